"""Recipes for several nodes (issue 27), run for real on one machine: two "nodes" on loopback.

Each test starts two launchers, one per node, from the recipe's own ``launch.sh`` (node 0 with arguments, node 1 with
NODE_RANK / MASTER_ADDR / MASTER_PORT in its environment), with the head node at 127.0.0.1, and ``--device cpu``: the
written ``accelerate_config.yaml`` (``num_machines: 2``), accelerate launch's static rendezvous (torchrun
``--nnodes 2 --node_rank R``) and gloo, exactly as on two machines but for the address. What ran (torch 2.13 CPU,
accelerate 1.15, DeepSpeed 0.19.8, transformers 5.24):

* ddp, 2 nodes of 1: DistributedDataParallel over 2 processes;
* zero3, 2 nodes of 1: DeepSpeed's ZeRO-3 engine itself (its CPU accelerator over gloo: all-gathers, reduce-scatters);
* zero3_hpz, 2 nodes of 2: ZeRO-3 with ZeRO++'s hpZ, from the recipe's ``ds_config.json`` (zero_hpz_partition_size 2);
* fsdp_hybrid_shard, 2 nodes of 2: accelerate applies FSDP only under an accelerator (and its ParallelismConfig refuses
  the CPU's MULTI_CPU), so on the CPU the recipe trains as data parallelism; HSDP itself runs in the last test.

Every test checks that both nodes trained the same steps: the same logged losses and gradient norms on each (the
Trainer logs the loss averaged over all ranks), two steps each, and half an epoch or more (the data was split).

The last slow test runs the two hybrid engines themselves across two loopback nodes of 2 processes and measures what
one rank holds: FSDP2 on a (2 nodes, 2 GPUs) DeviceMesh (HYBRID_SHARD: each rank holds P/2, as full shard over one
node's GPUs) and DeepSpeed ZeRO-3 with zero_hpz_partition_size 2 (the primary partition P/4 beside the secondary P/2),
against estimator/sharding.py. The SLURM script is run with stand-ins for ``scontrol`` and ``srun`` (sbatch is not
here) and parsed for its directives.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from canifinetune.estimator.plan import TrainingPlan
from canifinetune.recipes.render import DEEPSPEED_FILE, LAUNCH_FILE, SLURM_FILE, make_recipe, write_recipe

ROOT = Path(__file__).resolve().parent.parent
MODEL = "Qwen/Qwen2.5-0.5B"
LOSS_LINE = re.compile(r"\{'loss': [^}]*\}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict:
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "OMP_NUM_THREADS": "1", **extra})
    return env


@pytest.fixture(scope="module")
def stubs(tmp_path_factory) -> Path:
    """Stand-ins that only record what they were given: accelerate (its arguments, one file per machine rank),
    scontrol (two hosts), srun (the command once per node, with SLURM_NODEID, as SLURM starts one task per node)."""
    folder = tmp_path_factory.mktemp("stub bin")
    scripts = {
        "accelerate": '#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGS_DIR/accelerate-$$.txt"\n',
        "scontrol": '#!/bin/sh\n[ "$1 $2" = "show hostnames" ] || exit 9\nprintf "%s\\n" head-node other-node\n',
        "srun": ('#!/bin/sh\nnodes=1\nwhile [ "$#" -gt 0 ]; do case "$1" in --nodes=*) nodes=${1#--nodes=}; shift ;;'
                 ' --*) shift ;; *) break ;; esac; done\nprintf "%s\\n" "$@" > "$ARGS_DIR/srun.txt"\ni=0\n'
                 'while [ "$i" -lt "$nodes" ]; do SLURM_NODEID=$i "$@" & i=$((i + 1)); done\nwait\n'),
    }
    for name, text in scripts.items():
        (folder / name).write_text(text, encoding="utf-8")
        (folder / name).chmod(0o755)
    return folder


def _multi_node_recipe(tmp_path: Path, **kw) -> Path:
    plan = TrainingPlan(**{"model": MODEL, "gpu": "H100 SXM", "num_nodes": 2, "gpus_per_node": 8,
                           "sharding": "zero3", **kw})
    folder = tmp_path / "recipe"
    write_recipe(make_recipe(plan), folder)
    return folder


# ---------------------------------------------------------------------------------------------- the files (fast)


def test_only_several_nodes_get_node_files(tmp_path):
    one = make_recipe(TrainingPlan(model=MODEL, num_gpus=8, sharding="zero3"))
    assert SLURM_FILE not in one.files and "machine_rank" not in one.files[LAUNCH_FILE]
    many = make_recipe(TrainingPlan(model=MODEL, num_nodes=2, gpus_per_node=8, sharding="zero3"))
    assert SLURM_FILE in many.files and many.launch_argv == ["sh", LAUNCH_FILE]
    assert "NODE_RANK" in many.next_step and "sbatch slurm.sbatch" in many.next_step


@pytest.mark.parametrize("sharding", ["ddp", "zero2", "zero3", "zero3_hpz", "fsdp_full_shard", "fsdp_hybrid_shard"])
def test_accelerate_config_for_several_nodes(sharding):
    import yaml

    recipe = make_recipe(TrainingPlan(model=MODEL, num_nodes=4, gpus_per_node=8, sharding=sharding))
    acc = yaml.safe_load(recipe.accelerate_config_yaml)
    assert (acc["num_machines"], acc["num_processes"], acc["machine_rank"]) == (4, 32, 0)
    assert "main_process_ip" in acc and acc["main_process_port"] == 29500 and acc["rdzv_backend"] == "static"
    if sharding.startswith("zero"):
        assert acc["distributed_type"] == "DEEPSPEED"
        assert acc["deepspeed_config"]["deepspeed_multinode_launcher"] == "standard"  # torchrun per node, no pdsh
    if sharding == "zero3_hpz":
        ds = json.loads(recipe.files[DEEPSPEED_FILE])["zero_optimization"]
        assert (ds["stage"], ds["zero_hpz_partition_size"]) == (3, 8)
        assert acc["deepspeed_config"]["deepspeed_config_file"] == DEEPSPEED_FILE and "mixed_precision" not in acc
    else:
        assert DEEPSPEED_FILE not in recipe.files
    if sharding == "fsdp_hybrid_shard":
        assert acc["fsdp_config"]["fsdp_reshard_after_forward"] is True
        assert acc["parallelism_config"] == {"parallelism_config_dp_replicate_size": 4,
                                             "parallelism_config_dp_shard_size": 8}


def test_the_slurm_script_reads_as_one_launcher_per_node(tmp_path):
    folder = _multi_node_recipe(tmp_path, num_nodes=4, gpus_per_node=8)
    text = (folder / SLURM_FILE).read_text(encoding="utf-8")
    assert text.startswith("#!/bin/bash\n")
    directives = dict(line[len("#SBATCH "):].split("=", 1) for line in text.splitlines()
                      if line.startswith("#SBATCH "))
    assert directives["--nodes"] == "4" and directives["--ntasks-per-node"] == "1"
    assert directives["--gpus-per-node"] == "8"
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1' in text
    srun = [line for line in text.splitlines() if line.startswith("srun ")]
    assert len(srun) == 1
    words = shlex.split(srun[0])
    assert words[:3] == ["srun", "--nodes=4", "--ntasks-per-node=1"]
    inner = shlex.split(words[words.index("-c") + 1])  # the command each node's task runs, $SLURM_NODEID unexpanded
    assert inner == ["exec", "sh", LAUNCH_FILE, "$SLURM_NODEID", "$MASTER_ADDR", "$MASTER_PORT", "$@"]
    assert subprocess.run(["bash", "-n", str(folder / SLURM_FILE)]).returncode == 0
    assert subprocess.run(["sh", "-n", str(folder / LAUNCH_FILE)]).returncode == 0


def test_the_slurm_script_starts_launch_sh_on_every_node(tmp_path, stubs):
    """slurm.sbatch run as sbatch would run it (in the folder it was submitted from), with stand-ins for scontrol and
    srun: every node's launcher gets its own machine rank and the allocation's first host."""
    folder = _multi_node_recipe(tmp_path, num_nodes=2, gpus_per_node=4)
    args = tmp_path / "args"
    args.mkdir()
    env = _env(PATH=f"{stubs}{os.pathsep}{os.environ['PATH']}", ARGS_DIR=str(args), SLURM_JOB_NODELIST="node[1-2]",
               SLURM_JOB_ID="4242")
    run = subprocess.run(["bash", SLURM_FILE, "--dataset", "my data.jsonl"], cwd=folder, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    calls = sorted((p.read_text(encoding="utf-8").splitlines() for p in args.glob("accelerate-*.txt")),
                   key=lambda a: a[a.index("--machine_rank") + 1])
    assert len(calls) == 2
    for rank, argv in enumerate(calls):
        assert argv == ["launch", "--config_file", "accelerate_config.yaml", "--machine_rank", str(rank),
                        "--main_process_ip", "head-node", "--main_process_port", str(20000 + 4242 % 20000),
                        "-m", "canifinetune.server.cli", "train", "recipe.yaml", "--dataset", "my data.jsonl"]
    # outside SLURM, or from another folder, it says what to do
    bare = _env(PATH=f"{stubs}{os.pathsep}{os.environ['PATH']}", ARGS_DIR=str(args))
    bare.pop("SLURM_JOB_NODELIST", None)
    outside = subprocess.run(["bash", SLURM_FILE], cwd=folder, env=bare, capture_output=True, text=True, timeout=30)
    assert outside.returncode != 0 and "sbatch" in outside.stderr
    elsewhere = subprocess.run(["bash", str(folder / SLURM_FILE)], cwd=tmp_path, env=env, capture_output=True,
                               text=True, timeout=30)
    assert elsewhere.returncode == 2 and "recipe folder" in elsewhere.stderr


def test_launch_sh_takes_the_node_as_arguments_or_environment(tmp_path, stubs):
    folder = _multi_node_recipe(tmp_path, num_nodes=3, gpus_per_node=8)
    args = tmp_path / "args"
    args.mkdir()
    path = f"{stubs}{os.pathsep}{os.environ['PATH']}"

    def launch(*argv: str, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
        for old in args.iterdir():
            old.unlink()
        base = {k: v for k, v in _env(PATH=path, ARGS_DIR=str(args)).items()
                if k not in ("NODE_RANK", "MASTER_ADDR", "MASTER_PORT")}
        run = subprocess.run(["sh", str(folder / LAUNCH_FILE), *argv], cwd=tmp_path, env={**base, **env},
                             capture_output=True, text=True, timeout=30)
        got = [p.read_text(encoding="utf-8").splitlines() for p in args.iterdir()]
        return run, got[0] if got else []

    def node_flags(argv: list[str]) -> tuple[str, str, str]:
        return tuple(argv[argv.index(flag) + 1] for flag in ("--machine_rank", "--main_process_ip",  # type: ignore
                                                             "--main_process_port"))

    run, argv = launch("2", "10.1.2.3", "1234", "--probe", "3")
    assert run.returncode == 0, run.stderr
    assert node_flags(argv) == ("2", "10.1.2.3", "1234") and argv[-2:] == ["--probe", "3"]
    run, argv = launch("0", "head.cluster", "--dataset", "d.jsonl")
    assert node_flags(argv) == ("0", "head.cluster", "29500") and argv[-2:] == ["--dataset", "d.jsonl"]
    run, argv = launch("--probe", "3", NODE_RANK="1", MASTER_ADDR="10.0.0.1", MASTER_PORT="40000")
    assert node_flags(argv) == ("1", "10.0.0.1", "40000") and argv[-2:] == ["--probe", "3"]
    # an address is only ever one argument: nothing in it reaches a shell
    run, argv = launch("1", "$(touch pwned); x")
    assert node_flags(argv)[1] == "$(touch pwned); x" and not list(tmp_path.rglob("pwned"))
    for argv_, env, words in ((("3", "h"), {}, "0 to 2"), (("x",), {"MASTER_ADDR": "h"}, "NODE_RANK"),
                              (("1",), {}, "MASTER_ADDR"), (("1", "h", "--x"), {"MASTER_PORT": "http"}, "MASTER_PORT")):
        run, got = launch(*argv_, **env)
        assert run.returncode == 2 and words in run.stderr and not got, (argv_, env, run.stderr)


def test_hostile_values_never_reach_the_node_scripts():
    plain = make_recipe(TrainingPlan(model=MODEL, num_nodes=2, gpus_per_node=2, sharding="zero3_hpz"))
    for value in ("$(touch pwned)", "a'b\"c; rm -rf ~", "`id`"):
        hostile = make_recipe(TrainingPlan(model=MODEL, num_nodes=2, gpus_per_node=2, sharding="zero3_hpz",
                                           dataset=value))
        for name in (LAUNCH_FILE, SLURM_FILE, DEEPSPEED_FILE, "accelerate_config.yaml"):
            assert hostile.files[name] == plain.files[name], name


def test_each_machine_is_checked_for_one_node_of_gpus():
    from canifinetune.recipes.runtime import Machine, check_plan_for_machine
    from canifinetune.recipes.schema import RecipeError

    plan = TrainingPlan(model=MODEL, num_nodes=2, gpus_per_node=8, sharding="zero3")
    check_plan_for_machine(plan, Machine(cuda=True, device_count=8, bf16=True, world_size=16))
    with pytest.raises(RecipeError, match="gpus_per_node: the recipe trains on 2 nodes of 8 GPUs"):
        check_plan_for_machine(plan, Machine(cuda=True, device_count=4, bf16=True, world_size=16))
    with pytest.raises(RecipeError, match=r"launch\.sh NODE_RANK MASTER_ADDR on every node"):
        check_plan_for_machine(plan, Machine(cuda=True, device_count=8, bf16=True, world_size=8))
    with pytest.raises(RecipeError, match="on every node"):
        check_plan_for_machine(plan, Machine(cuda=False, world_size=1, cpu_run=True))


# ---------------------------------------------------------------------------------------------- run for real (slow)

TRANSIENT_LAUNCH = re.compile(r"EADDRINUSE|Address already in use|connectFullMesh|Connection refused|"
                              r"Connection reset by peer|DistNetworkError|RendezvousConnectionError")
# What a failed launch's output is read for first (the tail alone can hide an abort's cause behind torchrun's report)
FAILURE_LINES = re.compile(r"terminate called|what\(\)|Abort|SIGABRT|exitcode|Error|Exception|Traceback")
TRAINED_LINE = "canifinetune: trained "


def _failure_summary(rank: int, output: str) -> str:
    """Node ``rank``'s failed launch: the lines that name the failure, then the output's tail."""
    lines = [line.strip() for line in output.splitlines() if FAILURE_LINES.search(line)]
    return f"node {rank}: " + " | ".join(lines[:30]) + "\n--- tail ---\n" + output[-2500:]


def _aborted_after_training(runs: list[subprocess.CompletedProcess], per_node: int) -> bool:
    """Every process of both nodes finished its training and reported it, and a process then died of SIGABRT on
    its way out: gloo's teardown race on the CPU (recipes/train.py end_process_group; one CI run of the 4-process
    hybrid-shard launch, not reproduced in 35 launches here)."""
    finished = all(run.stdout.count(TRAINED_LINE) == per_node for run in runs)
    return finished and any("SIGABRT" in run.stdout for run in runs if run.returncode)


def test_only_an_abort_after_every_process_trained_is_retried():
    """The retry never hides a launch that failed while training: a node short of its processes' trained lines, or
    a failure that is not an abort, is reported at once."""
    def run(code: int, text: str) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess([], code, text, "")

    trained = TRAINED_LINE + "2 steps\n"
    aborted = "traceback : Signal 6 (SIGABRT) received by PID 1\n"
    assert _aborted_after_training([run(1, 2 * trained + aborted), run(0, 2 * trained)], per_node=2)
    assert not _aborted_after_training([run(1, trained + aborted), run(0, 2 * trained)], per_node=2)
    assert not _aborted_after_training([run(1, 2 * trained + "exitcode 1\n"), run(0, 2 * trained)], per_node=2)
    assert "terminate called" in _failure_summary(0, "a\nterminate called without an active exception\nb")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("trl")
    from test_runtime import make_tiny_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


def _tiny_recipe(tiny_model: Path, tmp_path: Path, **kw) -> Path:
    from test_runtime import NON_ASCII_ROWS, _write_jsonl

    data = _write_jsonl(tmp_path / "train.jsonl", NON_ASCII_ROWS * 4)  # 16 rows
    plan = TrainingPlan(**{"model": str(tiny_model), "dtype": "fp32", "seq_len": 64, "batch_size": 2, "max_steps": 2,
                           "learning_rate": 1e-3, "num_nodes": 2, "dataset": str(data), **kw})
    folder = tmp_path / "recipe"
    write_recipe(make_recipe(plan), folder)
    return folder


def _two_nodes(start, folder: Path, per_node: int = 1) -> list[subprocess.CompletedProcess]:
    """``start(rank, port)`` -> (argv, extra env) for each node, both started at once; one retry with a new port
    only when the failure is a rendezvous failure (the port taken between our probe and the bind) or an abort after
    every one of the ``per_node`` processes a node runs had trained (:func:`_aborted_after_training`)."""
    for attempt in range(2):
        port = _free_port()
        procs = []
        for rank in (0, 1):
            argv, extra = start(rank, port)
            procs.append(subprocess.Popen(argv, cwd=folder, env=_env(**extra), stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        runs = []
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                for other in procs:
                    other.kill()
                raise
            runs.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, ""))
        failed = [r for r in runs if r.returncode]
        transient = any(TRANSIENT_LAUNCH.search(r.stdout) for r in failed) or _aborted_after_training(runs, per_node)
        if not failed or attempt or not transient:
            return runs
    return runs


def _launch_sh(rank: int, port: int) -> tuple[list[str], dict]:
    """Node 0 gives its rank and the head node as arguments, node 1 in its environment."""
    if rank == 0:
        return ["sh", LAUNCH_FILE, "0", "127.0.0.1", str(port), "--device", "cpu"], {}
    return ["sh", LAUNCH_FILE, "--device", "cpu"], {"NODE_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                                                     "MASTER_PORT": str(port)}


@pytest.mark.slow
@pytest.mark.parametrize("sharding,per_node,engine", [
    ("ddp", 1, None),
    ("zero3", 1, "DeepSpeed ZeRO-3 runs it over 2 processes on 2 nodes"),
    ("zero3_hpz", 2, "ZeRO-3 with ZeRO++ hpZ (zero_hpz_partition_size 2) runs it over 4 processes on 2 nodes"),
    ("fsdp_hybrid_shard", 2, "trains it as data parallelism over 4 processes on 2 nodes"),
])
def test_two_node_recipe_trains_the_same_steps_on_both_nodes(tiny_model, tmp_path, sharding, per_node, engine):
    if sharding.startswith("zero"):
        pytest.importorskip("deepspeed")
    folder = _tiny_recipe(tiny_model, tmp_path, gpus_per_node=per_node, sharding=sharding)
    runs = _two_nodes(_launch_sh, folder, per_node)
    for rank, run in enumerate(runs):
        assert run.returncode == 0, _failure_summary(rank, run.stdout)
        # every process of the node reports its two steps
        assert run.stdout.count("canifinetune: trained 2 steps on 16 samples") == per_node, run.stdout[-4000:]
        if engine:
            assert engine in run.stdout, run.stdout[-4000:]
    logged = [LOSS_LINE.findall(run.stdout) for run in runs]
    assert len(logged[0]) == 2 and logged[0] == logged[1], logged  # the same two steps, seen from both nodes
    for line in logged[0]:
        loss = float(re.search(r"'loss': '?([-+0-9.eE]+|nan|inf)'?", line).group(1))  # type: ignore[union-attr]
        assert math.isfinite(loss) and loss > 0, line
    # batch 2 x 2 steps x 2 (or 4) processes = 8 (or 16) of 16 samples: the data was split over every process
    assert f"'epoch': '{0.5 * per_node:g}'" in logged[0][-1], logged[0][-1]


ENGINES_SCRIPT = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import torch, torch.distributed as dist
sys.path.insert(0, sys.argv[2])
from torch.distributed.device_mesh import init_device_mesh
from fsdp_fake import shard_like_accelerate
from canifinetune.recipes import model_setup
from canifinetune.recipes.runtime import model_source
from canifinetune.recipes.schema import load_recipe
dist.init_process_group("gloo")
rank = dist.get_rank()
plan = load_recipe(sys.argv[1]).plan
config, source = model_source(plan)
nodes, per_node = plan.num_nodes, plan.node_gpus
out = {"rank": rank}
# FSDP2 HYBRID_SHARD: the (nodes, GPUs of a node) mesh accelerate's ParallelismConfig builds, sharded as accelerate does
hybrid = plan.replace(sharding="fsdp_hybrid_shard")
torch.manual_seed(0)
model = model_setup.build_model(hybrid, config, pretrained_path=source)
out["params"] = sum(p.numel() for p in model.parameters())
mesh = init_device_mesh("cpu", (nodes, per_node), mesh_dim_names=("dp_replicate", "dp_shard"))
shard_like_accelerate(model, hybrid, mesh)
opt = model_setup.build_optimizer(hybrid, model)
ids = torch.randint(0, int(config["vocab_size"]), (2, 32), generator=torch.Generator().manual_seed(rank % per_node))
losses = []
for _ in range(2):
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.item())
out["hsdp_local"] = sum(p.to_local().numel() for p in model.parameters())
out["hsdp_losses"] = losses
del model, opt
# DeepSpeed ZeRO-3 with ZeRO++ hpZ, as the recipe's ds_config.json sets it (every parameter partitioned: no
# persistence threshold, so the tiny model's tensors count like a large model's)
import deepspeed
from transformers import AutoModelForCausalLM
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
ds = json.load(open(sys.argv[4], encoding="utf-8"))
ds.update({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
           "zero_allow_untested_optimizer": True, "bf16": {"enabled": False}, "fp16": {"enabled": False}})
del ds["train_batch_size"]
ds["zero_optimization"]["stage3_param_persistence_threshold"] = 0
engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), config=ds)
params = list(engine.module.parameters())
ids = torch.randint(0, int(config["vocab_size"]), (2, 32), generator=torch.Generator().manual_seed(1))
losses = []
for _ in range(2):
    loss = engine(input_ids=ids, labels=ids, use_cache=False).loss
    engine.backward(loss)
    # after backward, before the step drops them: every parameter's secondary partition inside the node
    out["zero_secondary"] = sum(p.ds_secondary_tensor.numel() for p in params
                                if getattr(p, "ds_secondary_tensor", None) is not None)
    engine.step()
    losses.append(loss.item())
out["zero_primary"] = sum(p.ds_tensor.numel() for p in params)
out["zero_params"] = sum(p.ds_numel for p in params)
out["zero_tensors"] = len(params)
out["zero_losses"] = losses
dist.barrier()
dist.destroy_process_group()
with open(sys.argv[3] + f"/rank{rank}.json", "w", encoding="utf-8") as handle:
    json.dump(out, handle)
"""


