"""Plain-text renderings shared by the CLI and the MCP tools' human-readable content."""

from __future__ import annotations

import json

from canifinetune.estimator.constants import GIB
from canifinetune.estimator.estimate import Estimate

VERDICT_WORDS = {
    "fits": "FITS",
    "tight": "TIGHT",
    "does_not_fit": "DOES NOT FIT",
    "unknown": "NO VERDICT",
}
BAR_WIDTH = 24


def gib(n: int | float) -> str:
    return f"{n / GIB:.2f} GiB"


def verdict_line(est: Estimate) -> str:
    where = f" on {est.gpu.name}" if est.gpu else ""
    per = " (per GPU)" if est.per_gpu else ""
    return f"{VERDICT_WORDS[est.verdict]}{where}{per}: {est.verdict_reason}"


def chosen_lines(est: Estimate) -> list[str]:
    """What the estimate chose for the user's hardware, each with why ('chose: dtype fp16: the Tesla T4 ...')."""
    return [f"chose: {c}" for c in est.chosen_defaults]


def tier_lines(est: Estimate) -> list[str]:
    """The one-line full / LoRA / QLoRA row, when the face computed it."""
    if not est.tiers:
        return []
    from canifinetune.estimator.tiers import tier_line

    return [tier_line(est.tiers, _on(est).removeprefix("the "))]


def speed_lines(est: Estimate) -> list[str]:
    """The one speed line (tokens/s and, with a token budget, the time to train), when the face computed it."""
    if est.speed is None:
        return []
    from canifinetune.estimator.tiers import speed_line

    return [speed_line(est.speed)]


def breakdown_lines(est: Estimate) -> list[str]:
    """One line per component with a bar proportional to its share of the budget."""
    scale = max(est.budget_bytes, est.gpu_usable_bytes or 0, 1)
    width = max(len(c.name) for c in est.breakdown)
    lines = []
    for c in est.breakdown:
        filled = round(BAR_WIDTH * c.bytes / scale)
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        lines.append(f"  {c.name:<{width}}  {c.bytes / GIB:8.3f} GiB  {bar}  {c.explanation}")
    return lines


def sequence_words(est: Estimate) -> str:
    """'seq_len 1024', or for a VLM 'seq_len 1024 + 1,198 image tokens = 2,222'."""
    plan = est.plan
    if est.image_tokens_per_sample is None:
        return f"seq_len {plan.seq_len}"
    tokens = est.image_tokens_per_sample
    return (f"seq_len {plan.seq_len} + {tokens:,} image token{'s' if tokens != 1 else ''} "
            f"({plan.images_per_sample} x {plan.image_size}) = {plan.seq_len + est.image_tokens_per_sample:,}")


def format_estimate(est: Estimate, next_move: str | None = None) -> str:
    plan = est.plan
    head = [
        verdict_line(est),
        *chosen_lines(est),
        *tier_lines(est),
        f"{est.model} ({est.params_total / 1e9:.3g}B params, {est.model_source}), {plan.method}, "
        f"{sequence_words(est)} x batch {plan.batch_size}, {plan.dtype}, {plan.optim}, "
        f"checkpointing {'on' if plan.gradient_checkpointing else 'off'}",
        next((a for a in est.assumptions if a.startswith("stack: ")), f"stack: {plan.stack.title}"),
        *speed_lines(est),
        f"peak allocated {gib(est.peak_allocated_bytes)} ({est.peak_phase}) | reserved {gib(est.peak_reserved_bytes)} "
        f"| process {gib(est.total_bytes)} | with margin {gib(est.budget_bytes)}"
        + (f" of {gib(est.gpu_usable_bytes)} ({est.used_fraction:.0%})" if est.gpu_usable_bytes else ""),
        "",
    ]
    lines = head + breakdown_lines(est)
    if est.warnings:
        lines.append("")
        lines += [f"warning: {w}" for w in est.warnings]
    move = next_move or default_next_move(est)
    if move:
        lines += ["", f"next: {move}"]
    return "\n".join(lines)


# make_recipe writes text-model recipes only; a vision-language plan's next step is said instead
VLM_TRAINING_MOVE = ("make a recipe (make_recipe, `canifinetune recipe`) with the same arguments and train a few steps "
                     "on your image rows (max_steps in the recipe): the probe measures text samples only")


