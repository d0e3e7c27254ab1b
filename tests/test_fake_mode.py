"""The fake-tensor measurement (benchmarks/validation/fake_mode.py) against the same accounting on real tensors."""

from __future__ import annotations

import importlib.util
import math
import os
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from harness_modules import TINY_LLAMA_CONFIG

from canifinetune.estimator.plan import TrainingPlan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "fake_mode", os.path.join(ROOT, "benchmarks", "validation", "fake_mode.py")
)
fake_mode = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("fake_mode", fake_mode)
_spec.loader.exec_module(fake_mode)

TINY = {**TINY_LLAMA_CONFIG, "vocab_size": 256}

QWEN2_05B = {
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
}


def _plan(**kw) -> TrainingPlan:
    base = {"model": "tiny", "seq_len": 64, "batch_size": 2}
    base.update(kw)
    return TrainingPlan(**base)


def test_recipes_setup_imports_without_torch():
    import subprocess

    code = (
        "import sys; import canifinetune.recipes.model_setup as s; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("loss", ["model", "trl_fused"])
def test_fake_equals_real_accounting(method, checkpointing, loss):
    # the CPU flash kernel runs both fake and real, so the routing to GPU kernels is left out here
    plan = _plan(method=method, gradient_checkpointing=checkpointing)
    fake = fake_mode.run_steps(plan, TINY, fake=True, loss=loss, route_sdpa=False)
    real = fake_mode.run_steps(plan, TINY, fake=False, loss=loss, route_sdpa=False)
    assert real["peak_allocated_bytes"] > 0
    assert fake["peak_allocated_bytes"] == pytest.approx(real["peak_allocated_bytes"], rel=0.01)
    assert fake["peak_phase"] == real["peak_phase"]
    for phase, value in real["phase_peaks"].items():
        assert fake["phase_peaks"][phase] == pytest.approx(value, rel=0.01)
    assert fake["peak_categories"] == real["peak_categories"]
    assert sum(fake["peak_categories"].values()) == fake["peak_allocated_bytes"]


def test_resolved_settings_tiny():
    plan = _plan(method="lora", target_modules=None)
    r = fake_mode.run_steps(plan, TINY, fake=True, steps=1)
    s = r["resolved"]
    assert s["adapted_modules"] == ["q_proj", "v_proj"]  # PEFT's default for llama
    assert s["adapter_dtypes"] == {"float32": s["trainable_params"]}  # autocast_adapter_dtype=True
    assert s["base_weight_dtypes"] == {"bfloat16": s["total_params"] - s["trainable_params"]}
    assert s["gradient_checkpointing"] is True
    assert s["optimizer_flags"]["fused"] is True
    assert r["attention_kernels"] == {"flash": 4}  # 2 layers, forward + recompute


def test_end_of_step_holds_weights_grads_and_states():
    plan = _plan(method="full", gradient_checkpointing=False)
    r = fake_mode.run_steps(plan, TINY, fake=True, loss="model")
    end = r["end_of_step_categories"]
    n = r["resolved"]["trainable_params"]
    assert end["parameters"] >= 2 * n  # bf16 weights (+ rotary buffer)
    assert end["gradients"] >= 2 * n
    assert end["optimizer_states"] >= 4 * n  # AdamW states in bf16: exp_avg + exp_avg_sq


@pytest.mark.parametrize("checkpointing", [False, True])
def test_qlora_runs_under_fake_tensors(checkpointing):
    pytest.importorskip("bitsandbytes")
    plan = _plan(method="qlora", target_modules="all-linear", gradient_checkpointing=checkpointing)
    r = fake_mode.run_steps(plan, TINY, fake=True)
    peak = r["peak_allocated_bytes"]
    assert peak > 0 and math.isfinite(peak)
    s = r["resolved"]
    assert s["quantized_params"] > 0
    assert "lm_head" in s["modules_left_unquantized"]
    assert s["adapter_dtypes"] == {"bfloat16": s["trainable_params"]}  # TRL casts adapters to bf16 on a 4-bit base
    assert r["peak_categories"]["parameters"] < r["resolved"]["total_params"] * 2


@pytest.mark.parametrize("framework", ["trl", "transformers"])
def test_int8_base_runs_under_fake_tensors_as_on_cuda(framework, monkeypatch):
    pytest.importorskip("bitsandbytes")
    from bitsandbytes.autograd import _functions as fns

    calls = {"MatMul8bitLt": 0, "MatMul8bitFp": 0}
    for name in calls:
        cls = getattr(fns, name)

        def forward(ctx, *args, _original=cls.forward, _name=name, **kwargs):
            calls[_name] += 1
            return _original(ctx, *args, **kwargs)

        monkeypatch.setattr(cls, "forward", staticmethod(forward))
    plan = _plan(method="lora", load_in_8bit=True, target_modules="all-linear", framework=framework)
    r = fake_mode.run_steps(plan, TINY, fake=True)
    assert calls["MatMul8bitLt"] > 0 and calls["MatMul8bitFp"] == 0  # the CUDA path, not the CPU one
    s = r["resolved"]
    int8 = s["base_weight_dtypes"]["int8"]  # 2 layers x 7 linears, one byte per weight
    assert int8 == 2 * (64 * 64 * 2 + 32 * 64 * 2 + 128 * 64 * 3)
    rest = sum(n for dtype, n in s["base_weight_dtypes"].items() if dtype != "int8")
    adapters = s["trainable_params"] * (2 if framework == "trl" else 4)  # TRL casts them to bf16
    per = 4 if framework == "transformers" else 2  # prepare_model_for_kbit_training: the rest in fp32
    # plus one fp32 scale (SCB) per output row: at most 128 rows, 512 bytes (one block) per linear
    expected = int8 + 14 * 512 + rest * per + adapters
    # small tensors (norms, LoRA matrices, the rotary buffer) are rounded up to 512-byte blocks
    assert expected <= r["after_build_categories"]["parameters"] <= expected + 64 * 512


@pytest.mark.slow
def test_qwen2_05b_full_is_plausible():
    plan = TrainingPlan(model="Qwen/Qwen2-0.5B", method="full", seq_len=1024, batch_size=1, gradient_checkpointing=True)
    r = fake_mode.measure_fake(plan, QWEN2_05B)
    s = r["resolved"]
    assert 0.49e9 < s["total_params"] < 0.50e9
    params = s["total_params"] * 2
    peak = r["peak_allocated_bytes"]
    # weights + grads + two bf16 AdamW states = 8 bytes/param, plus activations and the loss
    assert params * 4 < peak < params * 4 + 3 * 2**30
    cats = r["peak_categories"]
    assert cats["parameters"] >= params
    assert r["attention_kernels"] == {"flash": 96}  # 24 layers x 2 steps x (forward + recompute)
    assert r["peak_phase"].startswith("step2")


@pytest.mark.slow
def test_qwen2_05b_qlora_is_plausible():
    pytest.importorskip("bitsandbytes")
    plan = TrainingPlan(model="Qwen/Qwen2-0.5B", method="qlora", seq_len=512, batch_size=1)
    r = fake_mode.measure_fake(plan, QWEN2_05B)
    s = r["resolved"]
    # embeddings stay bf16 (136M params), the 358M linear parameters take ~0.5 byte + absmax
    assert s["base_weight_dtypes"].get("4bit-nf4", 0) > 0.35e9
    assert 0.3e9 < r["peak_categories"]["parameters"] < 0.6e9
    assert 0.3e9 < r["peak_allocated_bytes"] < 2e9


def test_cli_reports_errors(tmp_path):
    import json
    import subprocess

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"model": "x", "method": "full"}))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "no-such-architecture"}))
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "validation", "fake_mode.py"), "--plan", str(plan),
         "--config", str(config), "--out", str(out)],
        capture_output=True, text=True,
    )
    assert proc.returncode != 0
    assert "error" in json.loads(out.read_text())


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_int8_base_with_real_tensors_is_quantized_where_its_weights_live(device):
    """The real-tensor path (the runtime, the cuda cohort) quantizes at build time wherever the weights live:
    Int8Params.to quantizes only a CPU tensor (bitsandbytes 0.50.2), so weights off the CPU (on the GPU, or on meta
    here) would otherwise stay 16-bit and be quantized again at every forward."""
    bnb = pytest.importorskip("bitsandbytes")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from canifinetune.recipes import model_setup

    plan = _plan(method="lora", load_in_8bit=True)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**TINY), dtype=torch.bfloat16)
    model_setup._quantize_model(model, plan, model_setup.quantization_config(plan))
    int8_linears = [m for m in model.modules() if isinstance(m, bnb.nn.Linear8bitLt)]
    assert len(int8_linears) == 2 * 7
    for linear in int8_linears:
        assert linear.weight.dtype == torch.int8 and linear.weight.device.type == device
        assert linear.weight.SCB is not None and tuple(linear.weight.SCB.shape) == (linear.out_features,)
