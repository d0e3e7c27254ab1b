"""Issue 22, "nothing lost, nothing silent, round two": each defect reproduced first, then fixed."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from canifinetune.estimator.errors import CanIFinetuneError
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.plan import TrainingPlan

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
REFUSED = (CanIFinetuneError, ValidationError)


# ---------------------------------------------------------------- 8: GRPO settings TRL 1.16 refuses


@pytest.mark.parametrize("fields,field", [
    ({"generation_batch_size": 16, "steps_per_generation": 2}, "steps_per_generation"),  # "can not be both"
    ({"loss_type": "sigmoid"}, "loss_type"),  # a DPO loss
    ({"loss_type": "luspo"}, "loss_type"),  # needs importance_sampling_level 'sequence'
    ({"num_generations": 1}, "num_generations"),  # at least 2 for an advantage
    ({"use_vllm": True, "vllm_max_model_length": 512}, "vllm_max_model_length"),  # below seq_len 1024
    ({"generation_batch_size": 12, "num_generations": 4}, "generation_batch_size"),  # not a multiple of batch 8
])
def test_grpo_settings_trl_refuses_are_refused(fields, field):
    plan = TrainingPlan(model=MODEL, trainer="grpo", gpu="A100 80GB SXM", **fields)
    with pytest.raises(REFUSED) as info:
        estimate(plan)
    assert str(info.value).startswith(f"{field}:"), str(info.value)


def test_grpo_settings_trl_takes_are_taken():
    for fields in ({"generation_batch_size": 16}, {"steps_per_generation": 2}, {"loss_type": "dr_grpo"},
                   {"use_vllm": True, "vllm_max_model_length": 1024}, {"num_generations": 2}):
        est = estimate(TrainingPlan(model=MODEL, trainer="grpo", gpu="A100 80GB SXM", **fields))
        assert est.verdict == "fits"


# ---------------------------------------------------------------- what is estimated is what runs: adapter dtype


@pytest.mark.parametrize("method,adapter_dtype,expected", [
    ("lora", None, "float32"),  # PEFT keeps fp32 adapters on a 16-bit base (TRL's default)
    ("lora", "bf16", "bfloat16"),  # cohort v9 n04: the runtime ignored this and trained fp32 adapters
    ("qlora", None, "bfloat16"),  # TRL casts adapters to bf16 on a quantized base
    ("qlora", "fp32", "float32"),  # ... unless the plan says otherwise
])
def test_the_runtime_trains_the_adapter_dtype_the_estimate_counts(method, adapter_dtype, expected):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    if method == "qlora":
        pytest.importorskip("bitsandbytes")
    from canifinetune.estimator.model_sources import resolve_model
    from canifinetune.recipes import model_setup

    config = {**resolve_model("HuggingFaceTB/SmolLM2-135M").config, "num_hidden_layers": 1}
    plan = TrainingPlan(model="HuggingFaceTB/SmolLM2-135M", method=method, adapter_dtype=adapter_dtype,
                        gradient_checkpointing=False)
    with torch.device("meta"):
        model = model_setup.build_model(plan, config)
    dtypes = {str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.requires_grad}
    assert dtypes == {expected}
