"""make_recipe: a plan in, the files that train exactly that plan out.

Nothing here imports torch (a test checks ``sys.modules``). Plan values never reach a shell command or a path:
the launch commands name only fixed file names, every argument is quoted with ``shlex``, YAML is written with
``dump_yaml`` (yaml.safe_dump's text) and files are written only inside the chosen folder under fixed names.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import shutil
import stat
import tempfile
from pathlib import Path

from pydantic import BaseModel, Field

from canifinetune.estimator.estimate import Estimate, estimate
from canifinetune.estimator.plan import TrainingPlan, zero_stage

from .examples import EXAMPLE_DATA_FILE, REWARD_FILE, REWARD_PY, example_jsonl
from .schema import (
    RECIPE_FILE,
    RECIPE_VERSION,
    EstimateSummary,
    RecipeError,
    RecipeFile,
    dump_recipe,
    dump_yaml,
    output_dir_problem,
)

ACCELERATE_FILE = "accelerate_config.yaml"
REQUIREMENTS_FILE = "requirements.txt"
ESTIMATE_FILE = "ESTIMATE.txt"
ESTIMATE_JSON_FILE = "estimate.json"
LAUNCH_FILE = "launch.sh"
SLURM_FILE = "slurm.sbatch"  # several nodes: one launch.sh per node under SLURM
DEEPSPEED_FILE = "ds_config.json"  # zero3_hpz: ZeRO++'s zero_hpz_partition_size has no accelerate config key
FILE_NAMES = (RECIPE_FILE, ACCELERATE_FILE, REQUIREMENTS_FILE, ESTIMATE_FILE, ESTIMATE_JSON_FILE, LAUNCH_FILE,
              EXAMPLE_DATA_FILE, REWARD_FILE, SLURM_FILE, DEEPSPEED_FILE)
# The head node's port when the launch gives none: torch.distributed's default MASTER_PORT
DEFAULT_MASTER_PORT = 29500

# What the runtime needs (the `train` extra), pinned to the versions the estimate's semantics follow; the line that
# installs this project comes first (project_requirement).
BASE_REQUIREMENTS = (
    "torch>=2.4",
    "transformers>=5.0",
    "peft>=0.17",
    "trl>=1.16",
    "accelerate>=1.0",
    "datasets>=3",
    "pyyaml>=6",
)

_GIB = 1024**3


class Recipe(BaseModel):
    """Everything make_recipe produces. ``files`` maps each file name to its text (what `--out DIR` writes)."""

    plan: TrainingPlan
    recipe_yaml: str = Field(description="recipe.yaml: the plan and the estimate it was made from")
    launch_command: str = Field(description="the shell command that trains the recipe, run from the recipe folder")
    launch_argv: list[str] = Field(description="the same command as an argument list (no shell)")
    accelerate_config_yaml: str | None = Field(description="accelerate config for several GPUs (DDP, FSDP, DeepSpeed)")
    requirements_txt: str
    estimate_summary: str = Field(description="a short text giving the estimate the recipe was made from")
    framework_note: str | None = Field(
        None, description="for a plan made for another framework: how the TRL recipe carries its memory-relevant "
                          "settings")
    next_step: str = Field(description="the first command to run in the recipe's folder (one `canifinetune train` "
                                       "accepts for this trainer and GPU count) and what it checks")
    files: dict[str, str]
    estimate: Estimate


# ---------------------------------------------------------------------------------------------- pieces


def launch_argv(plan: TrainingPlan) -> list[str]:
    """The launch command as argv. It names only fixed file names: no plan value is ever in it.

    Several nodes: ``sh launch.sh``, run on every node with NODE_RANK and MASTER_ADDR (and MASTER_PORT) in its
    environment; launch.sh passes them to accelerate launch (:func:`node_launch_script`)."""
    if plan.num_gpus == 1:
        return ["canifinetune", "train", RECIPE_FILE]
    if plan.num_nodes > 1:
        return ["sh", LAUNCH_FILE]
    return accelerate_argv()


def accelerate_argv() -> list[str]:
    """accelerate launch with the recipe's config: one process per GPU of this machine (torchrun)."""
    return ["accelerate", "launch", "--config_file", ACCELERATE_FILE,
            "-m", "canifinetune.server.cli", "train", RECIPE_FILE]


PROBE_STEPS = 3


