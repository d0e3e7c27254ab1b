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
from .tensor_records import Role, Split, TensorRecord

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
    # the inventory's records as this engine places them (buffer, split, offloaded): the static fields above are
    # their fold (:func:`fold`)
    records: tuple[TensorRecord, ...] = ()


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


# The buffer a single GPU's records go in, by role (the breakdown's static components).
_BUFFER = {Role.BASE_WEIGHT: "weights", Role.QUANTIZED_WEIGHT: "weights", Role.BUFFER: "weights",
           Role.QUANTIZATION_STATE: "qconst",
           **dict.fromkeys(m.ADAPTER_ROLES, "adapters"), Role.GRADIENT: "gradients", Role.OPTIMIZER_STATE: "states"}


def fold(records: tuple[TensorRecord, ...], n: int, k: int) -> tuple[dict[str, int], int]:
    """One GPU's bytes of each buffer, and the host bytes of one node (its ``k`` ranks), from placed records.

    A buffer's records are summed and then divided by their split (n GPUs, or the k of a node): an engine splits a
    flat buffer as one. An offloaded buffer's share is on the host, once per rank of the node. A buffer named
    ``component/part`` is a buffer of its own that counts in ``component`` (ZeRO's fp32 gradient partition beside the
    low-precision gradients)."""
    sums: dict[tuple[str, Split, bool], int] = {}
    for rec in records:
        key = (rec.buffer, rec.split, rec.offloaded)
        sums[key] = sums.get(key, 0) + rec.bytes
    gpu: dict[str, int] = dict.fromkeys(("weights", "adapters", "qconst", "master", "gradients", "states"), 0)
    host = 0
    for (buffer, split, offloaded), total in sums.items():
        share = total // (n if split is Split.SHARDED else k if split is Split.NODE_SHARDED else 1)
        if offloaded:
            host += share * k
        else:
            gpu[buffer.partition("/")[0]] += share
    return gpu, host


def _shares_of(records: tuple[TensorRecord, ...], folded: tuple[dict[str, int], int], **rest) -> Shares:
    """Shares whose static fields are ``folded``, the fold of ``records``; ``rest`` gives the engine's transient
    buffers."""
    gpu, host = folded
    return Shares(weights=gpu["weights"], adapters=gpu["adapters"], qconst=gpu["qconst"], master=gpu["master"],
                  states=gpu["states"], grads=gpu["gradients"], host=host, records=records, **rest)


def _ddp_shares(r: ResolvedPlan) -> Shares:
    records = tuple(rec.placed(_BUFFER[rec.role]) for rec in inventory_of(r).records)  # every record whole
    grads_all = m.gradient_bytes(r)
    return _shares_of(records, fold(records, 1, 1), grad_factor=1.0, buckets=grads_all, gather_forward=0,
                      gather_backward=0, tail_grads=0, note="DDP: replicated; reducer buckets copy the gradients")


def _zero_shares(r: ResolvedPlan, stage: int) -> Shares:
    """DeepSpeed ZeRO-1/2/3: the module in the compute dtype, fp32 master, gradient and state partitions (ZeRO++ hpZ:
    and a secondary partition of the weights over the node). Host memory: what the node's k ranks offload."""
    plan, spec, n, a = r.plan, r.spec, r.plan.num_gpus, r.act_bytes
    k = plan.node_gpus  # the ranks on one machine, whose offloaded states share its host RAM
    records = _zero_records(r, stage)
    folded = fold(records, n, k)
    gpu = folded[0]
    grads_all = m.gradient_bytes(r)
    gather = 2 * spec.largest_layer_params * a if stage == 3 else 0  # the largest layer's params and grads (4L)
    bucket_bytes = DS_REDUCE_BUCKET_ELEMENTS * (4 if stage == 1 else a)
    if stage == 3:
        bucket_bytes += DS_PREFETCH_BUCKET_ELEMENTS * a
    if inventory_of(r).trainable_params == 0:
        bucket_bytes = 0
    return _shares_of(records, folded, grad_factor=(gpu["gradients"] / grads_all) if grads_all else 0.0,
                      buckets=bucket_bytes, gather_forward=gather, gather_backward=gather, tail_grads=0,
                      note=(f"DeepSpeed ZeRO-3 with ZeRO++ hpZ {_over(plan, n)}: a secondary copy of the weights "
                            f"partitioned over the {k} GPUs of each node" if plan.sharding == "zero3_hpz"
                            else f"DeepSpeed ZeRO-{stage} {_over(plan, n)}"))


