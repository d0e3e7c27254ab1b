"""transformers TrainingArguments JSON (HfArgumentParser.parse_json_file): the trainer's memory-relevant keys.
It names no model: --model (or a PEFT adapter_config.json beside it) gives one."""

from __future__ import annotations

from ..errors import safe_text
from .reading import OFF, Reading, fsdp_offload_edits, read_optim, reasons

SCHEMA = "transformers 5 TrainingArguments"
DEFAULTS = {"batch_size": 8, "gradient_accumulation_steps": 1, "gradient_checkpointing": False,
            "optim": "adamw_torch_fused", "dtype": "bf16", "method": "full"}
# The keys read into the plan (tests/test_configs.py walks TrainingArguments' fields: each is read, warned about
# when set, or ignored with its reason)
READS = ("per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing", "bf16", "fp16",
         "optim", "deepspeed", "fsdp", "fsdp_config", "torch_compile")
# Keys that change GPU memory but are not modelled: warned about whenever they are on (a message of None: read and
# only said when set, see read_training_args)
NOT_MODELLED: dict[str, str | None] = {
    "torch_compile": None,  # read into the plan's torch_compile, which refuses it by name
    "use_liger_kernel": "Liger's kernels are not modelled (estimated without them: an upper bound)",
    "activation_offloading": "activation offloading is not modelled (estimated without it: an upper bound)",
    "tp_size": "tensor parallelism is not modelled", "parallelism_config": "the parallelism config is not modelled",
    "per_device_eval_batch_size": "evaluation is not estimated (the training step is); its batch can be larger",
    "eval_accumulation_steps": "evaluation is not estimated (the training step is)",
    "bf16_full_eval": "evaluation is not estimated (the training step is)",
    "fp16_full_eval": "evaluation is not estimated (the training step is)",
    "auto_find_batch_size": "the batch size found at run time is not modelled; per_device_train_batch_size (the "
                            "first it tries) is estimated",
    "activation_checkpointing": "FSDP's activation checkpointing is not read; gradient_checkpointing decides the "
                                "estimate (without it: an upper bound)",
    "use_cpu": "training on the CPU: a GPU estimate does not apply",
    "label_smoothing_factor": "label smoothing's fp32 log-softmax over the logits is not modelled",
    "optim_target_modules": "GaLore/APOLLO target modules: the projected optimizer states are not modelled",
    "optim_args": "optimizer arguments are not read (the optimizer's states are estimated with its defaults)",
    "ddp_bucket_cap_mb": "DDP's gradient bucket size is not modelled",
}
# TrainingArguments keys that do not change GPU memory, each with why (transformers 5.24 training_args.py)
IGNORED = reasons(
    ("the optimization schedule: no memory", "learning_rate weight_decay adam_beta1 adam_beta2 adam_epsilon "
     "max_grad_norm lr_scheduler_type lr_scheduler_kwargs warmup_steps num_train_epochs max_steps"),
    ("logging and tracking only", "logging_steps logging_strategy logging_first_step logging_nan_inf_filter "
     "report_to run_name project trackio_space_id trackio_bucket_id trackio_static_space_id log_level "
     "log_level_replica log_on_each_node disable_tqdm skip_memory_metrics"),
    ("checkpoints written to disk", "output_dir save_steps save_strategy save_total_limit save_only_model "
     "save_on_each_node load_best_model_at_end metric_for_best_model greater_is_better resume_from_checkpoint "
     "restore_callback_states_from_checkpoint ignore_data_skip enable_jit_checkpoint"),
    ("the Hugging Face Hub only", "push_to_hub hub_model_id hub_strategy hub_token hub_private_repo hub_always_push "
     "hub_revision"),
    ("what the script runs", "do_train do_eval do_predict"),
    ("when evaluation runs and what it reports (evaluation is not estimated; its batch is warned about)",
     "eval_strategy eval_steps eval_delay eval_on_start eval_use_gather_object eval_do_concat_batches "
     "batch_eval_metrics prediction_loss_only include_for_metrics"),
    ("host-side data loading (CPU processes and pinned host memory)", "dataloader_drop_last dataloader_num_workers "
     "dataloader_pin_memory dataloader_persistent_workers dataloader_prefetch_factor "
     "dataloader_multiprocessing_context dataloader_in_order accelerator_config"),
    ("which dataset columns and sample order: the same batches", "label_names length_column_name "
     "remove_unused_columns train_sampling_strategy"),
    ("randomness only", "seed data_seed full_determinism"),
    ("counting and averaging of tokens: no tensors", "average_tokens_across_devices include_num_input_tokens_seen"),
    ("process-group setup: no tensors", "local_rank ddp_backend ddp_timeout ddp_find_unused_parameters "
     "ddp_broadcast_buffers ddp_static_graph"),
    ("TF32 matmul mode: the same tensors", "tf32"),
    ("the generation KV cache, off in training", "use_cache"),
    ("use_reentrant and the like: the same saved tensors", "gradient_checkpointing_kwargs"),
    ("only with activation_checkpointing (warned about when on)", "activation_checkpointing_kwargs"),
    ("only with torch_compile (warned about when on)", "torch_compile_backend torch_compile_mode"),
    ("only with use_liger_kernel (warned about when on)", "liger_kernel_config"),
    ("empties the allocator's cache every N steps: the peak is the same", "torch_empty_cache_steps"),
    ("NEFTune's noise: one embedding-sized tensor, freed at once", "neftune_noise_alpha"),
    ("debugging checks (underflow/overflow): no kept tensors", "debug"),
)
FSDP_WORDS = ("full_shard", "shard_grad_op", "offload", "auto_wrap", "no_shard", "hybrid_shard", "hybrid_shard_zero2")


