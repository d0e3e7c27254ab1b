"""Build the model and the optimizer for a :class:`TrainingPlan`, exactly as TRL's ``SFTTrainer`` would.

This is shared by the training runtime (real tensors on a GPU) and by the memory measurement
(``benchmarks/validation/fake_mode.py``, fake tensors on a CPU), so that what is measured is what trains.
It mirrors TRL 1.16 ``SFTTrainer.__init__`` (sft_trainer.py: model loading, ``get_peft_model``,
``enable_input_require_grads`` under gradient checkpointing, the bf16 cast of adapters on a quantized
base) and transformers 5 ``Trainer`` (activation checkpointing with ``use_reentrant=False``, the
optimizer for ``optim``).

torch, transformers, peft and bitsandbytes are imported inside the functions only: importing
``canifinetune.recipes`` must not need torch.
"""

from __future__ import annotations

from typing import Any

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


# ----------------------------------------------------------------------------------------------
# small helpers


def torch_dtype(plan):
    """The compute dtype of the plan (``plan.dtype``) as a torch dtype."""
    import torch

    return getattr(torch, _DTYPES[plan.dtype])


def weight_dtype(plan):
    """The dtype the (unquantized) weights are stored in: plan.dtype for 'pure', fp32 for 'mixed'."""
    import torch

    return torch.float32 if plan.precision == "mixed" else torch_dtype(plan)


def autocast_dtype(plan):
    """The autocast dtype the trainer runs the forward under, or None.

    TRL's SFTConfig turns bf16 on by default (fp16 when asked), and accelerate then wraps the model's
    forward in ``torch.autocast`` whatever dtype the weights are stored in (Accelerator.prepare_model with
    native AMP). So a bf16 model runs under bf16 autocast too: PEFT's fp32 LoRA adapters then compute in
    bf16 and keep bf16 inputs for backward. Only fp32 plans run without autocast."""
    return torch_dtype(plan) if plan.dtype in ("bf16", "fp16") else None


def quantization_config(plan):
    """transformers' ``BitsAndBytesConfig`` for the plan, or None (what TRL's ``get_quantization_config`` builds)."""
    if not (plan.quantized_4bit or plan.load_in_8bit):
        return None
    from transformers import BitsAndBytesConfig

    if plan.quantized_4bit:
        if plan.framework != "trl":
            # the PEFT/bitsandbytes docs' config: bnb_4bit_quant_storage left at its default (uint8)
            return BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_compute_dtype=torch_dtype(plan),
                bnb_4bit_quant_type=plan.bnb_4bit_quant_type,
                bnb_4bit_use_double_quant=plan.bnb_4bit_use_double_quant,
            )
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_compute_dtype=torch_dtype(plan),
            bnb_4bit_quant_type=plan.bnb_4bit_quant_type,
            bnb_4bit_use_double_quant=plan.bnb_4bit_use_double_quant,
            bnb_4bit_quant_storage=torch_dtype(plan),
        )
    return BitsAndBytesConfig(load_in_8bit=True)


def lora_config(plan, target_modules: str | None = None):
    """PEFT ``LoraConfig`` for the plan (None for full fine-tuning); ``target_modules`` (a regex) replaces the plan's
    names where given (a vision-language model: recipes/vision_setup.py)."""
    if not plan.uses_adapters:
        return None
    from peft import LoraConfig

    targets = target_modules if target_modules is not None else plan.target_modules
    if isinstance(targets, list):
        targets = list(targets)
    return LoraConfig(
        r=plan.lora_r,
        lora_alpha=plan.lora_alpha,
        lora_dropout=plan.lora_dropout,
        target_modules=targets,  # None: PEFT's default for the architecture; "all-linear" passes through
        bias="none",
        task_type="CAUSAL_LM",
        # trainable copies of whole modules (peft ModulesToSaveWrapper) and DoRA's magnitude vectors
        modules_to_save=list(plan.modules_to_save) if plan.modules_to_save else None,
        use_dora=plan.use_dora,
    )


def hf_config(config: dict):
    """A transformers config object from a config.json dict."""
    from transformers import AutoConfig

    data = dict(config)
    model_type = data.pop("model_type")
    for key in ("architectures", "transformers_version", "_name_or_path", "quantization_config"):
        data.pop(key, None)
    return AutoConfig.for_model(model_type, **data)


