"""The memory model of each training stack, component by component (pure estimator, no torch).

transformers' Trainer + PEFT with prepare_model_for_kbit_training (peft/utils/other.py 0.21) keeps every
non-quantized parameter in fp32, so the residual stream, the checkpointed block inputs and the outputs of the
4-bit linears are fp32, and autocast keeps a compute-dtype copy of the fp32 lm_head; TRL 1.16's stack does
none of that. Also: the loss each framework defaults to, and Phi-3's sliding-window mask and fused qkv_proj.
"""

from __future__ import annotations

import pytest

from canifinetune.estimator import memory as m
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.model_sources import resolve_model
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.resolved import resolve

LLAMA = "meta-llama/Llama-3.2-1B"
PHI3 = "microsoft/Phi-3-mini-4k-instruct"

# Expected values below are computed by hand from the models' published config.json, never from the spec the estimator
# parsed (issue 23 item 9). Llama-3.2-1B: hidden 2048, intermediate 8192, 16 layers, 32 heads x 64, 8 KV heads x 64,
# vocab 128,256, tied embeddings.
#   4-bit linears per layer: q 2048x2048 + k 2048x512 + v 2048x512 + o 2048x2048 + gate/up/down 3 x 2048x8192
#     = 60,817,408; x 16 layers = 973,078,528
#   left unquantized: embedding 128,256 x 2048 = 262,668,288 + 33 RMSNorm weights x 2048 = 67,584 -> 262,735,872
# Both counts are also measured: benchmarks/validation/results/fake-cohort-v13.jsonl case a06 (this model, QLoRA)
# records base_weight_dtypes {"bfloat16": 262735872, "4bit-nf4": 973078528}, and fake-cohort-v7.jsonl case e06
# (kbit-prepared by transformers) {"float32": 262735872, ...}.
LLAMA_4BIT_PARAMS = 973_078_528
LLAMA_UNQUANTIZED_PARAMS = 262_735_872
LLAMA_H, LLAMA_I, LLAMA_V = 2048, 8192, 128_256


def _resolved(**fields):
    plan = TrainingPlan(**fields)
    return resolve(plan, resolve_model(plan.model).spec)


def test_kbit_preparation_makes_the_unquantized_weights_fp32():
    trl = _resolved(model=LLAMA, method="qlora")
    prepared = _resolved(model=LLAMA, method="qlora", framework="transformers")
    assert (trl.frozen_dtype, trl.residual_dtype) == ("bf16", "bf16")
    assert (prepared.frozen_dtype, prepared.residual_dtype) == ("fp32", "fp32")
    # 4-bit packs two weights a byte: 973,078,528 / 2 = 486,539,264 bytes; the rest bf16 (2 bytes) under TRL, fp32
    # (4 bytes) once prepared: 262,735,872 x 2 = 525,471,744 and x 4 = 1,050,943,488
    packed = LLAMA_4BIT_PARAMS // 2
    assert m.weight_bytes(trl) == LLAMA_UNQUANTIZED_PARAMS * 2 + packed  # 1,012,011,008
    assert m.weight_bytes(prepared) == LLAMA_UNQUANTIZED_PARAMS * 4 + packed  # 1,537,482,752
    assert m.quantization_constant_bytes(prepared) == m.quantization_constant_bytes(trl)


