"""Activation offloading (TRL 1.16's activation_offloading, torchtune 0.6.1's enable_activation_offloading) with
gradient checkpointing: the block inputs leave the GPU (estimator/memory.py offload_stash_bytes and the two terms beside
it), and what is not modelled is refused by name. The figures against the libraries' own OffloadActivations run under
fake tensors are cohort v27 (docs/validation.md)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from canifinetune.estimator import memory as m
from canifinetune.estimator.allocator import round_block
from canifinetune.estimator.errors import PlanError
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.model_sources import resolve_model
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.resolved import resolve

QWEN = "Qwen/Qwen2.5-0.5B"  # config.json: hidden_size 896, 24 layers
HIDDEN, LAYERS = 896, 24


def _resolved(**fields):
    plan = TrainingPlan(model=QWEN, **fields)
    return resolve(plan, resolve_model(QWEN).spec)


def test_the_terms_are_block_inputs_from_the_config():
    r = _resolved(method="lora", seq_len=4096, batch_size=2, activation_offloading=True)
    block_input = round_block(2 * 4096 * 2 * HIDDEN)  # bf16 hidden states of 8,192 tokens
    assert m.checkpoint_boundary_bytes(r) == block_input
    assert m.offload_stash_bytes(r) == m.OFFLOAD_FORWARD_STASH_TENSORS * block_input == 5 * block_input
    assert m.offload_brought_back_bytes(r) == 2 * block_input
    assert m.offload_host_bytes(r) == LAYERS * block_input


def test_the_terms_are_zero_without_offloading():
    r = _resolved(method="lora", seq_len=4096, batch_size=2)
    assert m.offload_stash_bytes(r) == m.offload_brought_back_bytes(r) == m.offload_host_bytes(r) == 0


@pytest.mark.parametrize("framework, method", [("trl", "lora"), ("trl", "qlora"), ("torchtune", "lora")])
def test_offloading_frees_the_checkpointed_block_inputs(framework, method):
    base = dict(model=QWEN, method=method, seq_len=4096, batch_size=2, framework=framework)
    kept = estimate(TrainingPlan(**base))
    offloaded = estimate(TrainingPlan(**base, activation_offloading=True))
    block_input = round_block(2 * 4096 * 2 * HIDDEN)
    freed = kept.peak_allocated_bytes - offloaded.peak_allocated_bytes
    # the 23 block inputs beyond block 0's leave the GPU; the forward stash (5) or the pair brought back (2) stays
    assert (LAYERS - 1 - 5) * block_input <= freed <= (LAYERS - 1) * block_input
    assert offloaded.host_memory_bytes == LAYERS * block_input
    activations = next(c for c in offloaded.breakdown if c.name == "activations")
    assert "activation offloading" in activations.explanation


@pytest.mark.parametrize("framework, model, batch", [("trl", QWEN, 2), ("torchtune", "meta-llama/Llama-3.2-1B", 1)])
def test_full_fine_tuning_peaks_where_offloading_frees_nothing(framework, model, batch):
    # the peak is the end of backward (the tied embedding's gradients), when every block input has been used:
    # measured so under both stacks on these two plans (cohort v27's exploratory runs); the pair brought back is the
    # estimate's only cost
    base = dict(model=model, method="full", seq_len=2048, batch_size=batch, framework=framework)
    kept = estimate(TrainingPlan(**base))
    offloaded = estimate(TrainingPlan(**base, activation_offloading=True))
    block_input = round_block(2 * 2048 * batch * resolve_model(model).spec.hidden_size)
    assert kept.peak_phase == offloaded.peak_phase == "backward"
    assert 0 <= offloaded.peak_allocated_bytes - kept.peak_allocated_bytes <= 2 * block_input


def test_the_host_memory_of_offloaded_activations_is_checked():
    plan = TrainingPlan(model=QWEN, method="lora", seq_len=32768, batch_size=8, activation_offloading=True,
                        gpu="H100 80GB", host_ram_gb=8)
    e = estimate(plan)
    assert e.verdict == "does_not_fit" and "host RAM" in e.verdict_reason


@pytest.mark.parametrize("fields, word", [
    ({"framework": "axolotl"}, "activation_offloading"),
    ({"framework": "llama_factory"}, "activation_offloading"),
    ({"gradient_checkpointing": False}, "gradient_checkpointing"),
    ({"num_gpus": 2, "sharding": "ddp"}, "num_gpus"),
    ({"method": "lora", "load_in_8bit": True}, "load_in_8bit"),
    ({"trainer": "dpo", "method": "lora"}, "trainer"),
])
def test_what_is_not_modelled_is_refused_by_name(fields, word):
    with pytest.raises(ValidationError, match=word):
        TrainingPlan(model=QWEN, activation_offloading=True, **fields)


def test_a_vision_language_model_is_refused_by_name():
    with pytest.raises(PlanError, match="activation_offloading"):
        estimate(TrainingPlan(model="Qwen/Qwen2.5-VL-3B-Instruct", method="lora", activation_offloading=True))
    with pytest.raises(ValidationError, match="image_size"):
        TrainingPlan(model=QWEN, image_size="640x480", activation_offloading=True)


def test_torch_compile_is_refused_by_name_and_false_is_the_eager_run():
    with pytest.raises(ValidationError, match=r"torch_compile: torch\.compile's memory is not modelled"):
        TrainingPlan(model=QWEN, torch_compile=True)
    assert estimate(TrainingPlan(model=QWEN, torch_compile=False)).peak_allocated_bytes == estimate(
        TrainingPlan(model=QWEN)).peak_allocated_bytes


def test_the_recipe_trains_with_the_plans_offloading():
    from canifinetune.recipes.runtime import sft_config_kwargs

    plan = TrainingPlan(model=QWEN, method="lora", activation_offloading=True)
    assert sft_config_kwargs(plan, output_dir="out", use_cpu=False)["activation_offloading"] is True
    assert sft_config_kwargs(plan.replace(activation_offloading=False), output_dir="out",
                             use_cpu=False)["activation_offloading"] is False


def test_trls_offloader_takes_a_softcapping_models_tanh_output_off_the_loss_backward():
    # gemma-2-2b config.json: vocab 256,000, final_logit_softcapping 30; TRL's context covers the loss (cohort v27 o06)
    plan = TrainingPlan(model="google/gemma-2-2b", method="lora", seq_len=4096, batch_size=2,
                        loss_implementation="standard", activation_offloading=True)
    r = resolve(plan, resolve_model(plan.model).spec)
    assert m.offloaded_softcap_bytes(r) == round_block(2 * 8192 * 256_000)
    for other in (plan.replace(loss_implementation="chunked"), plan.replace(activation_offloading=False)):
        assert m.offloaded_softcap_bytes(resolve(other, r.spec)) == 0
    assert m.offloaded_softcap_bytes(_resolved(method="lora", loss_implementation="standard",
                                               activation_offloading=True)) == 0  # Qwen: no softcap
