"""The phase-wise peak: what is alive at the end of forward, during backward and in the optimizer step.

A training step's peak is not the sum of every component: activations are freed as backward
produces gradients, the loss's logits tiles exist only around the loss, and the optimizer's
temporaries only in its step. This module evaluates the live set at each phase of a steady-state
step (the second and later ones, when optimizer states exist and ``zero_grad(set_to_none=True)``
has dropped the gradients) and returns the largest, itemized.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from . import memory as m
from . import peft_memory, term_cache, torchtune_memory, vision_memory
from .constants import DTYPE_BYTES
from .inventory import inventory_of
from .resolved import ResolvedPlan

if TYPE_CHECKING:  # imported where a plan has several GPUs (_static): one GPU never needs the sharding engines
    from . import sharding


class Item(NamedTuple):
    name: str
    bytes: int
    explanation: str


class PhasePeak(NamedTuple):
    phase: str  # "forward", "backward" or "optimizer"
    bytes: int
    items: tuple[Item, ...]


_GATHER_NOTE = ("all-gathered parameters: the layer running and the one prefetched (ZeRO-3/FSDP full shard), "
                "every layer until its backward (FSDP shard_grad_op), FSDP's unsharded tail unit "
                "(final norm + lm_head), and in backward the unsharded gradients before reduce-scatter")
_IN_BACKWARD_NOTE = ("optimizer in backward (torchtune's optimizer_in_bwd): each parameter is stepped and its gradient "
                     "freed as soon as it is made; no gradient set, no separate optimizer step")
_ACCUMULATED_NOTE = ("gradient accumulation: the earlier micro-batches' gradients, alive until the optimizer step "
                     "(none on the first micro-batch)")


class _Static(NamedTuple):
    """What one GPU holds through the whole step (``sh``: its sharding shares; None on one GPU)."""

    sh: sharding.Shares | None
    weights: int
    grads: int
    states: int
    buckets: int
    grad_factor: float
    gather: int  # all-gathered bytes in forward (ZeRO-3/FSDP)
    gather_bwd: int  # and in backward
    fsdp: sharding.FsdpGathered | None  # FSDP2: the gathered bytes vary within a phase (None elsewhere)
    items: tuple[Item, ...]
    bytes: int


class _Activations(NamedTuple):
    """The step's activation sizes: saved per block, shared, the loss's, and the forward's temporaries."""

    layer_full: dict[int, int]  # one block's full saved set, by layer kind
    boundary: int  # a checkpointed block's input
    saved_per_layer: dict[int, int]
    saved_layers: int  # every block's saved tensors at the end of forward
    shared: int
    loss_fwd: int
    loss_fwd_tmp: int
    loss_bwd: int
    loss_bwd_start: int  # what the loss holds as its backward starts (its forward's kept tensors less the logits)
    held: int  # logits the training loop holds through the whole step (LitGPT: memory.held_logits_bytes)
    forward_cache: int  # autocast's cached weight casts of checkpointed blocks, alive until the forward returns
    dequant: int  # a quantized linear's forward transient (also in checkpoint recomputation)
    dequant_backward: int  # and its input gradient's
    adapter_tmp: int
    brought_back: int  # activation offloading: block inputs back from the host while a block is back-propagated
    note: str


class _Live(NamedTuple):
    """The largest live set found in backward: its total, its gathered bytes and (activations, loss, grads, temps)."""

    bytes: int
    gather: int
    parts: tuple[int, int, int, int]


