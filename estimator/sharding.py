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

Several nodes (num_nodes N of gpus_per_node K GPUs, n = N·K): a rank does not know where its peers are, so ZeRO-1/2/3
and FSDP full shard / shard-grad-op over N nodes hold on each GPU exactly what they hold over n GPUs of one machine
(DeepSpeed's own estimators take ``num_nodes`` and ``num_gpus_per_node`` and divide by their product). Host memory
is per node: what K ranks offload (DeepSpeed's ZeRO-3 estimator: its ``gpus_factor`` 1/num_nodes). The hybrid
shardings use the node:

* fsdp_hybrid_shard: FSDP HYBRID_SHARD, as FSDP2 does it (torch 2.13 ``fully_shard`` on a 2-D DeviceMesh
  (replicate N, shard K); accelerate 1.15 builds it from ``parallelism_config`` dp_replicate_size N, dp_shard_size K):
  parameters, gradients and optimizer states sharded over the K GPUs of a node and replicated across nodes, so one
  GPU holds what fsdp_full_shard holds over K GPUs. The gradients are reduce-scattered inside the node and then
  all-reduced across nodes in place (``foreach_reduce``'s all_reduce on the reduce-scatter output): nothing more
  on the GPU. torch docs: FSDP ``ShardingStrategy.HYBRID_SHARD`` ("apply FULL_SHARD within a node, and replicate
  parameters across nodes"); ``fully_shard(mesh=...)``: "a 2D mesh ... HSDP".
* zero3_hpz: ZeRO-3 with ZeRO++'s hierarchical partitioning (hpZ; Wang et al. 2023, "ZeRO++: Extremely Efficient
  Collective Communication for Giant Model Training", arXiv:2306.10209, section 3.2; DeepSpeed's ZeRO++ tutorial:
  ``zero_hpz_partition_size`` = GPUs per node), as DeepSpeed 0.19 does it: the primary partition (a·P/n) stays
  over all n GPUs, with the fp32 masters, gradients and optimizer states; each parameter also keeps a secondary
  partition over the K GPUs of its node (``partition_parameters.py`` ``_partition_param_sec``: ``tensor_size //
  num_ranks_in_param_group``, in the parameter's dtype, on the parameters' device: the CPU with offload_params),
  from which backward all-gathers inside the node. One GPU: ZeRO-3 over n, plus a·P/K (and a·adapters/K).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import memory as m
from .inventory import inventory_of
from .plan import zero_stage
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
    # alive at the end of backward only, freed before the optimizer step (FSDP2 HYBRID_SHARD: every unit's
    # reduce-dtype all-reduce buffer; its per-block growth is in grad_factor)
    backward_extra: int = 0


def _fp32_trainable(r: ResolvedPlan) -> ResolvedPlan:
    """The plan with its trainable parameters in fp32 (master weights): for optimizer states kept in fp32."""
    if r.full:
        return replace(r, weight_dtype="fp32")
    return replace(r, adapter_dtype="fp32")


def shares(r: ResolvedPlan) -> Shares:
    """One GPU's share of each static component under the plan's sharding (``r`` is the ResolvedPlan)."""
    kind = r.plan.sharding
    if kind == "ddp":
        return _ddp_shares(r)
    stage = zero_stage(kind)
    if stage is not None:
        return _zero_shares(r, stage=stage)
    return _fsdp_shares(r)


def _over(plan, n: int) -> str:
    """'over 8 GPUs', or 'over 16 GPUs (2 nodes of 8)' for several nodes: for the notes."""
    return f"over {n} GPUs" + (f" ({plan.num_nodes} nodes of {plan.node_gpus})" if plan.num_nodes > 1 else "")


def _mixed(r: ResolvedPlan) -> bool:
    return r.plan.dtype in ("bf16", "fp16")  # accelerate mixed_precision bf16/fp16


def _ddp_shares(r: ResolvedPlan) -> Shares:
    grads_all = m.gradient_bytes(r)
    return Shares(weights=m.weight_bytes(r), adapters=m.adapter_bytes(r), qconst=m.quantization_constant_bytes(r),
                  master=0, states=m.optimizer_state_bytes(r), grads=grads_all, grad_factor=1.0, buckets=grads_all,
                  gather_forward=0, gather_backward=0, tail_grads=0, host=0,
                  note="DDP: replicated; reducer buckets copy the gradients")


def _zero_shares(r: ResolvedPlan, stage: int) -> Shares:
    """DeepSpeed ZeRO-1/2/3: the module in the compute dtype, fp32 master, gradient and state partitions (ZeRO++ hpZ:
    and a secondary partition of the weights over the node). Host memory: what the node's k ranks offload."""
    plan, spec, n, a = r.plan, r.spec, r.plan.num_gpus, r.act_bytes
    k = plan.node_gpus  # the ranks on one machine, whose offloaded states share its host RAM
    tb, pt, mixed = r.trainable_bytes_per_param, inventory_of(r).trainable_params, _mixed(r)
    weights = m.weight_bytes(r)
    grads_all = m.gradient_bytes(r)
    quantized = r.quantization != "none"
    # DeepSpeed casts the module to the compute dtype (bf16/fp16 enabled), frozen and trainable alike
    w16 = weights if (quantized or not mixed) else spec.total_params * a
    # every trainable tensor beside the base: adapters, modules_to_save copies, DoRA magnitudes (issue 24: the copies
    # were missing from each GPU's parameters)
    a16 = 0 if r.full else inventory_of(r).trainable_params * (a if mixed else tb)
    g16_per = a if mixed else tb  # low-precision gradient bytes per trainable param
    # ZeRO-1/2 clone their fp32 master partition whatever the parameters' dtype (DeepSpeed 0.19.8 stage_1_and_2.py,
    # ``single_partition_of_fp32_groups``: ``.detach().clone().to(dtype=master_weights_and_grads_dtype)``), so fp32
    # plans hold it too; ZeRO-3 reuses an fp32 partition as its master (stage3.py ``_create_fp32_partitions``)
    master = (pt * 4) // n if (mixed or stage in (1, 2)) else 0
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
        host += master * k + grads32 * k + states * k
        master = grads32 = states = 0
        if stage == 2:
            g16 = 0
    gather = 0
    if stage == 3:
        # ZeRO++ hpZ: every parameter also has a secondary partition over the node's k GPUs (_partition_param_sec)
        hpz = plan.sharding == "zero3_hpz"
        if plan.offload_params:  # the node's k partitions on its host (hpZ's secondary too: its remote_device)
            host += (w16 + a16) * k // n + ((w16 // k + a16 // k) * k if hpz else 0)
            w16 = a16 = 0
        else:
            w16 = w16 // n + (w16 // k if hpz else 0)
            a16 = a16 // n + (a16 // k if hpz else 0)
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
                  note=(f"DeepSpeed ZeRO-3 with ZeRO++ hpZ {_over(plan, n)}: a secondary copy of the weights "
                        f"partitioned over the {k} GPUs of each node" if plan.sharding == "zero3_hpz"
                        else f"DeepSpeed ZeRO-{stage} {_over(plan, n)}"))


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
        layer_unsharded += (inventory_of(r).adapter_params // max(spec.num_layers, 1)) * param_a
    head = spec.vocab_size * spec.hidden_size
    tail = (head + spec.hidden_size) * param_a  # final norm + lm_head (the embedding itself when tied)
    if r.full:
        layer_grad_unsharded = largest * param_a  # the unit's unsharded grads, then the reduce-scatter input
        tail_grads = head * param_a * (3 if spec.tie_word_embeddings else 1)
    else:
        layer_grad_unsharded = (inventory_of(r).adapter_params // max(spec.num_layers, 1)) * param_a
        tail_grads = 0
    untied_extra = 0 if spec.tie_word_embeddings else tail  # untied: the tail's own copy-out comes after the blocks
    if r.plan.sharding in ("fsdp_full_shard", "fsdp_hybrid_shard"):  # reshard_after_forward=True
        # end of forward: the tail, the last block's all-gather output (tied); untied, the tail's copy-out as well
        forward = tail + layer_unsharded + untied_extra
        copy = tail + 3 * layer_unsharded  # block k's copy-out: its output and params, block k-1's output
        backward = tail + 2 * layer_unsharded + 2 * layer_grad_unsharded
        backward_start = tail + layer_unsharded  # the last block prefetched by the tail's pre-backward
        release = 0
    else:
        all_unsharded = (spec.total_params + (inventory_of(r).adapter_params if not r.full else 0)) * param_a
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
    """FSDP2 as accelerate prepares it: fp32 trainable masters (mixed precision), everything sharded over n
    (HYBRID_SHARD: over the GPUs of one node). Host memory: what the node's k ranks offload."""
    plan, spec, n, tb = r.plan, r.spec, r.plan.shard_gpus, r.trainable_bytes_per_param
    k = plan.node_gpus
    mixed = _mixed(r)
    master_tb = 4 if mixed and r.quantization == "none" else tb
    param_a = r.act_bytes if mixed else r.weight_bytes_per_param  # all-gathered (param_dtype) bytes per param
    if r.full:
        w_sh = (spec.total_params * master_tb) // n
        a_sh = 0
    else:
        w_sh = m.weight_bytes(r) // n
        a_sh = (inventory_of(r).trainable_params * master_tb) // n  # adapters, modules_to_save copies, DoRA magnitudes
    grads = (inventory_of(r).trainable_params * master_tb) // n
    states = m.optimizer_state_bytes(_fp32_trainable(r) if master_tb == 4 else r) // n
    grad_factor = (master_tb / tb / n) if tb else 0.0
    ar_buffers = 0
    if plan.sharding == "fsdp_hybrid_shard" and param_a != master_tb and tb:
        # HSDP (torch 2.13 foreach_reduce): each unit's reduce-scatter output, in the reduce dtype, is all-reduced
        # across the nodes and then cast into the sharded gradient; FSDPParamGroup._all_reduce_state keeps that
        # buffer until finalize_backward, so every unit's is alive at the end of backward (a·Pt/n beside the
        # gradients; measured under fake tensors: docs/memory_model.md)
        ar_buffers = (inventory_of(r).trainable_params * param_a) // n
        grad_factor += param_a / tb / n
    host = 0
    if plan.offload_params or plan.offload_optimizer:
        host = (w_sh + a_sh + grads + states) * k
        w_sh = a_sh = grads = states = 0
        grad_factor = 0.0
    g = _fsdp_gathered(r, param_a)
    return Shares(weights=w_sh, adapters=a_sh, qconst=m.quantization_constant_bytes(r) // n, master=0, states=states,
                  grads=grads, grad_factor=grad_factor, buckets=0, gather_forward=g.forward,
                  gather_backward=g.backward, tail_grads=g.tail_grads, host=host,
                  note=_fsdp_note(plan, n), fsdp=g, backward_extra=ar_buffers)


def _fsdp_note(plan, n: int) -> str:
    if plan.sharding == "fsdp_hybrid_shard":
        return (f"FSDP2 HYBRID_SHARD: sharded over the {n} GPUs of each node, replicated across {plan.num_nodes} "
                "nodes")
    return f"FSDP2 {'FULL_SHARD' if plan.sharding == 'fsdp_full_shard' else 'SHARD_GRAD_OP'} {_over(plan, n)}"
