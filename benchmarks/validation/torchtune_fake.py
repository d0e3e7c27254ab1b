"""torchtune's own single-device fine-tuning step under fake tensors: its recipe class, builders, LoRA, chunked loss.

Runs in its own virtual environment (torchtune 0.6.1 imports names torchao removed in 0.16, and torchao >= 0.16 moved
``torchao.dtypes.nf4tensor``; 0.15.0 is the newest torchao torchtune 0.6.1 imports):

    python3 -m venv .venv-torchtune
    .venv-torchtune/bin/pip install torch==2.13.0
    .venv-torchtune/bin/pip install torchtune==0.6.1 torchao==0.15.0
    .venv-torchtune/bin/python benchmarks/validation/torchtune_fake.py --case '{"model": "Qwen/Qwen2.5-0.5B",
        "method": "lora", "seq_len": 1024, "batch_size": 2}'

(torchao 0.15.0 prints "Skipping import of cpp extensions due to incompatible torch version": its compiled kernels
are for CUDA / its own torch pin; nothing torchtune's step runs needs them: NF4 is a pure-Python tensor subclass.)

What runs is torchtune's own recipe: ``recipes/lora_finetune_single_device.py`` ``LoRAFinetuneRecipeSingleDevice``
(lora, qlora) or ``recipes/full_finetune_single_device.py`` ``FullFinetuneRecipeSingleDevice`` (full), loaded by path
from the installed wheel, constructed with the wheel's own YAML config for the model
(``recipes/configs/<family>/<size>_{lora,qlora,full}_single_device.yaml``) with the case's fields overriding it, and
driven by the recipe's own ``setup(cfg)`` and ``train()``: its model builder, ``set_trainable_params``, activation
checkpointing, offloading context, optimizer (or optimizer-in-backward hooks), ``CEWithChunkedOutputLoss``,
``_loss_step`` and training loop, two optimizer steps. What is replaced, and why:

- the checkpointer: ``FakeCheckpointer`` hands back a state dict of fake bf16 CPU tensors with the base model's keys
  and shapes (no weights exist); the recipe's own ``model.load_state_dict`` copies them in (QLoRA: NF4Tensor's
  ``copy_`` re-quantizes); they are not counted (a real checkpointer loads them into CPU memory);
- tokenizer and dataset: ``FakeTokenizer`` (pad id 0) and ``SyntheticDataset`` (every sample ``seq_len`` tokens,
  all labels counted), collated by the recipe's own ``padded_collate_sft`` into its own ``StatefulDataLoader``;
  ``shuffle: False`` (the sampler's randperm ``.tolist()`` has no values under fake tensors);
- the metric logger: ``RecordingLogger`` keeps the recipe's log dicts;
- ``save_checkpoint``: a no-op (it runs after the epoch, after the measured steps, and writes files);
- ``torch.Tensor.item`` on a fake tensor returns 1.0 (the loop's ``running_loss.item()`` for its progress bar; a host
  read that allocates nothing).

The device. The recipe runs with ``device: cpu`` under ``FakeTensorMode(allow_fallback_kernels=False)``, with the GPU's
choices emulated where torch or torchtune choose by device (each emulation is listed in the result's ``emulations``):

- scaled-dot-product attention routed as an A100/H100 dispatches it (``fake_mode.gpu_routing``: bf16, no mask,
  causal -> ``aten._scaled_dot_product_flash_attention``); torchtune calls ``F.scaled_dot_product_attention`` with
  ``is_causal=True`` and ``mask=None`` for unpacked batches (modules/attention.py ``MultiHeadAttention.forward``,
  attention_utils.py ``_sdpa_or_flex_attention``); k and v are expanded to all query heads by torchtune itself
  (``k.unsqueeze(2).expand(...).flatten(1, 2)``) before the call, so those copies are counted as on a GPU;
- ``Llama3ScaledRoPE.apply_scaling`` (Llama 3.1/3.2) branches in Python on each frequency's value: under fake tensors
  it returns an empty tensor of its output's shape (dim/2 floats); the RoPE cache built from it has its real shape;
- ``FrozenNF4Linear.__init__`` (QLoRA's linears without adapters) is run line by line with the NF4 parameter assigned
  instead of ``torch.utils.swap_tensors``, which refuses fake tensors (they carry weak references);
- the counter skips torchao's ``NF4Tensor`` wrappers themselves (a wrapper subclass reports a storage of its logical
  bf16 size that holds nothing) and counts their inner tensors (packed codes, scalers), which are op outputs;
- torchtune's ``RMSNorm`` calls ``F.rms_norm(x.float(), weight=bf16 scale)``: mismatched dtypes take the composite
  (unfused) path on CUDA as on CPU, so nothing to emulate; nor for ``training.get_dtype("bf16", device)``, which
  checks bf16 support only for non-CPU devices;
- ``enable_activation_offloading`` (with checkpointing): torchtune's own ``OffloadActivations`` runs under
  ``offload_emulation.emulated_offloading`` (its CUDA streams, events, pinned host copies and the host-to-device copy
  emulated: that module's docstring). The recipe's ``__init__`` refuses offloading unless ``self._device.type ==
  "cuda"``; that one answer is emulated: the recipe is constructed with the flag off, then the flag is set as
  ``__init__`` sets it (``recipe._enable_activation_offloading = True``) after its other check, which is kept: with
  checkpointing off the recipe's own RuntimeError is raised; ``setup`` then builds the offloading context itself
  (``training.get_act_offloading_ctx_manager``). Counts are in the result's ``activation_offloading``;
- ``compile`` is refused (see below), not faked.

What torchtune 0.6.1's step does that changes memory against a transformers/TRL step (source read from the wheel):

- precision: ``_setup_model`` builds the model under ``training.set_default_dtype(self._dtype)`` and the device
  (recipes/*_single_device.py), so every parameter -- base weights, LoRA A/B, norms, embeddings -- is bf16 with
  ``dtype: bf16``; there are no fp32 master weights and no autocast; AdamW's states follow the parameter dtype (bf16);
  the YAMLs pass ``fused: True`` to ``torch.optim.AdamW``. ``training.validate_expected_param_dtype`` checks the
  adapters (lora) or all parameters (full) are bf16. Like LitGPT's bf16-true, unlike transformers' bf16 AMP with
  fp32 trainable weights.
- RoPE caches: ``Qwen2RotaryPositionalEmbeddings`` keeps an fp32 cache of ``max_seq_len`` (32768) x head_dim
  (16.8 MB for Qwen2.5-0.5B) on the device; ``qwen2`` (full) shares one module across layers
  (models/qwen2/_component_builders.py ``qwen2``), but ``lora_qwen2`` builds one per layer inside
  ``lora_qwen2_self_attention`` (24 x 16.8 MB = 403 MB on Qwen2.5-0.5B LoRA); ``lora_llama3_2`` shares one.
- LoRA (modules/peft/lora.py ``LoRALinear``): ``lora_a``/``lora_b`` are ``nn.Linear`` created under the same default
  dtype (bf16); ``forward`` is ``F.linear(x, W) + (alpha/r) * lora_b(lora_a(dropout(x)))``, no dtype casts; dropout
  is ``nn.Identity`` when ``lora_dropout`` is 0 (all shipped YAMLs). Targets are set by ``lora_attn_modules`` /
  ``apply_lora_to_mlp`` / ``apply_lora_to_output`` (shipped: q, v, output_proj + MLP, r 32-64).
- QLoRA (``quantize_base=True``; the ``qlora_*`` builders are ``partial(lora_*, quantize_base=True)``): the base
  weight becomes a torchao ``NF4Tensor`` (torchao/dtypes/nf4tensor.py): ``to_nf4(weight, block_size=64,
  scaler_block_size=256)`` stores ``quantized_data`` (uint8, two 4-bit codes a byte: numel/2 bytes),
  ``quantized_scalers`` (int8, one per 64-block), ``quantization_factor`` (bf16, one per 256 scalers),
  ``scaler_mean`` and the 16-entry ``nf4`` table; ``linear_nf4`` (``LinearNF4``) dequantizes the whole weight to the
  input dtype in forward (``weight.to(input.dtype)`` -> ``get_original_weight``) and again in backward, saving only
  the NF4 weight; the dequantized bf16 weight is a transient of each call. Only linear weights in LoRALinear are
  quantized; embeddings, norms and the output head stay bf16.
- loss: ``CEWithChunkedOutputLoss(num_output_chunks=8)`` (modules/loss/ce_chunked_output_loss.py); setup calls
  ``model.set_num_output_chunks(8)`` and ``TransformerDecoder.forward`` returns ``chunked_output(h)``: a list of 8
  bf16 logits chunks ``self.output(chunk)`` (modules/transformer.py); each chunk is upcast to fp32 separately in
  ``compute_cross_entropy`` (``F.cross_entropy(logits.float(), labels, reduction="sum")``), so only one fp32 upcast
  exists at a time, but every chunk's fp32 log-softmax output is saved for backward (4·T·V bytes in all, T = tokens,
  V = vocab); ``_loss_step`` deletes the logits list before returning ("free logits otherwise it peaks backward
  memory"), so the bf16 logits are not alive through backward. No fused/linear CE.
- activation checkpointing: ``training.set_activation_checkpointing(model, auto_wrap_policy=
  {modules.TransformerSelfAttentionLayer})`` (training/memory.py -> torch's ``apply_activation_checkpointing`` with
  ``checkpoint_wrapper`` NO_REENTRANT): every decoder layer is one checkpointed region; its input is kept.
- ``optimizer_in_bwd`` (full recipe only, ``_setup_optimizer``): one optimizer per parameter
  (``config.instantiate(cfg_optimizer, [p])``), ``training.register_optim_in_bwd_hooks`` registers
  ``register_post_accumulate_grad_hook(optim_step)`` that runs ``optim.step(); optim.zero_grad()`` as soon as that
  parameter's gradient is accumulated: at most one parameter's gradient (plus those whose hooks have not yet fired)
  is alive, instead of all gradients at the end of backward; incompatible with gradient accumulation and clipping.
- ``enable_activation_offloading`` (``training.get_act_offloading_ctx_manager`` -> ``OffloadActivations``,
  training/_activation_offloading.py): a ``saved_tensors_hooks`` context around the forward; every saved tensor of
  at least 1024 bytes that is not a parameter/buffer is copied to a pinned CPU tensor on a side CUDA stream and
  brought back with ``.to("cuda")`` in backward; up to 5 recent activations stay on the GPU (``fwd_stash``) until
  their copy finishes; the output head's input is excluded (``NoOpManager`` hooks on ``model.output``). The recipe
  raises unless the device is CUDA and checkpointing is on, so with checkpointing only each layer's saved input is
  offloaded. The context covers the forward only (``_loss_step``: ``with self.activations_handling_ctx: logits =
  self._model(**batch)``): the chunked loss's saved tensors stay on the GPU. Run here with the emulated CUDA path
  (above).
- ``compile``: ``training.compile_model`` compiles each layer with inductor and ``compile_loss`` the chunk CE. Not run
  here: inductor on a CPU build generates CPU code (no Triton), whose buffer reuse is not the GPU's.
- logged memory: with ``log_peak_memory_stats: True`` (all shipped YAMLs) the loop logs ``training.get_memory_stats``
  (training/memory.py): ``peak_memory_active`` = ``torch.cuda.memory_stats()["active_bytes.all.peak"]``,
  ``peak_memory_alloc`` = ``max_memory_allocated``, ``peak_memory_reserved`` = ``max_memory_reserved``, all in GiB
  (1024**3) and reset after each log (per optimizer step). "Active" counts allocated blocks plus freed blocks whose
  reuse waits on another stream (``record_stream``); it equals allocated except around offloading's side-stream
  copies. The count here is allocated bytes (as ``max_memory_allocated``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import sys
import tempfile
import typing

# catalog model id -> (torchtune model family, config size prefix, base builder name)
MODELS = {
    "Qwen/Qwen2.5-0.5B": ("qwen2_5", "0.5B", "qwen2_5_0_5b"),
    "Qwen/Qwen2.5-0.5B-Instruct": ("qwen2_5", "0.5B", "qwen2_5_0_5b"),
    "Qwen/Qwen2.5-1.5B": ("qwen2_5", "1.5B", "qwen2_5_1_5b_base"),
    "Qwen/Qwen2.5-1.5B-Instruct": ("qwen2_5", "1.5B", "qwen2_5_1_5b_instruct"),
    "Qwen/Qwen2.5-3B": ("qwen2_5", "3B", "qwen2_5_3b"),
    "Qwen/Qwen2.5-7B": ("qwen2_5", "7B", "qwen2_5_7b_base"),
    "Qwen/Qwen2.5-7B-Instruct": ("qwen2_5", "7B", "qwen2_5_7b_instruct"),
    "meta-llama/Llama-3.2-1B": ("llama3_2", "1B", "llama3_2_1b"),
    "meta-llama/Llama-3.2-1B-Instruct": ("llama3_2", "1B", "llama3_2_1b"),
    "meta-llama/Llama-3.2-3B": ("llama3_2", "3B", "llama3_2_3b"),
    "meta-llama/Llama-3.2-3B-Instruct": ("llama3_2", "3B", "llama3_2_3b"),
}
RECIPES = {"lora": ("lora_finetune_single_device.py", "LoRAFinetuneRecipeSingleDevice"),
           "qlora": ("lora_finetune_single_device.py", "LoRAFinetuneRecipeSingleDevice"),
           "full": ("full_finetune_single_device.py", "FullFinetuneRecipeSingleDevice")}
# case field -> torchtune config key (model.* for the builder's arguments)
CASE_TO_CONFIG = {"gradient_checkpointing": "enable_activation_checkpointing",
                  "activation_offloading": "enable_activation_offloading",
                  "optimizer_in_bwd": "optimizer_in_bwd", "compile": "compile", "clip_grad_norm": "clip_grad_norm",
                  "dtype": "dtype", "lora_r": "model.lora_rank", "lora_alpha": "model.lora_alpha",
                  "lora_dropout": "model.lora_dropout", "lora_attn_modules": "model.lora_attn_modules",
                  "apply_lora_to_mlp": "model.apply_lora_to_mlp", "apply_lora_to_output": "model.apply_lora_to_output"}

_BASE_STATE: dict = {}  # name -> (shape, dtype) of the base model's state dict, for FakeCheckpointer
_COUNTER = None


def torchtune_root():
    spec = importlib.util.find_spec("torchtune")
    return os.path.dirname(os.path.dirname(spec.origin))  # site-packages: torchtune/ and recipes/ side by side


# ----------------------------------------------------------------------------------------------
# the components the recipe instantiates from its config, standing in for files and downloads


class FakeCheckpointer:
    """``checkpointer._component_``: the base model's state dict as fake bf16 CPU tensors (not counted: a real
    checkpointer loads to CPU memory)."""

    def __init__(self, should_load_recipe_state=False, **kwargs):
        self.kwargs = kwargs

    def load_checkpoint(self):
        import torch

        with (_COUNTER.paused() if _COUNTER is not None else contextlib.nullcontext()):
            state = {name: torch.empty(shape, dtype=dtype, device="cpu")
                     for name, (shape, dtype) in _BASE_STATE.items()}
        return {"model": state}

    def save_checkpoint(self, *args, **kwargs):
        pass


class FakeTokenizer:
    """``tokenizer._component_``: the recipe reads only ``pad_id`` (collate)."""

    pad_id = 0

    def __init__(self, **kwargs):
        pass


class SyntheticDataset:
    """``dataset._component_``: ``length`` samples of ``seq_len`` tokens, every label counted."""

    def __init__(self, tokenizer, seq_len: int, length: int, vocab: int = 1000, packed: bool = False):
        self.seq_len, self.length, self.vocab = int(seq_len), int(length), int(vocab)

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        tokens = [(i * 7 + j) % self.vocab + 1 for j in range(self.seq_len)]
        return {"tokens": tokens, "labels": list(tokens)}


class RecordingLogger:
    """``metric_logger._component_``: keeps the recipe's log dicts (values as text: they may be fake tensors)."""

    records: typing.ClassVar[list] = []

    def __init__(self, **kwargs):
        RecordingLogger.records = []

    def log_config(self, config):
        pass

    def log(self, name, data, step):
        RecordingLogger.records.append({"step": step, name: str(data)})

    def log_dict(self, payload, step):
        RecordingLogger.records.append({"step": step, **{k: str(v) for k, v in payload.items()}})

    def close(self):
        pass