def step_peaks(r: ResolvedPlan, end_grad: int = 0) -> tuple[PhasePeak, PhasePeak, PhasePeak, dict[str, int]]:
    """The live set at the forward, backward and optimizer-step peaks, and the static sizes.

    ``r`` is the ResolvedPlan (as in estimator/memory.py). ``end_grad``: gradient bytes made by the very last op of
    backward and kept through the optimizer step, beyond ``r``'s own: a reward model's trainable input embedding
    (estimator/trainer_memory.py reward_embedding_grad_bytes; it has no lm_head, so its V x H gradient is made by
    the embedding's backward alone and becomes ``.grad``)."""
    st = term_cache.STATIC.get(r, _static)  # both kept across plans that differ only in what they never read
    acts = term_cache.ACTIVATIONS.get(r, _activations)
    forward = _forward_peak(r, st, acts)
    backward = _backward_peak(r, st, acts, end_grad)
    optimizer = _optimizer_peak(r, st, end_grad)
    sizes = {
        "weights": st.weights,
        "gradients": st.grads,
        "optimizer_states": st.states,
        "host_memory": (0 if st.sh is None else st.sh.host) + m.offload_host_bytes(r),
    }
    return forward, backward, optimizer, sizes


def _static(r: ResolvedPlan) -> _Static:
    """One GPU: every component whole. Several: estimator/sharding.py says what each GPU holds."""
    sh = None
    if r.plan.sharding != "none":
        from . import sharding

        sh = sharding.shares(r)
    workspace = m.workspace_bytes(r)
    if sh is None:
        weights, qconst, adapters = m.weight_bytes(r), m.quantization_constant_bytes(r), m.adapter_bytes(r)
        grads, states, buckets = m.gradient_bytes(r), m.optimizer_state_bytes(r), 0
        grad_factor, gather, gather_bwd = 1.0, 0, 0
    else:
        weights, qconst, adapters = sh.weights, sh.qconst, sh.adapters
        grads, states, buckets = sh.grads, sh.states + sh.master, sh.buckets
        grad_factor, gather, gather_bwd = sh.grad_factor, sh.gather_forward, sh.gather_backward
    items = (
        Item("weights", weights, _weights_note(r) if sh is None else _weights_note(r) + f"; {sh.note}"),
        Item("quantization_constants", qconst, "4-bit absmax/code tensors (or 8-bit row scales) of the quantized "
                                               "linears"),
        Item("lora_adapters", adapters, _adapter_note(r)),
        Item("optimizer_states", states, _optimizer_note(r) if sh is None else _sharded_optimizer_note(r, sh)),
        Item("cuda_workspaces", workspace, "cuBLAS workspace allocated through the caching allocator"),
    )
    return _Static(sh=sh, weights=weights, grads=grads, states=states, buckets=buckets, grad_factor=grad_factor,
                   gather=gather, gather_bwd=gather_bwd, fsdp=sh.fsdp if sh is not None else None,
                   items=items, bytes=sum(i.bytes for i in items))


