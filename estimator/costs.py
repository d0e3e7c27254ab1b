"""The cost model of suggest_cheaper_config: what a change costs the user, and how costs rank.

Each change has a tier (what happens to the mathematics: unchanged, learning changed, more hardware), a
kind (the user's choice: KINDS), a quality penalty (QUALITY_WEIGHTS), the GPUs added and the slowdown
the throughput model gives; suggestions rank by ``user_cost``, which adds them up (USER_COST_WEIGHTS).
``docs/search.md`` explains every weight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, Field

from . import catalog
from .dataset_lengths import token_lengths, tokens_kept
from .knobs import current_targets
from .model_sources import ResolvedModel
from .plan import PLAN_FIELDS, TrainingPlan
from .throughput import Throughput, throughput

Tier = Literal["same_math", "changes_learning", "more_hardware"]
TIER_NAMES: tuple[str, ...] = ("same_math", "changes_learning", "more_hardware")
# The kinds of choice a user has (the search offers the best of each): the kind of a suggestion is the
# last of these its changes touch, in this order (QLoRA on a shorter context is a shorter_context choice).
Kind = Literal["same_math", "lower_precision", "fewer_trainable", "shorter_context", "fewer_image_tokens",
               "fewer_generations", "cpu_offload", "more_gpus", "larger_gpu"]
KINDS: tuple[str, ...] = Kind.__args__  # type: ignore[attr-defined]
KIND_WORDS = {
    "same_math": "same mathematics",
    "lower_precision": "lower precision (4-bit base or 8-bit optimizer states)",
    "fewer_trainable": "fewer trainable parameters",
    "shorter_context": "shorter context (or GRPO completions)",
    "fewer_image_tokens": "fewer image tokens (a lower max_pixels, no image splitting, fewer images a sample)",
    "fewer_generations": "fewer GRPO generations per prompt",
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
    # quality risk of a 4-bit base with its slowdown (1 + 3 x log2 of at most ~1.35), so QLoRA on the user's own GPU
    # ranks before a second GPU
    "more_gpus_per_doubling": 4.0,
    "larger_gpu": 4.0,  # another GPU to rent or buy: as dear as twice the GPUs
    # a DeepSpeed launch, host RAM for the offloaded states, the CPU in the step; for activation offloading, pinned
    # host RAM and PCIe traffic each micro-step (its exposed time is priced by the throughput model)
    "cpu_offload": 1.0,
    # offload when the plan does not say how much host RAM the machine has: per doubling of the need over 32 GiB (a
    # common workstation), so a 131 GiB offload ranks after an option of similar cost that needs no host RAM
    "host_ram_unknown_per_doubling": 1.0,
    # a fitting plan near the GPU's limit: per 15 points of usable memory above 80%, so an option at 80% beats one at
    # 94% of similar cost (the seeds' guide: never run at the boundary; budgets above 95% are "tight" and not offered)
    "fullness_per_15_points": 1.5,
}
HOST_RAM_UNKNOWN_REFERENCE_GIB = 32.0  # the host RAM an unknown machine is assumed to have for pricing offload
FULLNESS_FREE_BELOW = 0.80  # up to this share of usable memory a suggestion pays nothing for fullness

# Quality penalty of changes that alter what is learned. Ordinal policy, not a measurement: it only
# orders tier-1 suggestions among themselves (docs/search.md explains each weight).
QUALITY_WEIGHTS = {
    "seq_len_per_halving": 2.0,  # lost context: samples are truncated or split
    "lora_r_per_halving": 1.0,  # Hu et al. 2021 (LoRA, table 6): small ranks often suffice
    "fewer_targets": 1.0,  # fewer adapted modules: less capacity (QLoRA paper: all-linear matters)
    # LoRA trains a low-rank update of a frozen base: Biderman et al. 2024 ("LoRA Learns Less and Forgets Less",
    # TMLR) find it behind full fine-tuning on code and maths, close on instruction following
    "full_to_lora": 2.0,
    # a 4-bit NF4 base with double quantization matched 16-bit LoRA and full 16-bit fine-tuning on MMLU and the Vicuna
    # benchmarks from 7B to 65B (Dettmers et al. 2023, QLoRA, sec. 4 and table 3): a risk on other tasks, small
    "lora_to_qlora": 1.0,
    "lora_to_qlora_fp4": 2.0,  # FP4 instead of NF4 lagged NF4 by about a point of MMLU in the same table
    # LLM.int8 -> NF4: both frozen bases matched 16-bit in the QLoRA paper's comparison (table 3); smaller than any
    # change of method
    "int8_to_4bit": 0.5,
    "effective_batch": 1.0,  # a different number of sequences per optimizer step
    # GRPO's group size: the advantage of a completion is its reward against its group's mean (Shao et al. 2024,
    # DeepSeekMath, sec. 4.1: 64 per prompt; TRL's default 8); fewer samples make that baseline noisier
    "num_generations_per_halving": 1.5,
    # GRPO completions cut at max_completion_length: answers that need more are clipped (as seq_len's halving)
    "completion_len_per_halving": 2.0,
    # a VLM's images downscaled (a lower max_pixels): visual detail is lost, as context is for text
    "image_tokens_per_halving": 2.0,
    # fewer images a sample: whole images are lost and a multi-image task (compare, before/after) changes; dearer
    # than a downscale, which practitioners try first for Qwen-VL (its processor's max_pixels)
    "images_per_sample_per_halving": 3.0,
    # the vision tower frozen instead of adapted: the default of most VLM recipes (TRL's, Qwen's), so small; priced
    # as a change of adapted modules is
    "freeze_vision_tower": 1.0,
    "other": 1.0,
}

# Search floors and grids (bounds that keep the search small; documented in docs/search.md).

COST_MODEL_TEXT = (
    "One suggestion per kind of choice (same mathematics; lower precision: QLoRA or 8-bit optimizer states; "
    "fewer trainable parameters; shorter context; fewer GRPO generations; CPU offload; more GPUs; a larger GPU), the "
    "best of each, ranked by "
    "user_cost: the quality penalty of learning changes, plus 3 per doubling of the time per training token, "
    "4 per doubling of the GPU count, 4 for a larger GPU, 1 for CPU offload. "
    "Slowdowns are approximate (see throughput)."
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
    user_cost: float = Field(0.0, description="what the choice costs the user in one number (quality penalty, "
                                              "slowdown, hardware, offload; USER_COST_WEIGHTS); suggestions rank by it")
    room_cost: float = Field(0.0, description="part of user_cost for running near the GPU's limit (above 80%)")
    host_ram_cost: float = Field(0.0, description="part of user_cost for offload needing host RAM the plan does not "
                                                  "give (host_ram_gb unset)")
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


@dataclass
class _Tally:
    """What cost_of adds up while it reads the changes: tier, quality penalty, words, fields it has read."""

    original: TrainingPlan
    plan: TrainingPlan
    tier: int = 0
    quality: float = 0.0
    lost: int = 0
    details: list[str] = field(default_factory=list)
    handled: set[str] = field(default_factory=set)

    def learning(self, penalty: float, words: str | None = None) -> None:
        """A change of what is learned: tier 1 at least, its penalty, its words."""
        self.tier = max(self.tier, 1)
        self.quality += penalty
        if words:
            self.details.append(words)


def cost_of(original: TrainingPlan, plan: TrainingPlan, rm: ResolvedModel,
            base_tp: Throughput | None = None, tp: Throughput | None = None, *,
            used_fraction: float | None = None, host_memory_bytes: int = 0) -> Cost:
    """The cost of going from ``original`` to ``plan`` under the documented cost model; ``used_fraction`` and
    ``host_memory_bytes`` are the suggested plan's estimate (room on the GPU, host RAM for offload)."""
    base_tp = base_tp or throughput(original, model=rm)
    tp = tp or throughput(plan, model=rm)
    t = _Tally(original, plan)
    _context_cost(t)
    _image_cost(t, rm)
    _vision_tower_cost(t)
    _method_cost(t, _pct(tp, base_tp))
    _adapter_cost(t, rm)
    eb0, eb1 = _batch_cost(t)
    extra = _hardware_cost(t, tp.gpu)
    _same_math_words(t, extra)
    _peft_extras_cost(t)
    server_gpus = _trainer_cost(t)
    extra += server_gpus
    for f in PLAN_FIELDS:
        if getattr(original, f) != getattr(plan, f) and f not in t.handled:
            t.learning(QUALITY_WEIGHTS["other"], f"{f} {getattr(original, f)!r} -> {getattr(plan, f)!r}")
    slow = tp.seconds_per_million_tokens / base_tp.seconds_per_million_tokens - 1.0
    kind = kind_of(original, plan, rm)
    room, host = room_cost(used_fraction), host_ram_cost(plan, host_memory_bytes)
    if host:
        t.details.append(f"needs {host_memory_bytes / 2**30:.1f} GiB of host RAM for the offloaded states (the "
                         "machine's host RAM was not given: set host_ram_gb)")
    total = user_cost(kind, t.quality, slow, original.num_gpus, plan.num_gpus + server_gpus) + room + host
    return Cost(tier=TIER_NAMES[t.tier], tier_rank=t.tier, kind=kind,
                user_cost=round(total, 4), room_cost=round(room, 4), host_ram_cost=round(host, 4),
                quality_penalty=round(t.quality, 4), extra_gpus=extra,
                slowdown_fraction=round(slow, 4), context_tokens_lost=t.lost, effective_batch_before=eb0,
                effective_batch_after=eb1, summary=_summary(t.tier, t.quality, extra, slow, t.lost),
                details=t.details)


