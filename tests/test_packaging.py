"""Packaging: the wheel installs in a fresh virtual environment and its commands work from there.

Builds the wheel from a copy of the sources (the checkout stays clean), installs it with pip into a new
venv (pydantic, mcp and pyyaml come from the package index or pip's cache), then runs
`canifinetune estimate --offline` and `canifinetune serve` (initialize + tools/list over stdio) from
that venv, and reads the memory-model resource the wheel ships. With uv on PATH it also starts the
server the way the README's `uvx --from <wheel> canifinetune serve` does. About a minute.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ["pyproject.toml", "README.md", "estimator", "recipes", "server", "docs/memory_model.md"]


def test_tests_import_only_the_installed_package():
    """tests/conftest.py refuses the checkout's bare package names; benchmarks/ still imports from the checkout."""
    import importlib

    for name in ("estimator", "recipes", "server"):
        with pytest.raises(ModuleNotFoundError, match=f"import canifinetune.{name}`, not `import {name}`"):
            importlib.import_module(name)
        with pytest.raises(ModuleNotFoundError, match=f"import canifinetune.{name}`"):
            importlib.import_module(f"{name}.errors")
    importlib.import_module("benchmarks.estimate_snapshot")
    from canifinetune.estimator.plan import TrainingPlan

    assert TrainingPlan.__module__ == "canifinetune.estimator.plan"


def test_memory_model_has_one_copy_in_the_checkout():
    """docs/memory_model.md is the one to edit; the wheel's copy is made from it at build time (pyproject.toml)."""
    assert (ROOT / "docs" / "memory_model.md").is_file()
    assert not (ROOT / "server" / "memory_model.md").exists(), "edit docs/memory_model.md; the wheel copies it"


def test_extras_declared():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert {"train", "validate", "test"} <= set(extras)
    assert project["scripts"]["canifinetune"] == "canifinetune.server.cli:main"
    assert not any(d.split(">")[0].split("=")[0].strip() == "torch" for d in project["dependencies"])


def _bin(venv: Path, name: str) -> Path:
    return venv / ("Scripts" if os.name == "nt" else "bin") / (name + (".exe" if os.name == "nt" else ""))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    dist = src / "dist"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                           "-w", str(dist), "-q"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheels = list(dist.glob("canifinetune-*.whl"))
    assert len(wheels) == 1
    return wheels[0]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    env_dir = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True, timeout=120)
    proc = subprocess.run([str(_bin(env_dir, "python")), "-m", "pip", "install", "-q", str(wheel)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return env_dir


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["HF_HUB_OFFLINE"] = "1"
    return env


@pytest.mark.slow
def test_wheel_contents(wheel):
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("canifinetune/server/cli.py", "canifinetune/server/app.py", "canifinetune/docs/memory_model.md",
                   "canifinetune/estimator/data/models.json", "canifinetune/estimator/data/gpus.json",
                   "canifinetune/recipes/render.py", "canifinetune/estimator/configs/combine.py",
                   "canifinetune/server/config_face.py"):
        assert needed in names
    # built from docs/memory_model.md, the only copy; nothing else of docs/ ships
    doc = (ROOT / "docs" / "memory_model.md").read_bytes()
    assert zipfile.ZipFile(wheel).read("canifinetune/docs/memory_model.md") == doc
    assert not [n for n in names if n.startswith("canifinetune/docs/") and n != "canifinetune/docs/memory_model.md"]
    assert "canifinetune/server/memory_model.md" not in names
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    for extra in ("train", "validate", "test"):
        assert f"Provides-Extra: {extra}" in text


@pytest.mark.slow
def test_installed_estimate_runs_offline(venv, tmp_path):
    proc = subprocess.run([str(_bin(venv, "canifinetune")), "estimate", "--model", "Qwen/Qwen2.5-1.5B-Instruct",
                           "--method", "qlora", "--gpu-vram-gb", "16", "--seq-len", "2048", "--offline"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_clean_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("FITS on 16 GB GPU")
    # the installed package is the one that ran, not the checkout
    where = subprocess.run([str(_bin(venv, "python")), "-c", "import canifinetune.server.cli as c; print(c.__file__)"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path, env=_clean_env())
    assert str(venv) in where.stdout


def _stdio_session(command: list[str], cwd: Path) -> dict:
    """initialize + tools/list + the memory-model resource over stdio with a real subprocess."""
    script = (
        "import anyio, json, os, sys\n"
        "from mcp import Client, StdioServerParameters\n"
        "async def main():\n"
        "    params = StdioServerParameters(command=sys.argv[1], args=sys.argv[2:], env=dict(os.environ))\n"
        "    async with Client(params) as c:\n"
        "        tools = [t.name for t in (await c.list_tools()).tools]\n"
        "        doc = (await c.read_resource('canifinetune://docs/memory-model')).contents[0].text\n"
        "        r = await c.call_tool('estimate_memory', {'model': 'Qwen/Qwen2.5-0.5B', 'gpu': 'RTX 4090'})\n"
        "        print(json.dumps({'tools': tools, 'doc': doc, 'verdict': r.structured_content['verdict']}))\n"
        "anyio.run(main)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, *command], capture_output=True, text=True, timeout=180,
                          cwd=cwd, env=_clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_installed_serve_lists_tools_over_stdio(venv, tmp_path):
    out = _stdio_session([str(_bin(venv, "canifinetune")), "serve"], tmp_path)
    assert out["tools"] == ["estimate_memory", "suggest_cheaper_config", "make_recipe"]
    assert out["verdict"] == "fits"
    assert out["doc"] == (ROOT / "docs" / "memory_model.md").read_text(encoding="utf-8")  # the wheel's copy


def _uvx() -> str | None:
    """The real uvx binary (a pyenv shim on PATH may not run in the MCP client's reduced environment)."""
    try:
        from uv import find_uv_bin

        uvx = Path(find_uv_bin()).with_name("uvx" + (".exe" if os.name == "nt" else ""))
        return str(uvx) if uvx.is_file() else None
    except (ImportError, FileNotFoundError):
        return shutil.which("uvx")


@pytest.mark.slow
@pytest.mark.skipif(_uvx() is None, reason="uv is not installed (pip install uv; the [test] extra has it)")
def test_uvx_from_the_wheel_serves(wheel, tmp_path):
    out = _stdio_session([_uvx(), "--from", str(wheel), "canifinetune", "serve"], tmp_path)
    assert out["tools"] == ["estimate_memory", "suggest_cheaper_config", "make_recipe"]
