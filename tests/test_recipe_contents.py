"""What a recipe writes and what the estimate says it runs (issue 21): the trainer class on the stack line, the
learning rate by method, a requirements.txt that installs this project, a recipe.yaml of the fields that matter, and
packing/padding_free refused alike by the estimate and the runtime beyond SFT. No torch is needed here."""

from __future__ import annotations

import json
from importlib import metadata

import pytest
import yaml
from pydantic import ValidationError

from canifinetune.estimator.errors import PlanError
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.trainers import TRAINER_CLASSES, TRAINERS
from canifinetune.recipes import render
from canifinetune.recipes.render import make_recipe, project_requirement, write_recipe
from canifinetune.recipes.runtime import Machine, check_plan_for_machine, sft_config_kwargs
from canifinetune.recipes.schema import RecipeError, load_recipe, parse_recipe
from canifinetune.recipes.trainers import TRAINER_TITLES

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
TRAINER_KW = {"grpo": {"num_generations": 4, "max_completion_length": 256}}
GPU = Machine(cuda=True, device_count=1, bf16=True, gpu_name="NVIDIA A100 80GB", world_size=1, flash_attn=True)


def _plan(**kw) -> TrainingPlan:
    return TrainingPlan(model=MODEL, **kw)


# ----------------------------------------------------------------------------------------- the stack line


@pytest.mark.parametrize("trainer", TRAINERS)
def test_the_stack_line_names_the_trainer_class_that_runs(trainer):
    est = estimate(_plan(trainer=trainer, **TRAINER_KW.get(trainer, {})))
    line = next(a for a in est.assumptions if a.startswith("stack: "))
    assert line.startswith(f"stack: TRL {TRAINER_CLASSES[trainer]} (trl 1.16): "), line
    assert TRAINER_CLASSES[trainer] in TRAINER_TITLES[trainer]  # the class the recipe's runtime builds
    others = [c for t, c in TRAINER_CLASSES.items() if t != trainer]
    assert not any(c in line for c in others), line


def test_other_frameworks_keep_their_title():
    est = estimate(_plan(framework="axolotl"))
    assert next(a for a in est.assumptions if a.startswith("stack: ")).startswith("stack: Axolotl (axolotl ")


# ----------------------------------------------------------------------------------------- learning rate


@pytest.mark.parametrize("method, expected", [("lora", 2e-4), ("qlora", 2e-4), ("full", 2e-5)])
def test_learning_rate_by_method(method, expected):
    plan = _plan(method=method)
    assert plan.learning_rate is None and plan.effective_learning_rate == expected
    assert _plan(method=method, learning_rate=5e-5).effective_learning_rate == 5e-5
    # the runtime's TrainingArguments carry the effective value
    kwargs = sft_config_kwargs(plan, output_dir="o", use_cpu=True)
    assert kwargs["learning_rate"] == expected
    recipe = make_recipe(plan)
    assert "learning_rate" not in yaml.safe_load(recipe.recipe_yaml)["plan"]  # null: by method, when it is read
    assert parse_recipe(recipe.recipe_yaml).plan.effective_learning_rate == expected
    assert f"learning rate {expected:g} (by method: {method})" in recipe.estimate_summary


def test_learning_rate_is_still_checked():
    for bad in (0, -1e-4, 2.0, float("nan")):
        with pytest.raises(ValidationError):
            _plan(learning_rate=bad)


def test_the_optimizer_gets_the_effective_learning_rate():
    from canifinetune.recipes.model_setup import optimizer_spec

    assert optimizer_spec(_plan(method="qlora"))[1]["lr"] == 2e-4
    assert optimizer_spec(_plan(method="full", optim="adafactor"))[1]["lr"] == 2e-5


# ----------------------------------------------------------------------------------------- requirements.txt


class _Dist:
    def __init__(self, direct_url: dict | str | None, version: str = "0.5.0.dev0"):
        self.version = version
        self._text = json.dumps(direct_url) if isinstance(direct_url, dict) else direct_url

    def read_text(self, name: str) -> str | None:
        assert name == "direct_url.json"
        return self._text


def _with_dist(monkeypatch, dist) -> list[str]:
    def distribution(name):
        assert name == "canifinetune"
        if dist is None:
            raise metadata.PackageNotFoundError(name)
        return dist

    monkeypatch.setattr(metadata, "distribution", distribution)
    return project_requirement()


