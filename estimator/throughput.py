"""Throughput and time to train: tokens per second of a plan on its GPUs, with a range the validation supports.

Every figure here is a model, not a measurement. It is validated against published fine-tuning runs
(benchmarks/throughput_published.json; docs/search.md, "Validation against published throughput"): the constants
marked "fitted" in data/calibration.json were fitted on the file's fitting two-thirds, and the range
(``tokens_per_second_low``/``_high``) is the spread of the held-back third's errors.

One micro-step on one GPU (``T`` computed tokens: ``batch_size`` rows, each ``seq_len`` long, or what the dataset,
packing or padding-free batching makes of them) is the sum of what the GPU executes:

* **GEMMs**: the matmul FLOPs (``2 N`` forward, ``2 N`` activation gradients, ``2 N_trainable`` weight gradients,
  one more block forward under checkpointing; LoRA adapters ``6 N_adapter``) at the GPU's dense tensor rate times a
  utilisation that grows with the matrix size: ``GEMM_EFFICIENCY_{HBM,CONSUMER,PRO} / (1 + GEMM_HALF_EFFICIENCY_TOKENS
  / T + GEMM_HALF_EFFICIENCY_HIDDEN / hidden)`` by GPU class (``gpu_class``).
* **Attention**: ``4 L H_q d S`` FLOPs per token forward, halved for the causal flash/SDPA kernels (they skip the
  masked half; eager computes the whole square and moves it through memory: EAGER_ATTENTION_BYTES_PER_SCORE),
  backward ``FLASH_BACKWARD_FLOPS_FACTOR`` times the forward, at FLASH_ATTENTION_RELATIVE_EFFICIENCY of the GEMMs'.
* **Memory-bound kernels**: norms, rotary embeddings, activations, residual adds, PEFT's LoRA path (dropout, casts,
  scale, add), DoRA's norms and the loss over the logits, as bytes per token counted from the transformers/PEFT code
  (``_layer_bytes``), times ELEMENTWISE_TRAFFIC_SCALE, over the memory bandwidth x MEMORY_BANDWIDTH_UTILISATION.
* **Dequantisation** per weight pass (not per token): bitsandbytes NF4 reads 0.5 byte and writes 2 per weight before
  every matmul (DEQUANT_NF4_BYTES_PER_WEIGHT), LLM.int8 3 per weight in backward plus its activation quantisation.

The GPU work overlaps the host's kernel dispatch (LAUNCH_SECONDS_PER_LAYER_PASS per decoder block and pass): a
micro-step takes the larger of the two, which is what small micro-batches are bound by. DeepSpeed ZeRO-3's
per-module hooks add DEEPSPEED_ZERO3_SECONDS_PER_LAYER_PASS. Per optimizer step: the optimizer's state traffic (fused,
or foreach: OPTIMIZER_FOREACH_TRAFFIC_FACTOR) and gradient clipping. More than one GPU: all-gathers,
reduce-scatters and all-reduces over the catalog's NVLink bandwidth (``interconnect_gbs``) or PCIe, at
NCCL_BUS_EFFICIENCY, hidden behind compute up to the sharding's overlap (COMM_OVERLAP_FSDP for PyTorch DDP/FSDP,
COMM_OVERLAP_DEEPSPEED for ZeRO); CPU offload streams over PCIe the same way and runs Adam at
HOST_MEMORY_BANDWIDTH_GBS. Activation offloading copies every block's input over PCIe both ways on a side stream,
exposed only where a phase's copies outlast its compute (``_activation_offload``).

Stacks (``plan.framework``): Unsloth's fused Triton kernels and compiled modules move fewer bytes and launch fewer
kernels (UNSLOTH_ELEMENTWISE_FACTOR, UNSLOTH_LAUNCH_FACTOR); no other plan framework compiles by default.

Real versus padded tokens: without ``dataset`` every row is ``seq_len`` real tokens (the memory model's assumption).
With a JSONL ``dataset`` (estimator/dataset_lengths.py) the rows' lengths decide: padded batches compute the longest
row of each micro-batch for every row, ``padding_free`` computes the real tokens, ``packing`` fills rows of
``seq_len``; tokens per second count real tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from pydantic import BaseModel, Field

from . import catalog, memory, peft_memory
from .constants import DTYPE_BYTES, constant
from .dataset_lengths import token_lengths
from .errors import PlanError
from .inventory import inventory_of
from .model_sources import ResolvedModel, resolve_model
from .plan import TrainingPlan
from .resolved import ResolvedPlan, resolve
from .spec import ModelSpec

# When the plan names no catalog GPU (gpu_vram_gb only), the figures use this GPU's numbers.
REFERENCE_GPU = "A100 80GB SXM"

APPROXIMATE_LABEL = (
    "approximate: a model of the step (GEMMs at a size-dependent utilisation, flash/eager attention, memory-bound "
    "kernels, dequantisation, kernel dispatch, optimizer and communication) fitted on two-thirds of 87 published "
    "runs and checked on the held-back third (docs/search.md); the range is the held-back errors' 10th-90th percentile"
)
RANGE_SOURCE = ("10th and 90th percentiles of measured/model on the held-back third of benchmarks/"
                "throughput_published.json (THROUGHPUT_RANGE_LOW, THROUGHPUT_RANGE_HIGH)")

SHARDED_PARAMS = ("zero3", "fsdp_full_shard")
SHARDED_GRADS = ("zero2", "zero3", "fsdp_full_shard", "fsdp_shard_grad_op", "zero3_hpz", "fsdp_hybrid_shard")
DEEPSPEED = ("zero1", "zero2", "zero3", "zero3_hpz")
# GPUs whose memory is HBM run GEMMs closer to their datasheet peak than the power-limited GDDR cards
HBM_ARCHS = ("sm_60", "sm_70", "sm_80", "sm_90", "sm_100", "gfx90a", "gfx942")


class Throughput(BaseModel):
    """Approximate training speed of a plan (all GPUs together unless a field says per GPU)."""

    approximate: bool = Field(True, description="always true: these are model figures, not measurements")
    label: str = APPROXIMATE_LABEL
    gpu: str = Field(description="the GPU whose TFLOPS, bandwidth and interconnect were used")
    gpu_assumed: bool = Field(description="true when the plan named no catalog GPU and the reference GPU was used")
    num_gpus: int
    flops_per_token: float = Field(description="training FLOPs per computed token actually executed (incl. "
                                               "recomputation; causal attention as the kernel computes it)")
    model_flops_per_token: float = Field(description="6N + 12 L H d S (PaLM's MFU convention) for comparison")
    utilisation: float = Field(description="hardware FLOPs utilisation of the whole step: executed FLOPs / (time x "
                                           "dense peak)")
    bound: str = Field(description="what dominates a micro-step: 'compute', 'memory', 'dispatch' or "
                                   "'communication'")
    seconds_per_micro_step: float = Field(description="one micro-batch forward+backward on one GPU, with the "
                                                      "communication it does not hide")
    seconds_per_optimizer_step: float = Field(
        description="gradient_accumulation_steps micro-steps plus the optimizer step and communication"
    )
    tokens_per_optimizer_step: int = Field(description="real tokens consumed by one optimizer step on all GPUs")
    computed_tokens_per_micro_step: int = Field(0, description="tokens one GPU computes per micro-step, padding "
                                                               "included")
    padding_fraction: float = Field(0.0, description="share of computed tokens that are padding (0 without a "
                                                     "dataset, with packing or padding_free)")
    tokens_per_second: float = Field(description="real tokens per second, all GPUs together")
    tokens_per_second_low: float = Field(0.0, description="low end of the range the validation supports")
    tokens_per_second_high: float = Field(0.0, description="high end of the range the validation supports")
    tokens_per_second_per_gpu: float
    seconds_per_million_tokens: float
    breakdown: dict[str, float] = Field(default_factory=dict,
                                        description="seconds per optimizer step on one GPU, by component (they add "
                                                    "up to seconds_per_optimizer_step; dispatch only where the GPU "
                                                    "waits for it)")
    training_tokens: int | None = None
    training_seconds: float | None = None
    training_hours: float | None = None
    training_hours_low: float | None = None
    training_hours_high: float | None = None
    gpu_hours: float | None = None
    gpu_hours_low: float | None = None
    gpu_hours_high: float | None = None
    notes: list[str] = Field(default_factory=list)


class TrainingTime(BaseModel):
    """How long ``training_tokens`` real tokens take on the plan's GPUs, with the range the validation supports."""

    approximate: bool = True
    label: str = APPROXIMATE_LABEL
    range_source: str = RANGE_SOURCE
    gpu: str
    num_gpus: int
    training_tokens: int
    tokens_per_second: float
    tokens_per_second_low: float
    tokens_per_second_high: float
    seconds: float
    seconds_low: float = Field(description="at tokens_per_second_high")
    seconds_high: float = Field(description="at tokens_per_second_low")
    hours: float
    hours_low: float
    hours_high: float
    gpu_hours: float = Field(description="hours x num_gpus (extra_gpus of a vLLM server not included)")
    gpu_hours_low: float
    gpu_hours_high: float
    notes: list[str] = Field(default_factory=list)
    throughput: Throughput


