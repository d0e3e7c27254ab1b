"""Gradient accumulation: every micro-batch after the first runs with the earlier ones' gradients alive (measured by
the trainers' own steps, cohort v13 and the v12 re-run; tests/test_validation_bounds.py holds those rows)."""

from __future__ import annotations

from canifinetune.estimator import memory as m
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.model_sources import resolve_model
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.resolved import resolve


def _phases(**kw) -> dict[str, int]:
    return estimate(TrainingPlan(**kw)).phases


def test_full_fine_tuning_forward_carries_the_earlier_micro_batches_gradients():
    base = dict(model="Qwen/Qwen2.5-0.5B", method="full", seq_len=1024, batch_size=2)
    plan = TrainingPlan(**base)
    grads = m.gradient_bytes(resolve(plan, resolve_model(plan.model).spec))
    once, accumulated = _phases(**base), _phases(**base, gradient_accumulation_steps=4)
    assert accumulated["forward"] - once["forward"] == grads
    assert accumulated["backward"] > once["backward"]
    assert accumulated["optimizer"] == once["optimizer"]  # the optimizer step held every gradient already


def test_fsdp_accumulates_unsharded_gradients_on_each_gpu():
    """accelerate's no_sync under FSDP2 skips the reduce-scatter: each GPU holds the whole gradients until the last
    micro-batch, so accumulation costs far more than the shard."""
    base = dict(model="Qwen/Qwen2.5-7B", method="full", num_gpus=4, sharding="fsdp_full_shard", seq_len=1024)
    plan = TrainingPlan(**base)
    whole = m.gradient_bytes(resolve(plan, resolve_model(plan.model).spec))
    once, accumulated = _phases(**base), _phases(**base, gradient_accumulation_steps=8)
    assert accumulated["forward"] - once["forward"] == whole


def test_lora_accumulation_costs_only_the_adapters_gradients():
    base = dict(model="Qwen/Qwen2.5-0.5B", method="lora", seq_len=1024, batch_size=2)
    once, accumulated = _phases(**base), _phases(**base, gradient_accumulation_steps=4)
    assert 0 < accumulated["forward"] - once["forward"] < 0.01 * once["forward"]
