"""Which groups of a block Axolotl's LoRA kernels replace (estimator/axolotl_memory.py), read from Axolotl 0.19.0's
apply_lora_kernel_patches: a group only where every projection of it has an adapter; never for 8-bit LoRA, DoRA, other
frameworks, or families whose blocks were not measured. The bytes are checked against Axolotl's own step in
tests/test_validation_bounds.py (cohorts v15, v16)."""

from __future__ import annotations

import pytest

from canifinetune.estimator import axolotl_memory
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.model_sources import resolve_model
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.resolved import resolve


def _groups(**kw) -> frozenset[str]:
    plan = TrainingPlan(**{"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "framework": "axolotl", **kw})
    return axolotl_memory.kernel_groups(resolve(plan, resolve_model(plan.model).spec))


@pytest.mark.parametrize("targets, expected", [
    ("all-linear", {"qkv", "o", "mlp"}),
    (["q_proj", "k_proj", "v_proj"], {"qkv"}),
    (["q_proj", "v_proj"], set()),  # PEFT's default: k_proj has no adapter, so q/k/v stay PEFT's
    (["o_proj", "gate_proj", "up_proj", "down_proj"], {"o", "mlp"}),
    (["gate_proj", "up_proj"], set()),
])
def test_a_group_is_patched_only_when_every_projection_is_adapted(targets, expected):
    assert _groups(target_modules=targets) == expected


@pytest.mark.parametrize("kw", [
    {"framework": "trl"}, {"load_in_8bit": True}, {"use_dora": True}, {"model": "google/gemma-3-1b-it"},
    {"method": "full", "target_modules": None, "attn_implementation": "flash_attention_2"},
])
def test_no_kernels_outside_what_axolotl_patches_and_was_measured(kw):
    assert _groups(**{"target_modules": "all-linear", **kw}) == frozenset()


def test_the_kernels_save_less_than_peft_without_checkpointing():
    """Same plan under trl's accounting of PEFT's path (with Axolotl's fp32 adapters) and under Axolotl's kernels."""
    common = dict(model="Qwen/Qwen3-0.6B", method="lora", target_modules="all-linear", lora_dropout=0.0,
                  adapter_dtype="fp32", seq_len=1024, batch_size=4, gradient_checkpointing=False)
    kernels = estimate(TrainingPlan(framework="axolotl", **common)).peak_allocated_bytes
    peft = estimate(TrainingPlan(framework="transformers", prepare_model_for_kbit_training=False, **common))
    assert kernels < peft.peak_allocated_bytes
