"""The knobs suggest_cheaper_config turns, each with its levels from mild to strong.

Each knob belongs to a cost tier (:mod:`canifinetune.estimator.costs`) and lists the field changes of
its levels; the search (:mod:`canifinetune.estimator.search`) tries the mildest level that fits first.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model_sources import ResolvedModel
from .moe_adapters import PEFT_EXPERT_TARGETS
from .plan import ACTIVATION_OFFLOADING_FRAMEWORKS, MAX_NUM_GPUS, PARAM_OFFLOAD_SHARDINGS, TrainingPlan
from .spec import PEFT_DEFAULT_TARGETS, ModelSpec
from .trainers import TRAINER_DEFAULTS

SEQ_LEN_FLOOR = 256
SEQ_LEN_GRID = 128
LORA_R_FLOOR = 4
GPU_COUNTS = (2, 4, 8, 16, 32, 64)
NUM_GENERATIONS_FLOOR = 2  # GRPO compares the completions of a group: two at least
COMPLETION_LEN_FLOOR = 128
COMPLETION_LEN_GRID = 128
VLLM_UTILIZATION_STEP = 0.05
VLLM_UTILIZATION_FLOOR = 0.1
MULTI_GPU_SHARDINGS = ("ddp", "zero2", "zero3", "fsdp_full_shard")


@dataclass
class Knob:
    name: str
    tier: int
    levels: list[dict]  # mild -> strong; each a dict of field changes
    monotone: bool = False  # memory falls monotonically along levels: bisect
    forced: bool = False  # a move the search holds fixed while it minimizes the rest (a QLoRA option, issue 21)


def divisors_below(n: int) -> list[int]:
    return [d for d in range(n - 1, 0, -1) if n % d == 0]


def current_targets(plan: TrainingPlan, rm: ResolvedModel) -> tuple[str, ...] | None:
    names = rm.spec.linear_names()
    if plan.target_modules is None:
        default = PEFT_DEFAULT_TARGETS.get(rm.spec.model_type)
        return tuple(n for n in default if n in names) if default else None
    if plan.target_modules == "all-linear":
        return names
    return tuple(n for n in plan.target_modules if n in names)


def trainer_setting(plan: TrainingPlan, name: str):
    """A trainer field: the plan's value, or the trainer's TRL 1.16 default (estimator/trainers.py)."""
    value = getattr(plan, name)
    return value if value is not None else TRAINER_DEFAULTS.get(plan.trainer, {}).get(name)


def vllm_colocated(plan: TrainingPlan) -> bool:
    return (plan.trainer == "grpo" and bool(trainer_setting(plan, "use_vllm"))
            and trainer_setting(plan, "vllm_mode") == "colocate")


def _trainer_knobs(p: TrainingPlan) -> list[Knob]:
    """The knobs of the trainers beyond SFT (docs/search.md): tier 0 the reference model and vLLM's share of the GPU,
    tier 1 GRPO's group size and completion length, tier 2 vLLM on its own GPU."""
    knobs: list[Knob] = []
    t = p.trainer
    if t in ("dpo", "kto") and not trainer_setting(p, "precompute_ref_log_probs"):
        # a pre-pass over the data computes the reference log-probabilities; the step then holds no reference
        knobs.append(Knob("precompute_ref_log_probs", 0, [{"precompute_ref_log_probs": True}]))
    if t in ("dpo", "kto", "grpo") and p.uses_adapters and p.reference_model == "copy":
        knobs.append(Knob("reference_model", 0, [{"reference_model": "adapter_disabled"}]))
    if vllm_colocated(p):
        u = float(trainer_setting(p, "vllm_gpu_memory_utilization"))
        levels, k = [], 1
        while round(u - k * VLLM_UTILIZATION_STEP, 2) >= VLLM_UTILIZATION_FLOOR:
            levels.append({"vllm_gpu_memory_utilization": round(u - k * VLLM_UTILIZATION_STEP, 2)})
            k += 1
        if levels:
            knobs.append(Knob("vllm_gpu_memory_utilization", 0, levels, monotone=True))
    if t == "grpo":
        n0 = n = int(trainer_setting(p, "num_generations"))
        levels = []
        while n // 2 >= NUM_GENERATIONS_FLOOR:
            n //= 2
            level: dict = {"num_generations": n}
            gbs = p.generation_batch_size
            if gbs is not None:
                # the generation batch counts completions: the same prompts per round, fewer completions each (what
                # saves memory; TRL's default batch, batch_size x GPUs x steps_per_generation, does not follow it)
                smaller = gbs * n // n0
                if smaller * n0 != gbs * n or smaller % (p.batch_size * p.num_gpus):
                    break
                level["generation_batch_size"] = smaller
            levels.append(level)
        if levels:
            knobs.append(Knob("num_generations", 1, levels, monotone=True))
        length = int(trainer_setting(p, "max_completion_length"))
        if length > COMPLETION_LEN_FLOOR:
            # seq_len is GRPO's prompt plus completion: the prompt keeps its share, seq_len falls with the completion
            top = (length - 1) // COMPLETION_LEN_GRID * COMPLETION_LEN_GRID
            values = list(range(top, COMPLETION_LEN_FLOOR - 1, -COMPLETION_LEN_GRID)) or [COMPLETION_LEN_FLOOR]
            levels = [{"max_completion_length": v, "seq_len": p.seq_len - (length - v)}
                      for v in values if p.seq_len - (length - v) >= 1]
            knobs.append(Knob("max_completion_length", 1, levels, monotone=True))
    return knobs


