"""Axolotl YAML (axolotl 0.18.0, src/axolotl/utils/schemas): its keys and its own defaults."""

from __future__ import annotations

from ..errors import safe_text
from .reading import Reading, fsdp_offload_edits, read_optim, reasons
from .transformers_args import deepspeed_path, fsdp_words, read_torch_compile

SCHEMA = "axolotl 0.18.0's keys as canifinetune knows them (docs/configs.md)"
DEFAULTS = {  # what Axolotl 0.18.0 does when the key is absent
    "method": "full", "lora_dropout": 0.0, "seq_len": 512, "batch_size": 1, "gradient_accumulation_steps": 1,
    "gradient_checkpointing": False, "optim": "adamw_torch_fused", "dtype": "bf16", "packing": False,
}
NOT_MODELLED = {
    "unfrozen_parameters": "training only some parameters in full is not modelled; estimated as every weight training",
    "lora_layers_to_transform": "adapters on some layers only are not modelled; estimated on every layer",
    "peft_layers_to_transform": "adapters on some layers only are not modelled; estimated on every layer",
    "relora": "ReLoRA restarts are not modelled", "lora_on_cpu": "adapters kept on the CPU are not modelled",
    "lora_mlp_kernel": "Axolotl's LoRA kernels are not modelled (PEFT's saved tensors are counted: an upper bound)",
    "lora_qkv_kernel": "Axolotl's LoRA kernels are not modelled (an upper bound)",
    "lora_o_kernel": "Axolotl's LoRA kernels are not modelled (an upper bound)",
    "unsloth_cross_entropy_loss": "Unsloth's cross-entropy is not modelled (full logits are counted: an upper bound)",
    "unsloth_lora_mlp": "Unsloth's LoRA kernels are not modelled",
    "unsloth_lora_qkv": "Unsloth's LoRA kernels are not modelled",
    "unsloth_lora_o": "Unsloth's LoRA kernels are not modelled",
    "unsloth_rms_norm": "Unsloth's RMSNorm is not modelled",
    "flash_attn_cross_entropy": "flash-attn's cross-entropy is not modelled (full logits are counted: an upper bound)",
    "flash_attn_fuse_mlp": "flash-attn's fused MLP is not modelled", "flash_attn_fuse_qkv": "fused QKV is not modelled",
    "sequence_parallel_degree": "sequence parallelism is not modelled (estimated with whole sequences per GPU)",
    "context_parallel_size": "context parallelism is not modelled (estimated with whole sequences per GPU)",
    "tensor_parallel_size": "tensor parallelism is not modelled", "fp8": "fp8 training is not modelled",
    "torch_compile": None,  # read into the plan's torch_compile, which refuses it by name
    "activation_offloading": "activation offloading is not modelled (an upper bound)",
    "eval_batch_size": "evaluation batches are not estimated (training only)",
    "gpu_memory_limit": "a memory cap is not modelled",
    "max_memory": "a device map with a memory cap is not modelled",
    "xformers_attention": "xformers attention: estimated as sdpa",
    "s2_attention": "shifted-sparse attention: estimated as sdpa",
    "flex_attention": "flex attention: estimated as sdpa",
    "liger_fused_linear_cross_entropy": "Liger's fused loss is not modelled (full logits are counted: an upper bound)",
    "liger_rms_norm": "Liger's RMSNorm is not modelled", "liger_glu_activation": "Liger's SwiGLU is not modelled",
    "liger_rope": "Liger's RoPE is not modelled", "liger_layer_norm": "Liger's LayerNorm is not modelled",
    "gptq": "GPTQ bases are not modelled (estimated as a 16-bit base)",
    "chunked_cross_entropy": "Axolotl's chunked cross-entropy is not modelled (full logits and their fp32 upcast are "
                             "counted: an upper bound)",
    "tiled_mlp": "ALST tiled MLP is not modelled (whole-sequence MLP activations are counted: an upper bound)",
}
NOT_MODELLED.update({
    "ddp_bucket_cap_mb": "DDP's gradient bucket size is not modelled",
    "overrides_of_model_config": "changes to the model's config.json are not read (the model's own config is "
                                 "estimated)",
    "bfloat16": "loading the base in bf16 without mixed precision: estimated with bf16/fp16's dtype",
    "float16": "loading the base in fp16 without mixed precision: estimated with bf16/fp16's dtype",
    "float32": "loading the base in fp32: estimated with bf16/fp16's dtype",
    "label_smoothing_factor": "label smoothing's fp32 log-softmax over the logits is not modelled",
    "optim_args": "optimizer arguments are not read (the optimizer's states are estimated with its defaults)",
    "optim_target_modules": "GaLore/APOLLO target modules: the projected optimizer states are not modelled",
    "auto_find_batch_size": "the batch size found at run time is not modelled; micro_batch_size is estimated",
})
SUPPORTED_RL = (None, "", False)
READS = ("base_model", "adapter", "load_in_4bit", "load_in_8bit", "lora_r", "lora_alpha", "lora_dropout",
         "lora_target_modules", "lora_target_linear", "lora_modules_to_save", "peft_use_dora", "sequence_len",
         "micro_batch_size", "batch_size", "gradient_accumulation_steps", "sample_packing", "pad_to_sequence_len",
         "optimizer", "gradient_checkpointing", "flash_attention", "sdp_attention", "eager_attention", "bf16", "fp16",
         "cut_cross_entropy", "deepspeed", "fsdp", "fsdp_version", "fsdp_config", "plugins", "rl")
