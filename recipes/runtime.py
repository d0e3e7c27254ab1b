"""The training runtime: `canifinetune train recipe.yaml` trains exactly the plan that was estimated.

The model, quantization, LoRA adapters, gradient checkpointing and optimizer come from ``recipes/model_setup.py`` (the
same code the fake-tensor measurement runs); TRL's ``SFTTrainer`` trains it with an ``SFTConfig`` mapped field by
field from the plan. Validation happens before anything heavy loads; the dataset is tokenized and length-checked
before the model loads. torch, transformers, peft, trl and bitsandbytes are imported only inside functions.

Every file is read and written as UTF-8 whatever the locale.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from canifinetune.estimator.errors import DatasetError, RecipeError
from canifinetune.estimator.errors import SampleTooLongError as SampleTooLongError  # declared in errors.py
from canifinetune.estimator.plan import TrainingPlan

from .schema import output_dir_problem

MAX_JSONL_LINE = 64 * 1024 * 1024
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json",
                   "pytorch_model.bin.index.json")


# ---------------------------------------------------------------------------------------------- machine checks


@dataclass(frozen=True)
class Machine:
    """What the runtime can see of this machine (a plain record so tests can describe other machines)."""

    cuda: bool
    device_count: int = 0
    bf16: bool = False
    gpu_name: str | None = None
    world_size: int = 1
    flash_attn: bool = False
    cpu_run: bool = False  # the run asked for the CPU (--device cpu): several processes then train with gloo

    @classmethod
    def detect(cls, device: str | None = None) -> Machine:
        import importlib.util

        import torch

        cuda = torch.cuda.is_available() and device != "cpu"
        if device is not None and device.startswith("cuda") and not torch.cuda.is_available():
            raise RecipeError(f"--device {device}: torch sees no CUDA GPU on this machine (torch {torch.__version__})")
        return cls(
            cuda=cuda,
            device_count=torch.cuda.device_count() if cuda else 0,
            bf16=bool(cuda and torch.cuda.is_bf16_supported()),
            gpu_name=torch.cuda.get_device_name(0) if cuda else None,
            world_size=int(os.environ.get("WORLD_SIZE", "1") or 1),
            flash_attn=importlib.util.find_spec("flash_attn") is not None,
            cpu_run=device == "cpu",
        )


def check_plan_for_machine(plan: TrainingPlan, machine: Machine) -> None:
    """Refuse, before anything loads, what cannot run here; every message says what to change."""
    problems: list[str] = []
    if plan.num_gpus > 1:
        if not machine.cuda and machine.cpu_run:
            # an explicit CPU run (tests, a dry run of a multi-GPU recipe): one process per planned GPU, gloo. Note
            # accelerate 1.15 runs every strategy as plain data parallelism (MULTI_CPU) there: FSDP and DeepSpeed
            # need an accelerator; the memory figures are the estimate's, not this run's
            if machine.world_size != plan.num_gpus:
                problems.append(f"num_gpus: the recipe trains on {plan.num_gpus} GPUs; on the CPU (--device cpu) start "
                                f"{plan.num_gpus} processes with the recipe's launch command"
                                + (" on every node" if plan.num_nodes > 1 else "")
                                + f" (this process runs {machine.world_size})")
        elif not machine.cuda:
            problems.append(f"num_gpus: the recipe trains on {plan.num_gpus} GPUs and this machine has no CUDA GPU; "
                            "set num_gpus: 1 and sharding: none (and make the recipe again) to train here")
        elif plan.num_nodes > 1 and plan.node_gpus > machine.device_count:
            problems.append(f"gpus_per_node: the recipe trains on {plan.gpus_words()} and this machine has "
                            f"{machine.device_count}; set gpus_per_node to {machine.device_count} or fewer and make "
                            "the recipe again")
        elif plan.num_nodes == 1 and plan.num_gpus > machine.device_count:
            problems.append(f"num_gpus: the recipe trains on {plan.num_gpus} GPUs and this machine has "
                            f"{machine.device_count}; set num_gpus to {machine.device_count} or fewer and make the "
                            "recipe again")
        elif machine.world_size != plan.num_gpus:
            problems.append(f"num_gpus: the recipe trains on {plan.num_gpus} GPUs but this process runs "
                            f"{machine.world_size} of them; start it with the recipe's launch command "
                            + ("(sh launch.sh NODE_RANK MASTER_ADDR on every node)" if plan.num_nodes > 1 else
                               "(accelerate launch --config_file accelerate_config.yaml -m canifinetune.server.cli "
                               "train recipe.yaml)"))
    if plan.dtype == "bf16" and machine.cuda and not machine.bf16:
        problems.append(f"dtype: this GPU ({machine.gpu_name}) has no bf16; set dtype: fp16 in the recipe "
                        "(and estimate again: fp16 needs the same memory)")
    if plan.dtype == "fp16" and not machine.cuda:
        problems.append("dtype: fp16 mixed precision needs a CUDA GPU; on a CPU use dtype: bf16 or fp32")
    if plan.dtype == "fp16" and plan.method == "full" and plan.precision == "pure":
        problems.append("precision: full fine-tuning with pure fp16 weights cannot train (the fp16 gradient scaler "
                        "refuses fp16 gradients); set precision: mixed, or dtype: bf16")
    if plan.attn_implementation == "flash_attention_2" and not (machine.cuda and machine.flash_attn):
        problems.append("attn_implementation: flash_attention_2 needs a CUDA GPU and the flash-attn package; "
                        "install flash-attn, or set attn_implementation: sdpa")
    if not machine.cuda and plan.optim.startswith("paged_"):
        problems.append(f"optim: {plan.optim} pages optimizer states through CUDA memory; on a CPU use adamw_torch")
    if plan.sharding.startswith("fsdp") and plan.offload_optimizer and not plan.offload_params:
        problems.append("offload_optimizer: FSDP offloads parameters, gradients and optimizer states together; set "
                        "offload_params: true with sharding fsdp_full_shard, or use sharding zero2/zero3 to offload "
                        "only the optimizer")
    from canifinetune.estimator.trainers import packing_problem

    packing = packing_problem(plan)  # the estimate refuses the same, with the same words
    if packing is not None:
        problems.append(packing)
    if plan.trainer == "grpo" and plan.use_vllm and not machine.cuda:
        problems.append("use_vllm: vLLM generates on a CUDA GPU; on a CPU set use_vllm: false (GRPO then generates "
                        "with model.generate)")
    from .trainers import trainer_problems

    problems += trainer_problems(plan)
    problem = output_dir_problem(plan.output_dir)
    if problem is not None:
        problems.append(problem)
    if problems:
        raise RecipeError("; ".join(problems))


# ---------------------------------------------------------------------------------------------- paths


def _local_path(name: str, recipe_dir: Path | None) -> Path | None:
    """An existing path for ``name``: as given (from the current folder), else relative to the recipe's folder."""
    path = Path(name).expanduser()
    if path.exists():
        return path
    if recipe_dir is not None and not path.is_absolute() and (recipe_dir / path).exists():
        return recipe_dir / path
    return None


