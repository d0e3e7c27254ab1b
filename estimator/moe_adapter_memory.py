"""PEFT's LoRA on fused MoE experts (ParamWrapper adapters): what they add to a step beyond their factors.

The factors themselves are inventory records (estimator/inventory.py ``expert_adapter_records``); which plans get them
and their shapes are estimator/moe_adapters.py's. Here: the merged expert weights a block keeps for backward and the
merged-weight gradient inside its backward, registered with the memory terms as ``EXPERT_ADAPTER_TERMS``
(estimator/knob_terms.py). Read from PEFT 0.21 (peft/tuners/lora/layer.py ``_LoraFactorsProxy``) and transformers 5.24
(integrations/moe.py).
"""

from __future__ import annotations

from dataclasses import replace

from .allocator import round_block
from .constants import DTYPE_BYTES
from .knob_terms import BlockPart, KnobTerms
from .moe_adapters import expert_adapter_shapes
from .resolved import ResolvedPlan


def expert_adapter_saved_bytes(r: ResolvedPlan) -> int:
    """What PEFT 0.21's ParamWrapper adapters on the fused experts add to an MoE block's saved tensors
    (0 without expert adapters; estimator/moe_adapters.py says which plans get them).

    Each forward, ``_LoraFactorsProxy`` (peft/tuners/lora/layer.py) builds the merged weight
    W' = baddbmm(W, B, A, alpha=scaling) for gate_up_proj and for down_proj, full-size and in the weight
    dtype w (the frozen dtype: bf16, fp32 for mixed precision or after kbit preparation); transformers'
    grouped-mm experts forward (integrations/moe.py) keeps W' for the input gradient and, W' requiring
    grad, its input for the weight gradient. So per block:

    - the merged experts: w·E·(2I·H + H·I) when both are adapted (w·E·3·H·I), the layer's expert weights
      again;
    - the casts of the factors to w (``lhs.to(W.dtype)``, ``rhs.to(W.dtype)``, kept by baddbmm) when the
      adapter dtype differs from w: w·E·(r_gu·(H + 2I) + r_down·(I + H)); none for bf16 adapters on a bf16
      base (the casts return the parameters' views);
    - the down projection's input, the act x up product (a·top_k·T·I), when down_proj is adapted;
    - the router: its merged weight W + (B @ A)·scaling (w·E·H, kept by F.linear) and its input, the
      normalized hidden states (a·T·H), when the router is adapted.
    """
    if not r.expert_adapters:
        return 0
    spec = r.spec
    moe = spec.moe
    lora = r.expert_lora
    assert moe is not None and lora is not None
    w = DTYPE_BYTES[r.frozen_dtype]
    a = r.act_bytes
    e, h, i = moe.num_experts, spec.hidden_size, moe.expert_intermediate
    saved = 0
    if lora.gate_up_rank:
        saved += round_block(w * e * 2 * i * h)
    if lora.down_rank:
        saved += round_block(w * e * h * i)
        saved += round_block(a * r.tokens * moe.top_k * i)
    if r.adapter_dtype != r.frozen_dtype:
        stacked = expert_adapter_shapes(replace(lora, router_rank=0), e, h, i)
        saved += sum(round_block(w * rows * cols) for rows, cols in stacked)
    if lora.router_rank:
        saved += round_block(w * e * h) + round_block(a * r.tokens * h)
    return saved


def expert_adapter_backward_bytes(r: ResolvedPlan) -> int:
    """The merged-weight gradient inside an MoE block's backward with PEFT expert adapters (0 without).

    The grouped-mm backward of an adapted expert projection writes dW', full-size in the weight dtype w,
    before baddbmm's backward reduces it to the factors' gradients. down_proj runs first: its dW'
    (w·E·H·I) coexists with both merged weights; then its W' is released and gate_up_proj's dW'
    (w·E·2I·H) is made. Extra at the worst moment: max(dW'_down, dW'_gate_up - W'_down), w·E·H·I when
    both are adapted (w·E·2I·H when only gate_up_proj is).
    """
    if not r.expert_adapters:
        return 0
    moe = r.spec.moe
    lora = r.expert_lora
    assert moe is not None and lora is not None
    w = DTYPE_BYTES[r.frozen_dtype]
    e, h, i = moe.num_experts, r.spec.hidden_size, moe.expert_intermediate
    down = round_block(w * e * h * i) if lora.down_rank else 0
    gate_up = round_block(w * e * 2 * i * h) if lora.gate_up_rank else 0
    return max(down, gate_up - down)


def _saved_in_block(r: ResolvedPlan, layer: int) -> dict[BlockPart, int]:
    return {BlockPart.MOE: expert_adapter_saved_bytes(r)} if r.spec.is_moe_layer(layer) else {}


def _backward_in_block(r: ResolvedPlan, layer: int) -> int:
    return expert_adapter_backward_bytes(r) if r.spec.is_moe_layer(layer) else 0


EXPERT_ADAPTER_TERMS = KnobTerms("expert adapters", block_saved=_saved_in_block, mlp_backward=_backward_in_block)
