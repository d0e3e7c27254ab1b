"""The trainer-driven SFT measurement (benchmarks/validation/sft_trainer_fake.py): the recipe's own trainer runs each
step, so object lifetimes are the trainer's (issue 24 item 1)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")

from harness_modules import TINY_LLAMA_CONFIG as TINY
from harness_modules import load_harness as _load

from canifinetune.estimator.plan import TrainingPlan

fake_mode = _load("fake_mode")
sft_trainer_fake = _load("sft_trainer_fake")



def _plan(**kw) -> TrainingPlan:
    return TrainingPlan(**{"model": "tiny", "seq_len": 64, "batch_size": 2, **kw})


@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.parametrize("loss", ["standard", "chunked"])
def test_trainer_step_fake_equals_real(method, loss):
    """Fake tensors count what real tensors hold, through the trainer's own step."""
    plan = _plan(method=method, loss_implementation=loss)
    fake = sft_trainer_fake.run_trainer_sft_steps(plan, TINY, fake=True, route_sdpa=False)
    real = sft_trainer_fake.run_trainer_sft_steps(plan, TINY, fake=False, route_sdpa=False)
    assert real["peak_allocated_bytes"] > 0
    assert fake["peak_allocated_bytes"] == pytest.approx(real["peak_allocated_bytes"], rel=0.01)
    assert fake["peak_phase"] == real["peak_phase"]
    expected_class = "SFTTrainer" if loss == "chunked" else "StandardLossSFTTrainer"
    assert fake["trainer_class"] == real["trainer_class"] == expected_class


def test_the_trainer_frees_the_logits_before_backward():
    """transformers' compute_loss returns the loss alone: at the start of backward the compute-dtype logits the old
    loop kept through backward are gone. The backward peak is a*T*V lower (bf16 logits), within the few small
    tensors each step keeps differently (the trainer's metrics, the loop's loss); the forward is the same."""
    plan = _plan(method="lora", loss_implementation="standard", seq_len=256, batch_size=4)
    trainer = sft_trainer_fake.run_trainer_sft_steps(plan, TINY, fake=True)
    loop = fake_mode.run_steps(plan, TINY, fake=True, loss="model")
    logits = fake_mode.round_block(2 * plan.batch_size * plan.seq_len * TINY["vocab_size"])
    assert trainer["peak_phase"] == loop["peak_phase"] == "step2.backward"
    drop = loop["phase_peaks"]["step2.backward"] - trainer["phase_peaks"]["step2.backward"]
    assert drop == pytest.approx(logits, abs=16 * 1024)
    assert trainer["phase_peaks"]["step2.forward"] == pytest.approx(loop["phase_peaks"]["step2.forward"], abs=16 * 1024)


def test_scalar_reads_are_answered_only_inside_the_trainer_step():
    """TRL's metrics read fake scalars (stubbed, counted); outside training_step a read still fails."""
    plan = _plan(method="lora")
    report = sft_trainer_fake.run_trainer_sft_steps(plan, TINY, fake=True)
    assert report["scalar_reads"] > 0
    counter = sft_trainer_fake._counter_with_scalar_reads(fake_mode)
    assert counter.stub_scalars is False