def next_command(plan: TrainingPlan) -> list[str]:
    """The first command to run in the recipe's folder, as argv: one that `canifinetune train` accepts for the plan's
    trainer and GPU count (recipes/train.py, recipes/runtime.py ``check_plan_for_machine``).

    ``--probe`` measures SFT steps only (train refuses it for another trainer), and a multi-GPU recipe runs only under
    its accelerate launch command (one process per GPU), which launch.sh holds and passes extra arguments to:

    * sft, one GPU: ``canifinetune train recipe.yaml --probe 3``
    * sft, several GPUs: ``sh launch.sh --probe 3``
    * another trainer: the recipe's own run, ``canifinetune train recipe.yaml`` (one GPU) or ``sh launch.sh``
      (several), after setting ``max_steps: 3`` (``next_step`` says so)."""
    probe = ["--probe", str(PROBE_STEPS)] if plan.trainer == "sft" else []
    if plan.num_gpus > 1:
        return ["sh", LAUNCH_FILE, *probe]
    return ["canifinetune", "train", RECIPE_FILE, *probe]


def next_step(plan: TrainingPlan) -> str:
    """``next_command`` with what it checks: the one next step the recipe's summary, the CLI and make_recipe print."""
    command = shlex.join(next_command(plan))
    if plan.num_nodes > 1:
        command += (f" on every node, with NODE_RANK (0 on the head node, to {plan.num_nodes - 1}) and MASTER_ADDR "
                    f"(the head node's address) set, or sbatch {SLURM_FILE}"
                    + (f" --probe {PROBE_STEPS}" if plan.trainer == "sft" else ""))
    if plan.trainer == "sft":
        return f"{command}   (measures {PROBE_STEPS} steps on your GPU and prints the peaks beside the estimate)"
    return (f"set max_steps: {PROBE_STEPS} in {RECIPE_FILE}, then {command}   (watch nvidia-smi against the estimate; "
            "--probe measures SFT steps only)")


def accelerate_config(plan: TrainingPlan) -> dict | None:
    """The accelerate config (as a dict) for a multi-GPU plan; None for one GPU."""
    if plan.num_gpus == 1:
        return None
    mixed = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[plan.dtype]
    # several nodes: one config for every node; launch.sh gives each its --machine_rank and the head node's
    # --main_process_ip / --main_process_port (null here: there is no address to guess). num_processes counts all nodes
    nodes: dict = ({"main_process_ip": None, "main_process_port": DEFAULT_MASTER_PORT} if plan.num_nodes > 1 else {})
    config: dict = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "machine_rank": 0,
        "num_machines": plan.num_nodes,
        **nodes,
        "num_processes": plan.num_gpus,
        "gpu_ids": "all",
        "main_training_function": "main",
        "mixed_precision": mixed,
        "downcast_bf16": "no",
        "rdzv_backend": "static",
        "same_network": True,
        "tpu_env": [],
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
        "use_cpu": False,
    }
    if plan.sharding == "ddp":
        config["distributed_type"] = "MULTI_GPU"
    elif plan.sharding.startswith("fsdp"):
        config["distributed_type"] = "FSDP"
        config["fsdp_config"] = {
            "fsdp_version": 2,
            # FSDP2: reshard after forward = FULL_SHARD (and HYBRID_SHARD); keep gathered until backward = SHARD_GRAD_OP
            "fsdp_reshard_after_forward": plan.sharding in ("fsdp_full_shard", "fsdp_hybrid_shard"),
            # FSDP offloads parameters, gradients and the optimizer step together
            "fsdp_offload_params": bool(plan.offload_params),
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
            # gradient checkpointing comes from the recipe (TrainingArguments), as the estimate assumes
            "fsdp_activation_checkpointing": False,
        }
        if plan.sharding == "fsdp_hybrid_shard":
            # HYBRID_SHARD in FSDP2: a 2-D mesh, replicated over the nodes and sharded over each node's GPUs
            # (accelerate 1.15 ParallelismConfig: dp_replicate_size x dp_shard_size = num_processes)
            config["parallelism_config"] = {"parallelism_config_dp_replicate_size": plan.num_nodes,
                                            "parallelism_config_dp_shard_size": plan.node_gpus}
    else:  # zero1 / zero2 / zero3 / zero3_hpz
        stage = zero_stage(plan.sharding)
        if stage is None:  # every sharding is DDP, FSDP or ZeRO: a new one must be rendered, not guessed
            raise RecipeError(f"sharding: {plan.sharding!r} has no accelerate config here; use ddp, zero1, zero2, "
                              "zero3, zero3_hpz or an fsdp_* sharding")
        ds: dict
        if plan.sharding == "zero3_hpz":
            # ZeRO++'s hpZ has no accelerate key: the DeepSpeed JSON carries the stage, hpZ and offload, and accelerate
            # takes nothing else it would override (its mixed_precision stays unset: bf16/fp16 come from the JSON)
            ds = {"deepspeed_config_file": DEEPSPEED_FILE}
            del config["mixed_precision"]
        else:
            ds = {
                "zero_stage": stage,
                "offload_optimizer_device": "cpu" if plan.offload_optimizer else "none",
                "offload_param_device": "cpu" if plan.offload_params else "none",
                "gradient_accumulation_steps": plan.gradient_accumulation_steps,
                "gradient_clipping": 1.0,
            }
        ds["zero3_init_flag"] = stage == 3 and not plan.uses_adapters
        if stage == 3 and plan.sharding != "zero3_hpz":
            ds["zero3_save_16bit_model"] = True
        if plan.num_nodes > 1:
            ds["deepspeed_multinode_launcher"] = "standard"  # torchrun on every node (not pdsh over ssh)
        config["distributed_type"] = "DEEPSPEED"
        config["deepspeed_config"] = ds
    return config


