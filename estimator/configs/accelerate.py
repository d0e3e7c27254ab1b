"""accelerate config YAML (`accelerate config`, default_config.yaml): distributed_type, num_processes,
mixed_precision, deepspeed_config and fsdp_config."""

from __future__ import annotations

from .reading import Reading, fsdp_offload_edits, reasons

SCHEMA = "accelerate 1.15's config (ClusterConfig)"
READS = ("distributed_type", "compute_environment", "num_processes", "mixed_precision", "deepspeed_config",
         "fsdp_config", "num_machines", "dynamo_config", "use_cpu")
NOT_MODELLED: dict[str, str | None] = {
    "dynamo_config": None, "use_cpu": None,  # read: see read()
    "fp8_config": "fp8 training is not modelled",
    "parallelism_config": "the parallelism config (tensor/context parallel) is not modelled",
    "megatron_lm_config": "Megatron-LM is not estimated",
}
IGNORED = reasons(
    ("where and how the processes start: no tensors", "machine_rank main_process_ip main_process_port "
     "main_training_function rdzv_backend same_network enable_cpu_affinity mpirun_config command_file commands"),
    ("which GPUs (num_processes counts them)", "gpu_ids"),
    ("TPU settings: not a CUDA GPU", "downcast_bf16 tpu_env tpu_name tpu_use_cluster tpu_use_sudo tpu_vm tpu_zone"),
    ("debugging checks: no kept tensors", "debug"),
)
FSDP_STRATEGIES = {"FULL_SHARD": "fsdp_full_shard", "1": "fsdp_full_shard", "SHARD_GRAD_OP": "fsdp_shard_grad_op",
                   "2": "fsdp_shard_grad_op"}
PRECISIONS = {"bf16": "bf16", "fp16": "fp16", "no": None, "fp8": None}
ZERO = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}


def _deepspeed(r: Reading) -> None:
    file = r.text("deepspeed_config.deepspeed_config_file")
    if file:
        r.use("deepspeed_config.deepspeed_config_file", None, file)
        r.refs.append(("deepspeed_config.deepspeed_config_file", file))
        return
    stage = r.get("deepspeed_config.zero_stage")
    if not isinstance(stage, int) or isinstance(stage, bool) or stage not in ZERO:
        raise r.fail("deepspeed_config.zero_stage", f"expected 0, 1, 2 or 3; got {stage!r}")
    r.use("deepspeed_config.zero_stage", "sharding", stage, ZERO[stage])
    for key, field in (("offload_optimizer_device", "offload_optimizer"), ("offload_param_device", "offload_params")):
        device = r.get(f"deepspeed_config.{key}")
        if device is not None:
            on = str(device).lower() in ("cpu", "nvme")
            if field == "offload_params" and on and stage != 3:
                r.warn(f"deepspeed_config.{key}", "parameter offload needs ZeRO stage 3; DeepSpeed ignores it here")
                continue
            r.use(f"deepspeed_config.{key}", field, device, on)


def _fsdp(r: Reading) -> None:
    version = r.get("fsdp_config.fsdp_version")
    if version == 2 and r.has("fsdp_config.fsdp_reshard_after_forward"):
        reshard = r.boolean("fsdp_config.fsdp_reshard_after_forward")
        r.use("fsdp_config.fsdp_reshard_after_forward", "sharding", reshard,
              "fsdp_full_shard" if reshard else "fsdp_shard_grad_op")
    else:
        strategy = str(r.get("fsdp_config.fsdp_sharding_strategy", "FULL_SHARD")).upper()
        if strategy not in FSDP_STRATEGIES:
            raise r.fail("fsdp_config.fsdp_sharding_strategy",
                         f"'{strategy}' is not modelled; FULL_SHARD and SHARD_GRAD_OP are (NO_SHARD is DDP: use "
                         "distributed_type MULTI_GPU; HYBRID_SHARD is not estimated yet)")
        r.use("fsdp_config.fsdp_sharding_strategy", "sharding", strategy, FSDP_STRATEGIES[strategy])
    offload = r.boolean("fsdp_config.fsdp_offload_params")
    if offload is not None:
        r.use("fsdp_config.fsdp_offload_params", "offload_params", offload)
        r.use("fsdp_config.fsdp_offload_params", "offload_optimizer", offload)


