"""The search's knobs for the trainers beyond SFT (issue 17.4): each knob, its levels, its tier, its kind and its cost
in words (estimator/knobs.py, estimator/costs.py; docs/search.md). The knobs and costs need no estimate; the
searches do: every trainer here is estimated, so a refusal of the estimate is a failure, never a skip (issue 23.9)."""

from __future__ import annotations

import pytest

from canifinetune.estimator.costs import QUALITY_WEIGHTS, cost_of, kind_of
from canifinetune.estimator.errors import PlanError
from canifinetune.estimator.knobs import build_knobs
from canifinetune.estimator.model_sources import resolve_model
from canifinetune.estimator.plan import TrainingPlan

MODEL = "Qwen/Qwen2.5-7B-Instruct"


def _plan(**kw) -> TrainingPlan:
    return TrainingPlan(**{"model": MODEL, "gpu": "RTX 4090", **kw})


def _knobs(plan: TrainingPlan, keep=()) -> dict:
    return {k.name: k for k in build_knobs(plan, resolve_model(plan.model), set(keep))}


def _cost(original: TrainingPlan, **changes):
    return cost_of(original, original.replace(**changes), resolve_model(original.model))


def test_dpo_knobs_precompute_and_the_adapter_disabled_reference():
    knobs = _knobs(_plan(trainer="dpo", reference_model="copy"))
    assert knobs["precompute_ref_log_probs"].tier == 0
    assert knobs["precompute_ref_log_probs"].levels == [{"precompute_ref_log_probs": True}]
    assert knobs["reference_model"].levels == [{"reference_model": "adapter_disabled"}]
    assert knobs["reference_model"].tier == 0
    # already precomputed, or full fine-tuning (no adapters to disable): no such knob
    assert "precompute_ref_log_probs" not in _knobs(_plan(trainer="kto", precompute_ref_log_probs=True))
    assert "reference_model" not in _knobs(_plan(trainer="dpo", method="full", reference_model="copy"))
    # pins hold
    assert "precompute_ref_log_probs" not in _knobs(_plan(trainer="dpo"), keep=["precompute_ref_log_probs"])
    # sft has none of them
    assert not {"precompute_ref_log_probs", "reference_model", "num_generations"} & set(_knobs(_plan()))


def test_same_math_costs_say_what_they_cost():
    dpo = _plan(trainer="dpo", reference_model="copy")
    c = _cost(dpo, precompute_ref_log_probs=True)
    assert (c.tier, c.kind, c.quality_penalty, c.extra_gpus) == ("same_math", "same_math", 0.0, 0)
    assert any("one pass of the reference over the whole dataset before training" in d for d in c.details)
    c = _cost(dpo, reference_model="adapter_disabled")
    assert (c.tier, c.quality_penalty) == ("same_math", 0.0)
    assert any("without a second copy of the weights" in d for d in c.details)
    grpo = _plan(trainer="grpo", use_vllm=True, seq_len=1024)
    c = _cost(grpo, vllm_gpu_memory_utilization=0.2)
    assert (c.tier, c.kind, c.quality_penalty) == ("same_math", "same_math", 0.0)
    assert any("smaller KV cache for vLLM" in d and "20%" in d and "30%" in d for d in c.details)


def test_grpo_knobs_group_size_completion_length_and_vllm():
    plan = _plan(trainer="grpo", use_vllm=True, seq_len=1024)
    knobs = _knobs(plan)
    assert knobs["vllm_gpu_memory_utilization"].tier == 0
    assert [lv["vllm_gpu_memory_utilization"] for lv in knobs["vllm_gpu_memory_utilization"].levels] == [
        0.25,
        0.2,
        0.15,
        0.1,
    ]
    assert knobs["num_generations"].tier == 1
    assert knobs["num_generations"].levels == [{"num_generations": 4}, {"num_generations": 2}]
    # shorter completions keep the prompt's share of seq_len (prompt + completion)
    levels = knobs["max_completion_length"].levels
    assert levels[0] == {"max_completion_length": 384, "seq_len": 896} and levels[-1] == {
        "max_completion_length": 128,
        "seq_len": 640,
    }
    assert knobs["vllm_mode"].tier == 2 and knobs["vllm_mode"].levels == [{"vllm_mode": "server"}]
    # with the generation batch set, it shrinks with the group (the same prompts per round), while TRL allows it
    set_gbs = _knobs(_plan(trainer="grpo", seq_len=1024, batch_size=4, generation_batch_size=32))["num_generations"]
    assert set_gbs.levels == [{"num_generations": 4, "generation_batch_size": 16},
                              {"num_generations": 2, "generation_batch_size": 8}]
    # without vLLM, or already on a server: no vLLM knobs
    assert not {"vllm_mode", "vllm_gpu_memory_utilization"} & set(_knobs(_plan(trainer="grpo", seq_len=1024)))
    assert "vllm_mode" not in _knobs(_plan(trainer="grpo", use_vllm=True, vllm_mode="server", seq_len=1024))


