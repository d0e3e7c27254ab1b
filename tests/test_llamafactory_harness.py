"""LLaMA-Factory's own SFT step under fake tensors (benchmarks/validation/llamafactory_fake.py), in its own virtual
environment (.venv-llamafactory: llamafactory 0.9.5 pins transformers <=5.6.0, peft <=0.18.1, trl <=0.24.0): a tiny
smoke case, skipped with the install command when the environment is missing (failed instead when
CANIFINETUNE_REQUIRE_INDEPENDENT_CHECKS is set)."""

from __future__ import annotations

import pytest
from stack_harness import run_case, stack_python

from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.plan import TrainingPlan


def _measure(case: dict) -> dict:
    python = stack_python("LLaMA-Factory", ".venv-llamafactory", "CANIFINETUNE_LLAMAFACTORY_PYTHON")
    return run_case(python, "llamafactory_fake.py", case, env={"HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"})


@pytest.mark.slow
def test_llamafactorys_own_lora_step_runs_in_its_environment():
    """LLaMA-Factory's get_train_args, run_sft, loader and CustomSeq2SeqTrainer with its defaults (LoRA r=8 on every
    linear, dropout 0, fp32 adapters, reentrant gradient checkpointing enabled by the loader, fused AdamW): two
    optimizer steps on SmolLM2-135M at 256 tokens x 2, sdpa routed to flash; the estimate (framework llama_factory,
    same settings) within -2/+10 % (it adds a 32 MiB cuBLAS workspace the fake measurement has not)."""
    case = {"model": "HuggingFaceTB/SmolLM2-135M", "method": "lora", "cutoff_len": 256, "batch_size": 2}
    measured = _measure(case)
    assert "error" not in measured, measured.get("error")
    resolved = measured["resolved"]
    assert measured["driver"] == "llamafactory" and resolved["trainer_class"] == "CustomSeq2SeqTrainer"
    assert resolved["data_collator"] == "SFTDataCollatorWith4DAttentionMask"
    assert measured["attention_kernels"].get("flash") and not measured["attention_kernels"].get("math")
    assert resolved["optimizer"] == "AdamW" and resolved["optimizer_defaults"]["fused"] is True
    assert resolved["param_dtypes"] == {"frozen": {"bfloat16": 134515008}, "trainable": {"float32": 2442240}}
    assert resolved["lora_rank"] == 8 and resolved["lora_dropout"] == 0.0
    assert resolved["lora_targets"] == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    assert resolved["gradient_checkpointing_model"] and "use_reentrant=True" in resolved["gradient_checkpointing_func"]
    assert measured["peak_phase"].startswith("step2.")
    plan = TrainingPlan(model=case["model"], method="lora", framework="llama_factory", seq_len=256, batch_size=2,
                        lora_r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear",
                        gradient_checkpointing=True, attn_implementation="sdpa")
    est = estimate(plan).peak_allocated_bytes
    error = 100 * (est - measured["peak_allocated_bytes"]) / measured["peak_allocated_bytes"]
    assert -2.0 <= error <= 10.0, f"{error:+.2f}%"