def deepspeed_config(plan: TrainingPlan) -> dict | None:
    """The DeepSpeed JSON for zero3_hpz (None otherwise): ZeRO-3 with ``zero_hpz_partition_size`` = the GPUs of a
    node (DeepSpeed's ZeRO++ tutorial), the plan's offload, and "auto" for what transformers' Trainer fills from the
    recipe (micro-batch, accumulation, clipping 1.0, bf16/fp16). Bucket sizes stay DeepSpeed's defaults, as the
    estimate assumes (estimator/sharding.py)."""
    if plan.sharding != "zero3_hpz":
        return None
    return {
        "zero_optimization": {
            "stage": 3,
            "zero_hpz_partition_size": plan.node_gpus,
            "offload_optimizer": {"device": "cpu" if plan.offload_optimizer else "none"},
            "offload_param": {"device": "cpu" if plan.offload_params else "none"},
            "stage3_gather_16bit_weights_on_model_save": True,
        },
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
    }


PROJECT = "canifinetune"
# The name on PyPI belongs to an unrelated project (0.4.1, no `train` extra): a bare `canifinetune[train]` would
# install that one. The recipe names this project by where it was installed from, or pins its own version.
CHECKOUT_NOTE = ("# canifinetune is installed from its checkout (the PyPI name belongs to another project): "
                 'pip install -e "/path/to/canifinetune[train]"')


def _token(value) -> str | None:
    """``value`` when it is one printable token (nothing that could end the line or the requirement), else None."""
    if isinstance(value, str) and value and all(c.isprintable() and not c.isspace() and c not in "#&" for c in value):
        return value
    return None


def _direct_reference(text: str | None) -> str | None:
    """The PEP 440 direct reference of a PEP 610 ``direct_url.json`` (a local folder, an archive or a VCS checkout),
    or None when there is none or it cannot be written as one line."""
    try:
        info = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(info, dict):
        return None
    url = _token(info.get("url"))
    if url is None:
        return None
    vcs = info.get("vcs_info")
    if isinstance(vcs, dict):
        kind, commit = _token(vcs.get("vcs")), _token(vcs.get("commit_id"))
        if kind is None or commit is None or not (kind.isalnum() and commit.isalnum()):
            return None
        url = f"{kind}+{url}@{commit}"
    elif not isinstance(info.get("dir_info"), dict) and not isinstance(info.get("archive_info"), dict):
        return None
    if "subdirectory" in info:
        sub = _token(info["subdirectory"])
        if sub is None:
            return None
        url += f"#subdirectory={sub}"
    return url


def project_requirement() -> list[str]:
    """The requirements.txt line(s) that install this project with its `train` extra: a direct reference to where the
    installed distribution came from (PEP 610 ``direct_url.json``: a local folder, an archive or a VCS commit), else
    its own version pinned, after a comment saying to install it from its checkout. Never a bare ``canifinetune``."""
    from importlib import metadata

    try:
        dist = metadata.distribution(PROJECT)
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return [CHECKOUT_NOTE]
    url = _direct_reference(dist.read_text("direct_url.json"))
    if url is not None:
        return [f"{PROJECT}[train] @ {url}"]
    return [CHECKOUT_NOTE, f"{PROJECT}[train]=={dist.version}"]


@functools.cache
def installed_project_requirement() -> tuple[str, ...]:
    """project_requirement() read once per process: the installed distribution does not change under a running
    server, and reading its metadata files was a fifth of make_recipe's time."""
    return tuple(project_requirement())


