"""Recipes cannot be weaponized: every string that reaches a recipe is validated, then only ever quoted.

Extends tests/test_recipes.py (which runs launch.sh on hostile dataset values) to every string field a
recipe carries: model id, dataset path, output dir, target module names; through the core, the MCP
tool and the CLI. Three outcomes only:

- refused, naming the field: control characters (newline, CR, NUL, escape, DEL, U+2028, bidi
  overrides), too long, target module names that are not plain names, output dirs that would leave the
  recipe's folder ('..', absolute, '~', a drive);
- accepted and inert: the value is data in recipe.yaml (round-trips exactly, no YAML tags), a repr() in
  the text summary, and absent from every command: launch.sh, the launch command, requirements and the
  accelerate config are byte-identical to a benign plan's;
- and in every case nothing is written outside the chosen folder, and no 'pwned' file appears.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from canifinetune.estimator.plan import MAX_STRING, TrainingPlan
from canifinetune.recipes.render import FILE_NAMES, LAUNCH_FILE, make_recipe, write_recipe
from canifinetune.recipes.schema import RecipeError, parse_recipe
from canifinetune.server.cli import main as cli_main

ROOT = Path(__file__).resolve().parent.parent
MODEL = "Qwen/Qwen2.5-0.5B"
TINY_CONFIG = {
    "model_type": "llama", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 256, "tie_word_embeddings": False,
}

# Printable, so accepted as data: shell, YAML, template and format-string metacharacters, unicode.
INERT = [
    "$(touch pwned)",
    "`touch pwned`",
    "a; touch pwned",
    "a && touch pwned || b",
    "a | touch pwned",
    "> pwned",
    "'; touch pwned; echo '",
    '"; touch pwned; echo "',
    "${IFS}touch${IFS}pwned",
    "$HOME/*",
    "-rf",
    "--config_file=/etc/passwd",
    "!!python/object/apply:os.system ['touch pwned']",
    "&anchor *alias",
    "key: value",
    "- item",
    "# comment",
    "{{7*7}} %s%n {0}",
    "\\",
    "模型/数据 🤗.jsonl",
    "שלום مرحبا",
    "x" * (MAX_STRING - 20) + "$(touch pwned)",
]
# Read-only paths: a dataset may be anywhere (it is read, never written).
READ_PATHS = ["../../../etc/passwd", "/etc/passwd", "~/data.jsonl", "C:\\data\\train.jsonl"]
# Never accepted anywhere: they start new lines or hide text in a recipe, a log or a terminal.
CONTROL = ["a\nrm -rf ~", "key: value\nplan: {model: evil}", "a\rb", "a\x00b", "a\x1b[2Jb", "a\x7fb", "a\x85b",
           "a\u2028b", "a\u2029b", "a\u202eb", "a\u2066b", "a\tb"]
ESCAPING = ["..", "../outside", "a/../../outside", "/tmp/outside", "/", "~", "~/outside", "~root/x", "C:\\outside",
            "C:outside", "\\\\server\\share", "a\\..\\..\\outside", "./../outside"]


def _plan(**kw) -> TrainingPlan:
    return TrainingPlan(**{"model": MODEL, "gpu": "RTX 4090", **kw})


def _output_dir_ok(value: str) -> bool:
    return not any(value.startswith(p) for p in ("/", "~", "\\")) and ".." not in value and ":" not in value


@pytest.fixture(scope="module")
def stubs(tmp_path_factory) -> Path:
    """`canifinetune` and `accelerate` stand-ins that only record their arguments."""
    folder = tmp_path_factory.mktemp("stub bin")
    for tool in ("canifinetune", "accelerate"):
        stub = folder / tool
        stub.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGS_FILE"\n', encoding="utf-8")
        stub.chmod(0o755)
    return folder


def _fields_for(value: str) -> list[dict]:
    kws = [{"dataset": value}]
    if _output_dir_ok(value):
        kws.append({"output_dir": value})
    return kws


# ----------------------------------------------------------------------------------------- accepted, inert


@pytest.mark.parametrize("value", INERT + READ_PATHS)
def test_inert_values_stay_data(value, tmp_path, stubs):
    for kw in _fields_for(value):
        for extra in ({}, {"num_gpus": 2, "sharding": "zero3", "target_modules": ["q_proj", "v_proj"]}):
            plan = _plan(**kw, **extra)
            benign = make_recipe(_plan(**extra))
            recipe = make_recipe(plan)
            field, = kw
            # recipe.yaml: the value is one YAML scalar that round-trips exactly; no tag runs, no key appears
            data = yaml.safe_load(recipe.recipe_yaml)
            assert set(data) == {"canifinetune_recipe", "plan", "estimate"}
            # recipe.yaml writes model and the fields that differ from the defaults (issue 21): this one among them
            assert data["plan"][field] == getattr(plan, field) and set(data["plan"]) <= set(TrainingPlan.model_fields)
            assert parse_recipe(recipe.recipe_yaml).plan == plan
            # every command is the benign plan's, byte for byte: no plan value reaches a shell
            assert recipe.launch_argv == benign.launch_argv
            assert recipe.launch_command == benign.launch_command
            for name in FILE_NAMES:
                if name in ("recipe.yaml", "ESTIMATE.txt", "estimate.json"):
                    continue
                assert recipe.files.get(name) == benign.files.get(name), name
            assert set(recipe.files) == set(benign.files)
            # the text summary shows values as repr(): each line starts with a fixed label, never with the value
            labels = {line.split(":")[0] for line in benign.estimate_summary.splitlines()}
            assert {line.split(":")[0] for line in recipe.estimate_summary.splitlines()} <= labels | {""}
            json.loads(recipe.files["estimate.json"])
            # written and run: only the recipe's files, only inside the folder; the stub sees the fixed argv
            out = tmp_path / "recipe folder" / f"{field}{extra.get('num_gpus', 1)}"
            written = write_recipe(recipe, out)
            assert {p.name for p in written} == set(recipe.files) == {p.name for p in out.iterdir()}
            args_file = tmp_path / "args.txt"
            env = {**os.environ, "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}", "ARGS_FILE": str(args_file)}
            run = subprocess.run(["sh", str(out / LAUNCH_FILE)], cwd=tmp_path, env=env, capture_output=True,
                                 text=True, timeout=30)
            assert run.returncode == 0, run.stderr
            assert args_file.read_text(encoding="utf-8").splitlines() == recipe.launch_argv[1:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["args.txt", "recipe folder"]
    assert not list(tmp_path.rglob("pwned")) and not (ROOT / "pwned").exists()


@pytest.mark.parametrize("value", ['m"; $(touch pwned); `touch pwned`;\'x', "模型 🤗", "-rf", "a b & c"])
def test_hostile_local_model_folder_is_data(value, tmp_path):
    folder = tmp_path / value
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_CONFIG), encoding="utf-8")
    recipe = make_recipe(TrainingPlan(model=str(folder)))
    assert parse_recipe(recipe.recipe_yaml).plan.model == str(folder)
    assert str(folder) not in recipe.launch_command and value not in recipe.files[LAUNCH_FILE]
    assert repr(str(folder)) in recipe.estimate_summary
    assert not list(tmp_path.rglob("pwned"))


@pytest.mark.parametrize(
    "names", [["q_proj", "v_proj"], ["model.layers.0.self_attn.q_proj"], ["up_proj", "down-proj_2"]]
)
def test_plain_target_module_names_only_reach_yaml(names, tmp_path):
    recipe = make_recipe(TrainingPlan(model=str(_tiny(tmp_path)), target_modules=[*names, "q_proj"]))
    assert yaml.safe_load(recipe.recipe_yaml)["plan"]["target_modules"] == sorted({*names, "q_proj"})
    for name in names:
        assert name not in recipe.launch_command and name not in recipe.files[LAUNCH_FILE]


def _tiny(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny"
    folder.mkdir(exist_ok=True)
    config = {**TINY_CONFIG}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


# ----------------------------------------------------------------------------------------- refused


@pytest.mark.parametrize("value", CONTROL)
@pytest.mark.parametrize("field", ["model", "gpu", "dataset", "output_dir"])
def test_control_characters_are_refused_naming_the_field(field, value):
    with pytest.raises(ValidationError) as info:
        TrainingPlan(**{"model": MODEL, field: value})
    errors = info.value.errors()
    assert [e["loc"] for e in errors] == [(field,)], errors
    assert "control characters" in str(info.value)


@pytest.mark.parametrize(
    "value", ["$(touch pwned)", "q;proj", "q proj", "../q_proj", "q`x`", "q\nproj", "q'x", "", "a\x00"]
)
def test_hostile_target_module_names_are_refused(value):
    with pytest.raises(ValidationError) as info:
        TrainingPlan(model=MODEL, target_modules=["q_proj", value])
    assert all(e["loc"][0] == "target_modules" for e in info.value.errors())


@pytest.mark.parametrize("field", ["model", "gpu", "dataset", "output_dir"])
def test_very_long_strings_are_refused(field):
    with pytest.raises(ValidationError) as info:
        TrainingPlan(**{"model": MODEL, field: "a" * (MAX_STRING + 1)})
    assert info.value.errors()[0]["loc"] == (field,)
    with pytest.raises(ValidationError):
        TrainingPlan(model=MODEL, target_modules=["q" * (MAX_STRING + 1)])


@pytest.mark.parametrize("value", ESCAPING)
def test_output_dir_cannot_leave_the_recipe_folder(value, tmp_path):
    with pytest.raises(RecipeError) as info:
        make_recipe(_plan(output_dir=value))
    assert str(info.value).startswith("output_dir:") and "inside the recipe's folder" in str(info.value)
    # the CLI: one line on stderr, exit 2, nothing written
    out = tmp_path / "out"
    assert cli_main(["recipe", "--model", MODEL, "--output-dir", value, "--out", str(out), "--offline"]) == 2
    assert not out.exists()


@pytest.mark.parametrize("text, field", [
    ('canifinetune_recipe: 1\nplan: {model: "Qwen/Qwen2.5-0.5B", dataset: "a\\nb"}\n', "plan.dataset"),
    ('canifinetune_recipe: 1\nplan: {model: "Qwen/Qwen2.5-0.5B", output_dir: "x\\u0000"}\n', "plan.output_dir"),
    ('canifinetune_recipe: 1\nplan: {model: "Qwen/\\u202eQwen2.5-0.5B"}\n', "plan.model"),
])
def test_a_hand_edited_recipe_with_control_characters_is_refused(text, field):
    with pytest.raises(RecipeError) as info:
        parse_recipe(text)
    assert str(info.value).startswith(field), str(info.value)


# ----------------------------------------------------------------------------------------- through MCP


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_mcp_make_recipe_refuses_or_quotes(anyio_backend, monkeypatch):
    from mcp import Client

    from canifinetune.server.mcp_server import build_server

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    refused = [("output_dir", v) for v in ESCAPING] + [(f, v) for f in ("model", "dataset", "output_dir", "gpu")
                                                       for v in CONTROL[:4]]
    refused += [("target_modules", ["$(touch pwned)"]), ("target_modules", ["q_proj", "a;b"])]
    async with Client(build_server()) as client:
        for field, value in refused:
            result = await client.call_tool("make_recipe", {"model": MODEL, field: value})
            text = result.content[0].text
            assert result.is_error and text.startswith(f"make_recipe: {field}"), (field, value, text)
        for value in INERT[:12]:
            result = await client.call_tool("make_recipe", {"model": MODEL, "dataset": value})
            assert not result.is_error, result.content[0].text
            # name -> resource URI, from the resource links (issue 21: the URIs travel once): read as a client does
            links = {c.name: str(c.uri) for c in result.content if c.type == "resource_link"}
            files = {name: (await client.read_resource(uri)).contents[0].text for name, uri in links.items()}
            assert value not in files[LAUNCH_FILE] and yaml.safe_load(files["recipe.yaml"])["plan"]["dataset"] == value
    assert not (ROOT / "pwned").exists()
