"""LLaMA-Factory YAML (llamafactory 0.9.6.dev0, src/llamafactory/hparams): `llamafactory-cli train FILE`."""

from __future__ import annotations

from . import transformers_args
from .reading import Reading, read_optim, reasons

SCHEMA = "LLaMA-Factory 0.9.6.dev0's keys as canifinetune knows them (docs/configs.md)"

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
    "use_llama_pro": "LLaMA Pro's expanded blocks are not modelled",
    "train_mm_proj_only": "training the projector only is not modelled",
    "torch_compile": None, "use_kt": "KTransformers is not modelled",
    "use_dft_loss": "the DFT loss (probability-weighted tokens) is not modelled; estimated as the plain loss",
    "mixture_of_depths": "mixture-of-depths is not modelled", "resize_vocab": "a resized vocabulary is not modelled",
    "use_muon": "the Muon optimizer is not modelled", "pissa_init": "PiSSA's SVD of the weights at the start is not "
                                                                    "modelled (the training step is)",
    "gradient_checkpointing": "LLaMA-Factory decides checkpointing by disable_gradient_checkpointing; this key is "
                              "not read",
    "fsdp": "LLaMA-Factory takes FSDP from an accelerate config; pass it as another --config",
    "fsdp_config": "LLaMA-Factory takes FSDP from an accelerate config; pass it as another --config",
    **{k: v for k, v in transformers_args.NOT_MODELLED.items() if k not in ("torch_compile",)},
}
READS = ("model_name_or_path", "stage", "finetuning_type", "quantization_bit", "quantization_method",
         "quantization_type", "double_quantization", "lora_rank", "lora_alpha", "lora_dropout", "lora_target",
         "additional_target", "use_dora", "cutoff_len", "per_device_train_batch_size", "gradient_accumulation_steps",
         "disable_gradient_checkpointing", "flash_attn", "optim", "bf16", "fp16", "deepspeed", "packing",
         "torch_compile")