def checked_output_dir(plan: TrainingPlan, recipe_dir: Path) -> Path:
    """The real path (symlinks resolved) of the plan's output_dir, which must lie inside the recipe's folder.

    output_dir_problem checks the text; this checks where it really lands: a symlink inside the recipe folder
    (``outputs -> /elsewhere``, or any folder on the way) that leads outside it is refused."""
    problem = output_dir_problem(plan.output_dir)
    if problem is not None:
        raise RecipeError(problem)
    root = Path(os.path.realpath(recipe_dir))
    real = Path(os.path.realpath(root / plan.output_dir))
    if real != root and root not in real.parents:
        raise RecipeError(f"output_dir: {plan.output_dir!r} leads to {str(real)!r} through a symbolic link, outside "
                          f"the recipe's folder {str(root)!r}; remove the link or choose another output_dir")
    if real == root:
        raise RecipeError(f"output_dir: {plan.output_dir!r} is the recipe's folder itself; use a folder inside it, "
                          "e.g. 'outputs'")
    if real.exists() and not real.is_dir():
        raise RecipeError(f"output_dir: {str(real)!r} exists and is not a folder")
    return real


def require_device(device: str | None) -> None:
    """A run without a CUDA GPU must ask for the CPU explicitly (--device cpu): never a silent CPU run."""
    if device is not None:
        return
    import torch

    if not torch.cuda.is_available():
        raise RecipeError("--device: torch sees no CUDA GPU on this machine; training on the CPU is very slow, "
                          "pass --device cpu to run it there anyway")


