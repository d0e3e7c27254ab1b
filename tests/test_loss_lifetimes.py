"""Issue 24 items 1 and 3: what the standard loss holds when backward starts, and Phi-3's o_proj input copy.

The figures these terms stand for were measured by the recipe's own trainer under fake tensors
(benchmarks/validation/sft_trainer_fake.py, cohort v11, docs/validation.md); here the terms are checked against
the tensors they name, counted from the plan's shapes."""

from __future__ import annotations

import pytest

from canifinetune.estimator import memory as m
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.model_sources import resolve_model
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.resolved import resolve

# Expected sizes are computed by hand from the models' published config.json, not from the spec the estimator parsed
# (issue 23 item 9): vocab 151,936 (Qwen2.5-0.5B), 256,000 (gemma-2-2b), 128,256 x hidden 2048 (Llama-3.2-1B);
# Phi-3-mini 32 heads of 96 (q 3072 wide). Each product below is already a multiple of the allocator's 512-byte block.


def _resolved(**kw):
    plan = TrainingPlan(**kw)
    return resolve(plan, resolve_model(plan.model).spec)


def test_standard_loss_backward_start_holds_log_softmax_and_two_fp32_gradients():
    """No logits at the start of backward: log_softmax's fp32 output and nll_loss's and log_softmax's fp32 gradients
    (three B x S x V fp32 tensors), nothing in the compute dtype."""
    r = _resolved(model="Qwen/Qwen2.5-0.5B", method="lora", loss_implementation="standard", seq_len=2048,
                  batch_size=2)
    fp32_tv = 4 * 2 * 2048 * 151_936  # 2,489,319,424
    assert m.loss_backward_start_bytes(r) == 3 * fp32_tv
    # the forward still holds the bf16 logits beside log_softmax's output
    assert m.loss_forward_bytes(r) == fp32_tv + 2 * 2 * 2048 * 151_936


def test_softcapping_keeps_tanh_output_into_backward():
    """Gemma-2's tanh softcap saves its output for backward: one compute-dtype B x S x V beside the three fp32."""
    r = _resolved(model="google/gemma-2-2b", method="lora", loss_implementation="standard", seq_len=1024,
                  batch_size=1)
    fp32_tv = 4 * 1024 * 256_000  # 1,048,576,000
    assert m.loss_backward_start_bytes(r) == 3 * fp32_tv + 2 * 1024 * 256_000


def test_chunked_loss_has_no_logits_to_free():
    r = _resolved(model="Qwen/Qwen2.5-0.5B", method="lora", seq_len=2048, batch_size=2)
    assert m.standard_logits_bytes(r) == 0
    assert m.loss_backward_start_bytes(r) == m.loss_forward_bytes(r) + m.loss_backward_bytes(r)


def test_full_fine_tuning_head_gradient_comes_after_the_loss_gradients():
    """With a trained head the backward-start moment is the larger of the fp32 loss gradients and the head matmul's
    backward (the logits' bf16 gradient beside the head's gradient), never both at once."""
    plan = dict(model="meta-llama/Llama-3.2-1B", method="full", loss_implementation="standard", seq_len=2048,
                batch_size=2)
    est = estimate(TrainingPlan(**plan))
    r = _resolved(**plan)
    head_grad = 128_256 * 2048 * 2  # the bf16 V x H head gradient: 525,336,576
    loss_start = m.loss_backward_start_bytes(r)
    assert loss_start > m.standard_logits_bytes(r) + head_grad  # here the loss's gradients are the larger moment
    backward_items = {c.name: c.bytes for c in est.breakdown} if est.peak_phase == "backward" else None
    if backward_items is not None and "logits_and_loss" in backward_items:
        assert backward_items["logits_and_loss"] in (loss_start, m.standard_logits_bytes(r))


@pytest.mark.parametrize("kernel_case, copies", [
    (dict(seq_len=2000, batch_size=1), True),  # under the 2047-token window: no mask, flash
    (dict(seq_len=4096, batch_size=1), False),  # the sliding-window mask: the memory-efficient kernel
    (dict(seq_len=2000, batch_size=1, attn_implementation="eager"), False),
])
def test_phi3_o_proj_input_is_a_copy_only_under_flash(kernel_case, copies):
    r = _resolved(model="microsoft/Phi-3-mini-4k-instruct", method="full", **kernel_case)
    tokens = kernel_case["seq_len"] * kernel_case["batch_size"]
    expected = 2 * tokens * 3072 if copies else 0  # bf16 T x q_dim: 2 x 2000 x 3072 = 12,288,000
    assert m.o_proj_input_copy_bytes(r) == expected


def test_llama_o_proj_input_is_a_view_under_flash():
    r = _resolved(model="meta-llama/Llama-3.2-1B", method="full", seq_len=2048, batch_size=1)
    assert r.attention_kernel == "flash"
    assert m.o_proj_input_copy_bytes(r) == 0


@pytest.mark.parametrize("knobs, saved", [
    (dict(method="full"), True),  # a trained o_proj saves its input: the copy
    (dict(method="lora", target_modules="all-linear", adapter_dtype="bf16", lora_dropout=0.0), True),  # lora_A reads it
    (dict(method="lora", target_modules="all-linear", lora_dropout=0.0), False),  # fp32 adapters cast their own copy
    (dict(method="lora", target_modules="all-linear", adapter_dtype="bf16", lora_dropout=0.1), False),  # dropout's copy
    (dict(method="lora", target_modules=["qkv_proj"], adapter_dtype="bf16", lora_dropout=0.0), False),  # frozen o_proj
])
def test_phi3_copy_is_counted_where_it_is_saved(monkeypatch, knobs, saved):
    """The copy counts in a block's saved tensors only where something keeps it for backward."""
    r = _resolved(model="microsoft/Phi-3-mini-4k-instruct", seq_len=2000, batch_size=1, gradient_checkpointing=False,
                  **knobs)
    copy = m.o_proj_input_copy_bytes(r)
    assert copy == 2 * 2000 * 3072  # 12,288,000, a multiple of 512
    with_copy = m.layer_activation_bytes(r, 0)
    monkeypatch.setattr(m, "o_proj_input_copy_bytes", lambda r: 0)
    without = m.layer_activation_bytes(r, 0)
    assert with_copy - without == (copy if saved else 0)
