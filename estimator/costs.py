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
    "Suggestions are ranked by tier, then within the tier: same_math (checkpointing, chunked loss, "
    "attention kernel, micro-batch with gradient accumulation, 8-bit/paged optimizer, CPU offload) by "
    "slowdown; changes_learning (shorter context, lower LoRA rank, fewer targets, full->LoRA->QLoRA) by "
    "quality penalty then slowdown; more_hardware (more GPUs with DDP/ZeRO/FSDP) by GPUs added, then "
    "quality penalty, then slowdown. Slowdowns are approximate (see throughput)."
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
    return Cost(tier=TIER_NAMES[tier], tier_rank=tier, quality_penalty=round(quality, 4), extra_gpus=extra,
                slowdown_fraction=round(slow, 4), context_tokens_lost=lost, effective_batch_before=eb0,
                effective_batch_after=eb1, summary=summary, details=details)


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
        return f"changes what is learned (quality penalty {quality:g}{extra_words}); {speed}"
    return f"{extra} more GPU{'s' if extra != 1 else ''}" + (
        f", quality penalty {quality:g}" if quality else "") + f"; {speed}"


def sort_key(c: Cost) -> tuple:
    """The ranking: tier, then (tier 1) quality or (tier 2) GPUs added and quality, then slowdown."""
    if c.tier_rank == 2:
        primary, secondary = c.extra_gpus, c.quality_penalty
    else:
        primary, secondary = c.quality_penalty, 0
    return (c.tier_rank, round(primary, 4), round(secondary, 4), round(c.slowdown_fraction, 3))