def _context_cost(t: _Tally) -> None:
    o, p, w = t.original, t.plan, QUALITY_WEIGHTS
    if p.trainer == o.trainer == "grpo":  # seq_len is the prompt plus the completion: the prompt's share is the context
        from .knobs import trainer_setting

        p0 = o.seq_len - int(trainer_setting(o, "max_completion_length"))
        p1 = p.seq_len - int(trainer_setting(p, "max_completion_length"))
        if p1 < p0:
            t.lost = p0 - p1
            t.learning(w["seq_len_per_halving"] * math.log2(p0 / max(p1, 1)),
                       f"{t.lost} fewer prompt tokens ({p0} -> {p1}; seq_len {o.seq_len} -> {p.seq_len}): longer "
                       "prompts must be shortened")
        t.handled.add("seq_len")
        return
    lengths = token_lengths(o.dataset) if p.seq_len < o.seq_len else None
    if lengths:
        _context_cost_from_data(t, lengths)
    elif p.seq_len < o.seq_len:
        t.lost = o.seq_len - p.seq_len
        t.learning(w["seq_len_per_halving"] * math.log2(o.seq_len / p.seq_len),
                   f"{t.lost} fewer tokens of context ({o.seq_len} -> {p.seq_len}): longer samples "
                   "are truncated or must be split")
    elif p.seq_len != o.seq_len:
        t.learning(w["other"], f"seq_len {o.seq_len} -> {p.seq_len}")
    t.handled.add("seq_len")


