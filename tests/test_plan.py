"""The TrainingPlan: strict, every range checked, errors naming the field and the value."""

import math

import pytest
from pydantic import ValidationError

from canifinetune.estimator.errors import describe_validation_error
from canifinetune.estimator.plan import TrainingPlan


def error_text(**kwargs) -> str:
    with pytest.raises(ValidationError) as info:
        TrainingPlan(**kwargs)
    return describe_validation_error(info.value)


def test_defaults_are_trl_sft_with_peft():
    plan = TrainingPlan(model="m")
    assert (plan.method, plan.lora_r, plan.lora_alpha, plan.lora_dropout) == ("lora", 16, 32, 0.05)
    assert (plan.seq_len, plan.batch_size, plan.optim) == (1024, 8, "adamw_torch_fused")
    assert plan.gradient_checkpointing is True and plan.dtype == "bf16"
    assert plan.effective_loss_implementation == "chunked" and plan.attn_implementation is None
    assert plan.loss_implementation is None and plan.framework == "trl"
    assert plan.target_modules is None


@pytest.mark.parametrize(
    "kwargs, field, fragment",
    [
        ({"seq_len": 0}, "seq_len", "got 0"),
        ({"batch_size": -1}, "batch_size", "got -1"),
        ({"lora_r": 0}, "lora_r", "got 0"),
        ({"lora_dropout": 1.0}, "lora_dropout", "got 1.0"),
        ({"gpu_vram_gb": math.nan}, "gpu_vram_gb", "finite"),
        ({"gpu_vram_gb": math.inf}, "gpu_vram_gb", "finite"),
        ({"optim": "adam"}, "optim", "'adam'"),
        ({"method": "prefix"}, "method", "'prefix'"),
        ({"dtype": "int4"}, "dtype", "'int4'"),
        ({"unknown_knob": 1}, "unknown_knob", "not a known field"),
        ({"seq_len": "long"}, "seq_len", "'long'"),
        ({"target_modules": []}, "target_modules", "at least one"),
        ({"target_modules": ["q_proj; rm -rf /"]}, "target_modules", "letters, digits"),
        ({"model": ""}, "model", ""),
    ],
)
def test_invalid_values_name_their_field(kwargs, field, fragment):
    data = {"model": "m", **kwargs}
    text = error_text(**data)
    assert text.startswith(field + ":"), text
    assert fragment in text


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"method": "full", "load_in_4bit": True}, "method"),
        ({"method": "full", "load_in_8bit": True}, "method"),
        ({"method": "qlora", "load_in_4bit": False}, "load_in_4bit"),
        ({"method": "lora", "load_in_4bit": True}, "load_in_4bit"),
        ({"method": "qlora", "load_in_8bit": True}, "load_in_8bit"),
        ({"num_gpus": 2, "sharding": "none"}, "sharding"),  # given as none: refused (unset: chosen)
        ({"num_gpus": 2, "sharding": "ddp", "offload_params": True}, "offload_params"),
        ({"offload_optimizer": True}, "offload_optimizer"),
        ({"num_gpus": 2, "sharding": "fsdp_full_shard", "offload_optimizer": True}, "offload_optimizer"),
        ({"precision": "mixed", "dtype": "fp32"}, "precision"),
        ({"gpu": "RTX 4090", "gpu_vram_gb": 24}, "gpu"),
    ],
)
def test_impossible_combinations_are_refused(kwargs, field):
    text = error_text(model="m", **kwargs)
    assert text.startswith(field + ":"), text


def test_plan_is_frozen_and_replace_revalidates():
    plan = TrainingPlan(model="m")
    with pytest.raises(ValidationError):
        plan.seq_len = 5  # type: ignore[misc]
    assert plan.replace(seq_len=512).seq_len == 512
    with pytest.raises(ValidationError):
        plan.replace(seq_len=0)


def test_qlora_implies_4bit_and_targets_are_normalised():
    plan = TrainingPlan(model="m", method="qlora", target_modules=["v_proj", "q_proj", "q_proj"])
    assert plan.quantized_4bit and plan.target_modules == ["q_proj", "v_proj"]
    assert not TrainingPlan(model="m").quantized_4bit