@dataclass(frozen=True)
class Flops:
    """FLOPs per computed training token, split by what they are."""

    matmul_params: int  # active matmul parameters per token (incl. LM head)
    head_params: int
    adapter_params: int
    attention_forward: float  # attention FLOPs of one forward per token, as the kernel computes them
    total: float  # executed: forward + backward + recomputation
    model: float  # 6N + attention (no recomputation, no causal discount): the MFU convention
    gemm: float = 0.0  # the matmul part of total
    attention: float = 0.0  # the attention part of total


@dataclass(frozen=True)
class Lengths:
    """Tokens per micro-step per GPU: real, computed (padding included), and the attention span per row."""

    real: float
    computed: float
    span: float  # tokens a query attends over, on average (the sequence, or the sample under packing/padding-free)
    note: str | None = None


@dataclass
class _Step:
    """Seconds per micro-step (GPU work by kind, dispatch) and per optimizer step, on one GPU."""

    gemm: float = 0.0
    attention: float = 0.0
    memory: float = 0.0
    dequant: float = 0.0
    dispatch: float = 0.0
    zero3_hooks: float = 0.0
    comm_micro: float = 0.0  # exposed communication per micro-step
    offload_micro: float = 0.0  # exposed activation-offload copies per micro-step
    optimizer: float = 0.0
    comm_step: float = 0.0  # exposed communication per optimizer step
    notes: list[str] = field(default_factory=list)

    @property
    def gpu(self) -> float:
        return self.gemm + self.attention + self.memory + self.dequant

    @property
    def busy(self) -> float:
        """The host dispatches ahead of the GPU (CUDA streams are asynchronous): the slower of the two."""
        return max(self.gpu, self.dispatch)

    @property
    def micro(self) -> float:
        return self.busy + self.zero3_hooks + self.comm_micro + self.offload_micro


