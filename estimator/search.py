"""suggest(): the best fitting configuration of each kind the user could choose, each with what it costs.

When a plan does not fit, the search looks for the smallest changes that make it fit, classifies each by
the kind of choice it is (:data:`~.costs.KINDS`: same mathematics; lower precision, a 4-bit base or
8-bit optimizer states; fewer trainable parameters; a shorter context; CPU offload; more GPUs; a larger
catalog GPU), keeps the cheapest of each kind and ranks them by one number, the user cost
(:func:`~.costs.user_cost`: the quality penalty of changes that alter what is learned, plus the
slowdown the throughput model gives, the hardware added and offload; ``docs/search.md``). Each change
also has a tier (``same_math``, ``changes_learning``, ``more_hardware``) that says what happens to the
mathematics.

The search is bounded: single-knob moves first (the mildest level of each knob that fits), then
greedy combinations that add knobs in cost order until the plan fits, then a minimality pass that
drops whole knobs, relaxes each remaining knob to its mildest fitting level, and finally reverts any
single field whose reversal still fits and is not more expensive. Every suggestion is therefore
minimal: reverting any one of its changes makes it invalid, not fit, or not cheaper.

Pinned fields (``keep``) never change. Plans the estimator refuses (a :class:`PlanError`, or a
validation error from an illegal combination) are skipped.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable

from pydantic import BaseModel, Field, ValidationError

from . import catalog
from .backends import gpu_runs_plan
from .costs import COST_MODEL_TEXT, FULLNESS_FREE_BELOW, Change, Cost, cost_of, sort_key
from .errors import CanIFinetuneError, PlanError
from .estimate import Estimate, Judgement, estimate, judge
from .knobs import GPU_COUNTS, MULTI_GPU_SHARDINGS, Knob, build_knobs, divisors_below
from .model_sources import ResolvedModel, resolve_model
from .plan import MAX_NUM_GPUS, MAX_STRING, PLAN_FIELDS, TrainingPlan
from .throughput import APPROXIMATE_LABEL, Throughput, throughput

# GPUs in one machine when the catalog does not say (an 8-GPU server board: HGX, OAM)
DEFAULT_GPUS_PER_NODE = 8
# The GPU layout: num_gpus = num_nodes x gpus_per_node, changed (and reverted) together
NODE_FIELDS = ("num_gpus", "num_nodes", "gpus_per_node")
# How many of the first suggestions must include a 4-bit (QLoRA) option when one fits (issue 21: the tier question
# a practitioner asks first)
QLORA_WITHIN_FIRST = 3
# A larger GPU is a step up in memory, not the same class with a few more MiB: at least 10% more than the plan's card
# (an RTX 3090's 24.0 GiB over an RTX 4090's 23.88 GiB is no "larger GPU": the plan would sit at the same boundary on
# an older, slower card)
LARGER_GPU_MIN_GAIN = 1.10


class Suggestion(BaseModel):
    rank: int
    qlora_rule: bool = Field(False, description="placed by the rule that a QLoRA option that fits is among the first "
                                                "three (docs/search.md), not by its cost")
    changes: list[Change]
    cost: Cost
    estimate: Estimate
    throughput: Throughput
    plan: TrainingPlan


class SuggestResult(BaseModel):
    """The outcome of :func:`suggest`."""

    plan: TrainingPlan
    original: Estimate
    original_throughput: Throughput
    fits_already: bool = Field(description="the plan fits as it is; no change is needed")
    keep: list[str] = Field(description="pinned fields: no suggestion changes them")
    suggestions: list[Suggestion]
    nothing_fits: bool = Field(description="no change on the plan's own GPUs (same count) makes it fit")
    min_reachable_bytes: int | None = Field(
        None, description="the smallest budget_bytes reachable on this GPU (same count) with any allowed change")
    min_reachable_changes: list[Change] = Field(default_factory=list)
    smallest_gpu: str | None = Field(None, description="the smallest catalog GPU on which the original plan fits")
    smallest_gpu_usable_bytes: int | None = None
    min_gpus: int | None = Field(
        None, description="the fewest GPUs of this kind on which the original plan fits (sharding changed only)"
    )
    min_gpus_sharding: str | None = None
    min_gpus_nodes: int | None = Field(
        None, description="the nodes (machines) min_gpus takes: 1, or whole machines of the card's max_per_node")
    training_tokens: int | None = None
    cost_model: str = COST_MODEL_TEXT
    throughput_label: str = APPROXIMATE_LABEL
    plans_evaluated: int = 0
    notes: list[str] = Field(default_factory=list)


# ------------------------------------------------------------------ evaluating plans

def _freeze(v):
    return tuple(v) if isinstance(v, list) else v


class _Evaluator:
    """Evaluates plans (original + changes) once each, skipping illegal ones. A plan is judged (verdict and budget,
    estimator/estimate.py ``judge``); the itemized estimate is built only for the plans the search returns."""

    def __init__(self, plan: TrainingPlan, rm: ResolvedModel):
        self.plan = plan
        self.rm = rm
        self.cache: dict[frozenset, tuple[TrainingPlan, Judgement] | None] = {}
        self.estimates: dict[frozenset, Estimate] = {}
        self.tp_cache: dict[frozenset, Throughput] = {}
        self.cards: dict[str, catalog.CatalogGPU | None] = {}
        self.frozen_plan = {name: _freeze(value) for name, value in plan.__dict__.items()}  # what key() compares to

    def card(self, name: str) -> catalog.CatalogGPU | None:
        if name not in self.cards:
            self.cards[name] = catalog.find_gpu(name)
        return self.cards[name]

    def key(self, changes: dict) -> frozenset:
        plan = self.frozen_plan
        return frozenset(item for item in ((k, _freeze(v)) for k, v in changes.items()) if plan[item[0]] != item[1])

    def clean(self, changes: dict) -> dict:
        plan = self.frozen_plan
        return {k: v for k, v in changes.items() if plan[k] != _freeze(v)}

    def get(self, changes: dict) -> tuple[TrainingPlan, Judgement] | None:
        k = self.key(changes)
        if k in self.cache:
            return self.cache[k]
        try:
            plan = self.plan.replace(**self.clean(changes)) if k else self.plan
            card = self.card(plan.gpu) if k and plan.gpu else None
            if card is not None and gpu_runs_plan(card, plan) is not None:
                out = None  # the card does not run the plan's kernels (bitsandbytes, flash-attn): never suggested
            else:
                out = (plan, judge(plan, model=self.rm))
        except (ValidationError, CanIFinetuneError):
            out = None
        self.cache[k] = out
        return out

    def estimate(self, changes: dict) -> Estimate:
        """The itemized estimate of a plan already judged legal (``get``)."""
        k = self.key(changes)
        if k not in self.estimates:
            got = self.get(changes)
            assert got is not None, "estimate() of a plan the search found illegal"
            self.estimates[k] = estimate(got[0], model=self.rm)
        return self.estimates[k]

    def least_budget(self) -> tuple[TrainingPlan, Judgement] | None:
        """The plan with the least budget of every plan evaluated so far on the original number of GPUs (the first
        evaluated on a tie), or None when none was legal."""
        best = None
        for got in self.cache.values():  # in the order they were evaluated
            if got is not None and got[0].num_gpus == self.plan.num_gpus and (
                    best is None or got[1].budget_bytes < best[1].budget_bytes):
                best = got
        return best

    def fits(self, changes: dict) -> bool:
        got = self.get(changes)
        return got is not None and got[1].verdict == "fits"

    def roomy(self, changes: dict) -> bool:
        """Fits with room: at most FULLNESS_FREE_BELOW of the GPU's usable memory."""
        got = self.get(changes)
        return (got is not None and got[1].verdict == "fits"
                and (got[1].used_fraction or 0.0) <= FULLNESS_FREE_BELOW)

    def budget(self, changes: dict) -> float:
        got = self.get(changes)
        return math.inf if got is None else got[1].budget_bytes

    def throughput(self, changes: dict, training_tokens: int | None = None) -> Throughput:
        k = self.key(changes)
        if training_tokens is None and k in self.tp_cache:
            return self.tp_cache[k]
        got = self.cache.get(k)  # the plan judged already, when it was (the search asks the cost of plans it judged)
        plan = got[0] if got is not None else self.plan.replace(**self.clean(changes)) if k else self.plan
        tp = throughput(plan, model=self.rm, training_tokens=training_tokens)
        if training_tokens is None:
            self.tp_cache[k] = tp
        return tp


