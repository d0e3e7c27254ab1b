"""Which format a config is: by its keys (each format has keys no other uses), then by its syntax."""

from __future__ import annotations

from ..errors import safe_text
from .parse import Doc
from .types import CONFIG_FORMATS, ConfigError

# Keys that only one format uses; a file's format is the one whose keys it has most of.
MARKERS: dict[str, tuple[str, ...]] = {
    "axolotl": ("base_model", "adapter", "micro_batch_size", "sequence_len", "sample_packing", "lora_target_linear",
                "lora_modules_to_save", "datasets", "val_set_size", "flash_attention", "sdp_attention", "optimizer",
                "pad_to_sequence_len", "wandb_project", "special_tokens", "base_model_config", "lora_model_dir"),
    "llama_factory": ("finetuning_type", "stage", "cutoff_len", "template", "lora_rank", "lora_target",
                      "quantization_bit", "flash_attn", "preprocessing_num_workers", "dataset_dir", "overwrite_cache",
                      "plot_loss", "disable_gradient_checkpointing", "additional_target"),
    "trl": ("use_peft", "max_length", "max_seq_length", "lora_target_modules", "dataset_name", "packing",
            "padding_free", "use_bnb_nested_quant", "dataset_text_field", "completion_only_loss",
            "assistant_only_loss", "activation_offloading", "model_init_kwargs", "dataset_train_split",
            # the other TRL trainers' own keys (trl/trainer/*_config.py): a DPO or GRPO file is TRL's too
            "num_generations", "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "generation_batch_size",
            "steps_per_generation", "max_completion_length", "precompute_ref_log_probs", "desirable_weight",
            "undesirable_weight", "center_rewards_coefficient", "reward_funcs"),
    "peft": ("peft_type", "base_model_name_or_path", "target_modules", "task_type", "fan_in_fan_out",
             "init_lora_weights", "inference_mode", "r"),
    "accelerate": ("compute_environment", "distributed_type", "num_processes", "mixed_precision", "machine_rank",
                   "num_machines", "main_training_function", "deepspeed_config", "fsdp_config", "use_cpu",
                   "downcast_bf16", "rdzv_backend", "same_network", "main_process_port"),
    "deepspeed": ("zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size",
                  "gradient_clipping", "zero_allow_untested_optimizer", "wall_clock_breakdown", "steps_per_print",
                  "activation_checkpointing", "zero_force_ds_cpu_optimizer"),
    "transformers": ("per_device_train_batch_size", "output_dir", "learning_rate", "num_train_epochs",
                     "logging_steps", "save_strategy", "lr_scheduler_type", "warmup_ratio", "report_to",
                     "eval_strategy", "gradient_checkpointing", "optim", "bf16", "fp16", "deepspeed", "fsdp"),
}


def detect(doc: Doc) -> str:
    """The format of ``doc``; a ConfigError when no format's keys are there."""
    keys = set(doc.data)
    scores = {fmt: len(keys & set(markers)) for fmt, markers in MARKERS.items()}
    if scores["peft"] and "peft_type" in keys:
        return "peft"
    if (scores["deepspeed"] and "zero_optimization" in keys) or "train_micro_batch_size_per_gpu" in keys:
        return "deepspeed"
    if "distributed_type" in keys or "compute_environment" in keys:
        return "accelerate"
    special = {f: s for f, s in scores.items() if f != "transformers"}
    best = max(special, key=lambda f: special[f])
    if special[best] >= 2 or (special[best] == 1 and not scores["transformers"]):
        return best
    if "model_name_or_path" in keys and scores["transformers"]:
        return "trl"  # a TrainingArguments file with a model: TRL's CLI reads exactly that
    if scores["transformers"]:
        return "transformers"
    shown = ", ".join(sorted(keys)[:8])
    raise ConfigError(
        f"{doc.name} line 1: cannot tell which framework this config is for (keys: {safe_text(shown, 200)}); "
        f"give its format (--config-format, or config_format in MCP: {', '.join(CONFIG_FORMATS)})")


def check_format(name: str, fmt: str) -> str:
    fmt = fmt.strip().lower().replace("-", "_")
    aliases = {"llamafactory": "llama_factory", "llama-factory": "llama_factory", "hf": "transformers",
               "training_arguments": "transformers", "adapter_config": "peft", "ds": "deepspeed"}
    fmt = aliases.get(fmt, fmt)
    if fmt not in CONFIG_FORMATS:
        raise ConfigError(f"{name}: config format {safe_text(repr(fmt), 60)} is not known; one of "
                          f"{', '.join(CONFIG_FORMATS)}")
    return fmt
