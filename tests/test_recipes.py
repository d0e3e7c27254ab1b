"""Recipes: rendering, the strict schema, machine checks, injection safety. No torch is needed here."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from canifinetune.estimator.plan import TrainingPlan
from canifinetune.recipes.render import (
    ACCELERATE_FILE,
    LAUNCH_FILE,
    Recipe,
    make_recipe,
    write_recipe,
)
from canifinetune.recipes.runtime import Machine, check_plan_for_machine
from canifinetune.recipes.schema import RecipeError, load_recipe, parse_recipe
from canifinetune.server.cli import main as cli_main

ROOT = Path(__file__).resolve().parent.parent

TINY_CONFIG = {
    "model_type": "llama", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 256, "tie_word_embeddings": False,
}
HOSTILE = [
    'x"; touch pwned; echo "',
    "x'; touch pwned; echo '",
    "$(touch pwned)",
    "`touch pwned`",
    "a;touch pwned",
    "a && touch pwned || b",
    "--config_file=/etc/passwd",
]
# Values with newlines or other control characters ("line1\nrm -rf ~ #", "key: value\nplan: {model: evil}") are
# refused by TrainingPlan itself: tests/test_recipe_injection.py.


def _plan(**kw) -> TrainingPlan:
    return TrainingPlan(**{"model": "Qwen/Qwen2.5-0.5B", "gpu": "RTX 4090", **kw})


# ----------------------------------------------------------------------------------------- rendering


@pytest.mark.parametrize("kw", [
    {},
    {"method": "qlora", "target_modules": "all-linear", "dataset": "data/train.jsonl", "truncation": True},
    {"method": "full", "optim": "adafactor", "precision": "mixed", "gradient_checkpointing": False},
    {"target_modules": ["q_proj", "o_proj"], "lora_r": 8, "learning_rate": 2e-4, "max_steps": 100},
    {"num_gpus": 4, "sharding": "ddp"},
    {"num_gpus": 2, "sharding": "fsdp_full_shard", "offload_params": True, "offload_optimizer": True},
    {"num_gpus": 8, "sharding": "zero3", "offload_optimizer": True, "method": "full"},
])
def test_recipe_round_trips_to_the_same_plan(kw, tmp_path):
    plan = _plan(**kw)
    recipe = make_recipe(plan)
    assert parse_recipe(recipe.recipe_yaml).plan == plan
    paths = write_recipe(recipe, tmp_path / "out")
    assert {p.name for p in paths} == set(recipe.files)
    loaded = load_recipe(tmp_path / "out" / "recipe.yaml")
    assert loaded.plan == plan
    assert loaded.estimate.total_bytes == recipe.estimate.total_bytes
    assert loaded.estimate.peak_allocated_bytes == recipe.estimate.peak_allocated_bytes
    assert shlex.split(recipe.launch_command) == recipe.launch_argv
    assert recipe.estimate.plan == plan
    if plan.num_gpus == 1:
        assert recipe.launch_argv == ["canifinetune", "train", "recipe.yaml"]
        assert recipe.accelerate_config_yaml is None and ACCELERATE_FILE not in recipe.files
    else:
        assert recipe.launch_argv[:4] == ["accelerate", "launch", "--config_file", ACCELERATE_FILE]
        acc = yaml.safe_load(recipe.accelerate_config_yaml)
        assert acc["num_processes"] == plan.num_gpus
        expected = {"ddp": "MULTI_GPU", "fsdp_full_shard": "FSDP", "zero3": "DEEPSPEED"}[plan.sharding]
        assert acc["distributed_type"] == expected
        if expected == "DEEPSPEED":
            assert acc["deepspeed_config"]["zero_stage"] == 3
            assert acc["deepspeed_config"]["offload_optimizer_device"] == "cpu"
            assert "deepspeed" in recipe.requirements_txt
        if expected == "FSDP":
            assert acc["fsdp_config"]["fsdp_reshard_after_forward"] is True
            assert acc["fsdp_config"]["fsdp_offload_params"] is True
    assert "canifinetune[train]" in recipe.requirements_txt
    assert f"{recipe.estimate.total_bytes / 1024**3:.2f} GiB" in recipe.estimate_summary
    assert stat.S_IMODE((tmp_path / "out" / LAUNCH_FILE).stat().st_mode) & 0o100


def test_accelerate_config_loads_in_accelerate(tmp_path):
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import load_config_from_file

    for kw in ({"num_gpus": 2, "sharding": "ddp"}, {"num_gpus": 2, "sharding": "fsdp_shard_grad_op"},
               {"num_gpus": 2, "sharding": "zero2", "offload_optimizer": True}):
        recipe = make_recipe(_plan(**kw))
        path = tmp_path / f"{kw['sharding']}.yaml"
        path.write_text(recipe.accelerate_config_yaml, encoding="utf-8")
        config = load_config_from_file(str(path))
        assert config.num_processes == 2


def test_render_does_not_import_torch():
    code = (
        "import sys\n"
        "from canifinetune.estimator.plan import TrainingPlan\n"
        "from canifinetune.recipes.render import make_recipe\n"
        "import canifinetune.recipes.schema, canifinetune.recipes.runtime, canifinetune.recipes.probe\n"
        "make_recipe(TrainingPlan(model='Qwen/Qwen2.5-0.5B', gpu='RTX 4090', num_gpus=2, sharding='zero3'))\n"
        "heavy = [m for m in ('torch', 'transformers', 'peft', 'trl', 'bitsandbytes') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_mcp_adapter_sees_the_files():
    """make_recipe links every file of the recipe (issue 15.4), and each link reads back as the file."""
    from canifinetune.server.mcp_server import RECIPE_URI_PREFIX, recipe_file, recipe_impl

    plan = _plan(method="qlora", dataset="train.jsonl")
    recipe = make_recipe(plan)
    result = recipe_impl({"model": plan.model, "gpu": plan.gpu, "method": "qlora", "dataset": "train.jsonl"})
    links = {c.name: c.uri for c in result.content if c.type == "resource_link"}
    # the URIs travel once, as resource links; the structured content names the files (issue 21: URIs once)
    assert list(links) == result.structured_content["files"] == list(recipe.files)
    for name, uri in links.items():
        key, file_name = str(uri)[len(RECIPE_URI_PREFIX):].split("/", 1)
        assert file_name == name and recipe_file(key, name) == recipe.files[name]


def test_write_recipe_refuses_names_outside_the_folder(tmp_path):
    recipe = make_recipe(_plan())
    for name in ("../evil.yaml", "sub/recipe.yaml", "/etc/passwd", "..", "other.txt"):
        bad = recipe.model_copy(update={"files": {name: "x"}})
        with pytest.raises(RecipeError, match="refusing"):
            write_recipe(bad, tmp_path / "out")
    assert not (tmp_path / "evil.yaml").exists()
    # a symlink planted in the folder is not followed
    out = tmp_path / "out2"
    out.mkdir()
    (out / "recipe.yaml").symlink_to(tmp_path / "target.txt")
    with pytest.raises(RecipeError, match="symbolic link"):
        write_recipe(recipe, out)
    assert not (tmp_path / "target.txt").exists()
    assert sorted(p.name for p in out.iterdir()) == ["recipe.yaml"]  # nothing else was written either


# ----------------------------------------------------------------------------------------- strict schema


def _yaml(plan_extra: dict | None = None, **top) -> str:
    data = {"canifinetune_recipe": 1, "plan": {"model": "Qwen/Qwen2.5-0.5B", **(plan_extra or {})}, **top}
    return yaml.safe_dump(data)


@pytest.mark.parametrize("text, words", [
    (_yaml(learning_rat=1e-4), ["learning_rat", "top-level", "plan:"]),
    (_yaml({"lora_rank": 8}), ["plan.lora_rank", "not a known field"]),
    (_yaml({"method": "full", "load_in_4bit": True}), ["full fine-tuning cannot train a quantized base", "qlora"]),
    (_yaml({"method": "qlora", "load_in_8bit": True}), ["load_in_8bit", "pick one"]),
    (_yaml({"method": "lora", "load_in_4bit": True}), ["load_in_4bit", "set method to 'qlora'"]),
    (_yaml({"num_gpus": 2}), ["sharding", "need a sharding strategy"]),
    (_yaml({"dtype": "bf32"}), ["plan.dtype"]),
    (_yaml({"seq_len": -5}), ["plan.seq_len"]),
    (_yaml({"estimate": 1}), ["plan.estimate"]),
    (_yaml(estimate={"total_bytes": 1, "surprise": 2}), ["estimate"]),
    ("canifinetune_recipe: 2\nplan: {model: x}\n", ["recipe format 1"]),
    ("plan: {model: x}\n", ["canifinetune_recipe"]),
    ("canifinetune_recipe: 1\n", ["plan"]),
    ("- a\n- b\n", ["must be a mapping"]),
    ("canifinetune_recipe: 1\nplan: {model: x\n", ["not valid YAML"]),
    ("canifinetune_recipe: 1\nplan:\n  model: a\n  model: b\n", ["appears twice"]),
    ("canifinetune_recipe: 1\nplan: !!python/object/apply:os.system ['touch pwned']\n", ["not valid YAML"]),
])
def test_strict_schema_errors(text, words, tmp_path):
    with pytest.raises(RecipeError) as info:
        parse_recipe(text)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message
    assert not Path("pwned").exists()
    # the CLI says it in one line and exits 2
    path = tmp_path / "recipe.yaml"
    path.write_text(text, encoding="utf-8")
    assert cli_main(["train", str(path)]) == 2


def test_cli_error_is_one_line(tmp_path, capsys):
    path = tmp_path / "recipe.yaml"
    path.write_text(_yaml({"lora_rank": 8}), encoding="utf-8")
    assert cli_main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("canifinetune: error: plan.lora_rank")
    assert cli_main(["train", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_recipe_file_is_utf8_whatever_the_locale(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_bytes(_yaml({"dataset": "données/训练.jsonl"}).encode("utf-8"))
    assert load_recipe(path).plan.dataset == "données/训练.jsonl"
    path.write_bytes("canifinetune_recipe: 1\nplan: {model: caf\xe9}\n".encode("latin-1"))
    with pytest.raises(RecipeError, match="not UTF-8"):
        load_recipe(path)


# ----------------------------------------------------------------------------------------- machine checks

GPU = Machine(cuda=True, device_count=1, bf16=True, gpu_name="NVIDIA A100", world_size=1, flash_attn=False)


@pytest.mark.parametrize(
    "kw, machine, words",
    [
        (
            {"dtype": "bf16"},
            Machine(cuda=True, device_count=1, bf16=False, gpu_name="Tesla T4"),
            ["dtype", "Tesla T4", "fp16"],
        ),
        ({"num_gpus": 4, "sharding": "ddp"}, Machine(cuda=True, device_count=2, bf16=True), ["num_gpus", "has 2"]),
        (
            {"num_gpus": 2, "sharding": "ddp"},
            Machine(cuda=True, device_count=2, bf16=True, world_size=1),
            ["accelerate launch"],
        ),
        ({"num_gpus": 2, "sharding": "ddp"}, Machine(cuda=False), ["no CUDA GPU"]),
        ({"dtype": "fp16"}, Machine(cuda=False), ["fp16", "CPU"]),
        ({"attn_implementation": "flash_attention_2"}, GPU, ["flash-attn", "sdpa"]),
        ({"optim": "paged_adamw_8bit"}, Machine(cuda=False), ["paged_adamw_8bit"]),
        ({"output_dir": "../../elsewhere"}, GPU, ["output_dir", "inside"]),
        ({"output_dir": "/tmp/abs"}, GPU, ["output_dir"]),
    ],
)
def test_impossible_combinations_are_refused(kw, machine, words):
    with pytest.raises(RecipeError) as info:
        check_plan_for_machine(_plan(**kw), machine)
    for word in words:
        assert word in str(info.value), str(info.value)


@pytest.mark.parametrize("sharding", ["fsdp_full_shard", "fsdp_shard_grad_op"])
def test_fsdp_optimizer_only_offload_is_refused_by_the_plan(sharding):
    """FSDP has no optimizer-only offload (accelerate's fsdp_offload_params / torch's CPUOffloadPolicy moves
    parameters, gradients and the step together): the plan refuses it, so no recipe or estimate is made for it."""
    with pytest.raises(ValueError) as info:
        _plan(num_gpus=2, sharding=sharding, offload_optimizer=True)
    assert "offload_optimizer" in str(info.value) and "offload_params" in str(info.value) and "zero" in str(info.value)
    both = make_recipe(_plan(num_gpus=2, sharding="fsdp_full_shard", offload_optimizer=True, offload_params=True))
    assert yaml.safe_load(both.accelerate_config_yaml)["fsdp_config"]["fsdp_offload_params"] is True
    assert both.estimate.host_memory_bytes > 0


def test_possible_plans_pass_the_machine_checks():
    check_plan_for_machine(_plan(), GPU)
    check_plan_for_machine(_plan(dtype="fp32"), Machine(cuda=False))
    check_plan_for_machine(
        _plan(num_gpus=2, sharding="zero3"), Machine(cuda=True, device_count=8, bf16=True, world_size=2)
    )


# ----------------------------------------------------------------------------------------- injection


@pytest.fixture()
def hostile_model(tmp_path):
    folder = tmp_path / 'm"; $(touch pwned); `touch pwned`;\'x'
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_CONFIG), encoding="utf-8")
    return folder


@pytest.mark.parametrize("bad", HOSTILE)
def test_hostile_values_cannot_inject(bad, hostile_model, tmp_path):
    plans = [
        TrainingPlan(model=str(hostile_model), dataset=bad, output_dir="outputs"),
        TrainingPlan(model=str(hostile_model), dataset=bad, num_gpus=2, sharding="zero2", target_modules=["q_proj"]),
    ]
    for plan in plans:
        recipe: Recipe = make_recipe(plan)
        # YAML keeps each value a value: the plan comes back exactly, no extra keys
        back = parse_recipe(recipe.recipe_yaml)
        assert back.plan == plan and back.plan.dataset == bad
        assert set(yaml.safe_load(recipe.recipe_yaml)) == {"canifinetune_recipe", "plan", "estimate"}
        # no plan string reaches a command, the accelerate config or the requirements
        for text in (recipe.launch_command, recipe.files[LAUNCH_FILE], recipe.requirements_txt,
                     recipe.accelerate_config_yaml or ""):
            assert bad.strip() not in text and "pwned" not in text
        assert shlex.split(recipe.launch_command) == recipe.launch_argv
        # the summary quotes values (repr): a newline in a value cannot start a line of its own
        assert all(not line.startswith("rm -rf") and not line.startswith("plan:")
                   for line in recipe.estimate_summary.splitlines())
        # run launch.sh with a stub `canifinetune`/`accelerate` that records its arguments
        out = tmp_path / f"out{plan.num_gpus}"
        write_recipe(recipe, out)
        stub_dir = tmp_path / "bin"
        stub_dir.mkdir(exist_ok=True)
        for tool in ("canifinetune", "accelerate"):
            stub = stub_dir / tool
            stub.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGS_FILE"\n', encoding="utf-8")
            stub.chmod(0o755)
        env = {
            **os.environ,
            "PATH": f"{stub_dir}{os.pathsep}{os.environ['PATH']}",
            "ARGS_FILE": str(tmp_path / "args.txt"),
        }
        run = subprocess.run(["sh", str(out / LAUNCH_FILE)], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=30)
        assert run.returncode == 0, run.stderr
        args = (tmp_path / "args.txt").read_text(encoding="utf-8").splitlines()
        assert args == recipe.launch_argv[1:]
    assert not any(p.name == "pwned" for p in tmp_path.rglob("pwned"))
    assert not (ROOT / "pwned").exists() and not Path("pwned").exists()


def test_cli_recipe_writes_the_folder(tmp_path, capsys, hostile_model):
    out = tmp_path / "recipe out"
    code = cli_main(["recipe", "--model", str(hostile_model), "--dataset", "$(touch pwned).jsonl", "--out", str(out),
                     "--json", "--offline"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["files"]) == {p.name for p in out.iterdir()}
    assert load_recipe(out / "recipe.yaml").plan.dataset == "$(touch pwned).jsonl"
    assert not any(tmp_path.rglob("pwned"))
    assert cli_main(["recipe", "--model", "Qwen/Qwen2.5-0.5B", "--method", "full", "--load-in-4bit", "--out",
                     str(tmp_path / "x")]) == 2