# ------------------------------------------------------------------------------------------ model facts


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


def _resolved(plan: TrainingPlan, spec: ModelSpec) -> ResolvedPlan | None:
    try:
        return resolve(plan, spec)
    except (ValueError, PlanError):
        return None


def _adapter_params(plan: TrainingPlan, spec: ModelSpec, r: ResolvedPlan | None = None) -> int:
    if not plan.uses_adapters:
        return 0
    r = r or _resolved(plan, spec)
    return inventory_of(r).adapter_params if r is not None else 0


def _causal_factor(kernel: str) -> float:
    """Share of the S x S score matrix the kernel computes: flash/memory-efficient causal kernels skip the masked
    upper triangle (about half), the eager (math) path computes the whole square and masks it."""
    return 1.0 if kernel == "math" else 0.5


def _window_span(spec: ModelSpec, span: float) -> float:
    """Average attended span over the layers: sliding-window layers attend over at most their window."""
    window = spec.sliding_window
    if not window or span <= window:
        return span
    sliding = min(spec.sliding_window_layers, spec.num_layers)
    return (sliding * window + (spec.num_layers - sliding) * span) / spec.num_layers


def flops_per_token(plan: TrainingPlan, spec: ModelSpec, span: float | None = None,
                    kernel: str | None = None, resolved: ResolvedPlan | None = None) -> Flops:
    """Training FLOPs per computed token of ``plan`` (see the module docstring for the formula and sources).

    ``span`` is the attention span (default ``seq_len``); ``kernel`` the attention kernel ('flash', 'efficient',
    'math'; default: what the plan resolves to); ``resolved`` the plan resolved against ``spec`` when the caller has
    it."""
    r = resolved or _resolved(plan, spec)
    n = _active_matmul_params(spec)
    head = spec.vocab_size * spec.hidden_size
    adapters = _adapter_params(plan, spec, r)
    kernel = kernel or (r.attention_kernel if r is not None else "flash")
    s = _window_span(spec, float(plan.seq_len if span is None else span))
    attn_full = 4.0 * spec.num_layers * spec.q_dim * s
    attn_fwd = attn_full * _causal_factor(kernel)
    bwd_factor = constant("FLASH_BACKWARD_FLOPS_FACTOR") if kernel != "math" else 2.0
    trainable_head = 0.0
    if r is not None and not r.full and peft_memory.head_trains_as_copy(r):
        trainable_head = head
    gemm_fwd = 2.0 * n + 2.0 * adapters
    if plan.method == "full":
        gemm_bwd = 4.0 * n
    else:  # frozen base: activation gradients only, plus the adapters' (and trained copies') weight gradients
        gemm_bwd = 2.0 * n + 4.0 * adapters + 2.0 * trainable_head
    gemm_re = (2.0 * (n - head) + 2.0 * adapters) if plan.gradient_checkpointing else 0.0
    attn = attn_fwd * (1.0 + bwd_factor + (1.0 if plan.gradient_checkpointing else 0.0))
    gemm = gemm_fwd + gemm_bwd + gemm_re
    model = 6.0 * n + 3.0 * attn_full
    return Flops(n, head, adapters, attn_fwd, gemm + attn, model, gemm, attn)


# ------------------------------------------------------------------------------------------ tokens


@lru_cache(maxsize=64)
def _expected_max(lengths: tuple[int, ...], batch: int) -> float:
    """E[max of ``batch`` rows drawn from ``lengths``] (with replacement): sum_k v_k ((k/n)^b - ((k-1)/n)^b)."""
    values = sorted(lengths)
    n = len(values)
    return sum(v * ((k / n) ** batch - ((k - 1) / n) ** batch) for k, v in enumerate(values, start=1))


def token_lengths_per_micro_step(plan: TrainingPlan, spec: ModelSpec | None = None) -> Lengths:
    """Real and computed tokens per micro-step per GPU, and the attention span, for ``plan``'s data handling (a
    VLM's rows carry their image tokens too; the vision tower's own work is not timed)."""
    b, s = plan.batch_size, plan.seq_len
    if spec is not None and spec.vision is not None and plan.image_size is not None:
        from .vision_images import resolve_images

        images = resolve_images(plan, spec)
        s += images.lm_tokens_per_sample if images is not None else 0
    lengths = token_lengths(plan.dataset) if plan.dataset else None
    if not lengths:
        note = None
        if plan.dataset:
            note = f"dataset {plan.dataset!r} gave no row lengths: every row taken as seq_len real tokens"
        return Lengths(float(b * s), float(b * s), float(s), note)
    clipped = tuple(min(max(1, int(x)), s) for x in lengths)
    mean = sum(clipped) / len(clipped)
    per_sample_span = sum(x * x for x in clipped) / (len(clipped) * mean)  # E[l^2]/E[l]: the span a token sees
    if plan.packing:
        return Lengths(float(b * s), float(b * s), per_sample_span,
                       f"packing: rows of {s} tokens filled from samples averaging {mean:.0f} tokens")
    if plan.padding_free:
        return Lengths(b * mean, b * mean, per_sample_span,
                       f"padding_free: {b} samples of {mean:.0f} tokens on average per micro-step, no padding")
    longest = _expected_max(clipped, b)
    return Lengths(b * mean, b * longest, longest,
                   f"padded batches: {b} rows padded to the longest ({longest:.0f} tokens on average) for "
                   f"{mean:.0f} real tokens per row")