def _is_fake(tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(tensor, FakeTensor)


# ----------------------------------------------------------------------------------------------
# quantization of a randomly initialised model (what from_pretrained(quantization_config=...) does)


def _seed_dynamic_map() -> None:
    """bitsandbytes' ``create_dynamic_map()`` is data-dependent (fails on fake tensors): compute it once on real
    tensors and serve the cached map afterwards."""
    import bitsandbytes.functional as F
    import torch

    if getattr(F.create_dynamic_map, "_canifinetune_cached", False):
        return
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    original = F.create_dynamic_map
    with unset_fake_temporarily():
        cache = {(True, 7, 8): original(True, 7, 8).clone()}

    def cached(signed=True, max_exponent_bits=7, total_bits=8):
        key = (signed, max_exponent_bits, total_bits)
        if key not in cache:
            with unset_fake_temporarily():
                cache[key] = original(signed, max_exponent_bits, total_bits).clone()
        # a fresh tensor from the values: under FakeTensorMode(allow_fallback_kernels=False) a clone of the cached
        # real tensor is refused as a non-fake input, while torch.tensor() makes a fake constant
        return torch.tensor(cache[key].tolist(), dtype=cache[key].dtype)

    cached._canifinetune_cached = True  # type: ignore[attr-defined]
    F.create_dynamic_map = cached


def _fake_int8_param(weight):
    """The int8 weight ``Int8Params(weight.to(float16), has_fp16_weights=False).to(device)`` makes, for a fake weight.

    Int8Params cannot wrap a FakeTensor (``_make_subclass`` refuses it), so do what ``Int8Params._quantize`` does with
    bitsandbytes' own op, which has a fake kernel (bitsandbytes 0.50.2 nn/modules.py): the weight made contiguous and
    fp16, ``int8_vectorwise_quant`` -> CB (int8, out x in, row-major: the parameter's data) and SCB (one fp32 scale per
    output row); then hang CB, SCB and ``has_fp16_weights=False`` on a plain Parameter, as Int8Params carries them
    (read by ``Linear8bitLt.forward``/``init_8bit_state``, which move them onto the module's MatmulLtState)."""
    import bitsandbytes as bnb
    import torch

    CB, SCB, _ = bnb.functional.int8_vectorwise_quant(weight.contiguous().to(torch.float16))
    param = torch.nn.Parameter(CB, requires_grad=False)
    param.CB = CB
    param.SCB = SCB
    param.has_fp16_weights = False
    return param


def _quantize_model(model, plan, qconfig) -> list[str]:
    """Replace nn.Linear modules by bitsandbytes modules as transformers' bnb quantizer does, and quantize their
    (random) weights. Returns the names of the modules left unquantized by transformers' rules."""
    import bitsandbytes as bnb
    import torch
    from transformers.integrations import replace_with_bnb_linear
    from transformers.quantizers.base import HfQuantizer

    skip = HfQuantizer.get_modules_to_not_convert(
        model, qconfig.llm_int8_skip_modules, getattr(model, "_keep_in_fp32_modules", None)
    )
    originals = {name: m for name, m in model.named_modules() if type(m) is torch.nn.Linear}
    fake = any(_is_fake(m.weight) for m in originals.values())
    if fake:
        # the bnb modules are created on the meta device; under FakeTensorMode that would make them fake
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            replace_with_bnb_linear(model, modules_to_not_convert=skip, quantization_config=qconfig,
                                    pre_quantized=False)
    else:
        replace_with_bnb_linear(model, modules_to_not_convert=skip, quantization_config=qconfig, pre_quantized=False)
    for name, old in originals.items():
        new = model.get_submodule(name)
        if new is old:
            continue
        weight = old.weight.detach()
        if plan.quantized_4bit:
            if _is_fake(weight):
                # Params4bit cannot wrap a FakeTensor: quantize with bitsandbytes' op (which has a fake kernel) and
                # hang the quant state on a plain Parameter, as Params4bit would.
                _seed_dynamic_map()
                packed, state = bnb.functional.quantize_4bit(
                    weight.to(torch_dtype(plan)),
                    blocksize=64,
                    compress_statistics=qconfig.bnb_4bit_use_double_quant,
                    quant_type=qconfig.bnb_4bit_quant_type,
                    quant_storage=qconfig.bnb_4bit_quant_storage,
                )
                param = torch.nn.Parameter(packed, requires_grad=False)
                param.quant_state = state
                param.blocksize = 64
                param.compress_statistics = qconfig.bnb_4bit_use_double_quant
                param.quant_type = qconfig.bnb_4bit_quant_type
                param.quant_storage = qconfig.bnb_4bit_quant_storage
                param.bnb_quantized = True
                param.module = new
                param.data_ptr_cache = None
                new.weight = param
            else:
                param = bnb.nn.Params4bit(
                    weight.to(torch_dtype(plan)),
                    requires_grad=False,
                    blocksize=64,
                    compress_statistics=qconfig.bnb_4bit_use_double_quant,
                    quant_type=qconfig.bnb_4bit_quant_type,
                    quant_storage=qconfig.bnb_4bit_quant_storage,
                    module=new,
                )
                new.weight = param.to(weight.device)  # Params4bit quantizes when moved to a device
        else:
            if _is_fake(weight):
                new.weight = _fake_int8_param(weight)
            else:
                param = bnb.nn.Int8Params(weight.to(torch.float16), requires_grad=False, has_fp16_weights=False)
                # Int8Params.to quantizes only a CPU tensor (bitsandbytes 0.50.2): weights built on the GPU would
                # stay fp16 and be quantized again at every forward, so quantize where the weight lives.
                new.weight = param._quantize(weight.device)
        if old.bias is not None:
            new.bias = torch.nn.Parameter(old.bias.detach(), requires_grad=False)
        new.compute_dtype = torch_dtype(plan)
    del originals
    if plan.quantized_4bit:
        model.is_loaded_in_4bit = True
    else:
        model.is_loaded_in_8bit = True
    model.config.quantization_config = qconfig
    return sorted(skip)


# ----------------------------------------------------------------------------------------------
# model


def build_model(plan, config: dict, *, pretrained_path: str | None = None):
    """The model SFTTrainer trains for ``plan``: base model (random weights from ``config``, or ``pretrained_path``),
    quantization, LoRA adapters and gradient checkpointing, as TRL 1.16 / transformers 5 set them up.

    Works with real tensors and under ``FakeTensorMode`` (the caller enters the mode and, for peft, patches
    ``Module._apply``; see benchmarks/validation/fake_mode.py)."""
    from transformers import AutoModelForCausalLM

    qconfig = quantization_config(plan)
    dtype = weight_dtype(plan) if qconfig is None else torch_dtype(plan)
    unquantized: list[str] = []
    if pretrained_path is not None:
        kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": plan.attn_implementation}
        if qconfig is not None:
            kwargs["quantization_config"] = qconfig
        model = AutoModelForCausalLM.from_pretrained(pretrained_path, **kwargs)
    else:
        cfg = hf_config(config)
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=plan.attn_implementation)
        if qconfig is not None:
            unquantized = _quantize_model(model, plan, qconfig)
    model.config.use_cache = False
    model._canifinetune_unquantized = unquantized
    quantized = bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False))

    if plan.method == "full":
        model.requires_grad_(True)
    if plan.framework != "trl" or plan.effective_kbit_preparation:
        return _build_transformers_stack(plan, model, quantized)
    if plan.uses_adapters:
        from peft import get_peft_model

        # TRL passes autocast_adapter_dtype=False only under DeepSpeed ZeRO-3 on an unquantized base: PEFT's default
        # (True) keeps adapters in fp32 on a bf16/fp16 base.
        model = get_peft_model(model, lora_config(plan))
    if plan.gradient_checkpointing:
        # transformers 5 Trainer: activation_checkpointing_enable, kwargs default {"use_reentrant": False}
        base = model.get_base_model() if plan.uses_adapters else model
        enable = getattr(base, "activation_checkpointing_enable", None) or base.gradient_checkpointing_enable
        enable({"use_reentrant": False})
        if plan.uses_adapters:
            model.enable_input_require_grads()  # TRL: PEFT + gradient checkpointing
    cast_adapters(model, plan, quantized)
    model.train()
    return model


