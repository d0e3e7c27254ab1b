"""The memory model's constants, read from the versioned calibration file ``data/calibration.json``.

Each constant there has a value, a unit and a source (a library's source code, a paper, or a stated
allowance); none is fitted on a validation cohort. The memory model reads constants only through
:func:`constant`, which records every name it is asked for, so a test can prove that nothing outside
the file is used. Byte sizes of dtypes are facts of the formats, not calibration, and live here.
"""

from __future__ import annotations

import json
from importlib import resources

CALIBRATION_FILE = "calibration.json"

with (resources.files(__package__) / "data" / CALIBRATION_FILE).open("r", encoding="utf-8") as _fh:
    CALIBRATION: dict = json.load(_fh)

_CONSTANTS: dict[str, dict] = CALIBRATION["constants"]
for _name, _entry in _CONSTANTS.items():
    if not isinstance(_entry.get("value"), (int, float)) or not str(_entry.get("source", "")).strip():
        raise RuntimeError(f"calibration constant {_name} needs a numeric value and a source")

CALIBRATION_VERSION: str = CALIBRATION["version"]
READ: set[str] = set()


def constant(name: str) -> float:
    """The value of a calibration constant; KeyError for a name the calibration file does not hold."""
    READ.add(name)
    return _CONSTANTS[name]["value"]


def source(name: str) -> str:
    return _CONSTANTS[name]["source"]


# Bytes per element of each dtype (IEEE 754 / bfloat16 formats).
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}
GIB = 1 << 30
