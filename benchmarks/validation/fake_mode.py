"""Measure the peak of live tensor memory of two training steps of a TrainingPlan, under fake tensors.

No GPU and no weights are needed: the model is built from its config.json under
``FakeTensorMode(allow_fallback_kernels=False)`` and every op's outputs are counted by a ``TorchDispatchMode``
(each untyped storage once, its size rounded up to 512 bytes like the CUDA caching allocator's blocks, freed
when the storage dies). The maximum of the running sum is what ``torch.cuda.max_memory_allocated`` would
report, less kernel-internal scratch (see docs/measuring.md).

Usage (one case per process):
    python benchmarks/validation/fake_mode.py --plan plan.json --config config.json [--out result.json]
several cases one after another, each in a fork of one process that has imported the libraries once (compare.py
``compare_many``):
    python benchmarks/validation/fake_mode.py --batch command_lines.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
import weakref
from typing import Any

BLOCK = 512


def round_block(nbytes: int) -> int:
    return 0 if nbytes <= 0 else ((nbytes + BLOCK - 1) // BLOCK) * BLOCK


# ----------------------------------------------------------------------------------------------
# the counter


def _make_counter_class():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class LiveMemoryCounter(TorchDispatchMode):
        """Counts every storage an op outputs once (by identity), rounded up to 512 bytes, until it dies.

        At each new global peak the live set is copied (cheaply: keys, serial numbers, sizes) just before the
        first free after it; ``classify()`` later, at a safe point (never inside a storage's destructor), splits
        that copy into categories with ``category_tensors()`` (set by the caller), matching storages by identity
        and allocation serial number."""

        def __init__(self):
            super().__init__()
            self.live: dict[int, tuple[int, int]] = {}  # storage key -> (serial, rounded bytes)
            self.serial = 0
            self.current = 0
            self.peak = 0
            self.phase = "setup"
            self.peak_phase = "setup"
            self.phase_peaks: dict[str, int] = {}
            self.category_tensors = None  # () -> {category: iterable of tensors}
            self.peak_categories: dict[str, int] | None = None
            self._pending: dict[int, tuple[int, int]] | None = None
            self._dirty = False  # a new global peak not yet copied
            self.largest_other: list[int] = []
            self.peak_largest_other: list[int] = []

        # -- bookkeeping
        def track(self, tensor) -> None:
            if tensor.device.type == "meta":
                return
            try:
                storage = tensor.untyped_storage()
            except Exception:
                return
            k = storage._cdata
            if k in self.live:
                return
            nbytes = round_block(int(storage.nbytes()))
            self.serial += 1
            self.live[k] = (self.serial, nbytes)
            weakref.finalize(storage, self._free, k)
            self.current += nbytes
            if self.current > self.phase_peaks.get(self.phase, -1):
                self.phase_peaks[self.phase] = self.current
            if self.current > self.peak:
                self.peak = self.current
                self.peak_phase = self.phase
                self._dirty = True

        def _free(self, k) -> None:
            entry = self.live.get(k)
            if entry is None:
                return
            if self._dirty:  # the live set right now (before this free) is the one at the peak
                self._dirty = False
                self._pending = dict(self.live)
            del self.live[k]
            self.current -= entry[1]

        def classify(self) -> None:
            """Split the pending peak snapshot into categories (call at safe points only)."""
            if self._dirty:
                self._dirty = False
                self._pending = dict(self.live)
            if self._pending is None or self.category_tensors is None:
                return
            self.peak_categories = self.split(self._pending)
            self.peak_largest_other = self.largest_other
            self._pending = None

        def split(self, snapshot) -> dict[str, int]:
            serials: dict[int, str] = {}
            for category, tensors in self.category_tensors().items():
                for t in tensors:
                    if t is None:
                        continue
                    try:
                        entry = self.live.get(t.untyped_storage()._cdata)
                    except Exception:
                        continue
                    if entry is not None and entry[0] not in serials:
                        serials[entry[0]] = category
            cats = {"parameters": 0, "gradients": 0, "optimizer_states": 0, "other": 0}
            others = []
            for serial, nbytes in snapshot.values():
                cat = serials.get(serial, "other")
                cats[cat] += nbytes
                if cat == "other":
                    others.append(nbytes)
            self.largest_other = sorted(others, reverse=True)[:8]
            return cats

        def categories_now(self) -> dict[str, int]:
            return self.split(self.live)

        def set_phase(self, name: str) -> None:
            self.classify()
            self.phase = name
            self.phase_peaks[name] = max(self.phase_peaks.get(name, 0), self.current)

        def reset_peak(self) -> None:
            self.peak = self.current
            self.peak_phase = self.phase
            self.peak_categories = None
            self._pending = None
            self._dirty = True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.track(t)
            return out

    return LiveMemoryCounter


# ----------------------------------------------------------------------------------------------
# what a GPU would run


# preprocess_mask (aten/src/ATen/native/transformers/attention.cpp, torch 2.x): the memory-efficient kernel takes a
# bias whose strides but the last are multiples of 8 elements; any other bias is padded in its last dimension (a copy)
# and sliced back, and that copy is what the kernel saves for backward
MEM_EFFICIENT_BIAS_ALIGNMENT = 8


def aligned_bias(bias):
    """The bias the memory-efficient kernel receives, as ``preprocess_mask`` makes it on CUDA."""
    import torch.nn.functional as F

    align = MEM_EFFICIENT_BIAS_ALIGNMENT
    if all(stride % align == 0 for stride in bias.stride()[:-1]) and bias.stride()[-1] == 1:
        return bias
    last = bias.shape[-1]
    return F.pad(bias, (0, align - last % align))[..., :last]


def routed_sdpa(original):
    """F.scaled_dot_product_attention as an A100/H100 dispatches it: flash (bf16/fp16, no mask, head_dim <= 256
    and a multiple of 8; GQA handled natively), else memory-efficient (no GQA: k/v expanded), else math."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        # autocast (CUDA's and CPU's) lists scaled_dot_product_attention as a lower-precision op: fp32 q/k/v (the
        # fp32 residual stream of a kbit-prepared model) are cast to the autocast dtype before the kernel is chosen
        device = query.device.type
        if torch.is_autocast_enabled(device) and query.dtype == torch.float32:
            low = torch.get_autocast_dtype(device)
            query, key, value = (t.to(low) for t in (query, key, value))
            if attn_mask is not None and attn_mask.is_floating_point():
                attn_mask = attn_mask.to(low)
        d = query.shape[-1]
        half = query.dtype in (torch.bfloat16, torch.float16)
        same = key.dtype == query.dtype == value.dtype and value.shape[-1] == d
        if attn_mask is None and half and same and d <= 256 and d % 8 == 0:
            sdpa.kernels["flash"] = sdpa.kernels.get("flash", 0) + 1
            return torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=scale
            )[0]
        if key.shape[-3] != query.shape[-3]:
            rep = query.shape[-3] // key.shape[-3]
            key = key.repeat_interleave(rep, dim=-3)
            value = value.repeat_interleave(rep, dim=-3)
        align = 8 if half else 4
        if same and d % align == 0 and query.dtype in (torch.bfloat16, torch.float16, torch.float32):
            sdpa.kernels["efficient"] = sdpa.kernels.get("efficient", 0) + 1
            bias = attn_mask
            if bias is not None and bias.dtype == torch.bool:
                bias = torch.zeros_like(bias, dtype=query.dtype).masked_fill_(~bias, float("-inf"))
            if bias is not None:
                bias = aligned_bias(bias).expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
            need_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                query, key, value, bias, need_grad, dropout_p, is_causal, scale=scale
            )[0]
        sdpa.kernels["math"] = sdpa.kernels.get("math", 0) + 1
        with sdpa_kernel(SDPBackend.MATH):
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale)

    sdpa.kernels = {}
    return sdpa


