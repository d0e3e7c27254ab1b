"""DPO, ORPO, KTO, reward and GRPO's loss step run by TRL's own trainers under fake tensors
(benchmarks/validation/pref_trainer_fake.py, issue 24 item 1): the trainer built as recipes/trainers.py builds it, each
step its ``training_step``."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")

from harness_modules import TINY_LLAMA_CONFIG as TINY
from harness_modules import load_harness as _load

from canifinetune.estimator.plan import TrainingPlan

fake_mode = _load("fake_mode")
pref = _load("pref_trainer_fake")
trainer_fake = _load("trainer_fake")

GRPO = {"trainer": "grpo", "num_generations": 2, "max_completion_length": 32}


def _plan(**kw) -> TrainingPlan:
    return TrainingPlan(**{"model": "tiny", "seq_len": 64, "batch_size": 2, **kw})


CASES = [
    # (plan fields, trainer class, reference, a metric only the trainer's own compute_loss records)
    ({"trainer": "dpo", "method": "lora"}, "DPOTrainer", "adapter_disabled", "rewards/margins"),
    ({"trainer": "dpo", "method": "full"}, "DPOTrainer", "copy", "rewards/margins"),
    ({"trainer": "dpo", "method": "lora", "precompute_ref_log_probs": True}, "DPOTrainer", "none", "rewards/margins"),
    ({"trainer": "orpo", "method": "lora"}, "ORPOTrainer", "none", "log_odds_ratio"),
    ({"trainer": "orpo", "method": "full"}, "ORPOTrainer", "none", "log_odds_ratio"),
    ({"trainer": "kto", "method": "lora"}, "KTOTrainer", "adapter_disabled", "kl"),
    ({"trainer": "reward", "method": "full"}, "RewardTrainer", "none", "accuracy"),
    ({**GRPO, "method": "full", "beta": 0.04}, "GRPOTrainer", "copy", "kl"),
]


@pytest.mark.parametrize(("fields", "cls", "reference", "metric"), CASES,
                         ids=["dpo-lora", "dpo-full", "dpo-precompute", "orpo-lora", "orpo-full", "kto-lora",
                              "reward-full", "grpo-full-beta"])
def test_trainer_step_fake_equals_real(fields, cls, reference, metric):
    """Fake tensors count what real tensors hold, through the trainer's own step: the emulated known batch values
    (nonzero, boolean-mask indexing, the fused head's compact path) and precompute columns give the real shapes."""
    plan = _plan(**fields)
    fake = pref.run_pref_trainer_steps(plan, TINY, fake=True, route_sdpa=False)
    real = pref.run_pref_trainer_steps(plan, TINY, fake=False, route_sdpa=False)
    assert real["peak_allocated_bytes"] > 0
    assert fake["peak_allocated_bytes"] == pytest.approx(real["peak_allocated_bytes"], rel=0.01)
    assert fake["peak_phase"] == real["peak_phase"]
    assert fake["phase_peaks"].keys() == real["phase_peaks"].keys()
    for report in (fake, real):
        assert report["trainer_class"] == cls  # TRL's class ran the step
        assert metric in report["trainer_metrics"]  # ... through its own compute_loss
        assert report["reference"] == reference
        assert report["driver"] == "trainer"
    has_reference_phase = any(k.endswith(".reference") for k in fake["phase_peaks"])
    assert has_reference_phase == (reference in ("copy", "adapter_disabled") and fields["trainer"] != "grpo")
    # reads of the batch's real values (ORPO reads none: nothing it computes from the batch changes a shape)
    assert (fake["known_scalar_reads"] > 0) == (fields["trainer"] != "orpo")
    assert real["scalar_reads"] == real["known_scalar_reads"] == 0
    # ORPO's get_batch_logps: TRL's Triton log-softmax (emulation 8), forward and backward, once a step
    launches = {"_forward_kernel": 2, "_backward_kernel": 2} if fields["trainer"] == "orpo" else {}
    assert fake["triton_kernel_launches"] == real["triton_kernel_launches"] == launches


def test_compact_head_scores_only_the_completion():
    """On CUDA TRL's fused head scores the labelled positions only; GRPO's prompt positions are not labelled, so its
    compact path holds less than the CPU build's (every position), which trainer_fake.py's loop measures."""
    plan = _plan(**{**GRPO, "method": "lora", "seq_len": 128})
    compact = pref.run_pref_trainer_steps(plan, TINY, compact=True)
    every = pref.run_pref_trainer_steps(plan, TINY, compact=False)
    loop = trainer_fake.run_trainer_steps(plan, TINY)
    assert compact["fused_head"] == "compact" and every["fused_head"] == "every_position"
    assert compact["peak_allocated_bytes"] < every["peak_allocated_bytes"]
    assert every["peak_allocated_bytes"] == pytest.approx(loop["peak_allocated_bytes"], rel=0.02)


def test_emulations_are_undone_and_scalar_reads_stay_loud():
    """The patches live only while the harness runs: the constant limit, TRL's _use_triton, the precompute pass, the
    Triton log-softmax branch and its stub ``triton``."""
    from torch._subclasses import fake_tensor
    from trl.trainer import dpo_trainer, utils

    limit, use_triton = fake_tensor.CONSTANT_NUMEL_LIMIT, utils._use_triton
    precompute = dpo_trainer.DPOTrainer._precompute_ref_logps
    triton_branch = (utils.is_triton_available, utils._supports_trl_loss_kernel)
    report = pref.run_pref_trainer_steps(_plan(trainer="kto", method="lora"), TINY)
    assert report["scalar_reads"] > 0  # metrics of the model's outputs: answered 1, counted
    assert limit == fake_tensor.CONSTANT_NUMEL_LIMIT
    assert utils._use_triton is use_triton
    assert dpo_trainer.DPOTrainer._precompute_ref_logps is precompute
    assert (utils.is_triton_available, utils._supports_trl_loss_kernel) == triton_branch
    assert not hasattr(utils, "_fused_logprob_entropy")  # a CPU build defines it only with Triton
    assert "triton" not in sys.modules
    assert pref._counter(fake_mode).stub_scalars is False


@pytest.mark.parametrize(("trainer", "cls"), [("reward", "RewardTrainer"), ("orpo", "ORPOTrainer")])
def test_measure_trainer_fake_runs_the_trainer_by_default(trainer, cls):
    plan = {"model": "tiny", "seq_len": 64, "batch_size": 2, "trainer": trainer, "method": "lora"}
    by_trainer = trainer_fake.measure_trainer_fake(plan, TINY)
    by_loop = trainer_fake.measure_trainer_fake(plan, TINY, driver="loop")
    assert by_trainer["driver"] == "trainer" and by_trainer["trainer_class"] == cls
    assert by_loop["driver"] == "loop" and "trainer_class" not in by_loop
    assert by_trainer["peak_allocated_bytes"] == pytest.approx(by_loop["peak_allocated_bytes"], rel=0.05)


def test_orpo_qlora_is_prepared_as_orpo_trainer_prepares_it():
    """ORPOTrainer.__init__ on a 4-bit base: prepare_model_for_kbit_training (the packed weights stay packed, as a
    real Params4bit does), PEFT's adapters left in fp32 (no bf16 cast, unlike the loop's recipe build), norms fp32 and
    the embedding bf16 (peft_module_casting_to_bf16). The fp32 adapters make the difference from the loop: 2 more
    bytes of weight and 4 of AdamW state per trainable parameter (on cohort v6's QLoRA plans: +6.5 and +10.2 MB)."""
    plan = _plan(trainer="orpo", method="qlora")
    by_trainer = pref.run_pref_trainer_steps(plan, TINY)
    by_loop = trainer_fake.run_trainer_steps(plan, TINY)
    resolved = by_trainer["resolved"]
    assert "4bit-nf4" in resolved["base_weight_dtypes"] and resolved["embedding_dtype"] == "bfloat16"
    assert resolved["adapter_dtypes"] == {"float32": resolved["trainable_params"]}
    assert by_loop["resolved"]["adapter_dtypes"] == {"bfloat16": resolved["trainable_params"]}
    assert by_trainer["triton_kernel_launches"] == {"_forward_kernel": 2, "_backward_kernel": 2}
    assert by_trainer["peak_categories"]["optimizer_states"] > by_loop["peak_categories"]["optimizer_states"]
    assert by_trainer["peak_allocated_bytes"] > by_loop["peak_allocated_bytes"]
