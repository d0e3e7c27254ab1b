"""CPU per tool call in one process, and the share the garbage collector takes, as the server is tuned and untuned.

The MCP server's compute without the protocol: each tool's implementation (server/mcp_server.py ``*_impl``) on
bench_http_load.py's mixed calls (8 models, 6 GPUs, three methods, several sequence lengths and batches), with the
term caches emptied before each pass so every pass computes what a fresh mix computes. Prints, per tool, the CPU
milliseconds per call (the least of ``--passes`` passes: the machine's noise only adds), the mix's average, and the
garbage collector's share of the CPU and its collections, first with CPython's default collector and then with the
server's (``tune_gc_for_serving``: what exists at start frozen, a young collection every GC_YOUNG_THRESHOLD
allocations).

    python benchmarks/bench_tool_cpu.py                  # 60 clients x 10 calls of the mix, 3 passes per setting
    python benchmarks/bench_tool_cpu.py --clients 20 --passes 5
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def measure(clients: int, calls: int, passes: int, tuned: bool) -> dict:
    """Per-tool CPU ms per call (least over the passes) and the collector's share over all passes."""
    from benchmarks.bench_http_load import call_plan
    from canifinetune.estimator import term_cache
    from canifinetune.server.mcp_server import estimate_memory_impl, recipe_impl, suggest_impl, tune_gc_for_serving

    impls = {"estimate_memory": estimate_memory_impl, "suggest_cheaper_config": suggest_impl,
             "make_recipe": recipe_impl}
    plan = [c for no in range(clients) for c in call_plan(no, calls)]
    for tool, args in call_plan(10_000, 20):  # imports and catalogs loaded, as in a server that has answered once
        impls[tool](dict(args), offline=True)
    if tuned:
        tune_gc_for_serving()
    in_gc = [0.0, 0]
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.process_time()
        else:
            in_gc[0] += time.process_time() - started[0]
            in_gc[1] += 1

    gc.callbacks.append(on_gc)
    best: dict[str, float] = {}
    total = 0.0
    for _ in range(passes):
        term_cache.clear_all()
        spent: dict[str, float] = {}
        for tool, args in plan:
            t0 = time.process_time()
            impls[tool](dict(args), offline=True)
            spent[tool] = spent.get(tool, 0.0) + time.process_time() - t0
        total += sum(spent.values())
        for tool, s in spent.items():
            best[tool] = min(best.get(tool, float("inf")), s)
    gc.callbacks.remove(on_gc)
    counts = {tool: sum(1 for t, _ in plan if t == tool) for tool in best}
    return {"ms_per_call": {tool: 1000 * best[tool] / counts[tool] for tool in best},
            "mix_ms_per_call": 1000 * sum(best.values()) / len(plan),
            "gc_share": in_gc[0] / total if total else 0.0, "gc_collections": in_gc[1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=60)
    parser.add_argument("--calls", type=int, default=10, help="calls per client")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--one", choices=("default", "tuned"), help=argparse.SUPPRESS)  # a child process's setting
    args = parser.parse_args(argv)
    if args.one:
        import json

        print(json.dumps(measure(args.clients, args.calls, args.passes, args.one == "tuned")))
        return 0
    import json

    print(f"{args.clients} clients x {args.calls} calls of bench_http_load.py's mix, in one process; CPU ms per call, "
          f"least of {args.passes} passes (term caches emptied before each)")
    for setting in ("default", "tuned"):  # each in a fresh process: the collector's state is process-wide
        out = subprocess.run([sys.executable, __file__, "--one", setting, "--clients", str(args.clients),
                              "--calls", str(args.calls), "--passes", str(args.passes)],
                             check=True, capture_output=True, text=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        tools = ", ".join(f"{tool} {ms:.2f}" for tool, ms in sorted(r["ms_per_call"].items()))
        print(f"gc {setting:7s}: {tools}; mix {r['mix_ms_per_call']:.2f} ms/call; garbage collector "
              f"{100 * r['gc_share']:.1f}% of the CPU ({r['gc_collections']} collections)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