# ------------------------------------------------------------------ the search

def _mildest_fitting(ev: _Evaluator, base: dict, knob: Knob) -> dict | None:
    """The mildest level of ``knob`` that fits on top of ``base``; None if none does. A same-mathematics knob
    (tier 0) goes on to its mildest level with room (at most FULLNESS_FREE_BELOW of the GPU) when one exists: a
    smaller micro-batch costs nothing in what is learned, running at the limit does (docs/search.md, "Room")."""
    fitting = _mildest(ev, base, knob, ev.fits)
    if fitting is None or knob.tier != 0 or ev.roomy({**base, **fitting}):
        return fitting
    return _mildest(ev, base, knob, ev.roomy) or fitting


def _mildest(ev: _Evaluator, base: dict, knob: Knob, ok) -> dict | None:
    """The first level of ``knob`` (mild -> strong) for which ``ok`` holds on top of ``base``."""
    levels = knob.levels
    if knob.monotone and len(levels) > 4:
        if not ok({**base, **levels[-1]}):
            return None
        lo, hi = 0, len(levels) - 1  # find the first index that passes
        while lo < hi:
            mid = (lo + hi) // 2
            if ok({**base, **levels[mid]}):
                hi = mid
            else:
                lo = mid + 1
        return levels[lo]
    for lv in levels:
        if ok({**base, **lv}):
            return lv
    return None


