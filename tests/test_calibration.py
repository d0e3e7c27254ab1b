"""Every constant the memory model reads is in the calibration file, with a source, and documented."""

import re
from pathlib import Path

from canifinetune.estimator import constants
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.plan import TrainingPlan

ROOT = Path(__file__).resolve().parent.parent
ESTIMATOR = ROOT / "estimator"


def names_in_code() -> set[str]:
    found = set()
    for path in ESTIMATOR.glob("*.py"):
        found |= set(re.findall(r"""constant\(["']([A-Z0-9_]+)["']\)""", path.read_text(encoding="utf-8")))
    return found


def test_every_constant_call_names_a_literal():
    # a computed name would escape the two checks below, which read names from the source
    import ast

    for path in ESTIMATOR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "constant":
                assert len(node.args) == 1 and isinstance(node.args[0], ast.Constant), (
                    f"{path.name}:{node.lineno}: constant() must be called with a literal name")


def test_code_reads_only_calibrated_constants():
    calibrated = set(constants.CALIBRATION["constants"])
    missing = names_in_code() - calibrated
    assert not missing, f"constants read by the code but absent from calibration.json: {missing}"


def test_constants_read_at_run_time_are_calibrated_and_sourced():
    constants.READ.clear()
    for method in ("full", "lora", "qlora"):
        for optim in ("adamw_torch", "adamw_bnb_8bit", "adafactor"):
            estimate(TrainingPlan(model="Qwen/Qwen2.5-0.5B", method=method, optim=optim, gpu_vram_gb=24,
                                  bnb_4bit_use_double_quant=True))
    estimate(TrainingPlan(model="Qwen/Qwen2.5-0.5B", method="lora", load_in_8bit=True, loss_implementation="standard"))
    assert constants.READ, "the estimate read no constants through constants.constant()"
    doc = (ROOT / "docs" / "memory_model.md").read_text(encoding="utf-8")
    for name in constants.READ:
        assert name in constants.CALIBRATION["constants"]
        assert constants.source(name).strip()
        assert name in doc, f"{name} is read by the estimate but not documented in docs/memory_model.md"


def test_memory_constants_are_documented():
    doc = (ROOT / "docs" / "memory_model.md").read_text(encoding="utf-8")
    memory_names = set(names_in_code())
    throughput_doc = ROOT / "docs" / "search.md"
    other = throughput_doc.read_text(encoding="utf-8") if throughput_doc.exists() else ""
    undocumented = {n for n in memory_names if n not in doc and n not in other}
    assert not undocumented, f"constants not named in docs/memory_model.md or docs/search.md: {undocumented}"


def test_a_constant_outside_the_file_is_refused():
    import pytest

    with pytest.raises(KeyError):
        constants.constant("NOT_A_CONSTANT")
