"""LLaMA-Factory's own SFT step under fake tensors: its argument parsing (get_train_args), its SFT workflow (run_sft:
tokenizer, template, model loader with its patches and adapters, data collator, CustomSeq2SeqTrainer), its optimizer
and scheduler, run on a fake CPU device; reports the peak of live tensor memory.

Runs in its own virtual environment (llamafactory 0.9.5, the newest on PyPI, pins transformers <=5.6.0, peft <=0.18.1,
trl <=0.24.0, accelerate <=1.11.0, datasets <=4.0.0: below the main venv's). torch first, pinned (the CPU build; never
a CUDA torch), then llamafactory with its own dependencies, the capped ones at their caps, torch pinned again so pip
keeps it (torchvision 0.28.0 is the release that pins torch==2.13.0); then torchvision and torchaudio are removed
(below):

    bash .ci/stack-venvs.sh      # its LLaMA-Factory section: the exact commands and pins
    HF_HUB_OFFLINE=1 WANDB_MODE=disabled .venv-llamafactory/bin/python benchmarks/validation/llamafactory_fake.py \\
        --case '{"model": "HuggingFaceTB/SmolLM2-135M", "method": "lora", "cutoff_len": 256, "batch_size": 2}' \\
        --out result.json

Dependencies left out, and why:
- torchvision and torchaudio (llamafactory requires both, unpinned). PyPI's torchvision 0.28.0 (the one that pins
  torch==2.13.0) is the CUDA build: its ``_C.so`` links ``libtorch_cuda.so``/``libc10_cuda.so``, which the CPU torch
  lacks, so ``import torchvision`` fails, and transformers 5.6 then fails to import ``PreTrainedModel`` ("operator
  torchvision::nms does not exist"). The newest torchaudio on PyPI is 2.11.1, whose extension does not load against
  torch 2.13 ("Could not load this library: .../_torchaudio.so"). Both are uninstalled. transformers imports torchvision
  only when it is installed. llamafactory/data/mm_plugin.py does ``import torchaudio`` at module level (it calls
  ``torchaudio.load``/``functional.resample`` only for audio inputs), so this harness puts a stand-in ``torchaudio``
  module into ``sys.modules`` before importing LLaMA-Factory (``torchaudio_stub`` in the report). A text-only SFT step
  never reaches it.
- bitsandbytes is LLaMA-Factory's optional extra for ``quantization_bit``; installed (0.50.2, as the other harnesses).
- Nothing else is skipped: ``pip check`` reports no broken requirement after the uninstall beyond those two
  (gradio, modelscope, av, tiktoken, ... are installed as llamafactory requires them, but a training step does not
  use them).

What one step is (read from llamafactory 0.9.5; run by this harness through LLaMA-Factory's own functions): the case
becomes the argument dict that ``llamafactory-cli train config.yaml`` passes to ``llamafactory.train.tuner.run_exp``;
this harness calls ``tuner._training_function({"args": ..., "callbacks": []})``, which runs ``get_train_args``
(hparams/parser.py: HfArgumentParser over ModelArguments, DataArguments, TrainingArguments, FinetuningArguments,
GeneratingArguments and its checks and post-processing: ``compute_dtype`` bf16 from ``bf16: true``, ``model_max_length``
= ``cutoff_len``), adds its callbacks (LogCallback, ReporterCallback) and calls ``run_sft`` (train/sft/workflow.py):
``load_tokenizer``, ``get_template_and_fix_tokenizer``, ``load_model`` (model/loader.py), the
``SFTDataCollatorWith4DAttentionMask`` and ``CustomSeq2SeqTrainer``, then ``trainer.train()``. ``train`` is replaced by
the driver here, which does what transformers 5.6's ``Trainer.train`` does before its loop (gradient checkpointing from
the training arguments: off, LLaMA-Factory enables it in the loader), ``_init_training_state`` and
``_prepare_for_training`` (``CustomSeq2SeqTrainer.create_optimizer`` -> ``create_custom_optimizer`` (None unless
GaLore/APOLLO/LoRA+/BAdam/Adam-mini/Muon) -> transformers' optimizer; accelerate's prepare; ``create_scheduler``), and
per optimizer step ``_run_epoch``'s body: ``get_batch_samples`` over micro-batches from the trainer's own
``data_collator``, ``trainer.training_step`` for each (two when the case accumulates gradients: the second runs with
the first's gradients alive), ``_clip_grad_norm`` (max_grad_norm 1.0), ``optimizer.step()``, ``lr_scheduler.step()``,
``model.zero_grad()``. Two optimizer steps: the second runs with the optimizer states alive. The driver then raises to
leave ``run_sft`` before ``save_model`` (nothing to save from fake tensors).

What LLaMA-Factory 0.9.5's SFT step does that changes memory against a TRL 1.16 SFTTrainer step:

- Loss: ``CustomSeq2SeqTrainer.compute_loss`` (train/sft/trainer.py) is ``Seq2SeqTrainer``/``Trainer.compute_loss``
  (unless ``use_asft_loss``): the model's own ``ForCausalLMLoss`` over full logits (bf16 logits under autocast, their
  fp32 upcast, log-softmax); its own loss functions (``dft_loss_func``, ``eaft_loss_func``, ``asft_loss_func`` in
  train/trainer_utils.py) only when ``use_dft_loss``/``use_eaft_loss``/``use_asft_loss`` (off by default; asft adds a
  reference model). No chunked/fused LM head (TRL 1.16's). ``compute_loss`` returns the loss alone: the output is
  freed before backward.
- No ``prepare_model_for_kbit_training`` anywhere in llamafactory 0.9.5 (grep): a QLoRA base keeps bf16 embeddings,
  norms and lm_head (``quantization_bit: 4`` -> ``BitsAndBytesConfig(load_in_4bit, nf4, double quant,
  bnb_4bit_compute_dtype = bnb_4bit_quant_storage = compute_dtype)``, model/model_utils/quantization.py
  ``configure_quantization``); ``upcast_layernorm`` and ``upcast_lmhead_output`` default False
  (hparams/model_args.py; model/model_utils/checkpointing.py ``prepare_model_for_training``).
- Adapter / trainable dtype: ``init_adapter`` (model/adapter.py) sets ``cast_trainable_params_to_fp32`` unless
  ``pure_bf16`` (default False), BAdam, or ZeRO-3 without quantization: LoRA adapters fp32 on a bf16 or 4-bit base
  (TRL 1.16 casts them to bf16 on a quantized base), and for ``finetuning_type: full`` every trainable weight cast to
  fp32 (``_setup_full_tuning``): fp32 weights, fp32 gradients, fp32 AdamW states (4+4+8 bytes/param) with the forward
  under accelerate's bf16 autocast. The model is loaded with ``torch_dtype="auto"`` (model/loader.py ``load_model``):
  the checkpoint's dtype before that cast.
- LoRA defaults (hparams/finetuning_args.py): ``finetuning_type: lora``, ``lora_rank`` 8, ``lora_alpha`` = 2 x rank,
  ``lora_dropout`` 0.0, ``lora_target: all`` (``find_all_linear_modules``, model/model_utils/misc.py: every Linear but
  lm_head).
- Gradient checkpointing: on by default (``disable_gradient_checkpointing`` False), enabled by the loader itself
  (``prepare_model_for_training``), not by the Trainer (``training_args.gradient_checkpointing`` stays False), with
  ``use_reentrant_gc`` True (reentrant, as transformers 4 did; transformers 5 defaults to False) and LLaMA-Factory's
  ``custom_gradient_checkpointing_func``: only layers with trainable parameters are checkpointed, and it sets
  ``requires_grad`` on each checkpointed layer's hidden-state input (instead of ``enable_input_require_grads``).
- Attention: ``flash_attn: auto`` (default) leaves the choice to transformers (``configure_attn_implementation``,
  model/model_utils/attention.py): sdpa. ``sdpa`` and ``fa2`` set it explicitly (``fa2`` only when flash-attn is
  installed; else a warning and transformers' default).
- Packing: off for SFT (``packing`` defaults to ``stage == "pt"``), ``neat_packing`` off; the collator pads to a
  multiple of 8 (``pad_to_multiple_of=8`` in run_sft); rows are padded per batch, not to ``cutoff_len``.
- Optimizer: transformers' default ``adamw_torch_fused`` (torch >= 2.8), LLaMA-Factory adds none by default.
- Liger kernel (``enable_liger_kernel``), Unsloth (``use_unsloth``, ``use_unsloth_gc``), ``use_v1_kernels``,
  KTransformers, ``mixture_of_depths``: off by default.

Emulated CUDA paths (each counted or named in the report where it can be):

1. ``weights_from_config``: ``AutoModelForCausalLM.from_pretrained(**init_kwargs)`` in model/loader.py builds the model
   from the config LLaMA-Factory loaded and patched (``from_config``) with the loader's dtype (``torch_dtype="auto"``:
   the config's dtype) and the attention implementation it set on the config, no weights; ``device_map``,
   ``low_cpu_mem_usage`` are not needed; a ``quantization_config`` (QLoRA) is applied by axolotl_fake's
   ``quantize_4bit_fake`` as transformers' bitsandbytes quantizer does at load. Eval mode, as from_pretrained returns.
2. ``use_cpu: true`` in the arguments (transformers refuses bf16 without a GPU otherwise): the tensors are fake on
   ``cpu``, and accelerate's autocast is ``torch.autocast("cpu", bfloat16)`` (CPU's autocast op lists differ slightly
   from CUDA's).
3. The dataset: ``get_dataset`` (data/loader.py: reads, converts and tokenizes the dataset with the template) is
   replaced by rows of ``cutoff_len`` token ids (input_ids, attention_mask, labels = input_ids, images/videos/audios
   None), the shape its supervised processor emits for samples at least ``cutoff_len`` long; the collator is
   LLaMA-Factory's own. The all-ones attention_mask of these unpadded rows is not passed to the model
   (sft_trainer_fake._without_all_ones_mask: a GPU run resolves it to no mask, a fake mask cannot be read and would keep
   a 4-D mask that rules out flash); the trainer's own code still sees it.
4. ``flash_attn: fa2``: transformers is told flash-attn is installed (``is_flash_attn_2_available``, which
   ``configure_attn_implementation`` asks) and axolotl_fake's ``flash_attention_2_emulation`` runs the
   ``flash_attention_2`` attention function as sdpa routed to aten's flash kernel (flash-attn 2's output and fp32 LSE).
5. From the shared harness (fake_mode.gpu_routing, classic_module_apply): sdpa routed as an H100 dispatches it, dropout
   as the fused CUDA kernel, bitsandbytes' 4-bit matmul as on CUDA, the classic ``Module._apply``; a read of a fake
   scalar inside ``get_batch_samples``/``training_step`` answers 1 (counted: ``scalar_reads``).
6. ``torchaudio`` is a stand-in module (see above; counted: ``torchaudio_stub``).

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


def _fake_mode_module():
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import fake_mode

    return fake_mode


def torchaudio_stub() -> bool:
    """Emulation 6: put a stand-in ``torchaudio`` into ``sys.modules`` when the real one cannot be imported (PyPI has
    no torchaudio for torch 2.13; llamafactory/data/mm_plugin.py imports it at module level and uses it for audio
    inputs only). True when the stand-in was installed."""
    import importlib.machinery
    import types

    try:
        import torchaudio  # noqa: F401

        return False
    except Exception:
        for name in [n for n in sys.modules if n == "torchaudio" or n.startswith("torchaudio.")]:
            del sys.modules[name]
    module = types.ModuleType("torchaudio")
    module.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)  # transformers' find_spec needs one

    def unavailable(*args, **kwargs):
        raise RuntimeError("torchaudio is a stand-in in this harness (no torchaudio build for torch 2.13)")

    module.load = unavailable
    module.functional = types.SimpleNamespace(resample=unavailable)
    sys.modules["torchaudio"] = module
    return True


def catalog_config(model: str) -> dict:
    """The model's config.json fields from the repository's catalog (estimator/data/models.json, read as plain JSON:
    this venv does not have canifinetune installed)."""
    data = json.loads((ROOT / "estimator" / "data" / "models.json").read_text(encoding="utf-8"))
    for entry in data["models"]:
        if entry["id"] == model or model in entry.get("aliases", ()):
            return dict(entry["config"])
    raise ValueError(f"{model} is not in estimator/data/models.json; pass the case's 'config'")


def llamafactory_args(case: dict, folder: Path) -> dict:
    """The LLaMA-Factory training arguments (the YAML ``llamafactory-cli train`` reads, as a dict) for ``case``.

    Case keys: model (catalog id) or config; method lora | qlora | full; cutoff_len (or seq_len); batch_size
    (per_device_train_batch_size); gradient_accumulation_steps; lora_rank, lora_alpha, lora_dropout, lora_target
    (LLaMA-Factory's defaults when absent: 8, 2 x rank, 0.0, "all"); flash_attn auto | sdpa | fa2 | disabled;
    disable_gradient_checkpointing; optim; "llamafactory": extra arguments, verbatim."""
    method = case.get("method", "lora")
    args: dict[str, Any] = {
        "model_name_or_path": str(folder / "model"),
        "stage": "sft",
        "do_train": True,
        "dataset": "synthetic",  # get_dataset is replaced (emulation 3); the parser requires a name
        "template": "empty",
        "cutoff_len": int(case.get("cutoff_len", case.get("seq_len", 1024))),
        "per_device_train_batch_size": int(case.get("batch_size", case.get("per_device_train_batch_size", 1))),
        "gradient_accumulation_steps": int(case.get("gradient_accumulation_steps", 1)),
        "learning_rate": 1.0e-4,
        "num_train_epochs": 1.0,
        "max_steps": 2,
        "lr_scheduler_type": "cosine",
        "warmup_ratio": 0.1,
        "bf16": True,
        "output_dir": str(folder / "out"),
        "overwrite_output_dir": True,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,  # emulation 2
        "flash_attn": case.get("flash_attn", "auto"),
        "disable_gradient_checkpointing": bool(case.get("disable_gradient_checkpointing", False)),
    }
    if "optim" in case:
        args["optim"] = case["optim"]
    if method in ("lora", "qlora"):
        args["finetuning_type"] = "lora"
        for key in ("lora_rank", "lora_alpha", "lora_dropout", "lora_target"):
            if key in case:
                args[key] = case[key]
        if method == "qlora":
            args["quantization_bit"] = 4
    elif method == "full":
        args["finetuning_type"] = "full"
    else:
        raise ValueError(f"method {method!r}: lora, qlora or full")
    args.update(case.get("llamafactory", {}))
    return args


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
def weights_from_config(quantize):
    """Emulation 1: the ``AutoModelForCausalLM`` that llamafactory/model/loader.py calls ``from_pretrained`` on builds
    the model from the config LLaMA-Factory loaded and patched, with the loader's dtype (``torch_dtype="auto"`` -> the
    config's dtype) and attention implementation (set on the config by ``configure_attn_implementation``, else
    transformers' default), no weights; a ``quantization_config`` is applied by ``quantize(model, qconfig)``."""
    import torch
    from llamafactory.model import loader as loader_module
    from transformers import AutoModelForCausalLM

    calls: list[dict] = []

    class ModelFromConfig:
        _model_mapping = AutoModelForCausalLM._model_mapping

        @staticmethod
        def from_config(*args, **kwargs):
            return AutoModelForCausalLM.from_config(*args, **kwargs)

        @staticmethod
        def from_pretrained(pretrained_model_name_or_path=None, *args, config=None, **kwargs):
            dtype = kwargs.pop("dtype", None) or kwargs.pop("torch_dtype", None)
            if dtype == "auto" or dtype is None:
                dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
                if isinstance(dtype, str):
                    dtype = getattr(torch, dtype)
            qconfig = kwargs.get("quantization_config")
            attn = kwargs.get("attn_implementation") or getattr(config, "_attn_implementation_internal", None)
            calls.append({"dtype": str(dtype), "attn_implementation_requested": attn,
                          "device_map": str(kwargs.get("device_map")),
                          "quantization": type(qconfig).__name__ if qconfig is not None else None,
                          "init_kwargs": sorted(kwargs)})
            build = {"dtype": dtype, "trust_remote_code": kwargs.get("trust_remote_code", False)}
            if attn is not None:
                build["attn_implementation"] = attn
            model = AutoModelForCausalLM.from_config(config, **build)
            if qconfig is not None:
                quantize(model, qconfig)
            model.eval()
            return model

    original = loader_module.AutoModelForCausalLM
    loader_module.AutoModelForCausalLM = ModelFromConfig
    try:
        yield calls
    finally:
        loader_module.AutoModelForCausalLM = original


@contextlib.contextmanager
def flash_attn_installed(active: bool):
    """Emulation 4 (``flash_attn: fa2``): ``configure_attn_implementation`` asks ``transformers.utils.
    is_flash_attn_2_available()`` before it sets ``flash_attention_2``; answered True, and the attention function is
    axolotl_fake's flash-attn 2 emulation."""
    if not active:
        yield {}
        return
    import transformers.utils as tu

    fm = _fake_mode_module()
    saved = tu.is_flash_attn_2_available
    tu.is_flash_attn_2_available = lambda: True
    try:
        with fm._beside("axolotl_fake").flash_attention_2_emulation(True) as calls:
            yield calls
    finally:
        tu.is_flash_attn_2_available = saved


@contextlib.contextmanager
def synthetic_dataset(dataset):
    """Emulation 3: ``get_dataset`` in train/sft/workflow.py returns ``dataset`` (tokenized rows) as its train split."""
    from llamafactory.train.sft import workflow

    original = workflow.get_dataset

    def get_dataset(template, model_args, data_args, training_args, stage, **kwargs):
        return {"train_dataset": dataset}

    workflow.get_dataset = get_dataset
    try:
        yield
    finally:
        workflow.get_dataset = original


class _Measured(Exception):
    """Raised by the driver after the measured steps, to leave run_sft before save_model."""


def run_llamafactory_steps(case: dict, steps: int = 2) -> dict:
    """Build ``case``'s LLaMA-Factory arguments, model and trainer with LLaMA-Factory's own code under fake tensors and
    run ``steps`` optimizer steps of its training step; the measurement report plus the resolved settings. The
    temporary model folder (config.json, stand-in tokenizer, output_dir) is removed after."""
    import shutil

    folder = Path(tempfile.mkdtemp(prefix="canifinetune-llamafactory-fake-"))
    try:
        return _run(case, steps, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(case: dict, steps: int, folder: Path) -> dict:
    stubbed = torchaudio_stub()
    fm = _fake_mode_module()
    import torch  # noqa: F401
    from datasets import Dataset
    from llamafactory.train import tuner
    from llamafactory.train.sft.trainer import CustomSeq2SeqTrainer
    from torch._subclasses.fake_tensor import FakeTensorMode

    config = dict(case.get("config") or catalog_config(case["model"]))
    _write_model_folder(folder / "model", config)
    args = llamafactory_args(case, folder)
    seq, mbs = args["cutoff_len"], args["per_device_train_batch_size"]
    micro_steps = 2 if args["gradient_accumulation_steps"] > 1 else 1
    vocab = int(config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size"))
    rows = fm._beside("sft_trainer_fake")._rows(vocab, seq, mbs * steps * micro_steps)
    dataset = Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * seq for _ in rows], "labels": rows,
                                 "images": [None] * len(rows), "videos": [None] * len(rows),
                                 "audios": [None] * len(rows)})

    counter = fm._beside("sft_trainer_fake").scalar_read_counter_class(fm)()
    objects: dict[str, Any] = {"model": None, "optimizer": None}
    timeline: list[dict] = []
    state: dict[str, Any] = {}
    result: dict[str, Any] = {}

    def category_tensors():
        model, optimizer = objects["model"], objects["optimizer"]
        return {"parameters": fm._model_state_tensors(model) if model is not None else [],
                "gradients": [p.grad for p in model.parameters()] if model is not None else [],
                "optimizer_states": fm._optimizer_state_tensors(optimizer)}

    counter.category_tensors = category_tensors

    def train(trainer, resume_from_checkpoint=None, **kwargs):
        """The measured part of transformers 5.6's Trainer.train / _inner_training_loop / _run_epoch."""
        targs = trainer.args
        if targs.gradient_checkpointing:  # Trainer.train (LLaMA-Factory leaves it False: its loader enabled GC)
            trainer.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=targs.gradient_checkpointing_kwargs)
        fm._beside("sft_trainer_fake")._without_all_ones_mask(trainer.model)  # emulation 3

        def seen(batches):
            result.setdefault("batch_shape", list(batches[0]["input_ids"].shape))
            result.setdefault("batch_keys", sorted(batches[0]))

        # Trainer._inner_training_loop and _run_epoch (sft_trainer_fake.hf_trainer_steps): the micro-batches from
        # LLaMA-Factory's own collator, training_step per micro-batch, the optimizer phase after the last
        timeline[:] = fm._beside("sft_trainer_fake").hf_trainer_steps(
            trainer, counter, state, steps, micro_steps,
            lambda row: [dict(dataset[i]) for i in range(row * mbs, (row + 1) * mbs)],
            lambda m, o: objects.update(model=m, optimizer=o), seen)
        result["trainer"] = trainer
        raise _Measured()

    fa2 = args["flash_attn"] == "fa2"
    quantize = fm._beside("axolotl_fake").quantize_4bit_fake
    original_train = CustomSeq2SeqTrainer.train
    CustomSeq2SeqTrainer.train = train
    try:
        with fm.gpu_routing(True) as routed, fm.classic_module_apply(), weights_from_config(quantize) as loads, \
                synthetic_dataset(dataset), flash_attn_installed(fa2) as flash_calls, \
                FakeTensorMode(allow_fallback_kernels=False), counter:
            counter.set_phase("build")
            try:
                tuner._training_function({"args": args, "callbacks": []})
            except _Measured:
                pass
            else:
                raise RuntimeError("run_sft returned without calling trainer.train()")
    finally:
        CustomSeq2SeqTrainer.train = original_train

    trainer = result.pop("trainer")
    model, optimizer = objects["model"], objects["optimizer"]
    inner = getattr(optimizer, "optimizer", optimizer)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    gc_func = getattr(base.model.layers[0], "_gradient_checkpointing_func", None) \
        if hasattr(base, "model") and hasattr(base.model, "layers") else None
    resolved = {
        "trainer_class": type(trainer).__name__,
        "model_class": type(model).__name__,
        "optimizer": type(inner).__name__,
        "optimizer_defaults": {k: v for k, v in inner.defaults.items()
                               if k in ("foreach", "fused", "lr", "weight_decay")},
        "optim": str(trainer.args.optim),
        "params_total": sum(p.numel() for p in model.parameters()),
        "params_trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "param_dtypes": _dtype_counts(model),
        "max_grad_norm": trainer.args.max_grad_norm,
        "bf16": trainer.args.bf16,
        "gradient_checkpointing_model": bool(getattr(base, "is_gradient_checkpointing", False)),
        "gradient_checkpointing_func": repr(getattr(gc_func, "__wrapped__", gc_func))[:200] if gc_func else None,
        "training_args_gradient_checkpointing": bool(trainer.args.gradient_checkpointing),
        "lora_targets": sorted(getattr(getattr(model, "peft_config", {}).get("default"), "target_modules", None)
                               or []) if hasattr(model, "peft_config") else None,
        "lora_rank": getattr(getattr(model, "peft_config", {}).get("default"), "r", None)
        if hasattr(model, "peft_config") else None,
        "lora_dropout": getattr(getattr(model, "peft_config", {}).get("default"), "lora_dropout", None)
        if hasattr(model, "peft_config") else None,
        "loads": loads,
        "attn_implementation": getattr(getattr(base, "config", None), "_attn_implementation", None),
        "flash_attention_2_calls": flash_calls.get("flash_attention_2"),
        "data_collator": type(trainer.data_collator).__name__,
        "model_accepts_loss_kwargs": getattr(trainer, "model_accepts_loss_kwargs", None),
        **result,
    }
    report = fm.measurement_report(counter, state, timeline, routed, resolved)
    return {**report, "fake": True, "driver": "llamafactory", "scalar_reads": counter.scalar_reads,
            "torchaudio_stub": stubbed, "args": args}


def _dtype_counts(model) -> dict:
    out: dict[str, dict[str, int]] = {}
    for p in model.parameters():
        key = "trainable" if p.requires_grad else "frozen"
        d = out.setdefault(key, {})
        d[str(p.dtype).replace("torch.", "")] = d.get(str(p.dtype).replace("torch.", ""), 0) + p.numel()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", required=True, help="JSON: model, method, cutoff_len, batch_size, ...")
    parser.add_argument("--out", help="write the result JSON here (also printed)")
    args = parser.parse_args(argv)
    # no network, no run tracking, quieter logs (set before LLaMA-Factory is imported)
    for key, value in (("HF_HUB_OFFLINE", "1"), ("WANDB_MODE", "disabled"), ("LLAMAFACTORY_VERBOSITY", "WARN"),
                       ("DISABLE_VERSION_CHECK", "0")):
        os.environ.setdefault(key, value)
    return _fake_mode_module().report_run(lambda: run_llamafactory_steps(json.loads(args.case)), args.out)


if __name__ == "__main__":
    sys.exit(main())
