"""The CLI's terminal rendering (rich): verdict, a stacked bar of the budget against the GPU, the breakdown table.

Used only when stdout is a terminal (:func:`terminal_console` returns None otherwise, and the CLI prints
server/text.py's plain text instead), so pipes, files and tests always see plain text. Imported lazily:
rich costs ~50 ms at startup.
"""

from __future__ import annotations

from canifinetune.estimator.constants import GIB

from .text import VERDICT_WORDS, default_next_move

VERDICT_STYLES = {"fits": "bold white on green", "tight": "bold black on yellow",
                  "does_not_fit": "bold white on red", "unknown": "bold white on grey50"}
# One colour per component, in breakdown order; the safety margin is drawn dim.
COLORS = ["blue", "dark_orange", "green", "magenta", "yellow", "red", "cyan", "chartreuse4",
          "orange4", "slate_blue1", "hot_pink3", "sea_green3", "tan", "grey62"]
BAR_WIDTH = 60


def terminal_console():
    """A rich Console when stdout is a terminal, else None (then print plain text)."""
    import sys

    if not sys.stdout.isatty():
        return None
    try:
        from rich.console import Console
    except ImportError:  # rich is a dependency, but never let its absence break the CLI
        return None
    console = Console()
    return console if console.is_terminal else None


def _color(name: str, i: int) -> str:
    return "grey50" if name == "safety_margin" else COLORS[i % len(COLORS)]


def budget_bar(est, width: int = BAR_WIDTH):
    """The budget as one stacked bar (a cell per 1/width of the scale), with a | at the GPU's usable memory."""
    from rich.text import Text

    usable = est.gpu_usable_bytes or 0
    scale = max(est.budget_bytes, usable, 1)
    cells: list[tuple[str, str]] = []
    for i, c in enumerate(est.breakdown):
        n = round(width * c.bytes / scale)
        char = "░" if c.name == "safety_margin" else "█"
        cells += [(char, _color(c.name, i))] * n
    cells = cells[:width] + [(" ", "")] * max(0, width - len(cells))
    cap = min(width - 1, round(width * usable / scale)) if usable else None
    bar = Text("▕")
    for j, (char, style) in enumerate(cells):
        if cap is not None and j == cap:
            bar.append("┃", style="bold red")
        else:
            bar.append(char, style=style)
    bar.append("▏")
    if usable:
        bar.append(f" GPU usable {usable / GIB:.2f} GiB", style="red")
    return bar


def show_estimate(console, est) -> None:
    from rich.table import Table
    from rich.text import Text

    plan = est.plan
    head = Text()
    head.append(f" {VERDICT_WORDS[est.verdict]} ", style=VERDICT_STYLES[est.verdict])
    head.append(f" {est.model}" + (f" on {est.gpu.name}" if est.gpu else "") + (" (per GPU)" if est.per_gpu else ""),
                style="bold")
    console.print(head)
    console.print(f"{est.verdict_reason}", style="dim")
    console.print(f"{est.params_total / 1e9:.3g}B params ({est.model_source}), {plan.method}, seq_len {plan.seq_len} x "
                  f"batch {plan.batch_size}, {plan.dtype}, {plan.optim}, checkpointing "
                  f"{'on' if plan.gradient_checkpointing else 'off'}; peak in {est.peak_phase}", style="dim")
    console.print(budget_bar(est))
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    table.add_column("")
    table.add_column("component")
    table.add_column("GiB", justify="right")
    table.add_column("share", justify="right")
    table.add_column("why", overflow="fold")
    for i, c in enumerate(est.breakdown):
        table.add_row(Text("░░" if c.name == "safety_margin" else "██", style=_color(c.name, i)), c.name,
                      f"{c.bytes / GIB:.3f}", f"{c.bytes / max(est.budget_bytes, 1):.0%}", c.explanation)
    table.add_row("", Text("budget", style="bold"), Text(f"{est.budget_bytes / GIB:.3f}", style="bold"), "",
                  f"peak allocated {est.peak_allocated_bytes / GIB:.2f} GiB, reserved {est.peak_reserved_bytes / GIB:.2f}"
                  f" GiB, process {est.total_bytes / GIB:.2f} GiB, plus the safety margin")
    console.print(table)
    for w in est.warnings:
        console.print(f"warning: {w}", style="yellow")
    move = default_next_move(est)
    if move:
        console.print(f"next: {move}", style="dim")


def show_suggestions(console, result, plain_text: str) -> None:
    """suggest: the original plan's bar, then server/text.py's format_suggestions (the MCP tool's text)."""
    console.print(budget_bar(result.original))
    console.print(plain_text, highlight=False, markup=False)
