"""An approximate throughput model: tokens per second and training time for a plan on its GPU.

Every figure here is APPROXIMATE. It exists so that "slower" in a suggestion is a number, and so two
plans can be compared on the same footing; it is not a benchmark.

FLOPs per token (training, per token of a sequence of length S):

* Matmul parameters N: the block linears, the experts a token actually visits (MoE: ``top_k`` of
  ``num_experts`` plus the router), and the LM head (``vocab x hidden``; the embedding lookup is not a
  matmul). This is the "active" N of MoE models.
* Forward: ``2 N`` (one multiply-add per weight) plus attention ``4 L H_q d S`` (Q.K^T and A.V,
  ``2 S`` multiply-adds per head dimension per token, no causal discount), following Kaplan et al.
  2020 ("Scaling Laws for Neural Language Models", section 2.1: C_forward ~ 2N + 2 n_layer n_ctx
  d_attn) and PaLM (Chowdhery et al. 2022, appendix B: 6N + 12 L H Q T per training token).
* Backward: gradients with respect to activations cost another ``2 N`` and twice the attention
  forward; gradients with respect to weights cost ``2 N_trainable``. Full fine-tuning therefore costs
  ``6 N + 12 L H_q d S``; LoRA/QLoRA skip the weight-gradient GEMMs of the frozen base (``4 N``
  instead of ``6 N``) and add ``6 N_adapter`` for the adapters.
* Gradient checkpointing recomputes each decoder block's forward during backward (Chen et al. 2016;
  Korthikanti et al. 2022 put full recomputation at about +33% of a step): one more forward of the
  blocks, i.e. ``2 (N - N_head) + 4 L H_q d S``.

Time per micro-step on one GPU is the larger of compute time (FLOPs / (dense bf16-or-fp16 TFLOPS x
TRAINING_FLOPS_UTILISATION)) and memory time (weights read once per pass over
memory_bandwidth x MEMORY_BANDWIDTH_UTILISATION), a roofline. Added to it, amortized over gradient
accumulation: the optimizer step's state traffic, CPU-offload copies over PCIe (PCIE_BANDWIDTH_GBS)
and the CPU Adam step (HOST_MEMORY_BANDWIDTH_GBS), and multi-GPU gradient all-reduce / ZeRO-3
parameter gathers over GPU_INTERCONNECT_BANDWIDTH_GBS, taken as not overlapped (conservative). QLoRA
multiplies a LoRA step by 1 + QLORA_STEP_TIME_OVERHEAD (the measured cost of dequantizing). fp32
compute uses half the bf16 tensor rate (TF32 on A100/H100 datasheets). Constants come from
``data/calibration.json`` with their sources.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field

from . import catalog
from .constants import DTYPE_BYTES, constant
from .model_sources import ResolvedModel, resolve_model
from .plan import TrainingPlan
from .spec import ModelSpec

# When the plan names no catalog GPU (gpu_vram_gb only), relative figures use this GPU's numbers.
REFERENCE_GPU = "A100 80GB SXM"

APPROXIMATE_LABEL = (
    "approximate: a roofline from FLOPs per token (Kaplan et al. 2020; PaLM appendix B) and the catalog's "
    "dense TFLOPS and memory bandwidth at a documented utilisation; not a benchmark"
)


class Throughput(BaseModel):
    """Approximate training speed of a plan (all GPUs together unless a field says per GPU)."""

    approximate: bool = Field(True, description="always true: these are model figures, not measurements")
    label: str = APPROXIMATE_LABEL
    gpu: str = Field(description="the GPU whose TFLOPS and bandwidth were used")
    gpu_assumed: bool = Field(description="true when the plan named no catalog GPU and the reference GPU was used")
    num_gpus: int
    flops_per_token: float = Field(description="training FLOPs per token actually executed (incl. recomputation)")
    model_flops_per_token: float = Field(description="6N + 12 L H d S (PaLM's MFU convention) for comparison")
    utilisation: float = Field(description="TRAINING_FLOPS_UTILISATION: fraction of dense peak assumed")
    bound: str = Field(description="what limits a micro-step: 'compute' or 'memory'")
    seconds_per_micro_step: float = Field(description="one micro-batch forward+backward on one GPU")
    seconds_per_optimizer_step: float = Field(
        description="gradient_accumulation_steps micro-steps plus the optimizer step and communication"
    )
    tokens_per_optimizer_step: int = Field(description="tokens consumed by one optimizer step on all GPUs")
    tokens_per_second: float = Field(description="all GPUs together")
    tokens_per_second_per_gpu: float
    seconds_per_million_tokens: float
    training_tokens: int | None = None
    training_seconds: float | None = None
    training_hours: float | None = None
    notes: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class Flops:
    """FLOPs per training token, split by what they are."""

    matmul_params: int  # active matmul parameters per token (incl. LM head)
    head_params: int
    adapter_params: int
    attention_forward: float
    total: float
    model: float  # 6N + attention (no recomputation): the MFU convention


def _active_matmul_params(spec: ModelSpec) -> int:
    n = 0
    for i, count in spec.layer_groups:
        per_layer = sum(lin.weight_params for lin in spec.layer_linears(i))
        if spec.is_moe_layer(i):
            moe = spec.moe
            assert moe is not None
            per_layer += moe.top_k * 3 * spec.hidden_size * moe.expert_intermediate + moe.num_experts * spec.hidden_size
        n += per_layer * count
    return n + spec.vocab_size * spec.hidden_size


def _adapter_params(plan: TrainingPlan, spec: ModelSpec) -> int:
    if not plan.uses_adapters:
        return 0
    from .resolved import resolve

    try:
        return resolve(plan, spec).adapter_params
    except ValueError:
        return 0


def flops_per_token(plan: TrainingPlan, spec: ModelSpec) -> Flops:
    """Training FLOPs per token of ``plan`` (see the module docstring for the formula and sources)."""
    n = _active_matmul_params(spec)
    head = spec.vocab_size * spec.hidden_size
    adapters = _adapter_params(plan, spec)
    attn_fwd = 4.0 * spec.num_layers * spec.q_dim * plan.seq_len
    forward = 2.0 * n + attn_fwd + 2.0 * adapters
    if plan.method == "full":
        backward = 4.0 * n + 2.0 * attn_fwd
    else:  # frozen base: activation gradients only, plus the adapters' weight gradients
        backward = 2.0 * n + 2.0 * attn_fwd + 4.0 * adapters
    recompute = (2.0 * (n - head) + attn_fwd + 2.0 * adapters) if plan.gradient_checkpointing else 0.0
    model = 6.0 * n + 3.0 * attn_fwd
    return Flops(n, head, adapters, attn_fwd, forward + backward + recompute, model)


def _gpu_numbers(plan: TrainingPlan) -> tuple[str, bool, float, float]:
    entry = catalog.find_gpu(plan.gpu) if plan.gpu else None
    assumed = entry is None
    if entry is None:
        entry = catalog.find_gpu(REFERENCE_GPU)
        assert entry is not None
    if plan.dtype == "fp32":
        tflops = (entry.tflops_bf16_dense or entry.tflops_fp16_dense) / 2.0
    elif plan.dtype == "bf16" and entry.tflops_bf16_dense:
        tflops = entry.tflops_bf16_dense
    else:
        tflops = entry.tflops_fp16_dense
    return entry.name, assumed, tflops * 1e12, entry.memory_bandwidth_gbs * 1e9


def _weight_bytes(plan: TrainingPlan, spec: ModelSpec) -> float:
    """Bytes of weights one full pass over the model reads (all GPUs' shards together)."""
    dense = DTYPE_BYTES["fp32" if plan.precision == "mixed" else plan.dtype]
    linear = spec.linear_weight_params + spec.expert_params
    rest = spec.total_params - linear
    if plan.quantized_4bit:
        return linear * 0.5 + rest * dense
    if plan.load_in_8bit:
        return linear * 1.0 + rest * dense
    return spec.total_params * dense


def _micro_step_seconds(plan: TrainingPlan, spec, compute_s: float, bw: float,
                        notes: list[str]) -> tuple[float, str, float]:
    """(one micro-step's seconds, what bounds it, its communication seconds): compute or weight reads, QLoRA's
    dequantization, all-gathers and offloaded weights."""
    pcie = constant("PCIE_BANDWIDTH_GBS") * 1e9
    link = constant("GPU_INTERCONNECT_BANDWIDTH_GBS") * 1e9
    n_gpus = plan.num_gpus
    weights = _weight_bytes(plan, spec)
    passes = 3 if plan.gradient_checkpointing else 2
    full_shard = plan.sharding in ("zero3", "fsdp_full_shard")
    # every GPU reads the whole (gathered) weights once per pass
    memory_s = passes * weights / bw
    micro_s = max(compute_s, memory_s)
    bound = "compute" if compute_s >= memory_s else "memory"
    if plan.method == "qlora":
        micro_s *= 1.0 + constant("QLORA_STEP_TIME_OVERHEAD")
        notes.append(f"QLoRA: +{constant('QLORA_STEP_TIME_OVERHEAD'):.0%} step time for dequantizing the 4-bit base")
    # per micro-step communication
    comm_micro = 0.0
    if n_gpus > 1 and full_shard:
        comm_micro += passes * weights * (n_gpus - 1) / n_gpus / link
    if plan.offload_params:
        comm_micro += passes * weights / n_gpus / pcie
        notes.append("offload_params: weights stream over PCIe every pass")
    return micro_s, bound, comm_micro


def _state_bytes_per_param(optim: str) -> int:
    if optim in ("adamw_bnb_8bit", "paged_adamw_8bit"):
        return 2
    if optim == "sgd":
        return 0
    if optim == "adafactor":
        return 1  # factored second moment: about O(rows + cols), small
    return 8


def _optimizer_step_seconds(plan: TrainingPlan, spec, adapter_params: int, bw: float, notes: list[str]) -> float:
    """Per optimizer step: optimizer state traffic, offload copies, gradient reduction."""
    pcie = constant("PCIE_BANDWIDTH_GBS") * 1e9
    link = constant("GPU_INTERCONNECT_BANDWIDTH_GBS") * 1e9
    host_bw = constant("HOST_MEMORY_BANDWIDTH_GBS") * 1e9
    n_gpus = plan.num_gpus
    trainable = spec.total_params if plan.method == "full" else adapter_params
    if plan.uses_adapters:  # PEFT keeps adapters in fp32, TRL casts them to bf16 on a quantized base
        tb = 2 if (plan.quantized_4bit or plan.load_in_8bit) else 4
    else:
        tb = DTYPE_BYTES["fp32" if plan.precision == "mixed" else plan.dtype]
    state_bytes = _state_bytes_per_param(plan.optim)
    shard_states = 1 / n_gpus if plan.sharding not in ("none", "ddp") else 1.0
    opt_bytes = trainable * shard_states * (3 * tb + 2 * state_bytes)
    opt_s = 0.0
    if plan.offload_optimizer:
        copy = trainable * shard_states * (2 * tb)
        opt_s += copy / pcie + opt_bytes / host_bw
        notes.append("offload_optimizer: gradients and parameters cross PCIe each optimizer step; Adam runs on the CPU")
    else:
        opt_s += opt_bytes / bw
    if n_gpus > 1:
        grad_bytes = trainable * tb
        sharded_grads = plan.sharding in ("zero2", "zero3", "fsdp_full_shard", "fsdp_shard_grad_op")
        factor = (n_gpus - 1) / n_gpus * (1.0 if sharded_grads else 2.0)
        opt_s += grad_bytes * factor / link
        notes.append("multi-GPU communication over a PCIe-class link, not overlapped (NVLink is faster)")
    return opt_s


def throughput(plan: TrainingPlan, model: ResolvedModel | None = None,
               training_tokens: int | None = None) -> Throughput:
    """Approximate tokens per second of ``plan`` and, with ``training_tokens``, the time to train them."""
    rm = model or resolve_model(plan.model)
    spec = rm.spec
    name, assumed, peak_flops, bandwidth = _gpu_numbers(plan)
    util = constant("TRAINING_FLOPS_UTILISATION")
    bw = bandwidth * constant("MEMORY_BANDWIDTH_UTILISATION")
    n_gpus = plan.num_gpus
    notes: list[str] = []
    f = flops_per_token(plan, spec)
    tokens_micro = plan.batch_size * plan.seq_len
    micro_s, bound, comm_micro = _micro_step_seconds(plan, spec, tokens_micro * f.total / (peak_flops * util), bw,
                                                     notes)
    opt_s = _optimizer_step_seconds(plan, spec, f.adapter_params, bw, notes)
    gas = plan.gradient_accumulation_steps
    step_s = gas * (micro_s + comm_micro) + opt_s
    tokens_step = tokens_micro * gas * n_gpus
    tps = tokens_step / step_s
    result = Throughput(
        gpu=name,
        gpu_assumed=assumed,
        num_gpus=n_gpus,
        flops_per_token=f.total,
        model_flops_per_token=f.model,
        utilisation=util,
        bound=bound,
        seconds_per_micro_step=micro_s + comm_micro,
        seconds_per_optimizer_step=step_s,
        tokens_per_optimizer_step=tokens_step,
        tokens_per_second=tps,
        tokens_per_second_per_gpu=tps / n_gpus,
        seconds_per_million_tokens=1e6 / tps,
        notes=notes,
    )
    if assumed:
        result.notes.insert(0, f"no catalog GPU in the plan: figures use the {REFERENCE_GPU}")
    if training_tokens is not None:
        seconds = training_tokens / tps
        result.training_tokens = int(training_tokens)
        result.training_seconds = seconds
        result.training_hours = seconds / 3600.0
    return result
