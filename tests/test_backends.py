"""Which GPU software a plan needs (bitsandbytes, flash-attn, Triton) and whether a catalog card runs it (issue 21)."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
from types import MappingProxyType

import pytest

from canifinetune.estimator.backends import BNB_OPTIMIZERS, gpu_runs_plan, required_backends, why_required
from canifinetune.estimator.catalog import BACKENDS, CatalogGPU, find_gpu, load_gpus
from canifinetune.estimator.plan import OPTIMIZERS, TrainingPlan

MODEL = "Qwen/Qwen2.5-0.5B"


def plan(**fields) -> TrainingPlan:
    return TrainingPlan(model=MODEL, **fields)


@pytest.mark.parametrize("fields, needed", [
    ({}, set()),  # LoRA on a 16-bit base, adamw_torch_fused, sdpa: nothing beyond PyTorch
    ({"method": "full"}, set()),
    ({"method": "qlora"}, {"bitsandbytes"}),
    ({"method": "qlora", "load_in_4bit": True}, {"bitsandbytes"}),
    ({"method": "lora", "load_in_8bit": True}, {"bitsandbytes"}),
    ({"optim": "adamw_bnb_8bit"}, {"bitsandbytes"}),
    ({"optim": "paged_adamw_8bit"}, {"bitsandbytes"}),
    ({"optim": "paged_adamw_32bit"}, {"bitsandbytes"}),
    ({"method": "full", "optim": "adamw_bnb_8bit"}, {"bitsandbytes"}),
    ({"optim": "adafactor"}, set()),
    ({"optim": "adamw_torch"}, set()),
    ({"attn_implementation": "flash_attention_2"}, {"flash_attention_2"}),
    ({"attn_implementation": "sdpa"}, set()),
    ({"attn_implementation": "eager"}, set()),
    ({"method": "qlora", "attn_implementation": "flash_attention_2"}, {"bitsandbytes", "flash_attention_2"}),
    ({"framework": "unsloth"}, {"triton"}),  # Unsloth's kernels are Triton kernels
    ({"framework": "unsloth", "method": "qlora"}, {"bitsandbytes", "triton"}),
    ({"framework": "axolotl"}, set()),
])  # fmt: skip
def test_required_backends(fields, needed):
    found = required_backends(plan(**fields))
    assert isinstance(found, frozenset) and found == needed
    assert found <= set(BACKENDS)


def test_every_bitsandbytes_optimizer_is_one_the_plan_knows():
    assert set(BNB_OPTIMIZERS) <= set(OPTIMIZERS)
    assert {o for o in OPTIMIZERS if "bnb" in o or "paged" in o} == set(BNB_OPTIMIZERS)


def test_why_required_names_the_fields():
    why = why_required(plan(method="qlora", optim="paged_adamw_8bit", attn_implementation="flash_attention_2"))
    assert why == {"bitsandbytes": "4-bit base, optim paged_adamw_8bit",
                   "flash_attention_2": "attn_implementation flash_attention_2"}
    assert why_required(plan(load_in_8bit=True)) == {"bitsandbytes": "8-bit base"}


@pytest.mark.parametrize("gpu", load_gpus(), ids=lambda g: g.name)
def test_a_plain_lora_plan_runs_on_every_card(gpu):
    assert gpu_runs_plan(gpu, plan()) is None
    assert gpu_runs_plan(gpu, plan(method="qlora")) is None  # bitsandbytes 0.50.2 runs on every catalog card


@pytest.mark.parametrize("name", ["Tesla P100", "Tesla T4", "Tesla V100 16GB", "Tesla V100 32GB"])
def test_flash_attention_2_does_not_run_before_ampere(name):
    reason = gpu_runs_plan(find_gpu(name), plan(attn_implementation="flash_attention_2", dtype="fp16"))
    assert reason is not None and "\n" not in reason
    assert reason.startswith(f"flash_attention_2 (attn_implementation flash_attention_2) does not run on the {name} "
                             "(NVIDIA, compute capability ")
    assert "8.0" in reason and "'sdpa'" in reason


@pytest.mark.parametrize("name", ["A10G", "L4", "A100 40GB SXM", "H100 SXM", "B200", "RTX 3090", "RTX 4090",
                                  "RTX 5090", "MI250X", "MI300X", "MI325X"])
def test_flash_attention_2_runs_from_ampere_and_on_amd_cdna(name):
    assert gpu_runs_plan(find_gpu(name), plan(attn_implementation="flash_attention_2")) is None


def test_unsloth_needs_triton_which_the_p100_lacks():
    reason = gpu_runs_plan(find_gpu("Kaggle P100"), plan(framework="unsloth", dtype="fp16"))
    assert reason is not None and reason.startswith(
        "triton (framework unsloth) does not run on the Tesla P100 (NVIDIA, compute capability 6.0)")
    assert gpu_runs_plan(find_gpu("Kaggle T4"), plan(framework="unsloth", dtype="fp16")) is None


def test_the_first_missing_backend_in_catalog_order_is_named():
    both = plan(method="qlora", attn_implementation="flash_attention_2", framework="unsloth", dtype="fp16")
    assert gpu_runs_plan(find_gpu("p100"), both).startswith("flash_attention_2 ")  # bitsandbytes runs there


def _without(gpu: CatalogGPU, backend: str) -> CatalogGPU:
    return dataclasses.replace(gpu, backends=MappingProxyType({**gpu.backends, backend: False}))


def test_a_card_without_bitsandbytes_refuses_quantization_and_bnb_optimizers():
    card = _without(find_gpu("MI250X"), "bitsandbytes")
    reason = gpu_runs_plan(card, plan(method="qlora"))
    assert reason is not None and reason.startswith(
        "bitsandbytes (4-bit base) does not run on the MI250X (AMD, gfx90a): it runs on ")
    assert "method 'lora'" in reason and reason.endswith(".")
    assert gpu_runs_plan(card, plan(optim="paged_adamw_32bit")).startswith("bitsandbytes (optim paged_adamw_32bit)")
    assert gpu_runs_plan(card, plan(load_in_8bit=True)).startswith("bitsandbytes (8-bit base)")
    assert gpu_runs_plan(card, plan()) is None


def test_the_signatures_the_search_and_the_plan_call():
    assert str(inspect.signature(required_backends)) == "(plan: 'TrainingPlan') -> 'frozenset[str]'"
    assert str(inspect.signature(gpu_runs_plan)) == "(gpu: 'CatalogGPU', plan: 'TrainingPlan') -> 'str | None'"


def test_import_stays_light():
    code = ("import sys\n"
            "import canifinetune.estimator.backends\n"
            "bad = [m for m in ('torch', 'transformers', 'bitsandbytes', 'flash_attn', 'triton') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
