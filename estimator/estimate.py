"""estimate(): a plan in, an itemized peak, a verdict and its reasons out.

The result's JSON names are the public contract shared by the CLI (`--json`) and the MCP tools.
"""

from __future__ import annotations

import functools
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from . import catalog, term_cache
from . import memory as m
from .components import PHASE, ComponentKind
from .constants import CALIBRATION_VERSION, GIB
from .errors import PlanError, UnknownGPUError
from .inventory import inventory_of
from .model_sources import ResolvedModel, resolve_model
from .phases import PhasePeak, step_peaks
from .plan import TrainingPlan
from .resolved import ResolvedPlan, resolve
from .trainers import resolved_trainer_fields

Verdict = Literal["fits", "tight", "does_not_fit", "unknown"]


class Component(BaseModel):
    """One line of the budget."""

    name: str
    bytes: int = Field(ge=0)
    gib: float
    phase: str = Field(description="where it is counted: static, forward, backward, optimizer, process or margin")
    explanation: str


class GPUTarget(BaseModel):
    model_config = ConfigDict(frozen=True)  # one instance per catalog card is shared by every estimate (resolve_gpu)

    name: str
    usable_bytes: int
    bf16: bool | None = None
    source: str


class TierFit(BaseModel):
    """One method (full, LoRA, QLoRA) on the estimate's GPU: its verdict and budget, or why it is not estimated
    (estimator/tiers.py fills the row)."""

    method: str
    label: str = Field(description="the method as the row names it: full, LoRA, LoRA (8-bit), QLoRA")
    verdict: Verdict | None = Field(description="null when the plan cannot take this method (see refused)")
    budget_bytes: int | None = None
    used_fraction: float | None = None
    refused: str | None = Field(None, description="why this method is not estimated for the plan")


class Speed(BaseModel):
    """How fast the plan trains and, given a token budget, how long (estimator/throughput.py; approximate, with the
    range its validation on published runs supports). The faces fill it, estimate() alone leaves it null."""

    gpu: str = Field(description="the GPU whose speed was modelled (an A100 80GB SXM's for a plan given by size)")
    num_gpus: int = 1
    tokens_per_second: float
    tokens_per_second_low: float
    tokens_per_second_high: float
    training_tokens: int | None = None
    hours: float | None = None
    hours_low: float | None = None
    hours_high: float | None = None
    gpu_hours: float | None = None
    gpu_hours_low: float | None = None
    gpu_hours_high: float | None = None
    basis: str | None = Field(None, description="where the token budget came from (training_tokens, max_steps, the "
                                                "dataset's epochs)")


class Estimate(BaseModel):
    """The estimate for one GPU of the plan (per GPU when num_gpus > 1)."""

    model_config = ConfigDict(frozen=True)

    model: str
    model_source: str
    method: str
    params_total: int
    params_trainable: int
    params_exact: int | None = Field(None, description="parameters counted in the checkpoint's safetensors headers "
                                     "(Hub models), when known; params_total is counted from config.json")
    params_source: Literal["config", "safetensors"] = Field(
        "config", description="config: params_total counted from config.json alone; safetensors: checked against "
        "the checkpoint's safetensors headers (params_exact)")
    image_tokens_per_sample: int | None = Field(
        None, description="a vision-language model: the tokens its images add to each sample's seq_len text tokens "
        "(image placeholders and markers); the language model runs seq_len + this many")
    peak_phase: Literal["forward", "backward", "optimizer", "generation"]
    peak_allocated_bytes: int = Field(description="what torch.cuda.max_memory_allocated would report")
    peak_reserved_bytes: int = Field(description="what torch.cuda.max_memory_reserved would report")
    total_bytes: int = Field(description="reserved plus CUDA context: the process as nvidia-smi sees it")
    budget_bytes: int = Field(description="total plus the safety margin")
    gpu: GPUTarget | None
    gpu_usable_bytes: int | None
    used_fraction: float | None = Field(description="budget_bytes / gpu_usable_bytes")
    verdict: Verdict
    verdict_reason: str
    per_gpu: bool = Field(description="true when num_gpus > 1: every figure is for one GPU")
    phases: dict[str, int] = Field(description="peak allocated bytes at the forward, backward and optimizer peaks "
                                   "(and generation, for GRPO generating with model.generate)")
    breakdown: list[Component]
    host_memory_bytes: int = Field(0, description="host RAM the offloaded states, parameters or activations need (all "
                                                  "GPUs; per node when num_nodes > 1)")
    assumptions: list[str]
    warnings: list[str]
    calibration_version: str
    plan: TrainingPlan
    tiers: list[TierFit] | None = Field(
        None, description="full / LoRA / QLoRA on this GPU, each with its verdict (estimator/tiers.py; the faces fill "
        "it, estimate() alone leaves it null)")
    speed: Speed | None = Field(None, description="tokens per second and, with a token budget, the time to train "
                                "(approximate, a range; estimator/tiers.py estimate_with_tiers fills it)")
    chosen_defaults: list[str] = Field(
        default_factory=list, description="what the estimate chose because the plan left it to the hardware (the "
        "dtype on a GPU without bf16, the sharding for several GPUs), each with why; the plan above is the chosen one")


