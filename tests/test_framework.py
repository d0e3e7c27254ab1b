"""The training stack as a plan field: each framework's defaults, the overrides, the search and the recipe."""

from __future__ import annotations

import pytest

from canifinetune.estimator.errors import PlanError
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.plan import FRAMEWORKS, TrainingPlan
from canifinetune.estimator.search import suggest
from canifinetune.estimator.stacks import STACKS
from canifinetune.recipes.render import make_recipe

QWEN = "Qwen/Qwen2.5-1.5B-Instruct"


def test_every_framework_has_a_stack_with_its_version_and_source():
    assert set(STACKS) == set(FRAMEWORKS)
    for stack in STACKS.values():
        assert stack.version and stack.source and stack.title
    measured = {name for name, s in STACKS.items() if s.measured}
    assert measured == {"trl", "transformers", "litgpt", "axolotl", "llama_factory", "torchtune"}
    # a stack says it is measured only where a frozen cohort with fake-mode results runs plans of it (the default
    # framework, trl, is every plan that names none)
    import json
    from pathlib import Path

    validation = Path(__file__).resolve().parent.parent / "benchmarks" / "validation"
    with_results = set()
    for cohort_path in validation.glob("cohort-v*.json"):
        cohort = json.loads(cohort_path.read_text(encoding="utf-8"))
        if any((validation / "results").glob(f"fake-{cohort['cohort']}*.jsonl")):
            with_results |= {c["plan"].get("framework", "trl") for c in cohort["cases"]}
    assert measured <= with_results, measured - with_results


@pytest.mark.parametrize(
    "framework, loss, kbit, adapters",
    [
        ("trl", "chunked", False, "bf16"),
        ("transformers", "standard", True, "fp32"),
        ("axolotl", "standard", False, "fp32"),
        ("llama_factory", "standard", False, "fp32"),
        ("unsloth", "standard", False, "fp32"),
    ],
)
def test_framework_sets_the_low_level_defaults(framework, loss, kbit, adapters):
    plan = TrainingPlan(model=QWEN, method="qlora", framework=framework)
    assert plan.effective_loss_implementation == loss
    assert plan.effective_kbit_preparation is kbit
    assumption = next(a for a in estimate(plan).assumptions if a.startswith("stack: "))
    assert f"{loss} loss" in assumption and f"adapters in {adapters}" in assumption
    assert f"prepare_model_for_kbit_training {'on' if kbit else 'off'}" in assumption


def test_low_level_fields_override_the_framework_one_by_one():
    base = TrainingPlan(model=QWEN, method="qlora", framework="transformers", seq_len=2048, batch_size=2)
    chunked = base.replace(loss_implementation="chunked")
    no_kbit = base.replace(prepare_model_for_kbit_training=False)
    bf16 = base.replace(adapter_dtype="bf16")
    est = estimate(base).peak_allocated_bytes
    assert estimate(chunked).peak_allocated_bytes < est
    assert estimate(no_kbit).peak_allocated_bytes < est
    assert estimate(bf16).peak_allocated_bytes < est
    # the trl stack with every transformers setting made explicit is the same estimate
    same = base.replace(framework="trl", loss_implementation="standard", prepare_model_for_kbit_training=True,
                        adapter_dtype="fp32")
    assert estimate(same).peak_allocated_bytes == est


def test_kbit_preparation_makes_the_unquantized_base_fp32():
    trl = estimate(TrainingPlan(model=QWEN, method="qlora"))
    prepared = estimate(TrainingPlan(model=QWEN, method="qlora", prepare_model_for_kbit_training=True))
    weights = {c.name: c.bytes for c in trl.breakdown}["weights"]
    prepared_weights = {c.name: c.bytes for c in prepared.breakdown}["weights"]
    assert prepared_weights > weights  # embeddings (tied head) and norms in fp32 instead of bf16


@pytest.mark.parametrize(
    "fields, word",
    [
        ({"method": "full", "use_dora": True}, "use_dora"),
        ({"method": "full", "modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"method": "lora", "prepare_model_for_kbit_training": True}, "prepare_model_for_kbit_training"),
        ({"activation_offloading": True, "framework": "axolotl"}, "activation_offloading"),
        ({"activation_offloading": True, "gradient_checkpointing": False}, "gradient_checkpointing"),
        ({"torch_compile": True}, "torch_compile"),
        ({"use_liger_kernel": True}, "use_liger_kernel"),
    ],
)
def test_knobs_that_mean_nothing_or_are_not_modelled_are_refused_by_name(fields, word):
    with pytest.raises(ValueError, match=word):
        TrainingPlan(model=QWEN, **fields)


def test_axolotl_full_fine_tuning_without_flash_attention_is_refused():
    with pytest.raises(PlanError, match="flash_attention_2"):
        estimate(TrainingPlan(model=QWEN, method="full", framework="axolotl"))
    estimate(TrainingPlan(model=QWEN, method="full", framework="axolotl", attn_implementation="flash_attention_2"))


def test_llama_factory_full_fine_tuning_trains_fp32_weights():
    lf = estimate(TrainingPlan(model=QWEN, method="full", framework="llama_factory"))
    mixed = estimate(TrainingPlan(model=QWEN, method="full", framework="transformers", precision="mixed"))
    assert lf.peak_allocated_bytes == mixed.peak_allocated_bytes


def test_unmeasured_stacks_say_so():
    est = estimate(TrainingPlan(model=QWEN, method="lora", framework="unsloth"))
    assert any("not measured" in w for w in est.warnings)
    assert not any("not measured" in w for w in estimate(TrainingPlan(model=QWEN, framework="transformers")).warnings)


def test_search_costs_stack_changes_in_words():
    plan = TrainingPlan(model="meta-llama/Llama-3.1-8B", method="qlora", framework="transformers", seq_len=2048,
                        batch_size=4, target_modules="all-linear", gpu="RTX 4090")
    result = suggest(plan)
    details = [d for s in result.suggestions for d in s.cost.details]
    assert any("transformers Trainer + PEFT" in d and "chunked" in d for d in details)
    fields = {c.field for s in result.suggestions for c in s.changes}
    assert "framework" not in fields  # the user's trainer is never silently swapped


def test_kbit_preparation_is_a_costed_knob():
    plan = TrainingPlan(model="meta-llama/Llama-3.1-8B", method="qlora", framework="transformers", seq_len=1024,
                        batch_size=2, gpu_vram_gb=12)
    result = suggest(plan, keep={"loss_implementation"})
    kbit = [s for s in result.suggestions if any(c.field == "prepare_model_for_kbit_training" for c in s.changes)]
    assert kbit and any("skip prepare_model_for_kbit_training" in d for d in kbit[0].cost.details)


def test_recipe_for_another_framework_carries_its_settings():
    plan = TrainingPlan(model=QWEN, method="qlora", framework="transformers", gpu="RTX 4090")
    recipe = make_recipe(plan)
    assert recipe.plan.framework == "trl"
    assert recipe.plan.loss_implementation == "standard"
    assert recipe.plan.prepare_model_for_kbit_training is True and recipe.plan.adapter_dtype == "fp32"
    assert (
        "transformers Trainer + PEFT" in recipe.framework_note
        and "loss_implementation=standard" in recipe.framework_note
    )
    assert recipe.estimate.peak_allocated_bytes == estimate(plan).peak_allocated_bytes
    assert make_recipe(plan.replace(framework="trl")).framework_note is None
