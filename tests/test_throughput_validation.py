"""The throughput model against published measurements (benchmarks/throughput_published.json): the file is
well-formed, every row cites its source, and the model's error stays within the bound docs/search.md states."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from canifinetune.estimator.catalog import find_gpu
from canifinetune.estimator.plan import TrainingPlan

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_throughput_validation.py"

# The bound docs/search.md states ("Validation against published throughput").
MEDIAN_ABS_ERROR_BOUND = 0.40
WORST_FACTOR_BOUND = 4.0  # every row: model / measured between 1/4 and 4


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_throughput_validation", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_the_file_is_well_formed(bench):
    data = bench.load()
    rows = data["rows"]
    assert len(rows) >= 10
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids))
    sources = set()
    for row in rows:
        assert {"id", "source", "published", "measured_tokens_per_second", "derivation", "plan"} <= set(row)
        assert "github.com" in row["source"] or "https://" in row["source"], row["id"]
        sources.add(row["source"].split(",")[0])
        assert row["published"] and math.isfinite(row["measured_tokens_per_second"])
        assert row["measured_tokens_per_second"] > 0
        plan = TrainingPlan(**row["plan"])
        assert plan.gpu and find_gpu(plan.gpu) is not None, row["id"]
        assert plan.model in data.get("models", {}) or "/" in plan.model
    assert len(sources) >= 3  # several independent publications, not one table


def test_the_error_stays_within_the_stated_bound(bench):
    results = bench.evaluate()
    stats = bench.summary(results)
    assert stats["rows"] >= 10
    assert stats["median_abs_error"] <= MEDIAN_ABS_ERROR_BOUND, stats
    for r in results:
        ratio = r["model"] / r["measured"]
        assert 1 / WORST_FACTOR_BOUND <= ratio <= WORST_FACTOR_BOUND, r


def test_the_script_prints_a_row_per_measurement_and_the_median(bench, capsys):
    assert bench.main([]) == 0
    out = capsys.readouterr().out
    assert "median |error|" in out
    assert sum(1 for line in out.splitlines() if "%" in line) >= len(bench.load()["rows"])