def _gib(n: int) -> float:
    return round(n / GIB, 3)


def resolve_gpu(plan: TrainingPlan) -> GPUTarget | None:
    if plan.gpu is not None:
        return _catalog_gpu_target(plan.gpu)
    if plan.gpu_vram_gb is not None:
        return GPUTarget(
            name=f"{plan.gpu_vram_gb:g} GB GPU",
            usable_bytes=max(1, int(plan.gpu_vram_gb * GIB)),  # 5e-324 GB is 0 bytes: keep used_fraction finite
            bf16=None,
            source="gpu_vram_gb, taken as GiB of device memory (what torch reports as total_memory)",
        )
    return None


@functools.lru_cache(maxsize=512)  # the catalog is fixed in a process; a search looks up its card for every plan
def _catalog_gpu_target(name: str) -> GPUTarget:
    """The catalog GPU a plan's ``gpu`` names, as the estimate's target; UnknownGPUError (not cached) when it names
    none."""
    found = catalog.lookup_gpu(name)
    entry = found.entry
    if entry is None:  # unknown, ambiguous (the candidates listed), a size the catalog lacks, Apple, laptop
        raise UnknownGPUError(found.message(), field="gpu")
    return GPUTarget(name=entry.name, usable_bytes=entry.total_memory_bytes, bf16=entry.bf16,
                     source=f"catalog: {entry.total_memory_source}")


def estimate(plan: TrainingPlan, model: ResolvedModel | None = None) -> Estimate:
    """Estimate the per-GPU peak memory of ``plan`` and judge it against the plan's GPU.

    What the plan leaves to the hardware is chosen first and said in ``chosen_defaults``: the dtype (fp16 on a GPU
    without bf16) and, for several GPUs without a sharding, the cheapest sharding that fits."""
    resolved_model = model or resolve_model(plan.model)
    chosen: list[str] = []
    measured = _measure_with_choices(plan, resolved_model, chosen)
    return _estimate_of(measured, resolved_model, chosen)


class Judgement(NamedTuple):
    """What the search needs of an estimate: the plan (with what the estimate chose for the hardware), the verdict
    and the budget. ``judge`` computes the same peak as ``estimate`` and skips the itemized result, which the
    search builds only for the plans it returns."""

    plan: TrainingPlan
    verdict: Verdict
    budget_bytes: int
    used_fraction: float | None
    host_memory_bytes: int
    gpu_usable_bytes: int | None


def judge(plan: TrainingPlan, model: ResolvedModel | None = None) -> Judgement:
    """``estimate(plan, model)``'s plan, verdict and budget, without its breakdown, assumptions and warnings."""
    measured = _measure_with_choices(plan, model or resolve_model(plan.model), [])
    return Judgement(plan=measured.plan, verdict=measured.verdict, budget_bytes=measured.budget.budget,
                     used_fraction=measured.fraction, host_memory_bytes=measured.sizes["host_memory"],
                     gpu_usable_bytes=measured.gpu.usable_bytes if measured.gpu else None)


