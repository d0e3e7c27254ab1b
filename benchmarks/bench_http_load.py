"""Load benchmark: `canifinetune serve --http` on 127.0.0.1 under many concurrent MCP clients.

Starts the server as a subprocess on a free 127.0.0.1 port, opens ``--clients`` sessions with the MCP
SDK's own streamable-HTTP client (all initialized before the first call, so they really are concurrent),
then each client makes ``--calls`` tool calls, mixed across estimate_memory, suggest_cheaper_config and
make_recipe on varied catalog models and GPUs (valid inputs: any tool error counts as an error). Prints
errors (goal 0), p50/p99/max call latency as the clients saw it, throughput, and the server's peak
RSS (VmHWM from /proc, or psutil). Localhost only; bounded; stops the server by itself. Exit status 1
when any call failed.

    python benchmarks/bench_http_load.py                      # 200 clients x 20 calls
    python benchmarks/bench_http_load.py --clients 20 --calls 5 --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "meta-llama/Llama-3.1-8B", "google/gemma-2-9b-it",
          "mistralai/Mistral-7B-v0.3", "microsoft/Phi-3.5-mini-instruct", "Qwen/Qwen3-14B", "meta-llama/Llama-3.1-70B"]
GPUS = ["RTX 4090", "RTX 3060 12GB", "A100 80GB SXM", "L4", "H100 SXM", "RTX 5090"]
MIX = [("estimate_memory", 6), ("suggest_cheaper_config", 2), ("make_recipe", 2)]  # weights


def call_plan(client_no: int, calls: int, seed: int = 0) -> list[tuple[str, dict]]:
    """The calls one client makes: deterministic for a (seed, client) pair."""
    rng = random.Random(seed * 1_000_003 + client_no)
    tools = [t for t, w in MIX for _ in range(w)]
    out = []
    for _ in range(calls):
        tool = rng.choice(tools)
        args = {"model": rng.choice(MODELS), "gpu": rng.choice(GPUS), "method": rng.choice(["lora", "qlora", "full"]),
                "seq_len": rng.choice([512, 1024, 2048, 4096]), "batch_size": rng.choice([1, 2, 4, 8])}
        if args["method"] != "full":  # not every family has PEFT default modules, or q_proj (Phi-3 fuses qkv_proj)
            args["target_modules"] = "all-linear"
        if tool == "suggest_cheaper_config" and rng.random() < 0.5:
            args["keep"] = ["model", "gpu", "seq_len"]
        out.append((tool, args))
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peak_rss_bytes(pid: int) -> int | None:
    """The process's peak resident set size (VmHWM), or its current RSS via psutil where /proc is missing."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil

        return psutil.Process(pid).memory_info().rss
    except Exception:  # psutil missing or the process gone
        return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time the process has used (/proc/<pid>/stat), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def current_rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def wait_listening(proc: subprocess.Popen, port: int, log, timeout: float = 30.0) -> None:
    """Return once ``proc`` accepts connections on 127.0.0.1:``port``; raise with its log if it exits or never does."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"the server exited with {proc.returncode}: {log.read()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        if time.monotonic() > deadline:
            raise RuntimeError("the server did not start listening")
        time.sleep(0.05)


@contextlib.contextmanager
def serve_process(cmd: list[str], port: int, timeout: float = 30.0, prefix: str = "canifinetune-load-"):
    """``cmd`` (a server) as a subprocess listening on 127.0.0.1:``port``, stopped on exit; yields the process and
    the name of its stderr log (kept after it stops)."""
    # closed in the finally below, after the server stops; its name outlives it (delete=False)
    log = tempfile.NamedTemporaryFile("w+", prefix=prefix, suffix=".err", delete=False)  # noqa: SIM115
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # catalog models only: the benchmark never leaves this machine
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT, env=env)
    try:
        wait_listening(proc, port, log, timeout)
        yield proc, log.name
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


@contextlib.contextmanager
def serve_http(port: int, extra: list[str] | None = None, timeout: float = 30.0):
    cmd = [sys.executable, "-m", "canifinetune.server.cli", "serve", "--http", "--host", "127.0.0.1",
           "--port", str(port)] + (extra or [])
    with serve_process(cmd, port, timeout) as served:
        yield served


def raise_open_file_limit(needed: int) -> None:
    """Raise this process's soft open-file limit to ``needed`` where the hard limit allows (each MCP client holds two
    connections: a POST one and its GET stream)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed if hard == resource.RLIM_INFINITY else min(needed, hard),
                                                        hard))