def cast_adapters(model, plan, quantized: bool) -> None:
    """The adapter dtype as estimator/resolved.py resolves it: the plan's, else TRL's (on a quantized base the
    trainable parameters are cast to bf16, QLoRA paper section 3; on a 16-bit base PEFT keeps them in fp32). DoRA's
    magnitude vectors stay fp32, as TRL's cast skips them (estimator/peft_memory.py magnitude_dtype)."""
    import torch

    wanted = plan.adapter_dtype or (plan.stack.adapter_dtype_quantized if quantized else None)
    if wanted is not None and plan.uses_adapters:
        dtype = getattr(torch, _DTYPES[wanted])
        for name, param in model.named_parameters():
            if param.requires_grad and "lora_magnitude_vector" not in name:
                param.data = param.data.to(dtype)


def _prepare_model_for_kbit_training(model, use_gradient_checkpointing: bool):
    """peft.prepare_model_for_kbit_training, with the fake path's packed 4-bit weights kept as Params4bit keeps them.

    PEFT casts every bf16/fp16 parameter whose class is not ``Params4bit`` to fp32. Under fake tensors the packed
    weight is a plain Parameter carrying ``quant_state`` (see :func:`_quantize_model`): with a 16-bit quant storage
    it would be cast, which a real Params4bit is not, so those are put back after the call."""
    from peft import prepare_model_for_kbit_training

    packed = {
        id(p): (p, p.data)
        for p in model.parameters()
        if getattr(p, "quant_state", None) is not None and type(p).__name__ != "Params4bit"
    }
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=use_gradient_checkpointing)
    for param, data in packed.values():
        if param.dtype != data.dtype:
            param.data = data
    return model