def recipe_move(plan, words: str) -> str:
    """``words`` (a next step through make_recipe and the probe), or for a vision-language plan, whose recipe the probe
    does not measure, the recipe and a few steps; for a LitGPT or torchtune plan, whose step make_recipe refuses to
    carry into TRL, that framework's own command (estimator/stacks.py ``Stack.own_command``)."""
    own = plan.stack.own_command(plan.method)
    if own is not None:
        return (f"run `{own}` with these settings (make_recipe writes TRL recipes, which cannot carry "
                f"{plan.stack.title}'s own step)")
    return VLM_TRAINING_MOVE if plan.image_size is not None else words


def default_next_move(est: Estimate) -> str:
    if est.verdict == "does_not_fit":
        return "ask suggest_cheaper_config (`canifinetune suggest ...`) for the cheapest changes that fit"
    if est.verdict == "tight":
        return "it may run, close to the limit; `canifinetune suggest` finds configs with room to spare"
    if est.verdict == "unknown":
        return "give a GPU (gpu='RTX 4090' or gpu_vram_gb=24) for a verdict"
    return recipe_move(est.plan, "make a recipe (`canifinetune recipe ...`) and check with a short probe run")


def changes_summary(changes) -> str:
    """A suggestion's changes in words: 'method "lora" -> "qlora", batch_size 8 -> 2'."""
    return ", ".join(f"{c.field} {json.dumps(c.old)} -> {json.dumps(c.new)}" for c in changes)


def _on(est: Estimate) -> str:
    gpu = est.gpu.name if est.gpu else "GPU"
    if est.plan.num_nodes > 1:
        return f"{est.plan.num_nodes} nodes of {est.plan.node_gpus} x {gpu}"
    return f"{est.plan.num_gpus} x {gpu}" if est.plan.num_gpus > 1 else f"the {gpu}"


def format_suggestions(result) -> str:
    """The suggest answer in words, for ``canifinetune suggest`` and the suggest_cheaper_config tool alike.

    ``result`` is the search's :class:`~canifinetune.estimator.search.SuggestResult` (the tool's structured
    content and ``canifinetune suggest --json``). The verdict first, then the answer (the first suggestion
    to apply, or that nothing fits), one entry per suggestion with its cost, the hardware on which the
    original plan fits, and the next move.
    """
    o = result.original
    usable = o.gpu_usable_bytes
    lines = [verdict_line(o), _answer_line(result), *chosen_lines(o)]
    if result.keep:
        lines.append("pinned (never changed): " + ", ".join(result.keep))
    lines.append(f"{o.model} as planned: ~{result.original_throughput.tokens_per_second:,.0f} tokens/s (approximate)")
    for s in result.suggestions:
        e, t = s.estimate, s.throughput
        share = (f" ({e.used_fraction:.0%} of {gib(e.gpu_usable_bytes)})"
                 if e.used_fraction is not None and e.gpu_usable_bytes else "")
        hours = (f", ~{t.training_hours:.1f} h for {result.training_tokens:,} tokens"
                 if t.training_hours is not None and result.training_tokens else "")
        host = f", needs {gib(e.host_memory_bytes)} of host RAM" if e.host_memory_bytes else ""
        lines += ["", f"  {s.rank}. [{s.cost.kind}] {changes_summary(s.changes)}: {VERDICT_WORDS[e.verdict]}, "
                      f"{gib(e.budget_bytes)} with margin{share}{host}, ~{t.tokens_per_second:,.0f} tokens/s "
                      f"({1e3 / t.tokens_per_second:.3g} ms per training token){hours}",
                  f"     cost: {s.cost.summary}"]
        lines += [f"     - {d}" for d in s.cost.details]
    if not result.fits_already:
        lines.append("")
        if result.nothing_fits and result.min_reachable_bytes is not None:
            lines.append(f"least memory reachable on {_on(o)}: {gib(result.min_reachable_bytes)} with margin"
                         + (f" of {gib(usable)}" if usable else ""))
        if result.smallest_gpu:
            lines.append(f"smallest catalog GPU for the plan unchanged: {result.smallest_gpu}"
                         + (f" ({gib(result.smallest_gpu_usable_bytes)} usable)"
                            if result.smallest_gpu_usable_bytes else ""))
        if result.min_gpus:
            lines.append(f"fewest GPUs for the plan unchanged: {result.min_gpus} x {o.gpu.name if o.gpu else 'GPU'} "
                         f"with sharding '{result.min_gpus_sharding}'")
        if result.suggestions:
            lines.append(f"({result.throughput_label})")
    if result.suggestions:
        move = ("apply the first suggestion's changes (or take its plan), confirm with estimate_memory "
                "(`canifinetune estimate`), then " + recipe_move(o.plan, "make_recipe (`canifinetune recipe`)"))
    elif result.fits_already:
        move = recipe_move(o.plan, "make_recipe (`canifinetune recipe`) with the same arguments")
    else:
        named = [w for w, there in (("the larger GPU", result.smallest_gpu), ("the GPU count", result.min_gpus))
                 if there]
        move = (f"pick {' or '.join(named)} named above, or unpin a field (keep) and ask again" if named
                else "unpin a field (keep) and ask again: no catalog GPU holds the plan unchanged")
    return "\n".join([*lines, "", f"next: {move}"])