def fsdp_words(r: Reading, key: str) -> list[str]:
    """The FSDP options of ``key`` (a list of options, a string of them, or true): checked, lower case."""
    value = r.get(key)
    if value is True:
        return ["full_shard"]
    if isinstance(value, str):
        words = value.split()
    elif isinstance(value, list) and all(isinstance(w, str) for w in value):
        words = [w for item in value for w in item.split()]
    else:
        raise r.fail(key, f"expected FSDP options ({', '.join(FSDP_WORDS[:4])}), as a list or one string, or true; "
                          f"got {safe_text(repr(value), 80)}")
    words = [w.lower() for w in words]
    bad = [w for w in words if w not in FSDP_WORDS]
    if bad:
        raise r.fail(key, f"'{safe_text(bad[0], 40)}' is not an FSDP option; {', '.join(FSDP_WORDS)} are")
    for word in ("no_shard", "hybrid_shard", "hybrid_shard_zero2"):
        if word in words:
            raise r.fail(key, f"{word} is not estimated; full_shard and shard_grad_op are (no_shard is data "
                              "parallel: leave fsdp out)")
    return words


def deepspeed_path(r: Reading, key: str = "deepspeed") -> None:
    """A DeepSpeed config named by path (read as another --config, or from its name); an inline mapping is warned
    about; anything else is an error."""
    ds = r.get(key)
    if ds in (None, ""):
        return
    if isinstance(ds, str):
        r.use(key, None, ds)
        r.refs.append((key, ds.strip()))
    elif isinstance(ds, dict):
        r.warn(key, "an inline DeepSpeed config is not read; save it as a JSON file and pass it as another --config")
    else:
        raise r.fail(key, f"expected the path of a DeepSpeed JSON config (e.g. ds_z3_config.json); got "
                          f"{safe_text(repr(ds), 80)}")


def _fsdp(r: Reading) -> None:
    fsdp, config = r.get("fsdp"), r.get("fsdp_config")
    if config is not None and not isinstance(config, (dict, str)):
        raise r.fail("fsdp_config", f"expected a mapping of FSDP settings (or a file path); got "
                                    f"{safe_text(repr(config), 80)}")
    if fsdp in (None, False, "", []):
        if isinstance(config, dict) and config:
            r.warn("fsdp_config", "fsdp_config without fsdp: transformers does not shard; set fsdp: true (or "
                                  "full_shard) to shard")
        return
    words = fsdp_words(r, "fsdp")
    if isinstance(config, str):
        r.warn("fsdp_config", "an FSDP config file is not read; its keys can go in fsdp_config here")
    elif isinstance(config, dict):
        r.use("fsdp_config", None, config)
    reshard = _setting(r, "reshard_after_forward")
    grad_op = "shard_grad_op" in words or reshard in (False, "shard_grad_op")
    r.use("fsdp", "sharding", fsdp, "fsdp_shard_grad_op" if grad_op else "fsdp_full_shard")
    offload = _setting(r, "cpu_offload")
    offload = _setting(r, "offload_params") if offload is None else offload
    if "offload" in words or offload is True or str(offload).lower() == "true":
        r.use("fsdp", "offload_params", fsdp, True)
        r.use("fsdp", "offload_optimizer", fsdp, True)


