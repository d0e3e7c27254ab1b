"""The runtime of the trainers beyond SFT: TRL 1.16's DPOTrainer, ORPOTrainer (trl.experimental.orpo), KTOTrainer,
RewardTrainer and GRPOTrainer, each built from the plan.

The plan's trainer fields (estimator/plan.py, TRL's names) become the trainer's config field by field; a null field
is the trainer's own default (estimator/trainers.py). The base model is loaded as TRL loads it (``from_pretrained``
in the plan's dtype with its ``BitsAndBytesConfig``) and the plan's ``LoraConfig`` is handed to the trainer as
``peft_config``, so TRL wraps it and chooses the reference model itself; the reference model is the plan's
(:func:`reference_of`): a separate frozen copy, the PEFT base with adapters disabled (TRL's ``ref_model=None`` with
PEFT), or none (precomputed reference log-probabilities, GRPO with beta 0, ORPO and reward modelling).

Samples are never cut silently: every row is tokenized and length-checked before the model loads (pairs: the prompt
with each answer; KTO: the prompt with the completion; GRPO: the prompt), and what TRL prepared is checked again.

torch, transformers, peft and trl are imported inside the functions only.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.trainers import TRAINER_CLASSES, TRAINER_DEFAULTS

from .examples import REWARD_FILE, ROW_KEYS
from .schema import RecipeError

TRAINER_TITLES = {
    "sft": "TRL's SFTTrainer",
    "dpo": "TRL's DPOTrainer",
    "orpo": "TRL's ORPOTrainer (trl.experimental.orpo)",
    "kto": "TRL's KTOTrainer",
    "reward": "TRL's RewardTrainer",
    "grpo": "TRL's GRPOTrainer",
}
# what seq_len bounds, per trainer (the words of a refusal)
_LENGTH_WORDS = {
    "dpo": "the prompt with its chosen or rejected answer",
    "orpo": "the prompt with its chosen or rejected answer",
    "reward": "the (prompt and) chosen or rejected answer",
    "kto": "the prompt with its completion",
    "grpo": "the prompt",
}


def length_limit(plan: TrainingPlan) -> int:
    """The most tokens a row may have: seq_len (max_length); for grpo the prompt's share of seq_len (seq_len is the
    longest prompt plus its completion, max_completion_length)."""
    if plan.trainer == "grpo":
        return plan.seq_len - int(setting(plan, "max_completion_length"))
    return plan.seq_len


# ---------------------------------------------------------------------------------------------- the plan's values


def setting(plan: TrainingPlan, name: str):
    """A trainer field's value: the plan's, or the trainer's TRL 1.16 default (None where TRL has none)."""
    value = getattr(plan, name)
    if value is not None:
        return value
    return TRAINER_DEFAULTS.get(plan.trainer, {}).get(name)


def reference_of(plan: TrainingPlan) -> str:
    """The reference model the step holds: 'copy', 'adapter_disabled' or 'none' (as TRL 1.16 decides it).

    dpo/kto: none when the log-probabilities are precomputed (once, before training); else the plan's
    reference_model; else the adapter-disabled base with LoRA/QLoRA, a copy for full fine-tuning. grpo: none when beta
    is 0 (TRL's default), else as dpo. orpo, reward, sft: none (no reference). The estimator decides it the same way.
    """
    if plan.trainer not in ("dpo", "kto", "grpo"):
        return "none"
    if plan.trainer == "grpo" and not setting(plan, "beta"):
        return "none"
    if plan.trainer != "grpo" and setting(plan, "precompute_ref_log_probs"):
        return "none"
    if plan.reference_model is not None:
        return plan.reference_model
    return "adapter_disabled" if plan.uses_adapters else "copy"