def _context_cost_from_data(t: _Tally, lengths: tuple[int, ...]) -> None:
    """A context cut priced by the user's data: the same weight per halving, applied to the tokens the data keeps
    (a cut that truncates no sample costs nothing; estimator/dataset_lengths.py)."""
    o, p = t.original, t.plan
    before, after = tokens_kept(lengths, o.seq_len), tokens_kept(lengths, p.seq_len)
    longer = sum(1 for n in lengths if n > p.seq_len)
    t.lost = o.seq_len - p.seq_len
    words = (f"seq_len {o.seq_len} -> {p.seq_len}: {longer} of {len(lengths)} samples of {o.dataset} are longer "
             f"(about {before - after:,} of {before:,} tokens, {1 - after / max(before, 1):.1%}, lost to truncation; "
             "tokens counted as characters / 4)")
    if after >= before:
        t.lost = 0  # no sample is cut: nothing of the data is lost
        t.tier = max(t.tier, 1)
        t.details.append(words.replace(f"{longer} of", "none of", 1) if not longer else words)
        return
    t.learning(QUALITY_WEIGHTS["seq_len_per_halving"] * math.log2(before / after), words)


def _method_cost(t: _Tally, time_words: str) -> None:
    o, p, w = t.original, t.plan, QUALITY_WEIGHTS
    if o.method != p.method:
        if o.method == "full" and p.method == "lora":
            t.learning(w["full_to_lora"], f"LoRA (r={p.lora_r}) instead of full fine-tuning: only adapters train, the "
                                          "base stays frozen")
        elif o.method == "lora" and p.method == "qlora" and o.load_in_8bit:
            t.learning(w["int8_to_4bit"], "4-bit NF4 base instead of 8-bit (load_in_8bit -> load_in_4bit): both "
                                          "matched 16-bit in the QLoRA paper's comparison (Dettmers et al. 2023, "
                                          f"table 3); about {time_words} in time")
        elif o.method == "lora" and p.method == "qlora":
            nf4 = p.bnb_4bit_quant_type == "nf4"
            t.learning(w["lora_to_qlora"] if nf4 else w["lora_to_qlora_fp4"],
                       f"4-bit {p.bnb_4bit_quant_type.upper()} base (QLoRA) instead of 16-bit: NF4 with double "
                       "quantization matched 16-bit LoRA on the QLoRA paper's benchmarks (Dettmers et al. 2023), "
                       f"not proven on every task; about {time_words} in time")
        elif o.method == "full" and p.method == "qlora":
            t.learning(w["full_to_lora"] + w["lora_to_qlora"],
                       f"QLoRA (4-bit NF4 base + LoRA r={p.lora_r}) instead of full fine-tuning: only adapters train, "
                       "and the quality risk of 4-bit quantization")
        else:
            t.learning(w["other"] * 2, f"method {o.method} -> {p.method}")
    t.handled |= {"method", "load_in_4bit", "load_in_8bit"}


