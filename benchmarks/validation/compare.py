"""Run fake-mode measurements for a list of plans, each in its own process, beside their estimates.

    python benchmarks/validation/compare.py CASES.json [--out results.json] [--jobs 2]

CASES.json is a list of TrainingPlan dicts (models from the catalog or local folders). Each case runs
``fake_mode.py`` in a fresh Python process; a case that fails is reported with its error, never dropped.
``compare_many`` (tests/test_accuracy.py) gives the same rows, fake_mode.py's plans measured in forks of a few
processes that each import the libraries once.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAKE_MODE = HERE / "fake_mode.py"
TRAINER_FAKE = HERE / "trainer_fake.py"
VLM_FAKE = HERE / "vlm_fake.py"
LITGPT_FAKE = HERE / "litgpt_fake.py"
LOSS_MODE = {"chunked": "trl_fused", "standard": "model", "litgpt": "model", "torchtune": "model"}
# LitGPT runs in a virtual environment of its own (.ci/stack-venvs.sh makes it)
LITGPT_PYTHON = os.environ.get("CANIFINETUNE_LITGPT_PYTHON",
                               str(HERE.parent.parent / ".venv-litgpt" / "bin" / "python"))
# the Hugging Face projection names a LitGPT LoRA flag adapts (litgpt/lora.py Config: lora_query, ...)
LITGPT_LORA_FLAGS = {"q_proj": "lora_query", "k_proj": "lora_key", "v_proj": "lora_value", "o_proj": "lora_projection",
                     "gate_proj": "lora_mlp", "up_proj": "lora_mlp", "down_proj": "lora_mlp"}


def litgpt_case(plan) -> dict:
    """The litgpt_fake.py case of a ``framework: litgpt`` TrainingPlan: its model, method, shape and LoRA fields, the
    target modules as LitGPT's flags (None: LitGPT's default, query and value)."""
    case = {"model": plan.model, "method": plan.method, "seq_len": plan.seq_len, "batch_size": plan.batch_size,
            "optim": plan.optim, "gradient_accumulation_steps": plan.gradient_accumulation_steps}
    if plan.uses_adapters:
        case.update(lora_r=plan.lora_r, lora_alpha=plan.lora_alpha, lora_dropout=plan.lora_dropout)
        targets = plan.target_modules
        if targets == "all-linear":
            targets = list(LITGPT_LORA_FLAGS)
        if targets is not None:
            flags = dict.fromkeys(LITGPT_LORA_FLAGS.values(), False)
            flags.update({LITGPT_LORA_FLAGS[name]: True for name in targets})
            case.update(flags)
    return case


AXOLOTL_FAKE = HERE / "axolotl_fake.py"
# Axolotl runs in a virtual environment of its own (.ci/stack-venvs.sh makes it)
AXOLOTL_PYTHON = os.environ.get("CANIFINETUNE_AXOLOTL_PYTHON",
                                str(HERE.parent.parent / ".venv-axolotl" / "bin" / "python"))
# what axolotl_fake.py names each attention implementation (Axolotl's flash_attention / sdp_attention / eager_attention)
AXOLOTL_ATTENTION = {"flash_attention_2": "flash_attention", "sdpa": "sdpa", "eager": "eager", None: "sdpa"}


def axolotl_case(plan) -> dict:
    """The axolotl_fake.py case of a ``framework: axolotl`` TrainingPlan: the Axolotl config keys of its model, method,
    shape, checkpointing, packing, attention, optimizer and LoRA fields (target_modules all-linear: Axolotl's
    lora_target_linear; None: the harness's q_proj and v_proj, PEFT's default for the families measured)."""
    case: dict = {"model": plan.model, "method": plan.method, "seq_len": plan.seq_len,
                  "micro_batch_size": plan.batch_size, "gradient_accumulation_steps": plan.gradient_accumulation_steps,
                  "gradient_checkpointing": plan.gradient_checkpointing, "sample_packing": plan.packing,
                  "attention": AXOLOTL_ATTENTION[plan.attn_implementation], "optimizer": plan.optim}
    if plan.uses_adapters:
        case.update(lora_r=plan.lora_r, lora_alpha=plan.lora_alpha, lora_dropout=plan.lora_dropout)
        if plan.target_modules == "all-linear":
            case["lora_target_linear"] = True
        elif plan.target_modules is not None:
            case["lora_target_modules"] = list(plan.target_modules)
    return case


LLAMAFACTORY_FAKE = HERE / "llamafactory_fake.py"
# LLaMA-Factory runs in a virtual environment of its own (.ci/stack-venvs.sh makes it)
LLAMAFACTORY_PYTHON = os.environ.get("CANIFINETUNE_LLAMAFACTORY_PYTHON",
                                     str(HERE.parent.parent / ".venv-llamafactory" / "bin" / "python"))
# LLaMA-Factory's flash_attn argument for each attention implementation (None: its "auto", transformers' default)
LLAMAFACTORY_ATTENTION = {"flash_attention_2": "fa2", "sdpa": "sdpa", "eager": "disabled", None: "auto"}


def llamafactory_case(plan) -> dict:
    """The llamafactory_fake.py case of a ``framework: llama_factory`` TrainingPlan: LLaMA-Factory's argument names
    for its model, method, shape, checkpointing, attention, optimizer and LoRA fields (target_modules all-linear: its
    lora_target "all"; a list: the names joined)."""
    case: dict = {"model": plan.model, "method": plan.method, "cutoff_len": plan.seq_len, "batch_size": plan.batch_size,
                  "gradient_accumulation_steps": plan.gradient_accumulation_steps,
                  "disable_gradient_checkpointing": not plan.gradient_checkpointing,
                  "flash_attn": LLAMAFACTORY_ATTENTION[plan.attn_implementation], "optim": plan.optim}
    if plan.uses_adapters:
        case.update(lora_rank=plan.lora_r, lora_alpha=plan.lora_alpha, lora_dropout=plan.lora_dropout)
        if plan.target_modules == "all-linear":
            case["lora_target"] = "all"
        elif plan.target_modules is not None:
            case["lora_target"] = ",".join(plan.target_modules)
        if plan.quantized_4bit:
            case["llamafactory"] = {"double_quantization": plan.bnb_4bit_use_double_quant}
    return case


# The frameworks measured by their own code, each in its own virtual environment (.ci/stack-venvs.sh): its name, its
# harness, the interpreter, the case of a plan, and the environment it runs with (no network, no telemetry)
TORCHTUNE_FAKE = HERE / "torchtune_fake.py"
# torchtune runs in a virtual environment of its own (.ci/stack-venvs.sh makes it)
TORCHTUNE_PYTHON = os.environ.get("CANIFINETUNE_TORCHTUNE_PYTHON",
                                  str(HERE.parent.parent / ".venv-torchtune" / "bin" / "python"))
# the Hugging Face projection names torchtune's lora_attn_modules use (o_proj is its output_proj)
TORCHTUNE_ATTENTION_NAMES = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "o_proj": "output_proj"}


def torchtune_case(plan) -> dict:
    """The torchtune_fake.py case of a ``framework: torchtune`` TrainingPlan: its model, method, shape, checkpointing,
    optimizer (torch AdamW, fused or not) and LoRA fields (target modules as lora_attn_modules and
    apply_lora_to_mlp; the plan refuses a partial MLP set)."""
    case: dict = {"model": plan.model, "method": plan.method, "seq_len": plan.seq_len, "batch_size": plan.batch_size,
                  "gradient_accumulation_steps": plan.gradient_accumulation_steps,
                  "gradient_checkpointing": plan.gradient_checkpointing,
                  "activation_offloading": plan.activation_offloading,
                  "optimizer": {"_component_": "torch.optim.AdamW", "fused": plan.optim == "adamw_torch_fused",
                                "lr": plan.effective_learning_rate}}
    if plan.method == "full":
        case["optimizer_in_bwd"] = plan.optimizer_in_backward
    if plan.uses_adapters:
        targets = plan.target_modules
        names = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj"] if targets == "all-linear" else list(targets)
        case.update(lora_r=plan.lora_r, lora_alpha=plan.lora_alpha, lora_dropout=plan.lora_dropout,
                    lora_attn_modules=[TORCHTUNE_ATTENTION_NAMES[n] for n in names if n in TORCHTUNE_ATTENTION_NAMES],
                    apply_lora_to_mlp="gate_proj" in names, apply_lora_to_output=False)
    return case


STACK_HARNESSES = {
    "litgpt": ("LitGPT", LITGPT_FAKE, LITGPT_PYTHON, litgpt_case, {}),
    "axolotl": ("Axolotl", AXOLOTL_FAKE, AXOLOTL_PYTHON, axolotl_case,
                {"HF_HUB_OFFLINE": "1", "AXOLOTL_DO_NOT_TRACK": "1", "WANDB_MODE": "disabled"}),
    "llama_factory": ("LLaMA-Factory", LLAMAFACTORY_FAKE, LLAMAFACTORY_PYTHON, llamafactory_case,
                      {"HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}),
    "torchtune": ("torchtune", TORCHTUNE_FAKE, TORCHTUNE_PYTHON, torchtune_case, {}),
}


def measured_by_fake_mode(validated) -> bool:
    """An SFT plan on text, run by this interpreter's stack: fake_mode.py measures it, and can measure several such
    plans in one process (:func:`compare_many`); trainer_fake.py, vlm_fake.py and the frameworks' harnesses measure
    the others."""
    return validated.framework not in STACK_HARNESSES and validated.image_size is None and validated.trainer == "sft"


def write_inputs(validated, folder: Path) -> tuple[Path, Path, Path]:
    """The plan and its model's config.json written into ``folder`` (plan.json, config.json), and out.json, where
    the harness writes its result: the files a harness's command line names."""
    from canifinetune.estimator.model_sources import resolve_model

    folder.mkdir(parents=True, exist_ok=True)
    plan_path, config_path, out_path = (folder / n for n in ("plan.json", "config.json", "out.json"))
    plan_path.write_text(json.dumps(validated.model_dump(mode="json")), encoding="utf-8")
    config_path.write_text(json.dumps(resolve_model(validated.model).config), encoding="utf-8")
    return plan_path, config_path, out_path


