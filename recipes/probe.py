"""The probe: train a few steps on a CUDA GPU and put the measured peaks beside the estimate.

`canifinetune train recipe.yaml --probe 3` and the validation harness's ``cuda`` mode both call :func:`probe`.
It trains on synthetic samples exactly ``seq_len`` tokens long (what the estimate assumes), reports what other
processes already hold on the GPU, and refuses to measure when the free memory is below the estimate. On a
machine without CUDA it measures nothing and says so (no made-up numbers).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from canifinetune.estimator.errors import ProbeError as ProbeError  # declared in errors.py (the one error tree)
from canifinetune.estimator.plan import TrainingPlan

from .schema import EstimateSummary

_GIB = 1024**3


class GPUProcess(BaseModel):
    pid: int
    bytes: int | None


class ProbeResult(BaseModel):
    """Measured peaks of ``steps`` training steps, beside the estimate (bytes; per GPU)."""

    steps: int
    device: str
    gpu_name: str
    device_total_bytes: int
    free_bytes_before: int = Field(
        description="free device memory before the model loaded (after this process's CUDA context)"
    )
    other_processes: list[GPUProcess] = Field(description="other processes on this GPU and what they hold (NVML)")
    other_processes_bytes: int | None = Field(description="what other processes hold; None when NVML is not available")
    peak_allocated_bytes: int = Field(description="torch.cuda.max_memory_allocated over the measured steps")
    peak_reserved_bytes: int = Field(description="torch.cuda.max_memory_reserved over the measured steps")
    process_total_bytes: int = Field(description="this process on the GPU at its peak: reserved peak + CUDA context")
    process_total_source: str = Field(description="how process_total_bytes was measured")
    estimate: EstimateSummary
    losses: list[float]
    samples: str
    notes: list[str] = Field(default_factory=list)

    def ratios(self) -> dict[str, float]:
        e = self.estimate
        return {
            "allocated": self.peak_allocated_bytes / e.peak_allocated_bytes if e.peak_allocated_bytes else float("nan"),
            "reserved": self.peak_reserved_bytes / e.peak_reserved_bytes if e.peak_reserved_bytes else float("nan"),
            "total": self.process_total_bytes / e.total_bytes if e.total_bytes else float("nan"),
        }


# ---------------------------------------------------------------------------------------------- NVML


def _nvml_handle(device_index: int):
    """(pynvml module, handle) for the torch device, or (None, None) without NVML."""
    try:
        import pynvml  # provided by nvidia-ml-py
    except ImportError:
        return None, None
    try:
        pynvml.nvmlInit()
        import torch

        try:
            index = torch.cuda._get_nvml_device_index(device_index)  # honours CUDA_VISIBLE_DEVICES
        except Exception:
            index = device_index
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:
        return None, None


def _nvml_processes(nvml, handle) -> list[GPUProcess]:
    procs = []
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            for p in getattr(nvml, getter)(handle):
                used = getattr(p, "usedGpuMemory", None)
                procs.append(GPUProcess(pid=int(p.pid), bytes=int(used) if isinstance(used, int) else None))
        except Exception:
            continue
    seen: dict[int, GPUProcess] = {}
    for p in procs:
        seen.setdefault(p.pid, p)
    return list(seen.values())


# ---------------------------------------------------------------------------------------------- probe


def synthetic_token_ids(plan: TrainingPlan, steps: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """Enough samples of exactly seq_len tokens for ``steps`` optimizer steps on every GPU."""
    import random

    rng = random.Random(seed)
    n = plan.batch_size * plan.gradient_accumulation_steps * steps * plan.num_gpus
    high = max(2, vocab_size) - 1
    return [[rng.randrange(1, high) for _ in range(plan.seq_len)] for _ in range(n)]


def probe(
    plan: TrainingPlan,
    steps: int = 3,
    *,
    recipe_dir: Path | None = None,
    estimate_summary: EstimateSummary | None = None,
    device: str | None = None,
) -> ProbeResult:
    """Measure ``steps`` training steps of ``plan`` on this machine's CUDA GPU."""
    torch = _require_cuda(steps, device)
    if estimate_summary is None:
        from canifinetune.estimator.estimate import estimate

        estimate_summary = EstimateSummary.from_estimate(estimate(plan))
    index = int(os.environ.get("LOCAL_RANK", "0") or 0)
    torch.cuda.set_device(index)
    torch.cuda.init()
    before = _gpu_before(torch, index)
    _refuse_when_short(torch, index, before, estimate_summary)
    m = _measure(torch, index, before, plan, steps, recipe_dir=recipe_dir, device=device)
    return ProbeResult(
        steps=steps,
        device=f"cuda:{index}",
        gpu_name=torch.cuda.get_device_name(index),
        device_total_bytes=int(before.device_total),
        free_bytes_before=int(before.free),
        other_processes=before.others,
        other_processes_bytes=before.others_bytes,
        peak_allocated_bytes=int(m.peak_allocated),
        peak_reserved_bytes=int(m.peak_reserved),
        process_total_bytes=int(m.total),
        process_total_source=m.source,
        estimate=estimate_summary,
        losses=m.losses,
        samples=f"synthetic: {m.samples} samples of exactly {plan.seq_len} tokens (what the estimate assumes)",
        notes=before.notes,
    )


