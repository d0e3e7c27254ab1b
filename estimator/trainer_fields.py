"""Which plan fields belong to which TRL 1.16 trainer, and their defaults: the tables the plan validates against.

TRL 1.16 (read in its config classes: trl/trainer/dpo_config.py, kto_config.py, reward_config.py,
grpo_config.py; ORPO lives in trl/experimental/orpo) gives each trainer its own memory-relevant settings. The
plan holds them under TRL's names, null meaning "the trainer's default" below; a field set for a trainer that
has no such setting is refused by the plan, naming it. Below the plan (which imports these tables); what follows
from a plan's fields is estimator/trainers.py, above it.
"""

from __future__ import annotations

TRAINERS: tuple[str, ...] = ("sft", "dpo", "orpo", "kto", "reward", "grpo")

# The TRL 1.16 class that trains each trainer (ORPO's lives in trl.experimental.orpo): what the text names
TRAINER_CLASSES: dict[str, str] = {
    "sft": "SFTTrainer",
    "dpo": "DPOTrainer",
    "orpo": "ORPOTrainer",
    "kto": "KTOTrainer",
    "reward": "RewardTrainer",
    "grpo": "GRPOTrainer",
}

# plan field -> the trainers that have it
TRAINER_FIELDS: dict[str, frozenset[str]] = {
    "precompute_ref_log_probs": frozenset({"dpo", "kto"}),
    "reference_model": frozenset({"dpo", "kto", "grpo"}),
    "loss_type": frozenset({"dpo", "grpo"}),
    "beta": frozenset({"dpo", "orpo", "kto", "grpo"}),
    "num_generations": frozenset({"grpo"}),
    "max_completion_length": frozenset({"grpo"}),
    "generation_batch_size": frozenset({"grpo"}),
    "steps_per_generation": frozenset({"grpo"}),
    "use_vllm": frozenset({"grpo"}),
    "vllm_mode": frozenset({"grpo"}),
    "vllm_gpu_memory_utilization": frozenset({"grpo"}),
    "vllm_max_model_length": frozenset({"grpo"}),
}

# TRL 1.16's defaults for the fields above, per trainer (the config classes' field defaults)
TRAINER_DEFAULTS: dict[str, dict[str, object]] = {
    "dpo": {"precompute_ref_log_probs": False, "loss_type": "sigmoid", "beta": 0.1},  # dpo_config.py
    "orpo": {"beta": 0.1},  # experimental/orpo/orpo_config.py (lambda of the odds-ratio term)
    "kto": {"precompute_ref_log_probs": False, "beta": 0.1},  # kto_config.py
    "reward": {},
    "grpo": {  # grpo_config.py
        "num_generations": 8,
        "max_completion_length": 512,
        "beta": 0.0,
        "loss_type": "dapo",
        "use_vllm": False,
        "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": 0.3,
    },
}


def refused_fields(trainer: str, values: dict[str, object]) -> list[str]:
    """The trainer fields set (not null) in ``values`` that ``trainer`` does not have."""
    return [name for name, owners in TRAINER_FIELDS.items() if values.get(name) is not None and trainer not in owners]
