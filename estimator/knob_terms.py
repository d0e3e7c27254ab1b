"""What a knob adds to a training step for part of it: the hooks its own module fills in.

A knob's tensors that live through the whole step are inventory records (estimator/inventory.py ``BUILDERS``). What
it adds for part of a step -- a block's saved tensors, a temporary in a block's forward or backward, what the loss
keeps, the gradient of a trainable head -- its module describes in one :class:`KnobTerms`, which memory.py's
``KNOB_TERMS`` lists beside the others. The memory terms fold over that list and never name a knob, so adding a knob
touches its own module, the plan and the validation harness (CONTRIBUTING.md, "Add a knob").

Below the resolved plan and above nothing that computes memory, so every knob module can import it.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import NamedTuple

from .resolved import ResolvedPlan


class BlockPart(Enum):
    """What part of a decoder block a saved tensor belongs to (memory.py ``block_saved_parts``)."""

    # members are singletons: identity hashing (in C) instead of Enum's hash of the name (Python); every estimate
    # keys a dict of parts per block kind
    __hash__ = object.__hash__

    NORMS = "norms"  # RMSNorms' fp32 inputs (and outputs when their weights train), q/k norms
    ATTENTION = "attention"  # q/k/v's input when their weights train, the kernel's tensors, mask and views
    MLP = "mlp"  # a dense block's gated MLP
    MOE = "moe"  # an MoE block's router, routed and shared experts, expert adapters
    ADAPTER_INPUTS = "adapter inputs"  # LoRA's own saved tensors: its input (cast, dropped out or the block's own)
    INT8_INPUTS = "8-bit inputs"  # what bitsandbytes' 8-bit matmul keeps of its input
    DORA = "DoRA"  # DoRA's base and LoRA results and weight copies
    WEIGHT_CASTS = "weight casts"  # autocast's compute-dtype copies of fp32 linear weights (mixed precision)


def _none(r: ResolvedPlan) -> int:
    return 0


def _none_in_block(r: ResolvedPlan, layer: int) -> int:
    return 0


def _no_parts(r: ResolvedPlan, layer: int) -> dict[BlockPart, int]:
    return {}


class KnobTerms(NamedTuple):
    """One knob's transient memory, hook by hook; a hook it leaves unset adds nothing. Each returns bytes on one GPU.

    - ``block_saved(r, layer)``: what a block of the kind starting at ``layer`` saves for backward, by part;
    - ``mlp_backward(r, layer)``: added to the MLP figure of that block's backward (memory.py
      ``layer_backward_transient_bytes``);
    - ``adapter_forward(r)``: added to the widest adapter's forward temporaries (``adapter_forward_transient_bytes``);
    - ``loss_saved(r, frozen_head_cast)``: what the standard loss keeps beyond the logits (``loss_forward_bytes``);
      ``frozen_head_cast`` is memory.lm_head_cast_bytes(r);
    - ``loss_backward(r)``: added to the chunked head's backward (``loss_backward_bytes``);
    - ``head_gradient(r)``: a trainable head's gradient, made at the loss end of backward (phases.py);
    - ``head_moment(r, frozen_head_cast)``: what the knob keeps while the standard loss's head matmul runs backward,
      beside the logits' gradient (phases.py ``_head_moment``).
    """

    name: str
    block_saved: Callable[[ResolvedPlan, int], dict[BlockPart, int]] = _no_parts
    mlp_backward: Callable[[ResolvedPlan, int], int] = _none_in_block
    adapter_forward: Callable[[ResolvedPlan], int] = _none
    loss_saved: Callable[[ResolvedPlan, int], int] = _none_in_block
    loss_backward: Callable[[ResolvedPlan], int] = _none
    head_gradient: Callable[[ResolvedPlan], int] = _none
    head_moment: Callable[[ResolvedPlan, int], int] = _none_in_block
