"""server/palette.py: one colour per component by name, shared by the terminal and the MCP App, and every text
pair the two define readable (WCAG 2 contrast at least 4.5:1, light and dark)."""

from __future__ import annotations

import json
import re

import pytest

from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.server import rich_view
from canifinetune.server.app import budget_app_html
from canifinetune.server.palette import (COMPONENT_COLORS, MARGIN_COLOR, OTHER_COLOR, THEMES, VERDICT_COLORS,
                                         component_color, contrast_ratio, palette_json, text_pairs)


def test_contrast_formula_matches_wcag_reference_values():
    assert contrast_ratio("#000000", "#FFFFFF") == pytest.approx(21.0)
    assert contrast_ratio("#FFFFFF", "#FFFFFF") == pytest.approx(1.0)
    assert contrast_ratio("#777777", "#FFFFFF") == pytest.approx(4.48, abs=0.01)  # the classic just-too-light grey
    assert contrast_ratio("#0072B2", "#FFFFFF") == contrast_ratio("#FFFFFF", "#0072B2")


@pytest.mark.parametrize("theme, what, fg, bg", text_pairs(), ids=lambda v: str(v))
def test_every_text_pair_reaches_4_5_to_1(theme, what, fg, bg):
    assert contrast_ratio(fg, bg) >= 4.5, f"{theme} {what}: {fg} on {bg} is {contrast_ratio(fg, bg):.2f}:1"


def test_pairs_cover_both_themes_every_verdict_and_every_text_colour():
    pairs = text_pairs()
    assert {t for t, *_ in pairs} == {"light", "dark"}
    for theme in THEMES:
        names = {w for t, w, *_ in pairs if t == theme}
        assert {f"{v} badge" for v in VERDICT_COLORS} <= names
        assert {"fg on bg", "muted on bg", "danger on bg", "success on bg", "warning on bg", "accent on panel"} <= names


def test_components_that_appear_together_have_distinct_colours():
    by_color: dict[str, list[str]] = {}
    for name, color in COMPONENT_COLORS.items():
        by_color.setdefault(color.upper(), []).append(name)
    shared = [names for names in by_color.values() if len(names) > 1]
    # only the three phases' temporaries share a colour: a breakdown holds the peak phase's alone
    assert shared == [["forward_temporaries", "backward_temporaries", "optimizer_temporaries"]]
    assert OTHER_COLOR.upper() not in by_color and MARGIN_COLOR.upper() not in by_color
    assert component_color("something_new") == OTHER_COLOR
    for plan in (TrainingPlan(model="Qwen/Qwen2.5-7B-Instruct", method=m) for m in ("full", "lora", "qlora")):
        names = [c.name for c in estimate(plan).breakdown if c.name != "safety_margin"]
        assert all(n in COMPONENT_COLORS for n in names), names
        assert len({component_color(n) for n in names}) == len(names)


def test_app_and_terminal_read_the_same_table():
    page = budget_app_html()
    inlined = json.loads(re.search(r"var PALETTE = (\{.*?\});\n", page).group(1))
    assert inlined == palette_json()
    for theme, colors in THEMES.items():
        for key, value in colors.items():
            assert f"--cf-{key}: {value};" in page
    assert rich_view.component_color is component_color
    assert rich_view.verdict_style("fits") == f"bold {VERDICT_COLORS['fits'][0]} on {VERDICT_COLORS['fits'][1]}"


def test_no_named_ansi_colours_in_the_terminal_view():
    source = open(rich_view.__file__, encoding="utf-8").read()
    named = r"\b(black|red|green|yellow|blue|magenta|cyan|white|grey\d*|gray\d*|purple|orange\d*)\b"
    styles = re.findall(r'style="([^"]*)"', source)
    assert styles and not [s for s in styles if re.search(named, s)], styles