def build_knobs(plan: TrainingPlan, rm: ResolvedModel, keep: set[str]) -> list[Knob]:
    """Every knob the search may turn for ``plan``, in cost order, with pinned fields left out."""
    p = plan
    same_mathematics = (_checkpointing_knob(p), _loss_knob(p), _kbit_knob(p), _attention_knob(p), _batch_knob(p),
                        _optim_knob(p), _activation_offload_knob(p), _offload_knob(p))  # tier 0
    changes_learning = (_seq_len_knob(p), _image_pixels_knob(p, rm.spec), _image_tiles_knob(p, rm.spec),
                        _images_per_sample_knob(p),
                        _vision_tower_knob(p), _lora_r_knob(p), _targets_knob(p, rm), _method_knob(p, rm),
                        _peft_extras_knob(p))  # tier 1
    knobs = [k for k in (*same_mathematics, *changes_learning) if k is not None]
    trainer_knobs = _trainer_knobs(p)
    knobs[:0] = [k for k in trainer_knobs if k.tier == 0]  # same mathematics: first in cost order
    at = max((i for i, k in enumerate(knobs) if k.tier <= 1), default=-1) + 1
    knobs[at:at] = [k for k in trainer_knobs if k.tier == 1]
    hardware = _gpu_count_knob(p, keep)  # tier 2: more hardware
    if hardware is not None:
        knobs.append(hardware)
    # more hardware: vLLM on its own GPU (`trl vllm-serve`), the training GPU keeps no reservation
    if vllm_colocated(p):
        knobs.append(Knob("vllm_mode", 2, [{"vllm_mode": "server"}]))
    # pins: a level that touches a pinned field is not allowed
    out = []
    for k in knobs:
        k.levels = [lv for lv in k.levels if not (set(lv) & keep) and any(getattr(p, f) != v for f, v in lv.items())]
        if k.levels:
            out.append(k)
    return out


def _checkpointing_knob(p: TrainingPlan) -> Knob | None:
    return None if p.gradient_checkpointing else Knob("gradient_checkpointing", 0, [{"gradient_checkpointing": True}])


def _loss_knob(p: TrainingPlan) -> Knob | None:
    if p.effective_loss_implementation != "standard":
        return None
    return Knob("loss_implementation", 0, [{"loss_implementation": "chunked"}])