# Axolotl keys that do not change GPU memory, each with why (axolotl 0.18.0 src/axolotl/utils/schemas; the keys of
# its examples and docs: a key not listed here, read or warned about gets a warning naming it)
IGNORED = reasons(
    ("the datasets and their preparation (CPU)", "datasets test_datasets dataset_prepared_path push_dataset_to_hub "
     "dataset_processes dataset_num_proc dataset_exact_deduplication dataset_keep_in_memory shuffle_merged_datasets "
     "shuffle_before_merging_datasets val_set_size pretraining_dataset streaming skip_prepare_dataset "
     "dataset_shard_num dataset_shard_idx train_on_inputs chat_template chat_template_jinja default_system_message "
     "is_preprocess remove_unused_columns group_by_length curriculum_sampling excess_length_strategy "
     "sample_packing_eff_est sample_packing_bin_size sample_packing_group_size sample_packing_sequentially "
     "pretrain_multipack_attn pretrain_multipack_buffer_size multipack_real_batches dataloader_num_workers "
     "dataloader_pin_memory dataloader_prefetch_factor dataloader_drop_last"),
    ("the tokenizer and its special tokens", "tokenizer_type tokenizer_config tokenizer_use_fast tokenizer_legacy "
     "tokenizer_padding_side tokenizer_save_jinja_files special_tokens tokens added_tokens_overrides"),
    ("which classes load the model: the same weights", "model_type base_model_config model_config_type "
     "revision_of_model trust_remote_code is_llama_derived_model is_mistral_derived_model is_qwen_derived_model "
     "is_falcon_derived_model processor_type"),
    ("the optimization schedule: no memory", "num_epochs max_steps warmup_steps warmup_ratio learning_rate "
     "lr_scheduler lr_scheduler_kwargs cosine_min_lr_ratio cosine_constant_lr_ratio lr_div_factor "
     "lr_quadratic_warmup weight_decay adam_beta1 adam_beta2 adam_beta3 adam_epsilon adam_epsilon2 max_grad_norm "
     "embedding_lr embedding_lr_scale loraplus_lr_ratio loraplus_lr_embedding lr_groups"),
    ("logging and tracking only", "logging_steps wandb_project wandb_entity wandb_watch wandb_name wandb_run_id "
     "wandb_log_model wandb_mode use_wandb mlflow_tracking_uri mlflow_experiment_name mlflow_run_name "
     "hf_mlflow_log_artifacts use_mlflow comet_api_key comet_workspace comet_project_name comet_experiment_key "
     "comet_mode comet_online comet_experiment_config use_comet use_tensorboard include_tokens_per_second "
     "profiler_steps"),
    ("checkpoints and the Hub", "output_dir save_steps saves_per_epoch save_strategy save_total_limit "
     "save_safetensors save_only_model save_first_step resume_from_checkpoint auto_resume_from_checkpoints "
     "hub_model_id hub_strategy hub_revision hf_use_auth_token"),
    ("adapters to continue from: the same shapes as lora_r says", "lora_model_dir"),
    ("when evaluation runs and what it reports (evaluation is not estimated; eval_batch_size is warned about)",
     "eval_steps evals_per_epoch eval_strategy eval_table_size eval_max_new_tokens do_causal_lm_eval "
     "eval_causal_lm_metrics early_stopping_patience load_best_model_at_end metric_for_best_model "
     "greater_is_better eval_sample_packing do_bench_eval bench_dataset bench_split"),
    ("randomness and process setup: no tensors", "seed local_rank ddp_timeout ddp_broadcast_buffers "
     "ddp_find_unused_parameters strict"),
    ("TF32 matmul mode: the same tensors", "tf32"),
    ("use_reentrant and the like: the same saved tensors", "gradient_checkpointing_kwargs"),
    ("NEFTune's noise: one embedding-sized tensor, freed at once", "neftune_noise_alpha"),
    ("the LoRA scaling and layout: the same adapters", "lora_fan_in_fan_out peft_use_rslora peft_layers_pattern"),
)
FSDP_VERSIONS = (1, 2)


