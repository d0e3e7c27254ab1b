"""LoRA on MoE experts as PEFT 0.21 applies it (estimator/moe_adapters.py).

The pure-estimator facts run everywhere; the comparison with PEFT's own trainable-parameter count builds
2-layer models of the catalog's MoE families on the meta device with recipes/model_setup.build_model (what the
trainer builds) and needs torch, transformers and peft.
"""

from __future__ import annotations

import pytest

from canifinetune.estimator.errors import PlanError
from canifinetune.estimator.inventory import inventory_of
from canifinetune.estimator.model_sources import resolve_model
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.resolved import resolve
from canifinetune.estimator.spec import ModelSpec

MIXTRAL = "mistralai/Mixtral-8x7B-v0.1"
QWEN3_MOE = "Qwen/Qwen3-30B-A3B"
QWEN2_MOE = "Qwen/Qwen1.5-MoE-A2.7B"


def _resolved(model: str, layers: int | None = None, **fields):
    config = dict(resolve_model(model).config)
    if layers is not None:
        config["num_hidden_layers"] = layers
    plan = TrainingPlan(model=model, method=fields.pop("method", "lora"), **fields)
    return resolve(plan, ModelSpec.from_config(config)), plan, config


# ---------------------------------------------------------------------------
# pure estimator


@pytest.mark.parametrize(
    "model, millions",
    [(MIXTRAL, 359.665664), (QWEN3_MOE, 996.507648)],  # the "about 360M" and "997M" at r=16
)
def test_all_linear_adapts_experts_at_full_size(model, millions):
    r, _, _ = _resolved(model, target_modules="all-linear", lora_dropout=0.0)
    assert r.expert_adapters
    assert (r.expert_lora.gate_up_rank, r.expert_lora.down_rank, r.expert_lora.router_rank) == (32, 16, 16)
    assert inventory_of(r).adapter_params == round(millions * 1e6)
    assert inventory_of(r).trainable_params == inventory_of(r).adapter_params


def test_qwen2_moe_all_linear_gets_no_expert_adapters():
    r, _, _ = _resolved(QWEN2_MOE, target_modules="all-linear")  # dropout 0.05 is fine: no ParamWrapper
    assert not r.expert_adapters
    assert r.expert_lora is None
    assert {"q_proj", "gate_proj", "down_proj", "shared_expert_gate"} <= set(r.target_modules)


@pytest.mark.parametrize("model", [MIXTRAL, QWEN3_MOE])
def test_explicit_attention_list_gets_no_expert_adapters(model):
    r, _, _ = _resolved(model, target_modules=["q_proj", "v_proj"])
    assert not r.expert_adapters
    assert r.target_modules == ("q_proj", "v_proj")


def test_explicit_expert_names_map_as_peft_does():
    r, _, _ = _resolved(MIXTRAL, target_modules=["w1", "w2", "w3"], lora_dropout=0.0)
    assert (r.expert_lora.gate_up_rank, r.expert_lora.down_rank, r.expert_lora.router_rank) == (32, 16, 0)
    assert r.target_modules == ()
    r, _, _ = _resolved(QWEN3_MOE, target_modules=["q_proj", "down_proj"], lora_dropout=0.0)
    assert (r.expert_lora.gate_up_rank, r.expert_lora.down_rank, r.expert_lora.router_rank) == (0, 16, 0)
    assert r.target_modules == ("q_proj",)
    assert not r.warnings


