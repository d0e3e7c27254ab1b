"""Activation offloading as a suggestion (issue 24): the search offers TRL's / torchtune's OffloadActivations where
the estimate models it (SFT on one GPU), as a CPU-offload choice that keeps the mathematics, with the host RAM it
needs; the throughput model prices the PCIe copies a side stream cannot hide."""

from __future__ import annotations

import pytest

from canifinetune.estimator import throughput as tp_module
from canifinetune.estimator.catalog import find_model
from canifinetune.estimator.costs import kind_of
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.knobs import build_knobs
from canifinetune.estimator.model_sources import resolve_model
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.resolved import resolve
from canifinetune.estimator.search import suggest

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def _plan(**kw) -> TrainingPlan:
    base = dict(model=LLAMA, method="qlora", seq_len=32768, batch_size=1, gpu="RTX 4090",
                gradient_checkpointing=True)
    return TrainingPlan(**{**base, **kw})


def _offloading_suggestions(plan: TrainingPlan):
    return [s for s in suggest(plan, max_suggestions=8).suggestions
            if any(c.field == "activation_offloading" for c in s.changes)]


def test_a_long_context_qlora_that_does_not_fit_is_offered_activation_offloading():
    plan = _plan()
    assert estimate(plan).verdict == "does_not_fit"
    found = _offloading_suggestions(plan)
    assert found, "no activation-offloading suggestion"
    s = found[0]
    assert s.cost.kind == "cpu_offload" and s.cost.tier == "same_math"
    assert s.estimate.verdict == "fits" and s.plan.activation_offloading and s.plan.gradient_checkpointing
    applied = plan.replace(**{c.field: c.new for c in s.changes})
    est = estimate(applied)
    assert est.verdict == "fits" and est.budget_bytes == s.estimate.budget_bytes
    # the block inputs in pinned host RAM: L x T x H x 2 bytes (32 x 32,768 x 4,096 x 2 = 8 GiB)
    assert est.host_memory_bytes >= 32 * 32768 * 4096 * 2
    assert any("activation offloading" in d for d in s.cost.details)


def test_offloading_turns_checkpointing_on_with_it():
    knobs = {k.name: k for k in build_knobs(_plan(gradient_checkpointing=False), resolve_model(LLAMA), set())}
    assert knobs["activation_offloading"].levels == [{"activation_offloading": True, "gradient_checkpointing": True}]


@pytest.mark.parametrize("kw", [
    {"trainer": "dpo"},  # the preference trainers' offloading is not measured
    {"framework": "axolotl"},
    {"activation_offloading": True},  # already on
])
def test_no_offloading_knob_where_it_is_not_estimated(kw):
    knobs = {k.name for k in build_knobs(_plan(**kw), resolve_model(LLAMA), set())}
    assert "activation_offloading" not in knobs


def test_a_pinned_field_keeps_offloading_out():
    plan = _plan()
    pinned = suggest(plan, keep=["activation_offloading"], max_suggestions=8).suggestions
    assert not any(c.field == "activation_offloading" for s in pinned for c in s.changes)


def test_plans_the_estimate_refuses_are_never_suggested():
    # an 8-bit base: offloading does not move bitsandbytes' kept inputs, so the plan refuses it and the search skips
    # it; offloading comes only with a move off the 8-bit base (QLoRA)
    plan = _plan(method="lora", load_in_8bit=True)
    for s in _offloading_suggestions(plan):
        assert not s.plan.load_in_8bit and s.plan.method == "qlora"
    with pytest.raises(Exception, match="load_in_8bit"):
        plan.replace(activation_offloading=True)


def test_the_kind_of_an_offloading_plan_is_cpu_offload():
    plan = _plan()
    rm = resolve_model(LLAMA)
    assert kind_of(plan, plan.replace(activation_offloading=True), rm) == "cpu_offload"


def test_the_copies_are_exposed_only_beyond_each_phase_compute():
    plan = _plan(activation_offloading=True)
    r = resolve(plan, resolve_model(LLAMA).spec)
    one_way = tp_module.memory.offload_host_bytes(r) / (tp_module.constant("PCIE_BANDWIDTH_GBS") * 1e9)
    for busy in (0.0, one_way, 2 * one_way, 4 * one_way, 100 * one_way):
        step = tp_module._Step(gemm=busy)
        tp_module._activation_offload(plan, r, step)
        forward = busy / 4
        expected = max(0.0, one_way - forward) + max(0.0, one_way - 3 * forward)
        assert step.offload_micro == pytest.approx(expected)
    # and nothing without offloading
    step = tp_module._Step(gemm=1.0)
    tp_module._activation_offload(_plan(), r, step)
    assert step.offload_micro == 0.0


def test_throughput_reports_the_offload_term():
    plan = _plan(activation_offloading=True)
    tp = tp_module.throughput(plan)
    assert "activation_offload" in tp.breakdown and tp.breakdown["activation_offload"] >= 0.0
    assert find_model(LLAMA) is not None


def test_a_machine_without_the_host_ram_is_not_offered_offloading():
    # the block inputs take 8 GiB of pinned host RAM; with 8 GiB on the machine (the estimate keeps an allowance for the
    # system and the training process) the offload does not fit, so the search offers the shorter context instead
    small = _offloading_suggestions(_plan(host_ram_gb=8))
    assert not small
    assert _offloading_suggestions(_plan(host_ram_gb=64))