def model_source(plan: TrainingPlan, recipe_dir: Path | None = None) -> tuple[dict, str]:
    """(config dict, what from_pretrained loads: a local folder with weights or a Hub id) for the plan's model."""
    from canifinetune.estimator.model_sources import resolve_model

    local = _local_path(plan.model, recipe_dir)
    resolved = resolve_model(str(local) if local is not None else plan.model)
    if resolved.source != "local":
        return resolved.config, resolved.id
    folder = Path(resolved.id)
    if not folder.is_dir():
        raise RecipeError(f"model: {plan.model!r} is a config file; training needs the model's folder with its weights")
    if not any(any(folder.glob(p)) for p in WEIGHT_PATTERNS):
        raise RecipeError(f"model: the folder {str(folder)!r} has config.json but no weights (*.safetensors or "
                          "pytorch_model*.bin); point model at a folder saved with save_pretrained, or a Hub id")
    return resolved.config, str(folder)


def dataset_path(plan: TrainingPlan, dataset: str | None, recipe_dir: Path | None) -> Path:
    name = dataset if dataset is not None else plan.dataset
    if name is None:
        raise DatasetError("dataset: the recipe names no dataset; pass --dataset FILE.jsonl (or a dataset folder), "
                           "or set plan.dataset in the recipe")
    path = _local_path(name, recipe_dir)
    if path is None:
        where = f" or in {str(recipe_dir)!r}" if recipe_dir is not None else ""
        raise DatasetError(f"dataset: {name!r} does not exist (looked in the current folder{where}); "
                           "give a JSONL file or a folder saved with datasets' save_to_disk")
    return path


# ---------------------------------------------------------------------------------------------- dataset


@dataclass
class Row:
    where: str  # "line 3" / "row 3": how a person finds it
    data: dict


def read_rows(path: Path) -> list[Row]:
    """Training rows from a JSONL file (UTF-8, 1-based line numbers) or a folder saved by ``datasets``."""
    rows: list[Row] = []
    if path.is_dir():
        from datasets import DatasetDict, load_from_disk

        try:
            ds = load_from_disk(str(path))
        except Exception as exc:  # datasets raises several kinds
            raise DatasetError(f"dataset: {str(path)!r} is not a folder saved by datasets' save_to_disk: "
                               f"{exc}") from None
        if isinstance(ds, DatasetDict):
            if "train" not in ds:
                raise DatasetError(f"dataset: {str(path)!r} has splits {list(ds)} and no 'train' split")
            ds = ds["train"]
        for i, item in enumerate(ds, start=1):
            rows.append(Row(f"row {i}", dict(item)))
    else:
        with open(path, encoding="utf-8-sig", newline=None) as handle:
            number = 0
            while True:
                try:
                    line = handle.readline(MAX_JSONL_LINE + 1)
                except UnicodeDecodeError as exc:
                    raise DatasetError(f"dataset: {str(path)!r} is not UTF-8 text ({exc.reason}); save it as "
                                       "UTF-8") from None
                if not line:
                    break
                number += 1
                if len(line) > MAX_JSONL_LINE:
                    raise DatasetError(f"dataset: line {number} of {str(path)!r} is longer than {MAX_JSONL_LINE} "
                                       "characters")
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                except ValueError as exc:
                    raise DatasetError(f"dataset: line {number} of {str(path)!r} is not JSON: {exc}") from None
                if not isinstance(item, dict):
                    raise DatasetError(f"dataset: line {number} of {str(path)!r} must be a JSON object with 'text' or "
                                       "'messages'")
                rows.append(Row(f"line {number}", item))
    if not rows:
        raise DatasetError(f"dataset: {str(path)!r} holds no rows")
    return rows


