"""The prospective validation (docs/validation.md): the frozen cohort's coverage, its freezing, and a CI subset.

The CI subset (the cases cohort-v1.json marks ``ci``) runs in fake mode through the runner, each case in its own
process, and the analysis runs on the result lines. The fake accounting itself is checked against the same accounting
on real tensors (within 1%) in tests/test_fake_mode.py::test_fake_equals_real_accounting.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks.validation import analyze, run_cohort

ROOT = Path(__file__).resolve().parent.parent
VALIDATION = ROOT / "benchmarks" / "validation"
COHORT_PATH = VALIDATION / "cohort-v1.json"
COHORT = run_cohort.load_cohort(COHORT_PATH)
LOWER, UPPER = -2.0, 10.0


def _specs():
    from canifinetune.estimator.model_sources import resolve_model

    return [resolve_model(c["plan"]["model"]).spec for c in COHORT["cases"]]


def _plans():
    from canifinetune.estimator.plan import TrainingPlan

    return [TrainingPlan(**c["plan"]) for c in COHORT["cases"]]


def test_cohort_is_versioned_and_frozen_with_its_rule():
    assert COHORT["cohort"] == "cohort-v1" and COHORT["version"] == 1
    assert COHORT["frozen"] and "not edited" in COHORT["rule"] and "new version" in COHORT["rule"]
    assert COHORT["gpu_sizes_gib"] and all(s > 0 for s in COHORT["gpu_sizes_gib"])


def test_cohort_coverage():
    cases, specs, plans = COHORT["cases"], _specs(), _plans()
    assert len(cases) >= 40
    assert len({s.model_type for s in specs}) >= 8
    assert any(s.moe is not None for s in specs), "no MoE model"
    assert any(s.tie_word_embeddings for s in specs), "no model with tied embeddings"
    assert any(s.vocab_size >= 150_000 for s in specs), "no 150k+ vocabulary"
    assert {p.method for p in plans} == {"full", "lora", "qlora"}
    assert min(p.seq_len for p in plans) <= 256 and max(p.seq_len for p in plans) >= 8192
    assert all(256 <= p.seq_len <= 8192 for p in plans)
    assert min(p.batch_size for p in plans) == 1 and max(p.batch_size for p in plans) == 8
    assert {p.gradient_checkpointing for p in plans} == {True, False}
    fake_runnable = {p.optim for p in plans} - set(run_cohort.FAKE_UNSUPPORTED_OPTIM)
    assert len(fake_runnable) >= 3, fake_runnable
    for method in ("full", "lora", "qlora"):  # every method has cases fake mode can measure
        assert any(p.method == method and p.optim not in run_cohort.FAKE_UNSUPPORTED_OPTIM for p in plans)


def test_subsets_are_small_and_valid():
    ci = run_cohort.select(COHORT, subset="ci")
    assert 3 <= len(ci) <= 6
    cuda = run_cohort.select(COHORT, subset="cuda")
    assert cuda and any(c["plan"]["method"] == "qlora" for c in cuda)
    assert [c["id"] for c in run_cohort.select(COHORT, cases="1,c07")] == ["c01", "c07"]


def _git(*args) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def test_cohort_file_committed_before_results_and_never_edited():
    try:
        history = _git("log", "--format=%H", "--follow", "--", str(COHORT_PATH.relative_to(ROOT))).split()
    except (subprocess.CalledProcessError, FileNotFoundError):
        pytest.skip("not a git checkout")
    if not history:
        pytest.skip("cohort file not committed yet")
    assert len(history) == 1, "cohort-v1.json was edited after it was frozen: a changed cohort is a new version"
    frozen_at = history[0]
    for results in sorted((VALIDATION / "results").glob("*-cohort-v1.jsonl")):
        commits = _git("log", "--format=%H", "--", str(results.relative_to(ROOT))).split()
        for c in commits:  # every commit of a results file descends from the freezing commit
            subprocess.run(["git", "merge-base", "--is-ancestor", frozen_at, c], cwd=ROOT, check=True)
            assert c != frozen_at, f"{results.name} was committed together with the cohort"


def test_result_files_reference_the_cohort_version():
    files = sorted((VALIDATION / "results").glob("*-cohort-v1.jsonl")) + sorted(
        (VALIDATION / "results").glob("*-cohort-v1-*.jsonl"))
    for path in files:
        header, rows = analyze.read_results(path)
        assert header is not None, f"{path.name}: no run header"
        assert header["cohort"] == COHORT["cohort"] and header["cohort_version"] == COHORT["version"]
        ids = {c["id"] for c in COHORT["cases"]}
        for row in rows:
            assert row["cohort"] == COHORT["cohort"] and row["cohort_version"] == COHORT["version"]
            assert row["case"] in ids
            assert row["status"] in ("ok", "error", "unsupported", "timeout", "not_run")
            if row["status"] != "ok":
                assert row.get("error"), f"{row['case']}: a case that did not run must say why"
    summary = VALIDATION / "results" / "summary.json"
    if summary.exists():
        data = json.loads(summary.read_text(encoding="utf-8"))
        assert data["cohort"] == COHORT["cohort"] and data["cohort_version"] == COHORT["version"]


def test_unsupported_cases_are_reported_not_dropped(tmp_path):
    bnb = next(c for c in COHORT["cases"] if c["plan"].get("optim") in run_cohort.FAKE_UNSUPPORTED_OPTIM)
    out = tmp_path / "fake.jsonl"
    rows = run_cohort.run("fake", [bnb], COHORT, out, jobs=1, timeout=60, quiet=True)
    assert rows[0]["status"] == "unsupported" and "bitsandbytes" in rows[0]["error"]
    header, lines = analyze.read_results(out)
    assert header["cases"] == [bnb["id"]] and lines[0]["case"] == bnb["id"]
    res = analyze.analyse_mode("fake", COHORT, header, lines)
    assert res["cases_ok"] == 0 and res["negative_results"][0]["status"] == "unsupported"
    assert res["errors"]["mape"] == "undefined"
    assert set(res["verdicts"]["rates"].values()) == {"undefined"}  # no denominator: said so, not 0


def test_rates_are_undefined_without_a_denominator():
    assert analyze._rate(0, 0) == "undefined"
    assert analyze._rate(1, 4) == 0.25


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("trl")
    out = tmp_path_factory.mktemp("validation") / "fake-cohort-v1.jsonl"
    cases = run_cohort.select(COHORT, subset="ci")
    rows = run_cohort.run("fake", cases, COHORT, out, jobs=2, timeout=600, quiet=True)
    return out, cases, rows


def test_ci_subset_in_fake_mode(ci_run):
    _, cases, rows = ci_run
    assert [r["case"] for r in rows] == [c["id"] for c in cases]
    for row in rows:
        assert row["status"] == "ok", f"{row['case']}: {row.get('error')}"
        assert row["cohort_version"] == COHORT["version"] and row["mode"] == "fake"
        m = row["measured"]
        assert m["attention_kernels"].get("math", 0) == 0
        assert m["peak_phase"].startswith("step")
        err = row["error_pct"]["allocated"]
        estimated = row["estimate"]["peak_allocated_bytes"] / 2**30
        assert LOWER <= err <= UPPER, (f"{row['case']}: estimate {estimated:.3f} GiB "
                                       f"vs measured {m['peak_allocated_bytes'] / 2**30:.3f} GiB ({err:+.2f}%)")


def test_ci_subset_analysis(ci_run, tmp_path):
    out, cases, _ = ci_run
    summary = analyze.summarise(COHORT_PATH, out, tmp_path / "no-cuda.jsonl")
    fake = summary["modes"]["fake"]
    assert fake["cases_ok"] == len(cases) and not fake["negative_results"]
    e = fake["errors"]
    assert e["n"] == len(cases) and LOWER <= e["min_error_pct"] <= e["max_error_pct"] <= UPPER
    assert e["underestimates"] + e["overestimates"] + e["exact"] == len(cases)
    v = fake["verdicts"]
    assert v["totals"]["pairs"] == len(cases) * len(COHORT["gpu_sizes_gib"])
    assert v["totals"]["false_feasible"] == 0
    assert summary["modes"]["cuda"]["run"] is False
    text = analyze.render(summary, COHORT)
    assert "cuda mode**: **not run**" in text and "undefined" in text


def test_stored_verdicts_follow_the_estimators_rule(ci_run):
    from canifinetune.estimator.estimate import estimate
    from canifinetune.estimator.plan import TrainingPlan

    _, _, rows = ci_run
    for row in rows:
        for size in COHORT["gpu_sizes_gib"]:
            est = estimate(TrainingPlan(**row["plan"]).replace(gpu_vram_gb=size))
            if est.budget_bytes == row["estimate"]["budget_bytes"]:  # the estimator unchanged since the run
                assert analyze.stored_verdict(row, est.gpu_usable_bytes) == est.verdict