async def run_clients(url: str, clients: int, calls: int, seed: int, call_timeout: float,
                      plan_for=None) -> dict:
    """``clients`` sessions, all opened before the first call, each making its calls: ``plan_for(client_no)`` (default:
    ``call_plan``, ``calls`` of the mix)."""
    import anyio
    from mcp import Client

    raise_open_file_limit(4 * clients + 256)

    latencies: list[float] = []
    opened: list[float] = []
    errors: list[str] = []
    ready = anyio.Event()
    ready_count = 0

    async def one_client(no: int) -> None:
        nonlocal ready_count
        plan = plan_for(no) if plan_for is not None else call_plan(no, calls, seed)
        t0 = time.perf_counter()
        try:
            async with Client(url) as client:
                opened.append(time.perf_counter() - t0)
                ready_count += 1
                if ready_count == clients:
                    ready.set()
                await ready.wait()
                for tool, args in plan:
                    start = time.perf_counter()
                    try:
                        with anyio.fail_after(call_timeout):
                            result = await client.call_tool(tool, args)
                    except Exception as exc:  # a timeout, a dropped connection, a protocol error
                        errors.append(f"{tool}: {type(exc).__name__}: {exc}"[:300])
                        continue
                    latencies.append(time.perf_counter() - start)
                    if result.is_error:
                        text = " ".join(getattr(c, "text", "") for c in result.content)
                        errors.append(f"{tool} {json.dumps(args)}: {text}"[:300])
        except Exception as exc:  # the session itself failed (opening it, its GET stream, or closing it)
            errors.append(f"client {no}: {_innermost(exc)}"[:300])
            ready_count += 1
            if ready_count == clients:
                ready.set()

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for no in range(clients):
            tg.start_soon(one_client, no)
    wall = time.perf_counter() - start
    return {"latencies": latencies, "opened": opened, "errors": errors, "wall_s": wall}


def _innermost(exc: BaseException) -> str:
    """'Type: message' of the first exception an ExceptionGroup (anyio's task groups) wraps, at any depth, with the
    groups it came through: a session's failure is in the leaf, not in 'unhandled errors in a TaskGroup'."""
    path = []
    while getattr(exc, "exceptions", None):  # an ExceptionGroup (the exceptiongroup backport's on Python 3.10)
        inner = exc.exceptions  # type: ignore[attr-defined]
        path.append(f"{type(exc).__name__}({len(inner)})")
        exc = inner[0]
    return " > ".join([*path, f"{type(exc).__name__}: {exc}"])


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run(clients: int = 200, calls: int = 20, seed: int = 0, call_timeout: float = 120.0) -> dict:
    """Start the server, run the load, stop the server; the figures as a dict."""
    import anyio

    port = free_port()
    with serve_http(port) as (proc, log_path):
        idle_rss = current_rss_bytes(proc.pid)
        cpu0, client_cpu0 = cpu_seconds(proc.pid), time.process_time()
        out = anyio.run(run_clients, f"http://127.0.0.1:{port}/mcp", clients, calls, seed, call_timeout)
        cpu1, client_cpu1 = cpu_seconds(proc.pid), time.process_time()
        peak = peak_rss_bytes(proc.pid)
        alive = proc.poll() is None
    lat = out["latencies"]
    errors = len(out["errors"]) + (0 if alive else 1)
    if errors == 0:  # keep the server's log only when something went wrong
        Path(log_path).unlink(missing_ok=True)
        log_path = None
    return {
        "clients": clients, "calls_per_client": calls, "calls_expected": clients * calls, "calls_answered": len(lat),
        "errors": errors, "error_samples": out["errors"][:5],
        "server_alive_after": alive,
        "p50_ms": _pct(lat, 0.50) * 1000, "p99_ms": _pct(lat, 0.99) * 1000,
        "max_ms": max(lat, default=float("nan")) * 1000,
        "mean_ms": (statistics.fmean(lat) * 1000) if lat else float("nan"),
        "session_open_p50_ms": _pct(out["opened"], 0.50) * 1000,
        "session_open_p99_ms": _pct(out["opened"], 0.99) * 1000,
        "wall_s": out["wall_s"], "calls_per_s": len(lat) / out["wall_s"] if out["wall_s"] else float("nan"),
        "server_cpu_s": (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None,
        "client_cpu_s": client_cpu1 - client_cpu0, "cpus": os.cpu_count(),
        "server_idle_rss_mib": idle_rss / 2**20 if idle_rss else None,
        "server_peak_rss_mib": peak / 2**20 if peak else None,
        "server_log": log_path,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--calls", type=int, default=20, help="calls per client")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds one call may take before it counts as an error")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    r = run(args.clients, args.calls, args.seed, args.timeout)
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        print(f"{r['clients']} clients x {r['calls_per_client']} calls = {r['calls_expected']} calls "
              f"(mix: {', '.join(f'{t} {w}0%' for t, w in MIX)}) on 127.0.0.1")
        print(f"errors:        {r['errors']} (goal 0)"
              + (f"  e.g. {r['error_samples'][0]}" if r["error_samples"] else ""))
        print(f"latency:       p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, max {r['max_ms']:.1f} ms "
              f"(session open p50 {r['session_open_p50_ms']:.0f} ms, p99 {r['session_open_p99_ms']:.0f} ms)")
        print(f"throughput:    {r['calls_per_s']:.0f} calls/s over {r['wall_s']:.1f} s")
        if r["server_cpu_s"] is not None and r["calls_answered"]:
            print(f"cpu:           server {r['server_cpu_s']:.1f} s "
                  f"({r['server_cpu_s'] * 1000 / r['calls_answered']:.1f} ms "
                  f"per call), clients {r['client_cpu_s']:.1f} s, on {r['cpus']} CPUs (clients and server share them)")
        idle = f"{r['server_idle_rss_mib']:.0f} MiB idle, " if r["server_idle_rss_mib"] else ""
        peak = f"{r['server_peak_rss_mib']:.0f} MiB" if r["server_peak_rss_mib"] else "unknown"
        print(f"server memory: {idle}peak RSS {peak}")
        print(f"server alive:  {r['server_alive_after']}" + (f" (log: {r['server_log']})" if r["server_log"] else ""))
    return 0 if r["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