def tokenize_rows(rows: list[Row], tokenizer, path: Path) -> list[list[int]]:
    """Token ids per row, as TRL's SFTTrainer would make them: text + EOS, or the chat template over messages."""
    out: list[list[int]] = []
    eos = tokenizer.eos_token
    for row in rows:
        data = row.data
        if isinstance(data.get("messages"), list):
            if not getattr(tokenizer, "chat_template", None):
                raise DatasetError(f"dataset: {row.where} of {str(path)!r} has 'messages' but the model's tokenizer "
                                   "has no chat template; use 'text' rows, or a model with a chat template")
            tools = data.get("tools")
            tools = json.loads(tools) if isinstance(tools, str) else tools
            ids = tokenizer.apply_chat_template(data["messages"], tokenize=True, return_dict=True,
                                                tools=tools)["input_ids"]
        elif isinstance(data.get("text"), str):
            text = data["text"]
            if eos and not text.endswith(eos):
                text = text + eos
            ids = tokenizer(text)["input_ids"]
        else:
            raise DatasetError(f"dataset: {row.where} of {str(path)!r} needs a 'text' string or a 'messages' list; "
                               f"it has {sorted(map(str, data))[:8]}")
        out.append(list(ids))
    return out


def check_lengths(rows: list[Row], ids: list[list[int]], seq_len: int, truncation: bool, path: Path) -> list[list[int]]:
    """Refuse samples longer than seq_len (naming them), or cut them when the recipe says truncation: true."""
    too_long = [(row, len(x)) for row, x in zip(rows, ids, strict=True) if len(x) > seq_len]  # ids: one per row
    if too_long and not truncation:
        first, count = too_long[0]
        more = f" ({len(too_long)} rows are too long; the first ones: " + ", ".join(
            f"{r.where}: {n}" for r, n in too_long[:5]) + ")" if len(too_long) > 1 else ""
        raise SampleTooLongError(
            f"dataset: {first.where} of {str(path)!r} is {count} tokens, longer than seq_len {seq_len}{more}; "
            "shorten or drop it, raise seq_len in the recipe (and estimate again), or set truncation: true to cut "
            "samples at seq_len"
        )
    return [x[:seq_len] for x in ids]


# ---------------------------------------------------------------------------------------------- trainer


def sft_config_kwargs(plan: TrainingPlan, *, output_dir: str, use_cpu: bool, max_steps: int | None = None) -> dict:
    """SFTConfig arguments, field by field from the plan."""
    ckpt = plan.gradient_checkpointing
    ckpt_kwargs = {"use_reentrant": False} if ckpt else None
    return {
        "output_dir": output_dir,
        "per_device_train_batch_size": plan.batch_size,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
        "activation_checkpointing": ckpt,
        "gradient_checkpointing": ckpt,
        "activation_checkpointing_kwargs": ckpt_kwargs,
        "gradient_checkpointing_kwargs": ckpt_kwargs,
        # TRL's OffloadActivations around each training step (estimator/memory.py offload_stash_bytes)
        "activation_offloading": plan.activation_offloading,
        "optim": plan.optim,
        "bf16": plan.dtype == "bf16",
        "fp16": plan.dtype == "fp16",
        # padding-free rows without packing: TRL 1.16 refuses a max_length it would not enforce (sft_trainer.py); the
        # runtime has already refused (or, with truncation, cut) every sample longer than seq_len (check_lengths)
        "max_length": None if plan.padding_free and not plan.packing else plan.seq_len,
        "truncation_mode": "keep_start",
        # as the plan says (TRL's names); TRL 1.16 packs with its "bfd" strategy, which turns padding-free on too
        "packing": plan.packing,
        "padding_free": plan.padding_free,
        "learning_rate": plan.effective_learning_rate,
        "max_steps": plan.max_steps if max_steps is None else max_steps,
        "num_train_epochs": plan.num_train_epochs,
        "report_to": "none",
        "use_cpu": use_cpu,
        "logging_steps": 1,
        "save_strategy": "no" if max_steps is not None else "steps",
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
        "seed": 42,
    }