def _activations(r: ResolvedPlan) -> _Activations:
    spec, groups, ckpt = r.spec, r.spec.layer_groups, r.plan.gradient_checkpointing
    layer_full = {i: m.layer_activation_bytes(r, i) for i, _ in groups}
    boundary = m.checkpoint_boundary_bytes(r)
    kept = {i: m.int8_kept_input_bytes(r, i) for i, _ in groups}  # 8-bit linears' inputs: never checkpointed
    offloaded = r.plan.activation_offloading  # with checkpointing (plan.py): the block inputs go to the host
    saved_per_layer = {i: (kept[i] if offloaded else boundary + kept[i]) if ckpt else layer_full[i] for i, _ in groups}
    if offloaded:
        saved_layers = m.offload_stash_bytes(r) + sum(kept[i] * n for i, n in groups)
    elif ckpt:
        # block inputs; block 0's input is the embedding output, already in the shared activations
        saved_layers = boundary * (spec.num_layers - 1) + sum(kept[i] * n for i, n in groups)
    else:
        saved_layers = sum(saved_per_layer[i] * n for i, n in groups)
    # Mllama's cross-attention layers keep more than the Llama layers counted in their place: each of them without
    # checkpointing, and the one recomputed (the largest block) with it
    cross = vision_memory.cross_attention_layer_extra_bytes(r)
    if cross:
        assert spec.vision is not None
        layer_full = {i: full + cross for i, full in layer_full.items()}
        if not ckpt:
            saved_layers += cross * len(spec.vision.cross_attention_layers)
    # autocast caches its casts of weights that require grad until the forward returns (torch autocast's
    # cached_cast, cleared when accelerate's autocast context exits): with checkpointing, every block's casts are alive
    # at the end of forward, though none is saved for backward (memory.weight_cast_bytes)
    casts = {i: m.weight_cast_bytes(r, i) for i, _ in groups} if (ckpt and r.full and r.fp32_weight_casts) else {}
    forward_cache = sum(casts[i] * n for i, n in groups) - max(casts.values()) if casts else 0
    forward_cache += vision_memory.image_outputs_bytes(r)  # held with the model's output until the loss is computed
    note = (
        f"gradient checkpointing: each of {spec.num_layers} blocks keeps its input (a·T·H)"
        + (" and its 8-bit linears' inputs (bitsandbytes keeps them past checkpointing)" if any(kept.values()) else "")
        if ckpt
        else f"{spec.num_layers} blocks x what each saves for backward (norms, attention, MLP, adapters)"
    )
    if offloaded:
        note = (f"gradient checkpointing with activation offloading: the {spec.num_layers} block inputs are copied to "
                f"host memory; the GPU keeps the last {m.OFFLOAD_FORWARD_STASH_TENSORS} until their copy ends, and "
                f"in backward {m.OFFLOAD_BROUGHT_BACK_INPUTS} brought back at a time")
    return _Activations(
        layer_full=layer_full, boundary=boundary, saved_per_layer=saved_per_layer, saved_layers=saved_layers,
        shared=m.shared_activation_bytes(r), loss_fwd=m.loss_forward_bytes(r) + m.lm_head_cast_bytes(r),
        loss_fwd_tmp=m.loss_forward_transient_bytes(r), loss_bwd=m.loss_backward_bytes(r),
        loss_bwd_start=m.loss_backward_start_bytes(r), held=m.held_logits_bytes(r), forward_cache=forward_cache,
        dequant=m.dequantization_bytes(r), dequant_backward=m.backward_dequantization_bytes(r),
        adapter_tmp=m.adapter_forward_transient_bytes(r), brought_back=m.offload_brought_back_bytes(r), note=note)


def _accumulated_grads(r: ResolvedPlan, st: _Static) -> int:
    """Gradients alive through a micro-step's forward and backward: with gradient accumulation, every micro-batch but
    the first runs with the earlier ones' gradients (Trainer and LitGPT's fit zero them only after the optimizer
    step; a new gradient is added to ``.grad`` in place), so the whole gradient set, as this GPU holds it (its share
    under sharding, estimator/sharding.py), is live from its forward on. 0 without accumulation (steady state:
    ``zero_grad(set_to_none=True)`` freed them). Measured: SmolLM2-360M full, 2048 x 2, accumulation 4: -15.1% without
    this term (cohort v13). Under FSDP the micro-batches before the last skip the reduce-scatter (accelerate 1.15
    ``no_sync``: FSDP2 ``set_requires_gradient_sync(False)``), so each GPU accumulates the whole unsharded gradients:
    counted whole (read from the source, not measured: the safe side)."""
    if r.plan.gradient_accumulation_steps <= 1:
        return 0
    if r.plan.sharding.startswith("fsdp"):
        return max(st.grads, m.gradient_bytes(r))
    return st.grads