def read(r: Reading) -> None:
    kind = str(r.get("distributed_type", "NO")).upper()
    r.mark("distributed_type", "compute_environment")
    if kind in ("NO", "MULTI_GPU", "DEEPSPEED", "FSDP"):
        r.use("distributed_type", None, r.get("distributed_type"))
    if kind == "MULTI_GPU":
        r.use("distributed_type", "sharding", kind, "ddp")
    elif kind == "DEEPSPEED":
        _deepspeed(r)
    elif kind == "FSDP":
        _fsdp(r)
    elif kind != "NO":
        raise r.fail("distributed_type", f"'{kind}' is not estimated; NO, MULTI_GPU, DEEPSPEED and FSDP are")
    processes = r.integer("num_processes", None, 1, 1024)
    if processes is not None:
        r.use("num_processes", "num_gpus", processes)
    machines = r.integer("num_machines", None, 1, 1024)
    if machines is not None and machines > 1:  # num_processes counts every machine's processes (accelerate 1.15)
        if processes is None or processes % machines:
            raise r.fail("num_machines", f"{machines} machines need num_processes, a multiple of it (all machines' "
                                         f"processes together); got {processes}")
        r.use("num_machines", "num_nodes", machines)
        r.use("num_machines", "gpus_per_node", machines, processes // machines)
    precision = r.text("mixed_precision")
    if precision is not None:
        mapped = PRECISIONS.get(precision.lower(), "unknown")
        if mapped == "unknown" or precision.lower() == "fp8":
            r.warn("mixed_precision", f"mixed_precision '{precision}' is not modelled; the training config's dtype is "
                                      "used")
        elif mapped:
            r.use("mixed_precision", "dtype", precision, mapped, soft=True)
        else:
            r.use("mixed_precision", None, precision)
    r.mark("deepspeed_config", "fsdp_config", "num_machines", "mixed_precision")
    dynamo = r.get("dynamo_config")
    if isinstance(dynamo, dict):  # a dynamo backend other than NO is torch.compile: the plan refuses it by name
        r.use("dynamo_config", "torch_compile", dynamo, str(dynamo.get("dynamo_backend", "NO")).upper() != "NO")
    if r.boolean("use_cpu", False):
        r.warn("use_cpu", "training on the CPU: a GPU estimate does not apply")
    for key, message in NOT_MODELLED.items():
        if message is not None and r.get(key) not in (None, False, 0, "", [], {}):
            r.warn(key, message)


# The plan fields the reader can set; each has an edit back (tests/test_configs.py checks both)
FIELDS = ("sharding", "offload_params", "offload_optimizer", "num_gpus", "dtype", "num_nodes", "gpus_per_node",
          "torch_compile")


def edits(changes: dict, old: dict, r: Reading) -> list[tuple]:
    out: list[tuple] = []
    kind = str(r.get("distributed_type", "NO")).upper()
    sharding = changes.get("sharding", old["sharding"])  # old: the whole plan, which always has it
    if "num_gpus" in changes:
        out.append(("num_processes", changes["num_gpus"], ["num_gpus"]))
    if "sharding" in changes or "offload_optimizer" in changes or "offload_params" in changes:
        out.extend(_sharding_edits(kind, sharding, changes, r, old))
    return out


def _sharding_edits(kind: str, sharding: str, changes: dict, r: Reading, new: dict) -> list[tuple]:
    out: list[tuple] = []
    fields = [f for f in ("sharding", "offload_optimizer", "offload_params") if f in changes]
    if sharding == "ddp":
        return [("distributed_type", "MULTI_GPU", fields)]
    if sharding.startswith("zero"):
        if kind != "DEEPSPEED":
            out.append(("distributed_type", "DEEPSPEED", ["sharding"]))
        if r.get("deepspeed_config.deepspeed_config_file"):
            return out  # the DeepSpeed JSON carries the rest
        out.append(("deepspeed_config.zero_stage", int(sharding[-1]), ["sharding"]))
        if "offload_optimizer" in changes:
            out.append(("deepspeed_config.offload_optimizer_device", "cpu" if changes["offload_optimizer"] else "none",
                        ["offload_optimizer"]))
        if "offload_params" in changes:
            out.append(("deepspeed_config.offload_param_device", "cpu" if changes["offload_params"] else "none",
                        ["offload_params"]))
        return out
    if kind != "FSDP":
        out.append(("distributed_type", "FSDP", ["sharding"]))
    if r.get("fsdp_config.fsdp_version") == 2:
        out.append(("fsdp_config.fsdp_reshard_after_forward", sharding == "fsdp_full_shard", ["sharding"]))
    else:
        out.append(("fsdp_config.fsdp_sharding_strategy",
                    "FULL_SHARD" if sharding == "fsdp_full_shard" else "SHARD_GRAD_OP", ["sharding"]))
    if "offload_params" in changes or "offload_optimizer" in changes:
        out += fsdp_offload_edits("fsdp_config.fsdp_offload_params", bool(new["offload_params"]), new,
                                  ["offload_params", "offload_optimizer"])
    return out