@contextlib.contextmanager
def gpu_routing(route_sdpa: bool = True):
    """Patch F.scaled_dot_product_attention to the GPU routing; patch TRL's chunked log-prob kernel to what its
    Triton path allocates on a GPU (the torch fallback for devices without Triton makes fp32 tile temporaries
    the Triton kernels do not)."""
    import torch
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention
    routed = routed_sdpa(original)
    patches: list[tuple[Any, str, Any]] = []
    if route_sdpa:
        patches.append((F, "scaled_dot_product_attention", routed))
    try:
        from trl.kernels import chunked_logprob as clp

        def forward_tile(tile, tile_stride, targets, *stats, **kwargs):  # Triton: folds in registers, in place
            return None

        def backward_tile(tile, *args, **kwargs):  # Triton: writes the logits gradient into the tile in place
            return None

        def addmm_fp32(acc, a, b):  # CUDA: torch.addmm(acc, a, b, out_dtype=float32, out=acc), no temporaries
            return None

        patches += [(clp, "_forward_tile", forward_tile), (clp, "_backward_tile", backward_tile),
                    (clp, "_addmm_fp32", addmm_fp32)]
    except Exception:  # pragma: no cover - trl missing
        pass
    try:
        # transformers treats fake position ids as traced and keeps a 4D mask (which rules out flash); the inputs here
        # are unpadded, unpacked sequences, for which the real detection finds no packing.
        from transformers import masking_utils

        patches.append((masking_utils, "find_packed_sequence_indices", lambda position_ids: None))
    except Exception:  # pragma: no cover
        pass
    # On CUDA, aten::dropout takes the fused native_dropout kernel (is_fused_kernel_acceptable: a CUDA input
    # and 0 < p < 1), which keeps a 1-byte bool mask; on CPU it falls back to input * noise, keeping a mask in
    # the input's dtype (4 bytes per element for PEFT's fp32-cast LoRA inputs). Route it as a GPU would.
    original_dropout = F.dropout

    def dropout(input, p=0.5, training=True, inplace=False):
        if training and 0.0 < p < 1.0 and input.numel() > 0:
            return torch.ops.aten.native_dropout(input, p, True)[0]
        return original_dropout(input, p, training, inplace)

    patches.append((F, "dropout", dropout))
    # MoE experts in fp32/fp16 (kbit-prepared or mixed precision): torch's grouped_mm meta kernel is bf16-only where
    # CUDA is not (benchmarks/validation/moe_fake.py)
    patches.append(_beside("moe_fake").grouped_mm_meta_patch())
    # bitsandbytes 8-bit bases: bnb.matmul as CUDA runs it (MatMul8bitLt), not the CPU path (int8_fake.py)
    patches += _beside("int8_fake").patches()
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    for obj, name, value in patches:
        setattr(obj, name, value)
    try:
        yield routed
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


