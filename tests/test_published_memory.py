"""Published peak-memory measurements that state their stack (benchmarks/validation/published-memory.json), scored
with that stack by benchmarks/validation/score_published.py (issue 24 item 5): the file is well-formed, the scorer
runs on it, and no published OOM that a plan can say is judged 'fits' (promise 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.validation import score_published as sp

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "validation" / "published-memory.json"


@pytest.fixture(scope="module")
def data() -> dict:
    return json.loads(DATA.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return sp.evaluate(sp.load())


def test_every_row_names_its_source_its_stack_and_its_run(data):
    assert data["schema"] == "canifinetune-published-memory/1"
    ids = [row["id"] for row in data["rows"]]
    assert len(ids) == len(set(ids)), "row ids repeat"
    assert len(data["sources"]) >= 4 and len(ids) >= 15
    for row in data["rows"]:
        where = row["id"]
        assert row["source"] in data["sources"], where
        assert row["url"].startswith("https://"), where
        assert row["quote"] and row["where"], where
        assert row["stack"]["framework"] and "framework_value" in row["stack"], where
        assert row["outcome"] in ("ran", "oom"), where
        if row["outcome"] == "ran":
            pub = row["published"]
            assert pub["value"] > 0 and pub["unit"] in data["units"] and pub["measure"] in data["measures"], where
        else:
            assert row["published"] is None, f"{where}: an OOM has no figure"
        assert ("plan" in row) != ("not_expressible" in row), f"{where}: a plan, or why none"
        if "plan" in row:
            assert row["stack"]["framework_value"] == row["plan"]["framework"], where
        for field in ("model", "method", "seq_len", "batch_size", "gpu", "num_gpus"):
            assert field in row["run"], f"{where}: run.{field}"
    for entry in data["excluded"]:
        assert entry["source"].startswith("https://") and entry["what"] and entry["why"]


def test_models_outside_the_catalog_come_with_their_config(data):
    from canifinetune.estimator.catalog import find_model

    for row in data["rows"]:
        if "plan" in row and find_model(row["plan"]["model"], forgiving=False) is None:
            assert row["plan"]["model"] in data["models"], row["id"]


def test_the_scorer_scores_every_row(results):
    rows = sp.load()["rows"]
    assert [r["id"] for r in results] == [row["id"] for row in rows]
    by_status = {s: [r for r in results if r["status"] == s] for s in ("scored", "oom", "not_expressible")}
    assert sum(map(len, by_status.values())) == len(results)
    assert by_status["scored"] and by_status["oom"] and by_status["not_expressible"]
    refused = [r["id"] for r in by_status["not_expressible"] if "plan" in r]
    assert not refused, f"rows whose plan the estimator refuses: {refused}"
    for r in by_status["scored"]:
        assert r["ours_bytes"] > 0 and r["published_bytes"] > 0
        assert r["compared_with"] == sp.OURS[r["measure"]]
    text = sp.markdown(results, sp.load()["excluded"])
    assert text.startswith("| source | stack value |") and "Rows not expressed:" in text


def test_the_scorers_output_is_deterministic(capsys):
    sp.main(["--json"])
    first = capsys.readouterr().out
    sp.main(["--json"])
    assert capsys.readouterr().out == first
    parsed = json.loads(first)
    assert set(parsed) == {"results", "summary", "excluded"} and parsed["summary"]


def test_no_published_oom_is_judged_fits(results):
    """Promise 1: never 'fits' for a run that went out of memory. Every published OOM a plan can say is judged on the
    run's own GPU, per GPU."""
    ooms = [r for r in results if r["status"] == "oom"]
    assert ooms
    fits = [f"{r['id']} ({r['estimate']['verdict']}, {r['estimate']['used_fraction']:.0%})" for r in ooms
            if r["estimate"]["verdict"] == "fits"]
    assert not fits, "published OOMs judged fits: " + ", ".join(fits)


def test_litgpts_resource_table_rows_within_bounds(results):
    """Lit-GPT's resource tables: max_memory_allocated printed by its own script on an A100, an independent GPU
    measurement of the litgpt stack; every expressible figure within -2/+10, as the config-hub rows are."""
    rows = [r for r in results if r["source"] in ("litgpt-resource-tables", "litgpt-config-hub")
            and r["status"] == "scored"]
    assert len(rows) >= 8
    for r in rows:
        assert -2.0 <= r["error_pct"] <= 10.0, f"{r['id']}: {r['error_pct']:+.2f}%"
