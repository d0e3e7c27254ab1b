"""Benchmark: the whole suggest() search (single-knob moves, combinations, minimality, multi-GPU
alternatives, smallest GPU) for plans on one GPU. Target: p50 <= 50 ms per plan.

Run: python benchmarks/bench_search.py [repeats]
"""

from __future__ import annotations

import statistics
import sys
import time

from canifinetune.estimator.model_sources import resolve_model
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.search import suggest

try:  # the term caches (estimator/term_cache.py); absent in commits before them, so A/B runs still work
    from canifinetune.estimator.term_cache import clear_all as clear_term_caches
except ImportError:  # pragma: no cover
    def clear_term_caches() -> None:
        pass

PLANS = [
    dict(model="meta-llama/Llama-3.1-8B", method="full", gpu="RTX 4090", seq_len=4096),
    dict(model="meta-llama/Llama-3.1-8B", method="lora", gpu="RTX 4090", seq_len=4096,
         gradient_checkpointing=False, loss_implementation="standard"),
    dict(model="Qwen/Qwen2.5-72B-Instruct", method="qlora", gpu="RTX 4090"),
    dict(model="Qwen/Qwen2.5-7B", method="full", gpu="A100 40GB SXM", seq_len=2048),
    dict(model="google/gemma-2-9b-it", method="qlora", gpu="RTX 3060 12GB", seq_len=4096),
    dict(model="mistralai/Mixtral-8x7B-v0.1", method="qlora", gpu="L4", seq_len=2048),
]


def main() -> int:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    all_ms: list[float] = []
    print("cold: the term caches emptied before each search (a plan the process has not seen); warm: the same "
          "search repeated")
    print(f"{'plan':<60} {'p50 ms':>8} {'p95 ms':>8} {'warm':>6} {'evals':>6} {'sugg':>5}")
    for kw in PLANS:
        plan = TrainingPlan(**kw)
        resolve_model(plan.model)  # warm the catalog lookups once, like a running server
        suggest(plan)
        times = []
        for _ in range(repeats):
            clear_term_caches()
            t = time.perf_counter()
            res = suggest(plan)
            times.append((time.perf_counter() - t) * 1e3)
        warm = []
        for _ in range(max(1, repeats // 4)):
            t = time.perf_counter()
            suggest(plan)
            warm.append((time.perf_counter() - t) * 1e3)
        all_ms += times
        times.sort()
        p95 = times[min(len(times) - 1, int(0.95 * len(times)))]
        label = f"{plan.model} {plan.method} {plan.gpu} seq {plan.seq_len}"
        print(f"{label:<60} {statistics.median(times):8.1f} {p95:8.1f} {statistics.median(warm):6.1f} "
              f"{res.plans_evaluated:6d} {len(res.suggestions):5d}")
    all_ms.sort()
    p50 = statistics.median(all_ms)
    p95 = all_ms[min(len(all_ms) - 1, int(0.95 * len(all_ms)))]
    print(f"{'all plans (cold)':<60} {p50:8.1f} {p95:8.1f}   target p50 <= 50 ms: {'OK' if p50 <= 50 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
