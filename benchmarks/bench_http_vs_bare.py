"""canifinetune over streamable HTTP against a bare MCP SDK server serving canned answers of the same size.

What does serving canifinetune cost beyond the MCP SDK itself? For each client count, this starts
``canifinetune serve --http --offline`` and then a bare SDK server (``MCPServer`` with three tools of the same
names and output schemas, each returning canifinetune's own answer to a typical call, recorded beforehand) on
free 127.0.0.1 ports, served the same way (the same uvicorn configuration: protocol, connection cap, keep-alive,
header limits, no access log; the same Host check and body limit), and drives both with the same load: every
client opens its session before the first call, then makes ``--calls`` calls (bench_http_load.py's harness).

Workloads:

* ``repeat`` (default): every call is the typical call of its tool (the tool mix of bench_http_load.py), so the
  answers are the very ones the bare server sends; canifinetune answers all but the first of each from its cache.
* ``mix``: bench_http_load.py's varied calls (8 models, 6 GPUs, three methods, ...), mostly distinct, so
  canifinetune computes most of them; the bare server answers each tool's typical answer.

Prints, per client count: calls answered, errors, throughput, p50/p99 latency and server CPU per call of both,
and the ratios (canifinetune / bare: throughput goal >= 0.8, p99 goal <= 1.5). Localhost only; bounded; stops
both servers. Clients and servers share this machine's CPUs, so the figures vary from run to run: ``--rounds N``
measures each side N times per client count (alternating which goes first) and prints the medians.

    python benchmarks/bench_http_vs_bare.py                          # 20, 100, 200 clients x 20 calls, repeat
    python benchmarks/bench_http_vs_bare.py --rounds 3                # medians of three runs per side
    python benchmarks/bench_http_vs_bare.py --workload mix --calls 10 --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_http_load import (  # noqa: E402
    MIX,
    _pct,
    call_plan,
    cpu_seconds,
    free_port,
    run_clients,
    serve_process,
)
from benchmarks.bench_mcp_tokens import TYPICAL  # noqa: E402

LEVELS = (20, 100, 200)
THROUGHPUT_GOAL = 0.8  # canifinetune's calls/s at least this share of the bare server's
P99_GOAL = 1.5  # canifinetune's p99 latency at most this multiple of the bare server's


def record_answers() -> dict[str, dict]:
    """canifinetune's answer (the CallToolResult as JSON) to the typical call of each tool, offline."""
    import anyio
    from mcp import Client

    from canifinetune.server.mcp_server import build_server

    async def record() -> dict[str, dict]:
        out = {}
        async with Client(build_server(offline=True)) as client:
            for tool, args in TYPICAL.items():
                result = await client.call_tool(tool, args)
                if result.is_error:
                    raise RuntimeError(f"{tool}: {result.content}")
                out[tool] = result.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"meta"})
        return out

    return anyio.run(record)


def bare_server(answers: dict[str, dict]):
    """A bare MCPServer: three tools of canifinetune's names and output schemas, each answering its canned result."""
    from mcp.server import MCPServer
    from mcp.types import CallToolResult

    from canifinetune.server.mcp_views import EstimateView, RecipeView, SuggestView, compact_schema, output_model

    canned = {tool: CallToolResult.model_validate(answer) for tool, answer in answers.items()}
    mcp = MCPServer("bare", log_level="WARNING")
    views = {"estimate_memory": EstimateView, "suggest_cheaper_config": SuggestView, "make_recipe": RecipeView}

    def tool(name: str):
        result = canned[name]

        def fn(model: str = "", gpu: str = "", method: str | None = None, seq_len: int | None = None,
               batch_size: int | None = None, target_modules: str | None = None, keep: list[str] | None = None,
               dataset: str | None = None):
            return result

        fn.__name__ = name
        fn.__annotations__["return"] = Annotated[CallToolResult, output_model(views[name])]
        return fn

    for name in views:
        mcp.add_tool(tool(name), name=name)
    for t in mcp._tool_manager.list_tools():  # the same (compacted) output schemas as canifinetune's
        if t.fn_metadata.output_schema is not None:
            compact_schema(t.fn_metadata.output_schema, arguments=False)
    return mcp


