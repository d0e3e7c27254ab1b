"""Benchmark of the MCP server over stdio (a benchmark, not a timed test).

1. Cold start: from spawning the process to the answer of the first `tools/list` (after `initialize`),
   for `canifinetune serve` and for a bare MCPServer with one trivial tool, measured alternately in the
   same run; the figure is the ratio of the medians (goal <= 1.3x).
2. Round trip: the p50 (and p90) of `estimate_memory` calls over stdio in one warm session (goal <= 5 ms).

Raw newline-delimited JSON-RPC over the pipes, so the client adds nothing.

    python benchmarks/bench_mcp.py [--starts 7] [--calls 300]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

SERVER = [sys.executable, "-m", "canifinetune.server.cli", "serve"]
BARE = [sys.executable, "-c", (
    "from mcp.server import MCPServer\n"
    "mcp = MCPServer('bare')\n"
    "@mcp.tool()\n"
    "def ping(x: int = 0) -> str:\n"
    "    return 'pong'\n"
    "mcp.run()\n"
)]
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}
CALL_ARGS = {"model": "Qwen/Qwen2.5-7B-Instruct", "gpu": "RTX 4090", "seq_len": 2048}


class Session:
    def __init__(self, cmd: list[str]):
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, bufsize=1)
        self.next_id = 1

    def send(self, message: dict) -> None:
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def request(self, method: str, params: dict | None = None) -> dict:
        self.next_id += 1
        rid = self.next_id
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, **({"params": params} if params else {})})
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the server closed stdout while waiting for {method}")
            msg = json.loads(line)
            if msg.get("id") == rid:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg["result"]

    def initialize(self) -> None:
        self.send(INIT)
        while json.loads(self.proc.stdout.readline()).get("id") != 1:
            pass
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def cold_start(cmd: list[str]) -> float:
    s = Session(cmd)
    s.initialize()
    tools = s.request("tools/list")["tools"]
    elapsed = time.perf_counter() - s.t0
    assert tools
    s.close()
    return elapsed


def round_trips(calls: int) -> list[float]:
    s = Session(SERVER)
    s.initialize()
    s.request("tools/list")
    for _ in range(20):  # warm up: imports of the first call, caches
        s.request("tools/call", {"name": "estimate_memory", "arguments": CALL_ARGS})
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        result = s.request("tools/call", {"name": "estimate_memory", "arguments": CALL_ARGS})
        times.append(time.perf_counter() - t)
        assert not result.get("isError"), result
    s.close()
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=7, help="cold starts of each server (alternating)")
    parser.add_argument("--calls", type=int, default=300, help="estimate_memory calls for the round trip")
    args = parser.parse_args(argv)

    cold_start(BARE), cold_start(SERVER)  # warm the OS file cache and .pyc files
    ours, bare = [], []
    for _ in range(args.starts):
        bare.append(cold_start(BARE))
        ours.append(cold_start(SERVER))
    ratio = statistics.median(ours) / statistics.median(bare)
    print(f"cold start to first tools/list (median of {args.starts}): canifinetune serve "
          f"{statistics.median(ours) * 1000:.0f} ms, bare MCPServer {statistics.median(bare) * 1000:.0f} ms, "
          f"ratio {ratio:.2f}x (goal <= 1.3x)")

    times = sorted(round_trips(args.calls))
    p50 = statistics.median(times) * 1000
    p90 = times[int(0.9 * (len(times) - 1))] * 1000
    print(f"estimate_memory round trip over stdio ({args.calls} calls): p50 {p50:.2f} ms, p90 {p90:.2f} ms "
          f"(goal p50 <= 5 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