def test_kbit_preparation_runs_the_residual_stream_in_fp32():
    kw = dict(model=LLAMA, method="qlora", seq_len=1024, batch_size=2)
    trl = _resolved(**kw)
    prepared = _resolved(**kw, framework="transformers")
    t, h = 2 * 1024, LLAMA_H  # T = batch 2 x seq_len 1024 tokens
    assert m.checkpoint_boundary_bytes(trl) == 2 * t * h
    assert m.checkpoint_boundary_bytes(prepared) == 4 * t * h
    assert m.residual_bytes(prepared) == 4 and m.quantized_output_bytes(prepared) == 4
    # the gated MLP's gate, act and up come out of fp32-returning 4-bit linears: 3 x (4 - 2) x T x I more
    diff = m.layer_activation_bytes(prepared, 0) - m.layer_activation_bytes(trl, 0)
    extra_mlp = 3 * (4 - 2) * t * LLAMA_I  # 3 x 2 x 2048 x 8192 = 100,663,296
    assert diff >= extra_mlp
    # autocast's bf16 copy of the fp32 lm_head is kept until the head's backward
    assert m.lm_head_cast_bytes(trl) == 0
    assert m.lm_head_cast_bytes(prepared) == 2 * LLAMA_V * h  # 2 x 128,256 x 2048 = 525,336,576


def test_an_unquantized_base_is_not_prepared():
    lora = _resolved(model=LLAMA, method="lora", framework="transformers")
    assert not lora.kbit_prepared
    assert (lora.frozen_dtype, lora.residual_dtype, lora.adapter_dtype) == ("bf16", "bf16", "fp32")
    assert m.lm_head_cast_bytes(lora) == 0


def test_the_trl_stack_is_the_default_and_unchanged_by_the_new_fields():
    kw = dict(model=LLAMA, method="qlora", seq_len=2048, batch_size=2, target_modules="all-linear")
    default = estimate(TrainingPlan(**kw))
    explicit = estimate(TrainingPlan(**kw, framework="trl", prepare_model_for_kbit_training=False,
                                     loss_implementation="chunked", adapter_dtype="bf16"))
    assert default.peak_allocated_bytes == explicit.peak_allocated_bytes
    r = _resolved(**kw)
    assert (r.framework, r.kbit_prepared, r.adapter_dtype, r.loss_implementation) == ("trl", False, "bf16", "chunked")
    assert m.residual_bytes(r) == m.quantized_output_bytes(r) == r.act_bytes == 2  # bf16


def test_kbit_preparation_under_trl_costs_what_it_costs_under_transformers():
    kw = dict(model=LLAMA, method="qlora", seq_len=1024, batch_size=2)
    trl_prepared = _resolved(
        **kw, prepare_model_for_kbit_training=True, adapter_dtype="fp32", loss_implementation="standard"
    )
    transformers = _resolved(**kw, framework="transformers")
    for component in (m.weight_bytes, m.checkpoint_boundary_bytes, m.shared_activation_bytes, m.lm_head_cast_bytes,
                      m.loss_forward_bytes, m.adapter_bytes, m.optimizer_state_bytes):
        assert component(trl_prepared) == component(transformers), component.__name__


@pytest.mark.parametrize("framework, loss", [("trl", "chunked"), ("transformers", "standard")])
def test_loss_default_per_framework(framework, loss):
    plan = TrainingPlan(model=LLAMA, method="lora", framework=framework)
    assert plan.effective_loss_implementation == loss
    assert _resolved(model=LLAMA, method="lora", framework=framework).loss_implementation == loss
    other = "standard" if loss == "chunked" else "chunked"
    assert (
        TrainingPlan(
            model=LLAMA, method="lora", framework=framework, loss_implementation=other
        ).effective_loss_implementation
        == other
    )


def test_standard_loss_keeps_the_full_logits():
    r = _resolved(model=LLAMA, method="lora", framework="transformers", seq_len=1024, batch_size=2)
    t, v = 2 * 1024, LLAMA_V  # T = batch 2 x seq_len 1024
    # bf16 logits and log_softmax's fp32 output until backward; two fp32 T x V gradients in the loss backward
    assert m.loss_forward_bytes(r) == 2 * t * v + 4 * t * v
    assert m.loss_backward_bytes(r) == 2 * 4 * t * v  # 2,101,346,304


