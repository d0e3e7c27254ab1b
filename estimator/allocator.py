"""The CUDA caching allocator's rounding, which every byte count of the memory model goes through.

Its own module so that the component modules (memory.py, inventory.py, peft_memory.py, trainer_memory.py) share
it from below rather than from each other.
"""

from __future__ import annotations

import math

from .constants import constant

# Read once: every byte count of the model goes through round_block, and the calibration file does not change while
# the process runs.
CUDA_BLOCK_BYTES = int(constant("CUDA_BLOCK_BYTES"))


def round_block(nbytes: float) -> int:
    """Round up to the CUDA caching allocator's 512-byte block, as every allocation is."""
    return int(math.ceil(nbytes / CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES) if nbytes > 0 else 0