def requirements(plan: TrainingPlan) -> list[str]:
    reqs = [*installed_project_requirement(), *BASE_REQUIREMENTS]
    bnb_optim = plan.optim in ("adamw_bnb_8bit", "paged_adamw_8bit", "paged_adamw_32bit")
    if plan.quantized_4bit or plan.load_in_8bit or bnb_optim:
        reqs.append("bitsandbytes>=0.45")
    if plan.attn_implementation == "flash_attention_2":
        reqs.append("flash-attn>=2.6  # build needs CUDA; see https://github.com/Dao-AILab/flash-attention")
    if plan.sharding.startswith("zero"):
        reqs.append("deepspeed>=0.15")
    if plan.trainer == "grpo" and plan.use_vllm:
        reqs.append("vllm  # the version TRL 1.16 supports: see TRL's vLLM integration docs")
    if plan.image_size is not None:
        reqs.append("pillow>=10")
        reqs.append("torchvision  # the build matching your torch: Qwen-VL processors need it (LLaVA's do not)")
    reqs.append("nvidia-ml-py>=12  # optional: lets --probe read per-process GPU memory")
    return reqs


def _gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / _GIB:.2f} GiB"


def summary_text(plan: TrainingPlan, est: Estimate, argv: list[str]) -> str:
    """A short text giving the estimate the recipe was made from. Plan values appear only as repr()s."""
    from .trainers import TRAINER_TITLES, reference_of

    lines = [
        "canifinetune estimate for this recipe (per GPU"
        + (f", {plan.gpus_words()}" if plan.num_gpus > 1 else "") + ")",
        f"trainer:          {TRAINER_TITLES[plan.trainer]}"
        + (f", reference model: {reference_of(plan)}" if plan.trainer in ("dpo", "kto", "grpo") else ""),
        f"model:            {est.model!r} ({est.model_source}); {est.params_total:,} parameters, "
        f"{est.params_trainable:,} trainable",
        f"method:           {plan.method}, {plan.dtype} ({plan.precision}), seq_len {plan.seq_len}, micro-batch "
        f"{plan.batch_size} x {plan.gradient_accumulation_steps} accumulation, checkpointing "
        f"{'on' if plan.gradient_checkpointing else 'off'}, optim {plan.optim}, learning rate "
        f"{plan.effective_learning_rate:g}" + (f" (by method: {plan.method})" if plan.learning_rate is None else ""),
        f"peak allocated:   {_gib(est.peak_allocated_bytes)} (torch.cuda.max_memory_allocated, {est.peak_phase} phase)",
        f"peak reserved:    {_gib(est.peak_reserved_bytes)} (torch.cuda.max_memory_reserved)",
        f"process total:    {_gib(est.total_bytes)} (reserved + CUDA context, as nvidia-smi shows it)",
        f"with margin:      {_gib(est.budget_bytes)}",
        f"GPU:              {est.gpu.name if est.gpu else 'none given'}"
        + (f", {_gib(est.gpu_usable_bytes)} usable" if est.gpu_usable_bytes else ""),
        f"verdict:          {est.verdict}: {est.verdict_reason}",
        f"calibration:      {est.calibration_version}",
        "",
        *_run_lines(plan, argv),
        "check it first:          " + next_step(plan),
    ]
    if plan.dataset is None:
        lines.append("dataset:                none in the plan: add --dataset FILE.jsonl (or a dataset folder) to the "
                     "train command")
    elif plan.trainer != "sft" and plan.dataset == EXAMPLE_DATA_FILE:
        lines.append(f"dataset:                {EXAMPLE_DATA_FILE}, a tiny example of the rows {plan.trainer} reads "
                     "(replace it: --dataset FILE.jsonl, or plan.dataset)")
    if plan.trainer == "grpo":
        lines.append(f"reward:                 {REWARD_FILE} (an example length-and-format reward: edit it for your "
                     "task)")
    for warning in est.warnings:
        lines.append(f"warning: {warning}")
    return "\n".join(lines) + "\n"


def _run_lines(plan: TrainingPlan, argv: list[str]) -> list[str]:
    if plan.num_nodes == 1:
        return ["run (from this folder):  " + shlex.join(argv)]
    return [f"run on every node:       NODE_RANK=<0 to {plan.num_nodes - 1}> MASTER_ADDR=<head node address> "
            + shlex.join(argv) + f"   (or, under SLURM: sbatch {SLURM_FILE})",
            f"nodes:                   {plan.num_nodes} of {plan.node_gpus} GPUs; the folder must be on every node "
            "(a shared file system)"]


