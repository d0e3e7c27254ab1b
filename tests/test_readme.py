"""Every command in README.md runs, and does what the README says.

How each is run:
- every line of every ```bash block is run with bash in a scratch folder, `canifinetune` on PATH
  (the current environment's), except the two below; each must exit 0 unless listed in EXPECTED;
- `pip install -e .` is run (slow test) in a fresh virtual environment against a copy of the
  checkout, and the block's estimate command is then run with that environment's `canifinetune`;
- `python -m pip install -e ".[test]" && python -m pytest -q -n auto --dist loadfile` is the command .ci/run
  runs (checked); here
  pytest is run with `--collect-only` (running the suite from inside itself would recurse), and
  tests/test_fresh_install.py runs the whole command in a fresh venv;
- every MCP client snippet (```json blocks with a "command", and the `claude mcp add ... -- CMD` line)
  names a server command: it is started and must answer tools/list over stdio;
- the sample output must be what the sample command prints (same verdict, components, order).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
TOOLS = ["estimate_memory", "suggest_cheaper_config", "make_recipe"]


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README, flags=re.S | re.M)


def _commands() -> list[str]:
    lines = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                lines.append(line.strip())
    return lines


INSTALL = "pip install -e ."
TESTS = 'python -m pip install -e ".[test]" && python -m pytest -q -n auto --dist loadfile'


def _train_ok(proc: subprocess.CompletedProcess) -> bool:
    """`train --probe` runs on a CUDA machine with the [train] extra; elsewhere it must refuse at once, clearly."""
    if proc.returncode == 0:
        return True
    return proc.returncode == 2 and ("CUDA" in proc.stderr or "[train]" in proc.stderr)


EXPECTED = {"canifinetune train ": _train_ok}


def test_the_readme_has_the_commands_it_promises():
    cmds = _commands()
    assert INSTALL in cmds and TESTS in cmds
    assert any(c.startswith("canifinetune estimate ") and "--offline" in c for c in cmds)
    assert any(c.startswith("canifinetune recipe ") for c in cmds)
    assert TESTS in (ROOT / ".ci" / "run").read_text()


@pytest.fixture(scope="module")
def path_with_cli(tmp_path_factory) -> str:
    """PATH with a `canifinetune` that runs this checkout's CLI in the current interpreter."""
    bindir = tmp_path_factory.mktemp("bin")
    shim = bindir / "canifinetune"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m canifinetune.server.cli "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    return f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"


def _env(path: str) -> dict:
    env = {**os.environ, "PATH": path, "HF_HUB_OFFLINE": "1"}
    env.pop("VIRTUAL_ENV", None)
    return env


def _block_commands() -> list[list[str]]:
    """Each bash block's commands, in order (a block's lines share one folder: later ones use earlier output)."""
    return [
        [c for c in _commands() if c in block.splitlines() and c not in (INSTALL, TESTS)] for block in _blocks("bash")
    ]


@pytest.mark.parametrize("block", [b for b in _block_commands() if b], ids=lambda b: b[0][:60])
def test_readme_commands_run(block, path_with_cli, tmp_path):
    for command in block:
        proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                              env=_env(path_with_cli), stdin=subprocess.DEVNULL)
        check = next((f for prefix, f in EXPECTED.items() if command.startswith(prefix)), None)
        if check is None:
            assert proc.returncode == 0, f"{command}\nexit {proc.returncode}\n{proc.stderr[-2000:]}"
            assert proc.stdout.strip()
        else:
            assert check(proc), f"{command}\nexit {proc.returncode}\n{proc.stderr[-2000:]}"