def _adapter_cost(t: _Tally, rm: ResolvedModel) -> None:
    """LoRA rank and target modules."""
    o, p, w = t.original, t.plan, QUALITY_WEIGHTS
    if p.uses_adapters and o.uses_adapters and p.lora_r != o.lora_r:
        if p.lora_r < o.lora_r:
            t.learning(w["lora_r_per_halving"] * math.log2(o.lora_r / p.lora_r),
                       f"LoRA rank {o.lora_r} -> {p.lora_r}: fewer adapter parameters, less capacity")
        else:
            t.learning(0.0, f"LoRA rank {o.lora_r} -> {p.lora_r}")
    elif p.lora_r != o.lora_r:
        t.details.append(f"lora_r {o.lora_r} -> {p.lora_r} (no effect without adapters)")
        t.quality += 0.01  # a pointless change is never free
    t.handled.add("lora_r")
    if p.target_modules != o.target_modules:
        before, after = _targets_of(o, rm), _targets_of(p, rm)
        if p.uses_adapters and o.uses_adapters:
            if after < before:
                t.learning(w["fewer_targets"], f"adapters on {', '.join(sorted(after))} only, not "
                                               f"{', '.join(sorted(before))}: fewer adapted modules, less capacity")
            else:
                t.learning(w["other"] if after != before else 0.01,
                           f"target_modules {o.target_modules} -> {p.target_modules}")
        else:
            t.quality += 0.01
    t.handled.add("target_modules")


def _batch_cost(t: _Tally) -> tuple[int, int]:
    """The effective batch before and after; a different one changes what is learned."""
    o, p = t.original, t.plan
    eb0, eb1 = _effective_batch(o), _effective_batch(p)
    if eb0 != eb1:
        t.learning(QUALITY_WEIGHTS["effective_batch"],
                   f"effective batch {eb0} -> {eb1} sequences per optimizer step (retune the learning rate)")
    elif p.batch_size != o.batch_size or p.gradient_accumulation_steps != o.gradient_accumulation_steps:
        t.details.append(f"micro-batch {o.batch_size} -> {p.batch_size} per GPU with gradient accumulation "
                         f"{o.gradient_accumulation_steps} -> {p.gradient_accumulation_steps}"
                         + (f" on {p.num_gpus} GPUs" if p.num_gpus != o.num_gpus else "")
                         + f": same effective batch of {eb1} sequences")
    t.handled |= {"batch_size", "gradient_accumulation_steps"}
    return eb0, eb1


