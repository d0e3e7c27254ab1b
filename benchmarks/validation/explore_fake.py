"""Run the fake-tensor measurement over a grid of plans (each case in its own process) and collect the results.

    python benchmarks/validation/explore_fake.py [--out benchmarks/validation/exploration-fake.json] [--jobs 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = {
    "Qwen/Qwen2.5-0.5B": "configs/qwen2.5-0.5b.json",
    "meta-llama/Llama-3.2-1B": "configs/llama-3.2-1b.json",
}
VARIANTS = {
    "full": {"method": "full"},
    "lora-default": {"method": "lora", "lora_r": 16, "target_modules": None},
    "lora-all-linear": {"method": "lora", "lora_r": 16, "target_modules": "all-linear"},
    "qlora-all-linear": {"method": "qlora", "lora_r": 16, "target_modules": "all-linear"},
}
KEEP = ("error", "peak_allocated_bytes", "peak_phase", "peak_categories", "phase_peaks", "after_build_bytes",
        "end_of_step_categories", "attention_kernels", "resolved", "wall_seconds", "versions")


def run_case_in_process(model, variant, seq_len, batch, ckpt, loss):
    """Faster (one import per worker); the CLI (run_case) is the reference way, one process per case."""
    sys.path.insert(0, HERE)
    import fake_mode

    plan = {"model": model, **VARIANTS[variant], "seq_len": seq_len, "batch_size": batch,
            "gradient_checkpointing": ckpt, "optim": "adamw_torch_fused", "dtype": "bf16"}
    with open(os.path.join(HERE, MODELS[model])) as f:
        config = json.load(f)
    try:
        result = fake_mode.measure_fake(plan, config, loss=loss)
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    case = {"model": model, "variant": variant, "seq_len": seq_len, "batch_size": batch,
            "gradient_checkpointing": ckpt, "loss": loss}
    case.update({k: result[k] for k in KEEP if k in result})
    print(json.dumps({k: case.get(k) for k in ("model", "variant", "seq_len", "batch_size", "gradient_checkpointing", "loss", "peak_allocated_bytes", "peak_phase", "error")}), flush=True)
    return case


def _worker(g):
    return run_case_in_process(g[1], g[2], g[3], g[4], g[5], g[0])


def run_case(model, variant, seq_len, batch, ckpt, loss):
    plan = {"model": model, **VARIANTS[variant], "seq_len": seq_len, "batch_size": batch,
            "gradient_checkpointing": ckpt, "optim": "adamw_torch_fused", "dtype": "bf16"}
    with tempfile.TemporaryDirectory() as tmp:
        plan_path, out_path = os.path.join(tmp, "plan.json"), os.path.join(tmp, "out.json")
        with open(plan_path, "w") as f:
            json.dump(plan, f)
        proc = subprocess.run(
            [sys.executable, os.path.join(HERE, "fake_mode.py"), "--plan", plan_path,
             "--config", os.path.join(HERE, MODELS[model]), "--out", out_path, "--loss", loss],
            capture_output=True, text=True, timeout=1200,
        )
        try:
            with open(out_path) as f:
                result = json.load(f)
        except Exception:
            result = {"error": f"no result (rc {proc.returncode}): {proc.stderr[-2000:]}"}
    case = {"model": model, "variant": variant, "seq_len": seq_len, "batch_size": batch,
            "gradient_checkpointing": ckpt, "loss": loss}
    case.update({k: result[k] for k in KEEP if k in result})
    print(json.dumps({k: case.get(k) for k in ("model", "variant", "seq_len", "batch_size", "gradient_checkpointing", "loss", "peak_allocated_bytes", "peak_phase", "error")}), flush=True)
    return case


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(HERE, "exploration-fake.json"))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--loss", nargs="+", default=["trl_fused", "model"])
    args = parser.parse_args()
    grid = list(itertools.product(["trl_fused"], MODELS, VARIANTS, (1024, 2048), (1, 4), (True, False)))
    if "model" in args.loss:  # transformers' own loss (full logits): a subset, to show the difference
        grid += list(itertools.product(["model"], MODELS, ("full", "qlora-all-linear"), (2048,), (1, 4), (True, False)))
    partial = args.out + ".partial.jsonl"
    done = {}
    if os.path.exists(partial):
        with open(partial) as f:
            for line in f:
                c = json.loads(line)
                done[(c["loss"], c["model"], c["variant"], c["seq_len"], c["batch_size"], c["gradient_checkpointing"])] = c

    todo = [g for g in grid if g not in done]
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for case in pool.imap_unordered(_worker, todo):
            key = (case["loss"], case["model"], case["variant"], case["seq_len"], case["batch_size"], case["gradient_checkpointing"])
            done[key] = case
            with open(partial, "a") as f:
                f.write(json.dumps(case) + "\n")
    cases = [done[g] for g in grid]
    with open(args.out, "w") as f:
        json.dump({"description": "Fake-tensor measurements (benchmarks/validation/fake_mode.py): peak of live tensor "
                   "bytes over two training steps, bf16, adamw_torch_fused, flash-routed SDPA, no attention mask.",
                   "cases": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
