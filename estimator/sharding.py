"""Per-GPU shares of the static components under DDP, DeepSpeed ZeRO-1/2/3 and PyTorch FSDP2, with CPU offload.

What each engine keeps on one GPU, as the recipe's accelerate config runs it (accelerate 1.15, torch 2.13,
DeepSpeed 0.19, transformers 5 Trainer). ``docs/memory_model.md`` ("Several GPUs") gives the formulas and sources;
``tests/test_sharding.py`` checks FSDP2 against torch's FSDPMemTracker and ZeRO-2/3 against DeepSpeed's estimators.

Notation: P parameters, Pt trainable, n GPUs, a bytes of the compute dtype, L the largest decoder layer's params.

* ddp: everything replicated; DDP's reducer buckets are a second copy of the gradients
  (``gradient_as_bucket_view=False``, torch DistributedDataParallel's default, which Trainer keeps).
* zero1/zero2/zero3 (DeepSpeed, bf16/fp16 enabled by accelerate's ``mixed_precision``): the module is cast to the
  compute dtype (a bytes/param) and the ZeRO optimizer keeps an fp32 master partition (4·Pt/n), an fp32 gradient
  partition (4·Pt/n) and fp32 optimizer states (8·Pt/n for AdamW): DeepSpeed's own estimators count
  2P + 18P/n (ZeRO-2) and 4L + 18P/n (ZeRO-3). ZeRO-1 keeps the low-precision gradients whole (a·Pt).
  The gradient-reduction bucket is ``reduce_bucket_size`` elements (DeepSpeed default 5e8, which accelerate's
  generated config leaves as is): ZeRO-1 stages it in fp32, ZeRO-2/3 in the compute dtype; ZeRO-3 adds a
  prefetch bucket (``stage3_prefetch_bucket_size``, 5e7 elements).
* fsdp_full_shard / fsdp_shard_grad_op (FSDP2, ``fsdp_version: 2``): accelerate's ``fsdp2_prepare_model`` upcasts
  trainable parameters to fp32 when mixed precision is on and shards everything over n (params, fp32 grads,
  fp32 optimizer states); ``MixedPrecisionPolicy(param_dtype=a)`` all-gathers one decoder layer at a time in the
  compute dtype. The tail unit (final norm + lm_head, and the embedding when tied) has
  ``reshard_after_forward=False``; FULL_SHARD reshards every layer after its forward and re-gathers it for
  backward (current + prefetched next), SHARD_GRAD_OP keeps every layer gathered from forward to its backward.
* offload: DeepSpeed moves master weights, fp32 gradients and optimizer states (and with offload_params the
  parameters) to host memory; FSDP2's CPUOffloadPolicy moves sharded parameters, gradients and the optimizer
  step together.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import memory as m
from .resolved import ResolvedPlan

# DeepSpeed ZeRO config defaults (deepspeed/runtime/zero/config.py, 0.19): accelerate's generated config
# (deepspeed_config without a file) does not set them, and Trainer fills only values given as "auto".
DS_REDUCE_BUCKET_ELEMENTS = 500_000_000
DS_PREFETCH_BUCKET_ELEMENTS = 50_000_000


@dataclass(frozen=True)
class Shares:
    """One GPU's bytes of each static component, and what host memory holds."""

    weights: int  # parameters resident on the GPU (sharded, low precision or fp32 masters)
    adapters: int
    qconst: int
    master: int  # DeepSpeed's fp32 master partition
    states: int
    grads: int  # gradients alive in the optimizer step (sharded/partitioned where the engine does)
    grad_factor: float  # bytes per trainable-dtype gradient byte during backward, per layer (sharded, upcast)
    buckets: int  # reduction buckets alive from backward through the step
    gather_forward: int  # all-gathered parameters alive in forward (beyond the sharded ones)
    gather_backward: int  # all-gathered parameters and unsharded gradients alive in backward
    tail_grads: int  # the tail unit's unsharded gradients at the end of backward (FSDP)
    host: int  # host RAM for offloaded parts, all ranks together
    note: str
    # FSDP2 only (None elsewhere: gather_forward/gather_backward then hold for the whole phase). FSDP2's gathered
    # bytes change within a phase: its forward_start, forward_copy, backward_start, backward_end and
    # release_per_layer; see :func:`_fsdp_gathered` for when each of these is alive.
    fsdp: FsdpGathered | None = None


def _fp32_trainable(r: ResolvedPlan) -> ResolvedPlan:
    """The plan with its trainable parameters in fp32 (master weights): for optimizer states kept in fp32."""
    if r.full:
        return replace(r, weight_dtype="fp32")
    return replace(r, adapter_dtype="fp32")


def is_sharded(r: ResolvedPlan) -> bool:
    return r.plan.sharding not in ("none",)