# ------------------------------------------------------------------ the MCP tools' text: short (issue 15.4)

BRIEF_PARTS = 3


def need_vs_have(est: Estimate) -> str:
    """'need 26.35 GiB with margin, have 23.88 GiB usable (110%): 2.47 GiB over'."""
    per = " per GPU" if est.per_gpu else ""
    need = f"need {gib(est.budget_bytes)} with margin{per}"
    if not est.gpu_usable_bytes:
        return need + " (no GPU given)"
    have = f"have {gib(est.gpu_usable_bytes)} usable ({est.used_fraction:.0%})"
    if est.verdict == "does_not_fit" and est.total_bytes <= est.gpu_usable_bytes:  # the host RAM is what is short
        return f"{need}, {have}: the GPU holds it; {est.verdict_reason}"
    if est.verdict == "does_not_fit":
        return f"{need}, {have}: {gib(est.total_bytes - est.gpu_usable_bytes)} over even without the margin"
    if est.verdict == "tight" and est.budget_bytes > est.gpu_usable_bytes:
        return f"{need}, {have}: {gib(est.budget_bytes - est.gpu_usable_bytes)} into the safety margin"
    if est.verdict == "tight":
        return f"{need}, {have}: only {gib(est.gpu_usable_bytes - est.budget_bytes)} free, under the headroom line"
    return f"{need}, {have}: {gib(est.gpu_usable_bytes - est.budget_bytes)} free"


def plan_line(est: Estimate) -> str:
    plan = est.plan
    return (f"{est.model} ({est.params_total / 1e9:.3g}B params, {est.model_source}), {plan.method}, "
            f"{sequence_words(est)} x batch {plan.batch_size}, {plan.dtype}, {plan.optim}, "
            f"checkpointing {'on' if plan.gradient_checkpointing else 'off'}"
            + (f", {plan.gpus_words()} {plan.sharding}" if plan.num_gpus > 1 else ""))


def stack_line(est: Estimate) -> str:
    return next((a for a in est.assumptions if a.startswith("stack: ")), f"stack: {est.plan.stack.title}")


def top_parts(est: Estimate, n: int = BRIEF_PARTS, explain: bool = True) -> str:
    parts = sorted((c for c in est.breakdown if c.name != "safety_margin"), key=lambda c: -c.bytes)[:n]
    return "largest: " + "; ".join(f"{c.name} {gib(c.bytes)}" + (f" ({c.explanation})" if explain else "")
                                   for c in parts)


def format_estimate_brief(est: Estimate, next_move: str | None = None) -> str:
    """estimate_memory's text: verdict, need vs have, the plan, the stack, the three largest parts, warnings,
    the next step (the whole breakdown is in the structured content; `canifinetune estimate` prints it)."""
    lines = [verdict_line(est), *chosen_lines(est), need_vs_have(est), *tier_lines(est), plan_line(est),
             stack_line(est), *speed_lines(est), top_parts(est)]
    lines += [f"warning: {w}" for w in est.warnings]
    lines.append(f"next: {next_move or default_next_move(est)}")
    return "\n".join(lines)


