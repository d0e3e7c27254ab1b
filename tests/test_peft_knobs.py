"""PEFT's modules_to_save and use_dora (estimator/peft_memory.py): the estimator's trainable parameters against PEFT's
own, the refusal of module names it cannot model, and the estimate against a fake-tensor measurement."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

from canifinetune.estimator.errors import PlanError
from canifinetune.estimator.inventory import inventory_of
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.resolved import resolve
from canifinetune.estimator.spec import ModelSpec

# two families, tied and untied heads, GQA, a bias on q/k/v (qwen2)
CONFIGS = {
    "llama_untied": dict(
        model_type="llama",
        vocab_size=1000,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    ),
    "llama_tied": dict(
        model_type="llama",
        vocab_size=1000,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        tie_word_embeddings=True,
    ),
    "qwen2_tied": dict(
        model_type="qwen2",
        vocab_size=1200,
        hidden_size=192,
        intermediate_size=448,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
}
KNOBS = [
    dict(modules_to_save=["lm_head"]),
    dict(modules_to_save=["embed_tokens", "lm_head"]),
    dict(modules_to_save=["embed_tokens"], target_modules="all-linear"),
    dict(use_dora=True),
    dict(use_dora=True, target_modules="all-linear", modules_to_save=["lm_head"]),
]


def _plan(**kw) -> TrainingPlan:
    base = {"model": "tiny", "method": "lora", "seq_len": 64, "batch_size": 2}
    base.update(kw)
    return TrainingPlan(**base)


@pytest.mark.parametrize("knobs", KNOBS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_trainable_params_match_peft(name, knobs):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from peft import get_peft_model

    from canifinetune.recipes import model_setup

    config = CONFIGS[name]
    plan = _plan(**knobs)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
        model = get_peft_model(model, model_setup.lora_config(plan))
    trainable = [p for p in model.parameters() if p.requires_grad]
    r = resolve(plan, ModelSpec.from_config(config))
    trainable_params = inventory_of(r).trainable_params
    assert trainable_params == sum(p.numel() for p in trainable) == model.get_nb_trainable_parameters()[0]
    assert inventory_of(r).trainable_tensors == len(trainable)


def test_tied_head_copy_is_its_own_tensor():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from peft import get_peft_model

    from canifinetune.recipes import model_setup

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**CONFIGS["llama_tied"])
        )
        model = get_peft_model(model, model_setup.lora_config(_plan(modules_to_save=["embed_tokens", "lm_head"])))
    base = model.get_base_model()
    head, embed = base.lm_head, base.model.embed_tokens
    # the originals stay tied and frozen; each wrapper trains its own V x H copy
    assert head.original_module.weight is embed.original_module.weight
    assert not head.original_module.weight.requires_grad
    assert head.modules_to_save["default"].weight is not embed.modules_to_save["default"].weight
    assert head.modules_to_save["default"].weight.requires_grad


@pytest.mark.parametrize("names, fragment", [
    (["embedding"], "no module named 'embedding'"),
    (["q_proj"], "not modelled yet"),
    (["norm"], "not modelled yet"),
])
def test_module_names_refused(names, fragment):
    spec = ModelSpec.from_config(CONFIGS["llama_untied"])
    with pytest.raises(PlanError) as info:
        resolve(_plan(modules_to_save=names), spec)
    assert info.value.field == "modules_to_save"
    assert fragment in str(info.value)
    assert "embed_tokens" in str(info.value) and "lm_head" in str(info.value)


def test_knobs_add_their_memory():
    from canifinetune.estimator import memory as m

    spec = ModelSpec.from_config(CONFIGS["llama_untied"])
    plain = resolve(_plan(), spec)
    head = resolve(_plan(modules_to_save=["lm_head"]), spec)
    vh = 256_000  # the head's V x H from CONFIGS["llama_untied"] by hand: 1000 x 256
    assert inventory_of(head).trainable_params - inventory_of(plain).trainable_params == vh
    assert m.gradient_bytes(head) - m.gradient_bytes(plain) == 2 * vh  # bf16 copy next to fp32 adapters
    assert m.optimizer_state_bytes(head) - m.optimizer_state_bytes(plain) == 2 * 2 * vh + 512
    dora = resolve(_plan(use_dora=True), spec)
    assert m.layer_activation_bytes(dora, 0) > m.layer_activation_bytes(plain, 0)
    assert m.adapter_forward_transient_bytes(dora) > m.adapter_forward_transient_bytes(plain)


# ------------------------------------------------------------------------------------------------
# estimate vs the fake-tensor measurement (benchmarks/validation/fake_mode.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEDIUM = dict(model_type="llama", vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
              num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048, tie_word_embeddings=True)


def _fake_mode():
    spec = importlib.util.spec_from_file_location(
        "fake_mode", os.path.join(ROOT, "benchmarks", "validation", "fake_mode.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fake_mode", module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("knobs", [
    dict(modules_to_save=["embed_tokens", "lm_head"]),
    dict(use_dora=True, target_modules="all-linear", gradient_checkpointing=False),
], ids=["modules_to_save", "dora"])
def test_estimate_against_fake_measurement(tmp_path, knobs):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from canifinetune.estimator.estimate import estimate

    (tmp_path / "config.json").write_text(json.dumps(MEDIUM), encoding="utf-8")
    plan = TrainingPlan(model=str(tmp_path), method="lora", seq_len=512, batch_size=2, **knobs)
    measured = _fake_mode().run_steps(plan, MEDIUM, fake=True, loss="trl_fused")
    est = estimate(plan)
    resolved = resolve(plan, ModelSpec.from_config(MEDIUM))
    assert measured["resolved"]["trainable_params"] == inventory_of(resolved).trainable_params
    error = (est.peak_allocated_bytes - measured["peak_allocated_bytes"]) / measured["peak_allocated_bytes"]
    assert -0.02 <= error <= 0.10, (est.peak_allocated_bytes, measured["peak_allocated_bytes"], error)


@pytest.mark.slow
def test_qlora_dora_and_head_copy_under_fake_tensors():
    """The harness's shims (benchmarks/validation/peft_fake.py): DoRA dequantizes the fake 4-bit weights, the head copy
    is cloned in the running fake mode; TRL's bf16 cast leaves the magnitude vectors in fp32."""
    pytest.importorskip("torch")
    pytest.importorskip("bitsandbytes")
    config = dict(CONFIGS["llama_tied"], max_position_embeddings=512)
    plan = _plan(method="qlora", use_dora=True, target_modules="all-linear", modules_to_save=["lm_head"])
    result = _fake_mode().run_steps(plan, config, fake=True)
    r = resolve(plan, ModelSpec.from_config(config))
    settings = result["resolved"]
    assert settings["trainable_params"] == inventory_of(r).trainable_params
    # DoRA's magnitude vectors (fp32), one per output feature of every adapted linear, by hand from
    # CONFIGS["llama_tied"] (hidden 256, MLP 512, 8 heads of 32, 4 KV heads: k/v 128): q 256 + k 128 + v 128 + o 256
    # + gate 512 + up 512 + down 256 = 2,048 per layer, x 2 layers
    assert settings["adapter_dtypes"]["float32"] == 4_096
    assert result["peak_allocated_bytes"] > 0