def _zero_records(r: ResolvedPlan, stage: int) -> tuple[TensorRecord, ...]:
    """The inventory as DeepSpeed ZeRO places it.

    * the module (``weights``; every trainable tensor beside the base in ``adapters``: adapters, modules_to_save
      copies, DoRA magnitudes, which issue 24 found missing from each GPU's parameters): cast to the compute dtype
      when bf16/fp16 is on (frozen and trainable alike; a quantized base keeps its packed weights), whole under
      ZeRO-1/2, partitioned under ZeRO-3 (and offloaded with offload_params); ZeRO++ hpZ adds a secondary partition
      over the node (``_partition_param_sec``);
    * the fp32 master partition (``master``): ZeRO-1/2 clone it whatever the parameters' dtype (DeepSpeed 0.19.8
      stage_1_and_2.py ``single_partition_of_fp32_groups``: ``.detach().clone().to(master dtype)``), so fp32 plans
      hold it too; ZeRO-3 keeps one only under mixed precision (stage3.py ``_create_fp32_partitions`` reuses an fp32
      partition);
    * gradients: the fp32 partition under mixed precision (``gradients``, partitioned), and the low-precision ones:
      whole under ZeRO-1, partitioned under ZeRO-2 (gone with offload_optimizer) and under ZeRO-3 without mixed
      precision; ZeRO-3 with it reduces straight into the fp32 partition (DeepSpeed's estimator: 18P/n);
    * optimizer states of the fp32 trainable parameters, partitioned; master, fp32 gradients and states offloaded
      with offload_optimizer."""
    plan, inv = r.plan, inventory_of(r)
    mixed, quantized, hpz = _mixed(r), r.quantization != "none", plan.sharding == "zero3_hpz"
    params_split = Split.SHARDED if stage == 3 else Split.WHOLE
    params_off, optim_off = stage == 3 and plan.offload_params, plan.offload_optimizer
    out: list[TensorRecord] = []

    def module(recs, buffer: str, dtype: str | None) -> None:
        out.extend(rec.placed(buffer, params_split, params_off, dtype=dtype) for rec in recs)
        if hpz:
            out.extend(rec.placed(buffer, Split.NODE_SHARDED, params_off, dtype=dtype) for rec in recs)

    module(inv.of(Role.BASE_WEIGHT, Role.QUANTIZED_WEIGHT), "weights",
           None if (quantized or not mixed) else r.compute_dtype)
    if not r.full:
        module(inv.trainable, "adapters", r.compute_dtype if mixed else r.trainable_dtype)
    out.extend(rec.placed("qconst", params_split) for rec in inv.of(Role.QUANTIZATION_STATE))
    if mixed or stage in (1, 2):
        out.extend(rec.placed("master", Split.SHARDED, optim_off, dtype="fp32", role=Role.MASTER_WEIGHT)
                   for rec in inv.trainable)
    grads = inv.of(Role.GRADIENT)
    if mixed:
        out.extend(g.placed("gradients/fp32", Split.SHARDED, optim_off, dtype="fp32") for g in grads)
    low_split = Split.WHOLE if stage == 1 else Split.SHARDED if (stage == 2 or not mixed) else None
    if low_split is not None and not (optim_off and stage == 2):
        out.extend(g.placed("gradients", low_split, dtype=r.compute_dtype if mixed else r.trainable_dtype)
                   for g in grads)
    out.extend(st.placed("states", Split.SHARDED, optim_off)
               for st in inventory_of(_fp32_trainable(r)).of(Role.OPTIMIZER_STATE))
    return tuple(out)


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
    plan, n, tb = r.plan, r.plan.shard_gpus, r.trainable_bytes_per_param
    k = plan.node_gpus
    mixed = _mixed(r)
    master_fp32 = mixed and r.quantization == "none"
    param_a = r.act_bytes if mixed else r.weight_bytes_per_param  # all-gathered (param_dtype) bytes per param
    grad_factor = ((4 if master_fp32 else tb) / tb / n) if tb else 0.0
    ar_buffers = 0
    if plan.sharding == "fsdp_hybrid_shard" and param_a != (4 if master_fp32 else tb) and tb:
        # HSDP (torch 2.13 foreach_reduce): each unit's reduce-scatter output, in the reduce dtype, is all-reduced
        # across the nodes and then cast into the sharded gradient; FSDPParamGroup._all_reduce_state keeps that
        # buffer until finalize_backward, so every unit's is alive at the end of backward (a·Pt/n beside the
        # gradients; measured under fake tensors: docs/memory_model.md)
        ar_buffers = (inventory_of(r).trainable_params * param_a) // n
        grad_factor += param_a / tb / n
    if plan.offload_params or plan.offload_optimizer:
        grad_factor = 0.0
    g = _fsdp_gathered(r, param_a)
    records = _fsdp_records(r, master_fp32)
    return _shares_of(records, fold(records, n, k), grad_factor=grad_factor, buckets=0,
                      gather_forward=g.forward, gather_backward=g.backward, tail_grads=g.tail_grads,
                      note=_fsdp_note(plan, n), fsdp=g, backward_extra=ar_buffers)


