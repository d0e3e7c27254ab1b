"""The LitGPT stack (framework litgpt, estimator/litgpt_memory.py): its defaults, its refusals, and its figures against
LitGPT's own step measured under fake tensors (benchmarks/validation/litgpt_fake.py; cohort v12)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from canifinetune.estimator.errors import PlanError
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.plan import TrainingPlan

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "validation" / "results"


def _plan(**kw) -> TrainingPlan:
    return TrainingPlan(**{"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "framework": "litgpt", **kw})


def test_an_unset_field_means_what_it_means_in_litgpt():
    """litgpt/finetune/lora.py 0.5.13 setup(): r 8, alpha 16, dropout 0.05, micro-batch 1 of 16, AdamW, no
    checkpointing; what the plan sets stays."""
    plan = _plan()
    assert (plan.lora_r, plan.lora_alpha, plan.lora_dropout) == (8, 16, 0.05)
    assert (plan.batch_size, plan.gradient_accumulation_steps) == (1, 16)
    assert plan.optim == "adamw_torch" and plan.gradient_checkpointing is False
    assert _plan(lora_r=32, batch_size=4).lora_r == 32
    assert TrainingPlan(model="Qwen/Qwen2.5-0.5B", method="lora").lora_r == 16  # the other stacks keep TRL's


@pytest.mark.parametrize("fields, field", [
    ({"method": "qlora"}, "method"),
    ({"gradient_checkpointing": True}, "gradient_checkpointing"),
    ({"loss_implementation": "chunked"}, "loss_implementation"),
    ({"num_gpus": 2}, "num_gpus"),
    ({"sharding": "zero3", "offload_optimizer": True}, "sharding"),
    ({"trainer": "dpo"}, "trainer"),
    ({"optim": "adafactor"}, "optim"),
    ({"target_modules": ["gate_proj"]}, "target_modules"),
    ({"use_dora": True}, "use_dora"),
])
def test_what_litgpt_does_not_run_is_refused_by_name(fields, field):
    with pytest.raises(Exception) as info:
        estimate(_plan(**fields))
    assert field in str(info.value) and "framework litgpt" in str(info.value)


@pytest.mark.parametrize("model", ["Qwen/Qwen3-30B-A3B", "microsoft/Phi-3-mini-4k-instruct"])
def test_families_litgpt_runs_with_code_of_its_own_are_refused(model):
    with pytest.raises(PlanError, match="framework litgpt"):
        estimate(_plan(model=model, target_modules="all-linear"))


def _measured(cohort: str) -> list[dict]:
    rows: dict[str, dict] = {}
    for path in sorted(RESULTS.glob(f"fake-{cohort}*.jsonl"), key=lambda p: ("-rerun-" in p.name, p.name)):
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if row.get("status") == "ok":
                rows[row["case"]] = row
    return list(rows.values())


def test_litgpt_counts_its_untied_head():
    """LitGPT builds an lm_head of its own for Llama-3.2-1B, whose checkpoint ties it: the parameter count its own
    model reports (cohort v12 g04, full fine-tuning) is the estimate's."""
    row = next(r for r in _measured("cohort-v12") if r["case"] == "g04")
    est = estimate(TrainingPlan(**row["plan"]))
    assert est.params_total == row["measured"]["resolved"]["params_total"]
    assert est.params_total > estimate(TrainingPlan(model="meta-llama/Llama-3.2-1B", method="full")).params_total


@pytest.mark.parametrize("phase", ["forward", "backward", "optimizer"])
def test_every_phase_is_within_bounds_of_litgpts_step(phase):
    """Phase by phase, not only at the peak: LitGPT's loop holds a step's fp32 logits through the optimizer step and
    beside the next forward's (without that term the optimizer phase alone is a third low)."""
    rows = _measured("cohort-v12")
    assert len(rows) == 12
    misses = []
    for row in rows:
        est = estimate(TrainingPlan(**row["plan"])).phases[phase]
        measured = row["measured"]["phase_peaks"][f"step2.{phase}"]
        error = 100 * (est - measured) / measured
        if not -2.0 <= error <= 10.0:
            misses.append(f"{row['case']} {error:+.2f}%")
    assert not misses, f"{phase}: " + ", ".join(misses)


def test_litgpts_own_step_runs_in_its_environment():
    """The smoke case: LitGPT's own step in .venv-litgpt (made by .ci/run), against the estimate."""
    from benchmarks.validation.compare import LITGPT_PYTHON, measure_in_subprocess

    if not Path(LITGPT_PYTHON).exists():
        if os.environ.get("CANIFINETUNE_REQUIRE_INDEPENDENT_CHECKS"):
            pytest.fail(f"LitGPT's environment is missing ({LITGPT_PYTHON}); .ci/run makes it")
        pytest.skip(f"LitGPT's environment is missing ({LITGPT_PYTHON}); benchmarks/validation/litgpt_fake.py says "
                    "how to make it")
    plan = {"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "framework": "litgpt", "seq_len": 256, "batch_size": 2}
    measured = measure_in_subprocess(plan, timeout=600)
    assert "error" not in measured, measured.get("error")
    assert measured["driver"] == "litgpt" and measured["attention_kernels"].get("flash")
    est = estimate(TrainingPlan(**plan)).peak_allocated_bytes
    assert -2.0 <= 100 * (est - measured["peak_allocated_bytes"]) / measured["peak_allocated_bytes"] <= 10.0


def test_litgpts_published_gpu_rows_within_bounds():
    """LitGPT's own config-hub table (benchmarks/validation/published-litgpt.json): peak memory measured on an A10G
    by LitGPT's finetune scripts, an independent GPU measurement of the stack; every expressible row within -2/+10."""
    data = json.loads((ROOT / "benchmarks" / "validation" / "published-litgpt.json").read_text(encoding="utf-8"))
    assert len(data["rows"]) >= 5 and data["not_expressible"]
    for row in data["rows"]:
        est = estimate(TrainingPlan(**row["plan"])).peak_allocated_bytes
        published = row["peak_gb"] * 1e9
        error = 100 * (est - published) / published
        assert -2.0 <= error <= 10.0, f"{row['config']}: {error:+.2f}%"