def _forward_peak(r: ResolvedPlan, st: _Static, acts: _Activations) -> PhasePeak:
    """Forward: everything saved, plus the loss tile or a dequantized weight."""
    ckpt = r.plan.gradient_checkpointing
    block_tmp = acts.dequant + acts.adapter_tmp
    if ckpt:
        # the block being run keeps its full activations until it returns
        block_tmp = max(block_tmp, max(acts.layer_full.values()) - acts.boundary + acts.dequant + acts.adapter_tmp)
    # the blocks run before the LM head: their temporaries never meet the loss's tensors
    if block_tmp > acts.loss_fwd + acts.loss_fwd_tmp:
        fwd_loss, fwd_transient = 0, block_tmp
    else:
        fwd_loss, fwd_transient = acts.loss_fwd, acts.loss_fwd_tmp
    fwd_loss += acts.held  # logits a training loop holds through the whole step (LitGPT's fit)
    fwd_gather, fwd_acts = st.gather, acts.saved_layers + acts.shared + acts.forward_cache
    accumulated = _accumulated_grads(r, st)
    if st.fsdp is not None:
        # FSDP2's all-gather copy-outs: at the start (the tail unit and block 0, nothing saved yet but the shared
        # activations) and at the last block's (the blocks below it saved); the end-of-forward set is the default
        last_saved = acts.boundary if ckpt else max(acts.layer_full.values())
        fwd_best = st.bytes + st.gather + acts.saved_layers + acts.shared + fwd_loss + fwd_transient + accumulated
        for g, live_acts in ((st.fsdp.forward_start, acts.shared),
                             (st.fsdp.forward_copy, max(acts.saved_layers - last_saved, 0) + acts.shared)):
            if st.bytes + g + live_acts + accumulated > fwd_best:
                fwd_best = st.bytes + g + live_acts + accumulated
                fwd_gather, fwd_acts, fwd_loss, fwd_transient = g, live_acts, 0, 0
    return PhasePeak(
        "forward",
        st.bytes + fwd_gather + fwd_acts + fwd_loss + fwd_transient + accumulated,
        (
            *st.items,
            Item("sharding_gather_buffers", fwd_gather, _GATHER_NOTE),
            Item("gradients", accumulated, _ACCUMULATED_NOTE),
            Item("activations", fwd_acts, acts.note),
            Item("logits_and_loss", fwd_loss, _loss_note(r)),
            Item("forward_temporaries", fwd_transient, _temporaries_note(r, "forward")),
        ),
    )


def _head_grad_bytes(r: ResolvedPlan, grad_factor: float) -> int:
    """The LM head's gradient (full fine-tuning), or a modules_to_save copy's, made at the loss end of backward."""
    if r.full:
        return int(r.spec.vocab_size * r.spec.hidden_size * r.trainable_bytes_per_param * grad_factor)
    return int(sum(knob.head_gradient(r) for knob in m.KNOB_TERMS) * grad_factor)  # modules_to_save's copy


def _backward_peak(r: ResolvedPlan, st: _Static, acts: _Activations, end_grad: int) -> PhasePeak:
    """Backward: the loss backward on top of every saved activation, then block by block, then its very end."""
    head_grad = _head_grad_bytes(r, st.grad_factor)
    best = _backward_start(r, st, acts, head_grad)
    best = _backward_blocks(r, st, acts, head_grad, best)
    best = _backward_end(r, st, acts, end_grad, best)
    language_model_best = best
    best = _vision_tower_backward(r, st, acts, best)
    in_tower = best is not language_model_best
    return PhasePeak(
        "backward",
        best.bytes,
        (
            *st.items,
            Item("sharding_gather_buffers", best.gather, _GATHER_NOTE),
            Item("activations", best.parts[0], acts.note + "; those of blocks already back-propagated are freed"),
            Item("logits_and_loss", best.parts[1], _loss_note(r)),
            Item("gradients", best.parts[2] + st.buckets, _grad_note(r, st.sh)),
            Item("backward_temporaries", best.parts[3],
                 vision_memory.TOWER_BACKWARD_NOTE if in_tower else _temporaries_note(r, "backward")),
        ),
    )


