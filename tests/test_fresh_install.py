"""The README's test command on a fresh machine (issue 15.1): a new virtual environment with nothing in it but
what ``python -m pip install -e ".[test]"`` brings (no torch, no training stack, no Chromium or Node tools
needed), on a copy of the checkout.

There, the whole suite must collect without an error, and a representative selection of test files (the core,
the Hub resolver, the terminal's colours, the MCP server over stdio, and files that need torch, DeepSpeed or
the Node clients) must pass, every test that needs something absent skipping with its reason. Slow (a pip
install: a minute or more, from pip's cache or the configured package index).

The other half of issue 15.1 (no "internal error: ModuleNotFoundError" when huggingface_hub is missing) is
checked here in process.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_packaging import _bin
from test_readme import TESTS

ROOT = Path(__file__).resolve().parent.parent
# A few files of each kind: what the base install runs (core, Hub, colours, MCP over stdio, the wheel), and what
# it skips (torch at module level, torch/DeepSpeed per test, the Node-based MCP clients unless installed).
SELECTION = ["tests/test_plan.py", "tests/test_hub.py", "tests/test_palette.py", "tests/test_mcp_transports.py",
             "tests/test_packaging.py::test_wheel_contents",  # builds the wheel without isolation: setuptools is there
             "tests/test_runtime.py", "tests/test_sharding.py", "tests/test_mcp_inspector.py"]
ABSENT = ("torch", "transformers", "peft", "trl", "bitsandbytes", "deepspeed")


def _copy_checkout(dest: Path) -> None:
    """The files a fresh clone has (tracked, plus new files not ignored), without .venv, caches or builds."""
    try:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                                timeout=60, check=True).stdout.decode().split("\0")
    except (OSError, subprocess.SubprocessError):
        listed = [str(p.relative_to(ROOT)) for name in ("pyproject.toml", "README.md", "estimator", "recipes", "server",
                                                        "tests", "benchmarks", "docs", ".ci")
                  for p in ([ROOT / name] if (ROOT / name).is_file() else (ROOT / name).rglob("*"))
                  if p.is_file() and "__pycache__" not in p.parts]
    for rel in filter(None, listed):
        source = ROOT / rel
        if not source.is_file() or rel.startswith((".venv/", ".ci/node/")):
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def _fresh_env(venv: Path) -> dict:
    # CANIFINETUNE_REQUIRE_INDEPENDENT_CHECKS (exported by .ci/run) turns a missing DeepSpeed into a failure: a bare
    # machine is where those checks skip, so it is not passed on
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTEST_ADDOPTS", "CANIFINETUNE_REQUIRE_INDEPENDENT_CHECKS")}
    env["PATH"] = f"{_bin(venv, 'python').parent}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env["HF_HUB_OFFLINE"] = "1"
    return env


@pytest.mark.slow
def test_the_readme_test_command_on_a_fresh_machine(tmp_path):
    install, run = TESTS.split(" && ")
    assert install == 'python -m pip install -e ".[test]"' and run.startswith("python -m pytest")
    src = tmp_path / "canifinetune"
    _copy_checkout(src)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = _fresh_env(venv)
    proc = subprocess.run(["bash", "-c", install], capture_output=True, text=True, timeout=1200, cwd=src, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    python = str(_bin(venv, "python"))
    absent = subprocess.run([python, "-c", "import importlib.util as u, sys; "
                                           f"print(' '.join(m for m in {ABSENT!r} if u.find_spec(m)))"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert absent.returncode == 0 and absent.stdout.strip() == "", f"not a bare machine: {absent.stdout}"

    collect = subprocess.run([python, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                             capture_output=True, text=True, timeout=900, cwd=src, env=env)
    assert collect.returncode == 0, collect.stdout[-3000:] + collect.stderr[-2000:]
    assert re.search(r"\d+ tests? collected", collect.stdout) and " error" not in collect.stdout.lower()

    proc = subprocess.run([python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *SELECTION],
                          capture_output=True, text=True, timeout=1500, cwd=src, env=env)
    out = proc.stdout
    assert proc.returncode == 0, out[-5000:] + proc.stderr[-2000:]
    skips = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert skips, out[-3000:]  # torch, DeepSpeed and the Node tools are absent: those tests skip...
    for line in skips:  # ...each with its reason
        reason = line.split(": ", 1)[-1] if ": " in line else ""
        assert len(reason.strip()) > 10, line
    assert any("torch" in line for line in skips), skips
    assert re.search(r"\d+ passed", out), out[-3000:]


def test_a_missing_huggingface_hub_is_a_clear_refusal(monkeypatch):
    """A Hub id without huggingface_hub (a broken environment): a refusal naming the package, never
    'internal error: ModuleNotFoundError', on the CLI and through the MCP tool."""
    from canifinetune.estimator.errors import CanIFinetuneError
    from canifinetune.server import hub
    from canifinetune.server.cli import EXIT_USAGE, main

    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(CanIFinetuneError) as info:
        hub.resolve_any("acme/not-in-the-catalog", offline=True)
    assert "pip install huggingface_hub" in str(info.value) and "acme/not-in-the-catalog" in str(info.value)
    assert main(["estimate", "--model", "acme/not-in-the-catalog", "--gpu-vram-gb", "16", "--offline"]) == EXIT_USAGE

    from mcp.server.mcpserver.exceptions import ToolError

    from canifinetune.server.mcp_server import estimate_memory_impl

    with pytest.raises(ToolError) as err:
        estimate_memory_impl({"model": "acme/not-in-the-catalog", "gpu_vram_gb": 16})
    assert "huggingface_hub" in str(err.value) and "internal error" not in str(err.value)


def test_the_test_extra_brings_what_the_tests_import():
    """What every test file imports at module level is a dependency, in the [test] extra, or skipped for."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!\[ ;]", d, maxsplit=1)[0].lower().replace("-", "_")
             for d in project["dependencies"] + project["optional-dependencies"]["test"]}
    assert {"huggingface_hub", "rich", "pytest", "hypothesis", "anyio", "uv"} <= names
    provided = names | {
        "pytest",
        "hypothesis",
        "anyio",
        "mcp",
        "pydantic",
        "yaml",
        "annotated_types",
        "mcp_types",
        "httpx2",
        "uvicorn",
        "starlette",
        "h11",
        "canifinetune",
        "benchmarks",
        "mcp_helpers",
        "hub_server",
        "recipes",
        "_pytest",
    }
    stdlib = set(sys.stdlib_module_names) | {p.stem for p in (ROOT / "tests").glob("*.py")}  # and the tests' own
    for path in sorted((ROOT / "tests").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        skipped = set(re.findall(r"importorskip\(\s*[\"']([\w.]+)", text))
        top = [n for n in ast.parse(text).body if isinstance(n, (ast.Import, ast.ImportFrom))]  # module level only
        modules = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
        modules += [n.module for n in top if isinstance(n, ast.ImportFrom) and n.module and not n.level]
        for module in (m.split(".")[0] for m in modules):
            if module in stdlib or module in provided or module in skipped or module == "__future__":
                continue
            pytest.fail(f"{path.name} imports {module} at module level: add it to the [test] extra or importorskip it")
