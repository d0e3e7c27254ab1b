"""Which GPU software a training plan needs, and whether a catalog card runs it.

A plan that quantizes its base (4-bit QLoRA, 8-bit LLM.int8) or trains with an 8-bit or paged optimizer needs
bitsandbytes; ``attn_implementation='flash_attention_2'`` needs the flash-attn package; Unsloth's kernels are
Triton kernels. The GPU catalog records, per card, whether each of these runs on it, with the rule and its source
(``estimator/data/gpus.json``, docs/catalogs.md "What each card's software runs"): this module only maps a plan's
fields onto those backends and words the answer. Pure Python, like the rest of the core.
"""

from __future__ import annotations

from .catalog import BACKENDS, CatalogGPU, load_backends
from .plan import TrainingPlan

__all__ = ["BNB_OPTIMIZERS", "gpu_runs_plan", "required_backends", "why_required"]

# Optimizers (TrainingArguments' names) that are bitsandbytes classes: bnb.optim.AdamW8bit, PagedAdamW8bit,
# PagedAdamW32bit (transformers' trainer, OptimizerNames).
BNB_OPTIMIZERS: frozenset[str] = frozenset({"adamw_bnb_8bit", "paged_adamw_8bit", "paged_adamw_32bit"})

# What to change instead, per backend, when a card does not run it.
_INSTEAD = {
    "bitsandbytes": "train without bitsandbytes (method 'lora' on an unquantized base, optim 'adamw_torch_fused') "
                    "or pick a card it runs on",
    "flash_attention_2": "use attn_implementation 'sdpa' (PyTorch's own attention kernels)",
    "triton": "use framework 'trl' or 'transformers', or pick a card Triton runs on",
}


def why_required(plan: TrainingPlan) -> dict[str, str]:
    """Each backend the plan needs, with the plan's fields that need it ('4-bit base', 'optim paged_adamw_8bit')."""
    needs: dict[str, list[str]] = {}
    if plan.quantized_4bit:
        needs.setdefault("bitsandbytes", []).append("4-bit base")
    if plan.load_in_8bit:
        needs.setdefault("bitsandbytes", []).append("8-bit base")
    if plan.optim in BNB_OPTIMIZERS:
        needs.setdefault("bitsandbytes", []).append(f"optim {plan.optim}")
    if plan.attn_implementation == "flash_attention_2":
        needs.setdefault("flash_attention_2", []).append("attn_implementation flash_attention_2")
    if plan.framework == "unsloth":
        needs.setdefault("triton", []).append("framework unsloth")
    return {backend: ", ".join(reasons) for backend, reasons in needs.items()}


def required_backends(plan: TrainingPlan) -> frozenset[str]:
    """The backends (of catalog.BACKENDS) the plan cannot train without."""
    return frozenset(why_required(plan))


def gpu_runs_plan(gpu: CatalogGPU, plan: TrainingPlan) -> str | None:
    """None when ``gpu`` runs every backend the plan needs; else one line naming the first backend it does not run,
    the card, the rule and what to change ('bitsandbytes (4-bit base) does not run on the ...: ...')."""
    for backend, why in sorted(why_required(plan).items(), key=lambda item: BACKENDS.index(item[0])):
        if gpu.runs(backend):
            continue
        return (f"{backend} ({why}) does not run on the {_card(gpu)}: it runs on {_rule(backend)}; "
                f"{_INSTEAD[backend]}.")
    return None


def _card(gpu: CatalogGPU) -> str:
    """'Tesla T4 (NVIDIA, compute capability 7.5)', 'MI250X (AMD, gfx90a)'."""
    cc = gpu.compute_capability
    arch = f"compute capability {cc[0]}.{cc[1]}" if cc else gpu.arch
    return f"{gpu.name} ({_VENDORS.get(gpu.vendor, gpu.vendor)}, {arch})"


_VENDORS = {"nvidia": "NVIDIA", "amd": "AMD"}


def _rule(backend: str) -> str:
    return load_backends()[backend].runs_on