# ------------------------------------------------------------------------------------------ the GPU


@dataclass(frozen=True)
class _Gpu:
    name: str
    assumed: bool
    peak_flops: float
    bandwidth: float  # bytes/s, at MEMORY_BANDWIDTH_UTILISATION
    link: float  # bytes/s per direction between GPUs, at NCCL_BUS_EFFICIENCY
    link_is_pcie: bool
    gemm_efficiency: float
    internode: float = 0.0  # bytes/s per direction per GPU between nodes, at NCCL_BUS_EFFICIENCY (several nodes)


def gpu_class(entry: catalog.CatalogGPU) -> str:
    """'hbm' (datacenter GPUs with HBM: A100, H100, MI300X, ...), 'consumer' (GeForce: boards that boost past their
    rated clock within 350-575 W) or 'pro' (workstation and GDDR datacenter cards: L4, L40S, A10, RTX A/Ada, held
    below their rated boost by 70-350 W power limits under sustained tensor load)."""
    if entry.arch in HBM_ARCHS and entry.category == "datacenter":
        return "hbm"
    return "consumer" if entry.category == "consumer" else "pro"


def _gpu(plan: TrainingPlan) -> _Gpu:
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
    eff = constant("GEMM_EFFICIENCY_HBM") if gpu_class(entry) == "hbm" else \
        constant("GEMM_EFFICIENCY_CONSUMER") if gpu_class(entry) == "consumer" else constant("GEMM_EFFICIENCY_PRO")
    pcie = constant("PCIE_BANDWIDTH_GBS")
    link_gbs = entry.interconnect_gbs or pcie
    return _Gpu(entry.name, assumed, tflops * 1e12,
                entry.memory_bandwidth_gbs * 1e9 * constant("MEMORY_BANDWIDTH_UTILISATION"),
                link_gbs * 1e9 * constant("NCCL_BUS_EFFICIENCY"), entry.interconnect_gbs is None, eff,
                _internode_gbs(entry, plan) * 1e9 * constant("NCCL_BUS_EFFICIENCY"))


def _internode_gbs(entry: catalog.CatalogGPU, plan: TrainingPlan) -> float:
    """GB/s per direction per GPU between nodes: an InfiniBand port per GPU for datacenter cards, one Ethernet uplink
    shared by the node's GPUs otherwise (INTERNODE_BANDWIDTH_GBS_PER_GPU, ..._PER_NODE_ETHERNET)."""
    if entry.category == "datacenter":
        return constant("INTERNODE_BANDWIDTH_GBS_PER_GPU")
    return constant("INTERNODE_BANDWIDTH_GBS_PER_NODE_ETHERNET") / max(plan.node_gpus, 1)


def _gemm_utilisation(g: _Gpu, tokens: float, hidden: int) -> float:
    """Fraction of the dense peak the micro-step's GEMMs reach: larger matrices run closer to peak."""
    return g.gemm_efficiency / (1.0 + constant("GEMM_HALF_EFFICIENCY_TOKENS") / max(tokens, 1.0)
                                + constant("GEMM_HALF_EFFICIENCY_HIDDEN") / hidden)


# ------------------------------------------------------------------------------------------ bytes


def _layer_bytes(spec: ModelSpec, residual_bytes: int) -> float:
    """Bytes the memory-bound kernels of one decoder block move per token in one forward, counted from transformers'
    LlamaDecoderLayer (5.x): two RMSNorms with their fp32 upcast (about 16 bytes per hidden element each, reads and
    writes), two residual adds (3 elements each), rotary embeddings on q and k (about 10 element passes), the
    attention kernel's layout copies (q, k, v in and out), and SwiGLU's act_fn(gate) * up (5 element passes of the
    intermediate width); bf16 elements are 2 bytes, the residual stream's width as resolved."""
    h, i, q, kv = spec.hidden_size, spec.intermediate_size or 4 * spec.hidden_size, spec.q_dim, spec.kv_dim
    if spec.moe is not None:
        i = spec.moe.top_k * spec.moe.expert_intermediate + (spec.moe.shared_intermediate or 0)
    norms = 2 * 16 * h * (residual_bytes / 2)
    residual = 2 * 3 * h * residual_bytes
    rotary = 10 * 2 * (q + kv)
    layout = 2 * 2 * (q + 2 * kv) + 2 * 2 * q
    mlp = 5 * 2 * i
    return norms + residual + rotary + layout + mlp


def _adapter_bytes(d_in: int, d_out: int, adapter_bytes: int, dropout: bool) -> float:
    """Bytes PEFT's LoRA path moves per token in one forward of one adapted linear (peft/tuners/lora/layer.py,
    Linear.forward): the input cast to the adapters' dtype, dropout (when p > 0), lora_A reading it, lora_B's output,
    the scaling, the add into the base output (promoted to the adapters' dtype when they are fp32) and the cast back."""
    a = adapter_bytes
    cast_in = (2 + a) if a != 2 else 0
    drop = (2 * a + 1) if dropout else 0
    out = a + 2 * a + (2 + 2 * a) + ((a + 2) if a != 2 else 0)
    return d_in * (cast_in + drop + a) + d_out * out


