"""The trainers beyond SFT on the CPU: two steps of TRL 1.16's DPO, ORPO, KTO, reward and GRPO on a tiny random llama.

Each run goes through the runtime (recipes/runtime.py ``prepare``) with the example dataset a recipe ships
(recipes/examples.py) and, for GRPO, its reward.py, generating with model.generate (no vLLM). The reference model is
the one the plan says (a copy, the adapter-disabled base, or none). Rows longer than seq_len are refused before the
model loads. make_recipe's files need an estimate: every trainer here is estimated, so a PlanError from estimate()
fails those tests (it no longer skips them: issue 23.9).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("peft")

from test_runtime import _write_jsonl, make_tiny_model

from canifinetune.estimator.errors import PlanError
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.recipes.examples import EXAMPLE_DATA_FILE, REWARD_FILE, REWARD_PY, example_jsonl
from canifinetune.recipes.runtime import SampleTooLongError, prepare
from canifinetune.recipes.schema import RecipeError
from canifinetune.recipes.trainers import reference_of, trainer_problems

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _recipe_dir(tmp_path: Path, trainer: str) -> Path:
    """A folder holding what make_recipe ships for the trainer: the example dataset (and GRPO's reward.py)."""
    folder = tmp_path / "recipe"
    folder.mkdir(exist_ok=True)
    (folder / EXAMPLE_DATA_FILE).write_text(example_jsonl(trainer), encoding="utf-8")
    if trainer == "grpo":
        (folder / REWARD_FILE).write_text(REWARD_PY, encoding="utf-8")
    return folder


def _plan(model: Path, trainer: str, **kw) -> TrainingPlan:
    base = {"model": str(model), "trainer": trainer, "dtype": "fp32", "seq_len": 64, "batch_size": 2, "max_steps": 2,
            "learning_rate": 1e-3, "dataset": EXAMPLE_DATA_FILE, "optim": "adamw_torch"}
    if trainer == "grpo":
        base.update(num_generations=2, max_completion_length=8)
    return TrainingPlan(**{**base, **kw})


CASES = [
    ("dpo", {}, "adapter_disabled"),
    ("dpo", {"method": "full", "gradient_checkpointing": False}, "copy"),
    ("dpo", {"precompute_ref_log_probs": True}, "none"),
    ("dpo", {"reference_model": "copy", "loss_type": "ipo", "beta": 0.2}, "copy"),
    ("orpo", {}, "none"),
    ("kto", {}, "adapter_disabled"),
    ("reward", {}, "none"),
    ("reward", {"method": "full"}, "none"),
    ("grpo", {}, "none"),
    ("grpo", {"beta": 0.04}, "adapter_disabled"),
]


@pytest.mark.parametrize(
    "trainer,kw,reference",
    CASES,
    ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v.values())) or "default",
)
def test_two_steps_of_each_trainer(trainer, kw, reference, tiny_model, tmp_path):
    plan = _plan(tiny_model, trainer, **kw)
    assert reference_of(plan) == reference
    folder = _recipe_dir(tmp_path, trainer)
    prepared = prepare(plan, recipe_dir=folder, device="cpu", output_dir=tmp_path / "out")
    t = prepared.trainer
    assert type(t).__name__ == {"dpo": "DPOTrainer", "orpo": "ORPOTrainer", "kto": "KTOTrainer",
                                "reward": "RewardTrainer", "grpo": "GRPOTrainer"}[trainer]
    args = t.args
    if trainer in ("dpo", "orpo", "kto", "reward"):
        assert args.max_length == plan.seq_len
    if trainer == "dpo":
        assert args.precompute_ref_log_probs is bool(plan.precompute_ref_log_probs)
        assert list(args.loss_type) == [plan.loss_type or "sigmoid"]
        assert args.beta == (plan.beta if plan.beta is not None else 0.1)
    if trainer == "grpo":
        assert (args.num_generations, args.max_completion_length, args.use_vllm) == (2, 8, False)
        assert args.beta == (plan.beta or 0.0)
    # the reference model the plan says
    ref = getattr(t, "ref_model", None)
    if reference == "copy":
        assert ref is not None and ref is not t.model
    elif trainer in ("dpo", "kto", "grpo"):
        assert ref is None
    if trainer == "reward":
        assert type(t.model).__name__.endswith("ForSequenceClassification") or hasattr(t.model, "get_base_model")
    if plan.uses_adapters:
        assert hasattr(t.model, "get_base_model")  # TRL wrapped it with the plan's LoraConfig
    output = t.train()
    assert output.global_step == 2
    losses = [h["loss"] for h in t.state.log_history if "loss" in h]
    assert losses and all(math.isfinite(x) for x in losses)


