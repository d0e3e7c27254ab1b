"""Every command a recipe prints is one `canifinetune train` accepts for its trainer and GPU count (issue 21).

For each trainer x GPU count, the recipe is made three ways a user meets it: `canifinetune recipe` (its stdout),
the recipe's ESTIMATE.txt and the MCP tool make_recipe (its text); launch.sh's comment names --probe only for SFT.
Every command printed there is parsed with the CLI's own parser; a `train` command is then run through
recipes/train.py's ``train`` as far as the point where it would load the model, on a machine described as a CUDA GPU
with bf16 and flash-attn and the world size its launcher gives it (1 for a bare command, num_gpus under accelerate
launch or launch.sh), so train's own refusals decide: --probe for a trainer beyond SFT, a multi-GPU recipe without
its accelerate launch. No torch is needed: the model is never loaded.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from mcp.server.mcpserver.exceptions import ToolError

from canifinetune.estimator.errors import PlanError
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.recipes import train as train_module
from canifinetune.recipes.render import LAUNCH_FILE, make_recipe, next_command, write_recipe
from canifinetune.recipes.runtime import Machine, check_plan_for_machine
from canifinetune.recipes.schema import RecipeError, load_recipe
from canifinetune.server.cli import build_parser
from canifinetune.server.cli import main as cli_main
from canifinetune.server.text import format_recipe_brief

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
GPU = "A100 80GB"
TRAINERS = {
    "sft": {},
    "dpo": {},
    "orpo": {},
    "kto": {},
    "reward": {},
    "grpo": {"num_generations": 4, "max_completion_length": 256},
}
GPU_COUNTS = {1: {}, 2: {"num_gpus": 2, "sharding": "ddp"}}
# where a printed command starts: the CLI, an accelerate launch, or the recipe's launch.sh
COMMAND_START = re.compile(r"(?<![\w.\[/-])(canifinetune (?=[a-z])|accelerate launch |sh launch\.sh\b)")


class Reached(Exception):
    """train() went past every check of the plan against the machine: it would load the model here."""


def _plan(trainer: str, gpus: int) -> TrainingPlan:
    return TrainingPlan(model=MODEL, gpu=GPU, trainer=trainer, **TRAINERS[trainer], **GPU_COUNTS[gpus])


def _flags(trainer: str, gpus: int) -> list[str]:
    words = ["--model", MODEL, "--gpu", GPU, "--trainer", trainer]
    for key, value in {**TRAINERS[trainer], **GPU_COUNTS[gpus]}.items():
        words += ["--" + key.replace("_", "-"), str(value)]
    return words


def printed_commands(text: str) -> list[str]:
    """Every command in a text: from where it starts to the end of its line or the first ' (' after it (to its ')'
    when it is itself in parentheses)."""
    commands = []
    for line in text.splitlines():
        if line.startswith("canifinetune estimate for this recipe"):  # ESTIMATE.txt's title, not a command
            continue
        found = COMMAND_START.search(line)
        if found is None:
            continue
        command = line[found.start():]
        if line[:found.start()].endswith("("):  # '(canifinetune train ...)': the command ends at its ')'
            command = command.split(")", 1)[0]
        commands.append(re.split(r"\s+\(", command, maxsplit=1)[0].strip())
    return commands


def as_cli_call(command: str, launch_argv: list[str], num_gpus: int) -> tuple[list[str], int]:
    """(the canifinetune arguments, the processes it runs in) of a printed command."""
    argv = shlex.split(command)
    if argv[:2] == ["sh", LAUNCH_FILE]:  # launch.sh runs the launch command with its extra arguments
        argv = launch_argv + argv[2:]
    if argv[0] == "canifinetune":
        return argv[1:], 1
    assert argv[:2] == ["accelerate", "launch"], command
    module = argv.index("-m")
    assert argv[module + 1] == "canifinetune.server.cli", command
    return argv[module + 2:], num_gpus  # the recipe's accelerate config starts one process per planned GPU


def train_would_refuse(args, folder: Path, world_size: int, monkeypatch) -> str | None:
    """What recipes/train.py's train() refuses for these parsed arguments, or None when it would load the model."""
    machine = Machine(cuda=True, device_count=8, bf16=True, gpu_name="NVIDIA A100 80GB", world_size=world_size,
                      flash_attn=True)

    def as_far_as_loading(plan, *_args, **_kwargs):
        check_plan_for_machine(plan, machine)  # what prepare() (and so the probe) checks first
        raise Reached

    monkeypatch.setattr(train_module, "require_train_dependencies", lambda plan: None)
    monkeypatch.setattr(train_module, "require_device", lambda device: None)
    monkeypatch.setattr(train_module, "probe", as_far_as_loading)
    monkeypatch.setattr(train_module, "prepare", as_far_as_loading)
    monkeypatch.chdir(folder)
    try:
        train_module.train(args.recipe, dataset=args.dataset, probe_steps=args.probe, device=args.device)
    except Reached:
        return None
    except RecipeError as exc:
        return str(exc)
    raise AssertionError("train() returned without loading a model")