def _measure_with_choices(plan: TrainingPlan, resolved_model: ResolvedModel, chosen: list[str]) -> _Measured:
    """The plan measured after the choices it leaves to the hardware (dtype, sharding), each said in ``chosen``."""
    gpu = resolve_gpu(plan)  # once: neither choice below changes the GPU
    plan = _images_from_the_dataset(plan, resolved_model, chosen)
    plan = _dtype_for_the_gpu(plan, gpu, chosen)
    if plan.sharding_unset:
        return _cheapest_sharding(plan, resolved_model, gpu, chosen)
    return _measure(plan, resolved_model, gpu)


# The shardings tried, cheapest first, for several GPUs given without one: DDP keeps the step as on one GPU (the
# fastest, no DeepSpeed), ZeRO-2 shards gradients and optimizer states, ZeRO-3 the parameters too.
SHARDING_CHOICE_ORDER = ("ddp", "zero2", "zero3")


def _images_from_the_dataset(plan: TrainingPlan, resolved_model: ResolvedModel, chosen: list[str]) -> TrainingPlan:
    """A vision-language plan with a ``dataset`` and no image_size: the dataset's image that the processor makes the
    most tokens of, and (unless the plan sets it) the most images a row holds (estimator/dataset_images.py)."""
    if plan.image_size is not None or not plan.dataset or resolved_model.spec.vision is None:
        return plan
    from .dataset_images import dataset_images, largest_image

    found = dataset_images(plan.dataset)
    if found is None or not found.sizes:
        return plan  # no image sizes to read: check_images asks for image_size
    width, height, tokens = largest_image(found, resolved_model.spec, plan.model, plan.min_pixels, plan.max_pixels,
                                          plan.do_image_splitting, plan.longest_edge, plan.max_image_size)
    changes: dict = {"image_size": f"{width}x{height}"}
    if "images_per_sample" not in plan.model_fields_set:
        changes["images_per_sample"] = max(1, found.most_per_row)
    chosen.append(f"image_size {width}x{height} ({tokens:,} tokens an image), images_per_sample "
                  f"{changes.get('images_per_sample', plan.images_per_sample)}: the largest image and the most images "
                  f"a row of dataset {plan.dataset!r} ({len(found.sizes):,} image sizes in {found.rows:,} rows; "
                  "image_size was not given; set it to choose)")
    return plan.replace(**changes)


def _dtype_for_the_gpu(plan: TrainingPlan, gpu: GPUTarget | None, chosen: list[str]) -> TrainingPlan:
    """fp16 where the plan gives no dtype and its GPU has no bf16 (with fp32 master weights for full fine-tuning,
    which pure fp16 cannot train)."""
    if not (plan.dtype_unset and plan.dtype == "bf16") or gpu is None or gpu.bf16 is not False:
        return plan
    changes: dict = {"dtype": "fp16"}
    words = f"dtype fp16: the {gpu.name} has no bf16 (dtype was not given; set it to choose)"
    if plan.method == "full" and "precision" not in plan.model_fields_set:
        changes["precision"] = "mixed"
        words += "; precision mixed: fp32 master weights, since pure fp16 weights cannot be trained"
    chosen.append(words)
    return plan.replace(**changes)


def _cheapest_sharding(plan: TrainingPlan, resolved_model: ResolvedModel, gpu: GPUTarget | None,
                       chosen: list[str]) -> _Measured:
    """The first of SHARDING_CHOICE_ORDER that fits (or the one needing least when none does), said in ``chosen``."""
    tried: list[_Measured] = []
    for sharding in SHARDING_CHOICE_ORDER:
        measured = _measure(plan.replace(sharding=sharding), resolved_model, gpu)
        tried.append(measured)
        if measured.verdict in ("fits", "unknown"):
            break
    fitting = [t for t in tried if t.verdict in ("fits", "unknown")]
    best = fitting[0] if fitting else min(tried, key=lambda t: t.budget.budget)
    sharding = best.plan.sharding
    if fitting:
        why = ("the cheapest that fits" if best.verdict == "fits" else "the simplest (no GPU given to judge)")
    else:
        why = "none of " + ", ".join(SHARDING_CHOICE_ORDER) + " fits; this one needs the least"
    chosen.append(f"sharding {sharding} over {plan.gpus_words()}: {why} (sharding was not given; set it to choose)")
    return best


