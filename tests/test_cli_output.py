"""The CLI a newcomer meets: plain text in pipes, rich on a terminal, JSON equal to the MCP tool's, exit codes."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest

from canifinetune.server.cli import EXIT_DOES_NOT_FIT, EXIT_OK, EXIT_TIGHT, EXIT_USAGE, main
from canifinetune.server.mcp_server import estimate_memory_impl, suggest_impl
from canifinetune.server.palette import VERDICT_COLORS, component_color

CLI = [sys.executable, "-m", "canifinetune.server.cli"]
FITS = ["--model", "Qwen/Qwen2.5-1.5B-Instruct", "--method", "qlora", "--gpu-vram-gb", "16", "--seq-len", "2048"]


def _on_a_terminal(args: list[str], columns: int = 160) -> tuple[int, str]:
    """Run the CLI with stdout on a pseudo-terminal; return (exit code, what the terminal showed)."""
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "xterm-256color", "COLORTERM": "truecolor"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(CLI + args, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    out, deadline = b"", time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(timeout=30), out.decode("utf-8", "replace")


def test_piped_output_is_plain_text_without_rich():
    code = "import sys, runpy; sys.argv = ['canifinetune', 'estimate', *sys.argv[1:]];\n" \
           "from canifinetune.server.cli import main; rc = main(sys.argv[1:]);\n" \
           "print('RICH-IMPORTED' if 'rich' in sys.modules else 'NO-RICH'); sys.exit(rc)"
    proc = subprocess.run([sys.executable, "-c", code, *FITS, "--offline"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == EXIT_OK, proc.stderr
    assert proc.stdout.startswith("FITS on 16 GB GPU")
    assert "\x1b[" not in proc.stdout  # no escape codes in a pipe
    assert "  weights " in proc.stdout and "#" in proc.stdout
    assert proc.stdout.rstrip().endswith("NO-RICH")


def test_terminal_output_has_the_verdict_the_bar_and_the_table():
    code, screen = _on_a_terminal(["estimate", *FITS, "--offline"])
    assert code == EXIT_OK, screen
    assert "\x1b[" in screen  # colour
    assert "FITS" in screen and "█" in screen and "┃" in screen and "GPU usable 16.00 GiB" in screen
    for name in ("weights", "activations", "cuda_context", "safety_margin", "budget"):
        assert name in screen


SGR = re.compile(r"\x1b\[([0-9;]*)m")
DOES_NOT_FIT = ["--model", "Qwen/Qwen2.5-7B-Instruct", "--method", "lora", "--gpu", "RTX 4090", "--seq-len", "2048"]


def _visible(screen: str) -> list[str]:
    return SGR.sub("", screen).replace("\r", "").splitlines()


def _colours(screen: str) -> set[tuple[str, str]]:
    """('fg' or 'bg', '#RRGGBB') of every colour the terminal was told to draw; fails on a named or indexed colour."""
    out = set()
    for params in SGR.findall(screen):
        p = [int(x) for x in params.split(";") if x] or [0]
        i = 0
        while i < len(p):
            if p[i] in (38, 48):
                assert p[i + 1] == 2, f"not a truecolor colour: {params}"
                out.add(("fg" if p[i] == 38 else "bg", "#{:02X}{:02X}{:02X}".format(*p[i + 2:i + 5])))
                i += 5
                continue
            assert not (30 <= p[i] <= 37 or 40 <= p[i] <= 47 or 90 <= p[i] <= 97 or 100 <= p[i] <= 107), \
                f"a named ANSI colour (theme-dependent): {params}"
            i += 1
    return out


@pytest.mark.parametrize("columns", [80, 132])
def test_terminal_leads_with_the_verdict_and_sizes_the_bar_to_the_console(columns):
    code, screen = _on_a_terminal(["estimate", *DOES_NOT_FIT, "--offline"], columns=columns)
    assert code == EXIT_DOES_NOT_FIT, screen
    lines = [line for line in _visible(screen) if line.strip()]
    est = estimate_memory_impl(dict(model="Qwen/Qwen2.5-7B-Instruct", method="lora", gpu="RTX 4090",
                                    seq_len=2048)).structured_content
    over = (est["total_bytes"] - est["gpu_usable_bytes"]) / 2**30
    assert lines[0].strip() == f"DOES NOT FIT  {over:.2f} GiB over"  # the verdict and its number, first
    bar = next(line for line in lines if line.startswith("▕"))
    assert len(bar) == columns and bar.endswith("▏") and bar.count("┃") == 1  # the console's width, never wrapped
    assert all(len(line) <= columns for line in lines)
    axis = lines[lines.index(bar) + 1]
    assert axis.lstrip().startswith("0") and "GPU usable 23.88 GiB" in axis
    cap = bar.index("┃")
    assert cap in (axis.index("↑"), axis.index("GPU") - 2)  # the label points at the line
    assert "7.62B params" in screen  # no number highlighting splitting it


def test_terminal_colours_are_truecolor_by_component_name():
    code, screen = _on_a_terminal(["estimate", *FITS, "--offline"])
    assert code == EXIT_OK
    colours = _colours(screen)
    assert ("bg", VERDICT_COLORS["fits"][1]) in colours and ("fg", VERDICT_COLORS["fits"][0]) in colours
    for name in ("weights", "quantization_constants", "activations", "cuda_context", "allocator_overhead"):
        assert ("fg", component_color(name)) in colours, name
    assert component_color("weights") != component_color("cuda_context")


def test_terminal_suggest_leads_with_the_verdict_and_has_a_legend():
    code, screen = _on_a_terminal(["suggest", "--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "RTX 4090",
                                   "--seq-len", "2048", "--offline"], columns=80)
    assert code == EXIT_OK, screen
    lines = [line for line in _visible(screen) if line.strip()]
    assert re.fullmatch(r" DOES NOT FIT  [\d.]+ GiB over on RTX 4090", lines[0])
    assert lines[1].startswith("▕") and len(lines[1]) == 80
    legend = " ".join(lines[3:7])
    for name in ("weights", "activations", "cuda_context", "safety_margin", "GPU usable 23.88 GiB"):
        assert name in legend, legend
    assert all(len(line) <= 80 for line in lines)
    _colours(screen)  # truecolor only
    first = suggest_impl(dict(model="Qwen/Qwen2.5-7B-Instruct", gpu="RTX 4090", seq_len=2048)).structured_content
    flags = " ".join(f"--{c['field'].replace('_', '-')} {c['new']}" for c in first["suggestions"][0]["changes"])
    assert f"recommended: {flags}" in lines  # the change as the flags to type


def test_terminal_suggest_shows_the_bar_and_the_ranking():
    code, screen = _on_a_terminal(["suggest", "--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "RTX 4090",
                                   "--seq-len", "2048", "--offline"])
    assert code == EXIT_OK, screen
    assert "GPU usable 23.88 GiB" in screen and "1. [" in screen
    assert "apply the first: batch_size 8 -> " in screen and "next:" in screen  # the micro-batch with room (issue 21)


def test_estimate_json_is_the_mcp_tools_structured_content(capsys):
    """`--json` prints the whole Estimate; the tool returns the same estimate made small (issue 15.4:
    server/mcp_views.py estimate_view)."""
    from canifinetune.estimator.estimate import Estimate
    from canifinetune.server.mcp_views import estimate_view

    args = dict(model="Qwen/Qwen2.5-1.5B-Instruct", method="qlora", gpu_vram_gb=16, seq_len=2048)
    assert main(["estimate", *FITS, "--json", "--offline"]) == EXIT_OK
    cli = json.loads(capsys.readouterr().out)
    tool = estimate_memory_impl(args).structured_content
    assert estimate_view(Estimate.model_validate(cli)) == tool
    assert cli["plan"]["lora_r"] == 16 and "lora_r" not in tool["plan"]  # the tool: only what differs


@pytest.mark.parametrize("cli_args, tool_args", [
    (["--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "RTX 4090", "--seq-len", "2048"],
     dict(model="Qwen/Qwen2.5-7B-Instruct", gpu="RTX 4090", seq_len=2048)),
    (["--model", "Qwen/Qwen2.5-7B", "--method", "full", "--gpu", "RTX 4090", "--keep", "method", "--keep", "sharding"],
     dict(model="Qwen/Qwen2.5-7B", method="full", gpu="RTX 4090", keep=["method", "sharding"])),  # nothing fits
    (FITS, dict(model="Qwen/Qwen2.5-1.5B-Instruct", method="qlora", gpu_vram_gb=16, seq_len=2048)),  # fits already
])
def test_suggest_json_is_the_mcp_tools_structured_content(cli_args, tool_args, capsys):
    """`canifinetune suggest --json` prints the search's whole SuggestResult; suggest_cheaper_config returns the
    same result made small (server/mcp_views.py suggest_view; nothing in it is non-deterministic, so the whole
    object is compared)."""
    from canifinetune.estimator.search import SuggestResult
    from canifinetune.server.mcp_views import suggest_view

    main(["suggest", *cli_args, "--json", "--offline"])
    cli = json.loads(capsys.readouterr().out)
    tool = json.loads(json.dumps(suggest_impl(tool_args).structured_content))
    assert json.loads(json.dumps(suggest_view(SuggestResult.model_validate(cli)))) == tool
    for item in cli["suggestions"]:
        assert {"changes", "cost", "estimate", "plan"} <= set(item) and item["estimate"]["verdict"] == "fits"
        assert item["changes"] and all(set(c) == {"field", "old", "new"} for c in item["changes"])


def test_suggest_text_is_the_mcp_tools_text(capsys):
    """The plain output and the tool's text say the same first: the verdict and the suggestion to apply; the
    tool's is the short form (server/text.py format_suggestions_brief, issue 15.4)."""
    assert main(["suggest", "--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "RTX 4090", "--seq-len", "2048",
                 "--offline"]) == EXIT_OK
    cli = capsys.readouterr().out
    tool = suggest_impl(dict(model="Qwen/Qwen2.5-7B-Instruct", gpu="RTX 4090", seq_len=2048)).content[0].text
    assert cli.splitlines()[:2] == tool.splitlines()[:2] and len(tool) <= 2400
    assert cli.startswith("DOES NOT FIT on RTX 4090") and "apply the first:" in cli.splitlines()[1]