def shares(r: ResolvedPlan) -> Shares:
    """One GPU's share of each static component under the plan's sharding (``r`` is the ResolvedPlan)."""
    kind = r.plan.sharding
    if kind == "ddp":
        return _ddp_shares(r)
    if kind.startswith("zero"):
        return _zero_shares(r, stage=int(kind[-1]))
    return _fsdp_shares(r)


def _mixed(r: ResolvedPlan) -> bool:
    return r.plan.dtype in ("bf16", "fp16")  # accelerate mixed_precision bf16/fp16


def _ddp_shares(r: ResolvedPlan) -> Shares:
    grads_all = m.gradient_bytes(r)
    return Shares(weights=m.weight_bytes(r), adapters=m.adapter_bytes(r), qconst=m.quantization_constant_bytes(r),
                  master=0, states=m.optimizer_state_bytes(r), grads=grads_all, grad_factor=1.0, buckets=grads_all,
                  gather_forward=0, gather_backward=0, tail_grads=0, host=0,
                  note="DDP: replicated; reducer buckets copy the gradients")


def _zero_shares(r: ResolvedPlan, stage: int) -> Shares:
    """DeepSpeed ZeRO-1/2/3: the module in the compute dtype, fp32 master, gradient and state partitions."""
    plan, spec, n, a = r.plan, r.spec, r.plan.num_gpus, r.act_bytes
    tb, pt, mixed = r.trainable_bytes_per_param, r.trainable_params, _mixed(r)
    weights = m.weight_bytes(r)
    grads_all = m.gradient_bytes(r)
    quantized = r.quantization != "none"
    # DeepSpeed casts the module to the compute dtype (bf16/fp16 enabled), frozen and trainable alike
    w16 = weights if (quantized or not mixed) else spec.total_params * a
    a16 = 0 if r.full else r.adapter_params * (a if mixed else tb)
    g16_per = a if mixed else tb  # low-precision gradient bytes per trainable param
    master = (pt * 4) // n if mixed else 0
    grads32 = (pt * 4) // n if mixed else 0
    states = m.optimizer_state_bytes(_fp32_trainable(r)) // n
    if stage == 1:
        g16 = pt * g16_per
    elif stage == 2 or not mixed:
        g16 = (pt * g16_per) // n
    else:
        g16 = 0  # ZeRO-3 reduces straight into the fp32 partition (DeepSpeed's estimator: 18P/n)
    host = 0
    if plan.offload_optimizer:
        host += master * n + grads32 * n + states * n
        master = grads32 = states = 0
        if stage == 2:
            g16 = 0
    gather = 0
    if stage == 3:
        if plan.offload_params:
            host += w16 + a16
            w16 = a16 = 0
        else:
            w16 //= n
            a16 //= n
        gather = 2 * spec.largest_layer_params * a  # the largest layer's gathered params and its gradients (4L)
    bucket_bytes = DS_REDUCE_BUCKET_ELEMENTS * (4 if stage == 1 else a)
    if stage == 3:
        bucket_bytes += DS_PREFETCH_BUCKET_ELEMENTS * a
    if pt == 0:
        bucket_bytes = 0
    grad_factor = ((g16 + grads32) / grads_all) if grads_all else 0.0
    return Shares(weights=w16, adapters=a16, qconst=m.quantization_constant_bytes(r) // (n if stage == 3 else 1),
                  master=master, states=states, grads=g16 + grads32, grad_factor=grad_factor, buckets=bucket_bytes,
                  gather_forward=gather, gather_backward=gather, tail_grads=0, host=host,
                  note=f"DeepSpeed ZeRO-{stage} over {n} GPUs")


@dataclass(frozen=True)
class FsdpGathered:
    """FSDP2's all-gathered (unsharded) bytes at the moments of a step where they peak (see _fsdp_gathered)."""

    forward: int
    forward_start: int
    forward_copy: int
    backward: int
    backward_start: int
    backward_end: int
    release_per_layer: int
    tail_grads: int


