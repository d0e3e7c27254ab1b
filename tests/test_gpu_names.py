"""GPU names as people write them (issue 15, point 2): nvidia-smi's names, memory suffixes, loose case and
spacing, PCIe/SXM, AMD names; ambiguous names are errors listing the candidates; "did you mean" ranks the
whole name, memory included. Also: enum fields are case-insensitive and target_modules takes a comma list."""

from __future__ import annotations

import pytest

from canifinetune.estimator.catalog import find_gpu, load_gpus, lookup_gpu, search_gpus, suggest_gpus
from canifinetune.estimator.errors import UnknownGPUError
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.gpu_names import MAX_GPU_COUNT, split_gpu_count
from canifinetune.estimator.plan import MAX_NUM_GPUS, TrainingPlan

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
    # older cards, as nvidia-smi prints them (Kaggle's P100)
    ("Tesla P100-PCIE-16GB", "Tesla P100"),
    ("P100", "Tesla P100"),
    ("Tesla P100", "Tesla P100"),
    ("NVIDIA Tesla P100", "Tesla P100"),
    ("p100 16gb", "Tesla P100"),
    ("Tesla V100-SXM2-16GB", "Tesla V100 16GB"),
    # hosted notebooks, named by their service
    ("Colab T4", "Tesla T4"),
    ("colab t4", "Tesla T4"),
    ("Google Colab T4", "Tesla T4"),
    ("google colab t4", "Tesla T4"),
    ("colab free", "Tesla T4"),  # the free tier is a T4 16GB
    ("Colab Free Tier", "Tesla T4"),
    ("free colab", "Tesla T4"),
    ("Colab free T4", "Tesla T4"),
    ("Colab T4 15GB", "Tesla T4"),  # what the notebook shows
    ("Colab A100", "A100 40GB SXM"),  # Colab's A100 is the 40 GB SXM4 card
    ("Google Colab A100", "A100 40GB SXM"),
    ("Colab Pro A100", "A100 40GB SXM"),
    ("Colab Pro+ A100", "A100 40GB SXM"),
    ("Colab A100 80GB", "A100 80GB SXM"),  # a stated size beyond the service's card: the catalog's card of that size
    ("Colab L4", "L4"),
    ("Google Colab L4", "L4"),
    ("Colab V100", "Tesla V100 16GB"),
    ("Kaggle P100", "Tesla P100"),
    ("kaggle p100 16gb", "Tesla P100"),
    ("Kaggle T4", "Tesla T4"),
    ("T4 on Kaggle", "Tesla T4"),
    ("Kaggle GPU T4", "Tesla T4"),
    # plurals, after a count or not
    ("RTX 4090s", "RTX 4090"),
    ("H100s", "H100 SXM"),
    ("L40s", "L40S"),  # not a plural: the L40S
]