def _kbit_knob(p: TrainingPlan) -> Knob | None:
    # the stack's own settings, each a costed change (estimator/costs.py says what it means for the user's trainer)
    if not p.effective_kbit_preparation:
        return None
    return Knob("prepare_model_for_kbit_training", 0, [{"prepare_model_for_kbit_training": False}])


def _attention_knob(p: TrainingPlan) -> Knob | None:
    attn = []
    if p.attn_implementation == "eager":
        attn.append({"attn_implementation": "sdpa"})
    if p.attn_implementation != "flash_attention_2" and p.dtype != "fp32":
        attn.append({"attn_implementation": "flash_attention_2"})
    return Knob("attn_implementation", 0, attn) if attn else None


# The smallest micro-batch a trainer trains: TRL 1.16's KTOTrainer refuses one row (its KL term pairs the rows of a
# micro-batch; recipes/trainers.trainer_problems says so to the user)
MIN_MICRO_BATCH = {"kto": 2}


def _batch_knob(p: TrainingPlan) -> Knob | None:
    """A smaller micro-batch with more accumulation steps: the same effective batch."""
    least = MIN_MICRO_BATCH.get(p.trainer, 1)
    if p.batch_size <= least:
        return None
    levels = [{"batch_size": d, "gradient_accumulation_steps": p.gradient_accumulation_steps * (p.batch_size // d)}
              for d in divisors_below(p.batch_size)
              if d >= least and p.gradient_accumulation_steps * (p.batch_size // d) <= 65536]
    if not levels:
        return None
    return Knob("batch_size", 0, levels, monotone=True)


def _optim_knob(p: TrainingPlan) -> Knob | None:
    if p.optim in ("adamw_torch_fused", "adamw_torch"):
        return Knob("optim", 0, [{"optim": "adamw_bnb_8bit"}, {"optim": "paged_adamw_8bit"}])
    if p.optim == "paged_adamw_32bit":
        return Knob("optim", 0, [{"optim": "paged_adamw_8bit"}])
    return None


def _activation_offload_knob(p: TrainingPlan) -> Knob | None:
    """Activation offloading with checkpointing: each checkpointed block's input moved to pinned host memory in
    forward and brought back in backward (TRL 1.16's and torchtune 0.6.1's OffloadActivations). Offered where it is
    estimated: SFT with TRL or torchtune on one GPU; the plan refuses the rest (plan.py), which the search skips."""
    if p.activation_offloading or p.framework not in ACTIVATION_OFFLOADING_FRAMEWORKS or p.trainer != "sft":
        return None
    return Knob("activation_offloading", 0, [{"activation_offloading": True, "gradient_checkpointing": True}])


def _offload_knob(p: TrainingPlan) -> Knob | None:
    """CPU offload of the optimizer (and the parameters), under the DeepSpeed/FSDP stage that can do it."""
    off: list[dict] = []
    if p.sharding in ("none", "ddp"):
        if not p.offload_optimizer:
            off.append({"sharding": "zero2", "offload_optimizer": True})
        off.append({"sharding": "zero3", "offload_optimizer": True, "offload_params": True})
    elif p.sharding in PARAM_OFFLOAD_SHARDINGS:  # zero3, zero3_hpz, fsdp_full_shard, fsdp_hybrid_shard
        if not p.offload_optimizer:
            off.append({"offload_optimizer": True})
        if not p.offload_params:
            off.append({"offload_optimizer": True, "offload_params": True})
    else:  # zero1, zero2, fsdp_shard_grad_op
        if not p.offload_optimizer:
            off.append({"offload_optimizer": True})
        off.append({"sharding": "zero3", "offload_optimizer": True, "offload_params": True})
    return Knob("cpu_offload", 0, off) if off else None


def _seq_len_knob(p: TrainingPlan) -> Knob | None:
    if p.seq_len <= SEQ_LEN_FLOOR:
        return None
    top = (p.seq_len - 1) // SEQ_LEN_GRID * SEQ_LEN_GRID
    values = list(range(top, SEQ_LEN_FLOOR - 1, -SEQ_LEN_GRID)) or [SEQ_LEN_FLOOR]
    return Knob("seq_len", 1, [{"seq_len": v} for v in values], monotone=True)


# max_pixels levels for a Qwen-VL model's images, in image tokens (28 x 28 pixels each on Qwen2.5-VL, 32 x 32 on
# Qwen3-VL): 1280, 768, 512, 256 and 128 tokens
IMAGE_TOKEN_LEVELS = (1280, 768, 512, 256, 128)


def _image_pixels_knob(p: TrainingPlan, spec: ModelSpec) -> Knob | None:
    """A VLM's images downscaled by the processor's max_pixels, to each of IMAGE_TOKEN_LEVELS below what the images
    take now (and not below min_pixels)."""
    size = p.image_width_height
    if size is None or spec.vision is None:
        return None
    from .vision_images import has_pixel_bounds, pixel_bounds, pixels_per_image_token

    if not has_pixel_bounds(spec):
        return None  # other processors resize to a fixed size: no pixel knob

    floor, ceiling = pixel_bounds(p, spec)
    now, per_token = min(size[0] * size[1], ceiling), pixels_per_image_token(spec)
    values = [n * per_token for n in IMAGE_TOKEN_LEVELS if floor <= n * per_token < now]
    return Knob("max_pixels", 1, [{"max_pixels": v} for v in values], monotone=True) if values else None


def _image_tiles_knob(p: TrainingPlan, spec: ModelSpec) -> Knob | None:
    """An Idefics3/SmolVLM plan's images cut into fewer tiles: the processor's longest edge lowered a tile at a time
    (size={"longest_edge": k x the tower's image size}, from one tile under the plan's down to two tiles), then
    do_image_splitting off (the global image alone: one tile's tokens instead of up to 17). Memory falls along the
    levels: a shorter longest edge never rounds up to more tiles."""
    if p.image_size is None or spec.vision is None:
        return None
    from .vision_images import IMAGE_SPLITTING_TYPES, longest_edge, splitting, tile_side

    if spec.vision.model_type not in IMAGE_SPLITTING_TYPES or not splitting(p):
        return None
    tile = tile_side(p, spec)
    now = longest_edge(p, spec)
    edges = [k * tile for k in range((now - 1) // tile, 1, -1)]
    return Knob("image_tiles", 1, [*({"longest_edge": e} for e in edges), {"do_image_splitting": False}],
                monotone=True)


def _vision_tower_knob(p: TrainingPlan) -> Knob | None:
    """A VLM's vision tower frozen instead of adapted or trained (its adapters or its gradients and optimizer
    states, and the tower's graph, go)."""
    return Knob("vision_tower", 1, [{"vision_tower": "frozen"}]) if p.vision_tower != "frozen" else None


def _images_per_sample_knob(p: TrainingPlan) -> Knob | None:
    """Fewer images in each sample of a VLM: halvings down to one."""
    if p.image_size is None or p.images_per_sample <= 1:
        return None
    values, count = [], p.images_per_sample
    while count > 1:
        count //= 2
        values.append(max(count, 1))
    return Knob("images_per_sample", 1, [{"images_per_sample": v} for v in values], monotone=True)


def _lora_r_knob(p: TrainingPlan) -> Knob | None:
    """The LoRA rank halved down to the floor."""
    if not (p.uses_adapters and p.lora_r > LORA_R_FLOOR):
        return None
    values, rank = [], p.lora_r
    while rank // 2 >= LORA_R_FLOOR:
        rank //= 2
        values.append(rank)
    if (values[-1] if values else p.lora_r) > LORA_R_FLOOR:
        values.append(LORA_R_FLOOR)
    return Knob("lora_r", 1, [{"lora_r": v} for v in values], monotone=True)


def _targets_knob(p: TrainingPlan, rm: ResolvedModel) -> Knob | None:
    """Fewer adapted modules: the attention projections, then PEFT's default (or the first projection)."""
    if not p.uses_adapters:
        return None
    current = current_targets(p, rm)
    if not current:
        return None
    attn_names = tuple(lin.name for lin in rm.spec.attention_linears())
    default = PEFT_DEFAULT_TARGETS.get(rm.spec.model_type)
    smallest = tuple(n for n in (default or attn_names[:1]) if n in rm.spec.linear_names())
    levels: list[dict] = []
    for cand in (attn_names, smallest):
        cset = set(cand)
        if cand and cset < set(current) and not any(set(lv["target_modules"]) == cset for lv in levels):
            levels.append({"target_modules": sorted(cset)})
    return Knob("target_modules", 1, levels) if levels else None


def _method_knob(p: TrainingPlan, rm: ResolvedModel) -> Knob | None:
    """full -> lora -> qlora (with the targets a family without PEFT defaults needs)."""
    needs_targets = (p.target_modules is None and PEFT_DEFAULT_TARGETS.get(rm.spec.model_type) is None)
    extra_targets: dict = {"target_modules": "all-linear"} if needs_targets else {}
    if needs_targets and p.lora_dropout > 0 and rm.spec.moe is not None and rm.spec.model_type in PEFT_EXPERT_TARGETS:
        # all-linear would put PEFT's expert adapters on the fused experts, which refuse dropout
        # (estimator/moe_adapters.py): propose the attention projections instead
        extra_targets = {"target_modules": sorted(lin.name for lin in rm.spec.attention_linears())}
    to_qlora: dict = {"method": "qlora"}
    if p.load_in_8bit:
        to_qlora["load_in_8bit"] = False
    if p.load_in_4bit is False:
        to_qlora["load_in_4bit"] = None
    if p.method == "full":
        # fp32 master weights (precision mixed, chosen for full fine-tuning on a GPU without bf16) would keep a
        # frozen base in fp32 under adapters: a move to adapters goes with the adapters' own precision, pure
        pure = {"precision": "pure"} if p.precision == "mixed" else {}
        return Knob("method", 1, [{"method": "lora", **extra_targets, **pure}, {**to_qlora, **extra_targets, **pure}])
    if p.method == "lora":
        return Knob("method", 1, [to_qlora])
    return None


def _peft_extras_knob(p: TrainingPlan) -> Knob | None:
    extras: list[dict] = []
    if p.use_dora:
        extras.append({"use_dora": False})
    if p.modules_to_save:
        extras.append({**({"use_dora": False} if p.use_dora else {}), "modules_to_save": None})
    return Knob("peft_extras", 1, extras) if extras else None


def _gpu_count_knob(p: TrainingPlan, keep: set[str]) -> Knob | None:
    """More GPUs (with each multi-GPU sharding unless pinned), keeping the effective batch where it divides."""
    hw: list[dict] = []
    shardings = (p.sharding,) if ("sharding" in keep or p.sharding not in ("none", "ddp")) else MULTI_GPU_SHARDINGS
    for n in GPU_COUNTS:
        if n <= p.num_gpus or n > MAX_NUM_GPUS:
            continue
        for s in shardings:
            lv: dict = {"num_gpus": n}
            if s != p.sharding:
                lv["sharding"] = s
            total = p.gradient_accumulation_steps * p.num_gpus
            if total % n == 0 and total // n != p.gradient_accumulation_steps:
                hw.append({**lv, "gradient_accumulation_steps": total // n})  # keeps the effective batch
            hw.append(lv)
    return Knob("num_gpus", 2, hw) if hw else None


# ------------------------------------------------------------------ evaluation