def _loss_bytes(spec: ModelSpec, loss: str, stack: str) -> float:
    """Bytes per token of the loss over the vocabulary: transformers' ForCausalLMLoss upcasts the logits to fp32,
    then log_softmax and its backward (about 32 bytes per vocabulary entry); TRL's chunked loss and Unsloth's fused
    cross-entropy keep tiles of bf16 logits (about 8)."""
    per = 8.0 if (loss == "chunked" or stack == "unsloth") else 32.0
    return per * spec.vocab_size


# ------------------------------------------------------------------------------------------ the step


def _micro_step(plan: TrainingPlan, spec: ModelSpec, r: ResolvedPlan | None, g: _Gpu, ln: Lengths,
                f: Flops, step: _Step) -> None:
    """GPU and dispatch seconds of one micro-step on one GPU."""
    t = ln.computed
    util = _gemm_utilisation(g, t, spec.hidden_size)
    step.gemm = t * f.gemm / (g.peak_flops * util)
    kernel = r.attention_kernel if r is not None else "flash"
    attn_rel = constant("FLASH_ATTENTION_RELATIVE_EFFICIENCY")
    if kernel == "efficient":
        attn_rel /= constant("MEMORY_EFFICIENT_ATTENTION_SLOWDOWN")
    step.attention = t * f.attention / (g.peak_flops * util * attn_rel)
    if kernel == "math":  # eager: the whole score matrix goes through memory, forward, backward (twice) and recompute
        scores = t * spec.num_layers * spec.num_heads * _window_span(spec, ln.span)
        passes_eager = (2 if plan.gradient_checkpointing else 1) + 2
        step.attention += scores * passes_eager * constant("EAGER_ATTENTION_BYTES_PER_SCORE") / g.bandwidth
    passes_fwd = 2 if plan.gradient_checkpointing else 1  # forward, and the recomputation
    unsloth = plan.framework == "unsloth"
    ew_factor = constant("UNSLOTH_ELEMENTWISE_FACTOR") if unsloth else 1.0
    residual_bytes = DTYPE_BYTES[r.residual_dtype] if r is not None else 2
    per_token = spec.num_layers * _layer_bytes(spec, residual_bytes) * ew_factor
    dora_weights = 0
    quantized = spec.linear_weight_params + spec.expert_params if (plan.quantized_4bit or plan.load_in_8bit) else 0
    if r is not None and r.adapter_dtype is not None:
        ab = DTYPE_BYTES[r.adapter_dtype]
        for i, count in spec.layer_groups:
            lins = r.adapted_linears(i)
            lb = sum(_adapter_bytes(lin.in_features, lin.out_features, ab, plan.lora_dropout > 0) for lin in lins)
            if r.use_dora:
                lb += sum(24 * lin.out_features for lin in lins)
                dora_weights += count * sum(lin.weight_params for lin in lins)
            per_token += count * lb * ew_factor
    # forward, backward (about twice the forward's traffic), recomputation
    per_token *= passes_fwd + 2
    loss = r.loss_implementation if r is not None else "standard"
    per_token += _loss_bytes(spec, loss, plan.framework)
    bytes_micro = t * per_token * constant("ELEMENTWISE_TRAFFIC_SCALE")
    # gradients of trained weights written or accumulated once per micro-step; a trained embedding's dense gradient
    grad_b = DTYPE_BYTES["fp32" if plan.precision == "mixed" else plan.dtype]
    if plan.method == "full":
        shard = plan.num_gpus if plan.sharding in SHARDED_GRADS else 1
        bytes_micro += 2 * grad_b * spec.total_params / shard
        bytes_micro += 12.0 * spec.vocab_size * spec.hidden_size
    elif r is not None and peft_memory.embedding_trains_as_copy(r):
        bytes_micro += 12.0 * spec.vocab_size * spec.hidden_size
    if dora_weights:
        bytes_micro += passes_fwd * constant("DORA_BYTES_PER_WEIGHT_PASS") * dora_weights
    step.memory = bytes_micro / g.bandwidth
    # dequantising the frozen base: per weight and pass (forward, backward, recomputation), not per token
    weight_passes = passes_fwd + 1
    if plan.quantized_4bit:
        step.dequant = weight_passes * quantized * constant("DEQUANT_NF4_BYTES_PER_WEIGHT") / g.bandwidth
    elif plan.load_in_8bit:
        act = t * spec.num_layers * sum(lin.in_features for lin in spec.layer_linears(0))
        step.dequant = (quantized * constant("DEQUANT_INT8_BYTES_PER_WEIGHT")
                        + passes_fwd * act * constant("INT8_ACTIVATION_QUANT_BYTES")) / g.bandwidth
        step.notes.append("8-bit base: LLM.int8's dequantisation and activation quantisation are counted from "
                          "bitsandbytes' kernels, but no published 8-bit run is in the validation set")
    # host-side kernel dispatch: per decoder block and pass
    passes = passes_fwd + 1
    launch = spec.num_layers * passes * constant("LAUNCH_SECONDS_PER_LAYER_PASS")
    step.dispatch = launch * (constant("UNSLOTH_LAUNCH_FACTOR") if unsloth else 1.0)
    if plan.sharding in ("zero3", "zero3_hpz"):
        step.zero3_hooks = spec.num_layers * passes * constant("DEEPSPEED_ZERO3_SECONDS_PER_LAYER_PASS")