def trainer_problems(plan: TrainingPlan) -> list[str]:
    """What TRL 1.16 cannot train as the plan says (checked before anything loads); each says what to change."""
    t = plan.trainer
    problems: list[str] = []
    if t == "sft":
        return problems
    ref = plan.reference_model
    if ref == "adapter_disabled" and not plan.uses_adapters:
        problems.append("reference_model: 'adapter_disabled' is the PEFT base with its adapters off, so it needs "
                        "method 'lora' or 'qlora'; with full fine-tuning use 'copy' (or leave it null)")
    if t in ("dpo", "kto") and ref == "none" and not setting(plan, "precompute_ref_log_probs"):
        problems.append(f"reference_model: {t} compares with a reference model's log-probabilities; 'none' needs "
                        "precompute_ref_log_probs: true (computed once before training), or use 'adapter_disabled' "
                        "(LoRA) / 'copy'")
    if t == "kto" and plan.batch_size < 2:
        # KTOTrainer 1.16 __init__: its KL term pairs each completion with another row of the same micro-batch
        problems.append("batch_size: KTO needs at least 2 rows per micro-batch (TRL's KTOTrainer refuses 1: its KL "
                        "term pairs each completion with another row of the batch); use batch_size 2 or more")
    if t == "grpo":
        beta = setting(plan, "beta")
        if not beta and ref in ("copy", "adapter_disabled"):
            problems.append(f"reference_model: GRPO with beta 0 (TRL's default) loads no reference model; set beta "
                            f"above 0 to use '{ref}', or leave reference_model null")
        if beta and ref == "none":
            problems.append(f"reference_model: GRPO with beta {beta} needs a reference model (its KL term); set beta "
                            "0 for none, or leave reference_model null")
        if beta and ref == "copy" and plan.uses_adapters:
            problems.append("reference_model: TRL's GRPOTrainer always uses the adapter-disabled base as the "
                            "reference with LoRA/QLoRA (it takes no separate reference model); use "
                            "'adapter_disabled' or leave it null")
        completion = setting(plan, "max_completion_length")
        if completion is not None and completion >= plan.seq_len:
            problems.append(f"max_completion_length: {completion} must be below seq_len {plan.seq_len} (for grpo, "
                            "seq_len is the longest prompt plus its completion)")
        gens = setting(plan, "num_generations")
        if gens is not None and gens < 2:
            problems.append("num_generations: GRPO compares the completions of a group; use at least 2")
        if plan.truncation:
            problems.append("truncation: TRL's GRPOTrainer does not cut prompts; leave truncation false and shorten "
                            "the prompts longer than seq_len (they are refused, naming them)")
    if t == "reward" and plan.truncation:
        problems.append("truncation: TRL's RewardTrainer drops pairs longer than max_length instead of cutting them; "
                        "leave truncation false (longer pairs are refused, naming them) or raise seq_len")
    return problems


# ---------------------------------------------------------------------------------------------- the dataset


def _ids(tokenizer, value, *, add_generation_prompt: bool = False) -> list[int]:
    if isinstance(value, list):
        return list(tokenizer.apply_chat_template(value, tokenize=True, return_dict=True,
                                                  add_generation_prompt=add_generation_prompt)["input_ids"])
    return list(tokenizer(value)["input_ids"])


def _text_with_eos(text: str, eos: str | None) -> str:
    return text + eos if eos and not text.endswith(eos) else text


def _check_value(trainer: str, key: str, value, where: str, path: Path) -> None:
    from canifinetune.estimator.errors import DatasetError

    if key == "label":
        if not isinstance(value, bool):
            raise DatasetError(f"dataset: {where} of {str(path)!r}: 'label' must be true (a desirable completion) or "
                               f"false; got {json.dumps(value)[:40]}")
        return
    ok = isinstance(value, str) or (
        isinstance(value, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in value))
    if trainer == "orpo" and not isinstance(value, str):
        raise DatasetError(f"dataset: {where} of {str(path)!r}: ORPO (trl.experimental.orpo) takes plain text; "
                           f"'{key}' must be a string")
    if not ok:
        raise DatasetError(f"dataset: {where} of {str(path)!r}: '{key}' must be a string or a list of "
                           "{role, content} messages")


def sequence_lengths(plan: TrainingPlan, rows, tokenizer, path: Path) -> list[int]:
    """Each row's longest sequence as the trainer builds it (tokens), after checking the row's shape."""
    from canifinetune.estimator.errors import DatasetError

    trainer = plan.trainer
    required, optional = ROW_KEYS[trainer]
    eos = tokenizer.eos_token
    lengths: list[int] = []
    for row in rows:
        data = row.data
        missing = [k for k in required if k not in data]
        if missing:
            raise DatasetError(f"dataset: {row.where} of {str(path)!r} has no {', '.join(repr(k) for k in missing)}; "
                               f"{trainer} rows hold {', '.join(required + optional)} (it has "
                               f"{sorted(map(str, data))[:8]})")
        for key in required + tuple(k for k in optional if k in data):
            _check_value(trainer, key, data[key], row.where, path)
        conversational = isinstance(data.get("prompt", data.get("chosen")), list)
        if trainer == "grpo":
            lengths.append(len(_ids(tokenizer, data["prompt"], add_generation_prompt=conversational)))
            continue
        answers = ("chosen", "rejected") if trainer != "kto" else ("completion",)
        longest = 0
        for key in answers:
            prompt, answer = data.get("prompt", [] if isinstance(data[key], list) else ""), data[key]
            if isinstance(answer, list) != isinstance(prompt, list):
                raise DatasetError(f"dataset: {row.where} of {str(path)!r}: 'prompt' and '{key}' must both be text "
                                   "or both be message lists")
            if isinstance(answer, list):
                n = len(_ids(tokenizer, prompt + answer))
            elif trainer == "orpo":  # ORPO: prompt and answer tokenized apart, BOS and EOS added when missing
                n = (len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
                     + len(tokenizer(answer, add_special_tokens=False)["input_ids"])
                     + (tokenizer.bos_token_id is not None) + 1)
            else:
                n = len(_ids(tokenizer, _text_with_eos(prompt + answer, eos)))
            longest = max(longest, n)
        lengths.append(longest)
    return lengths