# ----------------------------------------------------------------------------------------------
# the config


def build_config(case: dict, steps: int):
    """torchtune's shipped YAML for the case's model and method, with the case's fields and the stand-in components."""
    from omegaconf import OmegaConf

    method = case.get("method", "lora")
    if method not in RECIPES:
        raise ValueError(f"method {method!r}: torchtune's single-device recipes run lora, qlora and full")
    if case["model"] not in MODELS:
        raise ValueError(f"model {case['model']!r}: no torchtune builder mapped (known: {', '.join(MODELS)})")
    family, size, builder = MODELS[case["model"]]
    configs = os.path.join(torchtune_root(), "recipes", "configs", family)
    name = f"{size}_{method}_single_device.yaml"
    if not os.path.exists(os.path.join(configs, name)):  # Qwen2.5 ships no QLoRA config: its LoRA one, quantized
        name = f"{size}_{'lora' if method == 'qlora' else method}_single_device.yaml"
    cfg = OmegaConf.load(os.path.join(configs, name))
    if method == "full":
        cfg.model = {"_component_": f"torchtune.models.{family}.{builder}"}
    else:
        model = OmegaConf.to_container(cfg.model)
        model["_component_"] = f"torchtune.models.{family}.lora_{builder}"
        model["quantize_base"] = method == "qlora"  # qlora_<builder> is partial(lora_<builder>, quantize_base=True)
        cfg.model = model
    if method == "full":
        cfg.optimizer_in_bwd = False
    cfg.enable_activation_checkpointing = False
    cfg.enable_activation_offloading = False
    cfg.compile = False
    for field, key in CASE_TO_CONFIG.items():
        if field in case:
            OmegaConf.update(cfg, key, case[field], force_add=True)
    if "optimizer" in case:  # e.g. {"_component_": "torch.optim.AdamW", "fused": True, "lr": 2e-5}
        cfg.optimizer = case["optimizer"]
    accumulation = min(int(case.get("gradient_accumulation_steps", 1)), 2)  # two micro-batches stand for any number
    batch = int(case.get("batch_size", 1))
    out = tempfile.mkdtemp(prefix="torchtune-fake-")
    cfg.output_dir = out
    cfg.device = "cpu"
    cfg.seed = 0
    cfg.shuffle = False
    cfg.epochs = 1
    cfg.max_steps_per_epoch = steps
    cfg.batch_size = batch
    cfg.gradient_accumulation_steps = accumulation
    cfg.resume_from_checkpoint = False
    cfg.checkpointer = {"_component_": "torchtune_fake.FakeCheckpointer", "output_dir": out,
                        "model_type": cfg.checkpointer.model_type}  # the recipe reads model_type
    cfg.tokenizer = {"_component_": "torchtune_fake.FakeTokenizer"}
    cfg.dataset = {"_component_": "torchtune_fake.SyntheticDataset", "seq_len": int(case["seq_len"]),
                   "length": batch * accumulation * steps, "packed": False}
    cfg.metric_logger = {"_component_": "torchtune_fake.RecordingLogger"}
    cfg.profiler = {"_component_": "torchtune.training.setup_torch_profiler", "enabled": False}
    return cfg, name, f"torchtune.models.{family}.{builder}"