def _hardware_cost(t: _Tally, gpu_name: str) -> int:
    """More GPUs or a larger GPU: tier 2. Returns the GPUs added."""
    o, p = t.original, t.plan
    extra = p.num_gpus - o.num_gpus
    if extra and p.num_nodes > 1:
        t.tier = 2
        t.details.append(f"{extra} more GPU{'s' if extra != 1 else ''}: {p.num_nodes} nodes of {p.node_gpus} x "
                         f"{gpu_name} ({p.num_gpus} GPUs) with {p.sharding}; {_node_words(o, p)}")
    elif extra:
        t.tier = 2
        t.details.append(f"{extra} more GPU{'s' if extra != 1 else ''} ({o.num_gpus} -> {p.num_gpus} x "
                         f"{gpu_name}) with {p.sharding}")
    if p.gpu != o.gpu or p.gpu_vram_gb != o.gpu_vram_gb:
        t.tier = 2
        was = o.gpu or f"{o.gpu_vram_gb:g} GB GPU"
        t.details.append(f"a larger GPU: {p.gpu or f'{p.gpu_vram_gb:g} GB GPU'} instead of the {was}")
    t.handled |= {"num_gpus", "num_nodes", "gpus_per_node", "gpu", "gpu_vram_gb"}
    return extra


def _node_words(o: TrainingPlan, p: TrainingPlan) -> str:
    """What a node is in a multi-node suggestion, and where its size comes from."""
    words = f"a node is one machine of {p.node_gpus} GPUs"
    if o.num_nodes > 1 and o.node_gpus == p.node_gpus:
        return words + ", as in the plan (launch.sh on every node, or slurm.sbatch)"
    card = catalog.find_gpu(p.gpu) if p.gpu else None
    if card is not None and card.max_per_node == p.node_gpus:
        return words + ", the catalog's max_per_node (nothing fits on one; launch.sh on every node, or slurm.sbatch)"
    return words + " (the usual 8-GPU server; nothing fits on one; launch.sh on every node, or slurm.sbatch)"


_OPTIMIZER_WORDS = {
    "adamw_bnb_8bit": "8-bit AdamW states (bitsandbytes block-wise; matched 32-bit Adam in Dettmers et al. 2022)",
    "paged_adamw_8bit": "paged 8-bit AdamW states (block-wise 8-bit, evictable to CPU under pressure)",
    "paged_adamw_32bit": "paged 32-bit AdamW states (evictable to CPU under pressure)",
}


def _same_math_words(t: _Tally, extra: int) -> None:
    """Changes that keep the mathematics: no penalty, only their words."""
    o, p, say = t.original, t.plan, t.details.append
    if p.gradient_checkpointing != o.gradient_checkpointing:
        say("gradient checkpointing: recompute each block in backward instead of keeping its activations"
            if p.gradient_checkpointing else "gradient checkpointing off")
    if p.effective_loss_implementation != o.effective_loss_implementation:
        say(f"loss {o.effective_loss_implementation} -> {p.effective_loss_implementation}: the same loss, "
            "scored in tiles without the full fp32 logits"
            + ("" if o.framework == "trl" else
               f" (TRL's SFTTrainer does this; with {o.stack.title} it needs a fused/chunked "
               "cross-entropy such as TRL's or Liger's)"))
    if p.effective_kbit_preparation != o.effective_kbit_preparation:
        say("skip prepare_model_for_kbit_training: embeddings, norms and lm_head stay in "
            f"{p.dtype} instead of fp32, so the residual stream is {p.dtype} (what TRL's "
            "SFTTrainer does; PEFT's docs call the fp32 upcast a stability aid)")
    if p.framework != o.framework:
        say(f"train with {p.stack.title} instead of {o.stack.title}")
    if p.attn_implementation != o.attn_implementation:
        say(f"attention {o.attn_implementation or 'default'} -> {p.attn_implementation}: the same attention, "
            "a memory-efficient kernel")
    if p.optim != o.optim:
        word = _OPTIMIZER_WORDS.get(p.optim)
        say(f"optimizer {o.optim} -> {p.optim}" + (f": {word}" if word else ""))
    if p.activation_offloading != o.activation_offloading:
        whose = "torchtune's" if p.framework == "torchtune" else "TRL's"
        say(f"activation offloading ({whose} OffloadActivations): each checkpointed block's input is copied to "
            "pinned host RAM in forward and brought back in backward, on a side stream"
            if p.activation_offloading else "activation offloading off")
    if p.offload_optimizer != o.offload_optimizer or p.offload_params != o.offload_params:
        what = (["optimizer states"] if p.offload_optimizer and not o.offload_optimizer else []) + (
            ["parameters"] if p.offload_params and not o.offload_params else [])
        say(f"CPU offload of {' and '.join(what) or 'nothing'} ({p.sharding})")
    elif p.sharding != o.sharding and not extra:
        say(f"sharding {o.sharding} -> {p.sharding}")
    t.handled |= {"prepare_model_for_kbit_training", "framework", "gradient_checkpointing", "activation_offloading",
                  "loss_implementation",
                  "attn_implementation", "optim", "offload_optimizer", "offload_params", "sharding"}


