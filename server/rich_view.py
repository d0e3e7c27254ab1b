"""The CLI's terminal rendering (rich): the verdict and its number, a stacked bar of the budget against the GPU, the
breakdown table (estimate) or a legend (suggest).

Used only when stdout is a terminal (:func:`terminal_console` returns None otherwise, and the CLI prints
server/text.py's plain text instead), so pipes, files and tests always see plain text. Imported lazily:
rich costs ~50 ms at startup.

Colours: each component has one fixed colour by name, shared with the MCP App (server/palette.py), given as
truecolor hex (rich reduces it on 256- or 16-colour terminals), never as named ANSI colours, which every
terminal theme redefines. Only the verdict badge sets a background, with its own text colour (at least
4.5:1); all other text is the terminal's own foreground (bold or dim). The GPU's usable memory is a ``┃``
in the foreground colour, not a component's colour. Numbers are not highlighted (``highlight=False``).
The bar takes the console's width, so it never wraps.
"""

from __future__ import annotations

from canifinetune.estimator.constants import GIB

from .palette import MARGIN_COLOR, VERDICT_COLORS, component_color
from .text import VERDICT_WORDS, default_next_move, sequence_words, verdict_line

MIN_BAR = 20


def terminal_console():
    """A rich Console when stdout is a terminal, else None (then print plain text)."""
    import sys

    if not sys.stdout.isatty():
        return None
    try:
        from rich.console import Console
    except ImportError:  # rich is a dependency, but never let its absence break the CLI
        return None
    console = Console(highlight=False)
    return console if console.is_terminal else None


def verdict_style(verdict: str) -> str:
    fg, bg = VERDICT_COLORS.get(verdict, VERDICT_COLORS["unknown"])
    return f"bold {fg} on {bg}"


def _style(name: str) -> str:
    return MARGIN_COLOR if name == "safety_margin" else component_color(name)


def _char(name: str) -> str:
    return "░" if name == "safety_margin" else "█"


def lead_number(est) -> str:
    """The one number that decides: how much over, how much into the safety margin, or how much free."""
    usable = est.gpu_usable_bytes
    per = " per GPU" if est.per_gpu else ""
    if not usable or est.verdict == "unknown":
        return f"needs {est.budget_bytes / GIB:.2f} GiB{per}"
    if est.verdict == "does_not_fit":
        return f"{(est.total_bytes - usable) / GIB:.2f} GiB over{per}"
    if est.verdict == "tight":
        return f"{(est.budget_bytes - usable) / GIB:.2f} GiB into the margin{per}"
    return f"{(usable - est.budget_bytes) / GIB:.2f} GiB free{per}"


def lead(est, where: bool = True):
    """' DOES NOT FIT  1.22 GiB over on RTX 4090': the verdict badge, then its number."""
    from rich.text import Text

    head = Text()
    head.append(f" {VERDICT_WORDS[est.verdict]} ", style=verdict_style(est.verdict))
    head.append(f" {lead_number(est)}", style="bold")
    if where and est.gpu:
        head.append(f" on {est.gpu.name}")
    return head


def budget_bar(est, width: int):
    """The budget as one stacked bar ``width`` cells wide, on a scale from 0 to max(budget, GPU usable), with a
    ``┃`` at the GPU's usable memory, and an axis line under it. Returns two rich Texts, each at most ``width``."""
    from rich.text import Text

    usable = est.gpu_usable_bytes or 0
    inner = max(MIN_BAR, width - 2 - (1 if usable else 0))
    scale = max(est.budget_bytes, usable, 1)
    cells: list[tuple[str, str]] = []
    cum = 0
    for c in est.breakdown:
        start, cum = round(inner * cum / scale), cum + c.bytes
        cells += [(_char(c.name), _style(c.name))] * (round(inner * cum / scale) - start)
    filled = len(cells)
    cap = round(inner * usable / scale) if usable else None
    cells += [("·" if cap is not None and i < cap else " ", "dim") for i in range(filled, inner)]
    bar = Text("▕")
    for j, (char, style) in enumerate(cells):
        if cap == j:
            bar.append("┃", style="bold")
        bar.append(char, style=style)
    if cap == inner:
        bar.append("┃", style="bold")
    bar.append("▏")

    # axis: 0 at the left, the GPU line's label pointing at it, the scale's end (the larger value) at the right
    axis = [" "] * len(bar.plain)
    _put(axis, 1, "0")
    right = f"{scale / GIB:.2f} GiB"
    if cap is not None:  # usable memory given
        col = 1 + cap  # where the ┃ is
        label = f"↑ GPU usable {usable / GIB:.2f} GiB"
        if col + len(label) > len(axis):
            label = f"GPU usable {usable / GIB:.2f} GiB ↑"
            col = col - len(label) + 1
        _put(axis, max(col, 2), label)
        _put(axis, len(axis) - 1 - len(right), right, only_if_free=True)
    else:
        _put(axis, len(axis) - 1 - len(right), right)
    return bar, Text("".join(axis).rstrip(), style="dim")