def _setting(r: Reading, name: str):
    """An fsdp_config setting, with or without transformers' 'fsdp_' prefix."""
    value = r.get(f"fsdp_config.{name}")
    return r.get(f"fsdp_config.fsdp_{name}") if value is None else value


def read_training_args(r: Reading) -> None:
    """The TrainingArguments keys TRL's SFTConfig shares."""
    for key, field in (("per_device_train_batch_size", "batch_size"),
                       ("gradient_accumulation_steps", "gradient_accumulation_steps")):
        if r.has(key):
            r.use(key, field, r.integer(key, None, 1, 65536))
    if r.has("gradient_checkpointing"):
        r.use("gradient_checkpointing", "gradient_checkpointing", r.boolean("gradient_checkpointing"))
    if r.boolean("bf16", False):
        r.use("bf16", "dtype", True, "bf16")
    elif r.boolean("fp16", False):
        r.use("fp16", "dtype", True, "fp16")
    r.mark("bf16", "fp16")
    read_optim(r, "optim")
    deepspeed_path(r)
    _fsdp(r)
    read_torch_compile(r, "torch_compile")
    warn_not_modelled(r, NOT_MODELLED)


def read_torch_compile(r: Reading, key: str) -> None:
    """A torch.compile switch (``key`` true or false) into the plan's torch_compile, which refuses it by name."""
    if r.has(key):
        r.use(key, "torch_compile", r.boolean(key, False))


def warn_not_modelled(r: Reading, table: dict[str, str | None]) -> None:
    """Warn about each key of ``table`` that is on (a message of None: read elsewhere), unless a format's own reader
    has read it already (TRL's SFT reads activation_offloading)."""
    for key, message in table.items():
        if message is not None and r.get(key) not in OFF and key not in r.seen:
            r.warn(key, message)


def read(r: Reading) -> None:
    read_training_args(r)
    if not (r.has("bf16") or r.has("fp16")):
        r.warn(None, "neither bf16 nor fp16 is set: the dtype your script loads the model in decides; estimated as "
                     "bf16 (transformers 5 loads a model in its saved dtype; give --dtype fp32 for an fp32 model)")
    r.warn(None, "TrainingArguments has no sequence length: the plan's seq_len is used (give --seq-len)")


# ------------------------------------------------------------------ edits back into the file

SIMPLE = {"batch_size": "per_device_train_batch_size", "gradient_accumulation_steps": "gradient_accumulation_steps",
          "gradient_checkpointing": "gradient_checkpointing", "optim": "optim", "torch_compile": "torch_compile"}


# The plan fields the reader can set; each has an edit back (tests/test_configs.py checks both)
FIELDS = ("batch_size", "gradient_accumulation_steps", "gradient_checkpointing", "optim", "dtype", "sharding",
          "offload_params", "offload_optimizer", "torch_compile")


def edits(changes: dict, new: dict, r: Reading) -> list[tuple]:
    out: list[tuple] = [(SIMPLE[f], v, [f]) for f, v in changes.items() if f in SIMPLE]
    if "dtype" in changes:
        dtype = changes["dtype"]
        if dtype == "fp32":  # neither bf16 nor fp16: the script's dtype decides, estimated as bf16
            out.append((None, None, ["dtype"], "load the model in fp32 in your script and leave bf16 and fp16 off "
                                               "(TrainingArguments has no dtype key)"))
        else:
            other = "fp16" if dtype == "bf16" else "bf16"
            out.append((dtype, True, ["dtype"]))
            if r.get(other):
                out.append((other, False, ["dtype"]))
    return out


def distribution_edits(changes: dict, new: dict, r: Reading) -> list[tuple]:
    fields = [f for f in ("sharding", "offload_optimizer", "offload_params") if f in changes]
    sharding = new["sharding"]
    if sharding.startswith("fsdp"):
        words = ("full_shard" if sharding == "fsdp_full_shard" else "shard_grad_op") + " auto_wrap"
        return fsdp_offload_edits("fsdp", words + (" offload" if new["offload_params"] else ""), new, fields)
    if sharding.startswith("zero"):
        tail = "_offload" if new["offload_optimizer"] and new["offload_params"] else \
            "_offload_optimizer" if new["offload_optimizer"] else "_offload_param" if new["offload_params"] else ""
        name = f"ds_{sharding}{tail}.json"
        return [("deepspeed", name, fields, f"write {name} (zero_optimization.stage {sharding[-1]}"
                 + (", offload to cpu" if tail else "") + "), or pass your DeepSpeed JSON as another --config")]
    return [(None, None, fields, "plain data parallel needs no key: launch with one process per GPU")]