def _fsdp_gathered(r: ResolvedPlan, param_a: int) -> FsdpGathered:
    """What FSDP2 holds unsharded, by moment, with ``param_a`` bytes per all-gathered parameter.

    When torch 2.13's FSDPParamGroup holds what (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py):

    * unshard() allocates the unit's flat all-gather output (a · unit params); wait_for_unshard() copies it out
      into the unsharded parameters (a second a · unit). In forward (implicit prefetch) the all-gather output is
      kept in ``comm_ctx.all_gather_state`` until the NEXT unit's wait_for_unshard, which drops it only after
      that unit's copy-out (the walrus local ``prev_all_gather_state`` holds it until the method returns); the
      root's post-forward frees the last one. So the running block has its all-gather output beside its
      unsharded parameters, and during a copy-out the previous unit's output is alive too.
    * FULL_SHARD reshards a block in its post-forward (the unsharded copy goes, its all-gather output stays until
      the next copy-out); SHARD_GRAD_OP keeps every block unsharded until its post-backward (reshard_after_backward).
      The tail unit (reshard_after_forward=False) stays unsharded from its first use to its post-backward.
    * In backward the all-gather output is freed right after the copy-out, and the next block is prefetched
      (its all-gather output allocated); post-backward turns the unit's unsharded gradients into a
      reduce-scatter input (a · unit grads) kept until the next unit's post-backward (one buffer in flight).
    """
    spec = r.spec
    largest = spec.largest_layer_params
    layer_unsharded = largest * param_a
    if not r.full:
        layer_unsharded += (r.adapter_params // max(spec.num_layers, 1)) * param_a
    head = spec.vocab_size * spec.hidden_size
    tail = (head + spec.hidden_size) * param_a  # final norm + lm_head (the embedding itself when tied)
    if r.full:
        layer_grad_unsharded = largest * param_a  # the unit's unsharded grads, then the reduce-scatter input
        tail_grads = head * param_a * (3 if spec.tie_word_embeddings else 1)
    else:
        layer_grad_unsharded = (r.adapter_params // max(spec.num_layers, 1)) * param_a
        tail_grads = 0
    untied_extra = 0 if spec.tie_word_embeddings else tail  # untied: the tail's own copy-out comes after the blocks
    if r.plan.sharding == "fsdp_full_shard":
        # end of forward: the tail, the last block's all-gather output (tied); untied, the tail's copy-out as well
        forward = tail + layer_unsharded + untied_extra
        copy = tail + 3 * layer_unsharded  # block k's copy-out: its output and params, block k-1's output
        backward = tail + 2 * layer_unsharded + 2 * layer_grad_unsharded
        backward_start = tail + layer_unsharded  # the last block prefetched by the tail's pre-backward
        release = 0
    else:
        all_unsharded = (spec.total_params + (r.adapter_params if not r.full else 0)) * param_a
        forward = all_unsharded + layer_unsharded + untied_extra  # every unit gathered, one output kept
        copy = all_unsharded + 2 * layer_unsharded
        backward = all_unsharded + 2 * layer_grad_unsharded  # the top block's backward
        backward_start = all_unsharded
        release = layer_unsharded  # each block reshards after its backward
    return FsdpGathered(
        forward=forward, forward_copy=copy, backward=backward, backward_start=backward_start,
        # start of forward: the tail (tied: it holds the embedding; untied: the embedding unit) copied out, then
        # block 0's copy-out with the tail's all-gather output still alive: 2 x (tail + block)
        forward_start=2 * (tail + layer_unsharded),
        # end of backward: the tail unsharded, the first block's reduce-scatter input (then the tail's own gradients)
        backward_end=tail + layer_grad_unsharded,
        release_per_layer=release, tail_grads=tail_grads)


def _fsdp_shares(r: ResolvedPlan) -> Shares:
    """FSDP2 as accelerate prepares it: fp32 trainable masters (mixed precision), everything sharded over n."""
    plan, spec, n, tb = r.plan, r.spec, r.plan.num_gpus, r.trainable_bytes_per_param
    mixed = _mixed(r)
    master_tb = 4 if mixed and r.quantization == "none" else tb
    param_a = r.act_bytes if mixed else r.weight_bytes_per_param  # all-gathered (param_dtype) bytes per param
    if r.full:
        w_sh = (spec.total_params * master_tb) // n
        a_sh = 0
    else:
        w_sh = m.weight_bytes(r) // n
        a_sh = (r.adapter_params * master_tb) // n
    grads = (r.trainable_params * master_tb) // n
    states = m.optimizer_state_bytes(_fp32_trainable(r) if master_tb == 4 else r) // n
    grad_factor = (master_tb / tb / n) if tb else 0.0
    host = 0
    if plan.offload_params or plan.offload_optimizer:
        host = (w_sh + a_sh + grads + states) * n
        w_sh = a_sh = grads = states = 0
        grad_factor = 0.0
    g = _fsdp_gathered(r, param_a)
    return Shares(weights=w_sh, adapters=a_sh, qconst=m.quantization_constant_bytes(r) // n, master=0, states=states,
                  grads=grads, grad_factor=grad_factor, buckets=0, gather_forward=g.forward,
                  gather_backward=g.backward, tail_grads=g.tail_grads, host=host,
                  note=f"FSDP2 {'FULL_SHARD' if plan.sharding == 'fsdp_full_shard' else 'SHARD_GRAD_OP'} over {n} GPUs",
                  fsdp=g)