def test_peft_refusals_are_plan_errors():
    # ParamWrapper: "does not work with lora_dropout != 0" (TrainingPlan's default dropout is 0.05)
    with pytest.raises(PlanError) as err:
        _resolved(MIXTRAL, target_modules="all-linear")
    assert err.value.field == "lora_dropout"
    # one of two names fused into gate_up_proj
    with pytest.raises(PlanError) as err:
        _resolved(QWEN3_MOE, target_modules=["q_proj", "gate_proj"], lora_dropout=0.0)
    assert "up_proj" in str(err.value)
    # the fused module itself is not an nn.Linear
    with pytest.raises(PlanError):
        _resolved(MIXTRAL, target_modules=["q_proj", "experts"], lora_dropout=0.0)
    with pytest.raises(PlanError) as err:
        _resolved(QWEN3_MOE, target_modules="all-linear", lora_dropout=0.0, use_dora=True)
    assert err.value.field == "use_dora"


def test_merged_expert_copies_are_in_the_estimate():
    """Without checkpointing every MoE block keeps its merged experts: the peak grows by at least a second
    copy of all expert weights over attention-only LoRA."""
    from canifinetune.estimator.estimate import estimate

    base = dict(
        model=QWEN3_MOE, method="lora", seq_len=512, batch_size=1, gradient_checkpointing=False, lora_dropout=0.0
    )
    attn = estimate(TrainingPlan(**base, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])).peak_allocated_bytes
    experts = estimate(TrainingPlan(**base, target_modules="all-linear")).peak_allocated_bytes
    # every expert's gate, up and down weights in bf16, by hand from Qwen3-30B-A3B's config.json (48 layers, 128
    # experts, hidden 2048, moe_intermediate_size 768): 2 bytes x 48 x 128 x 3 x 2048 x 768 = 57,982,058,496 (54 GiB)
    expert_weight_bytes = 57_982_058_496
    assert experts - attn > expert_weight_bytes


# ---------------------------------------------------------------------------
# against PEFT's own count


@pytest.mark.slow  # importing transformers and peft: about 8 s, then well under a second per model
@pytest.mark.parametrize(
    "model, targets",
    [
        (MIXTRAL, "all-linear"),
        (QWEN3_MOE, "all-linear"),
        (QWEN2_MOE, "all-linear"),
        (MIXTRAL, ["q_proj", "v_proj"]),
        (MIXTRAL, ["w1", "w2", "w3", "gate"]),
        (QWEN3_MOE, ["q_proj", "gate_proj", "up_proj", "down_proj"]),
    ],
)
def test_trainable_params_match_peft(model, targets):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from canifinetune.recipes import model_setup

    r, plan, config = _resolved(model, layers=2, target_modules=targets, lora_dropout=0.0)
    with torch.device("meta"):
        peft_model = model_setup.build_model(plan, config)
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    assert inventory_of(r).trainable_params == sum(p.numel() for p in trainable)
    assert inventory_of(r).trainable_tensors == len(trainable)


# ---------------------------------------------------------------------------
# against a fake-tensor training step (2-layer configs of the catalog models)


@pytest.mark.slow  # a 2-layer step under fake tensors: about 5-15 s each
@pytest.mark.parametrize(
    "model, fields",
    [
        (QWEN3_MOE, dict(method="lora", gradient_checkpointing=False)),
        (MIXTRAL, dict(method="qlora", gradient_checkpointing=True)),
    ],
)
def test_estimate_matches_a_fake_step(model, fields):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("trl")
    import importlib.util
    import os
    import sys

    from canifinetune.estimator.phases import step_peaks

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(
        "fake_mode", os.path.join(root, "benchmarks", "validation", "fake_mode.py")
    )
    fake_mode = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fake_mode", fake_mode)
    spec.loader.exec_module(fake_mode)

    r, plan, config = _resolved(model, layers=2, target_modules="all-linear", lora_dropout=0.0, seq_len=512,
                                batch_size=1, **fields)
    assert r.expert_adapters
    estimate = max(p.bytes for p in step_peaks(r)[:3])
    measured = fake_mode.run_steps(plan, config, fake=True, loss="trl_fused")["peak_allocated_bytes"]
    error = 100 * (estimate - measured) / measured
    assert -2.0 <= error <= 10.0, f"estimate {estimate} vs measured {measured}: {error:+.2f}%"