class _Measured(NamedTuple):
    """One plan's phase peaks, budget and verdict: everything an Estimate is built from."""

    plan: TrainingPlan
    gpu: GPUTarget | None
    r: ResolvedPlan
    forward: PhasePeak
    backward: PhasePeak
    optimizer: PhasePeak
    extra: tuple[PhasePeak, ...]
    peak: PhasePeak
    sizes: dict
    unmodelled: int
    unmodelled_bytes: int
    params_warning: str | None
    budget: _Budget
    verdict: Verdict
    reason: str
    fraction: float | None


def _measure(plan: TrainingPlan, resolved_model: ResolvedModel, gpu: GPUTarget | None) -> _Measured:
    if gpu is not None and gpu.bf16 is False and plan.dtype == "bf16":
        raise PlanError(
            f"dtype: the {gpu.name} has no bf16 support; use dtype 'fp16' (or 'fp32')", field="dtype"
        )
    r = resolve(plan, resolved_model.spec)
    forward, backward, optimizer, sizes, extra = _phase_peaks(r)
    peak = max((forward, backward, optimizer, *extra), key=lambda p: p.bytes)
    unmodelled, params_warning = _unmodelled_params(resolved_model)
    unmodelled_bytes = unmodelled * r.weight_bytes_per_param  # loaded as frozen weights in the plan's dtype
    b = _budget(plan, gpu, peak.bytes + unmodelled_bytes)
    verdict, reason, fraction = _verdict(plan, gpu, b, sizes["host_memory"])
    return _Measured(plan=plan, gpu=gpu, r=r, forward=forward, backward=backward, optimizer=optimizer, extra=extra,
                     peak=peak, sizes=sizes, unmodelled=unmodelled, unmodelled_bytes=unmodelled_bytes,
                     params_warning=params_warning, budget=b, verdict=verdict, reason=reason, fraction=fraction)


def _estimate_of(measured: _Measured, resolved_model: ResolvedModel, chosen: list[str]) -> Estimate:
    """The itemized Estimate of a measured plan."""
    r, plan, gpu, b = measured.r, measured.plan, measured.gpu, measured.budget
    peak, unmodelled_bytes = measured.peak, measured.unmodelled_bytes
    return Estimate(
        model=resolved_model.id,
        model_source=resolved_model.source,
        method=plan.method,
        params_total=r.spec.total_params,  # the model as the stack builds it (LitGPT unties a tied head)
        params_trainable=inventory_of(r).trainable_params,
        params_exact=resolved_model.params_exact,
        params_source="safetensors" if resolved_model.params_exact else "config",
        image_tokens_per_sample=r.images.lm_tokens_per_sample if r.images is not None else None,
        peak_phase=peak.phase,
        peak_allocated_bytes=b.allocated,
        peak_reserved_bytes=b.reserved,
        total_bytes=b.total,
        budget_bytes=b.budget,
        gpu=gpu,
        gpu_usable_bytes=gpu.usable_bytes if gpu else None,
        used_fraction=measured.fraction,
        verdict=measured.verdict,
        verdict_reason=measured.reason,
        per_gpu=plan.num_gpus > 1,
        phases={"forward": measured.forward.bytes + unmodelled_bytes,
                "backward": measured.backward.bytes + unmodelled_bytes,
                "optimizer": measured.optimizer.bytes + unmodelled_bytes,
                **{p.phase: p.bytes + unmodelled_bytes for p in measured.extra}},
        breakdown=_breakdown(r, gpu, peak, measured.unmodelled, unmodelled_bytes, b),
        host_memory_bytes=measured.sizes["host_memory"],
        assumptions=assumptions(r),
        warnings=_warnings(resolved_model, r, measured.params_warning),
        calibration_version=CALIBRATION_VERSION,
        plan=plan,
        chosen_defaults=list(chosen),
    )