def _strongest(ev: _Evaluator, base: dict, knob: Knob) -> dict | None:
    """The level of ``knob`` with the lowest budget on top of ``base`` (None when none lowers it)."""
    if knob.monotone:
        cands = [knob.levels[-1]]
    else:
        cands = knob.levels
    best, best_b = None, ev.budget(base)
    for lv in cands:
        b = ev.budget({**base, **lv})
        if b < best_b:
            best, best_b = lv, b
    return best


class _Search:
    def __init__(self, plan: TrainingPlan, rm: ResolvedModel, keep: set[str]):
        self.plan = plan
        self.rm = rm
        self.keep = keep
        self.ev = _Evaluator(plan, rm)
        self.base_tp = self.ev.throughput({})
        self.knobs = build_knobs(plan, rm, keep)
        self.cost_cache: dict[frozenset, Cost] = {}
        here = catalog.find_gpu(plan.gpu) if plan.gpu else None
        self.gpu_here = here
        # GPUs one machine of this card holds: counts up to it are one node, more only as whole nodes (of the plan's
        # own nodes when it already spans several)
        self.per_node = (plan.node_gpus if plan.num_nodes > 1
                         else getattr(here, "max_per_node", None) or DEFAULT_GPUS_PER_NODE)
        self.multi_node = False  # set when nothing on one node fits: then whole nodes are searched
        self.qlora_pick: frozenset | None = None  # the QLoRA option the tier rule placed (_with_qlora_early)

    def cost(self, changes: dict) -> Cost:
        k = self.ev.key(changes)
        if k not in self.cost_cache:
            got = self.ev.get(changes)
            assert got is not None
            self.cost_cache[k] = cost_of(self.plan, got[0], self.rm, self.base_tp, self.ev.throughput(changes),
                                         used_fraction=got[1].used_fraction,
                                         host_memory_bytes=got[1].host_memory_bytes)
        return self.cost_cache[k]

    def _order(self, knob: Knob) -> int:
        """A knob's place in cost order (a knob made for one search, such as a larger GPU, comes last)."""
        return self.knobs.index(knob) if knob in self.knobs else len(self.knobs)

    def minimize(self, applied: list[tuple[Knob, dict]]) -> dict | None:
        """Drop whole knobs, relax the rest to their mildest fitting level, then revert single fields."""
        def merged(items):
            out: dict = {}
            for _, lv in items:
                out.update(lv)
            return out

        items = list(applied)
        if not self.ev.fits(merged(items)):
            return None

        def relax(which):
            for idx in sorted(range(len(items)), key=lambda i: (-items[i][0].tier, -self._order(items[i][0]))):
                knob, _ = items[idx]
                if not which(knob):
                    continue
                others = merged(items[:idx] + items[idx + 1:])
                lv = _mildest_fitting(self.ev, others, knob)
                if lv is not None:
                    items[idx] = (knob, lv)

        def drop(which):
            nonlocal items
            for entry in sorted(items, key=lambda kv: (-kv[0].tier, -self._order(kv[0]))):
                if not which(entry[0]) or entry[0].forced:
                    continue
                trial = [x for x in items if x is not entry]
                if self.ev.fits(merged(trial)):
                    items = trial

        # 1. the expensive knobs first: drop those not needed, and relax the rest to their mildest
        #    fitting level with every cheap knob still at its strongest (the longest context, the
        #    highest rank that fits)
        drop(lambda k: k.tier >= 1)
        relax(lambda k: k.tier >= 1)
        # 2. then the cheap knobs: drop those the relaxed plan no longer needs, relax the rest
        drop(lambda k: k.tier == 0)
        relax(lambda k: k.tier == 0)
        changes = self.ev.clean(merged(items))
        # 3. revert single fields while that fits and is not more expensive
        held = {f for knob, lv in items if knob.forced for f in lv}
        return self.field_pass(changes, held)

    def field_pass(self, changes: dict, held: set[str] | frozenset[str] = frozenset()) -> dict:
        """Revert single fields (not those ``held``) while the plan still fits and costs no more."""
        improved = True
        while improved:
            improved = False
            cur_key = sort_key(self.cost(changes))
            for f in list(changes):
                if f in held or f in NODE_FIELDS[1:]:
                    continue  # the nodes go with num_gpus, reverted only with it (else a node grows past a machine)
                together = NODE_FIELDS if f == "num_gpus" else (f,)
                trial = {k: v for k, v in changes.items() if k not in together}
                if self.ev.fits(trial) and sort_key(self.cost(trial)) <= cur_key:
                    changes = trial
                    improved = True
                    break
        return changes

    def combo(self, knobs: list[Knob]) -> dict | None:
        """Add knobs in cost order at their strongest level until the plan fits; then minimize."""
        applied: list[tuple[Knob, dict]] = []
        state: dict = {}
        for knob in knobs:
            lv: dict | None
            if knob.forced:
                lv = knob.levels[0]
                if self.ev.get({**state, **lv}) is None:
                    return None
            elif knob.tier == 2:
                lv = _mildest_fitting(self.ev, state, knob)
                if lv is None:
                    return None
            else:
                lv = _strongest(self.ev, state, knob)
                if lv is None:
                    continue
            applied.append((knob, lv))
            state = {**state, **lv}
            if self.ev.fits(state):
                return self.minimize(applied)
        return None

    def layout(self, n: int) -> dict:
        """``n`` GPUs as machines hold them: one node up to ``per_node``, else whole nodes of ``per_node`` (the plan's
        num_nodes and gpus_per_node set to match)."""
        if n > self.per_node and n % self.per_node == 0:
            return {"num_gpus": n, "num_nodes": n // self.per_node, "gpus_per_node": self.per_node}
        return {"num_gpus": n, "num_nodes": 1, "gpus_per_node": None}

    def hw_level(self, state: dict, n: int, sharding: str) -> dict | None:
        """``n`` GPUs with ``sharding`` on top of ``state``, keeping the effective batch when the micro-batch
        and accumulation allow it (largest micro-batch that fits first); else the batch as it is."""
        p = self.plan
        b = state.get("batch_size", p.batch_size)
        g = state.get("gradient_accumulation_steps", p.gradient_accumulation_steps)
        lv: dict = self.layout(n)
        if sharding != p.sharding:
            lv["sharding"] = sharding
        eff = b * g * p.num_gpus
        for b2 in [b, *divisors_below(b)]:
            if b2 != b and "batch_size" in self.keep:
                continue
            if eff % (b2 * n):
                continue
            g2 = eff // (b2 * n)
            if g2 != g and "gradient_accumulation_steps" in self.keep:
                continue
            trial = {**state, **lv, "batch_size": b2, "gradient_accumulation_steps": g2}
            if self.ev.fits(trial):
                return self.ev.clean({**lv, "batch_size": b2, "gradient_accumulation_steps": g2})
        trial = {**state, **lv}
        if self.ev.fits(trial):
            return lv
        return None

    def hw_possible(self, state: dict, n: int, shardings: tuple[str, ...]) -> bool:
        """Whether the least-memory layout on ``n`` GPUs fits (memory falls with sharding and micro-batch)."""
        p = self.plan
        sh = "zero3" if "zero3" in shardings else shardings[-1]
        b = state.get("batch_size", p.batch_size)
        g = state.get("gradient_accumulation_steps", p.gradient_accumulation_steps)
        lv: dict = {**self.layout(n), "sharding": sh}
        if "batch_size" not in self.keep:
            lv["batch_size"] = 1
            if "gradient_accumulation_steps" not in self.keep:
                lv["gradient_accumulation_steps"] = max(1, b * g * p.num_gpus // n)
        return self.ev.fits({**state, **lv})

    def gpu_counts(self) -> list[int]:
        """The GPU counts a machine of this card has (up to per_node), or, once nothing on one node fits, whole
        nodes of it (2, 4, 8 nodes)."""
        if self.multi_node:
            return [self.per_node * k for k in (2, 4, 8) if self.per_node * k <= MAX_NUM_GPUS]
        return [n for n in GPU_COUNTS if n <= self.per_node]

    def hw_combo(self, tier0: list[Knob], start: dict | None = None) -> dict | None:
        """Same-math knobs at their strongest (over ``start``: a change of method), then the fewest GPUs that fit;
        then minimize."""
        if "num_gpus" in self.keep or self.plan.num_gpus >= MAX_NUM_GPUS:
            return None
        applied: list[tuple[Knob, dict]] = []
        state: dict = dict(start or {})
        if start:
            if self.ev.get(state) is None:
                return None
            applied.append((Knob("method", 1, [start]), start))
        for knob in tier0:
            lv = _strongest(self.ev, state, knob)
            if lv is not None:
                applied.append((knob, lv))
                state = {**state, **lv}
        if applied and self.ev.fits(state):
            return None  # fits without more hardware: a hardware suggestion would not be minimal
        shardings = ((self.plan.sharding,) if ("sharding" in self.keep or self.plan.sharding not in ("none", "ddp"))
                     else MULTI_GPU_SHARDINGS)
        for n in self.gpu_counts():
            if n <= self.plan.num_gpus or n > MAX_NUM_GPUS:
                continue
            if not self.hw_possible(state, n, shardings):
                continue  # not even the most sharded, smallest-batch layout fits on n GPUs
            for sh in shardings:
                lv = self.hw_level(state, n, sh)
                if lv is None:
                    continue
                # drop same-math knobs the hardware made unnecessary, most expensive first
                items = list(applied)
                for entry in sorted(items, key=lambda kv: -self._order(kv[0])):
                    trial = [x for x in items if x is not entry]
                    merged: dict = {}
                    for _, l2 in trial:
                        merged.update(l2)
                    if self.ev.fits({**merged, **lv}):
                        items = trial
                merged = {}
                for _, l2 in items:
                    merged.update(l2)
                return self.field_pass(self.ev.clean({**merged, **lv}))
        return None

    def larger_gpu(self, start: dict | None = None) -> dict | None:
        """The smallest catalog GPU (same vendor, one that runs the plan's kernels, fastest among equal sizes)
        larger than the plan's on which the plan fits with same-mathematics changes and no offload (over ``start``:
        a change of method); those changes then minimized."""
        if {"gpu", "gpu_vram_gb"} & self.keep:
            return None
        same = [k for k in self.knobs if k.tier == 0 and k.name not in ("cpu_offload", "optim")]
        applied: list[tuple[Knob, dict]] = []
        state: dict = dict(start or {})
        if start:
            if self.ev.get(state) is None:
                return None
            applied.append((Knob("method", 1, [start]), start))
        for knob in same:
            lv = _strongest(self.ev, state, knob)
            if lv is not None:
                applied.append((knob, lv))
                state = {**state, **lv}
        if self.ev.fits(state):
            return None  # fits on the plan's own GPU: a larger one is not a minimal change
        need = self.ev.budget(state)
        here = self.gpu_here
        usable = self.ev.get({})[1].gpu_usable_bytes or 0  # type: ignore[index]
        vendor, category = (here.vendor, here.category) if here else ("nvidia", "datacenter")
        planned = self.ev.get(state)[0]  # type: ignore[index]
        bigger = sorted((g for g in catalog.load_gpus() if g.vendor == vendor
                         and g.total_memory_bytes >= usable * LARGER_GPU_MIN_GAIN
                         and g.total_memory_bytes >= need and g.name != (here.name if here else None)
                         and gpu_runs_plan(g, planned) is None),
                        key=lambda g: (g.category != category, g.total_memory_bytes,
                                       -(g.tflops_bf16_dense or g.tflops_fp16_dense)))
        for g in bigger:
            move = Knob("gpu", 2, [{"gpu": g.name, "gpu_vram_gb": None}])
            if self.ev.fits({**state, **move.levels[0]}):
                return self.minimize([*applied, (move, move.levels[0])])
        return None

    def run(self) -> list[dict]:
        found: list[dict] = []
        # the two offloads exclude each other (the plan refuses activation offloading under ZeRO/FSDP): each has
        # its own base, so a combination never stalls on the other one being applied first
        activations = [k for k in self.knobs if k.name == "activation_offloading"]
        tier0 = [k for k in self.knobs if k.tier == 0 and k.name != "activation_offloading"]
        tier1 = [k for k in self.knobs if k.tier == 1]
        no_off = [k for k in tier0 if k.name != "cpu_offload"]
        # single-knob moves
        for knob in self.knobs:
            if knob.tier == 2:
                continue
            lv = _mildest_fitting(self.ev, {}, knob)
            if lv is not None:
                found.append(self.field_pass(self.ev.clean(lv)))
        # greedy combinations in cost order, with and without CPU offload (offload is slow: the
        # variant without it reaches the learning-changing alternatives)
        meth = [k for k in tier1 if k.name == "method"]
        free = [k for k in no_off if k.name != "gradient_checkpointing"]
        bases = [tier0]
        if activations:
            bases.insert(0, no_off + activations)
        if len(no_off) < len(tier0):
            bases.insert(0, no_off)
        if len(free) < len(no_off):
            bases.insert(0, free)  # no recomputation either: the faster learning-changing alternatives
        for base in bases:
            recipes: list[list[Knob]] = [base, *([*base, k] for k in tier1)]
            if len(tier1) > 1:
                recipes.append(base + tier1)
                if meth:
                    recipes.append(base + meth + [k for k in tier1 if k.name != "method"])
            for recipe in recipes:
                got = self.combo(recipe)
                if got is not None:
                    found.append(got)
        # a 4-bit option held fixed, whatever else it needs (the tier question a practitioner asks first; the
        # minimality pass would otherwise keep only the cheapest method that fits)
        others = [k for k in tier1 if k.name != "method"]
        for lv in [lv for lv in self.method_moves() if lv.get("method") == "qlora"]:
            qlora = Knob("method", 1, [lv], forced=True)
            for base in bases:
                got = self.combo([qlora, *base, *others])
                if got is not None:
                    found.append(got)
                    break
        # vLLM on its own GPU (GRPO): alone, then with the same-math knobs
        for knob in [k for k in self.knobs if k.name == "vllm_mode"]:
            for base in ([], no_off, tier0):
                got = self.combo([*base, knob])
                if got is not None:
                    found.append(got)
                    break
        found += self.hardware(no_off, tier0)
        if not any(self.ev.fits(ch) for ch in found):
            # nothing on one machine of this card fits: whole nodes of it
            self.multi_node = True
            found += self.hardware(no_off, tier0)
        return found

    def method_moves(self) -> list[dict]:
        """The tier changes a hardware change may come with: each level of the method knob (LoRA, QLoRA)."""
        return [lv for k in self.knobs if k.name == "method" for lv in k.levels]

    def hardware(self, no_off: list[Knob], tier0: list[Knob]) -> list[dict]:
        """More GPUs (alone, with same-math knobs, with offload as a last resort) and a larger GPU, each as the plan
        is and with each change of method (QLoRA on one 80 GB card; QLoRA on two cards with the sharding that
        fits)."""
        found: list[dict] = []
        for start in [{}, *self.method_moves()]:
            for base in ([], no_off, tier0):
                got = self.hw_combo(base, start)
                if got is not None:
                    found.append(got)
                    if base:
                        break
            if not self.multi_node:
                got = self.larger_gpu(start)
                if got is not None:
                    found.append(got)
        return found


def _demands(search: _Search, ch: dict) -> tuple:
    """What a suggestion asks of the user, count by count (lower is better on each). The context lost and a changed
    effective batch are counts of their own, so a change of tier that keeps the user's context and batch is never
    dropped as dominated by a context cut."""
    c = search.cost(ch)
    est = search.ev.get(ch)[1]  # type: ignore[index]
    return (c.quality_penalty, c.slowdown_fraction - 1e-9, c.extra_gpus, int(c.kind == "larger_gpu"),
            int(c.kind == "cpu_offload"), est.host_memory_bytes, c.context_tokens_lost,
            int(c.effective_batch_after != c.effective_batch_before), c.room_cost)


# A suggestion that costs this much more than the first one is not a choice anybody would make (a context cut to a
# quarter with a lower rank beside a change of tier): it is left out (user_cost units, docs/search.md)
MAX_COST_GAP = 6.0


def _best_of_each_kind(ranked: list[dict], search: _Search) -> list[dict]:
    """The first (cheapest) suggestion of each kind, in rank order, less those an earlier one beats or equals on
    every count (quality, slowdown, GPUs added, a larger GPU, offload, host RAM): nobody would choose them."""
    kept: list[dict] = []
    kinds: set[str] = set()
    for ch in ranked:
        kind = search.cost(ch).kind
        if kind in kinds:
            continue
        if (kept and search.cost(ch).tier_rank < 2
                and search.cost(ch).user_cost > search.cost(kept[0]).user_cost + MAX_COST_GAP):
            continue  # hardware (ranked last, by its own cost) is always shown: it is the user's last resort
        mine = _demands(search, ch)
        if any(all(o <= m for o, m in zip(_demands(search, other), mine, strict=True)) for other in kept):
            continue
        kinds.add(kind)
        kept.append(ch)
    return kept


def _is_new_4bit(search: _Search, ch: dict) -> bool:
    plan = search.ev.get(ch)[0]  # type: ignore[index]
    return plan.quantized_4bit and not search.plan.quantized_4bit


def _with_qlora_early(kept: list[dict], everything: list[dict], search: _Search) -> list[dict]:
    """A 4-bit (QLoRA) option among the first QLORA_WITHIN_FIRST whenever one fits: on the user's own GPUs first,
    else on a larger card or more cards of theirs (the cheapest such, by the ranking)."""
    if search.plan.quantized_4bit or "method" in search.keep:
        return kept
    if any(_is_new_4bit(search, ch) for ch in kept[:QLORA_WITHIN_FIRST]):
        return kept
    hardware_kinds = ("more_gpus", "larger_gpu")
    qlora = [ch for ch in everything if _is_new_4bit(search, ch)]
    own = [ch for ch in qlora if search.cost(ch).kind not in hardware_kinds]
    if not qlora:
        return kept
    pick = (own or qlora)[0]
    search.qlora_pick = search.ev.key(pick)
    rest = [ch for ch in kept if ch is not pick]
    at = min(QLORA_WITHIN_FIRST - 1, len(rest))
    return [*rest[:at], pick, *rest[at:]]


def _changes_list(original: TrainingPlan, plan: TrainingPlan) -> list[Change]:
    return [Change(field=f, old=getattr(original, f), new=getattr(plan, f))
            for f in PLAN_FIELDS if getattr(original, f) != getattr(plan, f)]


MAX_KEEP = 64  # at most this many pinned names (there are fewer plan fields); checked before anything else
MAX_SUGGESTIONS = 100
MAX_TRAINING_TOKENS = 10**15


def validate_keep(keep: Iterable[str]) -> list[str]:
    """The pinned field names, checked: an unknown name is an error that lists the valid ones.

    At most MAX_KEEP names, counted before any is looked at; the first unknown one ends the check."""
    if isinstance(keep, str):
        keep = [keep]
    keep = list(itertools.islice(iter(keep), MAX_KEEP + 1))
    if len(keep) > MAX_KEEP:
        raise PlanError(f"keep: at most {MAX_KEEP} field names (there are {len(PLAN_FIELDS)} plan fields)",
                        field="keep")
    out = []
    for name in keep:
        name = str(name)[:MAX_STRING + 1].strip() if isinstance(name, str) else repr(name)[:80]
        if name not in PLAN_FIELDS:
            shown = name if len(name) <= 64 else name[:64] + "..."
            raise PlanError(f"keep: {shown!r} is not a plan field; valid fields are {', '.join(PLAN_FIELDS)}",
                            field="keep")
        if name not in out:
            out.append(name)
    return out


def suggest(plan: TrainingPlan, keep: Iterable[str] = (), max_suggestions: int = 5,
            training_tokens: int | None = None, model: ResolvedModel | None = None) -> SuggestResult:
    """The best fitting configuration of each kind for ``plan``, ranked by the cost model, each with its cost.

    ``keep`` pins plan fields (never changed). ``training_tokens`` adds the approximate training time of
    each plan. Raises PlanError for an unknown pinned field or a plan without a GPU.
    """
    pins = _checked_arguments(keep, max_suggestions, training_tokens)
    rm = model or resolve_model(plan.model)
    original = estimate(plan, model=rm)
    plan = original.plan  # with what the estimate chose for the hardware (dtype, sharding): the search starts there
    if original.verdict == "unknown":
        raise PlanError("gpu: suggest needs a target GPU; pass gpu (a catalog name) or gpu_vram_gb", field="gpu")
    search = _Search(plan, rm, set(pins))
    ev = search.ev
    ev.get({})
    base_tp = ev.throughput({}, training_tokens)
    result = SuggestResult(plan=plan, original=original, original_throughput=base_tp,
                           fits_already=original.verdict == "fits", keep=pins, suggestions=[],
                           nothing_fits=False, training_tokens=training_tokens)
    if result.fits_already:
        result.min_reachable_bytes = original.budget_bytes
        result.notes.append("the plan fits as it is: nothing to change")
        result.plans_evaluated = len(ev.cache)
        return result
    _rank(search, result, max_suggestions, training_tokens)
    _least_memory_on_this_gpu(search, result)
    _other_hardware_for_the_plan(search, result, pins)
    if result.nothing_fits:
        result.notes.append(
            "nothing fits on this GPU with the allowed changes: the least memory reachable is "
            f"{(result.min_reachable_bytes or 0) / 2**30:.2f} GiB of {original.gpu_usable_bytes / 2**30:.2f} GiB"  # type: ignore[operator]
            + (f"; the original plan fits a {result.smallest_gpu}" if result.smallest_gpu else "")
            + (f", or {result.min_gpus} GPUs{_nodes_words(result.min_gpus, result.min_gpus_nodes)} with "
               f"{result.min_gpus_sharding}" if result.min_gpus else ""))
    result.plans_evaluated = len(ev.cache)
    return result


def _nodes_words(gpus: int, nodes: int | None) -> str:
    """' (2 nodes of 8)' for a GPU count that takes several machines, else ''."""
    return f" ({nodes} nodes of {gpus // nodes})" if nodes and nodes > 1 else ""


def _checked_arguments(keep: Iterable[str], max_suggestions: int, training_tokens: int | None) -> list[str]:
    pins = validate_keep(keep)
    if not 1 <= max_suggestions <= MAX_SUGGESTIONS:
        raise PlanError(f"max_suggestions: must be between 1 and {MAX_SUGGESTIONS}", field="max_suggestions")
    if training_tokens is not None and not 1 <= training_tokens <= MAX_TRAINING_TOKENS:
        raise PlanError(f"training_tokens: must be a positive number of tokens, at most {MAX_TRAINING_TOKENS:.0e}",
                        field="training_tokens")
    return pins


def _rank(search: _Search, result: SuggestResult, max_suggestions: int, training_tokens: int | None) -> None:
    """Run the search, keep the best fitting plan of each kind, rank them, and fill the result."""
    ev, plan = search.ev, search.plan
    uniq: dict[frozenset, dict] = {}
    for ch in search.run():
        if ch and ev.fits(ch):
            uniq.setdefault(ev.key(ch), ch)
    ranked = sorted(uniq.values(), key=lambda ch: (sort_key(search.cost(ch)), len(ch), sorted(map(str, ch))))
    everything = ranked
    ranked = _with_qlora_early(_best_of_each_kind(ranked, search), everything, search)
    for i, ch in enumerate(ranked[:max_suggestions]):
        new_plan = ev.get(ch)[0]  # type: ignore[index]
        est = ev.estimate(ch)
        result.suggestions.append(Suggestion(rank=i + 1, qlora_rule=ev.key(ch) == search.qlora_pick,
                                             changes=_changes_list(plan, new_plan), cost=search.cost(ch),
                                             estimate=est, throughput=ev.throughput(ch, training_tokens),
                                             plan=new_plan))
    result.nothing_fits = not any(search.cost(ch).kind not in ("more_gpus", "larger_gpu") for ch in ranked)


def _least_memory_on_this_gpu(search: _Search, result: SuggestResult) -> None:
    """The minimum reachable on this GPU: the least budget of every plan tried, the plan with every same-hardware
    knob at its strongest included."""
    ev, plan = search.ev, search.plan
    strongest: dict = {}
    for knob in search.knobs:
        if knob.tier < 2:
            lv = _strongest(ev, strongest, knob)
            if lv is not None:
                strongest.update(lv)
    ev.get(strongest)  # evaluated already by _strongest: the walk's own result, among the plans tried
    least = ev.least_budget()
    result.min_reachable_bytes = least[1].budget_bytes if least is not None else None
    result.min_reachable_changes = _changes_list(plan, least[0]) if least is not None and least[0] is not plan else []


def _smallest_gpu_for(plan: TrainingPlan, budget_bytes: int,
                      here: catalog.CatalogGPU | None) -> catalog.CatalogGPU | None:
    """The smallest catalog GPU (fastest among equal sizes) of the plan's vendor (NVIDIA for a plan given by size)
    that runs the plan's kernels and holds ``budget_bytes`` within the headroom line (bf16 plans: with bf16)."""
    best = None
    vendor = here.vendor if here else "nvidia"
    line = 1 - plan.headroom_percent / 100
    for g in catalog.load_gpus():
        if g.vendor != vendor or gpu_runs_plan(g, plan) is not None:
            continue
        if plan.dtype == "bf16" and not g.bf16:
            continue
        if budget_bytes > g.total_memory_bytes * line:
            continue
        if best is None or (g.total_memory_bytes, -(g.tflops_bf16_dense or g.tflops_fp16_dense)) < (
                best.total_memory_bytes, -(best.tflops_bf16_dense or best.tflops_fp16_dense)):
            best = g
    return best


def _other_hardware_for_the_plan(search: _Search, result: SuggestResult, pins: list[str]) -> None:
    """The smallest catalog GPU and the fewest GPUs of this kind on which the original plan fits unchanged."""
    # the budget does not depend on the GPU
    best = _smallest_gpu_for(search.plan, result.original.budget_bytes, search.gpu_here)
    if best is not None:
        result.smallest_gpu, result.smallest_gpu_usable_bytes = best.name, best.total_memory_bytes
    if "gpu" in pins or "gpu_vram_gb" in pins:
        result.notes.append("gpu is pinned: smallest_gpu is reported for information only")
    if "num_gpus" in pins:
        result.notes.append("num_gpus is pinned: no multi-GPU alternative was searched")
        return
    hw = [k for k in search.knobs if k.name == "num_gpus"]
    for lv in (hw[0].levels if hw else []):  # sharding only
        n = lv["num_gpus"]
        if "gradient_accumulation_steps" in lv or (n > search.per_node and n % search.per_node):
            continue  # more than one machine holds, and not whole machines: no real cluster is laid out so
        lv = {**lv, **search.layout(n)}
        if search.ev.fits(lv):
            got = search.ev.get(lv)
            result.min_gpus, result.min_gpus_sharding = got[0].num_gpus, got[0].sharding  # type: ignore[index]
            result.min_gpus_nodes = got[0].num_nodes  # type: ignore[index]
            break
