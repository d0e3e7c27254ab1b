"""torchtune's own single-device recipe under fake tensors (benchmarks/validation/torchtune_fake.py), in its own virtual
environment: one tiny smoke case, skipped with the install command when the environment is missing."""

from __future__ import annotations

from stack_harness import run_case, stack_python


def _measure(case: dict) -> dict:
    return run_case(stack_python("torchtune", ".venv-torchtune", "CANIFINETUNE_TORCHTUNE_PYTHON"), "torchtune_fake.py",
                    case)


def test_torchtunes_own_lora_step_runs_in_its_environment():
    """The recipe's own setup() and train(): two optimizer steps of LoRA on Qwen2.5-0.5B at 128 tokens, bf16 weights,
    flash attention, eight output chunks; the peak is above the weights and below weights + 1 GiB."""
    measured = _measure({"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "seq_len": 128, "batch_size": 1})
    assert "error" not in measured, measured.get("error")
    assert measured["driver"] == "torchtune"
    assert measured["calls"]["optimizer_step"] == 2 and measured["calls"]["loss_step"] == 2
    assert measured["attention_kernels"].get("flash") and not measured["attention_kernels"].get("math")
    resolved = measured["resolved"]
    assert resolved["param_dtypes"] == ["torch.bfloat16"] and resolved["num_output_chunks"] == 8
    assert resolved["params_trainable"] < resolved["params_total"] / 20
    weights = measured["after_build_categories"]["parameters"]
    assert weights < measured["peak_allocated_bytes"] < weights + 2**30
    states = measured["end_of_step_categories"]["optimizer_states"]  # bf16 AdamW: 2 + 2 bytes, plus fused step counters
    assert 4 * resolved["params_trainable"] <= states < 4 * resolved["params_trainable"] + 2**20