def test_grpo_costs_learning_and_hardware():
    plan = _plan(trainer="grpo", use_vllm=True, seq_len=1024)
    c = _cost(plan, num_generations=2)
    assert (c.tier, c.kind) == ("changes_learning", "fewer_generations")
    assert c.quality_penalty == pytest.approx(QUALITY_WEIGHTS["num_generations_per_halving"] * 2)
    assert any("noisier advantage" in d for d in c.details)
    c = _cost(plan.replace(batch_size=4, generation_batch_size=32), num_generations=4, generation_batch_size=16)
    assert c.kind == "fewer_generations" and c.quality_penalty == pytest.approx(
        QUALITY_WEIGHTS["num_generations_per_halving"]
    )
    assert any("the same 4 prompts per generation round" in d for d in c.details)
    c = _cost(plan, max_completion_length=256, seq_len=768)
    assert (c.tier, c.kind) == ("changes_learning", "shorter_context")
    assert c.quality_penalty == pytest.approx(QUALITY_WEIGHTS["completion_len_per_halving"])  # 512 -> 256, prompt kept
    assert c.context_tokens_lost == 0 and any("clipped" in d for d in c.details)
    c = _cost(plan, vllm_mode="server")
    assert (c.tier, c.kind, c.extra_gpus) == ("more_hardware", "more_gpus", 1)
    assert c.user_cost >= 4.0 * 1  # one doubling of the GPUs (1 -> 2)
    assert any("trl vllm-serve" in d for d in c.details)
    assert kind_of(plan, plan.replace(vllm_mode="server"), resolve_model(MODEL)) == "more_gpus"


# ----------------------------------------------------------------------------------------- searches (need the estimate)


def _suggest(plan: TrainingPlan, **kw):
    """suggest(); the trainer must be estimated: a PlanError (e.g. "not estimated yet") fails the test."""
    from canifinetune.estimator.search import suggest

    try:
        return suggest(plan, **kw)
    except PlanError as exc:
        pytest.fail(f"the {plan.trainer} plan must be estimated and searched: {exc}")


def test_a_dpo_plan_with_a_reference_copy_is_fixed_with_the_same_math():
    result = _suggest(_plan(trainer="dpo", reference_model="copy", seq_len=2048))
    assert not result.fits_already
    first = result.suggestions[0]
    assert first.cost.kind == "same_math" and first.estimate.verdict == "fits"
    fields = {c.field for c in first.changes}
    assert fields & {"precompute_ref_log_probs", "reference_model"}, fields


def test_a_colocated_grpo_plan_can_move_vllm_to_its_own_gpu():
    plan = _plan(trainer="grpo", use_vllm=True, vllm_gpu_memory_utilization=0.6, seq_len=1024)
    result = _suggest(plan, keep=["method", "seq_len", "max_completion_length", "num_generations"], max_suggestions=8)
    # the plan is chosen not to fit (a 7B model and vLLM's 60% on one 24 GB card): a plan that fits would leave
    # nothing to check, so it fails rather than skips
    assert not result.fits_already and result.original.verdict == "does_not_fit", result.original.verdict
    changes = [{c.field: c.new for c in s.changes} for s in result.suggestions]
    assert any(ch.get("vllm_mode") == "server" or "vllm_gpu_memory_utilization" in ch for ch in changes), changes
    for s in result.suggestions:
        assert s.estimate.verdict == "fits"
        if any(c.field == "vllm_mode" for c in s.changes):
            assert s.cost.kind == "more_gpus" and s.cost.extra_gpus >= 1


def test_the_cli_takes_the_trainer_and_its_fields(capsys):
    from canifinetune.server.cli import main

    with pytest.raises(SystemExit):
        main(["estimate", "--help"])
    out = capsys.readouterr().out
    for flag in ("--trainer", "--precompute-ref-log-probs", "--reference-model", "--beta", "--loss-type",
                 "--num-generations", "--max-completion-length", "--generation-batch-size", "--steps-per-generation",
                 "--use-vllm", "--vllm-mode", "--vllm-gpu-memory-utilization", "--vllm-max-model-length"):
        assert flag in out, flag
    assert main(["estimate", "--model", MODEL, "--trainer", "dpo", "--num-generations", "4", "--offline"]) == 2
    assert "num_generations" in capsys.readouterr().err