def _phase_peaks(r: ResolvedPlan) -> tuple:
    """The phase peaks, computed once per model and plan whatever the card (estimator/term_cache.py): a search
    measures one plan on many cards, and an assistant asks again with another."""
    return term_cache.PEAKS.get(r, _compute_phase_peaks)


def _compute_phase_peaks(r: ResolvedPlan) -> tuple:
    """(forward, backward, optimizer, sizes, extra phases): SFT's step, or the trainer's
    (estimator/trainer_memory.py)."""
    if r.plan.trainer != "sft":  # DPO/KTO/GRPO: the policy's SFT-like step plus what the trainer adds (trainer_memory)
        from . import phases as phases_module
        from . import trainer_memory

        return trainer_memory.trainer_step_peaks(r, phases_module)
    forward, backward, optimizer, sizes = step_peaks(r)
    return forward, backward, optimizer, sizes, ()


class _Budget(NamedTuple):
    """From the allocated peak to the budget: allocator, CUDA context, vLLM's reservation, safety margin."""

    allocated: int
    overhead: int
    reserved: int
    context: int
    vllm: int
    total: int
    margin: int
    budget: int


def _budget(plan: TrainingPlan, gpu, allocated: int) -> _Budget:
    overhead = m.allocator_overhead_bytes(allocated)
    reserved = allocated + overhead
    context = m.cuda_context_bytes()
    total = reserved + context
    vllm_bytes = 0
    if plan.trainer == "grpo":
        from . import trainer_memory

        vllm = trainer_memory.vllm_reservation_bytes(plan, gpu.usable_bytes if gpu else None)
        vllm_bytes = vllm or 0
        total += vllm_bytes
    margin = m.safety_margin_bytes(total)
    return _Budget(allocated=allocated, overhead=overhead, reserved=reserved, context=context, vllm=vllm_bytes,
                   total=total, margin=margin, budget=total + margin)


def _breakdown(r, gpu, peak, unmodelled: int, unmodelled_bytes: int, b: _Budget) -> list[Component]:
    """The budget's lines: the peak phase's items, then what the process and the margin add."""
    breakdown = [_line(ComponentKind.named(item.name), item.bytes, item.explanation, peak.phase)
                 for item in peak.items if item.bytes > 0]
    if unmodelled_bytes:
        breakdown.append(_line(
            ComponentKind.UNMODELLED_CHECKPOINT_WEIGHTS, unmodelled_bytes,
            f"{unmodelled / 1e9:.2f}B parameters the safetensors headers hold beyond what config.json "
            f"describes, counted as frozen {r.weight_dtype} weights"))
    breakdown.append(_line(ComponentKind.ALLOCATOR_OVERHEAD, b.overhead,
                           "caching-allocator rounding and fragmentation (reserved - allocated)"))
    breakdown.append(_line(ComponentKind.CUDA_CONTEXT, b.context,
                           "CUDA context and kernel images (not counted by torch)"))
    if b.vllm:
        breakdown.append(_line(
            ComponentKind.VLLM_RESERVATION, b.vllm,
            f"vLLM colocated on this GPU takes vllm_gpu_memory_utilization "
            f"({resolved_trainer_fields(r.plan)['vllm_gpu_memory_utilization']}) of its "
            f"{_gib(gpu.usable_bytes if gpu else 0):.2f} GiB (vLLM's documented behaviour, not measured); "
            f"training has the rest"))
    breakdown.append(_line(ComponentKind.SAFETY_MARGIN, b.margin,
                           "headroom for longer runs than a probe shows, evaluation, checkpointing"))
    return breakdown