@contextlib.contextmanager
def classic_module_apply():
    """torch 2.13 swaps fake parameters in ``Module._apply``, which refuses tensors with weak references (peft's
    ``.to(...)`` then fails): use the classic ``param.data = fn(param)``."""
    import torch

    def _apply(self, fn, recurse=True):
        if recurse:
            for module in self.children():
                module._apply(fn)
        for _key, param in self._parameters.items():
            if param is None:
                continue
            with torch.no_grad():
                applied = fn(param)
            if applied is not param:
                param.data = applied
            if param.grad is not None:
                with torch.no_grad():
                    param.grad.data = fn(param.grad)
        for key, buf in self._buffers.items():
            if buf is not None:
                self._buffers[key] = fn(buf)
        return self

    original = torch.nn.Module._apply
    torch.nn.Module._apply = _apply
    try:
        yield
    finally:
        torch.nn.Module._apply = original


# ----------------------------------------------------------------------------------------------
# the measurement


def _storage_keys(tensors) -> set[int]:
    keys = set()
    for t in tensors:
        if t is None:
            continue
        with contextlib.suppress(Exception):
            keys.add(t.untyped_storage()._cdata)
    return keys


def _model_state_tensors(model):

    out = []
    for p in model.parameters():
        out.append(p)
        qs = getattr(p, "quant_state", None)
        if qs is not None:
            out.extend(_quant_state_tensors(qs))
        out.append(getattr(p, "SCB", None))  # an 8-bit weight's row scales, before its first forward
    for m in model.modules():  # after it, on the Linear8bitLt's MatmulLtState
        out.append(getattr(getattr(m, "state", None), "SCB", None))
    out.extend(model.buffers())
    return out