def _method(r: Reading) -> None:
    adapter = r.text("adapter")
    four, eight = r.boolean("load_in_4bit", False), r.boolean("load_in_8bit", False)
    r.mark("load_in_4bit", "load_in_8bit")
    if adapter in (None, ""):
        if four or eight:
            raise r.fail("load_in_4bit" if four else "load_in_8bit", "a quantized base needs adapter lora or qlora")
        if r.has("adapter"):
            r.use("adapter", "method", adapter, "full")
        return
    if adapter not in ("lora", "qlora"):
        raise r.fail("adapter", f"'{adapter}' is not estimated; lora, qlora or none (full fine-tuning) are")
    if adapter == "qlora" or four:
        r.use("adapter", "method", adapter, "qlora")
        if not four:
            r.warn("adapter", "Axolotl requires load_in_4bit: true with adapter qlora; estimated with a 4-bit base")
        if four:
            r.use("load_in_4bit", None, True)
    else:
        r.use("adapter", "method", adapter, "lora")
    if eight:
        r.use("load_in_8bit", "load_in_8bit", True)
    _lora(r)


def _lora(r: Reading) -> None:
    rank = r.integer("lora_r", None, 1, 4096)
    if rank is None:
        raise r.fail("adapter", "Axolotl needs lora_r with an adapter (it has no default); add e.g. lora_r: 16")
    r.use("lora_r", "lora_r", rank)
    if r.has("lora_alpha"):
        r.use("lora_alpha", "lora_alpha", r.number("lora_alpha"))
    r.use("lora_dropout", "lora_dropout", r.number("lora_dropout")) if r.has("lora_dropout") else None
    if r.boolean("lora_target_linear", False):
        r.use("lora_target_linear", "target_modules", True, "all-linear")
        r.mark("lora_target_modules")
    elif r.names("lora_target_modules"):
        r.use("lora_target_modules", "target_modules", r.get("lora_target_modules"), r.names("lora_target_modules"))
    saved = r.names("lora_modules_to_save")
    if saved:
        r.use("lora_modules_to_save", "modules_to_save", r.get("lora_modules_to_save"), saved)
    if r.boolean("peft_use_dora", False):
        r.use("peft_use_dora", "use_dora", True)


def _precision(r: Reading) -> None:
    bf16, fp16 = r.get("bf16", "auto"), r.boolean("fp16", False)
    if fp16:
        r.use("fp16", "dtype", True, "fp16")
    elif bf16 == "auto" or bf16 is True:
        r.use("bf16", "dtype", bf16, "bf16") if r.has("bf16") else None
        if bf16 == "auto":
            r.warn("bf16" if r.has("bf16") else None, "bf16 'auto' (Axolotl's default) means bf16 where the GPU has "
                   "it; estimated as bf16 (give --dtype fp16 for a T4 or V100)")
    elif r.boolean("bf16") is False:
        r.use("bf16", "dtype", False, "fp32")
    r.mark("bf16", "fp16")


