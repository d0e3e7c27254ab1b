"""A multi-GPU recipe launched on the CPU: 2 processes, gloo, a tiny local model, two steps with a finite loss.

The recipe is rendered by make_recipe for ``num_gpus: 2`` and run with its own launch command and its own rendered
``accelerate_config.yaml``, unchanged, plus ``--device cpu`` (``canifinetune train --device cpu``):

* accelerate launch starts the 2 processes with torchrun (``distributed_type`` MULTI_GPU or FSDP: a CPU variant with
  ``use_cpu: true`` would make accelerate 1.15 start ONE process, its simple launcher, unless mpirun is used);
* ``--device cpu`` makes the runtime accept the 2-GPU plan without CUDA (a plain run without CUDA is still refused)
  and sets Trainer's ``use_cpu``, so accelerate's state becomes MULTI_CPU with the gloo backend.

What ran on the CPU (torch 2.13 CPU, accelerate 1.15, transformers 5.24): DDP for both recipes. accelerate applies
its FSDP plugin only under an accelerator's distributed type, so the FSDP recipe trains as DDP on the CPU (the
runtime prints a note saying so). FSDP2 itself does run on the CPU with gloo: the last test shards the same tiny model
as ``benchmarks/validation/fsdp_fake.py`` models accelerate's FSDP2 preparation and trains two steps with torchrun.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("peft")
pytest.importorskip("accelerate")

from test_runtime import NON_ASCII_ROWS, _write_jsonl, make_tiny_model

from canifinetune.estimator.plan import TrainingPlan
from canifinetune.recipes.render import make_recipe, write_recipe

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "OMP_NUM_THREADS": "1"})
    return env


def _recipe(tiny_model: Path, tmp_path: Path, sharding: str) -> tuple[Path, list[str]]:
    data = _write_jsonl(tmp_path / "train.jsonl", NON_ASCII_ROWS * 4)  # 16 rows: 2 steps x 2 ranks x batch 2 = 8
    plan = TrainingPlan(model=str(tiny_model), dtype="fp32", seq_len=64, batch_size=2, max_steps=2,
                        learning_rate=1e-3, num_gpus=2, sharding=sharding, dataset=str(data))
    recipe = make_recipe(plan)
    folder = tmp_path / "recipe"
    write_recipe(recipe, folder)
    return folder, recipe.launch_argv


# Rendezvous failures that say nothing about the recipe: the free port was taken between our probe and
# torchrun's bind, or a peer's gloo connection was refused while the other rank was still starting.
TRANSIENT_LAUNCH = re.compile(r"EADDRINUSE|Address already in use|connectFullMesh|Connection refused|"
                              r"Connection reset by peer|DistNetworkError|RendezvousConnectionError")


def _run_on_free_port(make_cmd, folder: Path) -> subprocess.CompletedProcess:
    """Run ``make_cmd(port)`` with a free rendezvous port. One retry, with a new port, only when the failure is
    a rendezvous failure (one was seen in five runs); any other failure stands."""
    for attempt in range(2):
        run = subprocess.run(make_cmd(_free_port()), cwd=folder, env=_env(), capture_output=True, text=True,
                             timeout=240)
        if run.returncode == 0 or not TRANSIENT_LAUNCH.search(run.stdout + run.stderr) or attempt:
            return run
    return run


def _launch(argv: list[str], folder: Path) -> subprocess.CompletedProcess:
    """The rendered launch command, with a free rendezvous port and --device cpu."""
    return _run_on_free_port(
        lambda port: [argv[0], argv[1], "--main_process_port", str(port), *argv[2:], "--device", "cpu"], folder)


@pytest.mark.parametrize("sharding", ["ddp", "fsdp_full_shard"])
def test_two_gpu_recipe_trains_two_steps_on_cpu_with_two_processes(tiny_model, tmp_path, sharding):
    folder, argv = _recipe(tiny_model, tmp_path, sharding)
    assert argv[:2] == ["accelerate", "launch"]
    # the launch command as rendered, with a free rendezvous port (tests may run side by side) and --device cpu
    run = _launch(argv, folder)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    # every rank reports its steps: two processes ran
    assert output.count("canifinetune: trained 2 steps on 16 samples") == 2, output[-4000:]
    losses = [float(x) for x in re.findall(r"'loss': '?([-+0-9.eE]+|nan|inf)'?", output)]
    assert len(losses) >= 2 and all(math.isfinite(x) and x > 0 for x in losses), losses
    # 2 steps x batch 2 x 2 ranks = 8 of 16 samples: the data was split over 2 ranks (one rank would reach 0.25)
    assert re.search(r"'epoch': '?0\.5'?", output), output[-4000:]
    if sharding != "ddp":
        assert "on the CPU accelerate trains it as data parallelism" in output


def test_two_gpu_recipe_without_cuda_still_needs_device_cpu(tiny_model, tmp_path):
    from canifinetune.recipes.runtime import Machine, check_plan_for_machine
    from canifinetune.recipes.schema import RecipeError, load_recipe

    folder, _ = _recipe(tiny_model, tmp_path, "ddp")
    plan = load_recipe(folder / "recipe.yaml").plan
    with pytest.raises(RecipeError, match="no CUDA GPU"):
        check_plan_for_machine(plan, Machine(cuda=False, world_size=2))
    with pytest.raises(RecipeError, match="start 2 processes"):
        check_plan_for_machine(plan, Machine(cuda=False, world_size=1, cpu_run=True))
    check_plan_for_machine(plan, Machine(cuda=False, world_size=2, cpu_run=True))


FSDP2_SCRIPT = r"""
import json, sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[2])
from torch.distributed.device_mesh import init_device_mesh
from fsdp_fake import shard_like_accelerate
from canifinetune.recipes import model_setup
from canifinetune.recipes.runtime import model_source
from canifinetune.recipes.schema import load_recipe
dist.init_process_group("gloo")
plan = load_recipe(sys.argv[1]).plan
config, source = model_source(plan)
torch.manual_seed(0)
model = model_setup.build_model(plan, config, pretrained_path=source)
wrapped, _ = shard_like_accelerate(model, plan, init_device_mesh("cpu", (dist.get_world_size(),)))
opt = model_setup.build_optimizer(plan, model)
ids = torch.randint(0, int(config["vocab_size"]), (plan.batch_size, 32), generator=torch.Generator().manual_seed(1))
losses = []
for _ in range(2):
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.item())
result = {"rank": dist.get_rank(), "root": type(model).__name__, "wrapped": wrapped, "losses": losses}
dist.barrier()
dist.destroy_process_group()
with open(sys.argv[3] + f"/rank{result['rank']}.json", "w", encoding="utf-8") as handle:
    json.dump(result, handle)
"""


def test_fsdp2_itself_runs_on_cpu_with_gloo(tiny_model, tmp_path):
    """fully_shard as accelerate's fsdp2_prepare_model applies it (the measurement harness's sharding), 2 ranks."""
    folder, _ = _recipe(tiny_model, tmp_path, "fsdp_full_shard")
    script = tmp_path / "fsdp2_two_steps.py"
    script.write_text(FSDP2_SCRIPT, encoding="utf-8")
    run = _run_on_free_port(
        lambda port: [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(port),
            str(script),
            str(folder / "recipe.yaml"),
            str(ROOT / "benchmarks" / "validation"),
            str(tmp_path),
        ],
        folder,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(2)]
    for result in results:
        assert result["root"].startswith("FSDP") and result["wrapped"] == 2, result  # root sharded, 2 layers wrapped
        assert len(result["losses"]) == 2 and all(math.isfinite(x) and x > 0 for x in result["losses"]), result
    assert results[0]["losses"] == results[1]["losses"]  # one model over 2 ranks: the same loss on both