def check_sequence_lengths(plan: TrainingPlan, rows, lengths: list[int], path: Path) -> int:
    """Refuse rows longer than seq_len (naming them), unless truncation: true; returns how many are longer."""
    from canifinetune.estimator.errors import SampleTooLongError

    limit = length_limit(plan)
    too_long = [(row, n) for row, n in zip(rows, lengths, strict=True) if n > limit]  # lengths: one per row
    if too_long and not plan.truncation:
        first, count = too_long[0]
        more = (f" ({len(too_long)} rows are too long; the first ones: "
                + ", ".join(f"{r.where}: {n}" for r, n in too_long[:5]) + ")") if len(too_long) > 1 else ""
        bound = (f"seq_len {plan.seq_len} less max_completion_length {plan.seq_len - limit}, the prompt's share"
                 if plan.trainer == "grpo" else f"seq_len {plan.seq_len}, the {plan.trainer} plan's max_length")
        raise SampleTooLongError(
            f"dataset: {first.where} of {str(path)!r} is {count} tokens ({_LENGTH_WORDS[plan.trainer]}), longer than "
            f"{limit} ({bound}){more}; shorten or drop it, raise seq_len in the recipe (and estimate again)"
            + ("" if plan.trainer in ("grpo", "reward") else ", or set truncation: true to let TRL cut it")
        )
    return len(too_long)


def train_dataset(plan: TrainingPlan, rows):
    """The rows as a datasets.Dataset of the trainer's columns (other columns kept for GRPO's reward)."""
    from datasets import Dataset

    required, optional = ROW_KEYS[plan.trainer]
    if plan.trainer == "grpo":
        return Dataset.from_list([dict(r.data) for r in rows])
    keys = required + tuple(k for k in optional if all(k in r.data for r in rows))
    return Dataset.from_list([{k: r.data[k] for k in keys} for r in rows])


# ---------------------------------------------------------------------------------------------- config


def config_kwargs(plan: TrainingPlan, common: dict) -> dict:
    """The trainer config's arguments: TrainingArguments' (``common``) and the trainer's own, from the plan."""
    # activation_offloading is SFTConfig's own field (TRL 1.16: GRPOConfig and ORPOConfig refuse the keyword); the plan
    # refuses offloading for every other trainer (plan.py), so leaving it out changes nothing
    sft_only = ("max_length", "truncation_mode", "packing", "padding_free", "activation_offloading")
    kw = {k: v for k, v in common.items() if k not in sft_only}
    t = plan.trainer
    if t in ("dpo", "orpo", "kto", "reward"):
        kw["max_length"] = plan.seq_len
    if t in ("dpo", "kto"):
        kw["precompute_ref_log_probs"] = bool(setting(plan, "precompute_ref_log_probs"))
    if t == "dpo":
        kw["loss_type"] = [setting(plan, "loss_type")]
    if t in ("dpo", "orpo", "kto", "grpo"):
        kw["beta"] = float(setting(plan, "beta"))
    if t == "grpo":
        for name in ("num_generations", "max_completion_length", "generation_batch_size", "steps_per_generation",
                     "loss_type", "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_max_model_length"):
            value = setting(plan, name)
            if value is not None:
                kw[name] = value
    return kw


def _config_class(trainer: str):
    if trainer == "orpo":
        from trl.experimental.orpo import ORPOConfig

        return ORPOConfig
    import trl

    names = {"dpo": "DPOConfig", "kto": "KTOConfig", "reward": "RewardConfig", "grpo": "GRPOConfig"}
    return getattr(trl, names[trainer])


def _trainer_class(trainer: str):
    if trainer == "orpo":
        from trl.experimental.orpo import ORPOTrainer

        return ORPOTrainer
    import trl

    return getattr(trl, TRAINER_CLASSES[trainer])