def _trainer_class(plan: TrainingPlan):
    from trl import SFTTrainer

    if plan.effective_loss_implementation == "chunked":
        return SFTTrainer  # TRL 1.16's default: the fused, tiled LM head

    class StandardLossSFTTrainer(SFTTrainer):
        """transformers' plain loss: model(**inputs) with labels builds the full logits (what 'standard' estimates)."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            from transformers import Trainer

            return Trainer.compute_loss(self, model, {**inputs, "use_cache": False},
                                        return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)

    return StandardLossSFTTrainer


@dataclass
class Prepared:
    plan: TrainingPlan
    trainer: Any
    model: Any
    tokenizer: Any
    output_dir: Path
    samples: int
    truncated: int = 0
    notes: list[str] = field(default_factory=list)


def _device_for(machine: Machine) -> str:
    if not machine.cuda:
        return "cpu"
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0') or 0)}"


def prepare(
    plan: TrainingPlan,
    *,
    recipe_dir: Path | None = None,
    dataset: str | None = None,
    token_ids: list[list[int]] | None = None,
    device: str | None = None,
    max_steps: int | None = None,
    output_dir: Path | None = None,
) -> Prepared:
    """Check the plan against this machine, read and length-check the data, build the model and the trainer.

    ``token_ids`` replaces the dataset (the probe trains on synthetic full-length samples)."""
    machine = Machine.detect(device)
    check_plan_for_machine(plan, machine)
    if machine.cpu_run and plan.sharding == "fsdp_hybrid_shard":
        # accelerate 1.15's ParallelismConfig (the recipe's HYBRID_SHARD mesh, from its launcher's environment) refuses
        # the CPU's MULTI_CPU state, and accelerate applies FSDP only under an accelerator anyway: a CPU dry run of the
        # launch trains as data parallelism, like the other FSDP recipes
        os.environ.pop("ACCELERATE_USE_PARALLELISM_CONFIG", None)
    base = recipe_dir if recipe_dir is not None else Path.cwd()
    out = output_dir if output_dir is not None else checked_output_dir(plan, base)  # before anything loads
    config, source = model_source(plan, recipe_dir)
    if plan.image_size is not None:
        return _prepare_vlm(plan, machine, config, source, out, recipe_dir=recipe_dir, dataset=dataset,
                            max_steps=max_steps, synthetic=token_ids is not None)
    if plan.trainer != "sft":
        if token_ids is not None:
            raise RecipeError(f"trainer: synthetic samples (the probe) are for sft; a {plan.trainer} plan trains on "
                              "its dataset")
        return _prepare_trainer(plan, machine, source, out, recipe_dir=recipe_dir, dataset=dataset,
                                max_steps=max_steps)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    truncated = 0
    if token_ids is None:
        path = dataset_path(plan, dataset, recipe_dir)
        rows = read_rows(path)
        ids = tokenize_rows(rows, tokenizer, path)
        truncated = sum(1 for x in ids if len(x) > plan.seq_len)
        ids = check_lengths(rows, ids, plan.seq_len, plan.truncation, path)
    else:
        ids = [list(x) for x in token_ids]

    from datasets import Dataset

    train_dataset = Dataset.from_dict({"input_ids": ids})

    from . import model_setup

    model = model_setup.build_model(plan, config, pretrained_path=source)
    dev = _device_for(machine)
    if machine.cuda and plan.sharding in ("none", "ddp"):
        model.to(dev)

    from trl import SFTConfig

    args = SFTConfig(**sft_config_kwargs(plan, output_dir=str(out), use_cpu=not machine.cuda, max_steps=max_steps))
    trainer = _trainer_class(plan)(model=model, args=args, train_dataset=train_dataset, processing_class=tokenizer)
    # TRL tokenizes nothing here (the rows are token ids already); confirm what it will train is what was checked
    longest = max(len(x) for x in trainer.train_dataset["input_ids"])
    if longest > plan.seq_len:  # pragma: no cover - guarded above
        raise SampleTooLongError(f"dataset: a prepared sample is {longest} tokens, longer than seq_len {plan.seq_len}")
    notes = []
    if machine.cpu_run and plan.num_gpus > 1 and plan.sharding != "ddp":
        notes.append(_cpu_engine_note(plan, trainer))
    if truncated:
        notes.append(f"{truncated} samples were cut at seq_len {plan.seq_len} (truncation: true)")
    if (plan.packing or plan.padding_free) and plan.attn_implementation != "flash_attention_2":
        # transformers 5 (masking_utils.find_packed_sequence_indices) keeps packed sequences apart under sdpa/eager
        # with a block-diagonal mask over the flattened row; flash_attention_2 uses varlen kernels and no mask
        notes.append(f"{'packing' if plan.packing else 'padding_free'} without flash_attention_2: transformers masks "
                     f"the packed sequences apart with a ({plan.batch_size} x {plan.seq_len})^2 mask, which the "
                     "estimate does not count; attn_implementation: flash_attention_2 needs none")
    return Prepared(plan=plan, trainer=trainer, model=trainer.model, tokenizer=tokenizer, output_dir=out,
                    samples=len(ids), truncated=truncated, notes=notes)


def _cpu_engine_note(plan: TrainingPlan, trainer) -> str:
    """What a sharded recipe runs as on the CPU (--device cpu), read from the Trainer's accelerator: DeepSpeed's ZeRO
    engine does run there (its CPU accelerator, over gloo: accelerate 1.15, DeepSpeed 0.19.8); accelerate applies its
    FSDP plugin only under an accelerator, so an FSDP recipe trains as data parallelism."""
    where = (f"over {plan.num_gpus} processes" + (f" on {plan.num_nodes} nodes" if plan.num_nodes > 1 else "")
             + " (gloo)")
    if getattr(trainer, "is_deepspeed_enabled", False):
        plugin = trainer.accelerator.state.deepspeed_plugin
        hpz = (plugin.deepspeed_config.get("zero_optimization") or {}).get("zero_hpz_partition_size", 1)
        hpz_words = f" with ZeRO++ hpZ (zero_hpz_partition_size {hpz})" if isinstance(hpz, int) and hpz > 1 else ""
        return f"sharding {plan.sharding}: on the CPU DeepSpeed ZeRO-{plugin.zero_stage}{hpz_words} runs it {where}"
    return (f"sharding {plan.sharding}: on the CPU accelerate trains it as data parallelism {where}; FSDP needs "
            "GPUs")


def _prepare_trainer(plan: TrainingPlan, machine: Machine, source: str, out: Path, *, recipe_dir: Path | None,
                     dataset: str | None, max_steps: int | None) -> Prepared:
    """DPO, ORPO, KTO, reward or GRPO (recipes/trainers.py): rows read, shape- and length-checked before the model
    loads, then TRL's trainer built from the plan, and what it prepared checked again."""
    from transformers import AutoTokenizer

    from . import trainers

    tokenizer = AutoTokenizer.from_pretrained(source, **({"padding_side": "left"} if plan.trainer == "grpo" else {}))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    path = dataset_path(plan, dataset, recipe_dir)
    rows = read_rows(path)
    lengths = trainers.sequence_lengths(plan, rows, tokenizer, path)
    truncated = trainers.check_sequence_lengths(plan, rows, lengths, path)
    common = sft_config_kwargs(plan, output_dir=str(out), use_cpu=not machine.cuda, max_steps=max_steps)
    trainer = trainers.build_trainer(plan, source=source, tokenizer=tokenizer,
                                     dataset=trainers.train_dataset(plan, rows), common=common, recipe_dir=recipe_dir)
    trainers.check_prepared(plan, trainer, len(rows))
    notes = [f"{trainers.TRAINER_TITLES[plan.trainer]}, reference model: {trainers.reference_of(plan)}"]
    if truncated:
        notes.append(f"{truncated} samples are longer than seq_len {plan.seq_len}: TRL cuts them (truncation: true)")
    return Prepared(plan=plan, trainer=trainer, model=trainer.model, tokenizer=tokenizer, output_dir=out,
                    samples=len(rows), truncated=truncated, notes=notes)