def _param_bytes_stored(plan: TrainingPlan, spec: ModelSpec) -> float:
    """Bytes of the weights as stored (what ZeRO-3/FSDP gathers and CPU offload streams), all shards together."""
    dense = DTYPE_BYTES["fp32" if plan.precision == "mixed" else plan.dtype]
    linear = spec.linear_weight_params + spec.expert_params
    rest = spec.total_params - linear
    if plan.quantized_4bit:
        return linear * 0.5 + rest * dense
    if plan.load_in_8bit:
        return linear * 1.0 + rest * dense
    return spec.total_params * dense


def _trainable(plan: TrainingPlan, spec: ModelSpec, r: ResolvedPlan | None) -> tuple[float, float]:
    """(trainable parameters, their bytes as stored)."""
    if plan.method == "full":
        return float(spec.total_params), float(spec.total_params * DTYPE_BYTES[
            "fp32" if plan.precision == "mixed" else plan.dtype])
    if r is None:
        return 0.0, 0.0
    inv = inventory_of(r)
    return float(inv.trainable_params), float(inv.trainable_bytes)


def _state_bytes(optim: str, param_bytes: float) -> float:
    """Bytes per moment element of the optimizer (torch AdamW keeps moments in the parameters' dtype)."""
    if optim in ("adamw_bnb_8bit", "paged_adamw_8bit"):
        return 1.0
    return param_bytes


def _optimizer_seconds(plan: TrainingPlan, spec: ModelSpec, trainable: tuple[float, float], g: _Gpu,
                       step: _Step) -> None:
    """Per optimizer step on one GPU: the optimizer's traffic, gradient clipping, offload."""
    params, pbytes = trainable
    n = plan.num_gpus
    shard = n if plan.sharding not in ("none", "ddp") else 1
    params /= shard
    pb = pbytes / max(params * shard, 1.0)  # bytes per trainable parameter
    deepspeed = plan.sharding in DEEPSPEED
    if deepspeed:  # DeepSpeed keeps an fp32 master copy and fp32 moments, and writes the 16-bit weights back
        master, sb, gb = 4.0, 4.0, pb
        traffic = params * (2 * master + gb + 4 * sb + pb)
        factor = 1.0  # DeepSpeed's fused Adam
    else:
        sb = _state_bytes(plan.optim, pb)
        if plan.optim == "sgd":
            traffic = params * (3 * pb)
        elif plan.optim == "adafactor":
            traffic = params * (4 * pb)
        else:
            traffic = params * (2 * pb + pb + 4 * sb)
        factor = 1.0 if plan.optim in ("adamw_torch_fused", "adamw_bnb_8bit", "paged_adamw_8bit") else \
            constant("OPTIMIZER_FOREACH_TRAFFIC_FACTOR")
    clip = params * 3 * pb  # gradient-norm clipping (max_grad_norm 1.0 by default): read for the norm, scale
    if plan.offload_optimizer or plan.offload_params:
        pcie = constant("PCIE_BANDWIDTH_GBS") * 1e9
        host = constant("HOST_MEMORY_BANDWIDTH_GBS") * 1e9
        step.optimizer = traffic * factor / host + params * 2 * pb / pcie + clip / g.bandwidth
        step.notes.append("CPU offload: the optimizer step runs on the CPU, gradients and weights cross PCIe")
    else:
        step.optimizer = (traffic * factor + clip) / g.bandwidth


def _communication(plan: TrainingPlan, spec: ModelSpec, trainable: tuple[float, float], g: _Gpu,
                   step: _Step) -> None:
    """Exposed communication per micro-step and per optimizer step: what the sharding cannot hide behind compute."""
    n = plan.num_gpus
    sharding = "ddp" if plan.sharding == "none" and n > 1 else plan.sharding
    tbytes = trainable[1]
    stored = _param_bytes_stored(plan, spec)
    compute = step.busy
    overlap = constant("COMM_OVERLAP_DEEPSPEED") if sharding in DEEPSPEED else constant("COMM_OVERLAP_FSDP")
    micro = 0.0
    per_step = 0.0
    if n > 1 and plan.num_nodes > 1:
        micro, per_step = _across_nodes(plan, sharding, stored, tbytes, g)
        step.notes.append(f"{plan.num_nodes} nodes: collectives that span them run at the inter-node link "
                          f"({g.internode / 1e9:.1f} GB/s per GPU at NCCL's bus efficiency)")
    elif n > 1:
        frac = (n - 1) / n
        if sharding in SHARDED_PARAMS:
            gathers = 2 + (1 if (sharding == "zero3" and plan.gradient_checkpointing) else 0)
            micro += gathers * stored * frac / g.link
            micro += tbytes * frac / g.link  # reduce-scatter of the gradients
        elif sharding in ("zero2", "fsdp_shard_grad_op"):
            micro += tbytes * frac / g.link
            per_step += stored * frac / g.link  # the updated weights gathered after the step
        else:  # ddp, zero1: one all-reduce of the gradients per optimizer step (no_sync while accumulating)
            per_step += 2 * tbytes * frac / g.link
            if sharding == "zero1":
                per_step += stored * frac / g.link
        if g.link_is_pcie:
            step.notes.append(f"{n} GPUs talk over PCIe (the catalog records no NVLink for the {g.name})")
    if plan.offload_params:
        pcie = constant("PCIE_BANDWIDTH_GBS") * 1e9
        passes = 2 + (1 if plan.gradient_checkpointing and sharding == "zero3" else 0)
        micro += passes * stored / n / pcie + tbytes / n / pcie
        step.notes.append("offload_params: each GPU's shard of the weights crosses PCIe every pass")
    step.comm_micro = max(micro - overlap * compute, (1.0 - overlap) * micro) if micro else 0.0
    step.comm_step = max(per_step - overlap * compute, (1.0 - overlap) * per_step) if per_step else 0.0


