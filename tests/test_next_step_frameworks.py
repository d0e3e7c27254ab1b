"""Every next step printed must run (promise 2): make_recipe writes TRL recipes and refuses to carry LitGPT's and
torchtune's own step, so a plan for either framework is pointed at that framework's command instead."""

from __future__ import annotations

import pytest

from canifinetune.estimator.errors import RecipeError
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.search import suggest
from canifinetune.recipes.render import make_recipe
from canifinetune.server.text import default_next_move, format_estimate, format_suggestions

MODEL = "Qwen/Qwen2.5-1.5B-Instruct"
CASES = [
    ({"framework": "torchtune", "method": "lora"}, "tune run lora_finetune_single_device"),
    ({"framework": "torchtune", "method": "qlora"}, "tune run lora_finetune_single_device"),
    ({"framework": "torchtune", "method": "full"}, "tune run full_finetune_single_device"),
    ({"framework": "litgpt", "method": "lora", "gradient_checkpointing": False}, "litgpt finetune lora"),
    ({"framework": "litgpt", "method": "full", "gradient_checkpointing": False}, "litgpt finetune full"),
]


@pytest.mark.parametrize("fields, command", CASES)
def test_a_fitting_plan_names_its_framework_command(fields, command):
    plan = TrainingPlan(model=MODEL, gpu="H100 SXM", seq_len=1024, batch_size=1, **fields)
    est = estimate(plan)
    assert est.verdict == "fits"
    move = default_next_move(est)
    assert f"`{command}`" in move and "canifinetune recipe" not in move
    assert format_estimate(est).splitlines()[-1] == f"next: {move}"
    with pytest.raises(RecipeError, match="framework"):  # why: the recipe would refuse
        make_recipe(plan)


@pytest.mark.parametrize("fields, command", CASES[:1] + CASES[3:4])
def test_a_suggestion_for_such_a_plan_ends_with_its_command(fields, command):
    plan = TrainingPlan(model="meta-llama/Llama-3.1-8B-Instruct", gpu="RTX 4090", seq_len=16384, batch_size=1,
                        **fields)
    text = format_suggestions(suggest(plan))
    last = text.splitlines()[-1]
    assert last.startswith("next: ") and f"`{command}`" in last and "canifinetune recipe" not in last


def test_a_trl_plan_still_goes_to_make_recipe():
    est = estimate(TrainingPlan(model=MODEL, gpu="H100 SXM", seq_len=1024))
    assert "canifinetune recipe" in default_next_move(est)
