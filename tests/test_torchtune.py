"""framework torchtune (estimator/torchtune_memory.py): the plan it accepts and refuses, and its terms counted by hand
from config.json and torchtune 0.6.1's source. The estimate against torchtune's own step is cohort v19
(tests/test_validation_bounds.py holds every stored row within -2%/+10%)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from canifinetune.estimator import memory as m
from canifinetune.estimator.errors import PlanError
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.inventory import inventory_of
from canifinetune.estimator.model_sources import resolve_model
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.resolved import resolve
from canifinetune.estimator.tensor_records import Role

# config.json: hidden 896, 24 layers, 14 heads of 64, 2 kv heads, vocab 151936, 32768 positions
QWEN = "Qwen/Qwen2.5-0.5B"
LLAMA = "meta-llama/Llama-3.2-1B"  # hidden 2048, 16 layers, 32 heads of 64, 8 kv heads, vocab 128256, 131072 positions


def _resolved(**kw):
    plan = TrainingPlan(framework="torchtune", **{"model": QWEN, "seq_len": 1024, "batch_size": 2, **kw})
    return resolve(plan, resolve_model(plan.model).spec)


def test_unset_fields_take_torchtunes_shipped_lora_settings():
    plan = TrainingPlan(model=QWEN, method="lora", framework="torchtune")
    assert plan.lora_dropout == 0.0
    assert plan.target_modules == sorted(["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    assert plan.effective_loss_implementation == "torchtune"


def test_every_parameter_is_bf16_without_autocast():
    r = _resolved(method="lora")
    assert (r.autocast, r.adapter_dtype, r.weight_dtype) == (False, "bf16", "bf16")
    states = inventory_of(r).of(Role.OPTIMIZER_STATE)
    assert states and all(rec.dtype == "bf16" for rec in states)


def test_rope_caches_one_per_layer_in_the_qwen_lora_builder_one_shared_otherwise():
    # Qwen2RotaryPositionalEmbeddings: cache [32768, 2 x 64] fp32 = 16,777,216 bytes, theta [32] fp32 (one 512 block)
    lora = inventory_of(_resolved(method="lora")).bytes_of(Role.BUFFER)
    full = inventory_of(_resolved(method="full")).bytes_of(Role.BUFFER)
    assert lora == 24 * (16_777_216 + 512)
    assert full == 16_777_216 + 512
    # Llama3ScaledRoPE: cache [131072, 32, 2] fp32 = 33,554,432 bytes, shared by every layer
    llama = inventory_of(_resolved(model=LLAMA, method="lora")).bytes_of(Role.BUFFER)
    assert llama == 33_554_432 + 512
    assert m.weight_bytes(_resolved(method="lora")) == 494_032_768 * 2 + lora  # bf16 parameters + the buffers


def test_nf4_state_per_quantized_linear():
    # torchao to_nf4: q_proj 896 x 896 = 802,816 weights: 12,544 int8 scalers, their bf16 factors (the storage of a
    # [49, 256] tensor: 25,088 bytes), a bf16 mean and the 16-entry bf16 table, each rounded to 512 bytes
    r = _resolved(method="qlora")
    q = [rec for rec in inventory_of(r).of(Role.QUANTIZATION_STATE) if rec.module == "q_proj"]
    assert q[0].bytes_each == 12_800 + 25_088 + 512 + 512


def test_grouped_query_attention_keeps_k_and_v_expanded_to_every_head():
    # 14 query heads over 2 kv heads: k and v copied to 896 wide, kept by the kernel: 2 x 2 x 2048 x (896 - 128)
    tt = _resolved(method="lora", gradient_checkpointing=False)
    trl = resolve(TrainingPlan(model=QWEN, method="lora", seq_len=1024, batch_size=2, lora_dropout=0.0,
                               target_modules=tt.plan.target_modules, adapter_dtype="bf16",
                               gradient_checkpointing=False, precision="pure"), tt.spec)
    assert m.layer_activation_bytes(tt, 0) - m.layer_activation_bytes(trl, 0) == 2 * 2 * 2048 * (896 - 128)


def test_loss_keeps_the_bf16_chunks_and_every_fp32_log_softmax():
    r = _resolved(method="lora")
    # 8 chunks of 128 positions x 2 rows x 151,936: bf16 chunks 622,329,856 bytes, fp32 log-softmax 1,244,659,712
    assert m.loss_forward_bytes(r) == 622_329_856 + 1_244_659_712
    assert m.standard_logits_bytes(r) == 622_329_856  # deleted by _loss_step before backward
    assert m.loss_forward_transient_bytes(r) == 4 * 2 * 128 * 151_936


@pytest.mark.parametrize("change, field", [
    ({"model": "microsoft/Phi-3-mini-4k-instruct"}, "framework"),
    ({"num_gpus": 2, "sharding": "ddp"}, "num_gpus"),
    ({"attn_implementation": "eager"}, "attn_implementation"),
    ({"target_modules": ["q_proj", "gate_proj"]}, "target_modules"),
    ({"target_modules": ["lm_head"]}, "target_modules"),
    ({"load_in_8bit": True}, "load_in_8bit"),
    ({"method": "qlora", "bnb_4bit_use_double_quant": True}, "bnb_4bit_quant_type"),
    ({"optim": "adamw_bnb_8bit"}, "optim"),
    ({"precision": "mixed"}, "dtype"),
    ({"loss_implementation": "chunked"}, "loss_implementation"),
    ({"packing": True, "padding_free": True}, "packing"),
    ({"use_dora": True}, "use_dora"),
    ({"trainer": "dpo"}, "trainer"),
])
def test_what_torchtune_does_not_run_is_refused_by_name(change, field):
    plan = {"model": QWEN, "method": "lora", "framework": "torchtune", **change}
    with pytest.raises((PlanError, ValidationError)) as info:
        estimate(TrainingPlan(**plan))
    assert field in str(info.value) and "torchtune" in str(info.value)


def test_optimizer_in_backward_holds_no_gradient_set():
    """Llama-3.2-1B full (tied head): with optimizer_in_bwd the end of backward holds the static components and the
    embedding's new gradient (128256 x 2048 bf16), not every gradient; there is no optimizer step phase of its own."""
    base = dict(model=LLAMA, method="full", seq_len=1024, batch_size=1, gradient_checkpointing=True)
    plain = estimate(TrainingPlan(framework="torchtune", **base))
    in_bwd = estimate(TrainingPlan(framework="torchtune", optimizer_in_backward=True, **base))
    assert in_bwd.peak_allocated_bytes < plain.peak_allocated_bytes
    static = sum(c.bytes for c in in_bwd.breakdown if c.name in ("weights", "optimizer_states", "cuda_workspaces"))
    assert in_bwd.phases["optimizer"] == static
    assert in_bwd.phases["backward"] >= static + 128256 * 2048 * 2


