"""Activation offloading measured by running the libraries' own OffloadActivations under fake tensors, with the CUDA
path a CPU build cannot take emulated (benchmarks/validation/offload_emulation.py): TRL's SFT through the trainer-driven
harness (sft_trainer_fake.py), torchtune's recipes in their own environment (torchtune_fake.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")

from harness_modules import TINY_LLAMA_CONFIG as TINY
from harness_modules import load_harness as _load
from stack_harness import run_case, stack_python

from canifinetune.estimator.plan import TrainingPlan

fake_mode = _load("fake_mode")
sft_trainer_fake = _load("sft_trainer_fake")
offload_emulation = _load("offload_emulation")

# many layers, a long sequence and a small vocabulary: the checkpointed layers' saved inputs dominate the backward
DEEP = {**TINY, "num_hidden_layers": 16, "vocab_size": 256, "max_position_embeddings": 2048}


def _plan(**kw) -> TrainingPlan:
    return TrainingPlan(**{"model": "tiny", "seq_len": 64, "batch_size": 2, "gradient_checkpointing": True,
                           "activation_offloading": True, **kw})


def test_the_emulation_round_trips_values_and_undoes_its_patches():
    """With real tensors, TRL's offloader under the emulation gives the gradients of a run without it (each offloaded
    tensor comes back with its values, as a new tensor); after the context, torch and TRL are as they were."""
    import torch
    from trl.models import activation_offloading as trl_offload

    def grads(offload: bool):
        torch.manual_seed(0)
        w = torch.randn(64, 64, requires_grad=True)
        x = torch.randn(8, 64)

        def step():
            h = x
            for _ in range(8):  # 16 saved tensors of 2 KiB: more than the forward stash keeps (5)
                h = torch.tanh(h @ w)
            h.sum().backward()

        if offload:
            with trl_offload.OffloadActivations():
                step()
        else:
            step()
        return w.grad

    data_ptr, module_torch = torch.UntypedStorage.data_ptr, trl_offload.torch
    expected = grads(False)
    with offload_emulation.emulated_offloading() as stats:
        got = grads(True)
    assert torch.equal(got, expected)
    report = stats.report()
    assert report["brought_back"] > 0 and report["brought_back"] + report["returned_from_stash"] == report["offloaded"]
    assert report["host_peak_bytes"] > 0
    assert torch.UntypedStorage.data_ptr == data_ptr and trl_offload.torch is module_torch is torch


def test_a_host_copy_comes_back_as_a_new_allocation():
    """``.to(device)`` of a host copy allocates a new tensor of the original's shape and strides (a plain ``.to("cpu")``
    of a cpu tensor would be the same tensor); the host copy itself is on ``meta``, which the counter ignores."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    stats = offload_emulation.OffloadStats()
    with FakeTensorMode(allow_fallback_kernels=False):
        activation = torch.empty(4, 8, dtype=torch.bfloat16).t()  # a transposed (dense) view: empty_like keeps strides
        host = offload_emulation._host_like(activation, stats)
        host.copy_(activation, non_blocking=True)
        back = host.to("cpu", non_blocking=True)
    assert host.meta.device.type == "meta"
    assert back.device.type == "cpu" and back.shape == activation.shape and back.stride() == activation.stride()
    assert back.untyped_storage()._cdata != activation.untyped_storage()._cdata
    assert stats.brought_back == 1 and stats.brought_back_bytes == 64


@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.parametrize("loss", ["standard", "chunked"])
def test_offloading_fake_equals_real(method, loss):
    """Fake tensors count what real tensors hold with TRL's offloader running in the trainer's step, to the byte, and
    the offloader takes the same decisions on both."""
    plan = _plan(method=method, loss_implementation=loss)
    fake = sft_trainer_fake.run_trainer_sft_steps(plan, TINY, fake=True, route_sdpa=False)
    real = sft_trainer_fake.run_trainer_sft_steps(plan, TINY, fake=False, route_sdpa=False)
    assert real["peak_allocated_bytes"] > 0
    assert fake["peak_allocated_bytes"] == real["peak_allocated_bytes"]
    assert fake["peak_phase"] == real["peak_phase"]
    assert fake["phase_peaks"] == real["phase_peaks"]
    assert fake["peak_categories"] == real["peak_categories"]
    assert fake["activation_offloading"] == real["activation_offloading"]