def _build_transformers_stack(plan, model, quantized: bool):
    """transformers' Trainer + PEFT as the PEFT and bitsandbytes docs teach it (peft 0.21, transformers 5.24):

    - on a quantized base, ``prepare_model_for_kbit_training(model, use_gradient_checkpointing=...)`` (it freezes
      the base, casts every bf16/fp16 parameter but the packed 4-bit weights to fp32 and enables checkpointing),
      when the plan or its framework asks for it (``plan.effective_kbit_preparation``);
    - ``get_peft_model`` (adapters in fp32 by PEFT's autocast_adapter_dtype=True), then cast to the plan's
      ``adapter_dtype`` or its framework's default when either sets one (none for ``transformers``);
    - Trainer(gradient_checkpointing=True): ``activation_checkpointing_enable`` with ``use_reentrant=False``,
      re-applied over what prepare_model_for_kbit_training set.
    The loss (transformers' ForCausalLMLoss over full logits) and bf16 autocast are the caller's
    (Trainer/accelerate)."""
    import torch

    if quantized and plan.effective_kbit_preparation:
        model = _prepare_model_for_kbit_training(model, plan.gradient_checkpointing)
    if plan.method == "full":
        model.requires_grad_(True)
    if plan.uses_adapters:
        from peft import get_peft_model

        model = get_peft_model(model, lora_config(plan))
        # the adapter dtype as estimator/resolved.py resolves it: the plan's, else its framework's, else PEFT's
        stack = plan.stack
        wanted = plan.adapter_dtype or (stack.adapter_dtype_quantized if quantized else stack.adapter_dtype_unquantized)
        if wanted is not None:
            dtype = getattr(torch, _DTYPES[wanted])
            for param in model.parameters():
                if param.requires_grad:
                    param.data = param.data.to(dtype)
    enable_checkpointing(model, plan)
    model.train()
    return model


def enable_checkpointing(model, plan) -> None:
    """Non-reentrant gradient checkpointing as transformers 5 enables it, and, under PEFT, inputs that require grad
    (``enable_input_require_grads``) so the checkpointed blocks of a frozen base still reach the adapters."""
    if not plan.gradient_checkpointing:
        return
    base = model.get_base_model() if plan.uses_adapters else model
    enable = getattr(base, "activation_checkpointing_enable", None) or base.gradient_checkpointing_enable
    enable({"use_reentrant": False})
    if plan.uses_adapters:
        model.enable_input_require_grads()


# ----------------------------------------------------------------------------------------------
# optimizer


