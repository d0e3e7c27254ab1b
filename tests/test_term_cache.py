"""The term caches (estimator/term_cache.py) key each term on every field but those it ignores: changing an ignored
field leaves the term as it was when computed afresh. Checked over one plan of each change of the snapshot grid
(benchmarks/estimate_snapshot.py: every method, stack, trainer, sharding, offload, quantization and knob), the
models taken in turn; a field is checked only where its other value makes a valid plan, and every ignored field must
have been checked on at least MIN_CHECKED plans, so the test cannot pass by skipping."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from benchmarks import estimate_snapshot
from canifinetune.estimator import estimate as estimate_module
from canifinetune.estimator import inventory, phases, term_cache
from canifinetune.estimator.errors import CanIFinetuneError
from canifinetune.estimator.model_sources import resolve_model
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.resolved import resolve

MIN_CHECKED = 5  # gpus_per_node varies validly on the multi-node changes alone
DATASET = "data.jsonl"  # a name: nothing reads it to estimate


# field -> a second value, from the plan's own
OTHER_VALUE = {
    "seq_len": lambda v: v * 2, "batch_size": lambda v: v + 1,
    "gradient_accumulation_steps": lambda v: 4 if v == 1 else 1,
    "num_gpus": lambda v: v * 2, "num_nodes": lambda v: 2 if v in (None, 1) else 1,
    "gpus_per_node": lambda v: 4 if v == 8 else 8, "gpu": lambda v: "H100 SXM" if v == "RTX 4090" else "RTX 4090",
    "gpu_vram_gb": lambda v: 24.0 if v != 24.0 else 48.0, "host_ram_gb": lambda v: 512.0,
    "headroom_percent": lambda v: 25.0,
    "learning_rate": lambda v: 1e-3, "max_steps": lambda v: 7, "num_train_epochs": lambda v: 3.0,
    "output_dir": lambda v: "elsewhere", "dataset": lambda v: DATASET if v is None else None,
    "attn_implementation": lambda v: "sdpa" if v == "eager" else "eager",
    "loss_implementation": lambda v: "chunked" if v == "standard" else "standard",
    "optim": lambda v: "sgd" if v == "adafactor" else "adafactor",
    "sharding": lambda v: "zero2" if v == "zero3" else "zero3",
}


def _other(field: str, plan: TrainingPlan):
    """A second value of ``field`` for ``plan`` (a flag flipped)."""
    value = getattr(plan, field)
    return OTHER_VALUE[field](value) if field in OTHER_VALUE else not value


TERMS = {
    "inventory": (term_cache.INVENTORY, inventory.build),
    "static": (term_cache.STATIC, phases._static),
    "activations": (term_cache.ACTIVATIONS, phases._activations),
    "peaks": (term_cache.PEAKS, estimate_module._compute_phase_peaks),
}


def _plans() -> list[TrainingPlan]:
    """One plan per change of the snapshot grid, the grid's models taken in turn."""
    grid = estimate_snapshot.grid_plans()
    models = estimate_snapshot.GRID_MODELS
    out = []
    for i, change in enumerate(estimate_snapshot.GRID_CHANGES):
        for method in ("full", "lora", "qlora"):
            try:
                out.append(TrainingPlan(**grid[f"grid/{models[i % len(models)]}/{method}/{change}"]))
            except ValidationError:
                continue
    return out


def _term(compute, plan: TrainingPlan):
    """The term computed afresh, or None where the plan is refused (by ``resolve``: no term is computed then)."""
    try:
        return compute(resolve(plan, resolve_model(plan.model).spec))
    except CanIFinetuneError:
        return None


@pytest.mark.parametrize("name", sorted(TERMS))
def test_a_term_does_not_read_the_fields_its_cache_ignores(name):
    cache, compute = TERMS[name]
    checked = dict.fromkeys(cache.plan_ignores, 0)
    for plan in _plans():
        base = _term(compute, plan)
        for field in sorted(cache.plan_ignores) if base is not None else ():
            try:
                other = plan.replace(**{field: _other(field, plan)})
            except (ValidationError, CanIFinetuneError):
                continue
            varied = _term(compute, other)
            if varied is None or getattr(other, field) == getattr(plan, field):
                continue
            assert varied == base, f"{name} reads {field}: {plan.model} {plan.method} {plan}"
            checked[field] += 1
    rarely = {f: n for f, n in checked.items() if n < MIN_CHECKED}
    assert not rarely, f"ignored fields hardly ever varied validly: {rarely}"


def test_a_cached_term_is_the_computed_one_and_a_changed_plan_misses():
    plan = TrainingPlan(model="Qwen/Qwen2.5-0.5B", method="lora", seq_len=1024)
    spec = resolve_model(plan.model).spec
    for cache, compute in TERMS.values():
        first = cache.get(resolve(plan, spec), compute)
        assert cache.get(resolve(plan, spec), compute) is first  # a hit: the same record
        assert first == compute(resolve(plan, spec))
    read_by_static = plan.replace(optim="sgd")  # optimizer states: not an ignored field of the static terms
    assert (term_cache.STATIC.get(resolve(read_by_static, spec), phases._static)
            != term_cache.STATIC.get(resolve(plan, spec), phases._static))
    read_by_activations = plan.replace(seq_len=2048)
    assert (term_cache.ACTIVATIONS.get(resolve(read_by_activations, spec), phases._activations)
            != term_cache.ACTIVATIONS.get(resolve(plan, spec), phases._activations))


def test_a_full_cache_starts_again(monkeypatch):
    monkeypatch.setattr(term_cache, "CACHE_ENTRIES", 2)
    spec = resolve_model("Qwen/Qwen2.5-0.5B").spec
    for seq_len in (256, 512, 1024):
        term_cache.ACTIVATIONS.get(resolve(TrainingPlan(model="Qwen/Qwen2.5-0.5B", method="lora", seq_len=seq_len),
                                           spec), phases._activations)
    assert len(term_cache.ACTIVATIONS.values) == 1