def base_state_shapes(builder_path: str) -> dict:
    """The plain builder's state dict (names, shapes, dtypes), built on the meta device: what a checkpoint holds."""
    import torch
    from omegaconf import OmegaConf
    from torchtune import config, training

    with training.set_default_dtype(torch.bfloat16), torch.device("meta"):
        model = config.instantiate(OmegaConf.create({"_component_": builder_path}))
    return {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}


def load_recipe_class(method: str):
    filename, cls = RECIPES[method]
    path = os.path.join(torchtune_root(), "recipes", filename)
    spec = importlib.util.spec_from_file_location(f"torchtune_recipe_{method}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, cls), path


# ----------------------------------------------------------------------------------------------
# the run


def _counter_class(fm):
    from torch._subclasses.fake_tensor import FakeTensor

    base = fm._make_counter_class()

    class Counter(base):
        _paused = False

        @contextlib.contextmanager
        def paused(self):
            self._paused = True
            try:
                yield
            finally:
                self._paused = False

        def track(self, tensor):
            # a wrapper subclass (torchao's NF4Tensor) reports a storage of its logical size (bf16 numel x 2) that
            # holds nothing; its inner tensors are op outputs of their own and counted as such
            if not self._paused and isinstance(tensor, FakeTensor):
                super().track(tensor)

    return Counter


def _nf4_inner(p):
    return [getattr(p, n, None) for n in ("quantized_data", "quantized_scalers", "quantization_factor",
                                          "scaler_mean", "nf4")]


def run_torchtune_steps(case: dict, steps: int = 2) -> dict:
    global _COUNTER
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    sys.modules.setdefault("torchtune_fake", sys.modules[__name__])
    import fake_mode as fm
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    for field, why in (("compile", "inductor on a CPU build of torch compiles CPU code, not the GPU's kernels"),):
        if case.get(field):
            raise NotImplementedError(f"{field}: not measured under fake tensors: {why}")
    method = case.get("method", "lora")
    cfg, config_name, builder_path = build_config(case, steps)
    offloading = bool(cfg.get("enable_activation_offloading", False))
    _BASE_STATE.clear()
    _BASE_STATE.update(base_state_shapes(builder_path))
    Recipe, recipe_path = load_recipe_class(method)
    emulations = ["F.scaled_dot_product_attention routed as a CUDA GPU dispatches it (fake_mode.gpu_routing): flash "
                  "for bf16 causal attention without a mask",
                  "device: cpu with fake tensors standing for the CUDA device (no CPU fallback is taken by the "
                  "recipe's step: it has no device branches besides memory logging and offloading)",
                  "torch.Tensor.item on a fake tensor returns 1.0 (the loop's running_loss.item())",
                  "recipe.save_checkpoint is a no-op (after the measured steps)"]
    counter = _counter_class(fm)()
    _COUNTER = counter
    if offloading:  # the recipe's __init__ refuses offloading off CUDA: constructed with the flag off, set after
        cfg.enable_activation_offloading = False
    recipe = Recipe(cfg=cfg)  # outside fake mode: seeds and flags only
    if offloading:
        cfg.enable_activation_offloading = True
        # __init__'s two checks: the device is CUDA (the emulated answer: yes), checkpointing is on (kept as it is)
        if not recipe._enable_activation_checkpointing:
            raise RuntimeError("enable_activation_offloading should only be True when enable_activation_checkpointing "
                               "is True")
        recipe._enable_activation_offloading = True
        emulations.append("enable_activation_offloading: the recipe's __init__ check that the device is CUDA answers "
                          "yes (the recipe is constructed with the flag off, then it is set as __init__ sets it); "
                          "torchtune's OffloadActivations runs under offload_emulation.emulated_offloading")
        emulations.extend(fm._beside("offload_emulation").EMULATIONS)
    offload_ctx = (fm._beside("offload_emulation").emulated_offloading() if offloading
                   else contextlib.nullcontext())
    state: dict = {"calls": {"save_checkpoint": 0, "item": 0, "optimizer_step": 0, "loss_step": 0}}
    timeline: list = []

    def model():
        return getattr(recipe, "_model", None)

    def optimizers():
        if getattr(recipe, "_optimizer", None) is not None:
            return [recipe._optimizer]
        wrapper = getattr(recipe, "_optim_ckpt_wrapper", None)
        return list(wrapper.optim_map.values()) if wrapper is not None else []

    def category_tensors():
        m = model()
        params = []
        if m is not None:
            params = fm._model_state_tensors(m)
            for p in m.parameters():
                params.extend(_nf4_inner(p))
        opt_states = []
        for opt in optimizers():
            opt_states.extend(fm._optimizer_state_tensors(opt))
        return {"parameters": params, "gradients": [p.grad for p in m.parameters()] if m is not None else [],
                "optimizer_states": opt_states}

    counter.category_tensors = category_tensors
    original_item = torch.Tensor.item

    def item(self):
        if isinstance(self, FakeTensor):
            state["calls"]["item"] += 1
            return 1.0
        return original_item(self)

    def save_checkpoint(epoch):
        state["calls"]["save_checkpoint"] += 1

    recipe.save_checkpoint = save_checkpoint
    torch.Tensor.item = item
    from torchtune.models.llama3_1._position_embeddings import Llama3ScaledRoPE

    original_scaling = Llama3ScaledRoPE.apply_scaling

    def apply_scaling(self, freqs, *args, **kwargs):  # a Python branch on each frequency's value
        if isinstance(freqs, FakeTensor):
            state["calls"]["rope_scaling"] = state["calls"].get("rope_scaling", 0) + 1
            return torch.empty_like(freqs)  # what it returns: torch.tensor(new_freqs), dim/2 floats
        return original_scaling(self, freqs, *args, **kwargs)

    Llama3ScaledRoPE.apply_scaling = apply_scaling
    from torchao.dtypes.nf4tensor import to_nf4
    from torchtune.modules.low_precision import nf4_linear

    original_frozen_init = nf4_linear.FrozenNF4Linear.__init__

    def frozen_init(self, in_dim, out_dim, bias=False, device=None, dtype=None, **quantization_kwargs):
        # FrozenNF4Linear.__init__ line by line, with the parameter replaced by assignment instead of
        # torch.utils.swap_tensors, which refuses fake tensors (they carry weak references); memory is the same: the
        # bf16 weight is freed once quantized
        torch.nn.Linear.__init__(self, in_dim, out_dim, bias=bias, device=device, dtype=dtype)
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        nf4_weight = to_nf4(self.weight, **quantization_kwargs)
        self.weight = torch.nn.Parameter(nf4_weight, requires_grad=False)

    nf4_linear.FrozenNF4Linear.__init__ = frozen_init
    emulations.append("FrozenNF4Linear.__init__ (QLoRA's non-adapted linears) replaces its weight by assignment "
                      "instead of torch.utils.swap_tensors, which refuses fake tensors (weak references)")
    emulations.append("Llama3ScaledRoPE.apply_scaling (Llama 3.1/3.2 RoPE) branches in Python on each of the dim/2 "
                      "frequencies' values; under fake tensors it returns an empty tensor of the same shape and dtype "
                      "(the RoPE cache built from it has its real shape)")
    try:
        with offload_ctx as offload_stats, fm.gpu_routing(True) as routed, fm.classic_module_apply(), \
                FakeTensorMode(allow_fallback_kernels=False), counter:
            counter.set_phase("build")
            recipe.setup(cfg=cfg)
            state["after_build"] = counter.current
            state["after_build_categories"] = counter.categories_now()
            counter.reset_peak()
            original_loss_step = recipe._loss_step

            def loss_step(batch):
                state["calls"]["loss_step"] += 1
                step = recipe.global_step + 1
                if not timeline or timeline[-1]["step"] != step:
                    timeline.append({"step": step, "start": counter.current})
                counter.set_phase(f"step{step}.forward")
                loss = original_loss_step(batch)
                counter.set_phase(f"step{step}.backward")  # the loop's next act is current_loss.backward()
                return loss

            recipe._loss_step = loss_step
            if recipe._optimizer is not None if hasattr(recipe, "_optimizer") else False:
                opt = recipe._optimizer
                original_step = opt.step

                def step_fn(*args, **kwargs):
                    state["calls"]["optimizer_step"] += 1
                    step = recipe.global_step + 1
                    counter.set_phase(f"step{step}.optimizer")
                    out = original_step(*args, **kwargs)
                    counter.classify()
                    if step == steps:
                        state["end_categories"] = counter.categories_now()
                    return out

                opt.step = step_fn
            recipe.train()
            counter.classify()
            if "end_categories" not in state:  # optimizer in backward: the states after the last step
                state["end_categories"] = counter.categories_now()
            for entry in timeline:
                entry["end"] = counter.current
            counter.set_phase("done")
            m = model()
            resolved = {
                "config": config_name, "recipe": os.path.relpath(recipe_path, torchtune_root()),
                "model_component": cfg.model._component_,
                "params_total": sum(p.numel() for p in m.parameters()),
                "params_trainable": sum(p.numel() for p in m.parameters() if p.requires_grad),
                "param_dtypes": sorted({str(p.dtype) for p in m.parameters()}),
                "nf4_params": sum(1 for p in m.parameters() if type(p).__name__ == "NF4Tensor"
                                  or type(getattr(p, "data", None)).__name__ == "NF4Tensor"),
                "num_output_chunks": getattr(m, "num_output_chunks", None),
                "checkpointed_layers": sum(1 for x in m.modules() if type(x).__name__ == "CheckpointWrapper"),
                "optimizer_in_bwd": bool(getattr(recipe, "_optimizer_in_bwd", False)),
                "optimizers": len(optimizers()),
                "batch_size": cfg.batch_size, "seq_len": int(case["seq_len"]),
                "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
                "settings": {k: cfg.get(k) for k in ("enable_activation_checkpointing", "enable_activation_offloading",
                                                    "compile", "clip_grad_norm", "dtype", "optimizer_in_bwd")},
                "optimizer": dict(cfg.optimizer),
                "model_config": dict(cfg.model),
                "activations_handling_ctx": type(getattr(recipe, "activations_handling_ctx", None)).__name__,
            }
    finally:
        torch.Tensor.item = original_item
        Llama3ScaledRoPE.apply_scaling = original_scaling
        nf4_linear.FrozenNF4Linear.__init__ = original_frozen_init
        _COUNTER = None
    report = fm.measurement_report(counter, state, timeline, routed, resolved)
    result = {**report, "loss": "torchtune_chunked_ce", "fake": True, "driver": "torchtune", "calls": state["calls"],
              "logged": RecordingLogger.records, "emulations": emulations}
    if offloading:
        if resolved["activations_handling_ctx"] != "OffloadActivations":
            raise RuntimeError(f"enable_activation_offloading: the recipe built {resolved['activations_handling_ctx']}")
        result["activation_offloading"] = offload_stats.report()
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", required=True,
                        help="JSON: model, method (lora/qlora/full), seq_len, batch_size, gradient_checkpointing, "
                             "optimizer_in_bwd, gradient_accumulation_steps, lora_r, lora_alpha, ...")
    parser.add_argument("--out", help="write the result JSON here (also printed)")
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import fake_mode

    def run() -> dict:
        import torch
        import torchao
        import torchtune

        result = run_torchtune_steps(json.loads(args.case))
        result["versions"] = {"torchtune": torchtune.__version__, "torchao": torchao.__version__,
                              "torch": torch.__version__}
        return result

    return fake_mode.report_run(run, args.out)


if __name__ == "__main__":
    sys.exit(main())