def _line(kind: ComponentKind, size: int, explanation: str, peak_phase: str = "") -> Component:
    """A breakdown line; its phase from the component's lifetime (estimator/components.py): 'static', the peak
    phase's name for a phase-long component, 'process' or 'margin'."""
    phase = peak_phase if kind.lifetime == PHASE else kind.lifetime
    return Component(name=kind.key, bytes=size, gib=_gib(size), phase=phase, explanation=explanation)


def _verdict(plan: TrainingPlan, gpu, b: _Budget, host_memory: int) -> tuple[Verdict, str, float | None]:
    """(verdict, its reason, the budget's fraction of the usable memory)."""
    verdict: Verdict
    usable = gpu.usable_bytes if gpu else None
    if usable is None:
        verdict, reason = "unknown", "no GPU given: pass gpu (a catalog name) or gpu_vram_gb for a verdict"
        fraction = None
    else:
        fraction = round(b.budget / usable, 4)
        line = 1 - plan.headroom_percent / 100
        if b.budget <= usable * line:
            verdict = "fits"
            reason = f"needs {_gib(b.budget):.2f} GiB with margin of {_gib(usable):.2f} GiB usable ({fraction:.0%})"
        elif b.budget <= usable:
            verdict = "tight"
            reason = (f"needs {_gib(b.budget):.2f} GiB with margin of {_gib(usable):.2f} GiB usable ({fraction:.0%}): "
                      f"above the {line:.0%} line (headroom_percent {plan.headroom_percent:g}), no room for a longer "
                      "batch, evaluation or fragmentation")
        elif b.total <= usable:
            verdict = "tight"
            reason = (f"fits without the safety margin ({_gib(b.total):.2f} of {_gib(usable):.2f} GiB) but not with "
                      f"it ({_gib(b.budget):.2f} GiB): expect to run near the limit")
        else:
            verdict = "does_not_fit"
            reason = f"needs {_gib(b.total):.2f} GiB before margin; the GPU has {_gib(usable):.2f} GiB usable"
    host_need = _host_ram_shortfall(plan, host_memory)
    if host_need is not None and verdict != "unknown":
        verdict, reason = "does_not_fit", host_need
    if plan.num_nodes > 1:
        reason = (f"per GPU ({plan.num_nodes} nodes of {plan.node_gpus} x {gpu.name if gpu else 'GPU'}, "
                  f"{plan.num_gpus} GPUs): " + reason)
    elif plan.num_gpus > 1:
        reason = f"per GPU ({plan.num_gpus} x {gpu.name if gpu else 'GPU'}): " + reason
    return verdict, reason, fraction


# The host RAM the operating system, the training process (Python, torch, CUDA's pinned staging) and the data loader
# take before any offloaded state: an allowance, not a measurement (docs/memory_model.md, "Host RAM").
HOST_RAM_RESERVED_BYTES = 8 * GIB


def _host_ram_shortfall(plan: TrainingPlan, host_memory_bytes: int) -> str | None:
    """Why the offloaded states do not fit the host RAM the plan gives (host_ram_gb), or None."""
    if plan.host_ram_gb is None or host_memory_bytes <= 0:
        return None
    have = int(plan.host_ram_gb * GIB)
    if host_memory_bytes + HOST_RAM_RESERVED_BYTES <= have:
        return None
    return (f"the offloaded tensors need {_gib(host_memory_bytes):.2f} GiB of host RAM, plus "
            f"{_gib(HOST_RAM_RESERVED_BYTES):.0f} GiB for the system and the training process; the machine has "
            f"{plan.host_ram_gb:g} GiB (host_ram_gb)")


def _warnings(resolved_model: ResolvedModel, r, params_warning: str | None) -> list[str]:
    plan = r.plan
    warnings = list(resolved_model.spec.warnings) + list(r.warnings) + ([params_warning] if params_warning else [])
    if plan.seq_len >= 32768:
        warnings.append(
            f"seq_len {plan.seq_len}: very long sequences are where kernels' own scratch grows; measure a "
            "short run (`canifinetune train recipe.yaml --probe 3`) before committing to it"
        )
    if not plan.stack.measured:
        warnings.append(f"framework {plan.framework}: {plan.stack.title} is not measured by the validation harness; "
                        "the estimate takes the conservative choice for each of its settings")
    if plan.optim.startswith("paged_"):
        warnings.append("paged optimizer states can be evicted to host memory under pressure; the estimate "
                        "counts them on the GPU (the safe side)")
    if r.images is not None:
        from .vision_images import tile_marker_warning, tower_target_warning

        for warning in (tower_target_warning(plan, r.spec), tile_marker_warning(plan, r.spec)):
            if warning:
                warnings.append(warning)
    return warnings