def launch_script(argv: list[str], trainer: str = "sft") -> str:
    examples = "--dataset FILE, --probe 3" if trainer == "sft" else "--dataset FILE"  # --probe measures SFT only
    return (
        "#!/bin/sh\n"
        f"# Trains this recipe from its own folder; extra arguments (e.g. {examples}) pass through.\n"
        "set -eu\n"
        'cd "$(dirname "$0")"\n'
        f'exec {shlex.join(argv)} "$@"\n'
    )


def node_launch_script(plan: TrainingPlan) -> str:
    """launch.sh for several nodes: run on every node with its machine rank and the head node's address (arguments or
    NODE_RANK / MASTER_ADDR / MASTER_PORT), it starts accelerate launch there (torchrun: gpus_per_node processes, a
    static rendezvous at MASTER_ADDR:MASTER_PORT). Only fixed names and the plan's node counts are in it."""
    nodes, per_node = plan.num_nodes, plan.node_gpus
    last = nodes - 1
    others = "1" if last == 1 else f"1 to {last}"
    examples = "--dataset FILE, --probe 3" if plan.trainer == "sft" else "--dataset FILE"
    argv = accelerate_argv()
    launch = (shlex.join(argv[:4]) + ' --machine_rank "$NODE_RANK" --main_process_ip "$MASTER_ADDR" '
              '--main_process_port "$MASTER_PORT" ' + shlex.join(argv[4:]) + ' "$@"')
    usage = "sh launch.sh NODE_RANK MASTER_ADDR [MASTER_PORT] [train arguments]"
    return (
        "#!/bin/sh\n"
        f"# Trains this recipe on {nodes} nodes of {per_node} GPUs ({plan.num_gpus} processes).\n"
        "# Run it on every node, at about the same time, with the node's own rank and the same head node,\n"
        "# as arguments or in the environment:\n"
        f"#   {usage}\n"
        f"#   NODE_RANK=1 MASTER_ADDR=head-node MASTER_PORT={DEFAULT_MASTER_PORT} sh launch.sh [train arguments]\n"
        f"# NODE_RANK: 0 on the head node, {others} on the others. MASTER_ADDR: the head node's address,\n"
        f"# which every node reaches. MASTER_PORT: a free TCP port on the head node (default {DEFAULT_MASTER_PORT}).\n"
        f"# accelerate launch starts {per_node} processes here (torchrun, static rendezvous at\n"
        "# MASTER_ADDR:MASTER_PORT) and waits for every node. Under SLURM, sbatch slurm.sbatch runs this once per\n"
        f"# node. Extra arguments (e.g. {examples}) pass through to canifinetune train.\n"
        "set -eu\n"
        'cd "$(dirname "$0")"\n'
        'case "${1:-}" in\n'
        "  ''|*[!0-9]*) ;;\n"
        '  *) NODE_RANK=$1; shift\n'
        "     case \"${1:-}\" in ''|-*) ;; *) MASTER_ADDR=$1; shift ;; esac\n"
        "     case \"${1:-}\" in ''|*[!0-9]*) ;; *) MASTER_PORT=$1; shift ;; esac ;;\n"
        "esac\n"
        "NODE_RANK=${NODE_RANK:-}\n"
        "MASTER_ADDR=${MASTER_ADDR:-}\n"
        f"MASTER_PORT=${{MASTER_PORT:-{DEFAULT_MASTER_PORT}}}\n"
        'case "$NODE_RANK" in\n'
        f"  ''|*[!0-9]*) echo 'launch.sh: NODE_RANK must be a node rank (0 to {last}): {usage}' >&2; exit 2 ;;\n"
        "esac\n"
        f'if [ "${{#NODE_RANK}}" -gt 6 ] || [ "$NODE_RANK" -gt {last} ]; then\n'
        f"  echo 'launch.sh: NODE_RANK must be 0 to {last} (the recipe trains on {nodes} nodes)' >&2; exit 2\n"
        "fi\n"
        'if [ -z "$MASTER_ADDR" ]; then\n'
        f"  echo 'launch.sh: give MASTER_ADDR, the head node address: {usage}' >&2; exit 2\n"
        "fi\n"
        'case "$MASTER_PORT" in\n'
        "  ''|*[!0-9]*) echo 'launch.sh: MASTER_PORT must be a TCP port number' >&2; exit 2 ;;\n"
        "esac\n"
        f"exec {launch}\n"
    )