def _backward_start(r: ResolvedPlan, st: _Static, acts: _Activations, head_grad: int) -> _Live:
    """The loss's backward, before any block's: every activation saved, the loss's gradients (and, under the
    standard loss, the larger of that moment and the LM head's own backward, which writes the head's gradient)."""
    loss_start, start_head = acts.loss_bwd_start + acts.held, 0
    if r.loss_implementation == "standard" and head_grad:  # the chunked head counts its gradient in loss_bwd
        loss_start, start_head = _head_moment(r, loss_start, head_grad)
    elif r.loss_implementation == "litgpt":  # the first chunk's head matmul writes the gradient
        start_head = head_grad
    elif r.loss_implementation == "torchtune" and head_grad:  # the larger of the loss's moment and the head's
        moment, heads = torchtune_memory.head_backward_moment(r, head_grad)
        if moment + heads > loss_start:
            loss_start, start_head = moment + acts.held, heads
    start_gather = st.fsdp.backward_start if st.fsdp else st.gather_bwd
    start_grads = start_head + _accumulated_grads(r, st)  # with accumulation the head's new gradient is a transient
    # the gradient-reduction buckets (DDP's reducer, ZeRO's) live from the first step on: counted at every moment
    start = st.bytes + start_gather + acts.saved_layers + acts.shared + loss_start + start_grads + st.buckets
    return _Live(start, start_gather, (acts.saved_layers + acts.shared, loss_start, start_grads, 0))


def _head_moment(r: ResolvedPlan, loss_start: int, head_grad: int) -> tuple[int, int]:
    """(loss bytes, head-gradient bytes) of the larger of two moments under the standard loss when a head trains:
    the loss's fp32 gradients (``loss_start``, no head gradient yet), or the head matmul's backward once those are
    freed, which writes the head's gradient beside the logits' gradient in the compute dtype (a·T·V) and what a
    knob keeps there (a modules_to_save copy's input: peft_memory.head_copy_moment_bytes)."""
    cast = m.lm_head_cast_bytes(r)
    moment = m.standard_logits_bytes(r) + sum(knob.head_moment(r, cast) for knob in m.KNOB_TERMS)
    if loss_start >= moment + head_grad:
        return loss_start, 0
    return moment, head_grad


def _backward_blocks(r: ResolvedPlan, st: _Static, acts: _Activations, head_grad: int, best: _Live) -> _Live:
    """Block by block: at block i (from the top), blocks below keep their saved tensors, blocks above have
    produced their gradients. Blocks of one kind are identical, so each kind's top-most and bottom-most
    position is evaluated (the live set changes linearly in between)."""
    spec = r.spec
    layer_grad = _layer_grad_bytes(r, st.grad_factor)
    accumulated = _accumulated_grads(r, st)
    cross_attention = vision_memory.cross_attention_backward_bytes(r)  # Mllama's cross-attention layers; else 0
    for index, _ in spec.layer_groups:
        # with checkpointing the block is first recomputed, so its adapters' and quantized linears' forward
        # temporaries recur
        recompute = acts.adapter_tmp + acts.dequant if r.plan.gradient_checkpointing else 0
        transient = max(m.layer_backward_transient_bytes(r, index) + acts.dequant_backward, recompute,
                        cross_attention + acts.dequant_backward)
        for below in (spec.num_layers - 1, 0):
            saved_below = _saved_below(r, below, acts.saved_per_layer)
            current = acts.layer_full[index] + acts.brought_back
            grads_above = _grads_above(r, below, layer_grad) + head_grad + layer_grad.get(index, 0)
            if r.plan.optimizer_in_backward:  # each gradient is stepped and freed as it is made: this block's, and
                # a tied head's summed gradient, whose AccumulateGrad waits for the embedding's backward
                tied_head = head_grad if r.spec.tie_word_embeddings else 0
                grads_above = layer_grad.get(index, 0) + tied_head + _in_backward_step_bytes(r)
            if accumulated:  # every gradient exists; the block's new ones are added in place (a transient)
                grads_above = accumulated + layer_grad.get(index, 0)
            # FSDP2 SHARD_GRAD_OP: the blocks above have resharded after their backward
            released = st.fsdp.release_per_layer * (spec.num_layers - 1 - below) if st.fsdp else 0
            block_gather = st.gather_bwd - released
            live = (st.bytes + block_gather + saved_below + acts.shared + current + grads_above + transient
                    + st.buckets + acts.held)
            if live > best.bytes:
                best = _Live(live, block_gather,
                             (saved_below + acts.shared + current, acts.held, grads_above, transient))
    return best