def _prepare_vlm(plan: TrainingPlan, machine: Machine, config: dict, source: str, out: Path, *,
                 recipe_dir: Path | None, dataset: str | None, max_steps: int | None, synthetic: bool) -> Prepared:
    """A vision-language SFT run (recipes/vision_setup.py, recipes/vision_data.py): the checkpoint's processor (with
    the plan's min_pixels/max_pixels, do_image_splitting, longest_edge and max_image_size where it sets them), the
    image rows checked
    against the plan before the model loads, then TRL's SFTTrainer with its vision collator and no max_length (image
    tokens are never cut).
    ``synthetic`` (the probe's text samples) is refused: a VLM trains on its images."""
    if synthetic:
        raise RecipeError("image_size: synthetic samples (the probe) are text; a vision-language plan trains on its "
                          "image dataset (run a few steps: max_steps in the recipe)")
    from datasets import Dataset
    from transformers import AutoProcessor
    from trl import SFTConfig, SFTTrainer

    from canifinetune.estimator.spec import ModelSpec
    from canifinetune.estimator.vision_images import image_seq_len, resolve_images, sequence_length

    from . import vision_data, vision_setup

    spec = ModelSpec.from_config(config)
    processor = AutoProcessor.from_pretrained(source)
    if plan.do_image_splitting is not None:  # the Idefics3 image processor's tiling
        processor.image_processor.do_image_splitting = plan.do_image_splitting
    if plan.longest_edge is not None:  # the Idefics3 image processor's resize before tiling
        processor.image_processor.size = {"longest_edge": plan.longest_edge}
    if plan.max_image_size is not None:  # the Idefics3 tile, and the tokens each tile's features fill
        processor.image_processor.max_image_size = {"longest_edge": plan.max_image_size}
        processor.image_seq_len = image_seq_len(plan, spec)
    if plan.min_pixels is not None or plan.max_pixels is not None:  # the Qwen image processor's bounds
        image_processor = processor.image_processor
        size = dict(getattr(image_processor, "size", None) or {})
        if plan.min_pixels is not None:
            size["shortest_edge"] = plan.min_pixels
        if plan.max_pixels is not None:
            size["longest_edge"] = plan.max_pixels
        image_processor.size = size
    path = dataset_path(plan, dataset, recipe_dir)
    rows = read_rows(path)
    train_rows = vision_data.image_rows(rows, path, plan, spec)
    planned = resolve_images(plan, spec)
    vision_data.check_row_lengths(train_rows, processor, plan, sequence_length(plan.seq_len, planned),
                                  [r.where for r in rows], path)
    model = vision_setup.build_vlm(plan, config, pretrained_path=source)
    if machine.cuda:
        model.to(_device_for(machine))
    kwargs = sft_config_kwargs(plan, output_dir=str(out), use_cpu=not machine.cuda, max_steps=max_steps)
    kwargs["max_length"] = None  # TRL's guidance for VLMs: truncation would cut image tokens
    trainer = SFTTrainer(model=model, args=SFTConfig(**kwargs), train_dataset=Dataset.from_list(train_rows),
                         processing_class=processor)
    notes = [f"vision-language SFT: {len(train_rows)} samples, images checked against image_size {plan.image_size}"]
    return Prepared(plan=plan, trainer=trainer, model=trainer.model, tokenizer=processor, output_dir=out,
                    samples=len(train_rows), notes=notes)


def runtime_settings(prepared: Prepared) -> dict:
    """The settings the trainer actually resolved (model as built, the optimizer Trainer makes for ``optim``)."""
    from . import model_setup

    trainer = prepared.trainer
    if trainer.optimizer is None:
        trainer.create_optimizer()
    settings = model_setup.resolved_settings(prepared.plan, trainer.model, trainer.optimizer)
    args = trainer.args
    settings["trainer"] = {
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "activation_checkpointing": bool(args.activation_checkpointing),
        "activation_checkpointing_kwargs": args.activation_checkpointing_kwargs,
        "max_length": getattr(args, "max_length", None),
        "bf16": bool(args.bf16),
        "fp16": bool(args.fp16),
        "optim": str(getattr(args.optim, "value", args.optim)),
        "learning_rate": args.learning_rate,
        "trainer_class": type(trainer).__name__,
    }
    return settings