def test_the_offloader_ran_and_its_counts_add_up():
    """TRL's OffloadActivations is the trainer's context; it offloaded the checkpointed layers' inputs (two layers,
    two steps) and brought every offloaded tensor back or handed back the one still stashed; the LM head's weight
    (the fused head saves it without calling the lm_head module) is recognised as a parameter storage."""
    plan = _plan(method="lora", loss_implementation="chunked")
    report = sft_trainer_fake.run_trainer_sft_steps(plan, TINY, fake=True)
    off = report["activation_offloading"]
    assert off["context"] == "OffloadActivations" and off["managers"] == ["trl.OffloadActivations"]
    assert off["offloaded"] > 0 and off["brought_back"] > 0 and off["unpacked"] > 0
    assert off["packed"] == sum(off[k] for k in ("offloaded", "kept_deduplicated", "skipped_small",
                                                 "skipped_parameter", "skipped_other"))
    assert off["brought_back"] + off["returned_from_stash"] == off["offloaded"]
    assert off["offloaded_shapes"].get("[2, 64, 64] bfloat16", 0) >= 2 * 2  # each layer's saved input, each step
    assert off["skipped_parameter"] >= 2  # lm_head.weight, each step: the emulated pointer filter found it
    assert off["host_peak_bytes"] > 0


def test_without_offloading_there_is_no_offloader():
    plan = _plan(method="lora", activation_offloading=False)
    report = sft_trainer_fake.run_trainer_sft_steps(plan, TINY, fake=True)
    assert "activation_offloading" not in report


@pytest.mark.slow  # 16 layers at 1024 tokens, twice: about 20 s
def test_offloading_lowers_the_peak_where_checkpoint_inputs_dominate():
    """16 checkpointed layers at 1024 tokens, a 256-token vocabulary: without offloading every layer's saved input is
    on the GPU through backward; with it, a few (the forward stash, the ones just brought back) are."""
    plan = _plan(method="lora", loss_implementation="standard", seq_len=1024)
    with_offload = sft_trainer_fake.run_trainer_sft_steps(plan, DEEP, fake=True)
    without = sft_trainer_fake.run_trainer_sft_steps(plan.model_copy(update={"activation_offloading": False}), DEEP,
                                                     fake=True)
    layer_input = 2 * 1024 * 64 * 2  # batch x tokens x hidden, bf16
    assert with_offload["peak_allocated_bytes"] < without["peak_allocated_bytes"]
    # at least the inputs of the layers beyond the stash (16 - 5) are off the GPU at the peak
    assert without["peak_allocated_bytes"] - with_offload["peak_allocated_bytes"] >= (16 - 5) * layer_input
    assert with_offload["activation_offloading"]["offloaded_shapes"]["[2, 1024, 64] bfloat16"] == 2 * 16


def _torchtune(case: dict) -> dict:
    return run_case(stack_python("torchtune", ".venv-torchtune", "CANIFINETUNE_TORCHTUNE_PYTHON"), "torchtune_fake.py",
                    case)


@pytest.mark.slow  # torchtune's recipe on Qwen2.5-0.5B at 128 tokens in its own environment: about 20-40 s
def test_torchtunes_own_offloading_runs_in_its_environment():
    """torchtune's recipe builds its OffloadActivations (the CUDA device check answered as on a GPU) and offloads each
    checkpointed layer's input (24 layers, two steps); the output head's input stays (NoOpManager)."""
    measured = _torchtune({"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "seq_len": 128, "batch_size": 1,
                           "gradient_checkpointing": True, "activation_offloading": True})
    assert "error" not in measured, measured.get("error")
    assert measured["resolved"]["activations_handling_ctx"] == "OffloadActivations"
    assert measured["resolved"]["settings"]["enable_activation_offloading"] is True
    off = measured["activation_offloading"]
    assert off["managers"] == ["torchtune.OffloadActivations"]
    assert off["offloaded_shapes"]["[1, 128, 896] bfloat16"] == 2 * 24
    assert off["brought_back"] + off["returned_from_stash"] == off["offloaded"] > 0
    assert any("CUDA" in e for e in measured["emulations"])


@pytest.mark.slow
def test_torchtune_offloading_without_checkpointing_is_the_recipes_error():
    measured = _torchtune({"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "seq_len": 128, "batch_size": 1,
                           "gradient_checkpointing": False, "activation_offloading": True})
    assert "enable_activation_checkpointing is True" in measured.get("error", "")


def test_torchtune_compile_is_refused_by_name():
    """What the torchtune harness does not run is refused by name, never measured as something else (activation
    offloading is now run: test_torchtunes_own_offloading_runs_in_its_environment)."""
    measured = _torchtune({"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "seq_len": 128, "batch_size": 1,
                           "compile": True})
    assert "compile" in measured.get("error", "")