# LLaMA-Factory keys that do not change GPU memory, each with why (src/llamafactory/hparams: model_args.py,
# data_args.py, finetuning_args.py, generating_args.py, training_args.py), and transformers' TrainingArguments
IGNORED = {
    **{k: v for k, v in transformers_args.IGNORED.items() if k not in READS},
    **reasons(
        ("the datasets and their preparation (CPU)", "dataset eval_dataset dataset_dir media_dir template "
         "train_on_prompt mask_history streaming buffer_size mix_strategy interleave_probs overwrite_cache "
         "preprocessing_batch_size preprocessing_num_workers max_samples ignore_pad_token_for_loss val_size "
         "eval_on_each_dataset tool_format default_system enable_thinking tokenized_path data_shared_file_system "
         "image_max_pixels image_min_pixels video_max_pixels video_min_pixels video_fps video_maxlen"),
        ("the tokenizer and its special tokens", "use_fast_tokenizer split_special_tokens new_special_tokens "
         "add_tokens add_special_tokens"),
        ("where the weights come from: the same model", "cache_dir model_revision hf_hub_token ms_hub_token "
         "om_hub_token trust_remote_code low_cpu_mem_usage adapter_name_or_path adapter_folder print_param_status "
         "use_reentrant_gc"),
        ("inference settings (training is estimated)", "infer_backend infer_dtype offload_folder use_cache "
         "vllm_maxlen vllm_gpu_util vllm_enforce_eager do_sample temperature top_p top_k num_beams max_length "
         "max_new_tokens repetition_penalty length_penalty skip_special_tokens predict_with_generate "
         "generation_max_length generation_num_beams generation_config eval_num_beams"),
        ("RoPE scaling of positions: the same tensors (cutoff_len sets the length)", "rope_scaling"),
        ("the LoRA scaling and start: the same adapters", "use_rslora pissa_iter pissa_convert create_new_adapter "
         "loraplus_lr_ratio loraplus_lr_embedding"),
        ("a loss weight: the same tensors", "moe_aux_loss_coef"),
        ("multimodal towers (a language model is estimated)", "freeze_vision_tower freeze_multi_modal_projector "
         "freeze_language_model"),
        ("what is reported and when training stops", "plot_loss compute_accuracy include_effective_tokens_per_second "
         "early_stopping_steps disable_shuffling use_swanlab swanlab_project swanlab_workspace swanlab_run_name "
         "swanlab_mode swanlab_api_key swanlab_logdir swanlab_lark_webhook_url swanlab_lark_secret"),
        ("transformers 4 TrainingArguments: the schedule, logging and saving (no memory)", "overwrite_output_dir "
         "warmup_ratio evaluation_strategy logging_dir save_safetensors sortish_sampler"),
        ("Ray's workers: where the processes run", "use_ray ray_run_name ray_storage_path ray_storage_filesystem "
         "ray_num_workers resources_per_worker placement_strategy ray_init_kwargs"),
    ),
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
    transformers_args.deepspeed_path(r)
    transformers_args.read_torch_compile(r, "torch_compile")  # the plan's torch_compile refuses it by name
    for key, message in NOT_MODELLED.items():
        if message is not None and r.get(key) not in (None, False, 0, "", [], {}):
            r.warn(key, message)


# ------------------------------------------------------------------ edits back into the file

SIMPLE = {"model": "model_name_or_path", "lora_r": "lora_rank", "seq_len": "cutoff_len",
          "batch_size": "per_device_train_batch_size", "gradient_accumulation_steps": "gradient_accumulation_steps",
          "optim": "optim", "use_dora": "use_dora", "packing": "packing", "lora_dropout": "lora_dropout",
          "lora_alpha": "lora_alpha", "bnb_4bit_quant_type": "quantization_type", "torch_compile": "torch_compile"}
# The plan fields the reader can set; each has an edit back (tests/test_configs.py checks both)
FIELDS = ("model", "method", "load_in_8bit", "bnb_4bit_quant_type", "bnb_4bit_use_double_quant", "lora_r",
          "lora_alpha", "lora_dropout", "target_modules", "modules_to_save", "use_dora", "seq_len", "batch_size",
          "gradient_accumulation_steps", "gradient_checkpointing", "attn_implementation", "optim", "dtype", "packing",
          "sharding", "offload_params", "offload_optimizer", "torch_compile")
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
        four = ["bnb_4bit_quant_type", "bnb_4bit_use_double_quant"] if bits == 4 else []  # with LF's defaults below
        if bits != r.get("quantization_bit"):
            out.append(("quantization_bit", bits, ["method", "load_in_8bit", *four]))
        if bits == 4 and r.get("double_quantization", True) != new["bnb_4bit_use_double_quant"]:
            out.append(("double_quantization", new["bnb_4bit_use_double_quant"], ["bnb_4bit_use_double_quant"]))
        if bits == 4 and r.get("quantization_type", "nf4") != new["bnb_4bit_quant_type"]:
            out.append(("quantization_type", new["bnb_4bit_quant_type"], ["bnb_4bit_quant_type"]))
    elif "bnb_4bit_use_double_quant" in changes and new["method"] == "qlora":
        out.append(("double_quantization", changes["bnb_4bit_use_double_quant"], ["bnb_4bit_use_double_quant"]))
    if "attn_implementation" in changes:
        flash = {v: k for k, v in ATTENTION.items()}[changes["attn_implementation"]]
        out.append(("flash_attn", flash, ["attn_implementation"]))
    if "dtype" in changes:
        dtype = changes["dtype"]
        if dtype == "fp32":
            out.append((None, None, ["dtype"], "LLaMA-Factory has no fp32 key: with bf16 and fp16 off it infers the "
                                               "dtype from the model"))
        else:
            out.append((dtype, True, ["dtype"]))
            if r.get("fp16" if dtype == "bf16" else "bf16"):
                out.append(("fp16" if dtype == "bf16" else "bf16", False, ["dtype"]))
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
