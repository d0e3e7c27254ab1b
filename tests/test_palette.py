"""server/palette.py: one colour per component by name, shared by the terminal and the MCP App, and every text
pair the two define readable (WCAG 2 contrast at least 4.5:1, light and dark)."""

from __future__ import annotations

import itertools
import json
import math
import re

import pytest

from canifinetune.estimator.estimate import _phase_peaks, estimate
from canifinetune.estimator.model_sources import resolve_model
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.resolved import resolve
from canifinetune.server import rich_view
from canifinetune.server.app import budget_app_html
from canifinetune.server.palette import (
    COMPONENT_COLORS,
    MARGIN_COLOR,
    OTHER_COLOR,
    THEMES,
    VERDICT_COLORS,
    component_color,
    contrast_ratio,
    palette_json,
    text_pairs,
)


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


SHARED_COLOURS = [  # the groups estimator/components.py documents as never appearing in one breakdown
    ["reference_model", "reward_model_embedding_and_score"],
    ["forward_temporaries", "backward_temporaries", "optimizer_temporaries", "reference_forward",
     "generation_temporaries"],
    ["kv_cache", "vllm_reservation"],
]
BREAKDOWN_PLANS = [
    *(dict(model="Qwen/Qwen2.5-7B-Instruct", method=m) for m in ("full", "lora", "qlora")),
    dict(model="Qwen/Qwen2.5-0.5B", method="full", trainer="dpo", reference_model="copy"),
    dict(model="Qwen/Qwen2.5-0.5B", method="lora", trainer="kto"),
    dict(model="Qwen/Qwen2.5-0.5B", method="lora", trainer="orpo"),
    dict(model="Qwen/Qwen2.5-0.5B", method="full", trainer="reward"),
    dict(model="Qwen/Qwen2.5-0.5B", method="lora", trainer="grpo"),
    dict(model="Qwen/Qwen2.5-0.5B", method="lora", trainer="grpo", use_vllm=True, gpu="H100"),
    dict(model="Qwen/Qwen2.5-7B-Instruct", method="full", num_gpus=4, sharding="zero3", gpu="A100 80GB"),
]


def test_components_that_appear_together_have_distinct_colours():
    by_color: dict[str, list[str]] = {}
    for name, color in COMPONENT_COLORS.items():
        by_color.setdefault(color.upper(), []).append(name)
    assert sorted(names for names in by_color.values() if len(names) > 1) == sorted(SHARED_COLOURS)
    assert OTHER_COLOR.upper() not in by_color and MARGIN_COLOR.upper() not in by_color
    assert component_color("something_new") == OTHER_COLOR
    seen = set()
    for fields in BREAKDOWN_PLANS:
        plan = TrainingPlan(**fields)
        breakdown = estimate(plan).breakdown
        process = [c.name for c in breakdown if c.phase == "process"]
        # every phase's lines, not only the peak's: each could be the breakdown of another plan
        forward, backward, optimizer, _sizes, extra = _phase_peaks(resolve(plan, resolve_model(plan.model).spec))
        for phase in (forward, backward, optimizer, *extra):
            names = [i.name for i in phase.items if i.bytes > 0] + process
            seen |= set(names)
            assert all(n in COMPONENT_COLORS for n in names), names
            assert len({component_color(n) for n in names}) == len(names), (phase.phase, names)
    # the plans reach the components that share a colour, so the check above is not vacuous for them
    assert {"reference_model", "reward_model_embedding_and_score", "vllm_reservation", "kv_cache",
            "generation_temporaries"} <= seen, seen


def test_app_and_terminal_read_the_same_table():
    page = budget_app_html()
    inlined = json.loads(re.search(r"var PALETTE = (\{.*?\});\n", page).group(1))
    assert inlined == palette_json()
    for _theme, colors in THEMES.items():
        for key, value in colors.items():
            assert f"--cf-{key}: {value};" in page
    assert rich_view.component_color is component_color
    assert rich_view.verdict_style("fits") == f"bold {VERDICT_COLORS['fits'][0]} on {VERDICT_COLORS['fits'][1]}"


def test_no_named_ansi_colours_in_the_terminal_view():
    with open(rich_view.__file__, encoding="utf-8") as handle:
        source = handle.read()
    named = r"\b(black|red|green|yellow|blue|magenta|cyan|white|grey\d*|gray\d*|purple|orange\d*)\b"
    styles = re.findall(r'style="([^"]*)"', source)
    assert styles and not [s for s in styles if re.search(named, s)], styles


# Machado, Oliveira & Fernandes (2009), severity 1.0, applied to linear RGB.
CVD = {
    "protanopia": ((0.152286, 1.052583, -0.204868), (0.114503, 0.786281, 0.099216), (-0.003882, -0.048116, 1.051998)),
    "deuteranopia": ((0.367322, 0.860646, -0.227968), (0.280085, 0.672501, 0.047413), (-0.011820, 0.042940, 0.968881)),
    "tritanopia": ((1.255528, -0.076749, -0.178779), (-0.078411, 0.930809, 0.147602), (0.004733, 0.691367, 0.303900)),
}


def _linear_rgb(hex_color: str) -> list[float]:
    h = hex_color.lstrip("#")
    out = []
    for i in (0, 2, 4):
        c = int(h[i:i + 2], 16) / 255
        out.append(c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4)
    return out


def _lab(rgb: list[float]) -> tuple[float, float, float]:
    x = (0.4124 * rgb[0] + 0.3576 * rgb[1] + 0.1805 * rgb[2]) / 0.95047
    y = 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2]
    z = (0.0193 * rgb[0] + 0.1192 * rgb[1] + 0.9505 * rgb[2]) / 1.08883
    f = [t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116 for t in (x, y, z)]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def _seen(hex_color: str, vision: str) -> tuple[float, float, float]:
    rgb = _linear_rgb(hex_color)
    if vision != "normal":
        rgb = [min(1.0, max(0.0, sum(m * c for m, c in zip(row, rgb, strict=True)))) for row in CVD[vision]]
    return _lab(rgb)


@pytest.mark.parametrize("vision", ["normal", *CVD])
def test_component_colours_stay_apart_for_colour_blind_eyes(vision):
    """Every two component colours (and the fallback) at least 10 CIE76 units apart, simulated per deficiency."""
    colors = sorted(set(COMPONENT_COLORS.values()) | {OTHER_COLOR})
    worst = min((math.dist(_seen(a, vision), _seen(b, vision)), a, b) for a, b in itertools.combinations(colors, 2))
    assert worst[0] >= 10, f"{vision}: {worst[1]} and {worst[2]} are only {worst[0]:.1f} apart"
