"""GPU names as people write them (issue 15, point 2): nvidia-smi's names, memory suffixes, loose case and
spacing, PCIe/SXM, AMD names; ambiguous names are errors listing the candidates; "did you mean" ranks the
whole name, memory included. Also: enum fields are case-insensitive and target_modules takes a comma list."""

from __future__ import annotations

import pytest

from canifinetune.estimator.catalog import find_gpu, lookup_gpu, search_gpus, suggest_gpus
from canifinetune.estimator.errors import UnknownGPUError
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.plan import TrainingPlan

A100_40 = ("A100 40GB PCIe", "A100 40GB SXM")
A100_80 = ("A100 80GB PCIe", "A100 80GB SXM")

# (spelling, the catalog entry it must resolve to)
RESOLVES = [
    # nvidia-smi --query-gpu=name, as printed
    ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA GeForce RTX 3090", "RTX 3090"),
    ("NVIDIA GeForce RTX 3060", "RTX 3060 12GB"),
    ("NVIDIA GeForce RTX 3080", "RTX 3080"),
    ("NVIDIA GeForce RTX 4060 Ti", "RTX 4060 Ti 16GB"),
    ("NVIDIA GeForce RTX 4070", "RTX 4070"),
    ("NVIDIA GeForce RTX 4080", "RTX 4080"),
    ("NVIDIA GeForce RTX 5080", "RTX 5080"),
    ("NVIDIA GeForce RTX 5090", "RTX 5090"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB SXM"),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB PCIe"),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA GH200 480GB", "GH200"),
    ("NVIDIA B200", "B200"),
    ("Tesla T4", "Tesla T4"),
    ("Tesla V100-SXM2-16GB", "Tesla V100 16GB"),
    ("Tesla V100-SXM2-32GB", "Tesla V100 32GB"),
    ("Tesla V100-PCIE-32GB", "Tesla V100 32GB"),  # the catalog lists one V100 32GB: the form factor is ignored
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40", "L40"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA A10G", "A10G"),
    ("NVIDIA A40", "A40"),
    ("NVIDIA RTX A6000", "RTX A6000"),
    ("NVIDIA RTX A5000", "RTX A5000"),
    ("NVIDIA RTX A4000", "RTX A4000"),
    ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
    ("AMD Instinct MI300X", "MI300X"),
    ("AMD Instinct MI250X", "MI250X"),
    ("AMD Instinct MI325X", "MI325X"),
    # a memory suffix, written every way
    ("RTX 4090 24GB", "RTX 4090"),
    ("rtx 4090 24 gb", "RTX 4090"),
    ("RTX4090-24G", "RTX 4090"),
    ("4090 24GiB", "RTX 4090"),
    ("T4 16GB", "Tesla T4"),
    ("T4 15GB", "Tesla T4"),  # what nvidia-smi and Colab report for the 16 GB card
    ("L40S 48GB", "L40S"),
    ("a100 80g", "A100 80GB SXM"),
    ("A100 40 GB", "A100 40GB SXM"),
    ("A100-80GB", "A100 80GB SXM"),
    ("a100 80gb sxm4", "A100 80GB SXM"),
    ("A100 SXM 40GB", "A100 40GB SXM"),
    ("A100 PCIe 80GB", "A100 80GB PCIe"),
    ("h100 sxm5 80gb", "H100 SXM"),
    ("H100 PCIe 80GB", "H100 PCIe"),
    ("H200 141GB", "H200"),
    ("mi300x 192gb", "MI300X"),
    ("MI250X 64GB", "MI250X"),  # one GCD, as ROCm shows it
    ("RTX 3060 12GB", "RTX 3060 12GB"),
    ("RTX 3080 10GB", "RTX 3080"),
    ("RTX 4060 Ti 16GB", "RTX 4060 Ti 16GB"),
    ("A6000 48GB", "RTX A6000"),
    ("RTX 6000 Ada 48GB", "RTX 6000 Ada"),
    ("B200 180GB", "B200"),
    ("V100 32GB", "Tesla V100 32GB"),
    ("A10 24GB", "A10"),
    # a size without its GB, after a name the catalog knows
    ("h100 80", "H100 SXM"),
    ("rtx 4090 24", "RTX 4090"),
    ("A100 PCIe 40", "A100 40GB PCIe"),
    ("a100 80", "A100 80GB SXM"),
    # loose case, spacing and punctuation
    ("rtx4090", "RTX 4090"),
    ("RTX_4090", "RTX 4090"),
    ("  geforce   rtx 4090 ", "RTX 4090"),
    ("rtx-3090", "RTX 3090"),
    ("l40-s", "L40S"),
    ("h100", "H100 SXM"),
    ("H100 SXM", "H100 SXM"),
    ("h-100 pcie", "H100 PCIe"),
    ("t4", "Tesla T4"),
    ("nvidia t4", "Tesla T4"),
    ("a10g", "A10G"),
    ("4060ti", "RTX 4060 Ti 16GB"),
    ("mi300x", "MI300X"),
    ("Instinct MI300X", "MI300X"),
]

# (spelling, the candidates the ambiguity error must list)
AMBIGUOUS = [
    ("A100", A100_40 + A100_80),
    ("nvidia a100", A100_40 + A100_80),
    ("a100 sxm", ("A100 40GB SXM", "A100 80GB SXM")),
    ("A100 PCIe", ("A100 40GB PCIe", "A100 80GB PCIe")),
    ("Tesla V100", ("Tesla V100 16GB", "Tesla V100 32GB")),
    ("v100 sxm2", ("Tesla V100 16GB", "Tesla V100 32GB")),
]