def _quant_state_tensors(qs):
    import torch

    out = []
    for name in ("absmax", "code"):
        t = getattr(qs, name, None)
        if isinstance(t, torch.Tensor):
            out.append(t)
    nested = getattr(qs, "state2", None)
    if nested is not None:
        out.extend(_quant_state_tensors(nested))
    off = getattr(qs, "offset", None)
    if isinstance(off, torch.Tensor):
        out.append(off)
    return out


def _optimizer_state_tensors(optimizer):
    import torch

    out = []
    if optimizer is None:
        return out
    for state in optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                out.append(v)
    return out


def _beside(name: str):
    """benchmarks/validation/<name>.py, loaded by path beside this file (which runs as a script or by path)."""
    import importlib.util
    import os

    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def run_steps(plan, config: dict, *, fake: bool = True, steps: int = 2, loss: str = "trl_fused",
              route_sdpa: bool = True, clip_grad: bool = True) -> dict:
    """Build the model and optimizer for ``plan`` and run ``steps`` training steps, counting live memory.

    fake: under FakeTensorMode(allow_fallback_kernels=False) (else with real CPU tensors: tiny models only).
    loss: "trl_fused" — TRL 1.16 SFTTrainer's loss (the fused, chunked LM head; full logits never exist);
          "model" — transformers' own ``model(input_ids, labels=labels)`` loss (full logits, fp32 upcast).
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from canifinetune.recipes import model_setup

    if plan.activation_offloading:  # TRL's offloader is entered by SFTTrainer.training_step: the trainer driver
        raise ValueError("activation_offloading: the hand-written loop does not run TRL's OffloadActivations; use "
                         "the trainer driver (sft_trainer_fake.run_trainer_sft_steps)")
    Counter = _make_counter_class()
    counter = Counter()
    fake_mode = FakeTensorMode(allow_fallback_kernels=False) if fake else contextlib.nullcontext()
    model = optimizer = None
    timeline: list[dict] = []
    state: dict[str, Any] = {}

    def category_tensors():
        return {
            "parameters": _model_state_tensors(model) if model is not None else [],
            "gradients": [p.grad for p in model.parameters()] if model is not None else [],
            "optimizer_states": _optimizer_state_tensors(optimizer),
        }

    counter.category_tensors = category_tensors
    apply_ctx = classic_module_apply() if fake else contextlib.nullcontext()
    peft_ctx = _beside("peft_fake").fake_peft_support(fake)  # modules_to_save / DoRA under fake tensors
    with gpu_routing(route_sdpa) as routed, apply_ctx, peft_ctx as build_ctx, fake_mode, counter:
        counter.set_phase("build")
        with build_ctx():
            model = model_setup.build_model(plan, config)
        if loss == "trl_fused":
            from trl.trainer.utils import add_fused_lm_head

            base = model.get_base_model() if plan.uses_adapters else model
            add_fused_lm_head(base, outputs=("log_probs", "entropy", "is_top1"))
        optimizer = model_setup.build_optimizer(plan, model)
        resolved = model_setup.resolved_settings(plan, model, optimizer)
        vocab = int(model.config.get_text_config().vocab_size)
        input_ids = torch.randint(0, vocab, (plan.batch_size, plan.seq_len))
        labels = input_ids.clone()
        state["after_build"] = counter.current
        state["after_build_categories"] = counter.categories_now()
        counter.reset_peak()
        ac = model_setup.autocast_dtype(plan)
        trainable = [p for p in model.parameters() if p.requires_grad]
        for step in range(1, steps + 1):
            counter.set_phase(f"step{step}.forward")
            start = counter.current
            autocast = torch.autocast("cpu", dtype=ac) if ac is not None else contextlib.nullcontext()
            with autocast:
                if loss == "trl_fused":
                    outputs = model(input_ids=input_ids, labels=labels, use_cache=False, fused_lm_head=True)
                    per_token_loss = -outputs.log_probs
                    step_loss = per_token_loss.sum() / outputs.label_mask.sum().clamp(min=1)
                else:
                    outputs = model(input_ids=input_ids, labels=labels, use_cache=False)
                    step_loss = outputs.loss
            counter.set_phase(f"step{step}.backward")
            step_loss.backward()
            del outputs, step_loss
            if loss == "trl_fused":
                del per_token_loss
            optimizer_phase(counter, optimizer, trainable, step, steps, state, clip_grad=clip_grad)
            timeline.append({"step": step, "start": start, "end": counter.current})
        counter.set_phase("done")
    return {**measurement_report(counter, state, timeline, routed, resolved), "loss": loss, "fake": fake}


def optimizer_phase(counter, optimizer, trainable, step: int, steps: int, state: dict, *,
                    clip_grad: bool = True) -> None:
    """Trainer's optimizer phase of one step: gradient clipping (max_grad_norm 1.0), the step, zero_grad(set_to_none);
    the end-of-step categories are taken on the last step, before zero_grad frees the gradients."""
    import torch

    counter.set_phase(f"step{step}.optimizer")
    if clip_grad:
        torch.nn.utils.clip_grad_norm_(trainable, 1.0, foreach=True)
    optimizer.step()
    counter.classify()  # before zero_grad frees the gradients
    if step == steps:
        state["end_categories"] = counter.categories_now()
    optimizer.zero_grad(set_to_none=True)


def measurement_report(counter, state: dict, timeline: list, routed, resolved) -> dict:
    """What every harness reports of a run: the peak, its phase and categories, per-phase peaks, the build, the
    steps."""
    return {
        "peak_allocated_bytes": counter.peak,
        "peak_phase": counter.peak_phase,
        "peak_categories": counter.peak_categories,
        "peak_largest_other_bytes": counter.peak_largest_other,
        "phase_peaks": {k: v for k, v in counter.phase_peaks.items() if k.startswith("step")},
        "after_build_bytes": state["after_build"],
        "after_build_categories": state["after_build_categories"],
        "end_of_step_categories": state.get("end_categories"),
        "steps": timeline,
        "attention_kernels": dict(routed.kernels),
        "resolved": resolved,
    }


def library_versions() -> dict[str, str]:
    """The versions of the libraries a measurement ran (every harness reports them)."""
    import peft
    import torch
    import transformers

    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}
    for name in ("trl", "bitsandbytes"):
        with contextlib.suppress(Exception):
            versions[name] = __import__(name).__version__
    return versions


def measure_fake(plan, config: dict, *, loss: str = "trl_fused", driver: str = "trainer") -> dict:
    """The fake-tensor measurement of ``plan`` (a TrainingPlan or a dict) on ``config`` (a config.json dict).

    driver "trainer" (the default): the recipe's own trainer runs each step (sft_trainer_fake.py; the loss is the
    plan's); "loop": :func:`run_steps`, the step written out with ``loss``."""

    from canifinetune.estimator.plan import TrainingPlan

    if not isinstance(plan, TrainingPlan):
        plan = TrainingPlan(**plan)
    t0 = time.perf_counter()
    if driver == "trainer":
        result = _beside("sft_trainer_fake").run_trainer_sft_steps(plan, config, fake=True)
    else:
        result = run_steps(plan, config, fake=True, loss=loss)
    result["wall_seconds"] = round(time.perf_counter() - t0, 2)
    result["versions"] = library_versions()
    result["plan"] = plan.model_dump(mode="json")
    return result