def _unmodelled_params(model: ResolvedModel) -> tuple[int, str | None]:
    """Parameters the checkpoint holds beyond the config's count (counted as frozen weights), and a warning
    when the two counts differ by more than 1%."""
    exact, counted = model.params_exact, model.spec.total_params
    if not exact or abs(exact - counted) <= 0.01 * counted:
        return 0, None
    if exact > counted:
        return exact - counted, (
            f"the checkpoint's safetensors headers hold {exact / 1e9:.3f}B parameters but config.json describes "
            f"{counted / 1e9:.3f}B (a vision tower, extra heads or an architecture canifinetune does not model?); "
            "the difference is counted as frozen weights (unmodelled_checkpoint_weights)")
    return 0, (f"the checkpoint's safetensors headers hold {exact / 1e9:.3f}B parameters, fewer than the "
               f"{counted / 1e9:.3f}B config.json describes; the estimate keeps the larger (config) count")


def stack_summary(r) -> str:
    """One sentence: which trainer the estimate assumes, and the settings it takes from it."""
    stack = r.plan.stack
    title = stack.title
    if r.plan.trainer != "sft" and stack.name == "trl":  # the TRL class that runs it (DPOTrainer, GRPOTrainer, ...)
        from .trainers import TRAINER_CLASSES

        title = f"TRL {TRAINER_CLASSES[r.plan.trainer]}"
    parts = [f"{r.loss_implementation} loss"]
    if r.quantization != "none":
        parts.append(f"prepare_model_for_kbit_training {'on' if r.kbit_prepared else 'off'}")
    parts.append(f"LoRA adapters in {r.adapter_dtype}" if r.adapter_dtype else "all weights train")
    text = f"stack: {title} ({stack.version}): " + ", ".join(parts)
    if not stack.measured:
        text += "; not measured by the validation harness, estimated conservatively"
    return text


def assumptions(r) -> list[str]:
    plan = r.plan
    sample = (f"every sample is {plan.seq_len} tokens (no padding, no packing); micro-batch {plan.batch_size}"
              if r.images is None else
              f"every sample is {plan.seq_len} text tokens and {r.images.words()}: the language model runs "
              f"{r.sequence_length:,} tokens a sample (no padding, no packing); micro-batch {plan.batch_size}")
    out = [
        sample,
        "steady state: the second and later steps, with optimizer states alive and gradients set to None by zero_grad",
        stack_summary(r),
        f"attention: {r.attn_implementation}, which runs the {r.attention_kernel} kernel (unpadded batches on an "
        "Ampere or newer GPU)",
        f"weights stored in {r.weight_dtype}, compute in {r.compute_dtype}"
        + (" under autocast" if r.autocast else ""),
    ]
    if plan.gradient_accumulation_steps > 1:
        out.append(f"gradient accumulation over {plan.gradient_accumulation_steps} micro-batches: every one after the "
                   "first runs with the earlier ones' gradients alive (added to in place), counted in its forward and "
                   "backward")
    if plan.num_nodes > 1:
        out.append(f"{plan.sharding} over {plan.gpus_words()}; the figures are per GPU, host memory per node")
    elif plan.num_gpus > 1:
        out.append(f"{plan.sharding} over {plan.num_gpus} GPUs; the figures are per GPU")
    if plan.trainer != "sft":
        from . import trainer_memory

        out.extend(trainer_memory.assumptions(plan))
    if r.images is not None:
        from .vision_memory import tower_assumption

        out.append(tower_assumption(r))
    return out
