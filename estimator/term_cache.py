"""Terms computed once per distinct input, across the plans a search or a server evaluates.

A search (estimator/search.py) judges a hundred plans that differ in a few fields: the same model on several
GPU counts and shardings, at several sequence lengths and batch sizes. The inventory (estimator/inventory.py) reads
neither the sequence and batch nor where its tensors go; the static components (weights, gradients, optimizer states
and their shares) do not read the sequence or the batch; the activations do not read the GPU count, the optimizer or
the offload settings; no phase peak reads the card. Each cache below names the fields its
term never reads, and keys the term on everything else: the model spec, the resolved facts of the plan and the
plan's other fields. ``resolve`` is a function of the plan and the spec, so nothing that could change the term is
left out of its key. tests/test_term_cache.py changes each ignored field over the snapshot plans and finds the
term unchanged; that test, not this docstring, is what keeps an ignored field ignored.

The cached values are frozen records, shared between callers. Each cache is bounded and simply emptied when full
(safe from the MCP server's worker threads: a dict's get and set are atomic under the GIL, and a lost entry is only
computed again).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from operator import itemgetter
from typing import TypeVar

from .plan import TrainingPlan
from .resolved import ResolvedPlan

T = TypeVar("T")

# Plan fields no memory term reads: the card and the host (only the budget and verdict read them, after the peaks),
# how long the run trains and on which data (the throughput reads those).
HARDWARE_AND_RUN_FIELDS = frozenset({"gpu", "gpu_vram_gb", "host_ram_gb", "headroom_percent", "learning_rate",
                                     "max_steps", "num_train_epochs", "output_dir", "dataset", "truncation"})
# What the static components never read: the tokens of a micro-batch and how their activations are kept.
STATIC_IGNORES = HARDWARE_AND_RUN_FIELDS | {"seq_len", "batch_size", "gradient_checkpointing", "attn_implementation",
                                            "loss_implementation", "packing", "padding_free"}
STATIC_IGNORES_RESOLVED = frozenset({"tokens", "attn_implementation", "attention_kernel", "attention_mask",
                                     "loss_implementation", "scored_per_row", "warnings"})
# What the activations never read: how the training state is held and spread over GPUs (gradient accumulation
# adds live gradients, which phases.py counts with the static terms, not with the activations).
ACTIVATION_IGNORES = HARDWARE_AND_RUN_FIELDS | {"optim", "gradient_accumulation_steps", "offload_optimizer",
                                                "offload_params", "num_gpus", "num_nodes", "gpus_per_node"}
# What the inventory (estimator/inventory.py: every tensor the step keeps, before any placement) never read: the
# static components' ignores and where the tensors go (estimator/sharding.py places the records per engine).
INVENTORY_IGNORES = STATIC_IGNORES | {"num_gpus", "num_nodes", "gpus_per_node", "sharding", "offload_optimizer",
                                      "offload_params"}
NO_RESOLVED_IGNORES: frozenset[str] = frozenset()
# Entries kept per cache: a search evaluates a few hundred plans; each entry is a few kB of records and notes.
CACHE_ENTRIES = 2048
# ResolvedPlan fields that are not facts of the plan (the plan itself and the spec are keyed apart; the memo is
# derived)
_NOT_FACTS = frozenset({"plan", "spec", "memo"})
_RESOLVED_FACTS = tuple(f.name for f in fields(ResolvedPlan) if f.name not in _NOT_FACTS)


# The plan's list-valued fields (target_modules, modules_to_save): made tuples to be part of a key
_LIST_FIELDS = frozenset(name for name, f in TrainingPlan.model_fields.items() if "list[" in str(f.annotation))


class TermCache:
    """One term's values by what it reads: the spec, the resolved facts and the plan fields it does not ignore."""

    def __init__(self, plan_ignores: frozenset[str], resolved_ignores: frozenset[str] = NO_RESOLVED_IGNORES):
        self.plan_ignores = plan_ignores
        self.resolved_ignores = resolved_ignores
        kept = [name for name in TrainingPlan.model_fields if name not in plan_ignores]
        self._plan_values = itemgetter(*(name for name in kept if name not in _LIST_FIELDS))
        self._plan_lists = tuple(name for name in kept if name in _LIST_FIELDS)
        self._facts = itemgetter(*(name for name in _RESOLVED_FACTS if name not in resolved_ignores))
        self.values: dict[int, tuple[tuple, object]] = {}

    def key(self, r: ResolvedPlan) -> tuple:
        """What the term of ``r`` is a function of (``resolve`` is a function of the plan and the spec)."""
        plan = r.plan.__dict__
        lists = tuple(None if plan[name] is None else tuple(plan[name]) for name in self._plan_lists)
        return r.spec, self._facts(r.__dict__), self._plan_values(plan), lists

    def get(self, r: ResolvedPlan, compute: Callable[[ResolvedPlan], T]) -> T:
        key = self.key(r)
        digest = hash(key)  # once: a tuple does not keep its hash, and the entry is looked up and stored under it
        entry = self.values.get(digest)
        if entry is not None and entry[0] == key:
            return entry[1]  # type: ignore[return-value]
        value = compute(r)
        if len(self.values) >= CACHE_ENTRIES:
            self.values.clear()
        self.values[digest] = (key, value)  # a colliding key replaces the entry; its own key is compared on a hit
        return value

    def clear(self) -> None:
        self.values.clear()


INVENTORY = TermCache(INVENTORY_IGNORES, STATIC_IGNORES_RESOLVED)
STATIC = TermCache(STATIC_IGNORES, STATIC_IGNORES_RESOLVED)
ACTIVATIONS = TermCache(ACTIVATION_IGNORES)
PEAKS = TermCache(HARDWARE_AND_RUN_FIELDS)
ALL = (INVENTORY, STATIC, ACTIVATIONS, PEAKS)


def clear_all() -> None:
    """Empty every cache (for benchmarks of cold calls, and tests that compare against uncached terms)."""
    for cache in ALL:
        cache.clear()
