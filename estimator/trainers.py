"""Trainers beyond SFT: what follows from a plan's trainer fields (the tables of which fields each TRL 1.16 trainer
has, and their defaults, are estimator/trainer_fields.py's, below the plan).

What follows from the fields alone lives here, below the memory model that needs it: the fields with their
defaults filled in (``resolved_trainer_fields``), where the reference log-probabilities come from
(``reference_mode``), and the combinations the memory model refuses (``check_supported``, called when a plan is
resolved). Their memory is estimator/trainer_memory.py's.
"""

from __future__ import annotations

from typing import Any

from .errors import PlanError
from .plan import TrainingPlan
from .trainer_fields import TRAINER_CLASSES, TRAINER_DEFAULTS, TRAINER_FIELDS, TRAINERS, refused_fields

# the tables are estimator/trainer_fields.py's (below the plan); they are read through this module too
__all__ = ["TRAINERS", "TRAINER_CLASSES", "TRAINER_DEFAULTS", "TRAINER_FIELDS", "check_supported", "packing_problem",
           "reference_mode", "refused_fields", "resolved_trainer_fields"]

def resolved_trainer_fields(plan: TrainingPlan) -> dict[str, Any]:
    """The plan's trainer fields with null replaced by the trainer's TRL 1.16 default (TRAINER_DEFAULTS).
    GRPO: generation_batch_size defaults to batch_size x num_gpus x steps_per_generation, steps_per_generation to
    gradient_accumulation_steps (grpo_config.py __post_init__)."""
    defaults = TRAINER_DEFAULTS.get(plan.trainer, {})
    out: dict[str, Any] = {}
    for name, owners in TRAINER_FIELDS.items():
        if plan.trainer not in owners:
            continue
        value = getattr(plan, name)
        out[name] = defaults.get(name) if value is None else value
    if plan.trainer == "grpo":
        steps = out.get("steps_per_generation") or plan.gradient_accumulation_steps
        out["steps_per_generation"] = steps
        if out.get("generation_batch_size") is None:
            out["generation_batch_size"] = plan.batch_size * plan.num_gpus * int(steps)
    return out


def packing_problem(plan: TrainingPlan) -> str | None:
    """Why the plan's packing/padding_free cannot be estimated and trained as it says, or None: both are SFTTrainer
    settings (the recipe passes them to SFTConfig); the other trainers' recipes and memory model take padded rows.
    The estimate (``check_supported``) and the runtime (recipes/runtime.py) refuse with this one message."""
    name = "packing" if plan.packing else "padding_free" if plan.padding_free else None
    if name is None or plan.trainer == "sft":
        return None
    return (f"{name}: packed and padding-free rows are estimated and trained for trainer sft only (TRL's "
            f"SFTTrainer); set {name}: false for trainer '{plan.trainer}'")


def check_supported(plan: TrainingPlan) -> None:
    """Refuse, naming why, what estimator/trainer_memory.py cannot model or the harness cannot measure."""
    packing = packing_problem(plan)
    if packing is not None:
        raise PlanError(packing, field="packing" if plan.packing else "padding_free")
    if plan.trainer == "reward" and plan.method == "full" and plan.optim not in ("adamw_torch_fused", "adamw_torch"):
        raise PlanError("optim: a fully fine-tuned reward model is estimated with adamw_torch_fused or adamw_torch "
                        f"only (its input embedding's optimizer states and step under '{plan.optim}' are not "
                        "modelled)", field="optim")
    if plan.trainer == "reward" and plan.modules_to_save:
        raise PlanError("modules_to_save: not modelled for the reward trainer (PEFT's SEQ_CLS task already trains "
                        "the score head)", field="modules_to_save")
    if plan.sharding != "none" or plan.num_gpus > 1:
        raise PlanError(f"trainer: '{plan.trainer}' is estimated on one GPU only (the reference model's and the "
                        "generation's sharding are not modelled); set num_gpus 1", field="trainer")
    if plan.framework != "trl":
        raise PlanError(f"trainer: '{plan.trainer}' is TRL's trainer; set framework 'trl'", field="framework")
    fields = resolved_trainer_fields(plan)
    if reference_mode(plan) == "copy" and plan.method == "qlora":
        raise PlanError("reference_model: a separate quantized reference copy beside a QLoRA policy is not modelled; "
                        "use 'adapter_disabled' (TRL's default with PEFT) or precompute_ref_log_probs",
                        field="reference_model")
    if reference_mode(plan) == "adapter_disabled" and not plan.uses_adapters:
        raise PlanError("reference_model: 'adapter_disabled' needs a LoRA/QLoRA policy (the reference is the base "
                        "with its adapters disabled); with full fine-tuning use 'copy' or precompute",
                        field="reference_model")
    if plan.trainer == "dpo" and fields.get("loss_type") not in ("sigmoid", "hinge", "ipo", "robust", "bco_pair",
                                                                  "sppo_hard", "apo_zero", "apo_down", "sigmoid_norm",
                                                                  "exo_pair", "nca_pair", "discopop"):
        raise PlanError(f"loss_type: DPO loss '{fields.get('loss_type')}' is not one of TRL 1.16's per-sequence "
                        "losses modelled", field="loss_type")
    if plan.trainer == "grpo":
        completion = int(fields["max_completion_length"])
        if completion >= plan.seq_len:
            raise PlanError(f"max_completion_length: {completion} must be below seq_len {plan.seq_len} (seq_len is "
                            "GRPO's longest prompt plus completion)", field="max_completion_length")
        _check_grpo(plan, fields)


