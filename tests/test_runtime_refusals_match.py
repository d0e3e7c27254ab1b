"""The estimate refuses exactly the dtype/precision combinations the runtime refuses (issue 21).

Every method x dtype x precision x trainer is built as a plan and estimated (a plan the TrainingPlan validator
refuses, or an estimate that raises, is "the estimate refuses"), and the runtime's own pre-flight check
(recipes/runtime.py ``check_plan_for_machine``) runs on a machine where nothing else is missing: one CUDA GPU with
bf16 and flash-attn, world size 1. A plan the validator refuses never reaches the runtime either (recipe.yaml is
read through the same TrainingPlan). No torch is needed.
"""

from __future__ import annotations

import itertools
import re

import pytest
from pydantic import ValidationError
from test_recipe_next_steps import TRAINERS  # every trainer with the settings it needs to run (one table)

from canifinetune.estimator.errors import CanIFinetuneError
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.recipes.runtime import Machine, check_plan_for_machine
from canifinetune.recipes.schema import RecipeError

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
GPU = "A100 80GB"
METHODS = ("full", "lora", "qlora")
DTYPES = ("bf16", "fp16", "fp32")
PRECISIONS = ("pure", "mixed")
# a machine on which only the plan itself can be the problem
MACHINE = Machine(cuda=True, device_count=1, bf16=True, gpu_name="NVIDIA A100 80GB", world_size=1, flash_attn=True)
# a runtime problem about dtype or precision starts with the field's name (problems are joined with "; ")
DTYPE_PROBLEM = re.compile(r"(?:^|; )(?:dtype|precision): ")
COMBINATIONS = list(itertools.product(METHODS, DTYPES, PRECISIONS, TRAINERS))


def _estimate_refusal(method: str, dtype: str, precision: str, trainer: str) -> tuple[TrainingPlan | None, str | None]:
    """(the plan, or None when the validator refuses it; why the estimate refuses, or None)."""
    try:
        plan = TrainingPlan(model=MODEL, gpu=GPU, method=method, dtype=dtype, precision=precision, trainer=trainer,
                            **TRAINERS[trainer])
    except ValidationError as exc:
        return None, str(exc)
    try:
        estimate(plan)
    except CanIFinetuneError as exc:
        return plan, str(exc)
    return plan, None


def _runtime_refusal(plan: TrainingPlan) -> str | None:
    try:
        check_plan_for_machine(plan, MACHINE)
    except RecipeError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("method, dtype, precision, trainer", COMBINATIONS,
                         ids=["-".join(c) for c in COMBINATIONS])
def test_the_estimate_refuses_what_the_runtime_refuses(method, dtype, precision, trainer):
    plan, estimate_refuses = _estimate_refusal(method, dtype, precision, trainer)
    if plan is None:
        # the validator's refusal is the runtime's too: recipe.yaml is read through TrainingPlan
        assert "precision" in estimate_refuses or "dtype" in estimate_refuses, estimate_refuses
        return
    runtime_refuses = _runtime_refusal(plan)
    if runtime_refuses is not None:
        # on this machine only the plan's dtype/precision can be refused: nothing else is missing
        assert DTYPE_PROBLEM.search(runtime_refuses), runtime_refuses
    assert (estimate_refuses is None) == (runtime_refuses is None), (
        f"{method}/{dtype}/{precision}/{trainer}: the estimate "
        + (f"refuses ({estimate_refuses})" if estimate_refuses else "accepts")
        + " but the runtime " + (f"refuses ({runtime_refuses})" if runtime_refuses else "accepts"))


def test_pure_fp16_full_fine_tuning_is_refused_with_the_runtimes_words():
    """Full fine-tuning in pure fp16 cannot train (torch's GradScaler refuses fp16 gradients): the plan says so in
    the runtime's own words, so the estimate never promises a run the runtime will not start."""
    with pytest.raises(ValidationError) as info:
        TrainingPlan(model=MODEL, method="full", dtype="fp16", precision="pure")
    runtime = TrainingPlan.model_construct(**{**TrainingPlan(model=MODEL).model_dump(), "method": "full",
                                              "dtype": "fp16", "precision": "pure"})
    with pytest.raises(RecipeError) as refused:
        check_plan_for_machine(runtime, MACHINE)
    words = ("full fine-tuning with pure fp16 weights cannot train (the fp16 gradient scaler refuses fp16 gradients); "
             "set precision: mixed, or dtype: bf16")
    assert words in str(info.value) and words in str(refused.value)
