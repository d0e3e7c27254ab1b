"""The inventory: every tensor a training step keeps on the GPU for its whole length, resolved once.

Resolving a plan (estimator/resolved.py) says which tensors train, in which dtype, with which kernels. This module
turns those facts into records, one per kind of tensor (its role, shape, how many there are, dtype, whether it
trains, the block kind it belongs to), built once per resolved plan. Every static term of the memory model is a sum
over these records (estimator/memory.py: weights, quantization constants, adapters, gradients, optimizer states and
their step temporaries), and so are the counts the notes and the sharding module read (trainable parameters and
tensors, adapter parameters, a block's trainable bytes). A knob that adds tensors adds records through its own
builder in :data:`BUILDERS`; no term has to learn about it (CONTRIBUTING.md, "Add a knob").

The layout follows PyTorch's ``torch.distributed._tools.mem_tracker``: each tensor gets one role once, and every
report is a fold over those records.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property, lru_cache

from . import peft_memory, term_cache, torchtune_memory, vision_memory
from .allocator import round_block
from .constants import DTYPE_BYTES, constant
from .packed_weights import linear_records, quantization_state_bytes
from .resolved import ResolvedPlan
from .spec import ModelSpec
from .tensor_records import Role, TensorRecord


@dataclass(frozen=True)
class Inventory:
    """The records of one resolved plan, and the folds the memory terms read."""

    records: tuple[TensorRecord, ...]

    @cached_property
    def _by_role(self) -> dict[Role, tuple[TensorRecord, ...]]:
        by_role: dict[Role, list[TensorRecord]] = {}
        for rec in self.records:
            by_role.setdefault(rec.role, []).append(rec)
        return {role: tuple(recs) for role, recs in by_role.items()}

    def of(self, *roles: Role) -> tuple[TensorRecord, ...]:
        if len(roles) == 1:
            return self._by_role.get(roles[0], ())
        return tuple(rec for rec in self.records if rec.role in roles)

    def bytes_of(self, *roles: Role) -> int:
        return sum(rec.bytes for role in roles for rec in self._by_role.get(role, ()))

    @cached_property
    def trainable(self) -> tuple[TensorRecord, ...]:
        return tuple(rec for rec in self.records if rec.trains)

    @cached_property
    def trainable_params(self) -> int:
        return sum(rec.params for rec in self.trainable)

    @cached_property
    def trainable_tensors(self) -> int:
        """How many parameter tensors train (optimizer states and step counters are per tensor)."""
        return sum(rec.tensors for rec in self.trainable)

    @cached_property
    def trainable_bytes(self) -> int:
        """All trainable parameters in their own dtypes (unrounded): the size of their gradients, of each AdamW
        moment and of foreach AdamW's temporary."""
        return sum(rec.param_bytes for rec in self.trainable)

    @cached_property
    def adapter_params(self) -> int:
        """LoRA A/B and expert-adapter parameters (without modules_to_save copies and DoRA magnitudes)."""
        return sum(rec.params for rec in self.of(Role.ADAPTER, Role.EXPERT_ADAPTER))

    def layer_trainable_bytes(self, layer: int) -> int:
        """Trainable bytes of one block of the kind that starts at ``layer`` (its gradients, made in its backward)."""
        return self._trainable_bytes_by_layer.get(layer, 0)

    @cached_property
    def _trainable_bytes_by_layer(self) -> dict[int | None, int]:
        # summed once per inventory (shared by the plans a search evaluates), not once per plan and block kind
        out: dict[int | None, int] = {}
        for rec in self.trainable:
            out[rec.layer] = out.get(rec.layer, 0) + rec.elements * DTYPE_BYTES[rec.dtype]
        return out


# ---------------------------------------------------------------------------
# the builders: each returns the records of one concern; a knob adds its own


def base_weight_records(r: ResolvedPlan) -> tuple[TensorRecord, ...]:
    """The model's own parameters, tensor kind by tensor kind (ModelSpec's counts): embedding, untied head, final
    norm, and per block kind its linears, norms, q/k norms and fused experts with their router. Unquantized they are
    in the weight dtype (fp32 masters under 'mixed'); on a quantized base everything but the block linears' weights
    stays in ``r.frozen_dtype`` (fp32 after prepare_model_for_kbit_training)."""
    dtype = r.weight_dtype if r.quantization == "none" else r.frozen_dtype
    return _base_weight_records(r.spec, r.quantization, dtype, r.full)


