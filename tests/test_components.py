"""The component table (estimator/components.py) is the one list of breakdown lines: every line any estimate emits is
in it, its lifetime labels the line, and its doc anchor exists in docs/memory_model.md."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from canifinetune.estimator.components import LIFETIMES, STATIC, STATIC_NAMES, ComponentKind
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.plan import TrainingPlan

ROOT = Path(__file__).resolve().parent.parent


def _slugs() -> set[str]:
    """GitHub's heading anchors of docs/memory_model.md."""
    text = (ROOT / "docs" / "memory_model.md").read_text(encoding="utf-8")
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in text.splitlines() if line.startswith("#")}


@pytest.mark.parametrize("kind", list(ComponentKind), ids=lambda k: k.key)
def test_each_component_has_a_lifetime_a_colour_and_an_existing_doc_anchor(kind):
    assert kind.lifetime in LIFETIMES
    assert re.fullmatch(r"#[0-9A-F]{6}", kind.color)
    assert kind.anchor in _slugs(), f"{kind.doc}: no such heading"
    assert ComponentKind.named(kind.key) is kind


def test_every_line_of_every_snapshot_plan_is_in_the_table_with_its_lifetime():
    sys.path.insert(0, str(ROOT))
    from benchmarks.estimate_snapshot import plan_tables

    checked = 0
    for plan_fields in plan_tables().values():
        try:
            est = estimate(TrainingPlan(**plan_fields))
        except Exception:
            continue
        for line in est.breakdown:
            kind = ComponentKind.named(line.name)
            expected = est.peak_phase if kind.lifetime == "phase" else kind.lifetime
            assert line.phase == expected, (plan_fields, line.name, line.phase)
            checked += 1
    assert checked > 5000


def test_a_full_dpo_reference_copy_is_static():
    """It was reported in the peak phase (backward) before the table (issue 23, item 6)."""
    est = estimate(TrainingPlan(model="Qwen/Qwen2.5-0.5B", method="full", trainer="dpo", reference_model="copy"))
    line = next(c for c in est.breakdown if c.name == "reference_model")
    assert line.phase == STATIC and "reference_model" in STATIC_NAMES