@pytest.mark.parametrize("direct_url, expected", [
    ({"url": "file:///home/me/canifinetune", "dir_info": {"editable": True}},
     "canifinetune[train] @ file:///home/me/canifinetune"),
    ({"url": "file:///home/me/canifinetune", "dir_info": {}}, "canifinetune[train] @ file:///home/me/canifinetune"),
    ({"url": "https://github.com/me/canifinetune.git",
      "vcs_info": {"vcs": "git", "commit_id": "0af0d1b9c1e2", "requested_revision": "main"}},
     "canifinetune[train] @ git+https://github.com/me/canifinetune.git@0af0d1b9c1e2"),
    ({"url": "file:///tmp/canifinetune-0.5.0-py3-none-any.whl", "archive_info": {"hashes": {"sha256": "ab"}}},
     "canifinetune[train] @ file:///tmp/canifinetune-0.5.0-py3-none-any.whl"),
    ({"url": "https://github.com/me/mono.git", "vcs_info": {"vcs": "git", "commit_id": "abc123"},
      "subdirectory": "canifinetune"},
     "canifinetune[train] @ git+https://github.com/me/mono.git@abc123#subdirectory=canifinetune"),
])
def test_requirements_name_where_the_project_was_installed_from(direct_url, expected, monkeypatch):
    """PEP 610's direct_url.json of the installed distribution becomes a PEP 508 direct reference."""
    lines = _with_dist(monkeypatch, _Dist(direct_url))
    assert lines == [expected]
    packaging = pytest.importorskip("packaging.requirements")
    req = packaging.Requirement(lines[0])
    assert req.name == "canifinetune" and req.extras == {"train"} and req.url


@pytest.mark.parametrize("direct_url", [
    None,  # installed from an index, or by a tool that writes no direct_url.json
    "not json",
    {"url": "file:///x\nevil", "dir_info": {}},  # a value that would start a line of its own
    {"url": "https://example.org/x.git", "vcs_info": {"vcs": "git", "commit_id": "a b"}},
    {"url": "https://example.org/x"},  # none of dir_info, archive_info, vcs_info
])
def test_requirements_pin_the_own_version_otherwise(direct_url, monkeypatch):
    """Without a usable direct URL: this project's own version, pinned, after a comment saying to install it from its
    checkout, since the PyPI name belongs to another project. Never a bare, unpinned canifinetune."""
    lines = _with_dist(monkeypatch, _Dist(direct_url, version="0.5.0.dev0"))
    assert lines[-1] == "canifinetune[train]==0.5.0.dev0"
    assert lines[0].startswith("#") and "PyPI" in lines[0]
    assert 'pip install -e "/path/to/canifinetune[train]"' in lines[0]
    assert all("\n" not in line for line in lines)


def test_requirements_never_name_a_bare_canifinetune(monkeypatch):
    for dist in (None, _Dist(None), _Dist({"url": "file:///p", "dir_info": {}})):
        monkeypatch.setattr(render, "installed_project_requirement", lambda dist=dist: _with_dist(monkeypatch, dist))
        reqs = render.requirements(_plan())
        names = [r for r in reqs if not r.startswith("#") and r.split("[")[0].split("=")[0].strip() == "canifinetune"]
        assert all("==" in r or " @ " in r for r in names), reqs
        assert "canifinetune[train]" not in reqs and "canifinetune" not in reqs
        assert "torch>=2.4" in reqs and "trl>=1.16" in reqs


def test_the_recipes_requirements_install_this_installed_project():
    """What this checkout writes: its own direct URL or its own pinned version."""
    text = make_recipe(_plan()).requirements_txt
    version = metadata.version("canifinetune")
    assert f"canifinetune[train]=={version}" in text or "canifinetune[train] @ " in text, text
    assert "\ncanifinetune[train]\n" not in "\n" + text


# ----------------------------------------------------------------------------------------- recipe.yaml


@pytest.mark.parametrize("kw", [
    {},
    {"method": "qlora", "target_modules": "all-linear", "dataset": "data/train.jsonl", "truncation": True},
    {"method": "full", "optim": "adafactor", "precision": "mixed", "gradient_checkpointing": False},
    {"lora_r": 8, "learning_rate": 2e-4, "max_steps": 100, "lora_alpha": 32.0, "target_modules": ["v_proj", "q_proj"]},
    {"num_gpus": 2, "sharding": "zero3", "offload_optimizer": True, "offload_params": True},
    {"trainer": "dpo", "beta": 0.2},
    {"trainer": "grpo", **TRAINER_KW["grpo"]},
    {"packing": True},
])
def test_recipe_yaml_writes_only_what_differs_and_reads_back_the_same_plan(kw, tmp_path):
    plan = _plan(**kw)
    recipe = make_recipe(plan)
    written = yaml.safe_load(recipe.recipe_yaml)["plan"]
    defaults = {k: f.default for k, f in TrainingPlan.model_fields.items() if not f.is_required()}
    assert next(iter(written)) == "model"
    assert all(k == "model" or written[k] != defaults[k] for k in written), written
    assert {k for k in written if k != "model"} == {k for k, v in recipe.plan if v != defaults.get(k, v)}
    assert len(written) <= len(kw) + 2  # model, and the example dataset a trainer recipe ships
    # one comment line names where every other default comes from
    header = [line for line in recipe.recipe_yaml.splitlines() if line.startswith("#")]
    assert any("not listed" in line and "SFTConfig" in line and "TrainingArguments" in line and "LoraConfig" in line
               for line in header), header
    # and it reads back, as train reads it, as the very plan
    write_recipe(recipe, tmp_path)
    assert load_recipe(tmp_path / "recipe.yaml").plan == recipe.plan
    assert parse_recipe(recipe.recipe_yaml).plan == recipe.plan


