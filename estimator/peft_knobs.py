"""PEFT's ``modules_to_save`` and ``use_dora`` as a plan names them: which modules the memory model can train as
copies, checked against the model. What the two knobs add to a step's memory is estimator/peft_memory.py.
"""


from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import PlanError

if TYPE_CHECKING:  # pragma: no cover
    from .plan import TrainingPlan
    from .spec import ModelSpec

EMBEDDING = "embed_tokens"
HEAD = "lm_head"
MODELLED_MODULES_TO_SAVE = (EMBEDDING, HEAD)
# Module names of a decoder outside its linears that PEFT's suffix match can reach (peft/utils/other.py _set_trainable
# matches ``key.endswith(name)``): trained in full by PEFT, not modelled here yet.
_OTHER_MODULES = (
    "norm", "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm",
    "self_attn", "mlp", "layers", "model", "rotary_emb", "experts", "gate", "router", "shared_expert",
    "shared_expert_gate",
)


# ---------------------------------------------------------------------------
# resolution


def resolve_modules_to_save(plan: TrainingPlan, spec: ModelSpec) -> tuple[str, ...]:
    """The plan's modules_to_save, checked against the model: embed_tokens and lm_head are modelled; a module the
    model has but the memory model does not train in full yet is refused, and so is a name the model does not have
    (PlanError on field modules_to_save, naming the valid choices)."""
    names = tuple(plan.modules_to_save or ())
    if not names:
        return ()
    linears = spec.linear_names()
    known = set(MODELLED_MODULES_TO_SAVE) | set(linears) | set(_OTHER_MODULES)
    if spec.qk_norm != "none":
        known |= {"q_norm", "k_norm"}
    unknown = [n for n in names if n.rsplit(".", 1)[-1] not in known]
    if unknown:
        raise PlanError(
            f"modules_to_save: this model has no module named {', '.join(repr(n) for n in unknown)}; choose from "
            f"{', '.join(MODELLED_MODULES_TO_SAVE)} (the embedding and the LM head)",
            field="modules_to_save",
        )
    unmodelled = [n for n in names if n.rsplit(".", 1)[-1] not in MODELLED_MODULES_TO_SAVE]
    if unmodelled:
        raise PlanError(
            f"modules_to_save: training {', '.join(repr(n) for n in unmodelled)} in full beside the adapters is not "
            f"modelled yet; the estimate models {', '.join(MODELLED_MODULES_TO_SAVE)} (use target_modules to adapt "
            "block linears with LoRA instead)",
            field="modules_to_save",
        )
    return tuple(sorted({n.rsplit(".", 1)[-1] for n in names}))