@pytest.mark.slow
def test_hybrid_engines_on_two_nodes_hold_what_the_estimate_says(tiny_model, tmp_path):
    """FSDP2 HYBRID_SHARD and ZeRO++ hpZ across 2 loopback nodes of 2 ranks (torchrun --nnodes 2 per node, gloo)."""
    pytest.importorskip("deepspeed")
    from canifinetune.estimator.model_sources import resolve_model
    from canifinetune.estimator.resolved import resolve
    from canifinetune.estimator.sharding import shares

    folder = _tiny_recipe(tiny_model, tmp_path, method="full", gpus_per_node=2, sharding="zero3_hpz")
    script = tmp_path / "engines.py"
    script.write_text(ENGINES_SCRIPT, encoding="utf-8")

    def start(rank: int, port: int) -> tuple[list[str], dict]:
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(rank),
                "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(port), str(script),
                str(folder / "recipe.yaml"), str(ROOT / "benchmarks" / "validation"), str(tmp_path),
                str(folder / DEEPSPEED_FILE)], {}

    runs = _two_nodes(start, folder)
    for rank, run in enumerate(runs):
        assert run.returncode == 0, _failure_summary(rank, run.stdout)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(4)]
    total = results[0]["params"]
    for res in results:
        # HYBRID_SHARD: one node's GPUs share the model (P / 2 each, up to FSDP's padding of each tensor to 2 rows)
        assert abs(res["hsdp_local"] - total / 2) <= 64, res
        # ZeRO++ hpZ: the primary partition over all 4 ranks, the secondary over the node's 2 (DeepSpeed pads each
        # tensor to a multiple of the partition count)
        p, tensors = res["zero_params"], res["zero_tensors"]
        assert abs(res["zero_primary"] - p / 4) <= 4 * tensors and abs(res["zero_secondary"] - p / 2) <= 2 * tensors
        assert res["zero_losses"] == results[0]["zero_losses"]  # one model, the same batch on every rank
    # replicas in the two nodes (same place in their node, the same batch) stay one model: the same losses
    assert results[0]["hsdp_losses"] == results[2]["hsdp_losses"] and results[1]["hsdp_losses"] == results[3][
        "hsdp_losses"]
    # the estimate's weights per GPU for this plan: a.P/n + a.P/K (fp32 here), within its 512-byte rounding per tensor
    plan = TrainingPlan(model=str(tiny_model), method="full", dtype="fp32", num_nodes=2, gpus_per_node=2,
                        sharding="zero3_hpz")
    estimated = shares(resolve(plan, resolve_model(plan.model).spec)).weights
    measured = 4 * (results[0]["zero_primary"] + results[0]["zero_secondary"])
    assert abs(estimated - measured) <= 512 * results[0]["zero_tensors"], (estimated, measured)
    hybrid = shares(resolve(plan.replace(sharding="fsdp_hybrid_shard"), resolve_model(plan.model).spec)).weights
    assert abs(hybrid - 4 * results[0]["hsdp_local"]) <= 512 * results[0]["zero_tensors"], (hybrid,
                                                                                            results[0]["hsdp_local"])