@lru_cache(maxsize=256)  # a search evaluates many plans of one model: the base's records repeat
def _base_weight_records(spec: ModelSpec, quantization: str, dtype: str, trains: bool) -> tuple[TensorRecord, ...]:
    h = spec.hidden_size

    def rec(module: str, rows: int, cols: int, count: int, layer: int | None) -> TensorRecord:
        return TensorRecord(Role.BASE_WEIGHT, module, rows, cols, count, dtype, trains,
                            rows * cols * DTYPE_BYTES[dtype], layer)

    out = [rec("embed_tokens", spec.vocab_size, h, 1, None)]
    if not spec.tie_word_embeddings:
        out.append(rec("lm_head", spec.vocab_size, h, 1, None))
    out.append(rec("norm", h, 1, 1, None))
    for i, n in spec.layer_groups:
        for lin in spec.layer_linears(i):
            out += linear_records(lin, i, n, quantization, dtype, trains)
        # one record per tensor of a block: ``tensors`` is always the number of blocks of the kind
        out += [rec(f"norm{k}", h, 1, n, i) for k in range(spec.norms_per_layer)]
        if spec.qk_norm == "head":
            out += [rec("q_norm", spec.head_dim, 1, n, i), rec("k_norm", spec.head_dim, 1, n, i)]
        elif spec.qk_norm == "full":
            out.append(rec("q_norm", spec.q_dim, 1, n, i))
            out.append(rec("k_norm", spec.kv_dim, 1, n, i))
        if spec.is_moe_layer(i):
            moe = spec.moe
            assert moe is not None
            # 3-D expert tensors: Adafactor factors their last two dimensions
            out.append(rec("experts.gate_up_proj", moe.num_experts * 2 * moe.expert_intermediate, h, n, i))
            out.append(rec("experts.down_proj", moe.num_experts * h, moe.expert_intermediate, n, i))
            out.append(rec("router", moe.num_experts, h, n, i))
    return tuple(out)


def quantization_state_records(r: ResolvedPlan) -> tuple[TensorRecord, ...]:
    """Per quantized linear: 4-bit (bitsandbytes QuantState) one fp32 absmax per NF4_BLOCKSIZE weights and the
    16-entry fp32 code, or with double quantization uint8 absmax, one fp32 absmax per NF4_DOUBLE_QUANT_BLOCKSIZE of
    them, a 256-entry fp32 code and an fp32 offset (QLoRA, Dettmers et al. 2023, sec. 3); 8-bit one fp32 scale per
    output row (INT8_ROW_STAT_BYTES); torchtune's QLoRA, torchao's NF4 (torchtune_memory.nf4_state_bytes). Each tensor
    rounded to the allocator block."""
    if r.quantization == "none":
        return ()
    return _quantization_state_records(r.spec, r.quantization, r.plan.bnb_4bit_use_double_quant,
                                       r.framework == "torchtune")


@lru_cache(maxsize=256)
def _quantization_state_records(spec: ModelSpec, quantization: str, double: bool,
                                torchao: bool) -> tuple[TensorRecord, ...]:
    return tuple(TensorRecord(Role.QUANTIZATION_STATE, lin.name, lin.out_features, 1, n, "mixed", False,
                              quantization_state_bytes(lin, quantization, double, torchao), i)
                 for i, n in spec.layer_groups for lin in spec.layer_linears(i))


def adapter_records(r: ResolvedPlan) -> list[TensorRecord]:
    """lora_A (r x in) and lora_B (out x r) per adapted linear, in the adapter dtype (PEFT 0.21 keeps them fp32 on
    an unquantized base; TRL 1.16 casts them to bf16 on a quantized one: estimator/resolved.py)."""
    if r.adapter_dtype is None:
        return []
    per, rank = DTYPE_BYTES[r.adapter_dtype], r.plan.lora_r
    out = []
    for i, n in r.spec.layer_groups:
        for lin in r.adapted_linears(i):
            out.append(TensorRecord(Role.ADAPTER, f"{lin.name}.lora_A", rank, lin.in_features, n, r.adapter_dtype,
                                    True, round_block(rank * lin.in_features * per), i))
            out.append(TensorRecord(Role.ADAPTER, f"{lin.name}.lora_B", lin.out_features, rank, n, r.adapter_dtype,
                                    True, round_block(rank * lin.out_features * per), i))
    return out