def serve_bare(port: int, answers_path: str) -> None:
    """Serve the bare server on 127.0.0.1:``port`` the way canifinetune serves itself (mcp_server.uvicorn_config)."""
    import anyio
    import uvicorn

    from canifinetune.server.mcp_server import MAX_REQUEST_BODY_BYTES, transport_security, uvicorn_config

    mcp = bare_server(json.loads(Path(answers_path).read_text()))
    app = mcp.streamable_http_app(transport_security=transport_security("127.0.0.1", port), host="127.0.0.1",
                                  max_request_body_size=MAX_REQUEST_BODY_BYTES)
    anyio.run(uvicorn.Server(uvicorn_config(app, "127.0.0.1", port)).serve)


@contextlib.contextmanager
def server(side: str, port: int, answers_path: str, timeout: float = 60.0):
    """canifinetune (``serve --http --offline``) or the bare server, as a subprocess on 127.0.0.1:``port``."""
    if side == "canifinetune":
        cmd = [sys.executable, "-m", "canifinetune.server.cli", "serve", "--http", "--offline", "--host", "127.0.0.1",
               "--port", str(port)]
    else:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-bare", str(port), answers_path]
    with serve_process(cmd, port, timeout, prefix=f"canifinetune-{side}-") as (proc, _log):
        yield proc


def plans(workload: str, calls: int, seed: int):
    """The calls of client ``no``: the mix's tools with their typical arguments (repeat), or the mix's own calls."""
    if workload == "mix":
        return lambda no: call_plan(no, calls, seed)
    return lambda no: [(tool, dict(TYPICAL[tool])) for tool, _ in call_plan(no, calls, seed)]


async def probe_bytes(url: str) -> int:
    """The bytes of the answers to the three typical calls, as a client receives them."""
    from mcp import Client

    total = 0
    async with Client(url) as client:
        for tool, args in TYPICAL.items():
            result = await client.call_tool(tool, args)
            total += len(result.model_dump_json(by_alias=True, exclude_none=True, exclude={"meta"}))
    return total


def measure(side: str, clients: int, calls: int, workload: str, seed: int, answers_path: str,
            call_timeout: float) -> dict:
    import anyio

    port = free_port()
    with server(side, port, answers_path) as proc:
        url = f"http://127.0.0.1:{port}/mcp"
        size = anyio.run(probe_bytes, url)
        cpu0 = cpu_seconds(proc.pid)
        out = anyio.run(run_clients, url, clients, calls, seed, call_timeout, plans(workload, calls, seed))
        cpu1 = cpu_seconds(proc.pid)
        alive = proc.poll() is None
    lat = out["latencies"]
    return {"calls_answered": len(lat), "errors": len(out["errors"]) + (0 if alive else 1),
            "error_samples": out["errors"][:3], "calls_per_s": len(lat) / out["wall_s"] if out["wall_s"] else 0.0,
            "p50_ms": _pct(lat, 0.50) * 1000, "p99_ms": _pct(lat, 0.99) * 1000, "wall_s": out["wall_s"],
            "server_cpu_ms_per_call": ((cpu1 - cpu0) * 1000 / len(lat)) if lat and cpu0 is not None
            and cpu1 is not None else None,
            "answer_bytes": size}


def _median_run(runs: list[dict]) -> dict:
    """One side's figures over its rounds: the median of each, errors summed (calls answered and errors in all)."""
    import statistics

    out = dict(runs[0])
    for key in ("calls_per_s", "p50_ms", "p99_ms", "wall_s", "server_cpu_ms_per_call"):
        values = [r[key] for r in runs if r[key] is not None]
        out[key] = statistics.median(values) if values else None
    out["calls_answered"] = sum(r["calls_answered"] for r in runs)
    out["errors"] = sum(r["errors"] for r in runs)
    out["error_samples"] = [e for r in runs for e in r["error_samples"]][:3]
    out["rounds"] = [{k: r[k] for k in ("calls_per_s", "p50_ms", "p99_ms", "server_cpu_ms_per_call")} for r in runs]
    return out


