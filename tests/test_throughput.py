"""The throughput model's mechanics (estimator/throughput.py): what each term of docs/search.md's "The throughput
model" says, one at a time, and the time-to-train budget with its range."""

from __future__ import annotations

import json

import pytest

from canifinetune.estimator.constants import constant
from canifinetune.estimator.model_sources import resolve_model
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.throughput import flops_per_token, throughput, training_time

MODEL = "meta-llama/Llama-3.1-8B"


def _plan(**kw) -> TrainingPlan:
    base = dict(model=MODEL, method="lora", gpu="A100 80GB SXM", seq_len=2048, batch_size=4)
    base.update(kw)
    return TrainingPlan(**base)


def test_causal_kernels_compute_half_the_attention_eager_the_whole_square():
    spec = resolve_model(MODEL).spec
    plan = _plan(seq_len=8192)
    flash = flops_per_token(plan, spec, kernel="flash")
    eager = flops_per_token(plan, spec, kernel="math")
    assert flash.attention_forward == pytest.approx(eager.attention_forward / 2)
    # by hand from Llama-3.1-8B's config.json (32 layers, 32 heads x 128 = 4096): QK^T and AV are 2 x 4096 FLOPs each
    # per attended position and layer, 4 x 32 x 4096 x 8192 = 4,294,967,296 per token over the whole square
    assert eager.attention_forward == 4 * 32 * 4096 * 8192
    assert flash.model == eager.model  # the MFU convention counts the whole square either way
    # PaLM's model FLOPs per token (Chowdhery et al. 2022, appendix B): 6N + 12 L H Q T, N the matmul parameters
    # (7,504,658,432 by hand: tests/test_search.py LLAMA8B_MATMUL), L 32, H x Q 4096, T 8192
    assert flash.model == 6 * 7_504_658_432 + 12 * 32 * 4096 * 8192  # 57,912,852,480
    assert throughput(plan.replace(attn_implementation="eager")).tokens_per_second < throughput(plan).tokens_per_second


def test_dequantisation_is_per_weight_pass_not_per_token():
    def cost(**kw) -> float:
        lora = throughput(_plan(**kw)).seconds_per_million_tokens
        qlora = throughput(_plan(method="qlora", adapter_dtype="fp32", **kw)).seconds_per_million_tokens
        return qlora / lora - 1.0

    short, long = cost(seq_len=1024, batch_size=1), cost(seq_len=4096, batch_size=4)
    assert short > 0.0 and long > 0.0
    assert short > 3 * long  # the same bytes per weight, spread over 16 times more tokens


def test_small_micro_steps_are_bound_by_dispatch():
    small = throughput(_plan(seq_len=256, batch_size=1))
    large = throughput(_plan(seq_len=4096, batch_size=4))
    assert small.bound == "dispatch" and large.bound == "compute"
    assert small.tokens_per_second < large.tokens_per_second
    assert small.utilisation < large.utilisation


def test_bigger_matrices_run_closer_to_peak():
    one = throughput(_plan(seq_len=512, batch_size=1, gradient_checkpointing=False))
    many = throughput(_plan(seq_len=512, batch_size=16, gradient_checkpointing=False))
    assert many.utilisation > one.utilisation


def test_nvlink_from_the_catalog_beats_pcie_for_sharded_weights():
    sxm = throughput(_plan(gpu="A100 40GB SXM", num_gpus=4, sharding="fsdp_full_shard", seq_len=1024, batch_size=1))
    pcie = throughput(_plan(gpu="A100 40GB PCIe", num_gpus=4, sharding="fsdp_full_shard", seq_len=1024, batch_size=1))
    assert sxm.tokens_per_second > pcie.tokens_per_second
    assert any("PCIe" in n for n in pcie.notes) and not any("over PCIe" in n for n in sxm.notes)


def test_unsloth_moves_fewer_bytes_and_launches_fewer_kernels():
    hf = throughput(_plan(framework="transformers", attn_implementation="flash_attention_2"))
    unsloth = throughput(_plan(framework="unsloth", attn_implementation="flash_attention_2"))
    assert unsloth.tokens_per_second > hf.tokens_per_second
    assert unsloth.breakdown["memory_bound"] < hf.breakdown["memory_bound"]


def test_padding_packing_and_padding_free_count_real_tokens(tmp_path):
    data = tmp_path / "data.jsonl"
    rows = [{"text": "x" * (4 * n)} for n in (100, 200, 400, 800, 1600) * 20]
    data.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    padded = throughput(_plan(dataset=str(data)))
    free = throughput(_plan(dataset=str(data), padding_free=True))
    packed = throughput(_plan(dataset=str(data), packing=True))
    assert padded.padding_fraction > 0.3 and free.padding_fraction == 0.0 and packed.padding_fraction == 0.0
    assert padded.tokens_per_second < free.tokens_per_second
    assert packed.computed_tokens_per_micro_step == 4 * 2048
    assert free.computed_tokens_per_micro_step == pytest.approx(4 * 620, rel=0.01)  # mean of the five lengths
    no_data = throughput(_plan())
    assert no_data.padding_fraction == 0.0 and any("no dataset" in n for n in no_data.notes)


def test_the_range_is_the_validated_spread():
    tp = throughput(_plan(), training_tokens=50_000_000)
    assert tp.tokens_per_second_low == pytest.approx(tp.tokens_per_second * constant("THROUGHPUT_RANGE_LOW"))
    assert tp.tokens_per_second_high == pytest.approx(tp.tokens_per_second * constant("THROUGHPUT_RANGE_HIGH"))
    assert tp.training_hours_low < tp.training_hours < tp.training_hours_high
    assert sum(tp.breakdown.values()) == pytest.approx(tp.seconds_per_optimizer_step, rel=1e-3)


def test_training_time_is_a_budget_with_a_range():
    plan = _plan(num_gpus=2, sharding="ddp")
    t = training_time(plan, training_tokens=100_000_000)
    assert t.seconds == pytest.approx(100_000_000 / t.tokens_per_second)
    assert t.hours_low < t.hours < t.hours_high
    assert t.gpu_hours == pytest.approx(2 * t.hours) and t.gpu_hours_high == pytest.approx(2 * t.hours_high)
    assert t.seconds_low == pytest.approx(t.hours_low * 3600)
    steps = training_time(plan.replace(max_steps=100))
    assert steps.training_tokens == 100 * 4 * 2048 * 2
    with pytest.raises(ValueError, match="training_tokens"):
        training_time(plan)


def test_training_time_from_the_dataset(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"text": "y" * 4000}) for _ in range(50)), encoding="utf-8")
    t = training_time(_plan(dataset=str(data), num_train_epochs=2))
    assert t.training_tokens == 2 * 50 * 1000
