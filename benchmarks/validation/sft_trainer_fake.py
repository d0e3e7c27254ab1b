"""An SFT step run by the recipe's own trainer under fake tensors: object lifetimes are the trainer's.

The loop in ``fake_mode.run_steps`` writes the step out (``outputs = model(...)``; ``loss.backward()``) and so keeps
the model output alive through backward, which no trainer does: transformers 5.24's ``Trainer.compute_loss`` (and
TRL 1.16's ``SFTTrainer.compute_loss``) returns the loss alone, so the output, its logits and accelerate's fp32 copy
of them are freed before backward starts (issue 24). Here the step is the trainer's:

- the model is built as the runtime builds it (``recipes/model_setup.build_model``), then handed to the trainer class
  the runtime uses (``recipes/runtime._trainer_class``: TRL's ``SFTTrainer``, or its subclass calling
  ``transformers.Trainer.compute_loss`` for the standard loss) with the runtime's ``SFTConfig``
  (``runtime.sft_config_kwargs``) and a dataset of full-length token-id rows, so ``SFTTrainer.__init__`` does what it
  does to a model (its fused LM head, ``enable_input_require_grads``, the bf16 cast of QLoRA adapters);
- ``trainer.accelerator.prepare(model, optimizer)`` wraps the forward as a training run does (autocast, fp32 outputs);
- each step is ``trainer.training_step(model, batch, num_items_in_batch)`` on a batch from the trainer's own
  ``data_collator``, then the optimizer phase of ``fake_mode.optimizer_phase`` (Trainer's order: clip, step,
  zero_grad); with gradient accumulation two micro-batches per optimizer step (:func:`accumulated_micro_steps`: the
  second, like every later one, runs with the gradients of the earlier ones alive, as Trainer keeps them until its
  optimizer step).

Where a CPU build or fake tensors take a path a CUDA run does not, the CUDA path is emulated (docs/validation.md,
"Emulated CUDA paths"): the GPU routing of ``fake_mode.gpu_routing``; the optimizer of ``model_setup.build_optimizer``
(foreach/fused as on CUDA); the all-ones ``attention_mask`` of unpadded rows is not passed to the model (on a GPU
transformers reads the mask, finds no padding and drops it for ``is_causal``; it cannot read a fake mask, and would
keep a 4-D mask that rules out the flash kernel), while the trainer's own code still sees it; and a read of a fake
scalar (``.item()``, ``bool(t)``: TRL's logging metrics and token counts) returns 1, which allocates nothing. Those
reads are counted in the report (``scalar_reads``).

Activation offloading (``plan.activation_offloading``, with gradient checkpointing: TRL 1.16's
``SFTConfig(activation_offloading=True)``, passed by ``runtime.sft_config_kwargs``): the trainer builds its own
``OffloadActivations`` (``get_act_offloading_ctx_manager(model)`` in ``SFTTrainer.__init__``) and enters it around
each ``training_step`` (forward and backward), running TRL's code under ``offload_emulation.emulated_offloading``
(the emulated CUDA path of its streams, events, pinned host copies and storage pointers: that module's docstring);
the report's ``activation_offloading`` counts what it offloaded, kept, skipped and brought back.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any


def _fake_mode_module():
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import fake_mode

    return fake_mode


def scalar_read_counter_class(fm):
    """The live-memory counter class of the trainer-driven harnesses. While ``stub_scalars`` is set (inside
    ``training_step`` only, so the optimizer step, where bitsandbytes' kernels read scalars, still fails loudly), a read
    of a fake scalar is answered from its constant when it has one (``known_scalar_reads``: FakeTensorMode answers),
    else with 1 (``scalar_reads``)."""
    import torch

    class TrainerStepCounter(fm._make_counter_class()):
        def __init__(self):
            super().__init__()
            self.scalar_reads = 0
            self.known_scalar_reads = 0
            self.stub_scalars = False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if self.stub_scalars and func is torch.ops.aten._local_scalar_dense.default:
                if getattr(args[0], "constant", None) is not None:
                    self.known_scalar_reads += 1
                    return super().__torch_dispatch__(func, types, args, kwargs)
                self.scalar_reads += 1
                dtype = args[0].dtype
                if dtype == torch.bool:
                    return True
                return 1.0 if dtype.is_floating_point else 1
            return super().__torch_dispatch__(func, types, args, kwargs)

    return TrainerStepCounter


def category_tensors_of(fm, current):
    """The counter's categories (parameters, gradients, optimizer states) of the model and optimizer ``current()``
    returns now (either None before it is built)."""

    def category_tensors():
        model, optimizer = current()
        return {
            "parameters": fm._model_state_tensors(model) if model is not None else [],
            "gradients": [p.grad for p in model.parameters()] if model is not None else [],
            "optimizer_states": fm._optimizer_state_tensors(optimizer),
        }

    return category_tensors


def training_step_in_phase(counter, trainer, wrapped, batch, num_items: int, step: int, fake: bool) -> None:
    """One ``trainer.training_step`` in the phase ``step{n}.forward`` (its backward tags itself:
    :func:`backward_phases_after_build`), fake scalar reads answered only inside it."""
    counter.set_phase(f"step{step}.forward")
    counter.stub_scalars = fake
    trainer.training_step(wrapped, batch, num_items_in_batch=num_items)
    counter.stub_scalars = False


def _counter_with_scalar_reads(fm):
    return scalar_read_counter_class(fm)()


def stand_in_tokenizer(folder: Path):
    """A tokenizer TRL can hold: pad/eos/unk only (the samples are token ids already)."""
    from tokenizers import Tokenizer, models
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"<pad>": 0, "</s>": 1, "<unk>": 2}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def _rows(vocab: int, seq_len: int, count: int) -> list[list[int]]:
    """Full-length rows of token ids (3 and up: not the stand-in tokenizer's pad/eos/unk), deterministic."""
    import random

    rng = random.Random(0)
    return [[rng.randrange(3, vocab) for _ in range(seq_len)] for _ in range(count)]


def _without_all_ones_mask(model):
    """Let ``model``'s forward drop ``attention_mask``: the rows are unpadded, so the mask is all ones and a GPU run
    resolves it to no mask (is_causal); the trainer's own code still reads it from the batch."""
    forward = model.forward

    def forward_without_mask(*args, attention_mask=None, **kwargs):
        return forward(*args, **kwargs)

    model.forward = forward_without_mask


def accumulated_micro_steps(plan) -> int:
    """Micro-batches run per optimizer step: two when the plan accumulates gradients (the second runs with the
    first's gradients alive, as every later one does; a third would repeat it), else one."""
    return 2 if plan.gradient_accumulation_steps > 1 else 1


def backward_phases_after_build(trainer, counter, state: dict) -> dict:
    """Once the trainer is built: its ``accelerator.backward`` runs in the phase ``step{n}.backward`` (n from the
    returned dict's ``"n"``, which the step loop sets), and the build's bytes and categories are recorded
    (``after_build``, ``after_build_categories``) before the peak is reset for the steps."""
    backward = trainer.accelerator.backward
    step_now = {"n": 0}

    def backward_in_its_phase(loss, **kwargs):
        counter.set_phase(f"step{step_now['n']}.backward")
        return backward(loss, **kwargs)

    trainer.accelerator.backward = backward_in_its_phase
    state["after_build"] = counter.current
    state["after_build_categories"] = counter.categories_now()
    counter.reset_peak()
    return step_now


def hf_trainer_steps(trainer, counter, state: dict, steps: int, micro_steps: int, rows, prepared,
                     seen=None) -> list[dict]:
    """transformers 5's ``Trainer._inner_training_loop`` and ``_run_epoch`` as a GPU run steps them, for a trainer a
    framework has built (Axolotl's, LLaMA-Factory's): the trainer's own state and ``_prepare_for_training``
    (create_optimizer, accelerator.prepare of model and optimizer, create_scheduler); then per optimizer step
    ``get_batch_samples`` over ``micro_steps`` micro-batches from the trainer's own data collator
    (``trainer.data_collator(rows(i))``, prefetched as ``_run_epoch`` does, label tokens counted),
    ``training_step`` per micro-batch (gradients synced on the last), and the optimizer phase (``_clip_grad_norm``
    when max_grad_norm > 0, ``optimizer.step``, ``lr_scheduler.step``, ``zero_grad``).

    ``prepared(model, optimizer)`` is called once both exist (the counter's categories read them); ``seen(batches)``
    after each step's micro-batches ran. Phases are ``step{n}.forward`` / ``.backward`` / ``.optimizer``; the state
    gets ``after_build``, ``after_build_categories`` and ``end_categories``; returns the per-step timeline."""
    args = trainer.args
    trainer._init_training_state(steps, steps, 1, None, None)
    wrapped, _ = trainer._prepare_for_training(steps, None, None)
    optimizer = trainer.optimizer
    prepared(trainer.model, optimizer)
    step_now = backward_phases_after_build(trainer, counter, state)
    wrapped.zero_grad()
    timeline: list[dict] = []
    row = 0
    for step in range(1, steps + 1):
        step_now["n"] = step
        start = counter.current
        collated = []
        for _ in range(micro_steps):
            collated.append(trainer.data_collator(rows(row)))
            row += 1
        counter.stub_scalars = True
        batch_samples, num_items = trainer.get_batch_samples(iter(collated), micro_steps, args.device)
        counter.stub_scalars = False
        del collated
        trainer.current_gradient_accumulation_steps = len(batch_samples)
        for micro, batch in enumerate(batch_samples):
            trainer.accelerator.gradient_state._set_sync_gradients(micro == micro_steps - 1)
            counter.set_phase(f"step{step}.forward")
            counter.stub_scalars = True
            trainer.training_step(wrapped, batch, num_items)
            counter.stub_scalars = False
        if seen is not None:
            seen(batch_samples)
        del batch_samples, batch
        counter.set_phase(f"step{step}.optimizer")
        if args.max_grad_norm and args.max_grad_norm > 0:
            trainer._clip_grad_norm(wrapped)
        optimizer.step()
        counter.classify()
        if step == steps:
            state["end_categories"] = counter.categories_now()
        trainer.lr_scheduler.step()
        wrapped.zero_grad()
        timeline.append({"step": step, "start": start, "end": counter.current})
    counter.set_phase("done")
    return timeline


def run_trainer_sft_steps(plan, config: dict, *, fake: bool = True, steps: int = 2, route_sdpa: bool = True) -> dict:
    """Build the model as the runtime does, hand it to the runtime's trainer class, and run ``steps`` steps through
    ``trainer.training_step``, counting live memory (``fake``: under FakeTensorMode, else real CPU tensors: tiny
    models only)."""
    from datasets import Dataset
    from torch._subclasses.fake_tensor import FakeTensorMode
    from trl import SFTConfig

    from canifinetune.recipes import model_setup, runtime

    fm = _fake_mode_module()
    counter = _counter_with_scalar_reads(fm)
    fake_mode = FakeTensorMode(allow_fallback_kernels=False) if fake else contextlib.nullcontext()
    model = optimizer = None
    timeline: list[dict] = []
    state: dict[str, Any] = {}

    counter.category_tensors = category_tensors_of(fm, lambda: (model, optimizer))
    folder = Path(tempfile.mkdtemp(prefix="canifinetune-trainer-fake-"))
    tokenizer = stand_in_tokenizer(folder / "tokenizer")
    vocab = int(config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size"))
    dataset = Dataset.from_dict({"input_ids": _rows(vocab, plan.seq_len,
                                                    plan.batch_size * steps * accumulated_micro_steps(plan))})
    apply_ctx = fm.classic_module_apply() if fake else contextlib.nullcontext()
    peft_ctx = fm._beside("peft_fake").fake_peft_support(fake)
    offloading = bool(getattr(plan, "activation_offloading", False))
    offload_ctx = fm._beside("offload_emulation").emulated_offloading() if offloading else contextlib.nullcontext()
    with offload_ctx as offload_stats, fm.gpu_routing(route_sdpa) as routed, apply_ctx, peft_ctx as build_ctx, \
            fake_mode, counter:
        counter.set_phase("build")
        with build_ctx():
            model = model_setup.build_model(plan, config)
        args = SFTConfig(**runtime.sft_config_kwargs(plan, output_dir=str(folder / "out"), use_cpu=True,
                                                     max_steps=steps))
        if bool(getattr(args, "activation_offloading", False)) != offloading:
            raise RuntimeError(f"plan.activation_offloading is {offloading} but runtime.sft_config_kwargs gives "
                               f"SFTConfig(activation_offloading={args.activation_offloading})")
        trainer = runtime._trainer_class(plan)(model=model, args=args, train_dataset=dataset,
                                               processing_class=tokenizer)
        offload_context = type(getattr(trainer, "maybe_activation_offload_context", None)).__name__
        if offloading and offload_context != "OffloadActivations":
            raise RuntimeError(f"activation offloading: the trainer built {offload_context}, not OffloadActivations")
        optimizer = model_setup.build_optimizer(plan, trainer.model)
        trainer.optimizer = optimizer
        resolved = model_setup.resolved_settings(plan, trainer.model, optimizer)
        _without_all_ones_mask(trainer.model)
        wrapped, _ = trainer.accelerator.prepare(trainer.model, optimizer)
        model = trainer.model
        trainable = [p for p in model.parameters() if p.requires_grad]
        step_now = backward_phases_after_build(trainer, counter, state)
        micro_steps = accumulated_micro_steps(plan)
        # set by Trainer._inner_training_loop before each optimizer step (len(batch_samples)); TRL's compute_loss
        # divides an MoE router's aux loss by it
        trainer.current_gradient_accumulation_steps = plan.gradient_accumulation_steps
        row = 0
        for step in range(1, steps + 1):
            step_now["n"] = step
            start = counter.current
            for _ in range(micro_steps):  # Trainer: training_step per micro-batch, the optimizer after the last
                batch = trainer.data_collator([dataset[i] for i in range(row, row + plan.batch_size)])
                row += plan.batch_size
                scored = plan.batch_size * (plan.seq_len - 1)  # every label is a token (full-length, unpadded rows)
                training_step_in_phase(counter, trainer, wrapped, batch, scored, step, fake)
                del batch
            fm.optimizer_phase(counter, optimizer, trainable, step, steps, state)
            timeline.append({"step": step, "start": start, "end": counter.current})
        counter.set_phase("done")
    report = fm.measurement_report(counter, state, timeline, routed, resolved)
    loss = "trl_fused" if plan.effective_loss_implementation == "chunked" else "model"
    result = {**report, "loss": loss, "fake": fake, "driver": "trainer", "trainer_class": type(trainer).__name__,
              "scalar_reads": counter.scalar_reads}
    if offloading:
        result["activation_offloading"] = {"context": offload_context, **offload_stats.report()}
    return result