def _put(line: list[str], at: int, text: str, only_if_free: bool = False) -> bool:
    at = max(0, min(at, len(line) - len(text)))
    if only_if_free and any(ch != " " for ch in line[max(0, at - 1):at + len(text) + 1]):
        return False
    line[at:at + len(text)] = list(text)
    return True


def legend(est, width: int):
    """Each component's colour, name and GiB (the suggest view has no table), wrapped to ``width``."""
    from rich.text import Text

    entries = [(f"{_char(c.name) * 2} ", _style(c.name), f"{c.name} {c.bytes / GIB:.2f}") for c in est.breakdown
               if c.bytes > 0]
    if est.gpu_usable_bytes:
        entries.append(("┃ ", "bold", f"GPU usable {est.gpu_usable_bytes / GIB:.2f} GiB"))
    out, line_len = Text(), 0
    for sw, style, label in entries:
        n = len(sw) + len(label)
        if line_len and line_len + 2 + n > width:
            out.append("\n")
            line_len = 0
        elif line_len:
            out.append("  ")
            line_len += 2
        out.append(sw, style=style)
        out.append(label)
        line_len += n
    return out


def show_estimate(console, est) -> None:
    from rich.table import Table
    from rich.text import Text

    plan = est.plan
    console.print(lead(est, where=False))
    console.print(Text(f"{est.model}" + (f" on {est.gpu.name}" if est.gpu else "")
                       + (" (per GPU)" if est.per_gpu else ""), style="bold"))
    console.print(Text(est.verdict_reason, style="dim"))
    console.print(Text(f"{est.params_total / 1e9:.3g}B params ({est.model_source}), {plan.method}, "
                       f"{sequence_words(est)} x batch {plan.batch_size}, {plan.dtype}, {plan.optim}, checkpointing "
                       f"{'on' if plan.gradient_checkpointing else 'off'}; peak in {est.peak_phase}", style="dim"))
    console.print()
    for line in budget_bar(est, console.width):
        console.print(line, no_wrap=True, overflow="crop")
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    table.add_column("")
    table.add_column("component")
    table.add_column("GiB", justify="right")
    table.add_column("share", justify="right")
    table.add_column("why", overflow="fold")
    for c in est.breakdown:
        table.add_row(Text(_char(c.name) * 2, style=_style(c.name)), c.name, f"{c.bytes / GIB:.3f}",
                      f"{c.bytes / max(est.budget_bytes, 1):.0%}", c.explanation)
    table.add_row("", Text("budget", style="bold"), Text(f"{est.budget_bytes / GIB:.3f}", style="bold"), "",
                  f"peak allocated {est.peak_allocated_bytes / GIB:.2f} GiB, "
                  f"reserved {est.peak_reserved_bytes / GIB:.2f} GiB, process {est.total_bytes / GIB:.2f} GiB, "
                  "plus the safety margin")
    console.print(table)
    for w in est.warnings:
        console.print(Text.assemble(("warning: ", "bold"), w))
    move = default_next_move(est)
    if move:
        console.print(Text(f"next: {move}", style="dim"))


def cli_flag(field: str, value) -> str | None:
    """A change as the flag the user would type: ``--seq-len 1408``, ``--no-gradient-checkpointing``,
    ``--gpu "A100 80GB"``."""
    import shlex

    name = "--" + field.replace("_", "-")
    if value is True:
        return name
    if value is False:
        return "--no-" + field.replace("_", "-")
    if value is None:
        return None
    text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return f"{name} {shlex.quote(text)}"


def show_suggestions(console, result, plain_text: str) -> None:
    """suggest: the plan's verdict and number, its bar with a legend, the recommended (first) suggestion as flags,
    then server/text.py's format_suggestions (the MCP tool's text) without its first line when that line only
    repeats the verdict."""
    from rich.text import Text

    o = result.original
    console.print(lead(o))
    for line in budget_bar(o, console.width):
        console.print(line, no_wrap=True, overflow="crop")
    console.print(legend(o, console.width))
    if result.suggestions:
        flags = [f for c in result.suggestions[0].changes if (f := cli_flag(c.field, c.new))]
        if flags:
            console.print(Text.assemble(("recommended: ", "bold"), " ".join(flags)))
    console.print()
    lines = plain_text.splitlines()
    if lines and lines[0] == verdict_line(o):
        console.print(Text(o.verdict_reason, style="dim"))
        lines = lines[1:]
    console.print("\n".join(lines), highlight=False, markup=False)
