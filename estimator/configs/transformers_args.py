"""transformers TrainingArguments JSON (HfArgumentParser.parse_json_file): the trainer's memory-relevant keys.
It names no model: --model (or a PEFT adapter_config.json beside it) gives one."""

from __future__ import annotations

from .reading import Reading, read_optim

DEFAULTS = {"batch_size": 8, "gradient_accumulation_steps": 1, "gradient_checkpointing": False,
            "optim": "adamw_torch_fused", "dtype": "bf16", "method": "full"}
NOT_MODELLED = {
    "torch_compile": "torch.compile's memory is not modelled",
    "use_liger_kernel": "Liger's kernels are not modelled (estimated without them: an upper bound)",
    "activation_offloading": "activation offloading is not modelled (estimated without it: an upper bound)",
    "tp_size": "tensor parallelism is not modelled", "parallelism_config": "the parallelism config is not modelled",
    "neftune_noise_alpha": None, "group_by_length": None, "torch_empty_cache_steps": None,
    "gradient_checkpointing_kwargs": None, "per_device_eval_batch_size": None, "eval_accumulation_steps": None,
}


def _fsdp(r: Reading) -> None:
    fsdp = r.get("fsdp")
    words = " ".join(fsdp) if isinstance(fsdp, list) else str(fsdp or "")
    reshard = r.get("fsdp_config.reshard_after_forward")
    if not words.strip() and not isinstance(r.get("fsdp_config"), dict):
        return
    if isinstance(r.get("fsdp_config"), str):
        r.warn("fsdp_config", "an FSDP config file is not read; its keys can go in fsdp_config here")
    grad_op = "shard_grad_op" in words or reshard is False
    r.use("fsdp", "sharding", fsdp, "fsdp_shard_grad_op" if grad_op else "fsdp_full_shard")
    if "offload" in words or r.get("fsdp_config.offload_params"):
        r.use("fsdp", "offload_params", fsdp, True)
        r.use("fsdp", "offload_optimizer", fsdp, True)
    r.mark("fsdp_config")


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
    r.mark("bf16", "fp16", "tf32")
    read_optim(r, "optim")
    ds = r.get("deepspeed")
    if isinstance(ds, str) and ds.strip():
        r.use("deepspeed", None, ds)
        r.refs.append(("deepspeed", ds))
    elif isinstance(ds, dict):
        r.warn("deepspeed", "an inline DeepSpeed config is not read; save it as a JSON file and pass it as another "
                            "--config")
    _fsdp(r)
    for key, message in NOT_MODELLED.items():
        if message is None:
            r.mark(key)
        elif r.get(key) not in (None, False, 0, "", []):
            r.warn(key, message)


def read(r: Reading) -> None:
    read_training_args(r)
    if not (r.has("bf16") or r.has("fp16")):
        r.warn(None, "neither bf16 nor fp16 is set: the dtype your script loads the model in decides; estimated as "
                     "bf16 (transformers 5 loads a model in its saved dtype; give --dtype fp32 for an fp32 model)")
    r.warn(None, "TrainingArguments has no sequence length: the plan's seq_len is used (give --seq-len)")


# ------------------------------------------------------------------ edits back into the file

SIMPLE = {"batch_size": "per_device_train_batch_size", "gradient_accumulation_steps": "gradient_accumulation_steps",
          "gradient_checkpointing": "gradient_checkpointing", "optim": "optim"}


def edits(changes: dict, new: dict, r: Reading) -> list[tuple]:
    out: list[tuple] = [(SIMPLE[f], v, [f]) for f, v in changes.items() if f in SIMPLE]
    if "dtype" in changes:
        out.append(("fp16" if changes["dtype"] == "fp16" else "bf16", changes["dtype"] != "fp32", ["dtype"]))
    return out


def distribution_edits(changes: dict, new: dict, r: Reading) -> list[tuple]:
    fields = [f for f in ("sharding", "offload_optimizer", "offload_params") if f in changes]
    sharding = new["sharding"]
    if sharding.startswith("fsdp"):
        words = ("full_shard" if sharding == "fsdp_full_shard" else "shard_grad_op") + " auto_wrap"
        return [("fsdp", words + (" offload" if new["offload_params"] else ""), fields)]
    if sharding.startswith("zero"):
        tail = "_offload" if new["offload_optimizer"] and new["offload_params"] else \
            "_offload_optimizer" if new["offload_optimizer"] else "_offload_param" if new["offload_params"] else ""
        name = f"ds_{sharding}{tail}.json"
        return [("deepspeed", name, fields, f"write {name} (zero_optimization.stage {sharding[-1]}"
                 + (", offload to cpu" if tail else "") + "), or pass your DeepSpeed JSON as another --config")]
    return [(None, None, fields, "plain data parallel needs no key: launch with one process per GPU")]
