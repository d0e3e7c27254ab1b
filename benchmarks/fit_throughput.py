"""Fit the throughput model's fitted constants on the fitting rows of benchmarks/throughput_published.json.

Only rows with ``"split": "fit"`` enter the objective; the held-back third is read after the fit, once, for the
range the estimate carries (THROUGHPUT_RANGE_LOW/HIGH: the 10th and 90th percentiles of measured/model over the
held-back rows) and for the report. The objective is a soft-L1 loss (scale 0.2) on log(model/measured), each row
weighted by 1/sqrt(rows of its stack), so that no single publication's table outweighs the others; it is minimised by
Nelder-Mead (pure Python: the project has no numerical dependencies) over the constants in FITTED, each moved in a
space that keeps it in its range (log for times and sizes, logit for fractions).

Run: python benchmarks/fit_throughput.py                     # fit and print the fitting rows' figures, nothing written
     python benchmarks/fit_throughput.py --write --report    # write the fitted values and the range into
                                                             # calibration.json; print the held-back figures too
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_throughput_validation as bench

from canifinetune.estimator import constants

CALIBRATION = Path(__file__).resolve().parents[1] / "estimator" / "data" / "calibration.json"

# name -> (transform, low, high, start): "log" keeps a positive value positive, "logit" keeps a fraction in (low, high);
# the fit starts from the stated starting values (calibration.json's sources give their reasons), not from the file
FITTED: dict[str, tuple[str, float, float, float]] = {
    "GEMM_EFFICIENCY_HBM": ("logit", 0.3, 0.95, 0.8),
    "GEMM_EFFICIENCY_CONSUMER": ("logit", 0.3, 1.5, 0.9),
    "GEMM_EFFICIENCY_PRO": ("logit", 0.2, 0.95, 0.6),
    "GEMM_HALF_EFFICIENCY_TOKENS": ("log", 1.0, 1e5, 512.0),
    "GEMM_HALF_EFFICIENCY_HIDDEN": ("log", 1.0, 1e5, 512.0),
    "ELEMENTWISE_TRAFFIC_SCALE": ("log", 0.1, 10.0, 1.0),
    "LAUNCH_SECONDS_PER_LAYER_PASS": ("log", 1e-5, 0.05, 0.0015),
    "DEEPSPEED_ZERO3_SECONDS_PER_LAYER_PASS": ("log", 1e-5, 0.05, 0.002),
    "COMM_OVERLAP_FSDP": ("logit", 0.0, 1.0, 0.7),
    "COMM_OVERLAP_DEEPSPEED": ("logit", 0.0, 1.0, 0.5),
}
SOFT_L1_SCALE = 0.2


def _to_x(name: str, value: float) -> float:
    kind, lo, hi, _ = FITTED[name]
    if kind == "log":
        return math.log(min(max(value, lo), hi))
    f = (min(max(value, lo + 1e-6), hi - 1e-6) - lo) / (hi - lo)
    return math.log(f / (1 - f))


def _from_x(name: str, x: float) -> float:
    kind, lo, hi, _ = FITTED[name]
    if kind == "log":
        return min(max(math.exp(x), lo), hi)
    return lo + (hi - lo) / (1 + math.exp(-x))


def _set(values: dict[str, float]) -> None:
    for name, value in values.items():
        constants._CONSTANTS[name]["value"] = value


def objective(values: dict[str, float], data: dict) -> float:
    _set(values)
    results = bench.evaluate(data, split="fit")
    counts: dict[str, int] = {}
    for r in results:
        counts[r["stack"]] = counts.get(r["stack"], 0) + 1
    total = weight = 0.0
    for r in results:
        w = 1.0 / math.sqrt(counts[r["stack"]])
        e = math.log(r["ratio"]) / SOFT_L1_SCALE
        total += w * (math.sqrt(1.0 + e * e) - 1.0)
        weight += w
    return total / weight


def nelder_mead(f, x0: list[float], step: float = 0.3, iters: int = 3000, tol: float = 1e-7) -> list[float]:
    n = len(x0)
    simplex = [list(x0)] + [[x + (step if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    scores = [f(x) for x in simplex]
    for _ in range(iters):
        order = sorted(range(n + 1), key=lambda i: scores[i])
        simplex, scores = [simplex[i] for i in order], [scores[i] for i in order]
        if abs(scores[-1] - scores[0]) < tol:
            break
        centroid = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        refl = [c + (c - w) for c, w in zip(centroid, worst, strict=True)]
        fr = f(refl)
        if fr < scores[0]:
            exp = [c + 2 * (c - w) for c, w in zip(centroid, worst, strict=True)]
            fe = f(exp)
            simplex[-1], scores[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < scores[-2]:
            simplex[-1], scores[-1] = refl, fr
        else:
            con = [c + 0.5 * (w - c) for c, w in zip(centroid, worst, strict=True)]
            fc = f(con)
            if fc < scores[-1]:
                simplex[-1], scores[-1] = con, fc
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (p - b) for b, p in zip(best, pt, strict=True)] for pt in simplex[1:]]
                scores = [scores[0]] + [f(p) for p in simplex[1:]]
    return simplex[min(range(n + 1), key=lambda i: scores[i])]


def _round(value: float) -> float:
    if value == 0:
        return 0.0
    digits = 3 - math.floor(math.log10(abs(value)))
    return round(value, max(digits, 0))


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def fit(data: dict, restarts: int = 3) -> dict[str, float]:
    names = list(FITTED)
    start = {n: FITTED[n][3] for n in names}
    x = [_to_x(n, start[n]) for n in names]

    def f(xs: list[float]) -> float:
        return objective({n: _from_x(n, v) for n, v in zip(names, xs, strict=True)}, data)

    for k in range(restarts):  # restart from the optimum: Nelder-Mead stalls in a collapsed simplex
        x = nelder_mead(f, x, step=0.5 / (k + 1))
        print(f"  restart {k}: objective {f(x):.5f}", file=sys.stderr)
    return {n: _round(_from_x(n, v)) for n, v in zip(names, x, strict=True)}


def main(argv: list[str]) -> int:
    data = bench.load()
    print(f"rows hash {bench.rows_hash(data)}; fitting on {sum(r['split'] == 'fit' for r in data['rows'])} rows")
    print(f"start objective {objective({n: v[3] for n, v in FITTED.items()}, data):.5f}")
    values = fit(data)
    _set(values)
    print(f"fitted objective {objective(values, data):.5f}")
    for name, value in values.items():
        print(f"  {name} = {value}")
    fit_rows = bench.evaluate(data, split="fit")
    print(bench._stats_line("fit", bench.summary(fit_rows)))
    print(f"  worst class bias {bench.worst_bias(fit_rows):.2f}x")
    held = bench.evaluate(data, split="held_back")  # read once, after the fit: the range, and the report
    ratios = [r["measured"] / r["model"] for r in held]
    low, high = _round(percentile(ratios, 0.10)), _round(percentile(ratios, 0.90))
    if "--report" in argv:
        print(f"held-back measured/model: 10th percentile {low}, 90th {high}, median {statistics.median(ratios):.3f}")
        print(bench._stats_line("held_back", bench.summary(held)))
        print(f"  worst class bias {bench.worst_bias(held):.2f}x (classes with 2+ rows: "
              f"{bench.worst_bias(held, min_rows=2):.2f}x)")
    if "--write" in argv:
        raw = json.loads(CALIBRATION.read_text(encoding="utf-8"))
        for name, value in values.items():
            raw["constants"][name]["value"] = value
        raw["constants"]["THROUGHPUT_RANGE_LOW"]["value"] = low
        raw["constants"]["THROUGHPUT_RANGE_HIGH"]["value"] = high
        CALIBRATION.write_text(json.dumps(raw, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"written to {CALIBRATION}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
