"""The official MCP conformance suite (npm @modelcontextprotocol/conformance, on Node 24) against
`canifinetune serve --http`: every server scenario, with tests/conformance-baseline.yml naming the
scenarios only the SDKs' fixture server can pass. The suite exits non-zero on a new failure and on a
baseline entry that has started to pass. Needs `.ci/install-node-tools.sh` (run by .ci/run).
"""

from __future__ import annotations

import subprocess

import pytest
from mcp_helpers import CONFORMANCE, MISSING_NODE_TOOLS, NODE24, ROOT, http_server

pytestmark = pytest.mark.skipif(not (CONFORMANCE.is_file() and NODE24.is_file()), reason=MISSING_NODE_TOOLS)

BASELINE = ROOT / "tests" / "conformance-baseline.yml"
# Scenarios that apply to any server: each must pass on its own (not only as part of the suite).
ANY_SERVER = ["server-initialize", "ping", "tools-list", "tools-call-error", "completion-complete",
              "resources-list", "prompts-list", "dns-rebinding-protection"]


def conformance(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(NODE24), str(CONFORMANCE), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_full_server_suite_against_baseline(tmp_path):
    with http_server() as (url, _):
        proc = conformance("server", "--url", url, "--suite", "all", "--expected-failures", str(BASELINE),
                           "-o", str(tmp_path))
    summary = proc.stdout[proc.stdout.find("=== SUMMARY ==="):]
    assert proc.returncode == 0, summary + proc.stderr[-3000:]


@pytest.mark.parametrize("scenario", ANY_SERVER)
def test_scenario_that_applies_to_any_server(scenario, tmp_path):
    with http_server() as (url, _):
        proc = conformance("server", "--url", url, "--scenario", scenario, "-o", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "0 failed" in proc.stdout


def test_baseline_names_only_known_scenarios():
    import yaml

    listed = conformance("list", "--server").stdout
    known = {line.strip()[2:].split(" ")[0] for line in listed.splitlines() if line.strip().startswith("- ")}
    baseline = yaml.safe_load(BASELINE.read_text())["server"]
    assert set(baseline) <= known, set(baseline) - known
    assert not set(baseline) & set(ANY_SERVER)