def _peft_extras_cost(t: _Tally) -> None:
    o, p = t.original, t.plan
    if o.use_dora and not p.use_dora:
        t.learning(QUALITY_WEIGHTS["other"],
                   "plain LoRA instead of DoRA: no magnitude vectors, no per-step weight norms")
    if o.modules_to_save and p.modules_to_save != o.modules_to_save:
        t.learning(QUALITY_WEIGHTS["other"], f"{', '.join(o.modules_to_save)} frozen instead of trained in full "
                                             "(modules_to_save dropped)")
    t.handled |= {"use_dora", "modules_to_save"}


def _vllm_server_gpus(original: TrainingPlan, plan: TrainingPlan) -> int:
    """GPUs a change adds for a vLLM server (GRPO colocate -> server: one, TRL's vllm_tensor_parallel_size 1)."""
    from .knobs import trainer_setting

    if plan.trainer != "grpo" or not trainer_setting(plan, "use_vllm"):
        return 0
    was_server = bool(trainer_setting(original, "use_vllm")) and trainer_setting(original, "vllm_mode") == "server"
    return int(trainer_setting(plan, "vllm_mode") == "server" and not was_server)


def _trainer_cost(t: _Tally) -> int:
    """The trainers' knobs (estimator/knobs.py): the reference model and vLLM's share keep the mathematics, GRPO's
    group size and completion length change what is learned, vLLM on its own GPU is more hardware. Returns the
    GPUs a vLLM server adds."""
    from .knobs import trainer_setting

    o, p, w, say = t.original, t.plan, QUALITY_WEIGHTS, t.details.append
    if p.trainer != o.trainer:
        return 0  # another trainer altogether: the generic rule prices it
    if trainer_setting(p, "precompute_ref_log_probs") and not trainer_setting(o, "precompute_ref_log_probs"):
        say("precompute the reference log-probabilities (precompute_ref_log_probs): the same loss; one pass of the "
            "reference over the whole dataset before training (about one forward per sample, once), then no reference "
            "model in the step")
    if p.reference_model != o.reference_model and p.reference_model == "adapter_disabled":
        say("the adapter-disabled base as the reference (reference_model adapter_disabled): the same reference, since "
            "the adapters start from the base, without a second copy of the weights; its forward runs through the "
            "policy with the adapters off")
    u0, u1 = trainer_setting(o, "vllm_gpu_memory_utilization"), trainer_setting(p, "vllm_gpu_memory_utilization")
    if u0 is not None and u1 is not None and u1 != u0:
        say(f"vLLM reserves {u1:.0%} of the GPU instead of {u0:.0%} (vllm_gpu_memory_utilization): the same "
            "mathematics, a smaller KV cache for vLLM, so it generates fewer sequences at once and more slowly"
            + (" (when the model's weights no longer fit in it, vLLM refuses to start)" if u1 < u0 else ""))
    n0, n1 = trainer_setting(o, "num_generations"), trainer_setting(p, "num_generations")
    if n0 and n1 and n1 != n0:
        if n1 < n0:
            t.learning(w["num_generations_per_halving"] * math.log2(n0 / n1),
                       f"GRPO's group {n0} -> {n1} completions per prompt (num_generations): each completion is judged "
                       "against fewer others, a noisier advantage; less to generate and score")
        else:
            t.learning(w["other"], f"num_generations {n0} -> {n1}")
    l0, l1 = trainer_setting(o, "max_completion_length"), trainer_setting(p, "max_completion_length")
    if l0 and l1 and l1 != l0:
        if l1 < l0:
            t.learning(w["completion_len_per_halving"] * math.log2(l0 / l1),
                       f"completions cut at {l1} tokens instead of {l0} (max_completion_length): answers that need "
                       "more are clipped, and a task with long reasoning learns less")
        else:
            t.learning(w["other"], f"max_completion_length {l0} -> {l1}")
    server = _vllm_server_gpus(o, p)
    if server:
        t.tier = 2
        say("vLLM on its own GPU (vllm_mode server, started with `trl vllm-serve`): the training GPU no longer holds "
            f"vLLM's reservation; {server} more GPU for the server")
    g0, g1 = o.generation_batch_size, p.generation_batch_size
    if g0 is not None and g1 is not None and g1 != g0 and n0 and n1 and g0 * n1 == g1 * n0:
        say(f"generation batch {g0} -> {g1} completions: the same {g1 // n1} prompts per generation round")
        t.handled.add("generation_batch_size")
    t.handled |= {"precompute_ref_log_probs", "reference_model", "vllm_gpu_memory_utilization", "num_generations",
                  "max_completion_length", "vllm_mode"}
    return server


