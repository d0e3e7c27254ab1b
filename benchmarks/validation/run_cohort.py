"""Run a frozen validation cohort, each case in its own process, beside its estimate.

    python benchmarks/validation/run_cohort.py --mode fake [--cases c01,c07 | --subset ci] \
        [--cohort benchmarks/validation/cohort-v1.json] [--out benchmarks/validation/results/fake-cohort-v1.jsonl]
    python benchmarks/validation/run_cohort.py --mode cuda --subset cuda   # on a machine with a CUDA GPU

Modes:

- ``fake`` (CPU): ``fake_mode.py`` in a fresh interpreter per case: the model, adapters and optimizer built from the
  plan with random weights by ``canifinetune.recipes.model_setup`` (what the training runtime uses), under fake tensors,
  attention and dropout routed as a GPU runs them, two full steps; the peak of live tensor storage, each rounded to
  512-byte blocks (what ``torch.cuda.max_memory_allocated`` reports, less kernel scratch; docs/measuring.md).
- ``cuda`` (a real GPU): a fresh interpreter per case calls ``canifinetune.recipes.probe.probe(plan, 3)`` — the
  same SFTTrainer the runtime builds, three steps — with the model built from its config with random weights (on the
  GPU) instead of downloaded weights, and a stand-in tokenizer (the samples are token ids already). Records
  ``torch.cuda.max_memory_allocated``, ``max_memory_reserved`` and the process total from NVML.

One JSON line per selected case is written, in cohort order, as each case finishes; a case that cannot run in the
mode (bitsandbytes 8-bit and paged optimizers under fake tensors) is written with status ``unsupported`` and
the reason, a failure with status ``error``, its message and the traceback's tail. Nothing is dropped.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_COHORT = HERE / "cohort-v1.json"
RESULTS = HERE / "results"
CUDA_STEPS = 3

# What the fake harness cannot run (docs/measuring.md, "What it does not contain").
FAKE_UNSUPPORTED_OPTIM = {
    "adamw_bnb_8bit": "bitsandbytes 8-bit optimizer: its CUDA kernels have no fake-tensor implementation",
    "paged_adamw_8bit": "bitsandbytes paged 8-bit optimizer: its CUDA kernels have no fake-tensor implementation",
    "paged_adamw_32bit": "bitsandbytes paged optimizer: its CUDA kernels have no fake-tensor implementation",
}


# ---------------------------------------------------------------------------------------------- cohort


def load_cohort(path: Path | str = DEFAULT_COHORT) -> dict:
    cohort = json.loads(Path(path).read_text(encoding="utf-8"))
    ids = [c["id"] for c in cohort["cases"]]
    if len(ids) != len(set(ids)):
        raise ValueError(f"{path}: duplicate case ids")
    return cohort


def select(cohort: dict, cases: str | None = None, subset: str | None = None) -> list[dict]:
    """The cases to run: an explicit id list (``c01,c07``; numbers are accepted too), a subset flag, or all."""
    all_cases = cohort["cases"]
    if cases:
        wanted = []
        for token in cases.split(","):
            token = token.strip()
            if not token:
                continue
            wanted.append(f"c{int(token):02d}" if token.isdigit() else token)
        known = {c["id"]: c for c in all_cases}
        unknown = [w for w in wanted if w not in known]
        if unknown:
            raise SystemExit(f"--cases: not in {cohort['cohort']}: {', '.join(unknown)}")
        return [c for c in all_cases if c["id"] in set(wanted)]
    if subset:
        key = {"ci": "ci", "cuda": "cuda_subset"}.get(subset)
        if key is None:
            raise SystemExit(f"--subset: 'ci' or 'cuda'; got {subset!r}")
        return [c for c in all_cases if c.get(key)]
    return list(all_cases)


def default_out(mode: str, cohort: dict) -> Path:
    return RESULTS / f"{mode}-{cohort['cohort']}.jsonl"


# ---------------------------------------------------------------------------------------------- estimate


def estimate_record(plan: dict) -> dict:
    from canifinetune.estimator.estimate import estimate
    from canifinetune.estimator.plan import TrainingPlan

    est = estimate(TrainingPlan(**plan))
    return {
        "peak_allocated_bytes": est.peak_allocated_bytes,
        "peak_reserved_bytes": est.peak_reserved_bytes,
        "total_bytes": est.total_bytes,
        "budget_bytes": est.budget_bytes,
        "peak_phase": est.peak_phase,
        "phases": est.phases,
        "params_total": est.params_total,
        "params_trainable": est.params_trainable,
        "calibration_version": est.calibration_version,
        "breakdown": {c.name: c.bytes for c in est.breakdown},
    }


def _pct(estimated: int, measured: int) -> float:
    return round(100.0 * (estimated - measured) / measured, 3)


def case_errors(mode: str, estimate: dict, measured: dict) -> dict:
    """Percent errors of one case: allocated peak in both modes; reserved peak and process total in cuda mode."""
    errors = {"allocated": _pct(estimate["peak_allocated_bytes"], measured["peak_allocated_bytes"])}
    if mode == "cuda":
        errors["reserved"] = _pct(estimate["peak_reserved_bytes"], measured["peak_reserved_bytes"])
        errors["total"] = _pct(estimate["total_bytes"], measured["process_total_bytes"])
    return errors


# ---------------------------------------------------------------------------------------------- fake mode


def unsupported_reason(mode: str, plan) -> str | None:
    if mode == "fake" and plan.optim in FAKE_UNSUPPORTED_OPTIM:
        return FAKE_UNSUPPORTED_OPTIM[plan.optim]
    return None


def run_fake(plan: dict, timeout: float) -> dict:
    from benchmarks.validation.compare import measure_in_subprocess

    measured = measure_in_subprocess(plan, timeout=timeout)
    if "error" in measured:
        return {"status": "timeout" if "timed out" in measured["error"] else "error", "error": measured["error"],
                "traceback_tail": (measured.get("traceback") or "")[-3000:]}
    keep = ("peak_allocated_bytes", "peak_phase", "phase_peaks", "peak_categories", "peak_largest_other_bytes",
            "after_build_bytes", "attention_kernels", "resolved", "loss", "versions", "wall_seconds", "trainer",
            "reference", "driver", "trainer_class", "scalar_reads", "sequence", "images", "activation_offloading")
    return {"status": "ok", "measured": {k: measured.get(k) for k in keep}}


# ---------------------------------------------------------------------------------------------- cuda mode


def _stand_in_tokenizer(folder: Path) -> None:
    """A tokenizer TRL can hold: pad/eos/unk only (the probe's samples are token ids already)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"<pad>": 0, "</s>": 1, "<unk>": 2}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(folder)


def measure_cuda(plan_dict: dict, steps: int = CUDA_STEPS) -> dict:
    """``probe(plan, steps)`` on this machine's GPU, with a random-weight model built from the plan's config."""
    import torch

    from canifinetune.estimator.model_sources import resolve_model
    from canifinetune.estimator.plan import TrainingPlan
    from canifinetune.recipes import model_setup, runtime
    from canifinetune.recipes import probe as probe_module

    plan = TrainingPlan(**plan_dict)
    config = resolve_model(plan.model).config
    folder = Path(tempfile.mkdtemp(prefix="canifinetune-cohort-"))
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    _stand_in_tokenizer(folder)
    build = model_setup.build_model

    def build_random(plan, config, *, pretrained_path=None):  # random weights, built where they will train
        index = int(os.environ.get("LOCAL_RANK", "0") or 0)
        with torch.device(f"cuda:{index}"):
            return build(plan, config)

    model_setup.build_model = build_random
    runtime.model_source = lambda plan, recipe_dir=None: (config, str(folder))
    result = probe_module.probe(plan, steps)
    return result.model_dump(mode="json")


def run_cuda(plan: dict, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(plan), "--worker-out", str(out)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "error": f"timed out after {timeout:.0f} s"}
        if not out.exists():
            return {"status": "error", "error": f"exit {proc.returncode}", "traceback_tail": proc.stderr[-3000:]}
        data = json.loads(out.read_text(encoding="utf-8"))
    if "error" in data:
        return {"status": data.get("status", "error"), "error": data["error"],
                "traceback_tail": data.get("traceback", "")[-3000:]}
    return {"status": "ok", "measured": data}


def worker(plan_json: str, out: str) -> int:
    try:
        result = measure_cuda(json.loads(plan_json))
        code = 0
    except BaseException as exc:  # report, never stay silent
        from_probe = type(exc).__name__ == "ProbeError"
        oom = "OutOfMemoryError" in type(exc).__name__
        result = {"status": "error", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(),
                  "kind": "probe_refused" if from_probe else ("out_of_memory" if oom else "exception")}
        code = 1
    Path(out).write_text(json.dumps(result, default=str), encoding="utf-8")
    return code


# ---------------------------------------------------------------------------------------------- one case


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=str(ROOT), capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except Exception:
        return None


def _git_dirty() -> list[str] | None:
    """Files of the harness and the estimator with uncommitted changes when the run started."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--", "estimator", "recipes", "benchmarks/validation"],
                             cwd=str(ROOT), capture_output=True, text=True, timeout=10).stdout
    except Exception:
        return None
    return [line[3:] for line in out.splitlines() if line.strip() and "results/" not in line]


def host_record() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}


def run_case(case: dict, mode: str, cohort: dict, timeout: float) -> dict:
    from canifinetune.estimator.plan import TrainingPlan

    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    plan = TrainingPlan(**case["plan"])
    plan_json = plan.model_dump(mode="json", exclude_defaults=False)
    row: dict = {"cohort": cohort["cohort"], "cohort_version": cohort["version"], "case": case["id"], "mode": mode,
                 "plan": case["plan"], "started_utc": started}
    try:
        row["estimate"] = estimate_record(plan_json)
    except Exception as exc:
        row["estimate_error"] = f"{type(exc).__name__}: {exc}"
    reason = unsupported_reason(mode, plan)
    if reason is not None:
        row.update(status="unsupported", error=reason)
    else:
        try:
            outcome = run_fake(plan_json, timeout) if mode == "fake" else run_cuda(plan_json, timeout)
        except Exception as exc:  # the runner itself: still a row
            outcome = {"status": "error", "error": f"{type(exc).__name__}: {exc}",
                       "traceback_tail": traceback.format_exc()[-3000:]}
        row.update(outcome)
    if row.get("status") == "ok" and "estimate" in row:
        row["error_pct"] = case_errors(mode, row["estimate"], row["measured"])
    row["wall_seconds"] = round(time.perf_counter() - t0, 2)
    return row


# ---------------------------------------------------------------------------------------------- main


def run(mode: str, cases: list[dict], cohort: dict, out: Path, jobs: int, timeout: float, quiet: bool = False,
        budget_s: float | None = None) -> list[dict]:
    """Run ``cases`` (``jobs`` at a time, each in its own process) and write the JSONL. With ``budget_s``, a case not
    started within that many seconds of the run's start is written as ``not_run`` (never silently dropped)."""
    t_start = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    header = {"cohort": cohort["cohort"], "cohort_version": cohort["version"], "mode": mode, "record": "run",
              "git_commit": _git_commit(), "git_uncommitted": _git_dirty(), "host": host_record(),
              "cases": [c["id"] for c in cases],
              "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    lock = threading.Lock()
    rows: dict[str, dict] = {}
    order = [c["id"] for c in cases]

    with out.open("w", encoding="utf-8") as f:  # progress as cases finish; rewritten in cohort order at the end
        f.write(json.dumps(header) + "\n")

    def one(case: dict) -> None:
        elapsed = time.perf_counter() - t_start
        if budget_s is not None and elapsed > budget_s:
            row = {"cohort": cohort["cohort"], "cohort_version": cohort["version"], "case": case["id"], "mode": mode,
                   "plan": case["plan"], "status": "not_run", "wall_seconds": 0.0,
                   "error": f"not started: the run's time budget of {budget_s:.0f} s was spent ({elapsed:.0f} s)"}
        else:
            case_timeout = timeout if budget_s is None else max(30.0, min(timeout, budget_s - elapsed + 60.0))
            row = run_case(case, mode, cohort, case_timeout)
        with lock:
            rows[case["id"]] = row
            with out.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row, default=str) + "\n")
            if not quiet:
                status = row["status"]
                detail = (f"est {row['estimate']['peak_allocated_bytes'] / 2**30:.3f} GiB, measured "
                          f"{row['measured']['peak_allocated_bytes'] / 2**30:.3f} GiB, {row['error_pct']}"
                          if status == "ok" and "error_pct" in row else (row.get("error") or "")[:160])
                print(f"{row['case']} {status:11} {row['wall_seconds']:7.1f}s  {detail}", flush=True)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, cases))
    header["finished_utc"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with out.open("w", encoding="utf-8") as f:
        f.write(json.dumps(header) + "\n")
        for cid in order:
            f.write(json.dumps(rows[cid], default=str) + "\n")
    return [rows[c] for c in order]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("fake", "cuda"))
    parser.add_argument("--cohort", default=str(DEFAULT_COHORT))
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--cases", help="comma-separated case ids (c01,c07) or numbers (1,7)")
    group.add_argument("--subset", choices=("ci", "cuda"), help="the cases the cohort marks for CI or for the GPU run")
    parser.add_argument("--out", help="JSONL to write (default results/<mode>-<cohort>.jsonl)")
    parser.add_argument("--jobs", type=int, default=None, help="cases at once (fake: 2; cuda: 1, one GPU)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per case (fake 900, cuda 240)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no case after this many seconds (later cases are written as not_run)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        return worker(args.worker, args.worker_out)
    if args.mode is None:
        parser.error("--mode is required")
    cohort = load_cohort(args.cohort)
    cases = select(cohort, args.cases, args.subset)
    out = Path(args.out) if args.out else default_out(args.mode, cohort)
    jobs = args.jobs or (2 if args.mode == "fake" else 1)
    timeout = args.timeout or (900.0 if args.mode == "fake" else 240.0)
    rows = run(args.mode, cases, cohort, out, jobs, timeout, budget_s=args.budget_s)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(f"{len(rows)} cases -> {out}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
