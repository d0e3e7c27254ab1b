"""The record of one kind of tensor a training step keeps, and its roles (estimator/inventory.py builds them).

Below the resolved plan and every module that builds records, so a knob's own module (estimator/peft_memory.py,
...) can describe its tensors without importing the inventory that lists them.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

from .constants import DTYPE_BYTES


class Role(Enum):
    """What a tensor is for: each record has exactly one."""

    # members are singletons: identity hashing (in C) instead of Enum's hash of the name (Python), for the folds
    __hash__ = object.__hash__

    BASE_WEIGHT = "base weight"  # the model's own parameters (trained in full fine-tuning, frozen otherwise)
    QUANTIZED_WEIGHT = "quantized weight"  # a block linear's packed 4-bit or 8-bit weight (bitsandbytes)
    QUANTIZATION_STATE = "quantization state"  # its absmax/code tensors (4-bit) or row scales (8-bit)
    ADAPTER = "LoRA adapter"  # lora_A / lora_B of an adapted linear
    EXPERT_ADAPTER = "expert adapter"  # PEFT's ParamWrapper factors on fused MoE experts and the router
    DORA_MAGNITUDE = "DoRA magnitude"  # lora_magnitude_vector of a DoRA-adapted linear
    SAVED_COPY = "modules_to_save copy"  # the trainable copy PEFT makes of embed_tokens / lm_head
    BUFFER = "buffer"  # a module's registered buffer on the GPU (torchtune's RoPE caches): no parameter, never trains
    # the training state of the trainable parameters (estimator/inventory.py derives them from the records above)
    GRADIENT = "gradient"  # .grad, or an engine's gradient partition
    OPTIMIZER_STATE = "optimizer state"  # the optimizer's per-tensor state (moments, factors, step counter)
    MASTER_WEIGHT = "fp32 master weight"  # an engine's fp32 copy of a trainable parameter (DeepSpeed ZeRO)


# The roles that are model parameters (the others are their quantization state and training state); a tuple: ``in``
# finds an enum member by identity, without Enum's Python-level __hash__.
PARAMETER_ROLES = (Role.BASE_WEIGHT, Role.QUANTIZED_WEIGHT, Role.ADAPTER, Role.EXPERT_ADAPTER, Role.DORA_MAGNITUDE,
                   Role.SAVED_COPY)


class Split(Enum):
    """How the GPUs of a sharded run divide a record between them (estimator/sharding.py places each record)."""

    __hash__ = object.__hash__  # as Role's

    WHOLE = "whole on every GPU"
    SHARDED = "split over the sharding's GPUs"  # plan.shard_gpus (every GPU; the node's under HYBRID_SHARD)
    NODE_SHARDED = "split over the GPUs of one node"  # ZeRO++ hpZ's secondary weight partition


class TensorRecord(NamedTuple):
    """``tensors`` identical tensors of one role: (rows, cols) elements each (cols 1 for a vector).

    ``bytes_each`` is what one takes as the memory model counts it: rows·cols·bytes of its dtype, rounded to the
    allocator's block where the term's formula rounds (packed weights, adapters, copies, magnitudes, quantization
    state; docs/memory_model.md says which). ``layer`` is the first block of the block kind it belongs to (the key
    of ``spec.layer_groups``), None outside the blocks."""

    role: Role
    module: str
    rows: int
    cols: int
    tensors: int  # how many identical tensors
    dtype: str  # bf16, fp16, fp32; nf4, fp4, int8 for packed weights; "mixed" for a quantization state
    trains: bool
    bytes_each: int
    layer: int | None = None
    # where a sharded run keeps it: the flat buffer an engine splits as one (sum, then divide), the split, and
    # whether it is offloaded to host memory (estimator/sharding.py; a single GPU keeps every record whole)
    buffer: str = ""
    split: Split = Split.WHOLE
    offloaded: bool = False

    @property
    def elements(self) -> int:
        return self.rows * self.cols

    @property
    def params(self) -> int:
        """Parameters of all ``tensors`` tensors (0 for a quantization or training state, which is not a parameter)."""
        return self.elements * self.tensors if self.role in PARAMETER_ROLES else 0

    @property
    def bytes(self) -> int:
        return self.bytes_each * self.tensors

    @property
    def param_bytes(self) -> int:
        """rows·cols·tensors in the record's own dtype, unrounded: the size of its gradient, of each AdamW moment."""
        return self.elements * self.tensors * DTYPE_BYTES[self.dtype]

    def placed(self, buffer: str, split: Split = Split.WHOLE, offloaded: bool = False, dtype: str | None = None,
               role: Role | None = None) -> TensorRecord:
        """This record as an engine keeps it: in ``buffer``, split and offloaded as given; re-typed to ``dtype``
        (unrounded: an engine's flat buffer) and as ``role`` (an fp32 master of a parameter) where given."""
        bytes_each = self.bytes_each if dtype is None else self.elements * DTYPE_BYTES[dtype]
        # built directly: dataclasses.replace is several times slower, and a search places thousands
        return TensorRecord(role or self.role, self.module, self.rows, self.cols, self.tensors, dtype or self.dtype,
                            self.trains, bytes_each, self.layer, buffer, split, offloaded)