def _attention(r: Reading) -> None:
    for key, impl in (("flash_attention", "flash_attention_2"), ("sdp_attention", "sdpa"),
                      ("eager_attention", "eager")):
        if r.boolean(key, False):
            r.use(key, "attn_implementation", True, impl)
        elif r.has(key):
            r.mark(key)


def _distribution(r: Reading) -> None:
    deepspeed_path(r)
    fsdp, config = r.get("fsdp"), r.get("fsdp_config")
    if config is not None and not isinstance(config, dict):
        raise r.fail("fsdp_config", f"expected a mapping of FSDP settings (reshard_after_forward, offload_params, "
                                    f"...); got {safe_text(repr(config), 80)}")
    version_key = "fsdp_version" if r.has("fsdp_version") else "fsdp_config.fsdp_version"
    version = r.get(version_key)
    if version is not None and (isinstance(version, bool) or version not in FSDP_VERSIONS):
        raise r.fail(version_key, f"expected 1 or 2 (FSDP1 or FSDP2); got {safe_text(repr(version), 40)}")
    words = [] if fsdp in (None, False, "", []) else fsdp_words(r, "fsdp")
    if not words and not config:
        if version is not None:
            r.warn(version_key, "fsdp_version without fsdp_config: Axolotl does not shard; add fsdp_config to shard")
        return
    strategy = str(_fsdp_setting(r, "sharding_strategy") or "").upper()
    if strategy in ("NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2", "3", "4", "5"):
        raise r.fail("fsdp_config", f"sharding strategy {strategy} is not estimated; FULL_SHARD and SHARD_GRAD_OP are")
    reshard = _fsdp_setting(r, "reshard_after_forward", boolean=True)
    grad_op = "shard_grad_op" in words or reshard is False or strategy in ("SHARD_GRAD_OP", "2")
    key = "fsdp" if words else "fsdp_config"
    r.use(key, "sharding", fsdp if words else config, "fsdp_shard_grad_op" if grad_op else "fsdp_full_shard")
    if "offload" in words or _fsdp_setting(r, "offload_params", boolean=True):
        r.use(key, "offload_params", True)
        r.use(key, "offload_optimizer", True)
    if _fsdp_setting(r, "activation_checkpointing", boolean=True):
        r.use("fsdp_config", "gradient_checkpointing", True)  # FSDP's own checkpointing of each wrapped block
    r.mark("fsdp_config", "fsdp_version")


def _fsdp_setting(r: Reading, name: str, boolean: bool = False):
    """An fsdp_config setting, with or without the 'fsdp_' prefix (checked true/false when ``boolean``)."""
    key = f"fsdp_config.{name}" if r.has(f"fsdp_config.{name}") else f"fsdp_config.fsdp_{name}"
    return r.boolean(key) if boolean else r.get(key)