def _fsdp_records(r: ResolvedPlan, master_fp32: bool) -> tuple[TensorRecord, ...]:
    """The inventory as FSDP2 places it: every record sharded over n; the trainable parameters (the whole module in
    full fine-tuning), their gradients and optimizer states in fp32 under mixed precision (accelerate 1.15's
    ``fsdp2_prepare_model`` upcasts them), in their own dtype otherwise; all but the quantization state offloaded
    with CPUOffloadPolicy (offload_params or offload_optimizer: FSDP2 moves them together)."""
    inv = inventory_of(r)
    off = r.plan.offload_params or r.plan.offload_optimizer
    master = "fp32" if master_fp32 else r.trainable_dtype
    out = [rec.placed("weights", Split.SHARDED, off, dtype=master if r.full else None)
           for rec in inv.of(Role.BASE_WEIGHT, Role.QUANTIZED_WEIGHT)]
    if not r.full:  # adapters, modules_to_save copies, DoRA magnitudes
        out += [rec.placed("adapters", Split.SHARDED, off, dtype=master) for rec in inv.trainable]
    out += [rec.placed("qconst", Split.SHARDED) for rec in inv.of(Role.QUANTIZATION_STATE)]
    out += [g.placed("gradients", Split.SHARDED, off, dtype=master) for g in inv.of(Role.GRADIENT)]
    states = inventory_of(_fp32_trainable(r) if master_fp32 else r).of(Role.OPTIMIZER_STATE)
    out += [st.placed("states", Split.SHARDED, off) for st in states]
    return tuple(out)


def _fsdp_note(plan, n: int) -> str:
    if plan.sharding == "fsdp_hybrid_shard":
        return (f"FSDP2 HYBRID_SHARD: sharded over the {n} GPUs of each node, replicated across {plan.num_nodes} "
                "nodes")
    return f"FSDP2 {'FULL_SHARD' if plan.sharding == 'fsdp_full_shard' else 'SHARD_GRAD_OP'} {_over(plan, n)}"
