"""LLaMA-Factory YAML (llamafactory 0.9.6.dev0, src/llamafactory/hparams): `llamafactory-cli train FILE`."""

from __future__ import annotations

from .reading import Reading, read_optim

DEFAULTS = {  # what LLaMA-Factory 0.9.6.dev0 does when the key is absent
    "method": "lora", "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear",
    "seq_len": 2048, "batch_size": 8, "gradient_accumulation_steps": 1, "gradient_checkpointing": True,
    "optim": "adamw_torch_fused", "dtype": "bf16", "packing": False,
}
NOT_MODELLED = {
    "use_unsloth": "Unsloth's kernels are not modelled (estimated as plain PEFT: an upper bound)",
    "use_unsloth_gc": "Unsloth's offloaded checkpoints are not modelled (an upper bound)",
    "enable_liger_kernel": "Liger's kernels are not modelled (an upper bound)",
    "use_galore": "GaLore's projected optimizer states are not modelled", "use_apollo": "APOLLO is not modelled",
    "use_badam": "BAdam's block-wise training is not modelled", "use_adam_mini": "Adam-mini is not modelled",
    "upcast_layernorm": "norms upcast to fp32 are not modelled",
    "upcast_lmhead_output": "an fp32 lm_head output is not modelled",
    "pure_bf16": "pure bf16 training (no fp32 copies of trainable weights) is not modelled; estimated with fp32 "
                 "trainables",
    "neat_packing": "neat packing is modelled as packing", "shift_attn": "shifted-sparse attention is not modelled",
    "use_llama_pro": "LLaMA Pro's expanded blocks are not modelled", "pissa_init": None, "use_rslora": None,
    "freeze_vision_tower": None, "train_mm_proj_only": "training the projector only is not modelled",
    "enable_thinking": None, "torch_compile": "torch.compile's memory is not modelled",
    "use_dft_loss": None, "use_kt": "KTransformers is not modelled", "moe_aux_loss_coef": None,
}
ATTENTION = {"auto": None, "disabled": "eager", "sdpa": "sdpa", "fa2": "flash_attention_2"}


def _stage(r: Reading) -> None:
    stage = r.text("stage", "sft")
    if stage not in ("sft", "pt"):
        raise r.fail("stage", f"the {stage} trainer is not estimated yet; stage sft and pt are")
    r.mark("stage")
    kind = r.text("finetuning_type", "lora")
    if kind == "freeze":
        raise r.fail("finetuning_type", "freeze (training only the last freeze_trainable_layers layers) is not "
                     "estimated; use full (an upper bound) or lora")
    if kind not in ("lora", "full"):
        raise r.fail("finetuning_type", f"'{kind}' is not estimated; lora and full are")
    if r.has("finetuning_type"):
        r.use("finetuning_type", "method", kind)
    if r.get("packing") is None and stage == "pt":
        r.use("stage", "packing", stage, True)  # LLaMA-Factory packs pre-training data by default
    elif r.has("packing"):
        r.use("packing", "packing", r.boolean("packing", False))


def _quantization(r: Reading) -> None:
    bits = r.get("quantization_bit")
    if bits is None:
        return
    if r.fields.get("method") == "full":
        raise r.fail("quantization_bit", "a quantized base trains only adapters; use finetuning_type lora")
    method = r.text("quantization_method", "bnb")
    if method != "bnb":
        r.warn("quantization_method", f"'{method}' quantization is not modelled; estimated as bitsandbytes")
    r.mark("quantization_method")
    if bits == 4:
        r.use("quantization_bit", "method", bits, "qlora")
        r.use("quantization_type", "bnb_4bit_quant_type", r.text("quantization_type", "nf4"))
        r.use("double_quantization", "bnb_4bit_use_double_quant", r.boolean("double_quantization", True))
    elif bits == 8:
        r.use("quantization_bit", "load_in_8bit", bits, True)
    else:
        raise r.fail("quantization_bit", f"{bits}-bit is not estimated; 4 or 8 are")


def _lora(r: Reading) -> None:
    rank = r.integer("lora_rank", 8, 1, 4096)
    if r.has("lora_rank"):
        r.use("lora_rank", "lora_r", rank)
    alpha = r.number("lora_alpha")
    r.use("lora_alpha", "lora_alpha", alpha) if alpha is not None else r.fields.update(lora_alpha=rank * 2)
    if r.has("lora_dropout"):
        r.use("lora_dropout", "lora_dropout", r.number("lora_dropout"))
    targets = r.names("lora_target")
    if targets is not None:
        r.use("lora_target", "target_modules", r.get("lora_target"), "all-linear" if targets == ["all"] else targets)
    extra = r.names("additional_target")
    if extra:
        r.use("additional_target", "modules_to_save", r.get("additional_target"), extra)
    if r.boolean("use_dora", False):
        r.use("use_dora", "use_dora", True)


def _precision(r: Reading) -> None:
    if r.boolean("bf16", False):
        r.use("bf16", "dtype", True, "bf16")
    elif r.boolean("fp16", False):
        r.use("fp16", "dtype", True, "fp16")
    else:
        r.warn(None, "neither bf16 nor fp16 is set: LLaMA-Factory infers the compute dtype from the model (bf16 "
                     "where the GPU has it); estimated as bf16")
    r.mark("bf16", "fp16")