def _require_cuda(steps: int, device: str | None):
    """torch, once it is clear there is a CUDA GPU to measure on and a sensible number of steps."""
    if steps < 1 or steps > 1000:
        raise ProbeError(f"--probe: the number of steps must be between 1 and 1000; got {steps}")
    import torch

    if device == "cpu" or not torch.cuda.is_available():
        raise ProbeError(
            "--probe: peak memory can only be measured on a CUDA GPU and torch sees none here "
            f"(torch {torch.__version__}, torch.cuda.is_available() is False); nothing was measured. "
            "Run the probe on the GPU you plan to train on"
        )
    return torch


@dataclass
class _Before:
    """The GPU before the model loads: free and total memory, torch's pool, NVML's view of the processes."""

    free: int
    device_total: int
    reserved_at_start: int
    nvml: Any
    handle: Any
    others: list[GPUProcess]
    others_bytes: int | None
    own_now: int | None
    notes: list[str]


def _gpu_before(torch, index: int) -> _Before:
    free_before, device_total = torch.cuda.mem_get_info(index)
    reserved_at_start = torch.cuda.memory_reserved(index)
    nvml, handle = _nvml_handle(index)
    me = os.getpid()
    others: list[GPUProcess] = []
    others_bytes: int | None = None
    own_now: int | None = None
    notes: list[str] = []
    if nvml is not None:
        procs = _nvml_processes(nvml, handle)
        others = [p for p in procs if p.pid != me]
        mine = [p for p in procs if p.pid == me]
        own_now = mine[0].bytes if mine else None
        others_bytes = sum(p.bytes or 0 for p in others)
        if not mine:
            notes.append("NVML does not list this process (a container PID namespace?): the process total falls back "
                         "to mem_get_info and other processes' figures may include this one")
    else:
        notes.append("nvidia-ml-py (pynvml) is not installed: other processes' memory is unknown and the process total "
                     "is an upper bound from torch.cuda.mem_get_info; `pip install nvidia-ml-py` for exact figures")
    return _Before(free=free_before, device_total=device_total, reserved_at_start=reserved_at_start, nvml=nvml,
                   handle=handle, others=others, others_bytes=others_bytes, own_now=own_now, notes=notes)


def _refuse_when_short(torch, index: int, before: _Before, estimate_summary: EstimateSummary) -> None:
    """Refuse to measure when the free memory is below the estimate (it would only show an out-of-memory error)."""
    available = before.free + (before.own_now or 0)
    if available >= estimate_summary.total_bytes:
        return
    others = before.others
    held = (f"; other processes hold {(before.others_bytes or 0) / _GIB:.2f} GiB "
            f"({', '.join(f'pid {p.pid}: {(p.bytes or 0) / _GIB:.2f} GiB' for p in others)})" if others else "")
    raise ProbeError(
        f"--probe: {torch.cuda.get_device_name(index)} has {available / _GIB:.2f} GiB free and the estimate needs "
        f"{estimate_summary.total_bytes / _GIB:.2f} GiB{held}; free the GPU (stop those processes) or probe a "
        "smaller plan (`canifinetune suggest`) — measuring now would only show an out-of-memory error"
    )