def read(r: Reading) -> None:
    rl = r.get("rl")
    if rl not in SUPPORTED_RL:
        raise r.fail("rl", f"the {rl} trainer is not estimated yet; supervised fine-tuning (no rl key) is")
    r.mark("rl")
    if r.text("base_model"):
        r.use("base_model", "model", r.text("base_model"))
    _method(r)
    for key, field in (("sequence_len", "seq_len"), ("micro_batch_size", "batch_size"),
                       ("gradient_accumulation_steps", "gradient_accumulation_steps")):
        if r.has(key):
            r.use(key, field, r.integer(key, None, 1, 1_048_576))
    total, steps = r.integer("batch_size", None, 1, 1_048_576), r.integer("gradient_accumulation_steps", 1, 1, 65536)
    if "batch_size" not in r.fields and total:  # Axolotl: micro_batch_size = batch_size // gradient_accumulation_steps
        r.use("batch_size", "batch_size", total, max(1, total // steps))
    if r.has("sample_packing"):
        r.use("sample_packing", "packing", r.boolean("sample_packing", False))
    if r.boolean("pad_to_sequence_len"):
        r.use("pad_to_sequence_len", None, True)  # every row seq_len long: what the estimate assumes anyway
    read_optim(r, "optimizer")
    _checkpointing(r)
    _attention(r)
    _precision(r)
    if r.boolean("cut_cross_entropy", False):
        r.use("cut_cross_entropy", "loss_implementation", True, "chunked")
    _distribution(r)
    _plugins(r)
    read_torch_compile(r, "torch_compile")  # the plan's torch_compile refuses it by name
    for key, message in NOT_MODELLED.items():
        if message is not None and r.get(key) not in (None, False, 0, "", []):
            r.warn(key, message)


def _checkpointing(r: Reading) -> None:
    value = r.get("gradient_checkpointing")
    if value in ("unsloth", "offload"):
        r.use("gradient_checkpointing", "gradient_checkpointing", value, True)
        r.warn("gradient_checkpointing", f"'{value}' also offloads the checkpoints to the CPU, which is not modelled "
                                          "(estimated as plain checkpointing: an upper bound)")
    elif value is not None:
        r.use("gradient_checkpointing", "gradient_checkpointing", r.boolean("gradient_checkpointing"))


def _plugins(r: Reading) -> None:
    plugins = r.get("plugins") or []
    for name in plugins if isinstance(plugins, list) else [plugins]:
        text = str(name)
        if "cut_cross_entropy" in text:
            r.mark("plugins")
        elif "liger" in text.lower():
            r.warn("plugins", f"plugin {text}: Liger's kernels are not modelled (an upper bound)")
        else:
            r.warn("plugins", f"plugin {text}: its memory is not modelled")


# ------------------------------------------------------------------ edits back into the file

SIMPLE = {"model": "base_model", "lora_r": "lora_r", "seq_len": "sequence_len", "batch_size": "micro_batch_size",
          "gradient_accumulation_steps": "gradient_accumulation_steps", "optim": "optimizer",
          "gradient_checkpointing": "gradient_checkpointing", "use_dora": "peft_use_dora",
          "modules_to_save": "lora_modules_to_save", "packing": "sample_packing", "lora_dropout": "lora_dropout",
          "lora_alpha": "lora_alpha", "torch_compile": "torch_compile"}
# The plan fields the reader can set; each has an edit back (tests/test_configs.py checks both)
FIELDS = ("model", "method", "load_in_8bit", "lora_r", "lora_alpha", "lora_dropout", "target_modules",
          "modules_to_save", "use_dora", "seq_len", "batch_size", "gradient_accumulation_steps", "packing", "optim",
          "gradient_checkpointing", "attn_implementation", "dtype", "loss_implementation", "sharding",
          "offload_params", "offload_optimizer", "torch_compile")
ATTENTION_KEYS = {"flash_attention_2": "flash_attention", "sdpa": "sdp_attention", "eager": "eager_attention"}
CCE_PLUGIN = "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"
SHIPPED_DS = {("zero1", False, False): "deepspeed_configs/zero1.json",
              ("zero2", False, False): "deepspeed_configs/zero2.json",
              ("zero3", False, False): "deepspeed_configs/zero3_bf16.json",
              ("zero3", True, True): "deepspeed_configs/zero3_bf16_cpuoffload_all.json",
              ("zero3", False, True): "deepspeed_configs/zero3_bf16_cpuoffload_params.json"}


def edits(changes: dict, new: dict, r: Reading) -> list[tuple]:
    out: list[tuple] = [(SIMPLE[f], v, [f]) for f, v in changes.items() if f in SIMPLE]
    if "method" in changes or "load_in_8bit" in changes or "load_in_4bit" in changes:
        out.extend(_method_edits(changes, new, r))
    if "target_modules" in changes:
        targets = changes["target_modules"]
        if targets == "all-linear":
            out.append(("lora_target_linear", True, ["target_modules"]))
        else:
            out.append(("lora_target_modules", targets, ["target_modules"]))
            if r.get("lora_target_linear"):
                out.append(("lora_target_linear", False, ["target_modules"]))
    if "attn_implementation" in changes:
        out.extend(_attention_edits(changes["attn_implementation"], r))
    if changes.get("loss_implementation") == "chunked":
        plugins = r.get("plugins") if isinstance(r.get("plugins"), list) else []
        if CCE_PLUGIN not in plugins:
            out.append(("plugins", [*plugins, CCE_PLUGIN], ["loss_implementation"]))
        out.append(("cut_cross_entropy", True, ["loss_implementation"],
                    "Axolotl's Cut Cross Entropy plugin never builds the full logits, as the chunked loss estimated "
                    "here"))
    elif "loss_implementation" in changes and r.get("cut_cross_entropy"):
        out.append(("cut_cross_entropy", False, ["loss_implementation"]))
    if "dtype" in changes:
        out.extend(_dtype_edits(changes["dtype"], r))
    return out


def _dtype_edits(dtype: str, r: Reading) -> list[tuple]:
    """fp16: true wins; then bf16 true/auto is bf16 and bf16: false is fp32 (as the reader reads them)."""
    if dtype == "fp16":
        return [("fp16", True, ["dtype"])]
    out: list[tuple] = [("bf16", dtype == "bf16", ["dtype"])]
    if r.get("fp16"):
        out.append(("fp16", False, ["dtype"]))
    return out


def _method_edits(changes: dict, new: dict, r: Reading) -> list[tuple]:
    method = new["method"]
    out: list[tuple] = [("adapter", None if method == "full" else method, ["method"])]
    if method == "qlora":
        out.append(("load_in_4bit", True, ["method"]))
    elif r.get("load_in_4bit"):  # a 4-bit base makes it qlora (or, without an adapter, an error)
        out.append(("load_in_4bit", False, ["method"]))
    if r.get("load_in_8bit") or new.get("load_in_8bit"):
        out.append(("load_in_8bit", bool(new.get("load_in_8bit")) and method == "lora", ["load_in_8bit"]))
    if method != "full" and not r.has("lora_r"):
        out += [("lora_r", new["lora_r"], ["lora_r"]), ("lora_alpha", new["lora_alpha"], ["lora_alpha"])]
        if not r.has("lora_target_linear") and not r.has("lora_target_modules") and new.get("target_modules"):
            targets = new["target_modules"]
            out.append(("lora_target_linear", True, ["target_modules"]) if targets == "all-linear"
                       else ("lora_target_modules", targets, ["target_modules"]))
    return out


def _attention_edits(impl: str | None, r: Reading) -> list[tuple]:
    """The key of ``impl`` on, every other attention key off (None: transformers' default, every key off)."""
    mine = ATTENTION_KEYS.get(impl) if impl else None
    out: list[tuple] = [(mine, True, ["attn_implementation"])] if mine else []
    for other in ("flash_attention", "sdp_attention", "eager_attention", "xformers_attention", "flex_attention",
                  "s2_attention"):
        if other != mine and r.get(other):
            out.append((other, False, ["attn_implementation"]))
    return out


def distribution_edits(changes: dict, new: dict, r: Reading) -> list[tuple]:
    """Sharding and offload in the Axolotl file itself (no DeepSpeed JSON or accelerate config was given)."""
    fields = [f for f in ("sharding", "offload_optimizer", "offload_params") if f in changes]
    sharding = new["sharding"]
    if sharding.startswith("zero"):
        shipped = SHIPPED_DS.get((sharding, bool(new["offload_optimizer"]), bool(new["offload_params"])))
        if shipped:
            return [("deepspeed", shipped, fields, "a DeepSpeed config Axolotl ships (deepspeed_configs/)")]
        name = f"deepspeed_configs/{sharding}_offload_optimizer.json"
        return [("deepspeed", name, fields, f"write {name}: Axolotl's {sharding}.json with "
                 '"offload_optimizer": {"device": "cpu", "pin_memory": true} in zero_optimization')]
    if sharding.startswith("fsdp"):
        return [("fsdp_version", 2, [f for f in fields if f == "sharding"] or fields[:1]),
                ("fsdp_config.reshard_after_forward", sharding == "fsdp_full_shard", ["sharding"]),
                *fsdp_offload_edits("fsdp_config.offload_params", bool(new["offload_params"]), new,
                                    [f for f in fields if f != "sharding"] or ["offload_params"])]
    return [(None, None, fields, "plain data parallel needs no key: launch with one process per GPU")]