@pytest.mark.parametrize("args, code", [
    (FITS, EXIT_OK),
    (["--model", "Qwen/Qwen2.5-7B-Instruct", "--method", "full", "--gpu", "RTX 4090"], EXIT_DOES_NOT_FIT),
    (["--model", "Qwen/Qwen2.5-7B-Instruct"], EXIT_OK),  # no GPU: no verdict, exit 0
    (["--model", "Qwen/Qwen2.5-1.5B-Instruct", "--gpu", "RTX 4090", "--batch-size", "-1"], EXIT_USAGE),
    (["--model", "Qwen/Qwen2.5-1.5B-Instruct", "--method", "qlorax"], EXIT_USAGE),
    (["--gpu", "RTX 4090"], EXIT_USAGE),
])
def test_exit_codes(args, code, capsys):
    assert main(["estimate", *args, "--offline"]) == code
    err = capsys.readouterr().err
    if code == EXIT_USAGE:
        assert err.startswith("canifinetune: error: ") and err.count("\n") == 1


def test_tight_exit_code(capsys):
    """Some batch size on a 16 GB card lands in the tight band; the CLI says 4 for it."""
    for batch in range(1, 65):
        rc = main(["estimate", "--model", "Qwen/Qwen2.5-1.5B-Instruct", "--gpu-vram-gb", "16", "--batch-size",
                   str(batch), "--json", "--offline"])
        verdict = json.loads(capsys.readouterr().out)["verdict"]
        assert rc == {"fits": EXIT_OK, "tight": EXIT_TIGHT, "does_not_fit": EXIT_DOES_NOT_FIT}[verdict]
        if verdict == "tight":
            return
    pytest.fail("no batch size between 1 and 64 is tight")


def test_models_and_gpus_search_the_catalogs(capsys):
    assert main(["models", "qwen", "7b"]) == EXIT_OK  # unquoted words, as the README shows
    assert "Qwen/Qwen2.5-7B-Instruct" in capsys.readouterr().out
    assert main(["models", "qwen 7b"]) == EXIT_OK
    assert "Qwen/Qwen2.5-7B-Instruct" in capsys.readouterr().out
    assert main(["gpus", "4090", "--json"]) == EXIT_OK
    assert any(g["name"] == "RTX 4090" for g in json.loads(capsys.readouterr().out))
