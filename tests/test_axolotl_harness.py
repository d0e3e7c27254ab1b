"""Axolotl's own training step under fake tensors (benchmarks/validation/axolotl_fake.py), in its own virtual
environment (.venv-axolotl: Axolotl 0.19.0 pins transformers 5.16.1, peft 0.20.0, trl 1.9.0): tiny smoke cases,
skipped with the install command when the environment is missing."""

from __future__ import annotations

import pytest
from stack_harness import run_case, stack_python

from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.plan import TrainingPlan


def _measure(case: dict) -> dict:
    python = stack_python("Axolotl", ".venv-axolotl", "CANIFINETUNE_AXOLOTL_PYTHON")
    return run_case(python, "axolotl_fake.py", case,
                    env={"HF_HUB_OFFLINE": "1", "AXOLOTL_DO_NOT_TRACK": "1", "WANDB_MODE": "disabled"})


# one measurement for both tests (each run of Axolotl's step starts an interpreter and imports Axolotl: ~20 s)
CASE = {"model": "HuggingFaceTB/SmolLM2-135M", "method": "lora", "seq_len": 256, "micro_batch_size": 2,
        "lora_dropout": 0.0, "lora_target_linear": True}


@pytest.fixture(scope="module")
def measured() -> dict:
    result = _measure(CASE)
    assert "error" not in result, result.get("error")
    return result


@pytest.mark.slow
def test_axolotls_own_lora_step_runs_in_its_environment(measured):
    """Axolotl's loader, AxolotlTrainer and fused AdamW: two optimizer steps of LoRA on every linear of SmolLM2-135M at
    256 tokens x 2, sdpa routed to flash; bf16 base, fp32 adapters; the estimate (framework axolotl, its LoRA kernels
    modelled) within -2/+10 %."""
    assert measured["driver"] == "axolotl" and measured["resolved"]["trainer_class"] == "AxolotlTrainer"
    assert measured["attention_kernels"].get("flash") and not measured["attention_kernels"].get("math")
    resolved = measured["resolved"]
    assert resolved["optimizer"] == "AdamW" and resolved["optimizer_defaults"]["fused"] is True
    assert set(resolved["param_dtypes"]["frozen"]) == {"bfloat16"}
    assert set(resolved["param_dtypes"]["trainable"]) == {"float32"}
    assert measured["peak_phase"].startswith("step2.")
    plan = TrainingPlan(model=CASE["model"], method="lora", framework="axolotl", target_modules="all-linear",
                        lora_dropout=0.0, seq_len=256, batch_size=2, gradient_checkpointing=False)
    est = estimate(plan).peak_allocated_bytes
    error = 100 * (est - measured["peak_allocated_bytes"]) / measured["peak_allocated_bytes"]
    assert -2.0 <= error <= 10.0, f"{error:+.2f}%"


@pytest.mark.slow
def test_axolotls_lora_kernels_run_on_all_linear_adapters(measured):
    """With every linear adapted, Axolotl's auto-enabled LoRA kernels replace the MLP (its SwiGLU op runs in forward
    and backward, once per layer and step): what estimator/axolotl_memory.py models."""
    layers, steps = 30, 2
    assert measured["axolotl_kernel_ops"] == {"axolotl::swiglu_fwd": layers * steps,
                                              "axolotl::swiglu_bwd": layers * steps}
