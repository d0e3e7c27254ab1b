"""The cost model of suggest_cheaper_config: what a change costs the user, and how costs rank.

Three tiers, in this order: changes that leave the training mathematics unchanged (checkpointing, the
chunked loss, accumulation instead of batch, paged or 8-bit optimizer states, offload), changes that
alter what is learned (shorter context, lower rank, fewer targets, a quantized base), and more
hardware. Within a tier, a documented quality penalty, then the slowdown the throughput model gives.
``docs/search.md`` explains every weight.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

from .knobs import current_targets
from .models import ResolvedModel
from .plan import PLAN_FIELDS, TrainingPlan
from .throughput import Throughput, throughput


Tier = Literal["same_math", "changes_learning", "more_hardware"]
TIER_NAMES: tuple[str, ...] = ("same_math", "changes_learning", "more_hardware")
# The kinds of choice a user has (the search offers the best of each): the kind of a suggestion is the
# last of these its changes touch, in this order (QLoRA on a shorter context is a shorter_context choice).
Kind = Literal["same_math", "lower_precision", "fewer_trainable", "shorter_context", "cpu_offload", "more_gpus",
               "larger_gpu"]
KINDS: tuple[str, ...] = Kind.__args__  # type: ignore[attr-defined]
KIND_WORDS = {
    "same_math": "same mathematics",
    "lower_precision": "lower precision (4-bit base or 8-bit optimizer states)",
    "fewer_trainable": "fewer trainable parameters",
    "shorter_context": "shorter context",
    "cpu_offload": "CPU offload",
    "more_gpus": "more GPUs",
    "larger_gpu": "a larger GPU",
}

# What a choice costs the user, in one number (Cost.user_cost; lower ranks first): the quality penalty,
# plus these. Ordinal policy like QUALITY_WEIGHTS, not a measurement (docs/search.md, "Ranking").
USER_COST_WEIGHTS = {
    # per doubling of the time per training token over the plan as given (log2 of the ratio; being faster is
    # no credit). 3 makes a 2x slower run dearer than the quality risk of a 4-bit base (2), and a 4x slower one
    # (6) dearer than full -> QLoRA (4) with its own slowdown: a many-times-slower choice never leads a fast one
    "time_per_doubling": 3.0,
    # per doubling of the GPU count: GPUs the user must own or rent, and a multi-GPU launch; dearer than the
    # quality risk of a 4-bit base with its slowdown (2 + 3 x log2 1.39 = 3.4), so QLoRA on the user's own GPU
    # ranks before a second GPU
    "more_gpus_per_doubling": 4.0,
    "larger_gpu": 4.0,  # another GPU to rent or buy: as dear as twice the GPUs
    "cpu_offload": 1.0,  # a DeepSpeed launch, host RAM for the offloaded states, the CPU in the step
}

# Quality penalty of changes that alter what is learned. Ordinal policy, not a measurement: it only
# orders tier-1 suggestions among themselves (docs/search.md explains each weight).
QUALITY_WEIGHTS = {
    "seq_len_per_halving": 2.0,  # lost context: samples are truncated or split
    "lora_r_per_halving": 1.0,  # Hu et al. 2021 (LoRA, table 6): small ranks often suffice
    "fewer_targets": 1.0,  # fewer adapted modules: less capacity (QLoRA paper: all-linear matters)
    "full_to_lora": 2.0,
    "lora_to_qlora": 2.0,  # 4-bit NF4 base: QLoRA reports parity on its benchmarks; a risk, not a certainty
    "effective_batch": 1.0,  # a different number of sequences per optimizer step
    "other": 1.0,
}

# Search floors and grids (bounds that keep the search small; documented in docs/search.md).

COST_MODEL_TEXT = (
    "One suggestion per kind of choice (same mathematics; lower precision: QLoRA or 8-bit optimizer states; "
    "fewer trainable parameters; shorter context; CPU offload; more GPUs; a larger GPU), the best of each, ranked by "
    "user_cost: the quality penalty of learning changes, plus 3 per doubling of the time per training token, "
    "4 per doubling of the GPU count, 4 for a larger GPU, 1 for CPU offload. Slowdowns are approximate (see throughput)."
)


# A plan field's value, as JSON: every TrainingPlan field is one of these (target_modules: a list of names).
PlanValue = bool | int | float | str | list[str] | None


class Change(BaseModel):
    field: str = Field(description="the plan field that changes")
    old: PlanValue = Field(description="its value in the original plan")
    new: PlanValue = Field(description="its value in the suggested plan")


class Cost(BaseModel):
    """What a suggestion costs the user, in words and in numbers."""

    tier: Tier
    tier_rank: int = Field(description="0 same_math, 1 changes_learning, 2 more_hardware")
    kind: Kind = Field("same_math", description="the kind of choice: " + ", ".join(KINDS))
    user_cost: float = Field(0.0, description="what the choice costs the user in one number (quality penalty, slowdown, "
                                              "hardware, offload; USER_COST_WEIGHTS); suggestions rank by it")
    quality_penalty: float = Field(description="ordinal penalty of changes that alter what is learned (0 for none)")
    extra_gpus: int = Field(description="GPUs added to the plan")
    slowdown_fraction: float = Field(
        description="time per training token relative to the original plan, minus 1: 0.33 is about 33% slower, "
                    "negative is faster (approximate, from the throughput model)")
    context_tokens_lost: int = 0
    effective_batch_before: int
    effective_batch_after: int
    summary: str
    details: list[str]

    def sort_key(self) -> tuple:
        return sort_key(self)



def _effective_batch(p: TrainingPlan) -> int:
    return p.batch_size * p.gradient_accumulation_steps * p.num_gpus


def _targets_of(p: TrainingPlan, rm: ResolvedModel) -> set[str]:
    t = current_targets(p, rm)
    return set(t or ())


def cost_of(original: TrainingPlan, plan: TrainingPlan, rm: ResolvedModel,
            base_tp: Throughput | None = None, tp: Throughput | None = None) -> Cost:
    """The cost of going from ``original`` to ``plan`` under the documented cost model."""
    base_tp = base_tp or throughput(original, model=rm)
    tp = tp or throughput(plan, model=rm)
    w = QUALITY_WEIGHTS
    tier = 0
    quality = 0.0
    details: list[str] = []
    changed = [f for f in PLAN_FIELDS if getattr(original, f) != getattr(plan, f)]
    handled = set()
    lost = 0
    # learning changes
    if plan.seq_len < original.seq_len:
        lost = original.seq_len - plan.seq_len
        quality += w["seq_len_per_halving"] * math.log2(original.seq_len / plan.seq_len)
        tier = max(tier, 1)
        details.append(f"{lost} fewer tokens of context ({original.seq_len} -> {plan.seq_len}): longer samples "
                       "are truncated or must be split")
    elif plan.seq_len != original.seq_len:
        quality += w["other"]
        tier = max(tier, 1)
        details.append(f"seq_len {original.seq_len} -> {plan.seq_len}")
    handled.add("seq_len")
    if original.method != plan.method:
        tier = max(tier, 1)
        if original.method == "full" and plan.method == "lora":
            quality += w["full_to_lora"]
            details.append(f"LoRA (r={plan.lora_r}) instead of full fine-tuning: only adapters train, the base "
                           "stays frozen")
        elif original.method == "lora" and plan.method == "qlora":
            quality += w["lora_to_qlora"]
            details.append("4-bit NF4 base (QLoRA): quality risk of quantizing the frozen weights (QLoRA reports "
                           f"parity with 16-bit on its benchmarks, not on every task); about "
                           f"{_pct(tp, base_tp)} in time")
        elif original.method == "full" and plan.method == "qlora":
            quality += w["full_to_lora"] + w["lora_to_qlora"]
            details.append(f"QLoRA (4-bit NF4 base + LoRA r={plan.lora_r}) instead of full fine-tuning: only "
                           "adapters train, and the quality risk of 4-bit quantization")
        else:
            quality += w["other"] * 2
            details.append(f"method {original.method} -> {plan.method}")
    handled |= {"method", "load_in_4bit", "load_in_8bit"}
    if plan.uses_adapters and original.uses_adapters and plan.lora_r != original.lora_r:
        tier = max(tier, 1)
        if plan.lora_r < original.lora_r:
            quality += w["lora_r_per_halving"] * math.log2(original.lora_r / plan.lora_r)
            details.append(f"LoRA rank {original.lora_r} -> {plan.lora_r}: fewer adapter parameters, less capacity")
        else:
            details.append(f"LoRA rank {original.lora_r} -> {plan.lora_r}")
    elif plan.lora_r != original.lora_r:
        details.append(f"lora_r {original.lora_r} -> {plan.lora_r} (no effect without adapters)")
        quality += 0.01  # a pointless change is never free
    handled.add("lora_r")
    if plan.target_modules != original.target_modules:
        before, after = _targets_of(original, rm), _targets_of(plan, rm)
        if plan.uses_adapters and original.uses_adapters:
            tier = max(tier, 1)
            if after < before:
                quality += w["fewer_targets"]
                details.append(f"adapters on {', '.join(sorted(after))} only, not {', '.join(sorted(before))}: "
                               "fewer adapted modules, less capacity")
            else:
                quality += w["other"] if after != before else 0.01
                details.append(f"target_modules {original.target_modules} -> {plan.target_modules}")
        else:
            quality += 0.01
    handled.add("target_modules")
    eb0, eb1 = _effective_batch(original), _effective_batch(plan)
    if eb0 != eb1:
        quality += w["effective_batch"]
        tier = max(tier, 1)
        details.append(f"effective batch {eb0} -> {eb1} sequences per optimizer step (retune the learning rate)")
    elif plan.batch_size != original.batch_size or plan.gradient_accumulation_steps != original.gradient_accumulation_steps:
        details.append(f"micro-batch {original.batch_size} -> {plan.batch_size} per GPU with gradient accumulation "
                       f"{original.gradient_accumulation_steps} -> {plan.gradient_accumulation_steps}"
                       + (f" on {plan.num_gpus} GPUs" if plan.num_gpus != original.num_gpus else "")
                       + f": same effective batch of {eb1} sequences")
    handled |= {"batch_size", "gradient_accumulation_steps"}
    # hardware
    extra = plan.num_gpus - original.num_gpus
    if extra:
        tier = 2
        details.append(f"{extra} more GPU{'s' if extra != 1 else ''} ({original.num_gpus} -> {plan.num_gpus} x "
                       f"{tp.gpu}) with {plan.sharding}")
    handled |= {"num_gpus"}
    larger = plan.gpu != original.gpu or plan.gpu_vram_gb != original.gpu_vram_gb
    if larger:
        tier = 2
        was = original.gpu or f"{original.gpu_vram_gb:g} GB GPU"
        details.append(f"a larger GPU: {plan.gpu or f'{plan.gpu_vram_gb:g} GB GPU'} instead of the {was}")
    handled |= {"gpu", "gpu_vram_gb"}
    # same-math changes
    if plan.gradient_checkpointing != original.gradient_checkpointing:
        details.append("gradient checkpointing: recompute each block in backward instead of keeping its "
                       "activations" if plan.gradient_checkpointing else "gradient checkpointing off")
    if plan.effective_loss_implementation != original.effective_loss_implementation:
        details.append(f"loss {original.effective_loss_implementation} -> {plan.effective_loss_implementation}: the same loss, "
                       "scored in tiles without the full fp32 logits"
                       + ("" if original.framework == "trl" else
                          f" (TRL's SFTTrainer does this; with {original.stack.title} it needs a fused/chunked "
                          "cross-entropy such as TRL's or Liger's)"))
    if plan.effective_kbit_preparation != original.effective_kbit_preparation:
        details.append("skip prepare_model_for_kbit_training: embeddings, norms and lm_head stay in "
                       f"{plan.dtype} instead of fp32, so the residual stream is {plan.dtype} (what TRL's "
                       "SFTTrainer does; PEFT's docs call the fp32 upcast a stability aid)")
    if plan.framework != original.framework:
        details.append(f"train with {plan.stack.title} instead of {original.stack.title}")
    if plan.attn_implementation != original.attn_implementation:
        details.append(f"attention {original.attn_implementation or 'default'} -> {plan.attn_implementation}: the same attention, "
                       "a memory-efficient kernel")
    if plan.optim != original.optim:
        word = {"adamw_bnb_8bit": "8-bit AdamW states (bitsandbytes block-wise; matched 32-bit Adam in Dettmers "
                                  "et al. 2022)",
                "paged_adamw_8bit": "paged 8-bit AdamW states (block-wise 8-bit, evictable to CPU under pressure)",
                "paged_adamw_32bit": "paged 32-bit AdamW states (evictable to CPU under pressure)"}.get(plan.optim)
        details.append(f"optimizer {original.optim} -> {plan.optim}" + (f": {word}" if word else ""))
    if plan.offload_optimizer != original.offload_optimizer or plan.offload_params != original.offload_params:
        what = []
        if plan.offload_optimizer and not original.offload_optimizer:
            what.append("optimizer states")
        if plan.offload_params and not original.offload_params:
            what.append("parameters")
        details.append(f"CPU offload of {' and '.join(what) or 'nothing'} ({plan.sharding})")
    elif plan.sharding != original.sharding and not extra:
        details.append(f"sharding {original.sharding} -> {plan.sharding}")
    if original.use_dora and not plan.use_dora:
        tier = max(tier, 1)
        quality += w["other"]
        details.append("plain LoRA instead of DoRA: no magnitude vectors, no per-step weight norms")
    if original.modules_to_save and plan.modules_to_save != original.modules_to_save:
        tier = max(tier, 1)
        quality += w["other"]
        details.append(f"{', '.join(original.modules_to_save)} frozen instead of trained in full "
                       "(modules_to_save dropped)")
    handled |= {"use_dora", "modules_to_save", "prepare_model_for_kbit_training", "framework"}
    handled |= {"gradient_checkpointing", "loss_implementation", "attn_implementation", "optim",
                "offload_optimizer", "offload_params", "sharding"}
    for f in changed:
        if f not in handled:
            quality += w["other"]
            tier = max(tier, 1)
            details.append(f"{f} {getattr(original, f)!r} -> {getattr(plan, f)!r}")
    slow = tp.seconds_per_million_tokens / base_tp.seconds_per_million_tokens - 1.0
    summary = _summary(tier, quality, extra, slow, lost)
    kind = kind_of(original, plan, rm)
    return Cost(tier=TIER_NAMES[tier], tier_rank=tier, kind=kind,
                user_cost=round(user_cost(kind, quality, slow, original.num_gpus, plan.num_gpus), 4),
                quality_penalty=round(quality, 4), extra_gpus=extra,
                slowdown_fraction=round(slow, 4), context_tokens_lost=lost, effective_batch_before=eb0,
                effective_batch_after=eb1, summary=summary, details=details)


def kind_of(original: TrainingPlan, plan: TrainingPlan, rm: ResolvedModel) -> str:
    """The kind of choice ``plan`` is (KINDS): the last kind in KINDS order that its changes touch."""
    if plan.gpu != original.gpu or plan.gpu_vram_gb != original.gpu_vram_gb:
        return "larger_gpu"
    if plan.num_gpus > original.num_gpus:
        return "more_gpus"
    if (plan.offload_optimizer and not original.offload_optimizer) or (plan.offload_params and not original.offload_params):
        return "cpu_offload"
    if plan.seq_len < original.seq_len:
        return "shorter_context"
    fewer = ((original.method == "full" and plan.method != "full")
             or (plan.uses_adapters and original.uses_adapters and plan.lora_r < original.lora_r)
             or (plan.uses_adapters and original.uses_adapters and _targets_of(plan, rm) < _targets_of(original, rm))
             or (original.use_dora and not plan.use_dora) or (original.modules_to_save and not plan.modules_to_save))
    if fewer:
        return "fewer_trainable"
    if (plan.quantized_4bit and not original.quantized_4bit) or (plan.load_in_8bit and not original.load_in_8bit) \
            or (plan.optim != original.optim and plan.optim in ("adamw_bnb_8bit", "paged_adamw_8bit")):
        return "lower_precision"
    return "same_math"


def user_cost(kind: str, quality: float, slowdown: float, gpus_before: int, gpus_after: int) -> float:
    """The one-number cost of a choice: quality penalty + slowdown + hardware + offload (USER_COST_WEIGHTS)."""
    w = USER_COST_WEIGHTS
    cost = quality + w["time_per_doubling"] * max(0.0, math.log2(max(1.0 + slowdown, 1e-9)))
    if gpus_after > gpus_before:
        cost += w["more_gpus_per_doubling"] * math.log2(gpus_after / gpus_before)
    if kind == "larger_gpu":
        cost += w["larger_gpu"]
    if kind == "cpu_offload":
        cost += w["cpu_offload"]
    return cost


def _pct(tp: Throughput, base: Throughput) -> str:
    s = tp.seconds_per_million_tokens / base.seconds_per_million_tokens - 1.0
    return f"{abs(s):.0%} {'slower' if s >= 0 else 'faster'}"


def _summary(tier: int, quality: float, extra: int, slow: float, lost: int) -> str:
    speed = ("about the same speed" if abs(slow) < 0.005 else
             f"about {abs(slow):.0%} {'slower' if slow > 0 else 'faster'} per training token (approximate)")
    if tier == 0:
        return f"same training mathematics; {speed}"
    if tier == 1:
        extra_words = f", {lost} fewer tokens of context" if lost else ""
        return f"changes what is learned (quality penalty {quality:.3g}{extra_words}); {speed}"
    if extra <= 0:
        return "a larger GPU" + (f", quality penalty {quality:.3g}" if quality else "") + f"; {speed}"
    return f"{extra} more GPU{'s' if extra != 1 else ''}" + (
        f", quality penalty {quality:.3g}" if quality else "") + f"; {speed}"


def sort_key(c: Cost) -> tuple:
    """The ranking: the user cost (quality, time, hardware, offload in one number), then tier, then slowdown."""
    return (round(c.user_cost, 3), c.tier_rank, round(c.slowdown_fraction, 3))

