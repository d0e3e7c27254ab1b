"""The TrainingPlan: strict, every range checked, errors naming the field and the value."""

import math

import pytest
from pydantic import ValidationError

from canifinetune.estimator.errors import describe_validation_error
from canifinetune.estimator.plan import TrainingPlan


def error_text(**kwargs) -> str:
    with pytest.raises(ValidationError) as info:
        TrainingPlan(**kwargs)
    return describe_validation_error(info.value)


def test_defaults_are_trl_sft_with_peft():
    plan = TrainingPlan(model="m")
    assert (plan.method, plan.lora_r, plan.lora_alpha, plan.lora_dropout) == ("lora", 16, 32, 0.05)
    assert (plan.seq_len, plan.batch_size, plan.optim) == (1024, 8, "adamw_torch_fused")
    assert plan.gradient_checkpointing is True and plan.dtype == "bf16"
    assert plan.effective_loss_implementation == "chunked" and plan.attn_implementation is None
    assert plan.loss_implementation is None and plan.framework == "trl"
    assert plan.target_modules is None


@pytest.mark.parametrize(
    "kwargs, field, fragment",
    [
        ({"seq_len": 0}, "seq_len", "greater than or equal to 1; got 0"),
        ({"batch_size": -1}, "batch_size", "greater than or equal to 1; got -1"),
        ({"lora_r": 0}, "lora_r", "greater than or equal to 1; got 0"),
        ({"lora_dropout": 1.0}, "lora_dropout", "less than 1; got 1.0"),
        ({"gpu_vram_gb": math.nan}, "gpu_vram_gb", "finite number; got nan"),
        ({"gpu_vram_gb": math.inf}, "gpu_vram_gb", "finite number; got inf"),
        ({"optim": "adam"}, "optim", "got 'adam'"),
        ({"method": "prefix"}, "method", "got 'prefix'"),
        ({"dtype": "int4"}, "dtype", "got 'int4'"),
        ({"unknown_knob": 1}, "unknown_knob", "not a known field"),
        ({"seq_len": "long"}, "seq_len", "valid integer, unable to parse string as an integer; got 'long'"),
        ({"target_modules": []}, "target_modules", "at least one"),
        ({"target_modules": ["q_proj; rm -rf /"]}, "target_modules", "letters, digits"),
        ({"model": ""}, "model", "at least 1 character; got ''"),
    ],
)
def test_invalid_values_name_their_field(kwargs, field, fragment):
    data = {"model": "m", **kwargs}
    text = error_text(**data)
    assert fragment.strip(), "an empty fragment matches every message"
    assert text.startswith(field + ":"), text
    assert fragment in text, text


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"method": "full", "load_in_4bit": True}, "method"),
        ({"method": "full", "load_in_8bit": True}, "method"),
        ({"method": "qlora", "load_in_4bit": False}, "load_in_4bit"),
        ({"method": "lora", "load_in_4bit": True}, "load_in_4bit"),
        ({"method": "qlora", "load_in_8bit": True}, "load_in_8bit"),
        ({"num_gpus": 2, "sharding": "none"}, "sharding"),  # given as none: refused (unset: chosen)
        ({"num_gpus": 2, "sharding": "ddp", "offload_params": True}, "offload_params"),
        ({"offload_optimizer": True}, "offload_optimizer"),
        ({"num_gpus": 2, "sharding": "fsdp_full_shard", "offload_optimizer": True}, "offload_optimizer"),
        ({"precision": "mixed", "dtype": "fp32"}, "precision"),
        ({"gpu": "RTX 4090", "gpu_vram_gb": 24}, "gpu"),
    ],
)
def test_impossible_combinations_are_refused(kwargs, field):
    text = error_text(model="m", **kwargs)
    assert text.startswith(field + ":"), text


def test_plan_is_frozen_and_replace_revalidates():
    plan = TrainingPlan(model="m")
    with pytest.raises(ValidationError):
        plan.seq_len = 5  # type: ignore[misc]
    assert plan.replace(seq_len=512).seq_len == 512
    with pytest.raises(ValidationError):
        plan.replace(seq_len=0)


def test_qlora_implies_4bit_and_targets_are_normalised():
    plan = TrainingPlan(model="m", method="qlora", target_modules=["v_proj", "q_proj", "q_proj"])
    assert plan.quantized_4bit and plan.target_modules == ["q_proj", "v_proj"]
    assert not TrainingPlan(model="m").quantized_4bit


# ---------------------------------------------------------------------------------------------- nodes (issue 27)


@pytest.mark.parametrize("given, layout", [
    ({"num_gpus": 8}, (8, 1, None)),  # the one-number form: one node of 8
    ({"num_nodes": 2, "gpus_per_node": 8}, (16, 2, 8)),
    ({"num_nodes": 2, "gpus_per_node": 8, "num_gpus": 16}, (16, 2, 8)),
    ({"num_nodes": 4, "num_gpus": 32}, (32, 4, 8)),
    ({"gpus_per_node": 8, "num_gpus": 32}, (32, 4, 8)),
    ({"gpus_per_node": 4}, (4, 1, None)),  # one node of 4
    ({"num_nodes": 1, "gpus_per_node": 4, "num_gpus": 4}, (4, 1, None)),
    ({"num_nodes": "2", "gpus_per_node": "8"}, (16, 2, 8)),  # as a command line or a chat gives them
    ({"gpu": "8x H100", "num_nodes": 2}, (8, 2, 4)),  # a count in the name is num_gpus, all of them
])
def test_num_gpus_is_nodes_times_gpus_per_node(given, layout):
    plan = TrainingPlan(model="m", **given)
    assert (plan.num_gpus, plan.num_nodes, plan.gpus_per_node) == layout
    assert plan.node_gpus == layout[0] // layout[1]