def _image_cost(t: _Tally, rm: ResolvedModel) -> None:
    """A VLM's images downscaled (a lower max_pixels: priced per halving of an image's tokens, as context is) or fewer
    of them a sample (priced higher per halving: a sample loses whole images, and a multi-image task changes)."""
    o, p, w = t.original, t.plan, QUALITY_WEIGHTS
    if _image_knobs(o) == _image_knobs(p) or None in (o.image_size, p.image_size):
        return
    before, after = _images(o, rm), _images(p, rm)
    if after.lm_tokens_per_image < before.lm_tokens_per_image:
        how = (f"downscaled (max_pixels {p.max_pixels:,})" if p.max_pixels != o.max_pixels else
               "not split into tiles (do_image_splitting off: the global image alone)"
               if p.do_image_splitting != o.do_image_splitting else
               f"cut into smaller tiles (max_image_size {p.max_image_size} px)"
               if p.max_image_size != o.max_image_size else
               f"split into fewer tiles (longest edge resized to {p.longest_edge:,} px)")
        t.learning(w["image_tokens_per_halving"] * math.log2(before.lm_tokens_per_image / after.lm_tokens_per_image),
                   f"images {how}: {before.lm_tokens_per_image:,} -> {after.lm_tokens_per_image:,} tokens each, "
                   "less visual detail to learn from")
    if p.images_per_sample < o.images_per_sample:
        # Mllama's images reach the text as one token each: what shrinks is the states its cross-attention reads
        what = (f"{before.cross_attention_tokens_per_sample:,} -> {after.cross_attention_tokens_per_sample:,} vision "
                "states a sample for the cross-attention layers" if before.cross_attention_tokens_per_image else
                f"{before.lm_tokens_per_sample:,} -> {after.lm_tokens_per_sample:,} image tokens a sample")
        t.learning(w["images_per_sample_per_halving"] * math.log2(o.images_per_sample / p.images_per_sample),
                   f"{p.images_per_sample} image{'s' if p.images_per_sample != 1 else ''} a sample instead of "
                   f"{o.images_per_sample}: {what}; samples lose whole images")
    t.handled.update(("max_pixels", "images_per_sample", "do_image_splitting", "longest_edge", "max_image_size"))


def _image_knobs(plan: TrainingPlan) -> tuple:
    """The plan's settings that decide its images' tokens, beside image_size."""
    return plan.max_pixels, plan.images_per_sample, plan.do_image_splitting, plan.longest_edge, plan.max_image_size


def _vision_tower_cost(t: _Tally) -> None:
    """The vision tower frozen instead of trained (by LoRA, or in full): it no longer learns the training images."""
    if t.original.vision_tower == "lora" and t.plan.vision_tower == "frozen":
        t.learning(QUALITY_WEIGHTS["freeze_vision_tower"],
                   "vision tower frozen: only the language model's adapters learn, as most VLM recipes train")
    elif t.original.vision_tower == "full" and t.plan.vision_tower == "frozen":
        t.learning(QUALITY_WEIGHTS["freeze_vision_tower"],
                   "vision tower frozen: the language model (and projector) train, the tower keeps its pretrained "
                   "weights, as most VLM recipes train (LLaMA-Factory's freeze_vision_tower default)")
    t.handled.add("vision_tower")