@pytest.mark.parametrize("change", [{"framework": "trl"}, {"method": "lora"}, {"gradient_accumulation_steps": 2}])
def test_optimizer_in_backward_is_torchtunes_full_recipe_alone(change):
    plan = {"model": LLAMA, "method": "full", "framework": "torchtune", "optimizer_in_backward": True, **change}
    with pytest.raises((PlanError, ValidationError), match="optimizer_in_backward"):
        TrainingPlan(**plan)


def test_a_trained_heads_backward_holds_three_head_gradients_and_the_unconsumed_chunk_gradients():
    """Llama-3.2-1B full at 1024 x 1: chunks of 128 positions; at the second head matmul the seven other chunks' bf16
    logits gradients (7 x 128 x 128,256 x 2) and three V x H bf16 gradients (the input buffer's out-of-place sum)."""
    from canifinetune.estimator import torchtune_memory

    r = _resolved(model=LLAMA, method="full", seq_len=1024, batch_size=1)
    head = 128256 * 2048 * 2
    assert torchtune_memory.head_backward_moment(r, head) == (7 * 32_833_536, 3 * head)


def test_torchtunes_activation_offloading_without_checkpointing_is_refused_by_its_own_name():
    # the recipe itself raises without activation checkpointing (lora_finetune_single_device.py, torchtune 0.6.1)
    with pytest.raises(ValidationError, match="enable_activation_offloading"):
        TrainingPlan(model=QWEN, method="lora", framework="torchtune", activation_offloading=True,
                     gradient_checkpointing=False)


@pytest.mark.parametrize("framework, targets", [
    ("torchtune", sorted(["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])),
    ("llama_factory", "all-linear"),
])
def test_a_null_field_takes_the_frameworks_default_as_an_unset_one_does(framework, targets):
    """An MCP client sends null for 'the default': under a framework with its own LoRA targets, null took PEFT's
    (q_proj and v_proj), fewer adapters than the framework trains."""
    plan = TrainingPlan(model=QWEN, method="lora", framework=framework, target_modules=None)
    assert plan.target_modules == targets == TrainingPlan(model=QWEN, method="lora", framework=framework).target_modules
    assert TrainingPlan(model=QWEN, method="lora", framework=framework, target_modules=["q_proj"]).target_modules == [
        "q_proj"]