def fake_mode_arguments(validated, plan_path: Path, config_path: Path, out_path: Path) -> list[str]:
    """fake_mode.py's arguments measuring one plan: a command line of its own, or one entry of its --batch."""
    return ["--plan", str(plan_path), "--config", str(config_path), "--out", str(out_path),
            "--loss", LOSS_MODE[validated.effective_loss_implementation]]


def measured_result(out_path: Path, returncode: int, stderr: str) -> dict:
    """The result a harness wrote to ``out_path``, else its process's exit status and the end of its stderr."""
    if out_path.exists():
        return json.loads(out_path.read_text(encoding="utf-8"))
    return {"error": f"exit {returncode}: {stderr[-2000:]}"}


def measure_in_subprocess(plan: dict, timeout: float = 900) -> dict:
    """Measure one plan under fake tensors in a fresh interpreter."""
    from canifinetune.estimator.plan import TrainingPlan

    validated = TrainingPlan(**plan)
    with tempfile.TemporaryDirectory() as tmp:
        plan_path, config_path, out_path = write_inputs(validated, Path(tmp))
        env = None
        stack = STACK_HARNESSES.get(validated.framework)
        if measured_by_fake_mode(validated):
            cmd = [sys.executable, str(FAKE_MODE), *fake_mode_arguments(validated, plan_path, config_path, out_path)]
        elif stack is not None:  # the framework's own step, in its own virtual environment
            title, harness, python, case_of, stack_env = stack
            if not Path(python).exists():
                return {"error": f"{title}'s virtual environment is missing ({python}); bash .ci/stack-venvs.sh "
                                 "makes it"}
            cmd = [python, str(harness), "--case", json.dumps(case_of(validated)), "--out", str(out_path)]
            env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
            env.update(stack_env)
        elif validated.image_size is not None:  # a vision-language model on images (vlm_fake.py)
            cmd = [sys.executable, str(VLM_FAKE), "--plan", str(plan_path), "--config", str(config_path),
                   "--out", str(out_path)]
        else:  # DPO/KTO/GRPO: their own training step (trainer_fake.py)
            cmd = [sys.executable, str(TRAINER_FAKE), "--plan", str(plan_path), "--config", str(config_path),
                   "--out", str(out_path)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
        return measured_result(out_path, proc.returncode, proc.stderr)


def measure_batch_in_subprocess(plans: list[dict], timeout_per_plan: float = 900) -> list[dict]:
    """Measure plans that fake_mode.py measures (:func:`measured_by_fake_mode`) one after another, each in a fork of
    one fresh interpreter (``fake_mode.py --batch``) and by the command line :func:`measure_in_subprocess` would run,
    so each result is the same, while torch, transformers, PEFT, bitsandbytes and TRL are imported once, not once a
    plan. On a timeout the whole process group goes (the batch and the fork measuring its current plan)."""
    from canifinetune.estimator.plan import TrainingPlan

    validated = [TrainingPlan(**plan) for plan in plans]
    with tempfile.TemporaryDirectory() as tmp:
        paths = [write_inputs(v, Path(tmp) / str(i)) for i, v in enumerate(validated)]
        command_lines = [fake_mode_arguments(v, *p) for v, p in zip(validated, paths, strict=True)]
        batch_path = Path(tmp) / "command_lines.json"
        batch_path.write_text(json.dumps(command_lines), encoding="utf-8")
        timeout = timeout_per_plan * len(plans)
        with subprocess.Popen([sys.executable, str(FAKE_MODE), "--batch", str(batch_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True) as proc:
            try:
                _, stderr = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:  # the plans measured before it ran out keep their results
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                return [json.loads(out.read_text(encoding="utf-8")) if out.exists()
                        else {"error": f"timed out after {timeout:.0f} s"} for _, _, out in paths]
        return [measured_result(out_path, proc.returncode, stderr) for _, _, out_path in paths]


def comparison_row(plan: dict, measured: dict) -> dict:
    """One row of the comparison: the plan, its estimate, and the measurement (or its error)."""
    from canifinetune.estimator.estimate import estimate
    from canifinetune.estimator.plan import TrainingPlan

    est = estimate(TrainingPlan(**plan))
    row = {"plan": plan, "estimate_bytes": est.peak_allocated_bytes, "estimate_phase": est.peak_phase,
           "estimate_phases": est.phases}
    if "error" in measured:
        row["error"] = measured["error"]
        return row
    peak = measured["peak_allocated_bytes"]
    row.update(measured_bytes=peak, measured_phase=measured.get("peak_phase"),
               measured_categories=measured.get("peak_categories"),
               error_pct=round(100 * (est.peak_allocated_bytes - peak) / peak, 2),
               wall_seconds=measured.get("wall_seconds"), attention_kernels=measured.get("attention_kernels"))
    return row


def compare(plan: dict) -> dict:
    return comparison_row(plan, measure_in_subprocess(plan))


def compare_many(plans: list[dict], processes: int = 2) -> list[dict]:
    """:func:`compare` of each plan, rows in the order given, ``processes`` measurements at a time. The plans
    fake_mode.py measures are dealt round-robin into ``processes`` batches, one interpreter each
    (:func:`measure_batch_in_subprocess`), as an interpreter spends seconds of CPU on its imports alone; every other
    plan runs alone, as :func:`compare` runs it."""
    from canifinetune.estimator.plan import TrainingPlan

    by_fake_mode = [measured_by_fake_mode(TrainingPlan(**plan)) for plan in plans]
    batched = [i for i, yes in enumerate(by_fake_mode) if yes]
    batches = [batch for batch in (batched[k::processes] for k in range(processes)) if batch]
    alone = [i for i, yes in enumerate(by_fake_mode) if not yes]
    measured: dict[int, dict] = {}

    def measure_batch(batch: list[int]) -> None:
        measured.update(zip(batch, measure_batch_in_subprocess([plans[i] for i in batch]), strict=True))

    def measure_alone(i: int) -> None:
        measured[i] = measure_in_subprocess(plans[i])

    with ThreadPoolExecutor(max_workers=processes) as pool:
        futures = [pool.submit(measure_batch, batch) for batch in batches]
        futures += [pool.submit(measure_alone, i) for i in alone]
        for future in futures:
            future.result()
    return [comparison_row(plan, measured[i]) for i, plan in enumerate(plans)]


def run_all(plans: list[dict], jobs: int = 2) -> list[dict]:
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(compare, plans))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases")
    parser.add_argument("--out")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    plans = json.loads(Path(args.cases).read_text(encoding="utf-8"))
    rows = run_all(plans, args.jobs)
    for row in rows:
        p = row["plan"]
        label = (f"{p['model']} {p.get('method', 'lora')} s{p.get('seq_len', 1024)} b{p.get('batch_size', 8)} "
                 f"ckpt={p.get('gradient_checkpointing', True)}")
        knobs = [f"{k}={p[k]}" for k in ("framework", "modules_to_save", "use_dora")
                 if p.get(k) not in (None, False, "trl")]
        label += "".join(" " + k for k in knobs)
        if "error" in row:
            print(f"{label}: ERROR {row['error'][:200]}")
        else:
            print(f"{label}: est {row['estimate_bytes'] / 2**30:.3f} GiB ({row['estimate_phase']}) "
                  f"measured {row['measured_bytes'] / 2**30:.3f} GiB ({row['measured_phase']}) "
                  f"err {row['error_pct']:+.2f}%")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