def test_recipe_run_writes_what_the_readme_says(path_with_cli, tmp_path):
    recipe = next(c for c in _commands() if c.startswith("canifinetune recipe "))
    subprocess.run(["bash", "-c", recipe], check=True, capture_output=True, cwd=tmp_path, env=_env(path_with_cli),
                   timeout=120)
    out = Path(tmp_path, shlex.split(recipe)[shlex.split(recipe).index("--out") + 1])
    for name in ("recipe.yaml", "launch.sh", "requirements.txt", "ESTIMATE.txt", "estimate.json"):
        assert (out / name).is_file(), name
        assert name in README


def test_test_command_collects(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert re.search(r"\d+ tests? collected", proc.stdout)


def test_sample_output_is_what_the_command_prints(path_with_cli, tmp_path):
    estimate = next(c for c in _commands() if c.startswith("canifinetune estimate "))
    sample = next(b for b in _blocks("text") if b.startswith(("FITS", "TIGHT", "DOES NOT FIT")))
    proc = subprocess.run(["bash", "-c", estimate], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=_env(path_with_cli))
    real = proc.stdout

    def shape(text: str) -> list[str]:  # the verdict word and the component names, in order (not the numbers)
        first = text.splitlines()[0].split(":")[0]
        names = re.findall(r"^  ([a-z_]+) +\d", text, flags=re.M)
        return [first, *names]

    assert shape(sample) == shape(real)
    assert sample.splitlines()[1] == real.splitlines()[1]  # the plan line
    assert sample.rstrip().splitlines()[-1] == real.rstrip().splitlines()[-1]  # the next move


# ------------------------------------------------------------------------------ the MCP client snippets


def _server_commands() -> list[list[str]]:
    found = []
    for block in _blocks("json"):
        data = json.loads(block)
        for servers in (data.get("mcpServers"), data.get("servers")):
            for entry in (servers or {}).values():
                found.append([entry["command"], *entry.get("args", [])])
    for block in _blocks("text"):
        for line in block.splitlines():
            if line.startswith("claude mcp add ") and " -- " in line:
                found.append(shlex.split(line.split(" -- ", 1)[1]))
    return found


def test_every_client_snippet_names_a_server_command():
    commands = _server_commands()
    assert len(commands) == 4  # Claude Desktop, Claude Code, VS Code, Cursor
    assert all(c == ["canifinetune", "serve"] for c in commands), commands


@pytest.mark.parametrize("command", sorted({tuple(c) for c in _server_commands()}))
def test_client_snippet_server_answers_tools_list(command, path_with_cli, tmp_path):
    exe = shutil.which(command[0], path=path_with_cli)
    assert exe, command
    script = (
        "import anyio, os, sys\n"
        "from mcp import Client, StdioServerParameters\n"
        "async def main():\n"
        "    async with Client(StdioServerParameters(command=sys.argv[1], args=sys.argv[2:],"
        " env=dict(os.environ))) as c:\n"
        "        print(' '.join(t.name for t in (await c.list_tools()).tools))\n"
        "anyio.run(main)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, exe, *command[1:]], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=_env(path_with_cli))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == TOOLS


# ------------------------------------------------------------------------------ the install command


@pytest.mark.slow
def test_install_command_in_a_fresh_venv(tmp_path):
    """`pip install -e .` on a copy of the checkout in a new venv, then the README's estimate from there."""
    src = tmp_path / "canifinetune"
    src.mkdir()
    for name in (
        "pyproject.toml",
        "README.md",
        "estimator",
        "recipes",
        "server",
        "docs",
    ):  # docs: memory_model.md ships
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(ROOT / name, src / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    path = f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**_env(path), "VIRTUAL_ENV": str(venv)}
    env.pop("PYTHONPATH", None)
    install = subprocess.run(["bash", "-c", INSTALL], capture_output=True, text=True, timeout=600, cwd=src, env=env)
    assert install.returncode == 0, install.stderr[-3000:]
    assert shutil.which("canifinetune", path=str(venv / "bin"))
    estimate = next(c for c in _commands() if c.startswith("canifinetune estimate "))
    proc = subprocess.run(["bash", "-c", estimate], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("FITS")
