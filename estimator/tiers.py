"""The tier row: does full fine-tuning, LoRA or QLoRA of this model fit the user's GPU, in one line.

Every estimate answer carries it (issue 21), so "would QLoRA fit?" is answered before it is asked. Each tier is the
plan as given with only the method changed (and what the method change needs: a quantization setting, adapter
fields only adapters have, PEFT's targets where the family has no default), judged by :func:`judge` (the same
peak as :func:`estimate`, without the itemized result the row does not show).
"""

from __future__ import annotations

from pydantic import ValidationError

from .errors import CanIFinetuneError
from .estimate import Estimate, Speed, TierFit, estimate, judge
from .model_sources import ResolvedModel
from .plan import METHODS, TrainingPlan
from .spec import PEFT_DEFAULT_TARGETS
from .throughput import throughput, training_time

TIER_WORDS = {"full": "full", "lora": "LoRA", "qlora": "QLoRA"}


def method_variant(plan: TrainingPlan, method: str, model: ResolvedModel) -> TrainingPlan:
    """``plan`` with ``method``: a 4-bit base for qlora, a 16-bit base for lora and full, no adapter-only fields for
    full, and 'all-linear' for a family without PEFT default targets (what the search's method knob does)."""
    changes: dict = {"method": method, "load_in_8bit": False, "load_in_4bit": None}
    if method == "full":
        changes.update(modules_to_save=None, use_dora=False, adapter_dtype=None, prepare_model_for_kbit_training=None)
        if plan.dtype == "fp16":
            changes["precision"] = "mixed"  # pure fp16 weights cannot be trained in full (estimator/plan.py)
    elif method == "lora":
        changes["prepare_model_for_kbit_training"] = None  # a 16-bit base has nothing to prepare
    if (method != "full" and plan.method == "full" and plan.target_modules is None
            and model.spec.model_type not in PEFT_DEFAULT_TARGETS):
        changes["target_modules"] = "all-linear"
    return plan.replace(**changes)


def tier_row(est: Estimate, model: ResolvedModel) -> list[TierFit]:
    """Full, LoRA and QLoRA on the estimate's GPU (the estimate itself for its own method)."""
    row = []
    for method in METHODS:
        label = TIER_WORDS[method] + (" (8-bit)" if method == "lora" and est.plan.load_in_8bit else "")
        if method == est.plan.method:
            row.append(TierFit(method=method, label=label, verdict=est.verdict, budget_bytes=est.budget_bytes,
                               used_fraction=est.used_fraction))
            continue
        try:
            other = judge(method_variant(est.plan, method, model), model=model)
        except (ValidationError, CanIFinetuneError) as exc:
            row.append(TierFit(method=method, label=TIER_WORDS[method], verdict=None,
                               refused=str(exc).splitlines()[0][:200]))
            continue
        row.append(TierFit(method=method, label=TIER_WORDS[method], verdict=other.verdict,
                           budget_bytes=other.budget_bytes, used_fraction=other.used_fraction))
    return row


def tier_line(row: list[TierFit], gpu_name: str | None) -> str:
    """'full / LoRA / QLoRA on RTX 4090: does not fit (61.2 GiB) / fits (71%) / fits (38%)'."""
    def one(t: TierFit) -> str:
        if t.verdict is None:
            return "n/a"
        if t.verdict == "unknown":
            return f"{(t.budget_bytes or 0) / 2**30:.1f} GiB"
        words = {"fits": "fits", "tight": "tight", "does_not_fit": "does not fit"}[t.verdict]
        if t.verdict == "does_not_fit":
            return f"{words} ({(t.budget_bytes or 0) / 2**30:.1f} GiB)"
        return f"{words} ({t.used_fraction:.0%})"

    names = " / ".join(t.label for t in row)
    return f"{names} on {gpu_name or 'this GPU'}: " + " / ".join(one(t) for t in row)


def estimate_with_tiers(plan: TrainingPlan, model: ResolvedModel, training_tokens: int | None = None) -> Estimate:
    """The estimate of ``plan`` with its tier row and its speed (what every face shows): tokens per second and, with
    ``training_tokens`` (or the plan's max_steps, or its dataset's epochs), the time and GPU-hours to train."""
    est = estimate(plan, model=model)
    update: dict = {"speed": speed_of(est.plan, model, training_tokens)}
    if est.gpu is not None:
        update["tiers"] = tier_row(est, model)
    return est.model_copy(update=update)


def speed_of(plan: TrainingPlan, model: ResolvedModel, training_tokens: int | None = None) -> Speed | None:
    """The plan's speed, and its time to train when a token budget is known (``training_tokens``, the plan's
    max_steps or its dataset's epochs); None when it cannot be modelled. One throughput computation either way."""
    tt = None
    if training_tokens is not None or plan.max_steps > 0 or plan.dataset:
        try:
            tt = training_time(plan, model=model, training_tokens=training_tokens)
        except (ValueError, CanIFinetuneError):
            tt = None  # no budget after all (a dataset that cannot be read): the speed alone
    try:
        tp = tt.throughput if tt is not None else throughput(plan, model=model)
    except (ValueError, CanIFinetuneError):
        return None
    out = Speed(gpu=tp.gpu, num_gpus=tp.num_gpus, tokens_per_second=tp.tokens_per_second,
                tokens_per_second_low=tp.tokens_per_second_low, tokens_per_second_high=tp.tokens_per_second_high)
    if tt is None:
        return out
    basis = "; ".join(tt.notes) if tt.notes else f"training_tokens {tt.training_tokens:,}"
    return out.model_copy(update=dict(training_tokens=tt.training_tokens, hours=tt.hours, hours_low=tt.hours_low,
                                      hours_high=tt.hours_high, gpu_hours=tt.gpu_hours, gpu_hours_low=tt.gpu_hours_low,
                                      gpu_hours_high=tt.gpu_hours_high, basis=basis))


def speed_line(speed: Speed) -> str:
    """'speed on RTX 4090: ~2,959 tokens/s (2,578-3,267); 50,000,000 tokens in ~4.69 h (4.25-5.39), 4.69 GPU-hours
    (approximate: docs/search.md)'."""
    on = f"{speed.num_gpus} x {speed.gpu}" if speed.num_gpus > 1 else speed.gpu
    text = (f"speed on {on}: ~{speed.tokens_per_second:,.0f} tokens/s ({speed.tokens_per_second_low:,.0f}-"
            f"{speed.tokens_per_second_high:,.0f})")
    if speed.hours is not None:
        text += (f"; {speed.training_tokens:,} tokens in ~{speed.hours:.3g} h ({speed.hours_low:.3g}-"
                 f"{speed.hours_high:.3g}), {speed.gpu_hours:.3g} GPU-hours")
    return text + " (approximate: docs/search.md)"