def optimizer_spec(plan, *, fake: bool = False) -> tuple[str, dict]:
    """(class path, kwargs without params) of the optimizer transformers' Trainer builds for ``plan.optim``.

    Trainer defaults: lr = plan.effective_learning_rate, betas (0.9, 0.999), eps 1e-8, weight_decay 0.0.
    - adamw_torch_fused: torch.optim.AdamW(fused=True)
    - adamw_torch: torch.optim.AdamW() which on CUDA picks foreach=True; passed explicitly (fake tensors are not in
      torch's foreach-supported types, so the default would silently become the single-tensor loop)
    - adafactor: transformers' Adafactor(scale_parameter=False, relative_step=False, lr=...)
    - sgd: torch.optim.SGD(lr) with Trainer's defaults: momentum 0 (no state), foreach on CUDA -> passed explicitly
    - adamw_bnb_8bit / paged_adamw_8bit / paged_adamw_32bit: bitsandbytes AdamW(optim_bits, is_paged)
    """
    lr = plan.effective_learning_rate
    adam = {"lr": lr, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
    if plan.optim == "adamw_torch_fused":
        return "torch.optim.AdamW", {**adam, "fused": True}
    if plan.optim == "adamw_torch":
        return "torch.optim.AdamW", {**adam, "foreach": True}
    if plan.optim == "adafactor":
        return "transformers.optimization.Adafactor", {
            "lr": lr,
            "scale_parameter": False,
            "relative_step": False,
            "weight_decay": 0.0,
        }
    if plan.optim == "sgd":
        return "torch.optim.SGD", {"lr": lr, "momentum": 0.0, "weight_decay": 0.0, "foreach": True}
    bits = 8 if "8bit" in plan.optim else 32
    return "bitsandbytes.optim.AdamW", {**adam, "optim_bits": bits, "is_paged": plan.optim.startswith("paged")}


def build_optimizer(plan, model):
    """The optimizer Trainer would build over the trainable parameters of ``model``."""
    import importlib

    path, kwargs = optimizer_spec(plan)
    module, _, name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    params = [p for p in model.parameters() if p.requires_grad]
    return cls(params, **kwargs)


# ----------------------------------------------------------------------------------------------
# what was resolved


def adapted_modules(model) -> list[str]:
    """Distinct leaf names of the modules carrying LoRA adapters (q_proj, v_proj, ...)."""
    try:
        from peft.tuners.lora import LoraLayer
    except Exception:  # pragma: no cover
        return []
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, LoraLayer)})


def resolved_settings(plan, model, optimizer=None) -> dict:
    """The settings the run resolved to, for comparison with the estimator's assumptions."""
    import torch

    def dtype_name(dtype) -> str:
        return str(dtype).replace("torch.", "")

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base_dtypes: dict[str, int] = {}
    adapter_dtypes: dict[str, int] = {}
    trainable = total = 0
    quantized_params = 0
    for name, p in model.named_parameters():
        n = p.numel()
        qs = getattr(p, "quant_state", None)
        if qs is not None:  # a 4-bit weight: numel of the packed storage is half the logical count
            n = int(torch.Size(qs.shape).numel())
            quantized_params += n
        total += n
        key = dtype_name(p.dtype) if qs is None else f"4bit-{getattr(p, 'quant_type', 'nf4')}"
        if p.requires_grad:
            trainable += n
            if "lora_" in name:
                adapter_dtypes[key] = adapter_dtypes.get(key, 0) + n
        if "lora_" not in name:
            base_dtypes[key] = base_dtypes.get(key, 0) + n
    emb = base.get_input_embeddings()
    head = base.get_output_embeddings()
    settings = {
        "method": plan.method,
        "base_weight_dtypes": base_dtypes,
        "adapter_dtypes": adapter_dtypes,
        "adapted_modules": adapted_modules(model),
        "trainable_params": trainable,
        "total_params": total,
        "quantized_params": quantized_params,
        "modules_left_unquantized": getattr(base, "_canifinetune_unquantized", []),
        "embedding_dtype": dtype_name(emb.weight.dtype) if emb is not None else None,
        "lm_head_dtype": (
            ("4bit" if getattr(head.weight, "quant_state", None) is not None else dtype_name(head.weight.dtype))
            if head is not None
            else None
        ),
        "tied_embeddings": bool(head is not None and emb is not None and head.weight is emb.weight),
        "gradient_checkpointing": bool(getattr(base, "is_gradient_checkpointing", False)),
        "attn_implementation": getattr(base.config, "_attn_implementation", plan.attn_implementation),
        "precision": plan.precision,
        "autocast_dtype": dtype_name(autocast_dtype(plan)) if autocast_dtype(plan) is not None else None,
    }
    if optimizer is not None:
        cls = type(optimizer)
        flags = {k: v for k, v in optimizer.defaults.items()
                 if k in ("fused", "foreach", "optim_bits", "is_paged", "momentum", "scale_parameter", "relative_step")}
        if hasattr(optimizer, "args"):  # bitsandbytes keeps optim_bits / is_paged on .args
            for k in ("optim_bits", "is_paged"):
                if hasattr(optimizer.args, k):
                    flags[k] = getattr(optimizer.args, k)
        settings["optimizer"] = f"{cls.__module__}.{cls.__qualname__}"
        settings["optimizer_flags"] = flags
    return settings