# (spelling, what the error says, the first "did you mean" or None)
REFUSED = [
    ("RTX 4090 16GB", "no 16 GB version", None),
    ("RTX 3060 8GB", "no 8 GB version", None),
    ("RTX 4060 Ti 8GB", "gpu_vram_gb=8", None),
    ("RTX 4090 16", "no 16 GB version", None),
    ("RTX 4090 Laptop GPU", "laptop GPU", None),
    ("M2 Max", "Apple silicon", None),
    ("Apple M3 Ultra", "Apple silicon", None),
    ("rtx 4900", "did you mean", "RTX 4090"),
    ("RTX 4900 24GB", "did you mean", "RTX 4090"),
    ("RTX 3090 Ti", "did you mean", "RTX 3090"),
    ("RTX 4060", "did you mean", "RTX 4060 Ti 16GB"),
    ("NVIDIA H200 NVL", "did you mean", "H200"),
    ("RTX 6000", "did you mean", "RTX 6000 Ada"),
    ("Quadro RTX 6000", "not in the GPU catalog", None),
    ("mi300", "did you mean", "MI300X"),
]


def test_the_table_is_large_enough():
    assert len(RESOLVES) + len(AMBIGUOUS) + len(REFUSED) >= 60


@pytest.mark.parametrize("name, expected", RESOLVES)
def test_resolves(name, expected):
    found = lookup_gpu(name)
    assert found.status == "found" and found.entry is not None, (name, found.status, found.candidates)
    assert found.entry.name == expected
    assert find_gpu(name).name == expected


@pytest.mark.parametrize("name, candidates", AMBIGUOUS)
def test_ambiguous_is_an_error_listing_the_candidates(name, candidates):
    found = lookup_gpu(name)
    assert found.entry is None and found.status == "ambiguous"
    assert set(found.candidates) == set(candidates)
    with pytest.raises(UnknownGPUError) as err:
        estimate(TrainingPlan(model="Qwen/Qwen2.5-0.5B", gpu=name))
    message = str(err.value)
    assert "ambiguous" in message and all(f"'{c}'" in message for c in candidates)
    assert err.value.field == "gpu"


@pytest.mark.parametrize("name, words, first", REFUSED)
def test_refused_with_a_sentence(name, words, first):
    found = lookup_gpu(name)
    assert found.entry is None
    with pytest.raises(UnknownGPUError) as err:
        estimate(TrainingPlan(model="Qwen/Qwen2.5-0.5B", gpu=name))
    message = str(err.value)
    assert message.startswith(f"gpu: '{name}'") and words in message, message
    assert "gpu_vram_gb" in message and "  " not in message and ". Or" not in message
    if first is not None:
        assert suggest_gpus(name)[0] == first


def test_did_you_mean_ranks_the_whole_name_memory_included():
    assert suggest_gpus("RTX 4090 24GB")[0] == "RTX 4090"
    assert suggest_gpus("RTX 4900 24GB")[0] == "RTX 4090"
    assert suggest_gpus("RTX 3060 8GB")[0] == "RTX 3060 12GB"
    assert suggest_gpus("h100 94gb")[:1] == ["H100 NVL"] or "H100 NVL" in suggest_gpus("h100 94gb")[:3]


def test_search_takes_a_whole_nvidia_smi_name():
    assert [g.name for g in search_gpus("NVIDIA GeForce RTX 4090")] == ["RTX 4090"]
    assert {g.name for g in search_gpus("NVIDIA A100")} == set(A100_40 + A100_80)


@pytest.mark.parametrize("field, spelt, value", [
    ("method", "QLoRA", "qlora"), ("method", " LoRA ", "lora"), ("optim", "AdamW_Torch_Fused", "adamw_torch_fused"),
    ("dtype", "BF16", "bf16"), ("sharding", "ZeRO3", "zero3"), ("attn_implementation", "SDPA", "sdpa"),
    ("framework", "TRL", "trl"), ("bnb_4bit_quant_type", "NF4", "nf4"), ("loss_implementation", "Chunked", "chunked"),
])
def test_enum_values_are_case_insensitive(field, spelt, value):
    assert getattr(TrainingPlan(model="Qwen/Qwen2.5-0.5B", **{field: spelt}), field) == value


@pytest.mark.parametrize("spelt, value", [
    ("q_proj,v_proj", ["q_proj", "v_proj"]), (" q_proj , v_proj ,", ["q_proj", "v_proj"]),
    ("q_proj", ["q_proj"]), ("all-linear", "all-linear"), ("ALL-LINEAR", "all-linear"),
    (["v_proj", "q_proj"], ["q_proj", "v_proj"]),
])
def test_target_modules_takes_a_comma_separated_string(spelt, value):
    assert TrainingPlan(model="Qwen/Qwen2.5-0.5B", method="lora", target_modules=spelt).target_modules == value


def test_a_misspelt_choice_is_still_refused():
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        TrainingPlan(model="Qwen/Qwen2.5-0.5B", method="qlor")


def test_the_mcp_tools_read_them_the_same_way():
    """The tools' own argument check (built from the plan's fields) lower-cases choices and splits lists too."""
    mcp_server = pytest.importorskip("canifinetune.server.mcp_server")
    from pydantic import TypeAdapter

    params = {p.name: p.annotation for p in mcp_server.plan_parameters()}
    assert TypeAdapter(params["method"]).validate_python("QLoRA") == "qlora"
    assert TypeAdapter(params["optim"]).validate_python("AdamW_Torch_Fused") == "adamw_torch_fused"
    assert TypeAdapter(params["dtype"]).validate_python("BF16") == "bf16"
    assert TypeAdapter(params["target_modules"]).validate_python("q_proj,v_proj") == ["q_proj", "v_proj"]
    assert TypeAdapter(params["target_modules"]).validate_python("all-linear") == "all-linear"