def test_phi3_sliding_window_mask_from_seq_len_2047():
    spec = resolve_model(PHI3).spec
    assert spec.sliding_window == 2047
    assert resolve_model("Qwen/Qwen2.5-0.5B").spec.sliding_window is None  # use_sliding_window false
    short = _resolved(model=PHI3, method="lora", target_modules=["qkv_proj"], seq_len=2046)
    at = _resolved(model=PHI3, method="lora", target_modules=["qkv_proj"], seq_len=2047)
    long = _resolved(model=PHI3, method="lora", target_modules=["qkv_proj"], seq_len=2048, batch_size=2)
    assert (short.attention_mask, short.attention_kernel) == (False, "flash")
    assert (at.attention_mask, at.attention_kernel) == (True, "efficient")
    assert (long.attention_mask, long.attention_kernel) == (True, "efficient")
    # the additive bias the efficient kernel keeps, a x B x S^2 per block (Phi-3-mini has no GQA), plus the
    # fused qkv output the kernel's v view keeps alive. By hand from Phi-3-mini-4k-instruct's config.json: 32 heads
    # and 32 KV heads of 3072 / 32 = 96, so q and each of k, v are 3072 wide, the fused qkv_proj output 9216;
    # T = 2 x 2048 = 4096: 2 x 4096 x 9216 - 2 x 4096 x 3072 = 50,331,648 (plus the mask 16,777,216: 67,108,864)
    t, q_dim, kv_dim = 2 * 2048, 3072, 3072
    qkv_extra = 2 * t * (q_dim + 2 * kv_dim) - 2 * t * kv_dim
    assert m.attention_mask_and_view_bytes(long) == 2 * 2 * 2048 * 2048 + qkv_extra


def test_fused_qkv_view_is_not_kept_behind_an_fp32_cast():
    lora = _resolved(model=PHI3, method="lora", target_modules=["qkv_proj"], seq_len=512)
    prepared = _resolved(model=PHI3, method="qlora", target_modules=["qkv_proj"], seq_len=512, framework="transformers")
    assert m.attention_mask_and_view_bytes(lora) > 0
    assert m.attention_mask_and_view_bytes(prepared) == 0  # autocast casts the fp32 q, k, v: v is a copy
    llama = _resolved(model=LLAMA, method="lora", seq_len=512)
    assert m.attention_mask_and_view_bytes(llama) == 0


def test_gemma3_masks_its_sliding_layers_only_and_repeat_kv_of_one_head_is_a_view():
    spec = resolve_model("google/gemma-3-1b-it").spec
    assert (spec.sliding_window, spec.sliding_window_layers) == (512, 22)  # 26 layers, every 6th global
    assert resolve_model(PHI3).spec.sliding_window_layers == 32  # Phi-3-mini: all 32 layers slide (config.json)
    short = _resolved(model="google/gemma-3-1b-it", method="lora", seq_len=256, batch_size=2)
    long = _resolved(model="google/gemma-3-1b-it", method="lora", seq_len=1024, batch_size=2)
    assert not short.attention_mask and m.attention_mask_and_view_bytes(short) == 0
    # the global layers still run flash; the sliding layers' bias is counted (for every block: the safe side)
    assert long.attention_mask and long.attention_kernel == "flash"
    assert m.attention_mask_and_view_bytes(long) == 2 * 2 * 1024 * 1024  # one k/v head: no repeat_kv copies
    medium = _resolved(model="microsoft/Phi-3-medium-4k-instruct", method="qlora", target_modules=["qkv_proj"],
                       seq_len=2048, batch_size=1)
    assert medium.spec.num_kv_heads > 1
    # by hand from Phi-3-medium-4k-instruct's config.json: hidden 5120, 40 heads and 10 KV heads of 128, so q is 5120
    # wide and k, v 1280 each; one row of 2048: the bias 2 x 2048^2 = 8,388,608 plus the qkv output less the v view,
    # 2 x 2 x 2048 x (5120 - 1280) = 31,457,280 -> 39,845,888
    assert m.attention_mask_and_view_bytes(medium) == 2 * 2048 * 2048 + 2 * 2 * 2048 * (5120 - 1280)
