"""The inventory's records as each sharding engine places them (estimator/sharding.py): every static share is a fold
of placed records. Expected values are counted by hand from Qwen2.5-0.5B's config.json (hidden 896, intermediate
4864, 24 layers, 14 heads and 2 KV heads of 64, q/k/v biases, vocab 151,936, tied embeddings): 494,032,768
parameters (the published count) in 290 tensors (embedding and final norm, and per layer q/k/v weights and biases,
o_proj, gate/up/down and two norms: 12 x 24)."""

from __future__ import annotations

import pytest

from canifinetune.estimator import sharding
from canifinetune.estimator.model_sources import resolve_model
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.resolved import resolve
from canifinetune.estimator.tensor_records import Role, Split

QWEN = "Qwen/Qwen2.5-0.5B"
P = 494_032_768
TENSORS = 290
# LoRA r 16 on q_proj and v_proj (PEFT's default for qwen2): 24 x 16 x ((896 + 896) + (896 + 128)) parameters in
# 4 x 24 = 96 tensors
LORA_P, LORA_TENSORS = 1_081_344, 96


def _shares(**kw) -> sharding.Shares:
    plan = TrainingPlan(model=QWEN, **kw)
    return sharding.shares(resolve(plan, resolve_model(QWEN).spec))


def test_ddp_keeps_every_record_whole():
    sh = _shares(method="full", num_gpus=4, sharding="ddp")
    assert all(rec.split is Split.WHOLE and not rec.offloaded for rec in sh.records)
    assert sh.weights == 2 * P and sh.grads == 2 * P
    assert sh.states == 2 * 2 * P + TENSORS * 512  # AdamW's two bf16 moments, a 512-byte step counter per tensor
    assert sh.host == 0


def test_zero3_partitions_the_module_masters_gradients_and_states():
    sh = _shares(method="full", num_gpus=4, sharding="zero3")
    assert sh.weights == 2 * P // 4  # the module in bf16, partitioned
    assert sh.master == 4 * P // 4  # fp32 masters
    assert sh.grads == 4 * P // 4  # ZeRO-3 reduces straight into the fp32 partition: no bf16 gradients
    assert sh.states == (2 * 4 * P + TENSORS * 512) // 4  # AdamW on the fp32 masters
    roles = {rec.role for rec in sh.records}
    assert Role.MASTER_WEIGHT in roles and Role.OPTIMIZER_STATE in roles and Role.GRADIENT in roles


def test_zero_plus_plus_hpz_adds_a_node_partition():
    plain = _shares(method="full", num_gpus=16, gpus_per_node=8, sharding="zero3")
    hpz = _shares(method="full", num_gpus=16, gpus_per_node=8, sharding="zero3_hpz")
    assert hpz.weights - plain.weights == 2 * P // 8  # the secondary partition over the node's 8 GPUs
    assert any(rec.split is Split.NODE_SHARDED for rec in hpz.records)


def test_zero2_offload_moves_the_optimizer_to_the_host():
    on_gpu = _shares(method="full", num_gpus=4, sharding="zero2")
    off = _shares(method="full", num_gpus=4, sharding="zero2", offload_optimizer=True)
    assert on_gpu.grads == 2 * P // 4 + 4 * P // 4  # bf16 and fp32 gradient partitions
    assert off.master == off.states == off.grads == 0  # the bf16 partition goes too (offload reduces on the host)
    # the node's 4 ranks each offload their fp32 master, fp32 gradient and state partitions
    assert off.host == 4 * (on_gpu.master + 4 * P // 4 + on_gpu.states)
    assert all(rec.offloaded for rec in off.records if rec.role in (Role.MASTER_WEIGHT, Role.OPTIMIZER_STATE))


def test_fsdp_keeps_adapters_in_fp32_and_shards_everything():
    sh = _shares(method="lora", num_gpus=2, sharding="fsdp_full_shard")
    assert sh.weights == 2 * P // 2  # the frozen bf16 base, sharded
    assert sh.adapters == 4 * LORA_P // 2  # accelerate's fsdp2_prepare_model upcasts trainable parameters to fp32
    assert sh.grads == 4 * LORA_P // 2
    assert sh.states == (2 * 4 * LORA_P + LORA_TENSORS * 512) // 2
    assert all(rec.split is Split.SHARDED for rec in sh.records)


@pytest.mark.parametrize("kind,method", [
    (kind, method) for kind in ("ddp", "zero1", "zero2", "zero3", "fsdp_full_shard", "fsdp_shard_grad_op")
    for method in ("full", "lora", "qlora") if not (method == "qlora" and kind.startswith("fsdp"))])  # refused
def test_the_shares_are_the_fold_of_the_placed_records(kind, method):
    sh = _shares(method=method, num_gpus=4, sharding=kind)
    gpu, host = sharding.fold(sh.records, 4, 4)
    assert (gpu["weights"], gpu["adapters"], gpu["qconst"], gpu["master"], gpu["states"], gpu["gradients"], host) == (
        sh.weights, sh.adapters, sh.qconst, sh.master, sh.states, sh.grads, sh.host)
    # nothing lost: a sharded buffer's shares over the 4 GPUs add up to the whole, within the integer division
    whole = sum(rec.bytes for rec in sh.records if rec.buffer == "weights" and rec.split is Split.SHARDED)
    assert 0 <= whole - 4 * (whole // 4) < 4
