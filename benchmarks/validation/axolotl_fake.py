"""Axolotl's own fine-tuning step under fake tensors: its config validation, model loader and patches, its adapters, its
trainer (AxolotlTrainer), its optimizer and scheduler, run on a fake CPU device; reports the peak of live tensor memory.

Runs in its own virtual environment (Axolotl 0.19.0 pins transformers 5.16.1, peft 0.20.0, trl 1.9.0, below the main
venv's). torch first, pinned (the CPU build; never a CUDA torch), then Axolotl without its dependencies, then the
runtime dependencies it imports, pinned as axolotl 0.19.0's own requirements pin them (unpinned there: unpinned here):

    bash .ci/stack-venvs.sh      # its Axolotl section: the exact commands and pins
    HF_HUB_OFFLINE=1 AXOLOTL_DO_NOT_TRACK=1 WANDB_MODE=disabled .venv-axolotl/bin/python \
        benchmarks/validation/axolotl_fake.py --case '{"model": "HuggingFaceTB/SmolLM2-135M", "method": "lora",
        "seq_len": 1024, "micro_batch_size": 2}' --out result.json

Imported at module level by ``axolotl.train`` / ``axolotl.core.builders``: triton (axolotl/monkeypatch/trainer/utils.py,
axolotl/kernels/*.py; a pip wheel that imports without a GPU: kernels are never launched here), posthog (telemetry),
numba (multipack sampler), pillow, evaluate and wandb (callbacks). Not installed, and why: xformers and flash-attn
(CUDA builds; flash attention is emulated, below), liger-kernel, fla-core, flash-linear-attention, torchao (Triton/CUDA
kernel packages no measured path imports; Liger and cut-cross-entropy are plugins, off unless configured), deepspeed
(an extra), gradio, modal, trackio, tensorboard, lm_eval, mistral-common, openenv-core, optimum, s3fs/gcsfs/adlfs/ocifs,
nvidia-ml-py, hf_transfer, art, langdetect, immutabledict, antlr4 (UI, logging, eval, cloud storage, not imported by
a training step). ``pip check`` lists them as missing; nothing measured imports them.

What one step is (read from axolotl 0.19.0; run by this harness through Axolotl's own functions):

- the case becomes an Axolotl config dict (``axolotl_cfg``), validated by ``axolotl.utils.config.validate_config`` with
  an H100's capabilities (``axolotl.cli.config.gpu_capabilities`` probes the GPU; here there is none) and normalized by
  ``normalize_config``, as ``axolotl.cli.config.load_cfg`` does;
- ``axolotl.train.setup_model_and_tokenizer`` (``ModelLoader.load``, axolotl/loaders/model.py, with its PatchManager
  patches), ``axolotl.utils.trainer.setup_trainer`` (``HFCausalTrainerBuilder.build``, axolotl/core/builders/causal.py:
  ``AxolotlTrainer`` with ``AxolotlTrainingArguments`` and Axolotl's collator);
- then what transformers 5.16's ``Trainer.train`` does before its loop (gradient checkpointing from the training
  arguments), ``_init_training_state`` and ``_prepare_for_training`` (Axolotl's ``OptimizerMixin.create_optimizer``,
  accelerate's prepare, Axolotl's ``SchedulerMixin.create_scheduler``), and per optimizer step ``_run_epoch``'s body:
  ``get_batch_samples`` over micro-batches from the trainer's ``data_collator``, ``trainer.training_step`` for each (two
  when the config accumulates gradients: the second runs with the first's gradients alive), ``_clip_grad_norm``,
  ``optimizer.step()``, ``lr_scheduler.step()``, ``model.zero_grad()``. Two steps: the second runs with the optimizer
  states alive.

What Axolotl's step does that changes memory against a plain TRL SFTTrainer step:

- Loss: ``AxolotlTrainer.compute_loss`` (axolotl/core/trainers/base.py) is transformers' ``Trainer.compute_loss``: the
  model's own loss over full logits (bf16 logits, their fp32 upcast, log-softmax), not TRL 1.16's chunked fused LM head;
  cut-cross-entropy and Liger only as plugins (``plugins:``), off by default.
- LoRA kernels on by default: ``check_auto_enable_lora_kernels`` (axolotl/utils/schemas/config.py) sets
  ``lora_mlp_kernel``, ``lora_qkv_kernel``, ``lora_o_kernel`` and ``lora_embedding_kernel`` for lora/qlora on one GPU;
  ``apply_lora_kernel_patches`` (axolotl/monkeypatch/lora_kernels.py, via ``PatchManager._apply_lora_kernel_patch``)
  replaces the MLP, QKV and O projections by custom autograd functions (axolotl/kernels/lora.py, the SwiGLU/GEGLU Triton
  ops in axolotl/kernels/swiglu.py, geglu.py) that save fewer activations, but only where every projection of the group
  has an adapter (all-linear: yes; PEFT's default q_proj/v_proj: none patched). The attention class's forward is
  rewritten to call ``apply_qkv``/``apply_o`` either way.
- Gradient checkpointing: ``normalize_config`` (axolotl/utils/config/__init__.py) defaults
  ``gradient_checkpointing_kwargs`` to ``{"use_reentrant": True}`` (transformers 5 defaults to False); for adapters the
  loader enables it itself (``ModelLoader._configure_embedding_dtypes``), for full fine-tuning the Trainer does.
- Dtypes (``ModelLoader._configure_embedding_dtypes`` / ``_convert_embedding_modules_dtype``): embed_tokens, lm_head and
  every module named ``norm`` are cast to fp32 first; they are cast back to bf16 for lora/qlora and when the attention
  implementation needs it (``attn_needs_dtype_cast``: every implementation but sdpa and eager), so a full fine-tune with
  sdpa or eager keeps fp32 embeddings (and lm_head), norms, their gradients and fp32 AdamW states; with flash attention
  all bf16. ``load_adapter`` (axolotl/loaders/adapter.py) always calls ``enable_input_require_grads`` and
  ``get_peft_model`` with PEFT's default fp32 adapters.
- QLoRA: ``BitsAndBytesConfig`` nf4 with double quantization and ``bnb_4bit_quant_storage`` bf16
  (``ModelLoader._set_quantization_config``), then ``prepare_model_for_kbit_training`` (fp32 cast of non-quantized
  parameters) followed by the cast back to bf16 above: the residual stream stays bf16.
- Optimizer ``adamw_torch_fused`` by default (axolotl/utils/schemas/training.py; fused: no model-sized temporary in the
  step); gradient clipping when ``max_grad_norm`` resolves > 0 (accelerate's ``clip_grad_norm_``; the report's
  ``resolved.max_grad_norm``).
- Sample packing: Axolotl's ``V2BatchSamplerDataCollatorForSeq2Seq`` concatenates documents into ``sequence_len`` rows
  with per-document position_ids (flash-attn varlen); with sdpa/eager a block-diagonal mask (not run here).
- The transformers ``Trainer`` prefetches the whole accumulation's micro-batches (``get_batch_samples``); the model
  output is freed before backward (``compute_loss`` returns the loss alone), as in TRL's trainer.

Emulated CUDA paths (each one named in the report where it can be):

1. ``weights_from_config``: ``ModelLoader._load_model_from_pretrained`` builds the model with ``from_config`` and the
   loader's own dtype and attention implementation (no weights); for QLoRA, ``quantize_4bit_fake`` does what
   transformers' bitsandbytes quantizer does at load (``replace_with_bnb_linear``, ``quantize_4bit``, the packed weight
   on a plain Parameter carrying ``quant_state``: Params4bit cannot wrap a FakeTensor).
2. ``trainer_on_cpu``: ``use_cpu=True`` in the training arguments (transformers refuses bf16 without a GPU); the
   tensors are fake on ``cpu`` and accelerate's autocast is ``torch.autocast("cpu", bfloat16)`` (CPU's autocast op
   lists differ slightly from CUDA's).
3. The all-ones attention_mask of unpadded, unpacked rows is not passed to the model (a GPU run resolves it to no mask;
   a fake mask cannot be read and would keep a 4-D mask that rules out flash); with sample packing it is kept.
4. ``flash_attention_2_emulation`` (``attention: flash_attention``): transformers' ``flash_attention_2`` becomes its
   sdpa function with no mask and ``is_causal``, routed to aten's flash kernel: flash-attn 2's output and fp32
   log-sum-exp; a packed batch is run as one causal sequence of the same tokens (same sizes as the varlen kernel's).
5. ``packed_weights_kept_in_kbit_preparation``: PEFT's ``prepare_model_for_kbit_training`` (called by Axolotl's loader)
   would cast the fake packed 4-bit weights (plain Parameters) to fp32; they are put back, as a real Params4bit is not.
6. From the shared harness (fake_mode.gpu_routing): sdpa routed as an H100 dispatches it, dropout as the fused CUDA
   kernel, bitsandbytes' 4-bit matmul as on CUDA; a read of a fake scalar inside ``training_step`` answers 1 (counted:
   ``scalar_reads``). Axolotl's own Triton ops (``torch.ops.axolotl.*``) run their registered fake implementations,
   which allocate what the Triton path allocates (counted: ``axolotl_kernel_ops``).
7. ``nf4_dequant_as_on_cuda``: the LoRA kernels' NF4 dequantization (``axolotl.kernels.quantize._ctypes_nf4_dequant``,
   bitsandbytes' CUDA kernels called through ctypes on the current stream) allocates its output weight and fp32 absmax
   as on CUDA and skips the kernels (counted: ``nf4_dequant_calls``).

Not in the figure: what fake_mode.py leaves out (kernel scratch, cuBLAS workspaces, allocator rounding, CUDA context).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# what an H100 reports to axolotl.cli.config.gpu_capabilities (the CPU build reports no GPU)
H100_CAPABILITIES = {"bf16": True, "fp8": True, "tf32": True, "n_gpu": 1, "compute_capability": "sm_90"}


def _fake_mode_module():
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import fake_mode

    return fake_mode


def catalog_config(model: str) -> dict:
    """The model's config.json fields from the repository's catalog (estimator/data/models.json, read as plain JSON:
    this venv does not have canifinetune installed)."""
    data = json.loads((ROOT / "estimator" / "data" / "models.json").read_text(encoding="utf-8"))
    for entry in data["models"]:
        if entry["id"] == model or model in entry.get("aliases", ()):
            return dict(entry["config"])
    raise ValueError(f"{model} is not in estimator/data/models.json; pass the case's 'config'")


def axolotl_cfg(case: dict, folder: Path) -> dict:
    """The Axolotl YAML config (as a dict) for ``case``."""
    method = case.get("method", "lora")
    cfg: dict[str, Any] = {
        "base_model": str(folder),
        "tokenizer_config": str(folder),
        "datasets": [{"path": "synthetic", "type": "_synthetic", "length": 64}],
        "sequence_len": int(case["seq_len"]),
        "micro_batch_size": int(case.get("micro_batch_size", case.get("batch_size", 1))),
        "gradient_accumulation_steps": int(case.get("gradient_accumulation_steps", 1)),
        "num_epochs": 1,
        "max_steps": 2,
        "learning_rate": 2e-4,
        "optimizer": case.get("optimizer", "adamw_torch_fused"),
        "lr_scheduler": "cosine",
        "bf16": True,
        "tf32": False,
        "gradient_checkpointing": bool(case.get("gradient_checkpointing", False)),
        "sample_packing": bool(case.get("sample_packing", False)),
        "output_dir": str(folder / "out"),
        "logging_steps": 1,
        "save_strategy": "no",
        "dataset_prepared_path": str(folder / "prepared"),
    }
    attention = case.get("attention", "sdpa")
    if attention == "flash_attention":
        cfg["flash_attention"] = True
    elif attention == "sdpa":
        cfg["sdp_attention"] = True
    elif attention == "eager":
        cfg["eager_attention"] = True
    else:
        raise ValueError(f"attention {attention!r}: sdpa, flash_attention or eager")
    if method in ("lora", "qlora"):
        cfg["adapter"] = method
        cfg["lora_r"] = int(case.get("lora_r", 16))
        cfg["lora_alpha"] = case.get("lora_alpha", 32)
        cfg["lora_dropout"] = case.get("lora_dropout", 0.05)
        if case.get("lora_target_linear"):
            cfg["lora_target_linear"] = True
        else:
            cfg["lora_target_modules"] = list(case.get("lora_target_modules", ["q_proj", "v_proj"]))
        if method == "qlora":
            cfg["load_in_4bit"] = True
    elif method != "full":
        raise ValueError(f"method {method!r}: lora, qlora or full")
    cfg.update(case.get("axolotl", {}))
    return cfg


def _write_model_folder(folder: Path, config: dict) -> None:
    """config.json and a stand-in tokenizer (no weights: the model is built under fake tensors)."""
    fm = _fake_mode_module()
    folder.mkdir(parents=True, exist_ok=True)
    cfg = dict(config)
    cfg.setdefault("bos_token_id", None)
    cfg.setdefault("eos_token_id", None)
    (folder / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    tok = fm._beside("sft_trainer_fake").stand_in_tokenizer(folder / "tok")
    tok.save_pretrained(folder)


@contextlib.contextmanager
def weights_from_config(quantize=None):
    """Emulation 1: ``ModelLoader._load_model_from_pretrained`` (axolotl/loaders/model.py) builds the model from its
    config with the loader's own keyword arguments (dtype, attention implementation) instead of reading weights that are
    not here; a ``quantization_config`` (QLoRA) is applied by ``quantize(model, qconfig)`` as transformers' bnb
    quantizer would. ``from_pretrained`` returns the model in eval mode; so does this (the trainer's step sets
    train)."""
    from axolotl.loaders.model import ModelLoader

    original = ModelLoader._load_model_from_pretrained
    calls = []

    def load(self, model_loader_class=None):
        loader = model_loader_class or self.auto_model_loader
        kwargs = dict(self.model_kwargs)
        qconfig = kwargs.pop("quantization_config", None)
        calls.append({"loader": getattr(loader, "__name__", str(loader)), "dtype": str(kwargs.get("dtype")),
                      "attn_implementation": kwargs.get("attn_implementation"),
                      "device_map": str(kwargs.get("device_map")), "quantization": type(qconfig).__name__
                      if qconfig is not None else None})
        model = loader.from_config(self.model_config, dtype=kwargs.get("dtype"),
                                   attn_implementation=kwargs.get("attn_implementation"),
                                   trust_remote_code=self.cfg.trust_remote_code or False)
        if qconfig is not None:
            if quantize is None:
                raise NotImplementedError("a quantized load without the 4-bit emulation")
            quantize(model, qconfig)
        model.eval()
        return model

    ModelLoader._load_model_from_pretrained = load
    try:
        yield calls
    finally:
        ModelLoader._load_model_from_pretrained = original


@contextlib.contextmanager
def trainer_on_cpu():
    """Emulation 2: the training arguments Axolotl builds get ``use_cpu=True`` (transformers refuses bf16 without a
    GPU otherwise); the tensors are fake, on the ``cpu`` device, as in the other harnesses (accelerate's autocast is
    then ``torch.autocast("cpu", bfloat16)``). Added through the builder's own (empty) ``hook_pre_create_training_args``
    (axolotl/core/builders/base.py)."""
    from axolotl.core.builders.base import TrainerBuilderBase

    original = TrainerBuilderBase.hook_pre_create_training_args

    def hook(self, training_arguments_kwargs):
        training_arguments_kwargs = original(self, training_arguments_kwargs)
        training_arguments_kwargs["use_cpu"] = True
        return training_arguments_kwargs

    TrainerBuilderBase.hook_pre_create_training_args = hook
    try:
        yield
    finally:
        TrainerBuilderBase.hook_pre_create_training_args = original


@contextlib.contextmanager
def flash_attention_2_emulation(active: bool):
    """Emulation 4 (``flash_attention: true``): transformers' ``flash_attention_2`` runs the flash-attn 2 kernel (the
    ``flash-attn`` extra, else the ``kernels-community/flash-attn2`` hub kernel Axolotl pins in
    axolotl/monkeypatch/attention/fa2_hub_kernel.py), neither of which exists on a CPU build. transformers is told the
    package is available (FLASH_ATTENTION_COMPATIBILITY_MATRIX[2]'s availability check), and the ``flash_attention_2``
    attention function becomes transformers' sdpa function with no mask and ``is_causal`` (routed to
    ``aten._scaled_dot_product_flash_attention`` by fake_mode.gpu_routing). Its memory is flash-attn 2's: the output
    (B, T, H, D) in the compute dtype and the fp32 log-sum-exp (B, H, T) kept for backward, grouped-query heads not
    expanded. A packed batch (sample_packing: flash-attn's varlen kernel over the position_ids' documents) is run as one
    causal sequence of the same tokens: the same output and log-sum-exp sizes."""
    if not active:
        yield {}
        return
    from transformers import modeling_flash_attention_utils as mfa
    from transformers import modeling_utils
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    calls = {"flash_attention_2": 0}

    def flash_attention_2(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        calls["flash_attention_2"] += 1
        return sdpa_attention_forward(module, query, key, value, None, dropout=dropout, scaling=scaling,
                                      is_causal=True)

    matrix = mfa.FLASH_ATTENTION_COMPATIBILITY_MATRIX[2]
    saved_check = matrix["general_availability_check"]
    mapping = ALL_ATTENTION_FUNCTIONS._global_mapping
    saved_fn = mapping.get("flash_attention_2")
    saved_lazy = modeling_utils.lazy_import_flash_attention
    matrix["general_availability_check"] = lambda *a, **k: True
    mapping["flash_attention_2"] = flash_attention_2
    # the model's __init__ imports the flash-attn functions (lazy_import_flash_attention); the emulation needs none
    modeling_utils.lazy_import_flash_attention = lambda *a, **k: None
    try:
        yield calls
    finally:
        modeling_utils.lazy_import_flash_attention = saved_lazy
        matrix["general_availability_check"] = saved_check
        mapping["flash_attention_2"] = saved_fn


def _seed_dynamic_map() -> None:
    """bitsandbytes' ``create_dynamic_map()`` is data-dependent (fails on fake tensors): computed once on real tensors
    and served from a cache (as recipes/model_setup.py does for the main harness)."""
    import bitsandbytes.functional as F
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    if getattr(F.create_dynamic_map, "_canifinetune_cached", False):
        return
    original = F.create_dynamic_map
    cache: dict = {}

    def cached(signed=True, max_exponent_bits=7, total_bits=8):
        key = (signed, max_exponent_bits, total_bits)
        if key not in cache:
            with unset_fake_temporarily():
                cache[key] = original(signed, max_exponent_bits, total_bits).tolist()
        return torch.tensor(cache[key], dtype=torch.float32)

    cached._canifinetune_cached = True  # type: ignore[attr-defined]
    F.create_dynamic_map = cached


def quantize_4bit_fake(model, qconfig) -> None:
    """What ``from_pretrained(quantization_config=BitsAndBytesConfig(load_in_4bit=True, ...))`` does to the linear
    layers, for a model built under fake tensors: transformers' ``replace_with_bnb_linear`` (the modules it skips by
    its own rules are kept), then each weight quantized with bitsandbytes' ``quantize_4bit`` (which has a fake kernel)
    and hung on a plain Parameter carrying ``quant_state`` and the other attributes Params4bit carries
    (``Params4bit`` cannot wrap a FakeTensor). As recipes/model_setup.py ``_quantize_model`` does."""
    import bitsandbytes as bnb
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from transformers.integrations import replace_with_bnb_linear
    from transformers.quantizers.base import HfQuantizer

    skip = HfQuantizer.get_modules_to_not_convert(model, qconfig.llm_int8_skip_modules,
                                                  getattr(model, "_keep_in_fp32_modules", None))
    originals = {name: m for name, m in model.named_modules() if type(m) is torch.nn.Linear}
    with unset_fake_temporarily():  # the bnb modules are created on the meta device
        replace_with_bnb_linear(model, modules_to_not_convert=skip, quantization_config=qconfig, pre_quantized=False)
    _seed_dynamic_map()
    storage = qconfig.bnb_4bit_quant_storage
    for name, old in originals.items():
        new = model.get_submodule(name)
        if new is old:
            continue
        packed, state = bnb.functional.quantize_4bit(
            old.weight.detach().to(qconfig.bnb_4bit_compute_dtype), blocksize=64,
            compress_statistics=qconfig.bnb_4bit_use_double_quant, quant_type=qconfig.bnb_4bit_quant_type,
            quant_storage=storage)
        param = torch.nn.Parameter(packed, requires_grad=False)
        param.quant_state = state
        param.blocksize = 64
        param.compress_statistics = qconfig.bnb_4bit_use_double_quant
        param.quant_type = qconfig.bnb_4bit_quant_type
        param.quant_storage = storage
        param.bnb_quantized = True
        param.module = new
        param.data_ptr_cache = None
        new.weight = param
        if old.bias is not None:
            new.bias = torch.nn.Parameter(old.bias.detach(), requires_grad=False)
        new.compute_dtype = qconfig.bnb_4bit_compute_dtype
    del originals
    model.is_loaded_in_4bit = True
    model.is_quantized = True
    model.quantization_method = "bitsandbytes"
    model.config.quantization_config = qconfig
    from transformers.quantizers import AutoHfQuantizer

    model.hf_quantizer = AutoHfQuantizer.from_config(qconfig, pre_quantized=False)


@contextlib.contextmanager
def nf4_dequant_as_on_cuda(calls: dict):
    """Emulation 7 (QLoRA with Axolotl's LoRA kernels): ``axolotl.kernels.quantize._ctypes_nf4_dequant`` calls
    bitsandbytes' CUDA kernels through ctypes on the current CUDA stream, which a CPU build does not have. Here its
    allocations are made as on CUDA (the ``out`` weight in the quant state's dtype and shape, the fp32 ``out_absmax``,
    the in-place ``+= offset``) and its kernels are skipped; counted in ``calls``."""
    from axolotl.kernels import quantize as quantize_module

    original = quantize_module._ctypes_nf4_dequant

    def dequant(W, absmax, code2, absmax2, offset, blocksize, blocksize2, shape, dtype):
        import torch

        calls["nf4_dequant"] = calls.get("nf4_dequant", 0) + 1
        out = torch.empty(tuple(shape), dtype=dtype, device=W.device)
        out_absmax = torch.empty(absmax.numel(), dtype=torch.float32, device=W.device)
        out_absmax += offset
        del out_absmax
        return out.t() if W.shape[0] == 1 else out

    quantize_module._ctypes_nf4_dequant = dequant
    try:
        yield
    finally:
        quantize_module._ctypes_nf4_dequant = original


@contextlib.contextmanager
def packed_weights_kept_in_kbit_preparation():
    """Emulation 5 (QLoRA): PEFT's ``prepare_model_for_kbit_training``, which Axolotl's loader calls
    (``ModelLoader._prepare_model_for_quantization``), with the fake packed weights (bf16 quant storage, as Axolotl
    asks) put back after the call (fake_mode.packed_weights_kept)."""
    from axolotl.loaders import model as loader_module

    with _fake_mode_module().packed_weights_kept(loader_module):
        yield


def _kernel_counting(counter_class):
    """The counter, also counting the calls of Axolotl's registered kernel ops (``torch.ops.axolotl.*``: the SwiGLU /
    GEGLU activations of its LoRA MLP kernels, axolotl/kernels/op_registry.py), which run their registered fake
    implementations under fake tensors (the Triton kernels write into buffers the op allocates)."""

    class KernelCounter(counter_class):
        def __init__(self):
            super().__init__()
            self.axolotl_ops: dict[str, int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if getattr(func, "namespace", None) == "axolotl":
                name = func.name()
                self.axolotl_ops[name] = self.axolotl_ops.get(name, 0) + 1
            return super().__torch_dispatch__(func, types, args, kwargs)

    return KernelCounter


def run_axolotl_steps(case: dict, steps: int = 2) -> dict:
    """Build ``case``'s Axolotl config, model and trainer with Axolotl's own code under fake tensors and run ``steps``
    optimizer steps of its training step; the measurement report (fake_mode.measurement_report) plus Axolotl's
    resolved settings. The temporary model folder (config.json, stand-in tokenizer, output_dir) is removed after."""
    import shutil

    folder = Path(tempfile.mkdtemp(prefix="canifinetune-axolotl-fake-"))
    try:
        return _run(case, steps, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(case: dict, steps: int, folder: Path) -> dict:
    fm = _fake_mode_module()
    import torch
    from axolotl.utils.config import normalize_config, validate_config
    from axolotl.utils.dict import DictDefault
    from datasets import Dataset
    from torch._subclasses.fake_tensor import FakeTensorMode

    config = dict(case.get("config") or catalog_config(case["model"]))
    _write_model_folder(folder / "model", config)
    raw = axolotl_cfg(case, folder / "model")
    cfg = validate_config(DictDefault(raw), capabilities=dict(H100_CAPABILITIES),
                          env_capabilities={"torch_version": torch.__version__.split("+")[0]})
    normalize_config(cfg)

    from axolotl.train import setup_model_and_tokenizer
    from axolotl.utils.trainer import setup_trainer

    counter = _kernel_counting(fm._beside("sft_trainer_fake").scalar_read_counter_class(fm))()
    objects: dict[str, Any] = {"model": None, "optimizer": None}
    state: dict[str, Any] = {}

    def category_tensors():
        model, optimizer = objects["model"], objects["optimizer"]
        return {"parameters": fm._model_state_tensors(model) if model is not None else [],
                "gradients": [p.grad for p in model.parameters()] if model is not None else [],
                "optimizer_states": fm._optimizer_state_tensors(optimizer)}

    counter.category_tensors = category_tensors
    seq, mbs = cfg.sequence_len, cfg.micro_batch_size
    micro_steps = 2 if cfg.gradient_accumulation_steps > 1 else 1
    vocab = int(config["vocab_size"])
    if cfg.sample_packing and not case.get("attention") == "flash_attention":
        # sdpa/eager packing: transformers builds a block-diagonal 4-D mask from the position_ids
        # (masking_utils.find_packed_sequence_indices), which needs their values; not emulated here
        raise NotImplementedError("sample_packing is run with attention flash_attention only (flash-attn's varlen "
                                  "kernel); with sdpa/eager transformers' packed-mask detection reads position_ids")
    rows = fm._beside("sft_trainer_fake")._rows(vocab, seq, mbs * steps * micro_steps)
    dataset = Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * seq for _ in rows],
                                 "labels": rows})
    doc_len = int(case.get("packed_doc_len", max(1, seq // 4)))

    def micro_batch(index: int):
        """The features of one micro-batch as the trainer's data_collator receives them: mbs unpadded full-length
        rows; with sample packing, mbs bins (MultipackBatchSampler) of documents of ``doc_len`` tokens filling
        ``sequence_len``, each with its position_ids (the attention_mask column dropped where Axolotl's
        _get_dataloader drops it: sample_packing_drop_attention_mask)."""
        chosen = [dataset[i] for i in range(index * mbs, (index + 1) * mbs)]
        if not cfg.sample_packing:
            return chosen
        bins = []
        for sample in chosen:
            docs = []
            for start in range(0, seq, doc_len):
                ids = sample["input_ids"][start:start + doc_len]
                doc = {"input_ids": ids, "labels": ids, "position_ids": list(range(len(ids)))}
                if not trainer.args.sample_packing_drop_attention_mask:
                    doc["attention_mask"] = [1] * len(ids)
                docs.append(doc)
            bins.append(docs)
        return bins

    nf4_calls: dict[str, int] = {}
    with fm.gpu_routing(True) as routed, fm.classic_module_apply(), \
            weights_from_config(quantize_4bit_fake) as loads, trainer_on_cpu(), \
            packed_weights_kept_in_kbit_preparation(), nf4_dequant_as_on_cuda(nf4_calls), \
            flash_attention_2_emulation(case.get("attention") == "flash_attention") as flash_calls, \
            FakeTensorMode(allow_fallback_kernels=False), counter:
        counter.set_phase("build")
        model, tokenizer, peft_config, processor = setup_model_and_tokenizer(cfg)
        trainer = setup_trainer(cfg, dataset, None, model, tokenizer, processor, total_num_steps=steps,
                                peft_config=peft_config)
        args = trainer.args
        # transformers 5.16 Trainer.train(), before its loop: gradient checkpointing as the training arguments say
        # (Axolotl's builder sets them, _configure_gradient_checkpointing in axolotl/core/builders/base.py)
        if args.gradient_checkpointing:
            gc_kwargs = dict(args.gradient_checkpointing_kwargs or {})
            every_n_layers = gc_kwargs.pop("every_n_layers", 1)
            trainer.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gc_kwargs or None,
                                                        every_n_layers=every_n_layers)
        # Trainer._inner_training_loop: the trainer's own state, then _prepare_for_training (create_optimizer:
        # Axolotl's OptimizerMixin; accelerator.prepare of model and optimizer; Axolotl's create_scheduler)
        if not cfg.sample_packing:
            # Emulation 3 (sft_trainer_fake._without_all_ones_mask): the rows are full length and unpadded, so the
            # collator's attention_mask is all ones, which a GPU run resolves to no mask (is_causal); a fake mask cannot
            # be read, and transformers would keep a 4-D mask that rules out the flash kernel. The model's forward
            # drops it; the trainer's own code still sees it in the batch.
            fm._beside("sft_trainer_fake")._without_all_ones_mask(trainer.model)
        # Trainer._inner_training_loop and _run_epoch (sft_trainer_fake.hf_trainer_steps): the micro-batches from the
        # trainer's own data_collator, training_step per micro-batch, the optimizer phase after the last
        timeline = fm._beside("sft_trainer_fake").hf_trainer_steps(
            trainer, counter, state, steps, micro_steps, micro_batch, lambda m, o: objects.update(model=m, optimizer=o))
    model, optimizer = objects["model"], objects["optimizer"]
    resolved = {
        "trainer_class": type(trainer).__name__,
        "optimizer": type(getattr(optimizer, "optimizer", optimizer)).__name__,
        "optimizer_defaults": {k: v for k, v in getattr(optimizer, "optimizer", optimizer).defaults.items()
                               if k in ("foreach", "fused", "lr", "weight_decay")},
        "params_total": sum(p.numel() for p in model.parameters()),
        "params_trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "param_dtypes": _dtype_counts(model),
        "max_grad_norm": args.max_grad_norm,
        "gradient_checkpointing": bool(args.gradient_checkpointing),
        "gradient_checkpointing_kwargs": args.gradient_checkpointing_kwargs,
        "loads": loads,
        "flash_attention_2_calls": flash_calls.get("flash_attention_2"),
        "nf4_dequant_calls": nf4_calls.get("nf4_dequant", 0),
        "attn_implementation": getattr(getattr(model, "config", None), "_attn_implementation", None),
    }
    report = fm.measurement_report(counter, state, timeline, routed, resolved)
    return {**report, "fake": True, "driver": "axolotl", "scalar_reads": counter.scalar_reads,
            "axolotl_kernel_ops": dict(counter.axolotl_ops)}


def _dtype_counts(model) -> dict:
    out: dict[str, dict[str, int]] = {}
    for p in model.parameters():
        key = "trainable" if p.requires_grad else "frozen"
        d = out.setdefault(key, {})
        d[str(p.dtype).replace("torch.", "")] = d.get(str(p.dtype).replace("torch.", ""), 0) + p.numel()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", required=True, help="JSON: model, method, seq_len, micro_batch_size, ...")
    parser.add_argument("--out", help="write the result JSON here (also printed)")
    args = parser.parse_args(argv)
    # no network, no telemetry, no run tracking (set before Axolotl is imported)
    for key, value in (("HF_HUB_OFFLINE", "1"), ("AXOLOTL_DO_NOT_TRACK", "1"), ("WANDB_MODE", "disabled")):
        os.environ.setdefault(key, value)
    return _fake_mode_module().report_run(lambda: run_axolotl_steps(json.loads(args.case)), args.out)


if __name__ == "__main__":
    sys.exit(main())
