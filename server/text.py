"""Plain-text renderings shared by the CLI and the MCP tools' human-readable content."""

from __future__ import annotations

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


def format_estimate(est: Estimate, next_move: str | None = None) -> str:
    plan = est.plan
    head = [
        verdict_line(est),
        f"{est.model} ({est.params_total / 1e9:.3g}B params, {est.model_source}), {plan.method}, "
        f"seq_len {plan.seq_len} x batch {plan.batch_size}, {plan.dtype}, {plan.optim}, "
        f"checkpointing {'on' if plan.gradient_checkpointing else 'off'}",
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


def default_next_move(est: Estimate) -> str:
    if est.verdict == "does_not_fit":
        return "ask suggest_cheaper_config (`canifinetune suggest ...`) for the cheapest changes that fit"
    if est.verdict == "tight":
        return "it may run, close to the limit; `canifinetune suggest` finds configs with room to spare"
    if est.verdict == "unknown":
        return "give a GPU (gpu='RTX 4090' or gpu_vram_gb=24) for a verdict"
    return "make a recipe (`canifinetune recipe ...`) and check with a short probe run"


def format_suggestions(result) -> str:
    """suggest_cheaper_config's text: the answer first, then one line per suggestion, then the next move.

    ``result`` is the tool's structured answer (``canifinetune.server.mcp_server.Suggestions``).
    """
    lines = [result.message]
    usable = result.gpu_usable_bytes
    for i, s in enumerate(result.suggestions, 1):
        share = f" ({s.used_fraction:.0%} of {gib(usable)})" if s.used_fraction is not None and usable else ""
        lines.append(f"  {i}. {s.summary}: {VERDICT_WORDS[s.verdict]}, {gib(s.budget_bytes)} with margin{share}"
                     + (f" [{s.note}]" if s.note else ""))
    if result.nothing_fits:
        if result.smallest_gpu:
            g = result.smallest_gpu
            lines.append(f"  smallest GPU for the plan unchanged: {g.gpu} ({gib(g.budget_bytes)} with margin)")
        if result.more_gpus:
            g = result.more_gpus
            lines.append(f"  or {g.num_gpus} x {g.gpu} with sharding '{g.sharding}' ({gib(g.budget_bytes)} per GPU)")
    if result.suggestions:
        move = "apply the first suggestion's changes and confirm with estimate_memory, then make_recipe"
    elif result.already_fits:
        move = "make_recipe with the same arguments"
    elif result.nothing_fits:
        move = "pick a larger GPU (or more GPUs) as named above, or free a kept field (keep=[...]) and ask again"
    else:
        move = "pass gpu or gpu_vram_gb"
    return "\n".join(lines + ["", f"next: {move}"])


def format_recipe(result) -> str:
    """make_recipe's text: the verdict of the plan, then each file of the recipe."""
    lines = [f"{VERDICT_WORDS[result.verdict]}: {result.verdict_reason}"]
    if result.verdict in ("does_not_fit", "tight"):
        lines.append("warning: this plan does not fit with margin; suggest_cheaper_config finds one that does")
    for name, content in result.files.items():
        lines += ["", f"--- {name}", content.rstrip()]
    lines += ["", "next: run a short probe first (a few steps) and compare its peak memory with the estimate"]
    return "\n".join(lines)