@pytest.mark.parametrize("given, field, fragment", [
    ({"num_nodes": 2, "gpus_per_node": 8, "num_gpus": 12}, "num_gpus", "num_nodes 2 x gpus_per_node 8"),
    ({"num_nodes": 3, "num_gpus": 16}, "num_gpus", "num_nodes 3"),
    ({"gpus_per_node": 3, "num_gpus": 8}, "num_gpus", "gpus_per_node 3"),
    ({"num_nodes": 2}, "gpus_per_node", "num_nodes 2"),
    ({"num_nodes": 1, "gpus_per_node": 4, "num_gpus": 8}, "gpus_per_node", "num_gpus 8"),
    ({"num_nodes": 64, "gpus_per_node": 32}, "num_gpus", "2048"),
    ({"num_nodes": 2.0, "gpus_per_node": 8, "num_gpus": 4}, "num_gpus", "gpus_per_node 8"),
    ({"num_nodes": 0, "gpus_per_node": 8}, "num_nodes", ""),
])
def test_a_contradiction_between_the_three_is_an_error_naming_them(given, field, fragment):
    text = error_text(model="m", **given)
    assert text.startswith(f"{field}:") and fragment in text, text


def test_the_hybrid_shardings_need_nodes_of_several_gpus():
    assert "on one node use zero3" in error_text(model="m", num_gpus=8, sharding="zero3_hpz")
    assert "on one node use fsdp_full_shard" in error_text(model="m", num_gpus=8, sharding="fsdp_hybrid_shard")
    assert "gpus_per_node 1" in error_text(model="m", num_nodes=4, gpus_per_node=1, sharding="fsdp_hybrid_shard")
    plan = TrainingPlan(model="m", num_nodes=2, gpus_per_node=8, sharding="zero3_hpz", offload_optimizer=True,
                        offload_params=True)
    assert plan.shard_gpus == 16 and plan.replace(sharding="fsdp_hybrid_shard").shard_gpus == 8
    # several GPUs still leave the sharding to the estimate when it is not given
    assert TrainingPlan(model="m", num_nodes=2, gpus_per_node=8).sharding_unset


def test_replace_derives_what_a_layout_change_leaves_out():
    plan = TrainingPlan(model="m", num_nodes=2, gpus_per_node=8, sharding="zero3")
    assert plan.replace(num_gpus=4).model_dump(include={"num_gpus", "num_nodes", "gpus_per_node"}) == {
        "num_gpus": 4, "num_nodes": 1, "gpus_per_node": None}  # the one-number form: one node
    assert (plan.replace(num_nodes=4).num_gpus, plan.replace(num_nodes=4).gpus_per_node) == (32, 8)
    assert (plan.replace(gpus_per_node=4).num_gpus, plan.replace(gpus_per_node=4).num_nodes) == (8, 2)
    assert plan.replace(num_gpus=32, num_nodes=2).gpus_per_node == 16
    one = TrainingPlan(model="m", num_gpus=8)
    assert one.replace(num_nodes=2).num_gpus == 16 and one.replace(num_nodes=2).sharding_unset
    assert one.replace(seq_len=512).sharding_unset


def test_the_cli_takes_nodes_from_the_plan_fields():
    from canifinetune.server.cli import _plan_from_args, build_parser

    args = build_parser().parse_args(["estimate", "--model", "m", "--num-nodes", "2", "--gpus-per-node", "8",
                                      "--sharding", "fsdp_hybrid_shard"])
    plan = _plan_from_args(args)
    assert (plan.num_gpus, plan.num_nodes, plan.gpus_per_node, plan.sharding) == (16, 2, 8, "fsdp_hybrid_shard")


def _is_number(annotation) -> bool:
    """A number type (int or float, optionally null) that is not also a bool, read from the annotation."""
    kinds = (annotation, *getattr(annotation, "__args__", ()))
    return bool not in kinds and any(k in (int, float) for k in kinds)


def test_every_numeric_field_refuses_true_and_false():
    from canifinetune.estimator.plan import NUMBER_FIELDS

    numeric = {name for name, f in TrainingPlan.model_fields.items() if _is_number(f.annotation)}
    assert set(NUMBER_FIELDS) == numeric  # a new numeric field is in the validator's list
    for name in sorted(numeric):
        with pytest.raises(ValidationError, match="must be a number, not true"):
            TrainingPlan(model="Qwen/Qwen2.5-0.5B", method="lora", **{name: True})


@pytest.mark.parametrize("text", ["out\nput", "a\x00b", "a\u202eb", "x\u200by", "tab\there", "a\x85b", "é\x07"])
def test_control_and_invisible_characters_are_refused_in_names(text):
    with pytest.raises(ValidationError, match="plain text"):
        TrainingPlan(model="Qwen/Qwen2.5-0.5B", method="lora", output_dir=text)
