"""LoRA on MoE experts as PEFT 0.21 applies it to transformers 5's fused expert weights.

transformers 5 stores an MoE block's experts as two 3-D parameters, ``experts.gate_up_proj`` (E, 2I, H)
and ``experts.down_proj`` (E, H, I), and its router as a module with a 2-D ``weight`` (E, H): none of
them is an ``nn.Linear``. For the model types whose transformers v4 -> v5 conversion PEFT knows, PEFT
0.21 rewrites the adapter config so that what targeted the v4 ``nn.Linear`` experts now targets those
parameters (``peft/utils/transformers_weight_conversion.py``: ``_convert_peft_config_moe``, called from
``BaseTuner.inject_adapter`` in ``peft/tuners/tuners_utils.py``):

- ``target_modules="all-linear"`` is resolved to every ``nn.Linear`` leaf name **plus** every v4 expert
  name of the family (``_resolve_string_target_modules``), so it adapts the experts and the router;
- a list is remapped name by name: a v4 expert name (Mixtral ``w1``/``w3``/``w2``, Qwen2-MoE-style
  ``gate_proj``/``up_proj``/``down_proj``, and ``gate`` for the router) becomes a ``target_parameters``
  entry; other names stay module targets. Naming only one of two names fused into ``gate_up_proj``
  raises ``ValueError``. An attention-only list therefore adapts no expert;
- when both fused names are targeted, ``rank_pattern``/``alpha_pattern`` give ``gate_up_proj`` rank
  2r (and alpha 2·alpha: the scaling is unchanged).

Each targeted parameter gets a ``lora.ParamWrapper`` (``peft/tuners/lora/layer.py``): for a 3-D
parameter, ``lora_A = nn.Linear(in, r·E)`` and ``lora_B = nn.Linear(r·E, out)`` (an r-rank adapter per
expert, stacked), with in/out swapped to the parameter's (E, out, in) layout (transformers' experts are
not ``is_transposed``); for the 2-D router weight an ordinary r-rank pair. ``ParamWrapper`` refuses
``lora_dropout != 0`` and DoRA (``ValueError`` at ``get_peft_model``). In forward it registers a
parametrization: for one adapter on a 3-D parameter ``_LoraFactorsProxy`` computes
``torch.baddbmm(W, lhs.to(W.dtype), rhs.to(W.dtype), alpha=scaling)``, a full-size merged copy W' of the
layer's experts in the weight dtype (autocast disabled); transformers' grouped-mm experts forward then
runs on W', and since W' requires grad autograd keeps it (and the down projection's input) for
backward, whose weight gradient dW' is full-size too. For the router, ``_LoraParameterProxy`` adds
``(B @ A)·scaling`` cast to W's dtype: W + ΔW, E x H.

Which families this applies to is the table below (model types the estimator knows as MoE).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import PlanError

# model_type -> the v4 expert names PEFT 0.21 maps onto v5 parameters, and the names fused into gate_up_proj.
# Source: peft/utils/transformers_weight_conversion.py (0.21.2): _MODEL_TO_CONVERSION_PATTERN (transformers
# 5.24 transformers/conversion_mapping.py, plus PEFT's own "mixtral": "mixtral") selects the base pattern;
# _MOE_TARGET_MODULE_MAPPING and _MOE_FUSED_TARGETS exist for the bases "mixtral" and "qwen2_moe" only.
# "qwen2_moe" itself is a base pattern but not a key of _MODEL_TO_CONVERSION_PATTERN, so PEFT converts nothing
# for Qwen1.5-MoE / Qwen2-MoE: all-linear adapts its attention and shared expert (nn.Linear) and no expert.
_MIXTRAL = {"gate": "router", "w1": "gate_up_proj", "w3": "gate_up_proj", "w2": "down_proj"}
_QWEN2_MOE = {"gate": "router", "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj", "down_proj": "down_proj"}
PEFT_EXPERT_TARGETS: dict[str, dict[str, str]] = {
    "mixtral": _MIXTRAL,
    "qwen3_moe": _QWEN2_MOE,  # transformers: "qwen3_moe": "qwen2_moe"
    "olmoe": _QWEN2_MOE,  # transformers: "olmoe": "qwen2_moe"
}
# names that PEFT fuses into gate_up_proj (both or neither must be targeted), per family
PEFT_FUSED_GATE_UP: dict[str, tuple[str, ...]] = {
    "mixtral": ("w1", "w3"),
    "qwen3_moe": ("gate_proj", "up_proj"),
    "olmoe": ("gate_proj", "up_proj"),
}
# module names inside an MoE block that are not nn.Linear: PEFT refuses them as target_modules
_NOT_LINEAR = ("experts", "gate_up_proj")


@dataclass(frozen=True)
class ExpertLoRA:
    """Ranks of PEFT's ParamWrapper adapters in each MoE block (0: that parameter is not adapted)."""

    gate_up_rank: int  # experts.gate_up_proj (E, 2I, H): 2r when both fused names are targeted
    down_rank: int  # experts.down_proj (E, H, I)
    router_rank: int  # the router's weight (E, H)

    @property
    def any(self) -> bool:
        return bool(self.gate_up_rank or self.down_rank or self.router_rank)


