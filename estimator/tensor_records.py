"""The record of one kind of tensor a training step keeps, and its roles (estimator/inventory.py builds them).

Below the resolved plan and every module that builds records, so a knob's own module (estimator/peft_memory.py,
...) can describe its tensors without importing the inventory that lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .constants import DTYPE_BYTES


class Role(Enum):
    """What a tensor is for: each record has exactly one."""

    BASE_WEIGHT = "base weight"  # the model's own parameters (trained in full fine-tuning, frozen otherwise)
    QUANTIZED_WEIGHT = "quantized weight"  # a block linear's packed 4-bit or 8-bit weight (bitsandbytes)
    QUANTIZATION_STATE = "quantization state"  # its absmax/code tensors (4-bit) or row scales (8-bit)
    ADAPTER = "LoRA adapter"  # lora_A / lora_B of an adapted linear
    EXPERT_ADAPTER = "expert adapter"  # PEFT's ParamWrapper factors on fused MoE experts and the router
    DORA_MAGNITUDE = "DoRA magnitude"  # lora_magnitude_vector of a DoRA-adapted linear
    SAVED_COPY = "modules_to_save copy"  # the trainable copy PEFT makes of embed_tokens / lm_head


@dataclass(frozen=True)
class TensorRecord:
    """``count`` identical tensors of one role: (rows, cols) elements each (cols 1 for a vector).

    ``bytes_each`` is what one takes as the memory model counts it: rows·cols·bytes of its dtype, rounded to the
    allocator's block where the term's formula rounds (packed weights, adapters, copies, magnitudes, quantization
    state; docs/memory_model.md says which). ``layer`` is the first block of the block kind it belongs to (the key
    of ``spec.layer_groups``), None outside the blocks."""

    role: Role
    module: str
    rows: int
    cols: int
    count: int
    dtype: str  # bf16, fp16, fp32; nf4, fp4, int8 for packed weights; "mixed" for a quantization state
    trains: bool
    bytes_each: int
    layer: int | None = None

    @property
    def elements(self) -> int:
        return self.rows * self.cols

    @property
    def params(self) -> int:
        """Parameters of all ``count`` tensors (0 for a quantization state, which is not a parameter)."""
        return 0 if self.role is Role.QUANTIZATION_STATE else self.elements * self.count

    @property
    def bytes(self) -> int:
        return self.bytes_each * self.count

    @property
    def param_bytes(self) -> int:
        """rows·cols·count in the record's own dtype, unrounded: the size of its gradient, of each AdamW moment."""
        return self.elements * self.count * DTYPE_BYTES[self.dtype]
