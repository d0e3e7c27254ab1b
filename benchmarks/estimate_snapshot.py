"""Every estimate of the validation cohorts and the test tables, byte for byte, to prove a refactoring changed none.

    python benchmarks/estimate_snapshot.py --write   # record tests/data/estimate_snapshot.json
                                                     # (after a deliberate change)
    python benchmarks/estimate_snapshot.py           # compare: prints the plans whose estimate changed, exit 1 if any

Each plan's record holds, per GPU size, the sha256 of the whole estimate as JSON (every component's bytes, phases,
verdict, explanations, warnings: the byte-for-byte check) beside its figures (peak, verdict and each component's bytes:
what a reviewer reads in the diff), or the error the plan raises. tests/test_estimate_snapshot.py runs the comparison
on every test run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = ROOT / "tests" / "data" / "estimate_snapshot.json"
GPU_SIZES_GIB = (16, 80)  # each plan is also judged on two GPU sizes: the verdict logic is in the snapshot too


def plan_tables() -> dict[str, dict]:
    """id -> plan: every frozen cohort's cases and the accuracy table's."""
    plans: dict[str, dict] = {}
    for path in sorted((ROOT / "benchmarks" / "validation").glob("cohort-v*.json")):
        cohort = json.loads(path.read_text(encoding="utf-8"))
        for case in cohort["cases"]:
            plans[f"{cohort['cohort']}/{case['id']}"] = case["plan"]
    accuracy = json.loads((ROOT / "tests" / "accuracy_cases.json").read_text(encoding="utf-8"))
    for i, case in enumerate(accuracy if isinstance(accuracy, list) else accuracy.get("cases", [])):
        plans[f"accuracy/{case.get('id', i)}"] = case.get("plan", case)
    return plans


def record(plan: dict) -> list:
    from canifinetune.estimator.estimate import estimate
    from canifinetune.estimator.plan import TrainingPlan

    out = []
    for size in (None, *GPU_SIZES_GIB):
        try:
            p = TrainingPlan(**plan)
            if size is not None:
                p = p.replace(gpu=None, gpu_vram_gb=size)
            est = estimate(p)
            text = est.model_dump_json(exclude={"plan"})
            out.append({"sha256": hashlib.sha256(text.encode()).hexdigest()[:32], "peak": est.peak_allocated_bytes,
                        "verdict": est.verdict, "parts": {c.name: c.bytes for c in est.breakdown}})
        except Exception as exc:  # a refusal is part of the behaviour too
            out.append({"error": f"{type(exc).__name__}: {exc}"})
    return out


def snapshot() -> dict[str, list]:
    return {key: record(plan) for key, plan in plan_tables().items()}


def changed(old: dict, new: dict) -> list[str]:
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="record the snapshot instead of comparing")
    args = parser.parse_args(argv)
    new = snapshot()
    if args.write:
        SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
        SNAPSHOT.write_text(json.dumps(new, indent=0, sort_keys=True) + "\n", encoding="utf-8")
        print(f"{len(new)} plans -> {SNAPSHOT.relative_to(ROOT)}")
        return 0
    old = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    diff = changed(old, new)
    print(f"{len(new)} plans, {len(diff)} changed" + (": " + ", ".join(diff) if diff else ""))
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
