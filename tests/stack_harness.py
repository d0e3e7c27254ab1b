"""Running a stack's own-code harness (benchmarks/validation/<stack>_fake.py) in that stack's virtual environment, for
its smoke tests (not a test module). The environments are made by ``bash .ci/stack-venvs.sh``; a missing one skips
the test with that command, or fails it where CI asks every independent check to run
(CANIFINETUNE_REQUIRE_INDEPENDENT_CHECKS)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def stack_python(stack: str, venv: str, override: str) -> str:
    """The interpreter of ``venv`` (or the environment variable ``override``); skips or fails when it is missing."""
    python = os.environ.get(override, str(ROOT / venv / "bin" / "python"))
    if not Path(python).exists():
        why = f"{stack}'s environment is missing ({python}); make it with: bash .ci/stack-venvs.sh"
        if os.environ.get("CANIFINETUNE_REQUIRE_INDEPENDENT_CHECKS"):
            pytest.fail(why)
        pytest.skip(why)
    return python


def run_case(python: str, harness: str, case: dict, env: dict[str, str] | None = None, timeout: float = 600) -> dict:
    """``harness --case <case> --out <file>`` run by ``python`` from the repository root, outside this interpreter's
    virtual environment and path; the result JSON it wrote."""
    clean = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        proc = subprocess.run([python, str(ROOT / "benchmarks" / "validation" / harness), "--case", json.dumps(case),
                               "--out", str(out)], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env={**clean, **(env or {})})
        assert out.exists(), (proc.stdout + proc.stderr)[-3000:]
        return json.loads(out.read_text(encoding="utf-8"))
