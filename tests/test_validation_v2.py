"""Cohort v2 (issue 13: the run the user actually has): its freezing, its coverage and its CI subset measured in
fake mode on each test run (every stored measurement against today's estimate: tests/test_validation_bounds.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks.validation import run_cohort

ROOT = Path(__file__).resolve().parent.parent
VALIDATION = ROOT / "benchmarks" / "validation"
COHORT_PATH = VALIDATION / "cohort-v2.json"
COHORT = run_cohort.load_cohort(COHORT_PATH)
LOWER, UPPER = -2.0, 10.0


def _plans(group: str | None = None):
    from canifinetune.estimator.plan import TrainingPlan

    return [TrainingPlan(**c["plan"]) for c in COHORT["cases"] if group is None or c["group"] == group]


def _family(plan) -> str:
    from canifinetune.estimator.model_sources import resolve_model

    return resolve_model(plan.model).spec.model_type


def test_cohort_v2_is_a_new_version_with_the_same_rule():
    assert COHORT["cohort"] == "cohort-v2" and COHORT["version"] == 2
    assert "not edited" in COHORT["rule"] and len(COHORT["cases"]) >= 40
    v1_ids = {c["id"] for c in run_cohort.load_cohort(VALIDATION / "cohort-v1.json")["cases"]}
    assert not v1_ids & {c["id"] for c in COHORT["cases"]}, "case ids must not collide with cohort v1's"


def test_cohort_v2_coverage():
    moe = _plans("moe_lora")
    assert len(moe) >= 10 and len({_family(p) for p in moe}) >= 3
    assert {p.gradient_checkpointing for p in moe} == {True, False}
    assert all(p.target_modules == "all-linear" for p in moe)
    stack = [p for p in _plans() if p.framework == "transformers" or p.prepare_model_for_kbit_training is not None]
    assert len(stack) >= 10 and len({_family(p) for p in stack}) >= 5
    assert {p.method for p in stack} >= {"lora", "qlora"}
    assert max(p.seq_len for p in _plans()) >= 32768
    knobs = _plans()
    assert any(p.modules_to_save for p in knobs) and any(p.use_dora for p in knobs)
    assert any(p.use_dora and p.method == "qlora" for p in knobs)


def _git(*args) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def test_cohort_v2_committed_before_results_and_never_edited():
    try:
        history = _git("log", "--format=%H", "--follow", "--", str(COHORT_PATH.relative_to(ROOT))).split()
    except (subprocess.CalledProcessError, FileNotFoundError):
        pytest.skip("not a git checkout")
    if not history:
        pytest.skip("cohort file not committed yet")
    assert len(history) == 1, "cohort-v2.json was edited after it was frozen"
    for results in sorted((VALIDATION / "results").glob("*-cohort-v2*.jsonl")):
        for c in _git("log", "--format=%H", "--", str(results.relative_to(ROOT))).split():
            subprocess.run(["git", "merge-base", "--is-ancestor", history[0], c], cwd=ROOT, check=True)
            assert c != history[0], f"{results.name} was committed together with the cohort"


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    for name in ("torch", "transformers", "peft", "bitsandbytes", "trl"):
        pytest.importorskip(name)
    out = tmp_path_factory.mktemp("validation") / "fake-cohort-v2.jsonl"
    cases = run_cohort.select(COHORT, subset="ci")
    rows = run_cohort.run("fake", cases, COHORT, out, jobs=2, timeout=900, quiet=True)
    return cases, rows


@pytest.mark.slow
def test_ci_subset_of_v2_in_fake_mode(ci_run):
    """Each CI case either measures within -2% / +10%, or is refused by PEFT and by the estimator alike (v39, frozen
    with PEFT's default targets, which phi3 does not have: the run fails at once and the estimate says why)."""
    from canifinetune.estimator.estimate import estimate
    from canifinetune.estimator.plan import TrainingPlan

    cases, rows = ci_run
    assert 2 <= len(cases) <= 4 and [r["case"] for r in rows] == [c["id"] for c in cases]
    assert any(r["status"] == "ok" for r in rows)
    for row in rows:
        if row["status"] != "ok":
            assert "target_modules" in row["error"], f"{row['case']}: {row.get('error')}"
            with pytest.raises(ValueError, match="target_modules"):
                estimate(TrainingPlan(**row["plan"]))
            continue
        err = row["error_pct"]["allocated"]
        assert LOWER <= err <= UPPER, f"{row['case']}: {err:+.2f}%"
