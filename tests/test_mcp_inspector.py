"""The MCP Inspector CLI (npm @modelcontextprotocol/inspector 2.12.0) against the real server over stdio.

`tools/list --strict` checks the schemas' portability across clients; one `tools/call` per tool.
Needs `.ci/install-node-tools.sh` (run by .ci/run); skipped with the reason when the tools are absent.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from mcp_helpers import INSPECTOR, MISSING_NODE_TOOLS, NODE24, ROOT, http_server

pytestmark = pytest.mark.skipif(not (INSPECTOR.is_file() and NODE24.is_file()), reason=MISSING_NODE_TOOLS)

STDIO = [sys.executable, "-m", "canifinetune.server.cli", "serve"]


def inspector(*args: str, target: list[str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [str(NODE24), str(INSPECTOR), "--cli", *(target or STDIO), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_tools_list_strict():
    proc = inspector("--method", "tools/list", "--strict")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warning" not in proc.stderr.lower(), proc.stderr
    tools = {t["name"]: t for t in json.loads(proc.stdout)["tools"]}
    assert set(tools) == {"estimate_memory", "suggest_cheaper_config", "make_recipe"}
    assert all(t["annotations"]["readOnlyHint"] and t["outputSchema"] for t in tools.values())


def call(tool: str, arguments: dict) -> subprocess.CompletedProcess:
    return inspector("--method", "tools/call", "--tool-name", tool, "--tool-args-json", json.dumps(arguments),
                     "--format", "json", "-q")


def test_call_estimate_memory():
    proc = call("estimate_memory", {"model": "Qwen/Qwen2.5-7B-Instruct", "gpu": "RTX 4090", "seq_len": 2048})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)["result"]
    assert result["structuredContent"]["plan"]["seq_len"] == 2048
    assert result["content"][0]["text"].split(" ")[0] in ("FITS", "TIGHT", "DOES")


def test_call_suggest_cheaper_config():
    proc = call("suggest_cheaper_config", {"model": "Qwen/Qwen2.5-7B", "method": "full", "gpu": "RTX 4090"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)["result"]
    out = result["structuredContent"]
    assert out["original"]["verdict"] == "does_not_fit" and out["suggestions"]
    first = out["suggestions"][0]
    assert first["estimate"]["verdict"] == "fits" and first["cost"]["summary"]
    assert first["changes"] and all(set(c) == {"field", "old", "new"} for c in first["changes"])
    assert "apply the first:" in result["content"][0]["text"]


def test_call_make_recipe():
    proc = call("make_recipe", {"model": "Qwen/Qwen2.5-0.5B", "gpu": "RTX 4090", "dataset": "data.jsonl"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["result"]["structuredContent"]["verdict"] == "fits"


def test_tool_error_exits_5_with_the_message():
    proc = call("estimate_memory", {"model": "Qwen/Qwen2.5-7B", "gpu": "rtx 4900"})
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "RTX 4090" in proc.stdout + proc.stderr


def test_tools_list_over_http():
    with http_server() as (url, _):
        proc = inspector("--method", "tools/list", target=[url])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(json.loads(proc.stdout)["tools"]) == 3
