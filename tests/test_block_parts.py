"""What a block saves, by part (memory.block_saved_parts): each part appears exactly where its knob or layer kind
does, and the parts add up to the block's saved bytes that the phases use."""

from __future__ import annotations

import pytest

from canifinetune.estimator import memory as m
from canifinetune.estimator.model_sources import resolve_model
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.resolved import resolve

P = m.BlockPart


def _parts(layer: int = 0, **fields) -> dict:
    plan = TrainingPlan(**({"model": "Qwen/Qwen2.5-0.5B", "seq_len": 1024} | fields))
    r = resolve(plan, resolve_model(plan.model).spec)
    parts = m.block_saved_parts(r, layer)
    assert sum(parts.values()) == m.layer_activation_bytes(r, layer)
    assert all(v >= 0 for v in parts.values()), parts
    return parts


def test_full_fine_tuning_keeps_no_adapter_or_8bit_part():
    parts = _parts(method="full")
    assert parts[P.ADAPTER_INPUTS] == parts[P.INT8_INPUTS] == parts[P.DORA] == parts[P.MOE] == 0
    assert parts[P.NORMS] and parts[P.ATTENTION] and parts[P.MLP]


def test_lora_inputs_are_the_adapters_part():
    plain = _parts(method="lora", target_modules="all-linear")
    assert plain[P.ADAPTER_INPUTS] > 0 and plain[P.INT8_INPUTS] == 0
    # a frozen base keeps no linear input of its own: full fine-tuning's attention part is larger by q/k/v's input
    assert _parts(method="full")[P.ATTENTION] > plain[P.ATTENTION]


def test_an_8bit_base_keeps_its_inputs_in_their_own_part():
    assert _parts(method="lora", load_in_8bit=True)[P.INT8_INPUTS] > 0
    assert _parts(method="qlora")[P.INT8_INPUTS] == 0


def test_dora_has_its_part():
    assert _parts(method="lora", use_dora=True)[P.DORA] > 0
    assert _parts(method="lora")[P.DORA] == 0


@pytest.mark.parametrize("method", ["full", "lora"])
def test_an_moe_block_has_an_moe_part_and_no_dense_mlp(method):
    fields = {"model": "mistralai/Mixtral-8x7B-v0.1", "method": method}
    if method == "lora":
        fields |= {"lora_dropout": 0.0}
    parts = _parts(**fields)
    assert parts[P.MOE] > 0 and parts[P.MLP] == 0