def test_pairs_and_prompts_longer_than_seq_len_are_refused(tiny_model, tmp_path):
    long = "x" * 200
    data = _write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "ok", "chosen": " yes", "rejected": " no"},
                                                   {"prompt": "ok", "chosen": long, "rejected": " no"}])
    for trainer in ("dpo", "orpo", "reward"):
        with pytest.raises(SampleTooLongError, match=r"line 2 .*longer than 64 \(seq_len 64"):
            prepare(_plan(tiny_model, trainer, dataset=str(data)), device="cpu", output_dir=tmp_path / "o")
    kto = _write_jsonl(tmp_path / "kto.jsonl", [{"prompt": long, "completion": " a", "label": True}])
    with pytest.raises(SampleTooLongError, match="prompt with its completion"):
        prepare(_plan(tiny_model, "kto", dataset=str(kto)), device="cpu", output_dir=tmp_path / "o")
    prompts = _write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "short"}, {"prompt": long}])
    with pytest.raises(SampleTooLongError, match=r"line 2 .*\(the prompt\)"):
        prepare(_plan(tiny_model, "grpo", dataset=str(prompts)), recipe_dir=_recipe_dir(tmp_path, "grpo"),
                device="cpu", output_dir=tmp_path / "o")


def test_rows_of_the_wrong_shape_are_named(tiny_model, tmp_path):
    data = _write_jsonl(tmp_path / "sft.jsonl", [{"text": "an sft row"}])
    with pytest.raises(RecipeError, match=r"line 1 .*has no 'prompt', 'chosen', 'rejected'"):
        prepare(_plan(tiny_model, "dpo", dataset=str(data)), device="cpu", output_dir=tmp_path / "o")
    bad_label = _write_jsonl(tmp_path / "kto.jsonl", [{"prompt": "p", "completion": "c", "label": "yes"}])
    with pytest.raises(RecipeError, match="'label' must be true"):
        prepare(_plan(tiny_model, "kto", dataset=str(bad_label)), device="cpu", output_dir=tmp_path / "o")


def test_a_grpo_recipe_needs_its_reward_py(tiny_model, tmp_path):
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / EXAMPLE_DATA_FILE).write_text(example_jsonl("grpo"), encoding="utf-8")
    with pytest.raises(RecipeError, match=r"reward.py"):
        prepare(_plan(tiny_model, "grpo"), recipe_dir=folder, device="cpu", output_dir=tmp_path / "o")


def test_reference_model_combinations_trl_cannot_train_are_refused(tiny_model):
    assert any("needs method 'lora'" in p for p in trainer_problems(
        _plan(tiny_model, "dpo", method="full", reference_model="adapter_disabled")))
    assert any("precompute_ref_log_probs: true" in p for p in trainer_problems(
        _plan(tiny_model, "dpo", reference_model="none")))
    assert any("beta 0" in p for p in trainer_problems(_plan(tiny_model, "grpo", reference_model="copy")))
    assert any("needs a reference model" in p for p in trainer_problems(
        _plan(tiny_model, "grpo", beta=0.1, reference_model="none")))
    assert any("adapter-disabled base" in p for p in trainer_problems(
        _plan(tiny_model, "grpo", beta=0.1, reference_model="copy")))
    assert not trainer_problems(_plan(tiny_model, "dpo", precompute_ref_log_probs=True, reference_model="none"))
    # KTOTrainer 1.16 refuses a micro-batch of one row (its KL term pairs rows of the batch)
    assert any("at least 2 rows" in p for p in trainer_problems(_plan(tiny_model, "kto", batch_size=1)))
    assert not any("at least 2 rows" in p for p in trainer_problems(_plan(tiny_model, "kto", batch_size=2)))
    assert reference_of(_plan(tiny_model, "grpo", method="full", beta=0.1)) == "copy"


# ----------------------------------------------------------------------------------------- recipes (need the estimate)


def _estimate(plan: TrainingPlan):
    """estimate(); every trainer here is estimated: a PlanError (e.g. "not estimated yet") fails the test."""
    from canifinetune.estimator.estimate import estimate

    try:
        return estimate(plan)
    except PlanError as exc:
        pytest.fail(f"the {plan.trainer} plan must be estimated: {exc}")


@pytest.mark.parametrize("trainer,method", [("dpo", "lora"), ("orpo", "lora"), ("orpo", "full"), ("kto", "lora"),
                                            ("reward", "lora"), ("reward", "full"), ("grpo", "lora")])
def test_make_recipe_ships_an_example_dataset_and_trains_it(trainer, method, tiny_model, tmp_path):
    from canifinetune.recipes.render import make_recipe, write_recipe
    from canifinetune.recipes.train import train

    plan = _plan(tiny_model, trainer, dataset=None, method=method)
    est = _estimate(plan)
    recipe = make_recipe(plan, est)
    assert recipe.plan.dataset == EXAMPLE_DATA_FILE
    assert recipe.files[EXAMPLE_DATA_FILE] == example_jsonl(trainer)
    assert (REWARD_FILE in recipe.files) is (trainer == "grpo")
    write_recipe(recipe, tmp_path / "r")
    with open(tmp_path / "log.txt", "w") as log:
        result = train(tmp_path / "r" / "recipe.yaml", device="cpu", out=log)
    assert result.steps == 2 and result.samples == len(example_jsonl(trainer).splitlines())