def _backward_end(r: ResolvedPlan, st: _Static, acts: _Activations, end_grad: int, best: _Live) -> _Live:
    """The very end of backward: every gradient made, the embedding's last.

    Tied head: the embedding's backward makes a dense V x H gradient and AccumulateGrad adds it to the
    head's existing one out of place, so two extra V x H tensors exist for a moment at the very end
    (measured under fake tensors: exactly 2 x V x H x bytes beyond all gradients). Untied, the new
    gradient simply becomes .grad."""
    embed_grad = 0
    if st.sh is not None and r.plan.sharding.startswith("fsdp"):
        embed_grad = st.sh.tail_grads  # the tail unit's unsharded gradients before its reduce-scatter
    elif r.full and r.spec.tie_word_embeddings:
        embed_grad = 2 * int(r.spec.embedding_params * r.trainable_bytes_per_param * st.grad_factor)
    elif r.full and _accumulated_grads(r, st):  # the embedding's new dense gradient, added to .grad in place
        embed_grad = int(r.spec.embedding_params * r.trainable_bytes_per_param * st.grad_factor)
    end_gather = st.fsdp.backward_end if st.fsdp else st.gather_bwd
    end_grad += st.sh.backward_extra if st.sh is not None else 0  # HSDP's all-reduce buffers (sharding.py)
    grads = st.grads
    if r.plan.optimizer_in_backward:  # only the embedding's gradient: tied, the head's summed one beside the new one
        grads = 0
        copies = 2 if r.spec.tie_word_embeddings else 1
        embed_grad = copies * int(r.spec.embedding_params * r.trainable_bytes_per_param) + _in_backward_step_bytes(r)
    shared = acts.shared - vision_memory.freed_before_embedding_backward(r)
    end = st.bytes + end_gather + grads + st.buckets + shared + embed_grad + end_grad + acts.held
    if end > best.bytes:
        return _Live(end, end_gather, (shared, acts.held, grads + embed_grad + end_grad, 0))
    return best


def _vision_tower_backward(r: ResolvedPlan, st: _Static, acts: _Activations, best: _Live) -> _Live:
    """A vision tower in the graph is back-propagated after the whole language model: every gradient made, what the
    step still holds then (the tower's checkpoints, the pixel values, the batch's ids) and one tower block recomputed
    with its backward's temporaries (vision_memory.tower_backward_saved_bytes, tower_block_backward_bytes). With many
    images of a large tower this outgrows every language-model moment (Gemma 3: 4,096 positions an image)."""
    tower = vision_memory.tower_block_backward_bytes(r)
    if not tower:
        return best
    saved = vision_memory.tower_backward_saved_bytes(r)
    # bitsandbytes' MatMul8bitLt keeps its input as a ctx attribute, which lives with its autograd node until the
    # graph goes at the end of backward: the language model's 8-bit linears still hold theirs here (measured: cohort
    # v42's q06, SmolVLM-256M at 26 tiles, -4.54% without them)
    saved += sum(m.int8_kept_input_bytes(r, i) * n for i, n in r.spec.layer_groups)
    live = st.bytes + st.gather_bwd + st.grads + st.buckets + saved + tower + acts.held
    if live > best.bytes:
        return _Live(live, st.gather_bwd, (saved, acts.held, st.grads, tower))
    return best


def _in_backward_step_bytes(r: ResolvedPlan) -> int:
    """torchtune's optimizer_in_bwd steps one parameter in its post-accumulate-grad hook, beside that gradient: torch
    AdamW's foreach step makes a sqrt(exp_avg_sq) temporary of the parameter's size (the largest trainable tensor
    counted, the embedding); the fused step updates in place (memory.optimizer_step_temporary_bytes)."""
    if r.plan.optim != "adamw_torch":
        return 0
    return max(rec.elements * DTYPE_BYTES[rec.dtype] for rec in inventory_of(r).trainable)