def read(r: Reading) -> None:
    _stage(r)
    if r.text("model_name_or_path"):
        r.use("model_name_or_path", "model", r.text("model_name_or_path"))
    _quantization(r)
    if r.fields.get("method", "lora") in ("lora", "qlora"):
        _lora(r)
    for key, field in (("cutoff_len", "seq_len"), ("per_device_train_batch_size", "batch_size"),
                       ("gradient_accumulation_steps", "gradient_accumulation_steps")):
        if r.has(key):
            r.use(key, field, r.integer(key, None, 1, 1_048_576))
    if r.boolean("disable_gradient_checkpointing", False):
        r.use("disable_gradient_checkpointing", "gradient_checkpointing", True, False)
    flash = r.text("flash_attn")
    if flash is not None:
        if flash not in ATTENTION:
            r.warn("flash_attn", f"'{flash}' is not modelled; estimated with transformers' default (sdpa)")
        else:
            r.use("flash_attn", "attn_implementation", flash, ATTENTION[flash])
    read_optim(r, "optim")
    _precision(r)
    ds = r.text("deepspeed")
    if ds:
        r.use("deepspeed", None, ds)
        r.refs.append(("deepspeed", ds))
    for key, message in NOT_MODELLED.items():
        if message is None:
            r.mark(key)
        elif r.get(key) not in (None, False, 0, "", []):
            r.warn(key, message)


# ------------------------------------------------------------------ edits back into the file

SIMPLE = {"model": "model_name_or_path", "lora_r": "lora_rank", "seq_len": "cutoff_len",
          "batch_size": "per_device_train_batch_size", "gradient_accumulation_steps": "gradient_accumulation_steps",
          "optim": "optim", "use_dora": "use_dora", "packing": "packing", "lora_dropout": "lora_dropout"}
SHIPPED_DS = {"ddp": "examples/deepspeed/ds_z0_config.json", "zero2": "examples/deepspeed/ds_z2_config.json",
              "zero3": "examples/deepspeed/ds_z3_config.json"}


def edits(changes: dict, new: dict, r: Reading) -> list[tuple]:
    out: list[tuple] = [(SIMPLE[f], v, [f]) for f, v in changes.items() if f in SIMPLE]
    if "gradient_checkpointing" in changes:
        out.append(("disable_gradient_checkpointing", not changes["gradient_checkpointing"],
                    ["gradient_checkpointing"]))
    if "target_modules" in changes:
        targets = changes["target_modules"]
        out.append(("lora_target", "all" if targets == "all-linear" else ",".join(targets), ["target_modules"]))
    if "modules_to_save" in changes:
        saved = changes["modules_to_save"]
        out.append(("additional_target", ",".join(saved) if saved else None, ["modules_to_save"]))
    if "method" in changes or "load_in_8bit" in changes:
        method = new["method"]
        out.append(("finetuning_type", "full" if method == "full" else "lora", ["method"]))
        bits = 4 if method == "qlora" else 8 if new.get("load_in_8bit") else None
        if bits != r.get("quantization_bit"):
            out.append(("quantization_bit", bits, ["method", "load_in_8bit"]))
        if bits == 4 and r.get("double_quantization", True) != new["bnb_4bit_use_double_quant"]:
            out.append(("double_quantization", new["bnb_4bit_use_double_quant"], ["bnb_4bit_use_double_quant"]))
    if "attn_implementation" in changes:
        flash = {v: k for k, v in ATTENTION.items() if v}[changes["attn_implementation"]]
        out.append(("flash_attn", flash, ["attn_implementation"]))
    if "dtype" in changes:
        out.append(("fp16" if changes["dtype"] == "fp16" else "bf16", changes["dtype"] != "fp32", ["dtype"]))
    return out


def distribution_edits(changes: dict, new: dict, r: Reading) -> list[tuple]:
    fields = [f for f in ("sharding", "offload_optimizer", "offload_params") if f in changes]
    sharding = new["sharding"]
    if sharding == "zero3" and new["offload_optimizer"] != new["offload_params"]:
        which = "optimizer" if new["offload_optimizer"] else "param"
        name = f"ds_z3_offload_{which}_config.json"
        return [("deepspeed", name, fields, f"write {name}: examples/deepspeed/ds_z3_config.json with "
                 f'zero_optimization.offload_{which} {{"device": "cpu", "pin_memory": true}}')]
    if sharding in ("zero2", "zero3") and (new["offload_optimizer"] or new["offload_params"]):
        return [("deepspeed", f"examples/deepspeed/ds_z{sharding[-1]}_offload_config.json", fields,
                 "a DeepSpeed config LLaMA-Factory ships (examples/deepspeed/)")]
    if sharding in SHIPPED_DS:
        return [("deepspeed", SHIPPED_DS[sharding], fields, "a DeepSpeed config LLaMA-Factory ships "
                                                            "(examples/deepspeed/)")]
    return [(None, None, fields, f"{sharding}: LLaMA-Factory takes FSDP and ZeRO-1 from an accelerate config "
             "(accelerate launch --config_file ...); pass one as another --config")]