# ---------------------------------------------------------------------------------------------- models


def load_model(plan: TrainingPlan, source: str, *, sequence_classification: bool = False):
    """The base model as TRL loads it for ``plan`` (no adapters: the trainer applies ``peft_config``)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from . import model_setup

    qconfig = model_setup.quantization_config(plan)
    dtype = model_setup.weight_dtype(plan) if qconfig is None else model_setup.torch_dtype(plan)
    kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": plan.attn_implementation}
    if qconfig is not None:
        kwargs["quantization_config"] = qconfig
    if sequence_classification:
        kwargs["num_labels"] = 1  # RewardTrainer: one scalar per sequence
        model = AutoModelForSequenceClassification.from_pretrained(source, **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    if plan.method == "full":
        model.requires_grad_(True)
    return model


def peft_config(plan: TrainingPlan):
    """The plan's LoraConfig for the trainer (task SEQ_CLS for a reward model: the score head trains in full)."""
    from . import model_setup

    config = model_setup.lora_config(plan)
    if config is not None and plan.trainer == "reward":
        config.task_type = "SEQ_CLS"
        config.modules_to_save = sorted(set(config.modules_to_save or []) | {"score"})
    return config


def load_reward_function(recipe_dir: Path | None):
    """``reward`` from the recipe's reward.py (GRPO). The file is the user's code, run as the recipe says."""
    path = (recipe_dir or Path.cwd()) / REWARD_FILE
    if not path.is_file():
        raise RecipeError(f"grpo: {str(path)!r} does not exist; a GRPO recipe holds its reward function in "
                          f"{REWARD_FILE} (make the recipe again, or write one defining reward(prompts, completions, "
                          "**kwargs) -> list of floats)")
    spec = importlib.util.spec_from_file_location("canifinetune_recipe_reward", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except Exception as exc:
        raise RecipeError(f"grpo: {REWARD_FILE} failed to load: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, "reward", None)
    if not callable(fn):
        raise RecipeError(f"grpo: {REWARD_FILE} must define reward(prompts, completions, **kwargs)")
    return fn


def build_trainer(plan: TrainingPlan, *, source: str, tokenizer, dataset, common: dict, recipe_dir: Path | None):
    """The TRL trainer for ``plan`` over ``dataset`` (a datasets.Dataset of the trainer's columns)."""
    t = plan.trainer
    args = _config_class(t)(**config_kwargs(plan, common))
    model = load_model(plan, source, sequence_classification=(t == "reward"))
    kwargs: dict[str, Any] = {"model": model, "args": args, "train_dataset": dataset, "processing_class": tokenizer}
    lora = peft_config(plan)
    if lora is not None:
        kwargs["peft_config"] = lora
    if t in ("dpo", "kto") and reference_of(plan) == "copy":
        ref = load_model(plan, source)  # a second frozen model, loaded like the policy
        ref.requires_grad_(False)
        ref.eval()
        kwargs["ref_model"] = ref
    if t == "reward":
        model.config.pad_token_id = tokenizer.pad_token_id
    if t == "grpo":
        kwargs["reward_funcs"] = load_reward_function(recipe_dir)
    return _trainer_class(t)(**kwargs)


def check_prepared(plan: TrainingPlan, trainer, rows: int) -> None:
    """TRL drops some rows it cannot fit (DPO: prompts filling max_length; reward: pairs over it): none may go."""
    data = trainer.train_dataset
    kept = len(data) if hasattr(data, "__len__") else rows
    if kept != rows:
        raise RecipeError(f"dataset: {TRAINER_TITLES[plan.trainer]} kept {kept} of {rows} rows (it drops rows longer "
                          f"than max_length {plan.seq_len}); raise seq_len or shorten them")
    columns = getattr(data, "column_names", []) or []
    for a, b in (("chosen_ids", None), ("rejected_ids", None), ("prompt_ids", "chosen_ids"),
                 ("prompt_ids", "rejected_ids"), ("prompt_ids", "completion_ids")):
        if a in columns and (b is None or b in columns) and plan.trainer in ("dpo", "kto", "reward"):
            if plan.trainer != "reward" and b is None:
                continue
            longest = max(len(x) + (len(y) if b else 0)
                          for x, y in zip(data[a], data[b] if b else data[a], strict=True))  # columns of one table
            if longest > plan.seq_len and not plan.truncation:
                raise RecipeError(f"dataset: a prepared sample is {longest} tokens, longer than seq_len {plan.seq_len}")