def import_before_counting() -> None:
    """Import what a measurement (:func:`measure_fake`, sft_trainer_fake.run_trainer_sft_steps) imports before its
    counter starts: the seconds of CPU a fresh process spends on torch, transformers, PEFT, TRL and datasets, which a
    --batch pays once, before it forks. A fresh process has imported all of these before its counter starts (and
    imports under it what a fork imports under it), so a forked measurement counts what a fresh one counts."""
    from datasets import Dataset  # noqa: F401
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: F401
    from trl import SFTConfig  # noqa: F401

    from canifinetune.estimator.plan import TrainingPlan  # noqa: F401
    from canifinetune.recipes import model_setup, runtime  # noqa: F401

    _beside("sft_trainer_fake")


def in_forked_process(run, *args) -> int:
    """``run(*args)`` in a fork of this process, returning its exit status (-N: killed by signal N). Whatever a
    measurement leaves behind in the libraries (caches such as recipes/model_setup's seeded bitsandbytes dynamic map,
    allocated under the first 4-bit plan's counter; patches; fake tensors) dies with its fork, so each measurement of
    a --batch starts from this process's state as a fresh process starts from its imports."""
    pid = os.fork()
    if pid == 0:
        try:
            code = run(*args)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", help="TrainingPlan as JSON (file); required unless --batch")
    parser.add_argument("--config", help="the model's config.json; required unless --batch")
    parser.add_argument("--out", help="write the result JSON here (also printed)")
    parser.add_argument("--loss", choices=("trl_fused", "model"), default="trl_fused",
                        help="with --driver loop: trl_fused: TRL 1.16 SFTTrainer's chunked LM-head loss (default); "
                             "model: transformers' own loss with full logits")
    parser.add_argument("--driver", choices=("trainer", "loop"), default="trainer",
                        help="trainer: the recipe's own trainer runs the step (its compute_loss and training_step: "
                             "its object lifetimes; the loss is the plan's); loop: the step written out here")
    parser.add_argument("--batch", help="a JSON list of command lines of this script (each a list of its arguments), "
                                        "each run by this function in turn, in a fork of this process once it has "
                                        "imported the libraries; exit status: the first failure's")
    args = parser.parse_args(argv)
    if args.batch:
        with open(args.batch) as f:
            command_lines = json.load(f)
        import_before_counting()
        codes = [in_forked_process(main, command_line) for command_line in command_lines]
        return next((code for code in codes if code), 0)
    if args.plan is None or args.config is None:
        parser.error("--plan and --config are required (or --batch)")
    return run_and_report(lambda plan, config: measure_fake(plan, config, loss=args.loss, driver=args.driver),
                          args.plan, args.config, args.out)