@dataclass
class _Measured:
    peak_allocated: int
    peak_reserved: int
    total: int  # this process on the GPU at its peak
    source: str  # how ``total`` was measured
    losses: list[float]
    samples: int


def _measure(torch, index: int, before: _Before, plan: TrainingPlan, steps: int, *, recipe_dir: Path | None,
             device: str | None) -> _Measured:
    """Train ``steps`` steps on synthetic samples and read the peaks (NVML's process figure when it has one)."""
    from .runtime import model_source, prepare

    config, _ = model_source(plan, recipe_dir)
    vocab = int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size") or 32000)
    ids = synthetic_token_ids(plan, steps, vocab)
    with tempfile.TemporaryDirectory(prefix="canifinetune-probe-") as tmp:
        prepared = prepare(plan, recipe_dir=recipe_dir, token_ids=ids, device=device, max_steps=steps,
                           output_dir=Path(tmp))
        torch.cuda.synchronize(index)
        torch.cuda.reset_peak_memory_stats(index)
        prepared.trainer.train()
        torch.cuda.synchronize(index)
        peak_alloc = torch.cuda.max_memory_allocated(index)
        peak_reserved = torch.cuda.max_memory_reserved(index)
        reserved_now = torch.cuda.memory_reserved(index)
        losses = [float(h["loss"]) for h in prepared.trainer.state.log_history if "loss" in h]
        own_end = None
        if before.nvml is not None:
            mine = [p for p in _nvml_processes(before.nvml, before.handle) if p.pid == os.getpid()]
            own_end = mine[0].bytes if mine else None
        if own_end is not None:
            # NVML's figure is now; outside torch's reserved pool it is the context and kernel images
            total = peak_reserved + max(0, own_end - reserved_now)
            source = "NVML: this process's GPU memory now, minus torch's reserved pool now, plus the reserved peak"
        else:
            context_and_others = max(0, (before.device_total - before.free) - before.reserved_at_start)
            total = peak_reserved + context_and_others
            source = ("torch.cuda.mem_get_info: reserved peak plus everything on the GPU before the model loaded "
                      "(this process's CUDA context and any other process): an upper bound")
        del prepared
    return _Measured(peak_allocated=peak_alloc, peak_reserved=peak_reserved, total=total, source=source,
                     losses=losses, samples=len(ids))


def format_probe(result: ProbeResult) -> str:
    def g(n: int | None) -> str:
        return "unknown" if n is None else f"{n / _GIB:8.3f} GiB"

    e = result.estimate
    r = result.ratios()
    lines = [
        f"probe: {result.steps} steps on {result.gpu_name} ({result.device}, {g(result.device_total_bytes).strip()}); "
        f"{result.samples}",
        f"other processes on this GPU: {g(result.other_processes_bytes).strip()}"
        + ("".join(f"\n  pid {p.pid}: {g(p.bytes).strip()}" for p in result.other_processes)),
        f"{'':16}{'measured':>14}{'estimate':>14}{'ratio':>8}",
        f"{'peak allocated':16}{g(result.peak_allocated_bytes):>14}{g(e.peak_allocated_bytes):>14}"
        f"{r['allocated']:8.2f}",
        f"{'peak reserved':16}{g(result.peak_reserved_bytes):>14}{g(e.peak_reserved_bytes):>14}{r['reserved']:8.2f}",
        f"{'process total':16}{g(result.process_total_bytes):>14}{g(e.total_bytes):>14}{r['total']:8.2f}",
        f"process total from {result.process_total_source}",
        "losses: " + ", ".join(f"{x:.4f}" for x in result.losses),
    ]
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)
