"""How a linear's weight is stored: whole in its dtype, or packed by bitsandbytes with its quantization state.

Below estimator/inventory.py (the language model's records) and estimator/vision_memory.py (the vision tower's),
which both pack their linears by these rules.
"""

from __future__ import annotations

import math

from . import torchtune_memory
from .allocator import round_block
from .constants import DTYPE_BYTES, constant
from .shapes import LinearSpec
from .tensor_records import Role, TensorRecord


def packed_weight_record(lin: LinearSpec, name: str, layer: int | None, n: int, quantization: str) -> TensorRecord:
    """A linear's weight as bitsandbytes packs it: 4-bit two codes per byte (Params4bit), 8-bit one byte per weight
    (Int8Params), rounded to the allocator block."""
    packed = lin.weight_params if quantization == "int8" else math.ceil(lin.weight_params / 2)
    return TensorRecord(Role.QUANTIZED_WEIGHT, name, lin.out_features, lin.in_features, n, quantization, False,
                        round_block(packed), layer)


def linear_records(lin: LinearSpec, layer: int, n: int, quantization: str, dtype: str,
                   trains: bool) -> list[TensorRecord]:
    """A block linear's weight (packed when bitsandbytes quantizes it) and bias; ``dtype`` is the unpacked
    tensors'."""
    out: list[TensorRecord] = []
    if quantization == "none":
        out.append(TensorRecord(Role.BASE_WEIGHT, lin.name, lin.out_features, lin.in_features, n, dtype,
                                trains, lin.weight_params * DTYPE_BYTES[dtype], layer))
    else:
        out.append(packed_weight_record(lin, lin.name, layer, n, quantization))
    if lin.bias:
        out.append(TensorRecord(Role.BASE_WEIGHT, f"{lin.name}.bias", lin.out_features, 1, n, dtype, trains,
                                lin.out_features * DTYPE_BYTES[dtype], layer))
    return out


def quantization_state_bytes(lin: LinearSpec, quantization: str, double: bool, torchao: bool) -> int:
    if torchao:
        return torchtune_memory.nf4_state_bytes(lin.weight_params)
    if quantization == "int8":
        return round_block(lin.out_features * constant("INT8_ROW_STAT_BYTES"))
    blocks = math.ceil(lin.weight_params / int(constant("NF4_BLOCKSIZE")))
    one = round_block(16 * 4)  # the 4-bit code book
    if double:
        one += round_block(blocks)  # uint8 absmax
        one += round_block(math.ceil(blocks / int(constant("NF4_DOUBLE_QUANT_BLOCKSIZE"))) * 4)  # fp32 2nd-level absmax
        one += round_block(256 * 4) + round_block(4)  # 8-bit code book, offset
    else:
        one += round_block(blocks * 4)
    return one
