"""torchtune's own single-device recipe under fake tensors (benchmarks/validation/torchtune_fake.py), in its own virtual
environment: one tiny smoke case, skipped with the install command when the environment is missing."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "benchmarks" / "validation" / "torchtune_fake.py"
TORCHTUNE_PYTHON = os.environ.get("CANIFINETUNE_TORCHTUNE_PYTHON", str(ROOT / ".venv-torchtune" / "bin" / "python"))
INSTALL = ("python3 -m venv .venv-torchtune && .venv-torchtune/bin/pip install torch==2.13.0 && "
           ".venv-torchtune/bin/pip install torchtune==0.6.1 torchao==0.15.0")


def _measure(case: dict, timeout: float = 600) -> dict:
    if not Path(TORCHTUNE_PYTHON).exists():
        if os.environ.get("CANIFINETUNE_REQUIRE_INDEPENDENT_CHECKS"):
            pytest.fail(f"torchtune's environment is missing ({TORCHTUNE_PYTHON}); make it with: {INSTALL}")
        pytest.skip(f"torchtune's environment is missing ({TORCHTUNE_PYTHON}); make it with: {INSTALL}")
    proc = subprocess.run([TORCHTUNE_PYTHON, str(HARNESS), "--case", json.dumps(case)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)
    assert proc.stdout.strip(), proc.stderr[-2000:]
    return json.loads(proc.stdout)


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


def test_activation_offloading_is_refused_by_name():
    """What the harness does not run is refused by name, never measured as something else."""
    measured = _measure({"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "seq_len": 128, "batch_size": 1,
                         "gradient_checkpointing": True, "activation_offloading": True})
    assert "activation_offloading" in measured.get("error", "")