MAX_BRIEF_SUGGESTIONS = 5


def _answer_line(result) -> str:
    """The search's answer in one line: nothing to change, the first suggestion to apply, or that nothing fits."""
    o = result.original
    first = result.suggestions[0] if result.suggestions else None
    if result.fits_already:
        return f"it fits on {_on(o)} as it is: nothing to change"
    if first is None:
        return f"nothing fits on {_on(o)} with the allowed changes"
    also = f" (nothing fits on {_on(o)} itself: all need more or larger GPUs)" if result.nothing_fits else ""
    return f"{len(result.suggestions)} configuration(s) fit{also}; apply the first: {changes_summary(first.changes)}"


def format_suggestions_brief(result) -> str:
    """suggest_cheaper_config's text: the verdict, the answer, one line per suggestion (changes, budget, speed,
    host RAM, cost), the hardware on which the plan fits unchanged, the next step."""
    o = result.original
    lines = [verdict_line(o), _answer_line(result), *chosen_lines(o)]
    lines.append(need_vs_have(o) + f"; ~{result.original_throughput.tokens_per_second:,.0f} tokens/s as planned")
    if result.keep:
        lines.append("pinned (never changed): " + ", ".join(result.keep))
    for s in result.suggestions[:MAX_BRIEF_SUGGESTIONS]:
        e, t = s.estimate, s.throughput
        share = f" ({e.used_fraction:.0%})" if e.used_fraction is not None else ""
        host = f", needs {gib(e.host_memory_bytes)} of host RAM" if e.host_memory_bytes else ""
        lines.append(f"{s.rank}. [{s.cost.kind}] {changes_summary(s.changes)}: {gib(e.budget_bytes)}{share}{host}, "
                     f"~{t.tokens_per_second:,.0f} tokens/s ({1e3 / t.tokens_per_second:.3g} ms per training token); "
                     f"{s.cost.summary}")
    if len(result.suggestions) > MAX_BRIEF_SUGGESTIONS:
        lines.append(f"({len(result.suggestions) - MAX_BRIEF_SUGGESTIONS} more in the structured content)")
    if not result.fits_already:
        if result.nothing_fits and result.min_reachable_bytes is not None:
            lines.append(f"least memory reachable on {_on(o)}: {gib(result.min_reachable_bytes)} with margin")
        if result.smallest_gpu:
            lines.append(f"smallest catalog GPU for the plan unchanged: {result.smallest_gpu}")
        if result.min_gpus:
            lines.append(f"fewest GPUs for the plan unchanged: {result.min_gpus} x {o.gpu.name if o.gpu else 'GPU'} "
                         f"with sharding '{result.min_gpus_sharding}'")
    if result.suggestions:
        move = ("apply the first suggestion's changes to the arguments, confirm with estimate_memory, then "
                + recipe_move(o.plan, "make_recipe"))
    elif result.fits_already:
        move = recipe_move(o.plan, "make_recipe with the same arguments")
    else:
        named = [w for w, there in (("the larger GPU", result.smallest_gpu), ("the GPU count", result.min_gpus))
                 if there]
        move = (f"pick {' or '.join(named)} named above, or unpin a field (keep) and ask again" if named
                else "unpin a field (keep) and ask again: no catalog GPU holds the plan unchanged")
    return "\n".join([*lines, f"next: {move}"])


def format_recipe_brief(view: dict) -> str:
    """make_recipe's text: the verdict, the files (sent as resource links), how to run it, the next step."""
    lines = [f"{VERDICT_WORDS[view['verdict']]}: {view['verdict_reason']}"]
    if view["verdict"] in ("does_not_fit", "tight"):
        lines.append("warning: this plan does not fit with margin; suggest_cheaper_config finds one that does")
    if view.get("framework_note"):
        lines.append(f"note: {view['framework_note']}")
    lines.append("files (resource links; read one with resources/read): " + ", ".join(view["files"]))
    lines.append(f"write them into a folder: {view['cli_command']}")
    lines.append(f"run: {view['launch_command']} (in that folder)")
    # recipes/render.py next_step: a command `canifinetune train` accepts for this trainer and GPU count
    lines.append(f"next, in that folder: {view['next_step']}")
    return "\n".join(lines)
