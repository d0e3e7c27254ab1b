"""Knobs register their transient terms (estimator/knob_terms.py); the memory terms fold over the registry.

Issue 23 item 7: adding a knob touches its own module, the plan and the harness, not the memory terms. These tests
register a stand-in knob and check that each hook reaches the term it names, and that the memory terms name no knob.
"""

from __future__ import annotations

import inspect

import pytest

from canifinetune.estimator import litgpt_memory, moe_adapter_memory, peft_memory, phases, term_cache
from canifinetune.estimator import memory as m
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.knob_terms import BlockPart, KnobTerms
from canifinetune.estimator.model_sources import resolve_model
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.resolved import resolve

EXTRA = 7 * 1024 * 1024  # bytes the stand-in knob adds, far above rounding


def _resolved(**kw):
    plan = TrainingPlan(**{"model": "Qwen/Qwen2.5-0.5B", "seq_len": 1024, "batch_size": 1, **kw})
    return resolve(plan, resolve_model(plan.model).spec)


def test_every_knob_module_is_registered():
    assert peft_memory.DORA_TERMS in m.KNOB_TERMS
    assert peft_memory.SAVED_COPY_TERMS in m.KNOB_TERMS
    assert moe_adapter_memory.EXPERT_ADAPTER_TERMS in m.KNOB_TERMS
    assert litgpt_memory.LITGPT_BLOCK_TERMS in m.KNOB_TERMS
    assert len({k.name for k in m.KNOB_TERMS}) == len(m.KNOB_TERMS)


def _with(monkeypatch, knob: KnobTerms) -> None:
    monkeypatch.setattr(m, "KNOB_TERMS", (*m.KNOB_TERMS, knob))
    term_cache.clear_all()  # the terms computed before the knob was registered do not count it


def test_a_registered_block_term_reaches_every_block(monkeypatch):
    r = _resolved(method="lora", gradient_checkpointing=False)
    before = m.layer_activation_bytes(r, 0)
    est_before = estimate(r.plan)
    _with(monkeypatch, KnobTerms("stand-in", block_saved=lambda r, layer: {BlockPart.ADAPTER_INPUTS: EXTRA}))
    assert m.layer_activation_bytes(r, 0) == before + EXTRA
    after = estimate(r.plan)
    layers = r.spec.num_layers
    grown = {c.name: c.bytes for c in after.breakdown}["activations"] - {
        c.name: c.bytes for c in est_before.breakdown}["activations"]
    assert grown >= (layers - 1) * EXTRA  # every block saves it (the one being back-propagated may have freed its own)


def test_registered_loss_and_transient_terms_reach_their_terms(monkeypatch):
    standard = _resolved(method="lora", loss_implementation="standard")
    chunked = _resolved(method="lora")
    saved, back = m.loss_forward_bytes(standard), m.loss_backward_bytes(chunked)
    fwd = m.adapter_forward_transient_bytes(chunked)
    _with(monkeypatch, KnobTerms("stand-in", loss_saved=lambda r, cast: EXTRA, loss_backward=lambda r: EXTRA,
                                 adapter_forward=lambda r: EXTRA))
    assert m.loss_forward_bytes(standard) == saved + EXTRA
    assert m.loss_backward_bytes(chunked) == back + EXTRA
    assert m.adapter_forward_transient_bytes(chunked) == fwd + EXTRA


def test_a_registered_head_gradient_is_made_at_the_loss_end(monkeypatch):
    r = _resolved(method="lora", loss_implementation="standard")
    assert phases._head_grad_bytes(r, 1.0) == 0
    _with(monkeypatch, KnobTerms("stand-in", head_gradient=lambda r: EXTRA))
    assert phases._head_grad_bytes(r, 1.0) == EXTRA
    assert phases._head_grad_bytes(r, 0.5) == EXTRA // 2


def test_a_registered_mlp_backward_term_joins_the_mlp_figure(monkeypatch):
    r = _resolved(method="full", gradient_checkpointing=False)
    before = m.layer_backward_transient_bytes(r, 0)
    huge = 10 * before  # large enough that the MLP figure becomes the block's transient
    _with(monkeypatch, KnobTerms("stand-in", mlp_backward=lambda r, layer: huge))
    assert m.layer_backward_transient_bytes(r, 0) > huge


@pytest.mark.parametrize("module", [m, phases])
def test_the_memory_terms_name_no_knob(module):
    """The terms fold over KNOB_TERMS: no DoRA, modules_to_save or expert-adapter function is called by name."""
    source = inspect.getsource(module)
    for name in ("dora_layer_saved_bytes", "dora_forward_transient_bytes", "head_copy_saved_bytes",
                 "head_copy_loss_backward_bytes", "head_copy_grad_bytes", "head_copy_moment_bytes",
                 "expert_adapter_saved_bytes", "expert_adapter_backward_bytes"):
        assert f"{name}(" not in source, f"{module.__name__} calls {name} by name"