def test_every_non_default_field_survives():
    """A plan with many fields changed: each one is written and read back."""
    kw = {"method": "qlora", "lora_r": 64, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": ["q_proj"],
          "bnb_4bit_quant_type": "fp4", "bnb_4bit_use_double_quant": True, "optim": "paged_adamw_8bit", "seq_len": 4096,
          "batch_size": 2, "gradient_accumulation_steps": 8, "gradient_checkpointing": False,
          "attn_implementation": "flash_attention_2", "loss_implementation": "standard", "adapter_dtype": "fp32",
          "modules_to_save": ["lm_head"], "use_dora": True, "padding_free": True, "dataset": "d.jsonl",
          "truncation": True, "learning_rate": 1e-4, "max_steps": 10, "num_train_epochs": 2.0, "output_dir": "out"}
    plan = _plan(**kw)
    recipe = make_recipe(plan)
    written = yaml.safe_load(recipe.recipe_yaml)["plan"]
    assert set(written) == {"model", *kw}
    assert parse_recipe(recipe.recipe_yaml).plan == plan


# ----------------------------------------------------------------------------------------- packing beyond SFT


@pytest.mark.parametrize("field", ["packing", "padding_free"])
@pytest.mark.parametrize("trainer", [t for t in TRAINERS if t != "sft"])
def test_packing_beyond_sft_is_refused_by_the_estimate_and_the_runtime_alike(trainer, field):
    plan = _plan(trainer=trainer, **TRAINER_KW.get(trainer, {}), **{field: True})
    with pytest.raises(PlanError) as estimated:
        estimate(plan)
    with pytest.raises(RecipeError) as run:
        check_plan_for_machine(plan, GPU)
    assert str(estimated.value) in str(run.value)
    assert f"set {field}: false" in str(estimated.value) and estimated.value.field == field


@pytest.mark.parametrize("field", ["packing", "padding_free"])
def test_packing_for_sft_passes_both(field):
    plan = _plan(**{field: True})
    estimate(plan)
    check_plan_for_machine(plan, GPU)
    kwargs = sft_config_kwargs(plan, output_dir="o", use_cpu=True)
    assert kwargs[field] is True
    # padding-free rows without packing: TRL 1.16 refuses a max_length it would not enforce; the runtime has
    # already refused or cut every longer sample
    assert kwargs["max_length"] == (None if field == "padding_free" else plan.seq_len)


@pytest.mark.parametrize("plan", [
    _plan(),
    TrainingPlan(model="Qwen/Qwen2.5-7B-Instruct", gpu="H100 SXM", num_gpus=8, sharding="zero3", method="full",
                 dataset="données/été ü.jsonl", output_dir="out dir/ä", num_train_epochs=2.5),
    TrainingPlan(model="Qwen/Qwen2.5-7B-Instruct", gpu="H100 SXM", num_gpus=16, num_nodes=2,
                 sharding="fsdp_full_shard", method="full"),
])
def test_recipe_yaml_is_what_pyyaml_safe_dump_writes(plan):
    """dump_yaml (libyaml's emitter where PyYAML has it) writes the recipe and the accelerate config byte for byte as
    yaml.safe_dump does, unicode and long lines included."""
    from canifinetune.recipes.schema import RecipeFile, dump_yaml

    made = make_recipe(plan, estimate(plan))
    recipe = parse_recipe(made.files["recipe.yaml"])
    data = recipe.model_dump(mode="json")
    data["plan"] = recipe.plan.model_dump(mode="json", exclude_defaults=True)
    assert isinstance(recipe, RecipeFile)
    assert dump_yaml(data, allow_unicode=True, width=100) == yaml.safe_dump(
        data, sort_keys=False, allow_unicode=True, default_flow_style=False, width=100)
    assert made.files["recipe.yaml"].endswith(dump_yaml(data, allow_unicode=True, width=100))
    accelerate = made.files.get(render.ACCELERATE_FILE)
    if accelerate is not None:
        acc = yaml.safe_load(accelerate)
        assert dump_yaml(acc) == yaml.safe_dump(acc, sort_keys=False, default_flow_style=False)
