"""suggest(): every suggestion fits by estimate(), is minimal, respects pins and is ranked by the cost model."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from canifinetune.estimator.costs import KINDS, TIER_NAMES, cost_of, sort_key
from canifinetune.estimator.errors import CanIFinetuneError, PlanError
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.model_sources import resolve_model
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.search import suggest
from canifinetune.estimator.throughput import flops_per_token, throughput

# A spread of plans that do not fit: different families, methods and GPUs from 10 to 141 GB.
SPREAD = [
    dict(model="meta-llama/Llama-3.1-8B", method="full", gpu="RTX 4090", seq_len=4096),
    dict(model="meta-llama/Llama-3.1-8B", method="lora", gpu="RTX 4090", seq_len=4096,
         gradient_checkpointing=False, loss_implementation="standard"),
    dict(model="Qwen/Qwen2.5-72B-Instruct", method="qlora", gpu="RTX 4090"),
    dict(model="Qwen/Qwen2.5-7B", method="full", gpu="A100 40GB SXM", seq_len=2048),
    dict(model="mistralai/Mistral-7B-v0.3", method="lora", gpu="Tesla T4", dtype="fp16", batch_size=16,
         seq_len=2048, gradient_checkpointing=False),
    # lora_dropout 0: PEFT 0.21 refuses dropout on the expert adapters all-linear puts on Qwen3-MoE's fused experts
    dict(model="Qwen/Qwen3-30B-A3B", method="lora", target_modules="all-linear", lora_dropout=0.0,
         gpu="A100 80GB SXM", seq_len=8192, batch_size=16),
    dict(model="google/gemma-2-9b-it", method="qlora", gpu="RTX 3060 12GB", seq_len=4096, batch_size=8),
    dict(model="microsoft/Phi-3-mini-4k-instruct", method="full", gpu="RTX 3080"),
    dict(model="HuggingFaceTB/SmolLM2-1.7B", method="full", gpu="RTX 4060 Ti 16GB", seq_len=8192, batch_size=16,
         attn_implementation="eager", gradient_checkpointing=False),
    dict(model="allenai/OLMo-2-1124-7B", method="lora", target_modules="all-linear", lora_r=64,
         gpu="RTX 4090", seq_len=4096, gradient_checkpointing=False),
    dict(model="meta-llama/Llama-3.1-70B", method="lora", gpu="H100 SXM", seq_len=4096, optim="adamw_torch"),
    dict(model="mistralai/Mixtral-8x7B-v0.1", method="qlora", gpu="L4", seq_len=2048),
    dict(model="Qwen/Qwen2.5-14B", method="full", gpu="H200", seq_len=8192, gradient_checkpointing=False),
]


def _plan(kw) -> TrainingPlan:
    return TrainingPlan(**kw)


@pytest.fixture(scope="module")
def results():
    out = []
    for kw in SPREAD:
        plan = _plan(kw)
        out.append((plan, suggest(plan, max_suggestions=8)))
    return out


def _try(plan: TrainingPlan, **changes):
    """The plan with ``changes`` and its estimate, or None when the combination is illegal."""
    try:
        p = plan.replace(**changes)
        return p, estimate(p)
    except (ValidationError, CanIFinetuneError):
        return None


def test_the_spread_does_not_fit_as_given(results):
    for plan, res in results:
        assert estimate(plan).verdict != "fits", plan.model
        assert not res.fits_already


def test_every_suggestion_fits_by_estimate(results):
    count = 0
    for plan, res in results:
        for s in res.suggestions:
            again = estimate(s.plan)
            assert again.verdict == "fits", (plan.model, [c.field for c in s.changes])
            assert again.budget_bytes == s.estimate.budget_bytes
            count += 1
    assert count >= len(results)  # most plans get several suggestions


def test_every_suggestion_is_minimal(results):
    """Reverting any one change makes the plan illegal, not fit, or not cheaper."""
    for plan, res in results:
        rm = resolve_model(plan.model)
        base_tp = throughput(plan, model=rm)
        for s in res.suggestions:
            own = sort_key(cost_of(plan, s.plan, rm, base_tp, used_fraction=s.estimate.used_fraction,
                                   host_memory_bytes=s.estimate.host_memory_bytes))
            assert own == sort_key(s.cost)
            assert s.changes, "a suggestion with no change"
            for change in s.changes:
                if s.qlora_rule and change.field in ("method", "load_in_8bit", "load_in_4bit"):
                    continue  # the 4-bit base is what the QLoRA rule holds fixed (docs/search.md)
                got = _try(s.plan, **{change.field: change.old})
                if got is None or got[1].verdict != "fits":
                    continue
                reverted = sort_key(cost_of(plan, got[0], rm, base_tp, used_fraction=got[1].used_fraction,
                                            host_memory_bytes=got[1].host_memory_bytes))
                assert reverted >= own, (plan.model, change.field, reverted, own)


def test_changes_list_matches_the_plan(results):
    for plan, res in results:
        for s in res.suggestions:
            for c in s.changes:
                assert getattr(plan, c.field) == c.old and getattr(s.plan, c.field) == c.new
            rebuilt = plan.replace(**{c.field: c.new for c in s.changes})
            assert rebuilt == s.plan


def test_ranking_follows_the_cost_model(results):
    for plan, res in results:
        ranked = [s for s in res.suggestions if not s.qlora_rule]  # the QLoRA rule places one by rule, not cost
        keys = [sort_key(s.cost) for s in ranked]
        assert keys == sorted(keys), plan.model
        kinds = [s.cost.kind for s in ranked]
        assert len(kinds) == len(set(kinds)), (plan.model, kinds)  # the best of each kind, once
        for s in res.suggestions:
            assert s.cost.tier == TIER_NAMES[s.cost.tier_rank] and s.cost.kind in KINDS
            assert s.rank == res.suggestions.index(s) + 1
            fields = {c.field for c in s.changes}
            if s.cost.kind == "same_math":
                assert not fields & {"seq_len", "lora_r", "target_modules", "method", "num_gpus", "gpu",
                                     "offload_optimizer", "offload_params"}
                assert s.cost.effective_batch_after == s.cost.effective_batch_before
            if s.cost.kind == "more_gpus":
                assert s.cost.extra_gpus > 0 and "num_gpus" in fields and s.cost.tier == "more_hardware"
            if s.cost.kind == "larger_gpu":
                assert "gpu" in fields and s.cost.tier == "more_hardware"
                assert s.estimate.gpu_usable_bytes > res.original.gpu_usable_bytes
            if s.cost.kind == "cpu_offload":
                assert fields & {"offload_optimizer", "offload_params", "activation_offloading"}
                assert s.estimate.host_memory_bytes > 0
            if "seq_len" in fields:
                assert s.cost.context_tokens_lost == plan.seq_len - s.plan.seq_len > 0
            assert s.cost.summary and s.cost.details


def _seconds_per_token(s) -> float:
    return 1.0 / s.throughput.tokens_per_second


def test_a_many_times_slower_choice_never_leads(results):
    """Time weighs: the first suggestion is never 4x slower than the plan as given while another suggestion
    runs within 1.5x of it, nor 3x slower than another choice on the same GPUs."""
    for plan, res in results:
        if len(res.suggestions) < 2:
            continue
        first, rest = res.suggestions[0], res.suggestions[1:]
        plan_s = 1.0 / res.original_throughput.tokens_per_second
        if _seconds_per_token(first) >= 4 * plan_s:
            assert not any(_seconds_per_token(s) <= 1.5 * plan_s for s in rest), plan.model
        own = [s for s in rest if s.cost.kind not in ("more_gpus", "larger_gpu")]
        if first.cost.kind not in ("more_gpus", "larger_gpu"):
            assert not any(3 * _seconds_per_token(s) <= _seconds_per_token(first) for s in own), plan.model


def test_the_issue_examples_offer_every_kind_that_fits():
    """Issue 15: Mistral-7B on an RTX 3060 at 8192 tokens offers QLoRA (it fits) beside offload; the text of
    every suggestion states its time per training token, and host RAM where it offloads."""
    from canifinetune.server.text import format_suggestions

    res = suggest(TrainingPlan(model="mistralai/Mistral-7B-v0.1", gpu="RTX 3060", seq_len=8192))
    kinds = {s.cost.kind: s for s in res.suggestions}
    # issue 21: four RTX 3060s are no longer offered beside QLoRA on the card itself (costlier by MAX_COST_GAP)
    assert {"lower_precision", "cpu_offload", "larger_gpu"} <= set(kinds)
    qlora = kinds["lower_precision"]
    assert qlora.plan.method == "qlora" and qlora.estimate.budget_bytes < 11 * 2**30
    text = format_suggestions(res)
    lines = [line for line in text.splitlines() if line.startswith("  ") and ". [" in line]
    assert len(lines) == len(res.suggestions)
    assert all("ms per training token" in line for line in lines)
    offload = next(line for line in lines if "[cpu_offload]" in line)
    assert "of host RAM" in offload
    big = suggest(TrainingPlan(model="meta-llama/Llama-3.1-70B", gpu="RTX 4090"))
    assert {"cpu_offload", "larger_gpu", "more_gpus"} <= {s.cost.kind for s in big.suggestions}
    assert all("host RAM" in line for line in format_suggestions(big).splitlines() if "[cpu_offload]" in line)


def test_slowdown_is_a_figure():
    plan = _plan(SPREAD[1])
    rm = resolve_model(plan.model)
    ckpt = cost_of(plan, plan.replace(gradient_checkpointing=True), rm)
    assert ckpt.slowdown_fraction > 0.1 and "slower" in ckpt.summary
    assert ckpt.user_cost > 0 and ckpt.kind == "same_math"


@pytest.mark.parametrize("keep", [["seq_len", "method"], ["num_gpus"], ["batch_size", "gradient_checkpointing"],
                                  ["method", "num_gpus", "sharding", "optim"]])
def test_pins_are_respected(keep):
    for kw in (SPREAD[0], SPREAD[1], SPREAD[6], SPREAD[9]):
        plan = _plan(kw)
        res = suggest(plan, keep=keep)
        assert res.keep == keep
        for s in res.suggestions:
            assert not {c.field for c in s.changes} & set(keep)
            for name in keep:
                assert getattr(s.plan, name) == getattr(plan, name)
        if "num_gpus" in keep:
            assert res.min_gpus is None


def test_unknown_pin_names_the_field_and_lists_valid_ones():
    with pytest.raises(PlanError) as err:
        suggest(_plan(SPREAD[0]), keep=["seqlen"])
    assert "seqlen" in str(err.value) and "seq_len" in str(err.value)
    assert err.value.field == "keep"


def test_a_plan_that_fits_needs_nothing():
    res = suggest(TrainingPlan(model="Qwen/Qwen2.5-0.5B", gpu="H100 SXM"))
    assert res.fits_already and res.suggestions == [] and not res.nothing_fits


def test_a_plan_without_gpu_is_refused():
    with pytest.raises(PlanError):
        suggest(TrainingPlan(model="Qwen/Qwen2.5-0.5B"))


def test_nothing_fits_reports_min_reachable_smallest_gpu_and_gpu_count():
    plan = TrainingPlan(model="meta-llama/Llama-3.1-8B", method="full", gpu_vram_gb=16, seq_len=1024, batch_size=1)
    res = suggest(plan, keep=["method", "seq_len", "offload_params", "offload_optimizer"])
    assert res.nothing_fits
    assert all(s.cost.kind in ("more_gpus", "larger_gpu") for s in res.suggestions)
    assert res.min_reachable_bytes is not None
    assert res.min_reachable_bytes > 16 * 2**30  # still too big for the card
    assert res.min_reachable_bytes < res.original.budget_bytes
    assert res.smallest_gpu is not None
    assert estimate(plan.replace(gpu_vram_gb=None, gpu=res.smallest_gpu)).verdict == "fits"
    # every catalog GPU smaller than it cannot hold the plan
    assert res.smallest_gpu_usable_bytes >= res.original.budget_bytes
    assert res.min_gpus is not None and res.min_gpus > 1
    fits_n = plan.replace(num_gpus=res.min_gpus, sharding=res.min_gpus_sharding)
    assert estimate(fits_n).verdict == "fits"
    assert res.notes


def test_nothing_fits_anywhere_with_one_gpu_only():
    plan = TrainingPlan(model="Qwen/Qwen2.5-72B-Instruct", method="full", gpu="RTX 3060 12GB", seq_len=8192)
    res = suggest(plan, keep=["method", "num_gpus", "seq_len", "offload_params"])
    assert res.nothing_fits and res.suggestions == []
    assert res.min_reachable_bytes and res.min_reachable_bytes > res.original.gpu_usable_bytes


def test_suggest_is_deterministic():
    plan = _plan(SPREAD[3])
    a, b = suggest(plan), suggest(plan)
    assert a.model_dump() == b.model_dump()


# ------------------------------------------------------------------ throughput

def test_throughput_is_positive_and_labelled(results):
    for _plan, res in results:
        tp = res.original_throughput
        assert tp.approximate and "approximate" in tp.label
        assert tp.tokens_per_second > 0 and math.isfinite(tp.tokens_per_second)
        for s in res.suggestions:
            assert s.throughput.tokens_per_second > 0


def test_throughput_moves_the_right_way():
    base = TrainingPlan(model="meta-llama/Llama-3.1-8B", method="lora", gpu="A100 80GB SXM", seq_len=2048,
                        gradient_checkpointing=False)
    t = throughput(base).tokens_per_second
    # checkpointing adds a forward: slower, by less than a whole step
    assert 0.6 * t < throughput(base.replace(gradient_checkpointing=True)).tokens_per_second < t
    # QLoRA's dequantisation is per weight pass, not per token (docs/search.md): it costs time on a short micro-step and
    # next to nothing on a long one (torchtune's and LLaMA-Factory's tables: within 2% at 4-8k tokens per micro-step)
    short = base.replace(seq_len=512, batch_size=1)
    assert throughput(short.replace(method="qlora")).tokens_per_second < throughput(short).tokens_per_second
    assert 0.9 < throughput(base.replace(method="qlora")).tokens_per_second / t < 1.1
    # full fine-tuning computes the weight gradients LoRA skips
    assert throughput(base.replace(method="full")).tokens_per_second < t
    # a faster GPU is faster; a longer context costs more per token
    assert throughput(base.replace(gpu="H100 SXM")).tokens_per_second > t
    assert throughput(base.replace(seq_len=8192)).tokens_per_second < t
    # CPU offload is slower; more GPUs give more tokens per second in all
    sharded = base.replace(sharding="zero2")
    assert (
        throughput(sharded.replace(offload_optimizer=True)).tokens_per_second <= throughput(sharded).tokens_per_second
    )
    assert throughput(base.replace(num_gpus=4, sharding="ddp")).tokens_per_second > t


def test_training_time_is_tokens_over_throughput():
    plan = TrainingPlan(model="Qwen/Qwen2.5-1.5B", method="lora", gpu="RTX 4090")
    one = throughput(plan, training_tokens=10_000_000)
    two = throughput(plan, training_tokens=20_000_000)
    assert one.training_seconds == pytest.approx(10_000_000 / one.tokens_per_second)
    assert two.training_hours == pytest.approx(2 * one.training_hours)


# Matmul parameters per token, by hand from the published config.json files (not from the spec the estimator parsed):
# Llama-3.1-8B: hidden 4096, intermediate 14336, 32 layers, 32 heads x 128, 8 KV heads x 128, vocab 128,256, untied.
#   per layer q 4096x4096 + k 4096x1024 + v 4096x1024 + o 4096x4096 + gate/up/down 3 x 4096x14336 = 218,103,808;
#   x 32 = 6,979,321,856; + lm_head 128,256 x 4096 = 525,336,576 -> 7,504,658,432 (the input embedding is a lookup).
#   Check against the published total, 8,030,261,248 parameters (measured: base_weight_dtypes of case v14 in
#   benchmarks/validation/results/fake-cohort-v2-part2.jsonl): 7,504,658,432 + embedding 525,336,576 + 65 RMSNorm
#   weights x 4096 = 266,240.
LLAMA8B_MATMUL = 7_504_658_432
# LoRA's default adapters, r 16 on q_proj and v_proj: 32 x 16 x ((4096 + 4096) + (4096 + 1024)) = 6,815,744
# (case v14 above measures trainable_params 6,815,744).
LLAMA8B_LORA = 6_815_744
# Qwen3-30B-A3B: hidden 2048, 48 layers, 32 heads x 128, 4 KV heads x 128, 128 experts of moe_intermediate 768, 8 per
# token, vocab 151,936, untied. Per layer q 2048x4096 + k 2048x512 + v 2048x512 + o 4096x2048 = 18,874,368, the router
# 2048 x 128 = 262,144, 8 active experts x 3 x 2048 x 768 = 37,748,736: 56,885,248; x 48 = 2,730,491,904; + lm_head
# 151,936 x 2048 = 311,164,928 -> 3,041,656,832. With the embedding (311,164,928) 3.35B: the model card's "3.3B
# activated" of "30.5B" total (huggingface.co/Qwen/Qwen3-30B-A3B).
QWEN3_MOE_ACTIVE_MATMUL = 3_041_656_832


def test_flops_per_token_follow_the_formula():
    """Training FLOPs per token at a one-token context are 6N (Kaplan et al. 2020, "Scaling Laws for Neural Language
    Models", C = 6N: 2N forward, 4N backward), N the matmul parameters a token goes through; a frozen base skips the
    weight gradients (4N) and the adapters cost 6 x their parameters. Tolerance 1e-4: at S = 1 all that is left
    besides the matmuls is attention, 4 x layers x q_dim x 1 = 524,288 FLOPs forward for Llama-3.1-8B (about 1e-5 of
    the total with its backward); a 1% error in N would be 100 times the tolerance."""
    rm = resolve_model("meta-llama/Llama-3.1-8B")
    spec = rm.spec
    full = flops_per_token(TrainingPlan(model="meta-llama/Llama-3.1-8B", method="full", seq_len=1,
                                        gradient_checkpointing=False), spec)
    assert full.total == pytest.approx(6 * LLAMA8B_MATMUL, rel=1e-4)  # 45,027,950,592
    lora = flops_per_token(TrainingPlan(model="meta-llama/Llama-3.1-8B", seq_len=1, gradient_checkpointing=False),
                           spec)
    assert lora.total == pytest.approx(4 * LLAMA8B_MATMUL + 6 * LLAMA8B_LORA, rel=1e-4)  # 30,059,528,192
    # MoE: the active parameters (8 of 128 experts), about a tenth of 6 x the 30.5B total
    moe = resolve_model("Qwen/Qwen3-30B-A3B").spec
    f = flops_per_token(TrainingPlan(model="Qwen/Qwen3-30B-A3B", method="full", seq_len=1,
                                     gradient_checkpointing=False), moe)
    assert f.total == pytest.approx(6 * QWEN3_MOE_ACTIVE_MATMUL, rel=1e-4)  # 18,249,940,992


def test_a_catalogless_gpu_uses_the_reference_and_says_so():
    tp = throughput(TrainingPlan(model="Qwen/Qwen2.5-1.5B", gpu_vram_gb=24))
    assert tp.gpu_assumed and tp.notes


# ------------------------------------------------------------------ the CLI

def test_cli_suggest_json_has_the_tool_structure(capsys):
    from canifinetune.server.cli import main

    code = main(["suggest", "--model", "meta-llama/Llama-3.1-8B", "--method", "full", "--gpu", "RTX 4090",
                 "--seq-len", "4096", "--keep", "seq_len", "--keep", "num_gpus", "--training-tokens", "1000000",
                 "--json"])
    out = capsys.readouterr().out
    data = json.loads(out)
    assert code == 0
    assert data["keep"] == ["seq_len", "num_gpus"]
    assert data["suggestions"]
    for item in data["suggestions"]:
        assert item["changes"] and all({"field", "old", "new"} <= set(c) for c in item["changes"])
        assert item["estimate"]["verdict"] == "fits"
        assert {"tier", "summary", "slowdown_fraction", "details"} <= set(item["cost"])
        assert item["throughput"]["training_hours"] > 0
        assert not {c["field"] for c in item["changes"]} & {"seq_len", "num_gpus"}
    for key in ("nothing_fits", "min_reachable_bytes", "smallest_gpu", "min_gpus", "original", "cost_model"):
        assert key in data


def test_cli_suggest_text_and_bad_pin(capsys):
    from canifinetune.server.cli import main

    assert main(["suggest", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "RTX 4090", "--seq-len", "4096",
                 "--no-gradient-checkpointing"]) == 0
    assert "1. [" in capsys.readouterr().out
    assert main(["suggest", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "RTX 4090", "--keep", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_more_nodes_only_when_one_does_not_fit_and_the_suggestion_says_what_a_node_is():
    """Whole machines of the card's max_per_node, with num_nodes and gpus_per_node set (issue 27)."""
    plan = TrainingPlan(model="meta-llama/Llama-3.1-70B", method="full", gpu="H100 SXM", num_gpus=8,
                        sharding="zero3", seq_len=4096, optim="adamw_torch")
    res = suggest(plan, keep=["method", "seq_len", "optim", "offload_optimizer", "offload_params", "gpu"])
    assert res.suggestions
    for s in res.suggestions:
        p = s.plan
        assert p.num_nodes > 1 and p.gpus_per_node == 8 and p.num_gpus == 8 * p.num_nodes, s.changes
        assert {"num_gpus", "num_nodes", "gpus_per_node"} <= {c.field for c in s.changes}
        words = f"{p.num_nodes} nodes of 8 x H100 SXM ({p.num_gpus} GPUs) with {p.sharding}; a node is one machine " \
                "of 8 GPUs, the catalog's max_per_node"
        assert any(words in d for d in s.cost.details), s.cost.details
        assert estimate(p).verdict == "fits"
    # a plan already on several nodes grows by whole nodes of its own size
    on_nodes = plan.replace(num_nodes=2, gpus_per_node=4)
    grown = suggest(on_nodes, keep=["method", "seq_len", "optim", "offload_optimizer", "offload_params", "gpu"])
    for s in grown.suggestions:
        if s.plan.num_gpus > on_nodes.num_gpus:
            assert s.plan.gpus_per_node == 4 and s.plan.num_gpus == 4 * s.plan.num_nodes
            assert any("as in the plan" in d for d in s.cost.details), s.cost.details


def test_one_machine_counts_stay_one_node():
    plan = TrainingPlan(model="meta-llama/Llama-3.1-8B", method="full", gpu="A100 40GB", seq_len=2048,
                        batch_size=1)
    res = suggest(plan, keep=["method", "seq_len", "offload_optimizer", "offload_params", "gpu"], max_suggestions=8)
    more = [s for s in res.suggestions if s.cost.kind == "more_gpus"]
    assert more and all(s.plan.num_nodes == 1 and s.plan.num_gpus <= 8 for s in more)
    assert all(c.field not in ("num_nodes", "gpus_per_node") for s in more for c in s.changes)
