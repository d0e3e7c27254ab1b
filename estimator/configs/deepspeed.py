"""DeepSpeed JSON: zero_optimization.stage, offload_optimizer/offload_param devices, micro-batch, accumulation,
bf16/fp16. "auto" defers to the trainer (the HF integration fills it from TrainingArguments)."""

from __future__ import annotations

from typing import Any

from .reading import Reading, reasons

SCHEMA = "DeepSpeed's JSON config (deepspeed 0.19 runtime/config.py)"
STAGES = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}
READS = ("zero_optimization", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
         "bf16", "fp16", "activation_checkpointing", "optimizer", "compile")
NOT_MODELLED: dict[str, str | None] = {
    "optimizer": None,  # read: see _optimizer()
    "amp": "apex AMP is not modelled",
    "data_types": "DeepSpeed's gradient-accumulation dtype is not modelled",
    "communication_data_type": "the dtype of the gradient all-reduce buffers is not modelled",
    "pipeline": "pipeline parallelism is not modelled",
    "sequence_parallel_size": "sequence parallelism is not modelled",
    "compression_training": "compression training is not modelled",
    "torch_autocast": "DeepSpeed's torch autocast is not modelled",
    "compile": None,  # read into the plan's torch_compile, which refuses it by name
    "elasticity": "elastic batch sizes are not modelled",
    "activation_checkpointing": "DeepSpeed's own activation checkpointing (partition_activations, cpu_checkpointing) "
                                "is not modelled; the trainer's gradient_checkpointing is",
    "zero_optimization.zero_quantized_weights": "ZeRO++ quantized weights are not modelled",
    "zero_optimization.zero_quantized_gradients": "ZeRO++ quantized gradients are not modelled",
    "zero_optimization.zero_hpz_partition_size": "ZeRO++ hierarchical partitioning is not modelled",
    "zero_optimization.offload_param.nvme_path": "NVMe offload is modelled as CPU offload (the GPU side is the same)",
    "tensor_parallel": "DeepSpeed tensor parallelism (AutoTP) is not modelled",
}


def _auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


def _stage(r: Reading) -> None:
    stage = r.get("zero_optimization.stage")
    if stage is None:
        r.mark("zero_optimization")
        r.use("zero_optimization.stage", "sharding", None, "ddp")
        r.warn("zero_optimization", "no zero_optimization.stage: DeepSpeed runs ZeRO stage 0 (plain data parallel)")
        return
    if not isinstance(stage, int) or isinstance(stage, bool) or stage not in STAGES:
        raise r.fail("zero_optimization.stage", f"expected 0, 1, 2 or 3; got {stage!r}")
    r.use("zero_optimization.stage", "sharding", stage, STAGES[stage])
    for sub, field in (("offload_optimizer", "offload_optimizer"), ("offload_param", "offload_params")):
        device = r.get(f"zero_optimization.{sub}.device")
        if device is None:
            continue
        on = str(device).lower() in ("cpu", "nvme")
        if field == "offload_params" and on and stage != 3:
            r.warn(f"zero_optimization.{sub}", "offload_param needs stage 3; DeepSpeed ignores it here")
            continue
        r.use(f"zero_optimization.{sub}.device", field, device, on)


def _batch(r: Reading) -> None:
    for key, field in (("train_micro_batch_size_per_gpu", "batch_size"),
                       ("gradient_accumulation_steps", "gradient_accumulation_steps")):
        value = r.get(key)
        if value is None:
            continue
        if _auto(value):
            r.use(key, None, value)
            continue
        r.use(key, field, r.integer(key), soft=True)
    if r.has("train_batch_size"):
        r.use("train_batch_size", None, r.get("train_batch_size"))
    for key, dtype in (("bf16.enabled", "bf16"), ("fp16.enabled", "fp16")):
        value = r.get(key)
        if value is True:
            r.use(key, "dtype", value, dtype, soft=True)
        elif value is not None:
            r.use(key, None, value)


IGNORED = reasons(
    ("the learning-rate schedule: no memory", "scheduler"),
    ("gradient clipping and scaling: no kept tensors", "gradient_clipping prescale_gradients "
     "gradient_predivide_factor"),
    ("logging, monitoring and profiling only", "steps_per_print wall_clock_breakdown flops_profiler tensorboard wandb "
     "csv_monitor comms_logger monitor_config memory_breakdown dump_state"),
    ("which optimizers DeepSpeed accepts: the optimizer itself is what is estimated", "zero_allow_untested_optimizer "
     "zero_force_ds_cpu_optimizer"),
    ("checkpoints written to disk", "checkpoint"),
    ("NVMe I/O settings (host side)", "aio"),
    ("the autotuner: a separate run", "autotuning"),
    ("sparse embedding gradients: not used by the trainers estimated", "sparse_gradients"),
    ("data sampling (curriculum lengths at most seq_len: the estimate is their upper bound)", "curriculum_learning "
     "data_efficiency"),
)


def _optimizer(r: Reading) -> None:
    kind = r.get("optimizer.type")
    if kind is None:
        return
    if str(kind).lower() in ("adam", "adamw", "fusedadam", "cpuadam", "deepspeedcpuadam"):
        r.use("optimizer.type", None, kind)  # Adam's two fp32 states, as the trainer's adamw is estimated
    else:
        r.warn("optimizer", f"DeepSpeed's optimizer '{kind}' is not modelled; estimated with the trainer's optim")


def _compile(r: Reading) -> None:
    """DeepSpeed's ``compile`` section ({"enabled": true, ...}, or a bare true): the plan's torch_compile."""
    value = r.get("compile")
    if value is None:
        return
    enabled = value.get("enabled", False) if isinstance(value, dict) else value
    r.use("compile", "torch_compile", value, enabled is True or str(enabled).lower() == "true")


def read(r: Reading) -> None:
    _stage(r)
    _batch(r)
    _optimizer(r)
    _compile(r)
    for key, message in NOT_MODELLED.items():
        value = r.get(key)
        if message is not None and value not in (None, False, 0, {}):
            if isinstance(value, dict) and value.get("enabled") is False:
                r.mark(key)  # {"enabled": false}: off
                continue
            if key == "activation_checkpointing" and not any(
                    value.get(k) for k in ("partition_activations", "cpu_checkpointing") if isinstance(value, dict)):
                r.mark(key)
                continue
            r.warn(key, message)
    r.mark("bf16", "fp16", "zero_optimization", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


# The plan fields the reader can set; each has an edit back (tests/test_configs.py checks both)
FIELDS = ("sharding", "offload_params", "offload_optimizer", "batch_size",
          "gradient_accumulation_steps", "dtype", "torch_compile")


def edits(changes: dict, old: dict) -> list[tuple[str, Any, list[str]]]:
    """(key, new value, plan fields) for the changes a DeepSpeed file can carry."""
    out: list[tuple[str, Any, list[str]]] = []
    sharding = changes.get("sharding", old.get("sharding"))
    if "sharding" in changes and sharding in ("zero1", "zero2", "zero3", "ddp"):
        stage = {v: k for k, v in STAGES.items()}[sharding]
        out.append(("zero_optimization.stage", stage, ["sharding"]))
    if "offload_optimizer" in changes:
        out.append(("zero_optimization.offload_optimizer.device",
                    "cpu" if changes["offload_optimizer"] else "none", ["offload_optimizer"]))
    if "offload_params" in changes:
        out.append(("zero_optimization.offload_param.device",
                    "cpu" if changes["offload_params"] else "none", ["offload_params"]))
    return out
