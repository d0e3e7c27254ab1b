"""Every stored fake-mode measurement of every frozen cohort stays within -2% / +10% of today's estimate.

No torch is needed: the measurements are read from benchmarks/validation/results/ and the estimator runs as it is,
so a change to the memory model that breaks any measured stack, model family or knob fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.validation import analyze, run_cohort

VALIDATION = Path(__file__).resolve().parent.parent / "benchmarks" / "validation"
COHORTS = sorted(VALIDATION.glob("cohort-v*.json"))
LOWER, UPPER = -2.0, 10.0


def _rows(cohort: dict) -> list[dict]:
    rows = []
    name = cohort["cohort"]
    # the main run (and its parts) first, re-runs after: "-rerun-" sorts before ".jsonl" by name
    paths = sorted((VALIDATION / "results").glob(f"fake-{name}*.jsonl"), key=lambda p: ("-rerun-" in p.name, p.name))
    for path in paths:
        if not re.fullmatch(rf"fake-{name}(-part\d+|-rerun-[\w-]+)?\.jsonl", path.name):
            continue
        header, lines = analyze.read_results(path)
        assert header is not None and header["cohort"] == name and header["cohort_version"] == cohort["version"]
        rows += lines
    latest: dict[str, dict] = {}
    for row in rows:  # a re-run supersedes an earlier line for its case
        if row.get("status") == "ok" or row["case"] not in latest:
            latest[row["case"]] = row
    return list(latest.values())


@pytest.mark.parametrize("path", COHORTS, ids=[p.stem for p in COHORTS])
def test_stored_measurements_within_bounds_of_the_current_estimate(path):
    cohort = run_cohort.load_cohort(path)
    rows = _rows(cohort)
    if not rows:
        pytest.skip(f"{cohort['cohort']} has no fake-mode results yet")
    ids = {c["id"] for c in cohort["cases"]}
    assert {r["case"] for r in rows} <= ids
    for row in rows:
        if row.get("status") != "ok":
            assert row.get("error"), f"{row['case']}: a case that did not run must say why"
    current = analyze.with_current_estimates("fake", [r for r in rows if r.get("status") == "ok"])
    misses = [f"{r['case']} {r['error_pct']['allocated']:+.2f}%" for r in current
              if not LOWER <= r["error_pct"]["allocated"] <= UPPER]
    assert not misses, f"{cohort['cohort']} outside -2%/+10%: " + ", ".join(misses)