def run(levels=LEVELS, calls: int = 20, workload: str = "repeat", seed: int = 0, repeat: bool | None = None,
        call_timeout: float = 120.0, rounds: int = 1) -> dict:
    """Both servers at each client count, ``rounds`` times (alternating which goes first; the medians); the figures
    and ratios as a dict. ``repeat``: shorthand for the workload."""
    if repeat is not None:
        workload = "repeat" if repeat else "mix"
    answers = record_answers()
    rows = []
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="canifinetune-bare-") as tmp:
        answers_path = str(Path(tmp) / "answers.json")
        Path(answers_path).write_text(json.dumps(answers))
        for clients in levels:
            row: dict = {"clients": clients, "calls_per_client": calls}
            runs: dict[str, list[dict]] = {"bare": [], "canifinetune": []}
            for n in range(rounds):
                for side in ("bare", "canifinetune") if n % 2 == 0 else ("canifinetune", "bare"):
                    runs[side].append(measure(side, clients, calls, workload, seed, answers_path, call_timeout))
                    sizes[side] = runs[side][-1]["answer_bytes"]
                    time.sleep(0.5)
            for side, side_runs in runs.items():
                row[side] = _median_run(side_runs)
            ours, bare = row["canifinetune"], row["bare"]
            row["throughput_ratio"] = ours["calls_per_s"] / bare["calls_per_s"] if bare["calls_per_s"] else 0.0
            row["p99_ratio"] = ours["p99_ms"] / bare["p99_ms"] if bare["p99_ms"] else 0.0
            rows.append(row)
    return {"workload": workload, "rounds": rounds, "rows": rows, "answer_bytes": sizes, "cpus": os.cpu_count(),
            "goals": {"throughput_ratio": THROUGHPUT_GOAL, "p99_ratio": P99_GOAL}}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve-bare"]:
        serve_bare(int(argv[1]), argv[2])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="client counts, comma-separated")
    parser.add_argument("--calls", type=int, default=20, help="calls per client")
    parser.add_argument("--workload", choices=("repeat", "mix"), default="repeat")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure each side this many times per client count (medians are printed)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds one call may take")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    r = run(levels, args.calls, args.workload, args.seed, call_timeout=args.timeout, rounds=max(1, args.rounds))
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        print(f"workload {r['workload']} (mix: {', '.join(f'{t} {w}0%' for t, w in MIX)}), on 127.0.0.1, "
              f"{r['cpus']} CPUs shared by clients and servers; answers to the typical calls: "
              f"{r['answer_bytes'].get('canifinetune')} bytes (canifinetune), {r['answer_bytes'].get('bare')} (bare)")
        print(f"{r['rounds']} round(s) per side and client count: medians")
        print(f"{'clients':>7} {'calls':>6}  {'side':<13}{'answered':>9}{'errors':>7}{'calls/s':>9}{'p50 ms':>9}"
              f"{'p99 ms':>9}{'cpu ms':>8}   ratio (goal)")
        for row in r["rows"]:
            for side in ("bare", "canifinetune"):
                f = row[side]
                ratio = ""
                if side == "canifinetune":
                    ratio = (f"   throughput {row['throughput_ratio']:.2f} (>= {THROUGHPUT_GOAL}), "
                             f"p99 {row['p99_ratio']:.2f} (<= {P99_GOAL})")
                cpu = f["server_cpu_ms_per_call"]
                print(f"{row['clients']:>7} {row['clients'] * row['calls_per_client']:>6}  {side:<13}"
                      f"{f['calls_answered']:>9}{f['errors']:>7}{f['calls_per_s']:>9.0f}{f['p50_ms']:>9.1f}"
                      f"{f['p99_ms']:>9.1f}{(f'{cpu:.2f}' if cpu is not None else '-'):>8}{ratio}")
    errors = sum(row[side]["errors"] for row in r["rows"] for side in ("bare", "canifinetune"))
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