# (spelling, the candidates the ambiguity error must list)
AMBIGUOUS = [
    ("A100", A100_40 + A100_80),
    ("nvidia a100", A100_40 + A100_80),
    ("a100 sxm", ("A100 40GB SXM", "A100 80GB SXM")),
    ("A100 PCIe", ("A100 40GB PCIe", "A100 80GB PCIe")),
    ("Tesla V100", ("Tesla V100 16GB", "Tesla V100 32GB")),
    ("v100 sxm2", ("Tesla V100 16GB", "Tesla V100 32GB")),
    ("colab", ("Tesla T4", "Tesla V100 16GB", "L4", "A100 40GB SXM")),  # a service alone: the cards it offers
    ("Google Colab", ("Tesla T4", "Tesla V100 16GB", "L4", "A100 40GB SXM")),
    ("Colab Pro", ("Tesla T4", "Tesla V100 16GB", "L4", "A100 40GB SXM")),
    ("Kaggle", ("Tesla P100", "Tesla T4")),  # Kaggle's accelerators: a P100 16GB or two T4s
    ("Kaggle GPU", ("Tesla P100", "Tesla T4")),
    ("A100s", A100_40 + A100_80),
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


# (gpu value, the count it states, the card name left) for split_gpu_count, and the catalog card that name is
COUNTS = [
    ("2x RTX 4090", 2, "RTX 4090", "RTX 4090"),
    ("2 x RTX 4090", 2, "RTX 4090", "RTX 4090"),
    ("2X RTX 4090", 2, "RTX 4090", "RTX 4090"),
    ("2x 4090", 2, "4090", "RTX 4090"),
    ("2x RTX 4090s", 2, "RTX 4090s", "RTX 4090"),
    ("8xH100", 8, "H100", "H100 SXM"),
    ("8x H100 80GB", 8, "H100 80GB", "H100 SXM"),
    ("8 x H100 SXM", 8, "H100 SXM", "H100 SXM"),
    ("8×A100 80GB", 8, "A100 80GB", "A100 80GB SXM"),
    ("8 × A100 80GB", 8, "A100 80GB", "A100 80GB SXM"),
    ("8*A100 80GB", 8, "A100 80GB", "A100 80GB SXM"),
    ("4x A100-SXM4-80GB", 4, "A100-SXM4-80GB", "A100 80GB SXM"),
    ("4x NVIDIA A100-SXM4-40GB", 4, "NVIDIA A100-SXM4-40GB", "A100 40GB SXM"),
    ("8x MI300X", 8, "MI300X", "MI300X"),
    ("8x L40S", 8, "L40S", "L40S"),
    ("1x H100", 1, "H100", "H100 SXM"),
    ("1024x H100", 1024, "H100", "H100 SXM"),
    ("RTX 4090 x2", 2, "RTX 4090", "RTX 4090"),
    ("RTX 3090 x 4", 4, "RTX 3090", "RTX 3090"),
    ("H100×8", 8, "H100", "H100 SXM"),
    ("A100 80GB x8", 8, "A100 80GB", "A100 80GB SXM"),
    ("T4 (x2)", 2, "T4", "Tesla T4"),
    ("T4x2", 2, "T4", "Tesla T4"),
    ("dual RTX 3090", 2, "RTX 3090", "RTX 3090"),
    ("Dual RTX A6000", 2, "RTX A6000", "RTX A6000"),
    ("quad RTX 4090", 4, "RTX 4090", "RTX 4090"),
    ("Kaggle T4 x2", 2, "Kaggle T4", "Tesla T4"),  # Kaggle's "GPU T4 x2" accelerator
    ("Kaggle T4x2", 2, "Kaggle T4", "Tesla T4"),
    ("Kaggle 2xT4", 2, "Kaggle T4", "Tesla T4"),
    ("Kaggle 2 x T4", 2, "Kaggle T4", "Tesla T4"),
    ("Kaggle GPU T4 x2", 2, "Kaggle GPU T4", "Tesla T4"),
    ("Google Colab 1x A100", 1, "Google Colab A100", "A100 40GB SXM"),
    # no count: the name as written, stripped
    ("Colab T4", None, "Colab T4", "Tesla T4"),
    ("Kaggle P100", None, "Kaggle P100", "Tesla P100"),
    ("  RTX 4090  ", None, "RTX 4090", "RTX 4090"),
    ("MI300X", None, "MI300X", "MI300X"),
    ("NVIDIA GH200 480GB", None, "NVIDIA GH200 480GB", "GH200"),
    ("RTX 6000 Ada", None, "RTX 6000 Ada", "RTX 6000 Ada"),
]

# gpu values whose count is wrong, and what the error says
BAD_COUNTS = [
    ("0x H100", "asks for 0 GPUs"),
    ("0 x RTX 4090", "asks for 0 GPUs"),
    ("RTX 4090 x0", "asks for 0 GPUs"),
    ("1.5x H100", "whole number"),
    ("2048x H100", "from 1 to 1024"),
    ("1025x H100", "from 1 to 1024"),
    ("2x H100 x4", "twice"),
    ("dual RTX 3090 x2", "twice"),
]


def test_the_table_is_large_enough():
    assert len(RESOLVES) + len(AMBIGUOUS) + len(REFUSED) >= 60
    assert len(COUNTS) + len(BAD_COUNTS) >= 40


@pytest.mark.parametrize("text, count, card, expected", COUNTS)
def test_split_gpu_count(text, count, card, expected):
    assert split_gpu_count(text) == (count, card)
    found = lookup_gpu(text)
    assert found.status == "found" and found.entry is not None, (text, found.status, found.candidates)
    assert (found.entry.name, found.count) == (expected, count)
    assert find_gpu(text).name == expected


@pytest.mark.parametrize("text, words", BAD_COUNTS)
def test_a_bad_count_is_an_error(text, words):
    with pytest.raises(UnknownGPUError) as err:
        split_gpu_count(text)
    assert err.value.field == "gpu" and words in str(err.value) and f"'{text}'" in str(err.value)
    assert isinstance(err.value, ValueError)  # pydantic turns it into a validation error inside a validator
    found = lookup_gpu(text)
    assert found.entry is None and found.status == "bad_count"
    assert found.message().startswith(f"gpu: '{text}'") and words in found.message()
    assert find_gpu(text) is None and search_gpus(text) == []


def test_no_catalog_name_reads_as_a_count():
    """Every name and alias of the catalog is a card, never 'a count of' something ('MI300X', 'GH200 480GB')."""
    for gpu in load_gpus():
        for name in (gpu.name, *gpu.aliases):
            assert split_gpu_count(name) == (None, name), name


def test_count_bounds_match_the_plan():
    assert MAX_GPU_COUNT == MAX_NUM_GPUS


def test_split_gpu_count_takes_only_text():
    with pytest.raises(TypeError):
        split_gpu_count(2)  # type: ignore[arg-type]
    assert split_gpu_count("") == (None, "")
    assert split_gpu_count("8x") == (None, "8x")  # no card after the count: not a count
    assert split_gpu_count("x8") == (None, "x8")


def test_a_count_with_an_unknown_card_suggests_the_card():
    found = lookup_gpu("2x RTX 4900")
    assert found.status == "unknown" and found.count == 2 and found.candidates[0] == "RTX 4090"
    assert found.message().startswith("gpu: '2x RTX 4900' is not in the GPU catalog; did you mean 'RTX 4090'")
    assert suggest_gpus("8x rtx 4900")[0] == "RTX 4090"


def test_search_takes_a_count():
    assert [g.name for g in search_gpus("2x RTX 4090")] == ["RTX 4090"]
    assert [g.name for g in search_gpus("Kaggle T4 x2")] == ["Tesla T4"]


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