def slurm_script(plan: TrainingPlan) -> str:
    """slurm.sbatch for several nodes: one task per node (srun), each running launch.sh with its machine rank
    ($SLURM_NODEID) and the head node (the allocation's first host, from scontrol). Fixed names and counts only."""
    nodes, per_node = plan.num_nodes, plan.node_gpus
    return (
        "#!/bin/bash\n"
        "#SBATCH --job-name=canifinetune\n"
        f"#SBATCH --nodes={nodes}\n"
        "#SBATCH --ntasks-per-node=1\n"
        f"#SBATCH --gpus-per-node={per_node}\n"
        "#SBATCH --output=slurm-%j.out\n"
        f"# Trains this recipe on {nodes} nodes of {per_node} GPUs. Submit it from the recipe's folder, on a file\n"
        "# system every node sees:   cd my-run && sbatch slurm.sbatch [train arguments]\n"
        "# srun starts one task per node; each runs launch.sh with its machine rank ($SLURM_NODEID) and the head\n"
        "# node (the first host of the allocation), and launch.sh starts accelerate launch with\n"
        f"# {per_node} processes there. Add your cluster's own lines above (#SBATCH --partition, --account, --time,\n"
        f"# --cpus-per-task, --mem; or --gres=gpu:{per_node} where --gpus-per-node is not available).\n"
        "set -eu\n"
        f"if [ ! -f {LAUNCH_FILE} ] || [ ! -f {RECIPE_FILE} ]; then\n"
        "  echo 'slurm.sbatch: submit it from the recipe folder (cd to it, then sbatch slurm.sbatch)' >&2; exit 2\n"
        "fi\n"
        ': "${SLURM_JOB_NODELIST:?run it with sbatch, which sets SLURM_JOB_NODELIST}"\n'
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
        "# a port of its own for each job, so two jobs sharing a head node do not collide\n"
        "MASTER_PORT=${MASTER_PORT:-$((20000 + ${SLURM_JOB_ID:-0} % 20000))}\n"
        "export MASTER_ADDR MASTER_PORT\n"
        f"srun --nodes={nodes} --ntasks-per-node=1 sh -c "
        "'exec sh launch.sh \"$SLURM_NODEID\" \"$MASTER_ADDR\" \"$MASTER_PORT\" \"$@\"' launch.sh \"$@\"\n"
    )


def trl_equivalent(plan: TrainingPlan) -> tuple[TrainingPlan, str | None]:
    """The plan the TRL recipe trains for a plan made for another framework, and a note saying what it carried.

    The recipe always runs TRL (the plan's trainer); the other stack's memory-relevant defaults (loss, kbit preparation,
    adapter dtype, LLaMA-Factory's fp32 full fine-tuning) become explicit plan fields, so the recipe trains, and
    estimates, what the user's framework would. Everything else in the plan is the same field by field."""
    if plan.framework == "trl":
        return plan, None
    own = plan.stack.own_command(plan.method)
    if own is not None:
        # LitGPT's and torchtune's model code and loss have no TRL fields (estimator/stacks.py own_step)
        raise RecipeError(
            f"framework: canifinetune writes TRL recipes, and {plan.stack.title}'s own step ({plan.stack.own_step}) "
            f"cannot be carried into one; run `{own}` with the estimated settings, or make the plan with framework "
            "'trl' for a TRL recipe (estimate it again: its memory differs)")
    changes: dict = {"framework": "trl", "loss_implementation": plan.effective_loss_implementation}
    if plan.quantized_4bit or plan.load_in_8bit:
        changes["prepare_model_for_kbit_training"] = plan.effective_kbit_preparation
    if plan.uses_adapters:
        stack = plan.stack
        quantized = plan.quantized_4bit or plan.load_in_8bit
        default = stack.adapter_dtype_quantized if quantized else stack.adapter_dtype_unquantized
        changes["adapter_dtype"] = plan.adapter_dtype or default or "fp32"
    if plan.method == "full" and plan.stack.full_weight_dtype == "fp32" and plan.dtype != "fp32":
        changes["precision"] = "mixed"
    carried = ", ".join(f"{k}={v}" for k, v in changes.items() if k != "framework")
    from .trainers import TRAINER_TITLES

    note = (f"The plan was made for {plan.stack.title}; this recipe trains it with {TRAINER_TITLES[plan.trainer]} and "
            f"carries the stack's memory-relevant settings as explicit fields ({carried}), so it trains what was "
            "estimated. Every other field is the plan's own.")
    return plan.replace(**changes), note


# ---------------------------------------------------------------------------------------------- public