def expert_adapter_records(r: ResolvedPlan) -> list[TensorRecord]:
    """PEFT's ParamWrapper factors on fused experts and the router (estimator/moe_adapters.py shapes)."""
    if r.adapter_dtype is None or not r.expert_adapters:
        return []
    per = DTYPE_BYTES[r.adapter_dtype]
    return [TensorRecord(Role.EXPERT_ADAPTER, "experts", rows, cols, n, r.adapter_dtype, True,
                         round_block(rows * cols * per), i)
            for i, n in r.spec.layer_groups for rows, cols in r.expert_adapter_shapes(i)]


# Every builder, in the order the records are listed. A knob that adds tensors appends its builder here (DoRA's and
# modules_to_save's live in estimator/peft_memory.py beside the rest of what those knobs do).
BUILDERS: tuple[Callable[[ResolvedPlan], Iterable[TensorRecord]], ...] = (
    base_weight_records,
    quantization_state_records,
    adapter_records,
    expert_adapter_records,
    peft_memory.saved_copy_records,
    peft_memory.dora_magnitude_records,
    torchtune_memory.rope_cache_records,
    vision_memory.vision_weight_records,
    vision_memory.vision_adapter_records,
)


def gradient_records(trainable: Iterable[TensorRecord]) -> list[TensorRecord]:
    """One gradient per trainable tensor, in its dtype (autograd accumulates ``.grad`` in the leaf's dtype), unrounded
    (as the memory model has always counted gradients: estimator/memory.py ``gradient_bytes``)."""
    return [TensorRecord(Role.GRADIENT, rec.module, rec.rows, rec.cols, rec.tensors, rec.dtype, False,
                         rec.elements * DTYPE_BYTES[rec.dtype], rec.layer) for rec in trainable]


def optimizer_state_records(trainable: Iterable[TensorRecord], optim: str, trainable_bytes: int
                            ) -> list[TensorRecord]:
    """Each trainable tensor's optimizer state, one record per parameter record (the formulas, by optimizer, are in
    estimator/memory.py ``optimizer_state_bytes``); ``trainable_bytes`` is the plan's bytes per trainable parameter,
    in which Adafactor's factors are counted. SGD keeps none."""
    counter = round_block(4)  # torch's per-tensor fp32 step counter, rounded to the allocator block
    out = []
    for rec in trainable:
        if optim in ("adamw_torch_fused", "adamw_torch"):
            each = 2 * rec.elements * DTYPE_BYTES[rec.dtype] + counter  # exp_avg, exp_avg_sq in the param's dtype
        elif optim == "paged_adamw_32bit":
            each = 2 * rec.elements * 4 + counter
        elif optim in ("adamw_bnb_8bit", "paged_adamw_8bit"):
            each = _bnb_8bit_state_bytes(rec.elements)
        elif optim == "adafactor":
            each = round_block(rec.rows * trainable_bytes) + (
                round_block(rec.cols * trainable_bytes) if rec.cols != 1 else 0)
        else:
            continue  # sgd
        out.append(TensorRecord(Role.OPTIMIZER_STATE, rec.module, rec.rows, rec.cols, rec.tensors, rec.dtype, False,
                                each, rec.layer))
    return out


def _bnb_8bit_state_bytes(size: int) -> int:
    """bitsandbytes Optimizer2State for one tensor of ``size`` elements: two uint8 states with one fp32 absmax per
    BNB_8BIT_STATE_BLOCKSIZE, or two fp32 states under BNB_8BIT_MIN_SIZE."""
    if size < constant("BNB_8BIT_MIN_SIZE"):
        return 2 * round_block(size * 4)
    return 2 * (round_block(size) + round_block(math.ceil(size / constant("BNB_8BIT_STATE_BLOCKSIZE")) * 4))


def build(r: ResolvedPlan) -> Inventory:
    """The parameter records of every builder, then the training state of the trainable ones."""
    params = tuple(rec for builder in BUILDERS for rec in builder(r))
    trainable = [rec for rec in params if rec.trains]
    return Inventory(params + tuple(gradient_records(trainable))
                     + tuple(optimizer_state_records(trainable, r.plan.optim, r.trainable_bytes_per_param)))


def inventory_of(r: ResolvedPlan) -> Inventory:
    """The plan's inventory, built on first use and kept with the resolved plan (``dataclasses.replace`` makes a new
    resolved plan, which builds its own)."""
    inv = r.memo.get("inventory")
    if inv is None:  # and shared with the plans that differ only in what it never reads (estimator/term_cache.py)
        inv = r.memo["inventory"] = term_cache.INVENTORY.get(r, build)
    return inv