def _optimizer_peak(r: ResolvedPlan, st: _Static, end_grad: int) -> PhasePeak:
    """The optimizer step: all gradients plus the step's temporaries (sharded with the states)."""
    # DDP: every rank steps the whole model (its states are whole); a sharded engine steps its partition
    share = 1.0 if st.sh is None or r.plan.sharding == "ddp" else (1 / r.plan.shard_gpus if st.sh.states else 0)
    opt_tmp = int(m.optimizer_step_temporary_bytes(r) * share)
    held = m.held_logits_bytes(r)  # LitGPT's fit holds the step's logits through optimizer.step()
    if r.plan.optimizer_in_backward:  # torchtune's optimizer_in_bwd: every parameter stepped during backward
        return PhasePeak("optimizer", st.bytes, (*st.items, Item("gradients", 0, _IN_BACKWARD_NOTE)))
    return PhasePeak(
        "optimizer",
        st.bytes + st.grads + end_grad + st.buckets + opt_tmp + held,
        (
            *st.items,
            Item("gradients", st.grads + end_grad + st.buckets, _grad_note(r, st.sh)),
            Item("logits_and_loss", held, _loss_note(r)),
            Item("optimizer_temporaries", opt_tmp, _optimizer_tmp_note(r)),
        ),
    )


def _layer_grad_bytes(r: ResolvedPlan, factor: float) -> dict[int, int]:
    """Gradient bytes one block of each kind leaves behind (``factor``: the per-GPU share, 1 on one GPU)."""
    inv = inventory_of(r)
    if r.full:
        return {i: int(inv.layer_trainable_bytes(i) * factor) for i, _ in r.spec.layer_groups}
    # adapters on the block's linears and, where PEFT adapts them, on its fused experts, and DoRA's magnitude vectors
    out = {i: inv.layer_trainable_bytes(i) for i, _ in r.spec.layer_groups}
    if r.plan.sharding != "none":
        out = {i: int(v * factor) for i, v in out.items()}
    return out


def _saved_below(r: ResolvedPlan, index: int, saved_per_layer: dict[int, int]) -> int:
    """Saved activations of the blocks below block ``index`` (exclusive). With checkpointing these are
    the inputs of blocks 1..index (block 0's input is the embedding output, counted as shared)."""
    spec = r.spec
    total = 0
    for first, _ in spec.layer_groups:
        kind = spec.is_moe_layer(first)
        count = sum(1 for j in range(index) if spec.is_moe_layer(j) == kind) if spec.moe_layers else index
        total += count * saved_per_layer[first]
    return total


def _grads_above(r: ResolvedPlan, index: int, layer_grad: dict[int, int]) -> int:
    spec = r.spec
    above = spec.num_layers - 1 - index
    if not spec.moe_layers:
        return above * layer_grad[0]
    total = 0
    for first, _ in spec.layer_groups:
        kind = spec.is_moe_layer(first)
        total += sum(1 for j in range(index + 1, spec.num_layers) if spec.is_moe_layer(j) == kind) * layer_grad[first]
    return total


def _weights_note(r: ResolvedPlan) -> str:
    spec = r.spec
    base = f"{spec.total_params / 1e9:.3g}B parameters"
    if r.quantization in ("nf4", "fp4"):
        base += f"; block linears in 4-bit {r.quantization} (0.5 byte/param), the rest in {r.frozen_dtype}"
    elif r.quantization == "int8":
        base += f"; block linears in int8, the rest in {r.frozen_dtype}"
    else:
        base += f" x {r.weight_bytes_per_param} bytes ({r.weight_dtype})"
    return base