def make_recipe(plan: TrainingPlan, est: Estimate | None = None) -> Recipe:
    """The recipe for ``plan``: recipe.yaml, the launch command, accelerate config, requirements and the estimate."""
    if not isinstance(plan, TrainingPlan):
        plan = TrainingPlan.model_validate(plan)
    # a given estimate (a Hub model's) stays: the equivalent plan has the same figures by construction
    plan, framework_note = trl_equivalent(plan)
    problem = output_dir_problem(plan.output_dir)  # the run writes there: it must stay inside the recipe's folder
    if problem is not None:
        raise RecipeError(problem)
    from .trainers import trainer_problems

    problems = trainer_problems(plan)  # what TRL cannot train as the plan says: refused before any file is made
    if problems:
        raise RecipeError("; ".join(problems))
    est = est if est is not None else estimate(plan)
    extra_files: dict[str, str] = {}
    if plan.image_size is not None and plan.dataset is None:
        # the example image rows (recipes/vision_data.py: shapes drawn at the plan's image size when it trains)
        from .vision_data import example_jsonl as example_image_jsonl

        extra_files[EXAMPLE_DATA_FILE] = example_image_jsonl(plan.images_per_sample)
        plan = plan.replace(dataset=EXAMPLE_DATA_FILE)
    elif plan.trainer != "sft" and plan.dataset is None:
        # a tiny example dataset of the trainer's shape, so the recipe runs as made; the plan names it
        extra_files[EXAMPLE_DATA_FILE] = example_jsonl(plan.trainer)
        plan = plan.replace(dataset=EXAMPLE_DATA_FILE)
    if plan.trainer == "grpo":
        extra_files[REWARD_FILE] = REWARD_PY
    recipe_file = RecipeFile(canifinetune_recipe=RECIPE_VERSION, plan=plan, estimate=EstimateSummary.from_estimate(est))
    recipe_yaml = dump_recipe(recipe_file)
    argv = launch_argv(plan)
    acc = accelerate_config(plan)
    acc_yaml = None
    if acc is not None:
        acc_yaml = (
            f"# accelerate config for {plan.gpus_words()}, sharding {plan.sharding} (made by canifinetune)\n"
            + (f"# the same on every node: {LAUNCH_FILE} passes --machine_rank, --main_process_ip and "
               "--main_process_port (NODE_RANK, MASTER_ADDR, MASTER_PORT)\n" if plan.num_nodes > 1 else "")
            + dump_yaml(acc)
        )
    reqs = "\n".join(requirements(plan)) + "\n"
    summary = summary_text(plan, est, argv) + (f"note: {framework_note}\n" if framework_note else "")
    files = {RECIPE_FILE: recipe_yaml}
    if acc_yaml is not None:
        files[ACCELERATE_FILE] = acc_yaml
    files[REQUIREMENTS_FILE] = reqs
    files[ESTIMATE_FILE] = summary
    files[ESTIMATE_JSON_FILE] = est.model_dump_json(indent=2) + "\n"
    files[LAUNCH_FILE] = node_launch_script(plan) if plan.num_nodes > 1 else launch_script(argv, plan.trainer)
    if plan.num_nodes > 1:
        files[SLURM_FILE] = slurm_script(plan)
    ds_json = deepspeed_config(plan)
    if ds_json is not None:
        files[DEEPSPEED_FILE] = json.dumps(ds_json, indent=2) + "\n"
    files.update(extra_files)
    return Recipe(
        plan=plan,
        recipe_yaml=recipe_yaml,
        launch_command=shlex.join(argv),
        launch_argv=argv,
        accelerate_config_yaml=acc_yaml,
        requirements_txt=reqs,
        estimate_summary=summary,
        framework_note=framework_note,
        next_step=next_step(plan),
        files=files,
        estimate=est,
    )


