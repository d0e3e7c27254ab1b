"""Validation: the throughput model (estimator/throughput.py) against published fine-tuning throughput.

Each row of benchmarks/throughput_published.json is a published measurement (tokens/s, or s/step turned into
tokens/s) for a named GPU and configuration, with its source, and the TrainingPlan that describes the run.
This prints the model's tokens/s beside each, the error (model / measured - 1), the utilisation the
measurement implies (TRAINING_FLOPS_UTILISATION x measured / model, for compute-bound rows), and the median
absolute error. Nothing is fitted: the rows check the model's constants, they do not set them.

Run: python benchmarks/bench_throughput_validation.py [--json]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from canifinetune.estimator.constants import constant
from canifinetune.estimator.model_sources import ResolvedModel, resolve_model
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.spec import ModelSpec
from canifinetune.estimator.throughput import throughput

DATA = Path(__file__).with_name("throughput_published.json")


def load(path: Path = DATA) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _model(name: str, extra: dict) -> ResolvedModel:
    """A catalog model, or one of the file's own configs (models the catalog does not hold)."""
    if name in extra:
        return ResolvedModel(name, "validation file", dict(extra[name]), ModelSpec.from_config(dict(extra[name])))
    return resolve_model(name)


def evaluate(data: dict | None = None) -> list[dict]:
    """One result per row: the measured and modelled tokens/s, the error, the implied utilisation."""
    data = data or load()
    util = constant("TRAINING_FLOPS_UTILISATION")
    out = []
    for row in data["rows"]:
        plan = TrainingPlan(**row["plan"])
        tp = throughput(plan, model=_model(plan.model, data.get("models", {})))
        measured = float(row["measured_tokens_per_second"])
        implied = util * measured / tp.tokens_per_second if tp.bound == "compute" else None
        out.append({"id": row["id"], "gpu": f"{plan.num_gpus} x {tp.gpu}", "method": plan.method,
                    "seq_len": plan.seq_len, "measured": measured, "model": tp.tokens_per_second,
                    "error": tp.tokens_per_second / measured - 1.0, "bound": tp.bound,
                    "implied_utilisation": implied})
    return out


def summary(results: list[dict]) -> dict:
    errors = [abs(r["error"]) for r in results]
    implied = [r["implied_utilisation"] for r in results if r["implied_utilisation"] is not None]
    return {"rows": len(results), "median_abs_error": statistics.median(errors), "max_abs_error": max(errors),
            "median_signed_error": statistics.median(r["error"] for r in results),
            "median_implied_utilisation": statistics.median(implied) if implied else None}


def main(argv: list[str]) -> int:
    results = evaluate()
    stats = summary(results)
    if "--json" in argv:
        print(json.dumps({"rows": results, "summary": stats}, indent=1))
        return 0
    print(f"{'row':<40} {'GPU':<18} {'method':<6} {'seq':>6} {'measured':>9} {'model':>9} {'error':>7} {'util':>5}")
    for r in results:
        util = f"{r['implied_utilisation']:.2f}" if r["implied_utilisation"] is not None else "-"
        print(f"{r['id']:<40} {r['gpu']:<18} {r['method']:<6} {r['seq_len']:>6} {r['measured']:>9,.0f} "
              f"{r['model']:>9,.0f} {r['error']:>+7.0%} {util:>5}")
    print(f"\n{stats['rows']} rows: median |error| {stats['median_abs_error']:.0%}, max {stats['max_abs_error']:.0%}, "
          f"median signed {stats['median_signed_error']:+.0%}; median implied utilisation "
          f"{stats['median_implied_utilisation']:.2f} (the model assumes {constant('TRAINING_FLOPS_UTILISATION')})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