def _images(plan: TrainingPlan, rm: ResolvedModel):
    from .vision_images import resolve_images

    return resolve_images(plan, rm.spec)


def _image_tokens(plan: TrainingPlan, rm: ResolvedModel) -> int:
    """Image tokens in one sample of ``plan`` (0 for a text model)."""
    images = _images(plan, rm)
    return images.lm_tokens_per_sample if images is not None else 0


def kind_of(original: TrainingPlan, plan: TrainingPlan, rm: ResolvedModel) -> str:
    """The kind of choice ``plan`` is (KINDS): the last kind in KINDS order that its changes touch."""
    from .knobs import trainer_setting

    if plan.gpu != original.gpu or plan.gpu_vram_gb != original.gpu_vram_gb:
        return "larger_gpu"
    if plan.num_gpus > original.num_gpus or _vllm_server_gpus(original, plan):
        return "more_gpus"
    offloads_more = ((plan.offload_optimizer and not original.offload_optimizer)
                     or (plan.offload_params and not original.offload_params)
                     or (plan.activation_offloading and not original.activation_offloading))
    if offloads_more:
        return "cpu_offload"
    if plan.trainer == original.trainer == "grpo" and (
            trainer_setting(plan, "num_generations") < trainer_setting(original, "num_generations")):
        return "fewer_generations"
    if _image_knobs(plan) != _image_knobs(original) and (
            plan.image_size is not None and _image_tokens(plan, rm) < _image_tokens(original, rm)):
        return "fewer_image_tokens"
    if plan.seq_len < original.seq_len or (plan.trainer == original.trainer == "grpo" and (
            trainer_setting(plan, "max_completion_length") < trainer_setting(original, "max_completion_length"))):
        return "shorter_context"
    fewer = ((original.method == "full" and plan.method != "full")
             or (plan.uses_adapters and original.uses_adapters and plan.lora_r < original.lora_r)
             or (plan.uses_adapters and original.uses_adapters and _targets_of(plan, rm) < _targets_of(original, rm))
             or (original.use_dora and not plan.use_dora) or (original.modules_to_save and not plan.modules_to_save)
             or (original.vision_tower == "lora" and plan.vision_tower == "frozen"))
    if fewer:
        return "fewer_trainable"
    if (plan.quantized_4bit and not original.quantized_4bit) or (plan.load_in_8bit and not original.load_in_8bit) \
            or (plan.optim != original.optim and plan.optim in ("adamw_bnb_8bit", "paged_adamw_8bit")):
        return "lower_precision"
    return "same_math"


def room_cost(used_fraction: float | None) -> float:
    """What running near the GPU's limit costs a fitting plan: nothing up to FULLNESS_FREE_BELOW of usable memory,
    then USER_COST_WEIGHTS["fullness_per_15_points"] per 15 points."""
    if used_fraction is None:
        return 0.0
    return USER_COST_WEIGHTS["fullness_per_15_points"] * max(0.0, used_fraction - FULLNESS_FREE_BELOW) / 0.15


def host_ram_cost(plan: TrainingPlan, host_memory_bytes: int) -> float:
    """Offload on a machine whose host RAM the plan does not give: per doubling of the need over
    HOST_RAM_UNKNOWN_REFERENCE_GIB (a plan with host_ram_gb is judged by the estimate instead)."""
    if plan.host_ram_gb is not None or host_memory_bytes <= 0:
        return 0.0
    need_gib = host_memory_bytes / 2**30
    return USER_COST_WEIGHTS["host_ram_unknown_per_doubling"] * max(0.0, math.log2(need_gib /
                                                                                    HOST_RAM_UNKNOWN_REFERENCE_GIB))


def user_cost(kind: str, quality: float, slowdown: float, gpus_before: int, gpus_after: int) -> float:
    """The one-number cost of a choice: quality penalty + slowdown + hardware + offload (USER_COST_WEIGHTS); the
    search adds room_cost and host_ram_cost, which need the suggestion's estimate."""
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
    """The ranking: changes on the user's own hardware before more or larger GPUs (the seeds' order: tune, switch
    tier, then switch card), then the user cost (quality, time, hardware, offload, room in one number), then tier,
    then slowdown."""
    return (c.tier_rank == 2, round(c.user_cost, 3), c.tier_rank, round(c.slowdown_fraction, 3))

