"""LitGPT's measured step against the closest plan canifinetune can express (issue 24 item 2, before a `litgpt` stack).

    python benchmarks/validation/litgpt_compare.py [--cases benchmarks/validation/litgpt-cases-v1.json]
        [--python .venv-litgpt/bin/python] [--out benchmarks/validation/results/litgpt-cases-v1.jsonl]

Each case runs ``litgpt_fake.py`` in LitGPT's own virtual environment (``--python``; see that file for how to make it)
in a fresh process; the estimate of :func:`closest_plan` is computed here. One JSON line per case, errors included.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ALL_LINEAR_FLAGS = ("lora_query", "lora_key", "lora_value", "lora_projection", "lora_mlp")


def closest_plan(case: dict) -> dict:
    """The TrainingPlan nearest LitGPT's run that canifinetune can express: bf16 weights and adapters (bf16-true), its
    LoRA defaults (r 8, alpha 16, dropout 0.05, query and value; every linear but the head when the case sets every
    flag), torch AdamW (foreach), no checkpointing, full logits (the standard loss)."""
    plan = {"model": case["model"], "method": case["method"], "seq_len": case["seq_len"],
            "batch_size": case.get("batch_size", 1), "gradient_checkpointing": False, "optim": "adamw_torch",
            "loss_implementation": "standard"}
    if case["method"] == "lora":
        flags = {"lora_query": True, "lora_value": True, **{k: case[k] for k in ALL_LINEAR_FLAGS if k in case}}
        every = all(flags.get(k) for k in ALL_LINEAR_FLAGS)
        plan.update(lora_r=case.get("lora_r", 8), lora_alpha=case.get("lora_alpha", 16),
                    lora_dropout=case.get("lora_dropout", 0.05), adapter_dtype="bf16",
                    target_modules="all-linear" if every else ["q_proj", "v_proj"])
    return plan


def measure(case: dict, python: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [python, str(HERE / "litgpt_fake.py"), "--case", json.dumps(case), "--out", str(out)]
        try:
            subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
        if not out.exists():
            return {"error": "no result written"}
        return json.loads(out.read_text(encoding="utf-8"))


def compare(entry: dict, python: str, timeout: float) -> dict:
    from canifinetune.estimator.estimate import estimate
    from canifinetune.estimator.plan import TrainingPlan

    case = entry["case"]
    plan = closest_plan(case)
    est = estimate(TrainingPlan(**plan))
    row = {"case": entry["id"], "litgpt_case": case, "closest_plan": plan,
           "estimate": {"peak_allocated_bytes": est.peak_allocated_bytes, "peak_phase": est.peak_phase,
                        "params_total": est.params_total, "params_trainable": est.params_trainable}}
    measured = measure(case, python, timeout)
    if "error" in measured:
        return {**row, "status": "error", "error": measured["error"],
                "traceback_tail": measured.get("traceback", "")[-2000:]}
    keep = ("peak_allocated_bytes", "peak_phase", "phase_peaks", "peak_categories", "resolved", "attention_kernels",
            "versions", "wall_seconds")
    peak = measured["peak_allocated_bytes"]
    return {**row, "status": "ok", "measured": {k: measured.get(k) for k in keep},
            "error_pct": round(100.0 * (est.peak_allocated_bytes - peak) / peak, 3)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=str(HERE / "litgpt-cases-v1.json"))
    parser.add_argument("--python", default=str(ROOT / ".venv-litgpt" / "bin" / "python"))
    parser.add_argument("--out", default=str(HERE / "results" / "litgpt-cases-v1.jsonl"))
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)
    cases = json.loads(Path(args.cases).read_text(encoding="utf-8"))["cases"]
    lines = []
    for entry in cases:
        row = compare(entry, args.python, args.timeout)
        lines.append(json.dumps(row))
        shown = (f"measured {row['measured']['peak_allocated_bytes'] / 2**30:.3f} GiB, closest estimate "
                 f"{row['estimate']['peak_allocated_bytes'] / 2**30:.3f} GiB, {row['error_pct']:+.2f}%"
                 if row["status"] == "ok" else row["error"])
        print(f"{entry['id']} {row['status']:6s} {shown}", flush=True)
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0 if all(json.loads(x)["status"] == "ok" for x in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