# With checkpointing a block's FLOPs run as forward (2 per parameter and token), recomputed forward (2) and backward
# (4): forward is a quarter of the micro-step's compute, backward with its recomputation three quarters (Kaplan et
# al. 2020's 2N forward, 4N backward; Korthikanti et al. 2022 for the recomputation)
FORWARD_SHARE_WITH_CHECKPOINTING = 2 / 8


def _activation_offload(plan: TrainingPlan, r: ResolvedPlan | None, step: _Step) -> None:
    """Activation offloading (TRL 1.16's and torchtune 0.6.1's OffloadActivations, ``use_streams`` on CUDA): every
    block's input (memory.offload_host_bytes) crosses PCIe to the host in forward and back in backward, on a side
    stream beside the compute; what a phase's copies take beyond that phase's compute is exposed. Full overlap up to
    the compute is the best case, not a GPU measurement."""
    if r is None or not plan.activation_offloading:
        return
    one_way = memory.offload_host_bytes(r) / (constant("PCIE_BANDWIDTH_GBS") * 1e9)
    forward = FORWARD_SHARE_WITH_CHECKPOINTING * step.busy
    step.offload_micro = max(0.0, one_way - forward) + max(0.0, one_way - (step.busy - forward))
    step.notes.append("activation offloading: every block's input crosses PCIe twice per micro-step on a side stream; "
                      "only what outlasts the compute is counted")


def _across_nodes(plan: TrainingPlan, sharding: str, stored: float, tbytes: float, g: _Gpu) -> tuple[float, float]:
    """(per micro-step, per optimizer step) seconds of communication on several nodes. A collective over every GPU
    runs at the slower of NVLink and the inter-node link (NCCL's rings cross nodes); FSDP's hybrid shard gathers and
    reduce-scatters inside a node and all-reduces its shard across nodes; ZeRO++ hpZ gathers across nodes in forward
    and from the node's secondary partition in backward (ZeRO++, arXiv 2306.10209, sec. 3.2)."""
    n, k, nodes = plan.num_gpus, plan.node_gpus, plan.num_nodes
    wide = min(g.link, g.internode) if g.internode else g.link
    frac, inside, across = (n - 1) / n, (k - 1) / k if k > 1 else 0.0, (nodes - 1) / nodes
    gathers = 2 + (1 if plan.gradient_checkpointing else 0)
    if sharding == "fsdp_hybrid_shard":
        micro = gathers * stored * inside / g.link + tbytes * inside / g.link
        return micro, 2 * (tbytes / k) * across / (g.internode or g.link)
    if sharding == "zero3_hpz":
        micro = stored * frac / wide + (gathers - 1) * stored * inside / g.link + tbytes * frac / wide
        return micro, 0.0
    if sharding in SHARDED_PARAMS:
        return gathers * stored * frac / wide + tbytes * frac / wide, 0.0
    if sharding in ("zero2", "fsdp_shard_grad_op"):
        return tbytes * frac / wide, stored * frac / wide
    return 0.0, 2 * tbytes * frac / wide + (stored * frac / wide if sharding == "zero1" else 0.0)


def _bound(step: _Step) -> str:
    parts = {"compute": step.gemm + step.attention, "memory": step.memory + step.dequant,
             "dispatch": step.dispatch + step.zero3_hooks, "communication": step.comm_micro + step.offload_micro}
    return max(parts, key=lambda k: parts[k])


def _range() -> tuple[float, float]:
    return constant("THROUGHPUT_RANGE_LOW"), constant("THROUGHPUT_RANGE_HIGH")