def _adapter_note(r: ResolvedPlan) -> str:
    if r.adapter_dtype is None:
        return "no adapters (full fine-tuning)"
    targets = list(r.target_modules)
    if r.expert_adapters:
        assert r.expert_lora is not None
        lora = r.expert_lora
        parts = [f"{name} r={rank}" for name, rank in (("experts.gate_up_proj", lora.gate_up_rank),
                 ("experts.down_proj", lora.down_rank), ("router", lora.router_rank)) if rank]
        targets.append(f"every expert ({', '.join(parts)}; PEFT's ParamWrapper)")
    return (
        f"LoRA r={r.plan.lora_r} on {', '.join(targets)}: {inventory_of(r).adapter_params / 1e6:.3g}M parameters "
        f"in {r.adapter_dtype}" + peft_memory.adapter_note_suffix(r)
    )


def _sharded_optimizer_note(r: ResolvedPlan, sh) -> str:
    note = f"{r.plan.optim} states for {inventory_of(r).trainable_params / 1e6:.4g}M trainable parameters"
    if sh.master:
        note += ", plus DeepSpeed's fp32 master partition"
    if sh.states == 0:
        note += "; offloaded to the CPU"
    elif r.plan.num_gpus > 1:
        note += f"; fp32, sharded over {r.plan.shard_gpus} GPUs"
    return note


def _optimizer_note(r: ResolvedPlan) -> str:
    return f"{r.plan.optim} states for {inventory_of(r).trainable_params / 1e6:.4g}M trainable parameters"


def _grad_note(r: ResolvedPlan, sh) -> str:
    note = f"gradients of the trainable parameters in {r.adapter_dtype or r.weight_dtype}"
    if sh is not None and sh.grad_factor < 1:
        note += f", sharded over {r.plan.shard_gpus} GPUs"
    if sh is not None and sh.buckets:
        note += "; plus the gradient buckets of the all-reduce / reduce-scatter"
    return note


def _loss_note(r: ResolvedPlan) -> str:
    if r.loss_implementation == "chunked":
        return "TRL's chunked LM head: final hidden states, per-token statistics, a logits tile in backward"
    if r.loss_implementation == "torchtune":
        return (f"torchtune's CEWithChunkedOutputLoss: the bf16 logit chunks (T x {r.spec.vocab_size} vocab) until the "
                "loss has run, each chunk's fp32 upcast and log-softmax output")
    if r.loss_implementation == "litgpt":
        return (f"LitGPT's fp32 logit chunks (T x {r.spec.vocab_size} vocab), held by its training loop through the "
                "step and beside the next step's at the end of a forward, and each chunk's log-softmax output")
    return f"full logits (T x {r.spec.vocab_size} vocab) in {r.compute_dtype}, their fp32 upcast and log-softmax"


def _optimizer_tmp_note(r: ResolvedPlan) -> str:
    return {
        "adamw_torch": "foreach AdamW's model-sized sqrt(exp_avg_sq) temporary",
        "adafactor": "Adafactor's fp32 copies of the largest gradient",
    }.get(r.plan.optim, "none: the step updates in place")


def _temporaries_note(r: ResolvedPlan, phase: str) -> str:
    """What the forward or backward temporaries are for this plan: only the parts that apply to it."""
    quant = {"nf4": "a dequantized 4-bit weight", "fp4": "a dequantized 4-bit weight",
             "int8": "an int8 copy of a linear's input and its row scales"}.get(r.quantization)
    lora = r.adapter_dtype is not None
    ckpt = r.plan.gradient_checkpointing
    if phase == "forward":  # the largest of these at a time (estimator: max of the loss tile and the rest)
        parts = ["a logits tile"] + ([quant] if quant else []) + (["LoRA's input casts"] if lora else []) \
            + (["the running block's full activations"] if ckpt else [])
        return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]
    extra = (["LoRA's input casts (checkpoint recomputation)"] if lora and ckpt else []) + ([quant] if quant else [])
    return "gradients in flight inside one block (MLP or attention)" + "".join(f", {e}" for e in extra)