@contextlib.contextmanager
def packed_weights_kept(module):
    """``module.prepare_model_for_kbit_training`` (a trainer's or a loader's import of PEFT's) with the fake path's
    packed 4-bit weights put back after the call. PEFT casts every bf16/fp16 parameter whose class is not
    ``Params4bit`` to fp32; under fake tensors the packed weight is a plain Parameter carrying ``quant_state`` (a
    Params4bit cannot wrap a FakeTensor), which a real run never casts (recipes/model_setup.py
    ``_prepare_model_for_kbit_training`` does the same for the recipe's own build)."""
    original = module.prepare_model_for_kbit_training

    def prepare(model, *args, **kwargs):
        packed = {id(p): (p, p.data) for p in model.parameters()
                  if getattr(p, "quant_state", None) is not None and type(p).__name__ != "Params4bit"}
        model = original(model, *args, **kwargs)
        for param, data in packed.values():
            if param.dtype != data.dtype:
                param.data = data
        return model

    module.prepare_model_for_kbit_training = prepare
    try:
        yield
    finally:
        module.prepare_model_for_kbit_training = original


def report_run(run, out: str | None) -> int:
    """Every harness's command line ends here: ``run()`` (no arguments) returns the result dict, timed into its
    ``wall_seconds``; the result JSON is printed (and written to ``out``); any failure is reported as an error record
    with its traceback, never silently (exit 1)."""
    try:
        t0 = time.perf_counter()
        result = run()
        result.setdefault("wall_seconds", round(time.perf_counter() - t0, 2))
        code = 0
    except BaseException as exc:  # report, never stay silent
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        code = 1
    text = json.dumps(result, indent=2, default=str)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    print(text)
    return code


def run_and_report(measure, plan_path: str, config_path: str, out: str | None) -> int:
    """The plan-driven harnesses' command line: read the plan and config JSON, measure, report (:func:`report_run`)."""

    def run() -> dict:
        with open(plan_path) as f:
            plan = json.load(f)
        with open(config_path) as f:
            config = json.load(f)
        return measure(plan, config)

    return report_run(run, out)


if __name__ == "__main__":
    sys.exit(main())