def throughput(plan: TrainingPlan, model: ResolvedModel | None = None,
               training_tokens: int | None = None) -> Throughput:
    """Tokens per second of ``plan`` (a model, with the range the validation supports) and, with
    ``training_tokens`` (real tokens), the time to train them."""
    rm = model or resolve_model(plan.model)
    spec = rm.spec
    g = _gpu(plan)
    r = _resolved(plan, spec)
    ln = token_lengths_per_micro_step(plan, spec)
    kernel = r.attention_kernel if r is not None else "flash"
    f = flops_per_token(plan, spec, span=ln.span, kernel=kernel, resolved=r)
    step = _Step()
    trainable = _trainable(plan, spec, r)
    _micro_step(plan, spec, r, g, ln, f, step)
    _optimizer_seconds(plan, spec, trainable, g, step)
    _communication(plan, spec, trainable, g, step)
    _activation_offload(plan, r, step)
    gas = plan.gradient_accumulation_steps
    n_gpus = plan.num_gpus
    micro_s = step.micro
    step_s = gas * micro_s + step.optimizer + step.comm_step
    tokens_step = ln.real * gas * n_gpus
    tps = tokens_step / step_s
    low, high = _range()
    notes = list(dict.fromkeys(step.notes))
    if ln.note:
        notes.append(ln.note)
    elif not plan.dataset and not plan.packing:
        notes.append("every row taken as seq_len real tokens (no dataset given): padded short samples train "
                     "fewer real tokens per second")
    if g.assumed:
        notes.insert(0, f"no catalog GPU in the plan: figures use the {REFERENCE_GPU}")
    executed = ln.computed * f.total * gas
    breakdown = {"gemm": gas * step.gemm, "attention": gas * step.attention, "memory_bound": gas * step.memory,
                 "dequantisation": gas * step.dequant, "dispatch_not_hidden": gas * max(0.0, step.dispatch - step.gpu),
                 "deepspeed_zero3_hooks": gas * step.zero3_hooks, "communication": gas * step.comm_micro
                 + step.comm_step, "activation_offload": gas * step.offload_micro, "optimizer": step.optimizer}
    result = Throughput(
        gpu=g.name,
        gpu_assumed=g.assumed,
        num_gpus=n_gpus,
        flops_per_token=f.total,
        model_flops_per_token=f.model,
        utilisation=executed / (step_s * g.peak_flops),
        bound=_bound(step),
        seconds_per_micro_step=micro_s,
        seconds_per_optimizer_step=step_s,
        tokens_per_optimizer_step=round(tokens_step),
        computed_tokens_per_micro_step=round(ln.computed),
        padding_fraction=max(0.0, 1.0 - ln.real / ln.computed),
        tokens_per_second=tps,
        tokens_per_second_low=tps * low,
        tokens_per_second_high=tps * high,
        tokens_per_second_per_gpu=tps / n_gpus,
        seconds_per_million_tokens=1e6 / tps,
        breakdown={k: round(v, 6) for k, v in breakdown.items()},
        notes=notes,
    )
    return result if training_tokens is None else with_training_time(result, training_tokens)


def with_training_time(tp: Throughput, training_tokens: int) -> Throughput:
    """``tp`` with the time and GPU-hours to train ``training_tokens`` real tokens, as a range."""
    low, high = _range()
    seconds = training_tokens / tp.tokens_per_second
    hours = seconds / 3600.0
    return tp.model_copy(update=dict(
        training_tokens=int(training_tokens), training_seconds=seconds, training_hours=hours,
        training_hours_low=hours / high, training_hours_high=hours / low, gpu_hours=hours * tp.num_gpus,
        gpu_hours_low=hours / high * tp.num_gpus, gpu_hours_high=hours / low * tp.num_gpus))


def training_time(plan: TrainingPlan, model: ResolvedModel | None = None,
                  training_tokens: int | None = None) -> TrainingTime:
    """Time and GPU-hours to train ``training_tokens`` real tokens with ``plan``, as a range.

    Without ``training_tokens`` the plan's own budget is used: ``max_steps`` optimizer steps when set, else
    ``num_train_epochs`` over the ``dataset``'s real tokens (estimator/dataset_lengths.py); a plan with neither
    cannot be timed (ValueError)."""
    rm = model or resolve_model(plan.model)
    notes: list[str] = []
    tp0 = throughput(plan, model=rm)
    if training_tokens is None:
        if plan.max_steps > 0:
            training_tokens = int(plan.max_steps * tp0.tokens_per_optimizer_step)
            notes.append(f"{plan.max_steps} optimizer steps of {tp0.tokens_per_optimizer_step:,} real tokens")
        else:
            lengths = token_lengths(plan.dataset) if plan.dataset else None
            if not lengths:
                raise ValueError("training_time needs training_tokens, or a plan with max_steps or a readable JSONL "
                                 "dataset")
            per_epoch = sum(min(x, plan.seq_len) for x in lengths)
            training_tokens = math.ceil(per_epoch * plan.num_train_epochs)
            notes.append(f"{plan.num_train_epochs:g} epoch(s) of {per_epoch:,} real tokens (dataset {plan.dataset!r}, "
                         "characters / 4)")
    tp = with_training_time(tp0, training_tokens)
    assert tp.training_seconds is not None and tp.training_hours is not None
    assert tp.training_hours_low is not None and tp.training_hours_high is not None
    assert tp.gpu_hours is not None and tp.gpu_hours_low is not None and tp.gpu_hours_high is not None
    return TrainingTime(
        gpu=tp.gpu,
        num_gpus=tp.num_gpus,
        training_tokens=int(training_tokens),
        tokens_per_second=tp.tokens_per_second,
        tokens_per_second_low=tp.tokens_per_second_low,
        tokens_per_second_high=tp.tokens_per_second_high,
        seconds=tp.training_seconds,
        seconds_low=tp.training_hours_low * 3600.0,
        seconds_high=tp.training_hours_high * 3600.0,
        hours=tp.training_hours,
        hours_low=tp.training_hours_low,
        hours_high=tp.training_hours_high,
        gpu_hours=tp.gpu_hours,
        gpu_hours_low=tp.gpu_hours_low,
        gpu_hours_high=tp.gpu_hours_high,
        notes=notes + tp.notes,
        throughput=tp,
    )