# GRPO losses TRL 1.16 takes with its default importance_sampling_level 'token' (grpo_config.py, grpo_trainer.py
# __init__: 'luspo' needs the sequence level, which the plan cannot set); each is a per-token loss over the same
# tensors, so one memory model serves them all
GRPO_LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo", "cispo", "sapo", "vespo")


def _check_grpo(plan: TrainingPlan, fields: dict[str, Any]) -> None:
    """What TRL 1.16's GRPOConfig.__post_init__ and GRPOTrainer.__init__ refuse, refused here with their reasons."""
    if plan.generation_batch_size is not None and plan.steps_per_generation is not None:
        raise PlanError("steps_per_generation: 'generation_batch_size' and 'steps_per_generation' can not be both "
                        "configured (TRL 1.16 grpo_config.py); give one", field="steps_per_generation")
    groups = int(fields["num_generations"])
    if groups < 2:
        raise PlanError(f"num_generations: GRPO needs at least 2 completions per prompt to compute its advantages; "
                        f"got {groups}", field="num_generations")
    gen = int(fields["generation_batch_size"])
    if gen % groups != 0:
        raise PlanError(f"generation_batch_size: {gen} must be a multiple of num_generations {groups} "
                        "(grpo_config.py)", field="generation_batch_size")
    global_batch = plan.batch_size * plan.num_gpus
    if gen % global_batch != 0:
        raise PlanError(f"generation_batch_size: {gen} must be a multiple of the global batch batch_size x num_gpus "
                        f"= {global_batch} (grpo_config.py)", field="generation_batch_size")
    loss = fields.get("loss_type")
    if loss not in GRPO_LOSS_TYPES:
        raise PlanError(f"loss_type: '{loss}' is not a GRPO loss of TRL 1.16 that runs with its default settings; use "
                        f"one of {', '.join(GRPO_LOSS_TYPES)}", field="loss_type")
    if loss == "vespo" and fields.get("use_vllm"):
        raise PlanError("loss_type: 'vespo' with use_vllm needs vllm_importance_sampling_correction off, which the "
                        "plan cannot set (grpo_trainer.py); use 'dapo' or generate without vLLM", field="loss_type")
    limit = fields.get("vllm_max_model_length")
    if fields.get("use_vllm") and limit is not None and int(limit) < plan.seq_len:
        raise PlanError(f"vllm_max_model_length: {limit} is below seq_len {plan.seq_len} (the longest prompt plus its "
                        "completion): vLLM refuses longer sequences; raise it to seq_len or leave it null",
                        field="vllm_max_model_length")


def reference_mode(plan: TrainingPlan) -> str:
    """Where the reference log-probabilities come from, as TRL 1.16 decides it.

    DPO/KTO (dpo_trainer.py / kto_trainer.py __init__): ``precompute_ref_log_probs`` -> 'none' (computed once
    before training, read from the dataset); otherwise the plan's ``reference_model``; by default a PEFT policy uses
    its base with adapters disabled (``use_adapter(model, None)``, no second model) and a full fine-tune loads a
    second frozen copy (``create_model_from_path``, in the policy's dtype). GRPO (grpo_trainer.py): no reference at
    all when beta == 0 (its default), else as DPO. ORPO and reward modelling have none."""
    if plan.trainer not in ("dpo", "kto", "grpo"):
        return "none"
    fields = resolved_trainer_fields(plan)
    if plan.trainer == "grpo" and not fields.get("beta"):
        return "none"
    if fields.get("precompute_ref_log_probs"):
        return "none"
    if plan.reference_model is not None:
        return plan.reference_model
    return "adapter_disabled" if plan.uses_adapters else "copy"