def _made(trainer: str, gpus: int, tmp_path: Path, capsys):
    """(recipe, its folder, the texts that print commands) made by the CLI and by make_recipe. A combination the
    estimate refuses (the trainers beyond SFT are estimated on one GPU) prints nothing there; its files are still
    rendered from the one-GPU estimate, so what they say is checked too."""
    plan = _plan(trainer, gpus)
    out = tmp_path / f"{trainer}-{gpus}"
    texts: dict[str, str] = {}
    code = cli_main(["recipe", *_flags(trainer, gpus), "--out", str(out), "--offline"])
    stdout = capsys.readouterr().out
    try:
        est = estimate(plan)
    except PlanError as exc:
        assert code == 2 and "one GPU" in str(exc), (code, exc)
        est = estimate(plan.replace(num_gpus=1, sharding="none"))
        recipe = make_recipe(plan, est)
        write_recipe(recipe, out)
    else:
        assert code == 0, stdout
        texts["canifinetune recipe"] = stdout
        recipe = make_recipe(est.plan, est)
    from canifinetune.server.mcp_server import recipe_impl
    from canifinetune.server.mcp_views import cli_command

    try:
        result = recipe_impl({"model": MODEL, "gpu": GPU, "trainer": trainer,
                              "plan": {**TRAINERS[trainer], **GPU_COUNTS[gpus]}}, offline=True)
    except ToolError:
        assert recipe.estimate.plan != plan  # refused only where the estimate refuses
        view = {"verdict": recipe.estimate.verdict, "verdict_reason": recipe.estimate.verdict_reason,
                "files": recipe.files, "cli_command": cli_command(plan),
                "launch_command": recipe.launch_command, "next_step": recipe.next_step}
        texts["make_recipe (rendered)"] = format_recipe_brief(view)
    else:
        texts["make_recipe"] = "\n".join(c.text for c in result.content if c.type == "text")
    texts["ESTIMATE.txt"] = (out / "ESTIMATE.txt").read_text(encoding="utf-8")
    assert load_recipe(out / "recipe.yaml").plan.trainer == trainer
    return recipe, out, texts


@pytest.mark.parametrize("gpus", sorted(GPU_COUNTS))
@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_every_printed_command_is_one_train_accepts(trainer, gpus, tmp_path, capsys, monkeypatch):
    recipe, folder, texts = _made(trainer, gpus, tmp_path, capsys)
    parser = build_parser()
    checked = 0
    for where, text in texts.items():
        for command in printed_commands(text):
            args, world_size = as_cli_call(command, recipe.launch_argv, gpus)
            parsed = parser.parse_args(args)  # the CLI's own parser: a UsageError fails the test
            if parsed.command != "train":
                continue
            refused = train_would_refuse(parsed, folder, world_size, monkeypatch)
            assert refused is None, f"{where} prints {command!r}, which train refuses: {refused}"
            checked += 1
    assert checked >= 2, texts  # at least the run and the next step
    # the next step is what every face names
    step = shlex.join(next_command(recipe.plan))
    assert all(step in text for text in texts.values()), texts
    # --probe only where train measures it: SFT; a multi-GPU recipe only through its launch command
    assert ("--probe" in step) == (trainer == "sft")
    assert step.startswith("sh launch.sh" if gpus > 1 else "canifinetune train recipe.yaml")
    # launch.sh's comment names the arguments that pass through: --probe only where train takes it
    comment = "".join(line for line in (folder / LAUNCH_FILE).read_text(encoding="utf-8").splitlines()
                      if line.startswith("#"))
    assert ("--probe" in comment) == (trainer == "sft")


def test_printed_commands_are_found():
    text = ("run (from this folder):  accelerate launch --config_file accelerate_config.yaml -m "
            "canifinetune.server.cli train recipe.yaml\n"
            "check it first:          set max_steps: 3 in recipe.yaml, then sh launch.sh   (watch nvidia-smi)\n"
            "next: cd '/tmp/x y', then canifinetune train recipe.yaml --probe 3   (measures 3 steps)\n"
            "install: pip install 'canifinetune[train]'\n"
            "next: run a short probe first (canifinetune train recipe.yaml --probe 3) and compare\n")
    assert printed_commands(text) == [
        "accelerate launch --config_file accelerate_config.yaml -m canifinetune.server.cli train recipe.yaml",
        "sh launch.sh", "canifinetune train recipe.yaml --probe 3", "canifinetune train recipe.yaml --probe 3"]


@pytest.mark.parametrize("trainer, gpus, world_size, refused", [
    ("dpo", 1, 1, "--probe"),  # the probe measures SFT steps only
    ("sft", 2, 1, "accelerate launch"),  # a multi-GPU recipe started as one process
])
def test_the_check_sees_what_train_refuses(trainer, gpus, world_size, refused, tmp_path, monkeypatch):
    """The commands the recipes printed before issue 21 (`canifinetune train recipe.yaml --probe 3` everywhere) are
    refused by this check, as by train itself."""
    plan = _plan(trainer, gpus)
    est = estimate(plan.replace(num_gpus=1, sharding="none"))
    write_recipe(make_recipe(plan, est), tmp_path)
    args = build_parser().parse_args(["train", "recipe.yaml", "--probe", "3"])
    assert refused in (train_would_refuse(args, tmp_path, world_size, monkeypatch) or "")