def resolve_expert_targets(
    model_type: str, is_moe: bool, plan_targets, lora_r: int, lora_dropout: float, use_dora: bool
) -> tuple[ExpertLoRA | None, frozenset[str], tuple[str, ...]]:
    """(expert adapters or None, the target names PEFT consumed as expert names, warnings) for a plan's
    ``target_modules`` ("all-linear", a list, or None for PEFT's default). Raises PlanError where PEFT 0.21
    raises: one of two fused names alone, and lora_dropout > 0 or DoRA on expert parameters."""
    mapping = PEFT_EXPERT_TARGETS.get(model_type)
    if not is_moe:
        return None, frozenset(), ()
    if isinstance(plan_targets, list):
        refused = [n for n in plan_targets if n in _NOT_LINEAR]
        if refused:
            hint = f"'all-linear' or {', '.join(sorted(mapping))}" if mapping else "'all-linear'"
            raise PlanError(
                f"target_modules: {refused} name the fused expert weights, which are not nn.Linear modules; PEFT 0.21 "
                f"refuses them. To adapt the experts use {hint}",
                field="target_modules",
            )
    if mapping is None or plan_targets is None:
        return None, frozenset(), ()
    if plan_targets == "all-linear":
        chosen = set(mapping)
    else:
        chosen = {n for n in plan_targets if n in mapping}
    if not chosen:
        return None, frozenset(), ()
    fused = PEFT_FUSED_GATE_UP[model_type]
    present = [n for n in fused if n in chosen]
    if present and len(present) < len(fused):
        missing = [n for n in fused if n not in chosen]
        raise PlanError(
            f"target_modules: PEFT 0.21 cannot target {present} without also targeting {missing}: transformers 5 "
            "fuses them into one experts.gate_up_proj parameter",
            field="target_modules",
        )
    gate_up = lora_r * len(fused) if present else 0
    down = lora_r if any(mapping[n] == "down_proj" for n in chosen) else 0
    router = lora_r if any(mapping[n] == "router" for n in chosen) else 0
    experts = ExpertLoRA(gate_up, down, router)
    if (gate_up or down or router) and lora_dropout > 0:
        raise PlanError(
            f"lora_dropout: PEFT 0.21 adapts {model_type}'s fused expert weights with lora.ParamWrapper, which raises "
            f"'does not work with lora_dropout != 0' (target_modules {_describe(plan_targets)} reaches the experts/"
            "router); set lora_dropout to 0, or target the attention projections only",
            field="lora_dropout",
        )
    if use_dora:
        raise PlanError(
            "use_dora: PEFT 0.21's lora.ParamWrapper (LoRA on fused MoE expert weights) does not work with DoRA; "
            "target the attention projections only or turn use_dora off",
            field="use_dora",
        )
    return experts, frozenset(chosen), ()


def _describe(targets) -> str:
    return "'all-linear'" if targets == "all-linear" else str(list(targets))


def expert_adapter_shapes(experts: ExpertLoRA, num_experts: int, hidden: int, width: int) -> list[tuple[int, int]]:
    """(rows, cols) of the adapter weights of one MoE block, as PEFT 0.21 ParamWrapper creates them
    (nn.Linear weights are (out, in)): gate_up_proj (E, 2I, H): lora_A (r_gu·E, H), lora_B (2I, r_gu·E);
    down_proj (E, H, I): lora_A (r·E, I), lora_B (H, r·E); router weight (E, H): lora_A (r, H), lora_B (E, r)."""
    e, h, i = num_experts, hidden, width
    shapes: list[tuple[int, int]] = []
    if experts.gate_up_rank:
        shapes += [(experts.gate_up_rank * e, h), (2 * i, experts.gate_up_rank * e)]
    if experts.down_rank:
        shapes += [(experts.down_rank * e, i), (h, experts.down_rank * e)]
    if experts.router_rank:
        shapes += [(experts.router_rank, h), (e, experts.router_rank)]
    return shapes