def write_recipe(recipe: Recipe, out_dir: str | Path, *, force: bool = False) -> list[Path]:
    """Write the recipe's files into ``out_dir`` (created if missing) and return their paths.

    Only the fixed file names this module produces are written, and only directly inside ``out_dir``. Nothing
    is written until every target has been checked: an existing file is refused unless ``force`` (and then
    only a plain file is replaced), and a symlink, a hard link (a file with more than one name) or anything
    that is not a plain file is always refused. The files are written into a temporary folder beside them
    and then renamed into place, so the folder ends with all of them or none (a failure puts back what was
    there). Files are UTF-8 with LF line ends on every platform.
    """
    root = _out_folder(out_dir)
    names = list(recipe.files)
    existing = _checked_targets(names, root, force)  # every check before anything is written
    try:
        staging = Path(tempfile.mkdtemp(prefix=".canifinetune-recipe-", dir=root))
    except OSError as exc:
        raise RecipeError(f"--out: cannot write in {root}: {exc.strerror or exc}") from None
    placed: list[str] = []
    backups: dict[str, Path] = {}
    try:
        _stage(recipe, names, staging)
        for name in names:
            target = root / name
            if name in existing:  # --force: move the old file aside (a rename never writes through a link)
                problem = _target_problem(target, force)
                if problem is not None:
                    raise RecipeError(f"--out: refusing to write {str(target)!r}: {problem}")
                backups[name] = staging / ".old" / name
                os.rename(target, backups[name])
                os.rename(staging / name, target)
            else:
                _place_new(staging / name, target)
            placed.append(name)
    except BaseException as exc:
        _put_back(root, placed, backups)
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, RecipeError):
            raise
        if isinstance(exc, OSError):
            raise RecipeError(f"--out: cannot write the recipe into {root}: {exc.strerror or exc}; nothing was "
                              "changed") from None
        raise
    shutil.rmtree(staging, ignore_errors=True)
    return [root / name for name in names]


def _out_folder(out_dir: str | Path) -> Path:
    """``out_dir`` created if missing and resolved; a RecipeError when it cannot be a folder."""
    if not str(out_dir).strip():
        raise RecipeError("--out: must name a folder (use --out . for the current folder); got ''")
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RecipeError(f"--out: cannot create {out}: {exc.strerror or exc}") from None
    if not out.is_dir():
        raise RecipeError(f"--out: {out} is not a folder")
    return out.resolve()


def _checked_targets(names: list[str], root: Path, force: bool) -> set[str]:
    """The names that exist already, once every name is one of the recipe's files and every target may be written."""
    existing: set[str] = set()
    for name in names:
        if name not in FILE_NAMES or name != os.path.basename(name) or name in ("", ".", ".."):
            raise RecipeError(f"recipe: refusing to write {name!r}: not one of the recipe's files")
        problem = _target_problem(root / name, force)
        if problem is not None:
            raise RecipeError(f"--out: refusing to write {str(root / name)!r}: {problem}")
        if os.path.lexists(root / name):
            existing.add(name)
    return existing


def _stage(recipe: Recipe, names: list[str], staging: Path) -> None:
    """Write every file into the staging folder (UTF-8, LF; launch.sh executable), and its .old folder."""
    for name in names:
        staged = staging / name
        with open(staged, "x", encoding="utf-8", newline="\n") as handle:
            handle.write(recipe.files[name])
        if name == LAUNCH_FILE:
            with contextlib.suppress(OSError):  # e.g. some Windows file systems
                staged.chmod(0o755)
    (staging / ".old").mkdir()


def _put_back(root: Path, placed: list[str], backups: dict[str, Path]) -> None:
    """Undo a half-written recipe: remove what was placed and restore what --force moved aside."""
    for name in reversed(placed):  # put back what was there
        with contextlib.suppress(OSError):
            if name in backups:
                os.replace(backups.pop(name), root / name)
            else:
                os.unlink(root / name)
    for name, backup in backups.items():
        if name not in placed:
            with contextlib.suppress(OSError):
                os.replace(backup, root / name)


def _target_problem(target: Path, force: bool) -> str | None:
    """Why ``target`` must not be written (a link, not a plain file, or existing without ``force``), or None."""
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc.strerror or str(exc)
    if stat.S_ISLNK(info.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISREG(info.st_mode):
        return "it exists and is not a plain file"
    if info.st_nlink > 1:
        return "it is a hard link (the same file has another name elsewhere)"
    if not force:
        return "it already exists; pass --force to replace it, or choose another --out folder"
    return None


def _place_new(staged: Path, target: Path) -> None:
    """Move ``staged`` to ``target``, which must not exist: a hard link fails if a file appeared meanwhile."""
    try:
        os.link(staged, target)
    except FileExistsError:
        raise RecipeError(f"--out: refusing to write {str(target)!r}: it appeared while the recipe was "
                          "written") from None
    except OSError:  # a file system without hard links: check, then rename
        if os.path.lexists(target):
            raise RecipeError(f"--out: refusing to write {str(target)!r}: it already exists") from None
        os.rename(staged, target)
        return
    os.unlink(staged)


def recipe_json(recipe: Recipe) -> str:
    """The recipe as JSON (for `canifinetune recipe --json`)."""
    return json.dumps(recipe.model_dump(mode="json"), indent=2, ensure_ascii=False)
