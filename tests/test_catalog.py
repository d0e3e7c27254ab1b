"""The built-in model and GPU catalogs: contents, forgiving lookups, suggestions and the numbers themselves."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from canifinetune.estimator import catalog
from canifinetune.estimator.catalog import (
    CatalogGPU,
    CatalogModel,
    find_gpu,
    find_model,
    load_gpus,
    load_models,
    search_gpus,
    search_models,
    suggest_gpus,
    suggest_models,
)
from canifinetune.estimator.spec import ESTIMATED_VISION_TYPES, ModelSpec

GIB = 2**30

# ------------------------------------------------------------------------------------------ contents

REQUIRED_FAMILIES = {
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "qwen2_moe",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "olmo2",
}

REQUIRED_MODELS = [
    "meta-llama/Llama-2-7b-hf",
    "meta-llama/Llama-2-13b-hf",
    "meta-llama/Meta-Llama-3-8B",
    "meta-llama/Llama-3.1-8B",
    "meta-llama/Llama-3.1-70B",
    "meta-llama/Llama-3.2-1B",
    "meta-llama/Llama-3.2-3B",
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
    "HuggingFaceTB/SmolLM2-135M",
    "HuggingFaceTB/SmolLM2-360M",
    "HuggingFaceTB/SmolLM2-1.7B",
    "mistralai/Mistral-7B-v0.1",
    "mistralai/Mistral-7B-v0.3",
    "mistralai/Mistral-Nemo-Base-2407",
    "mistralai/Mixtral-8x7B-v0.1",
    "Qwen/Qwen2-0.5B",
    "Qwen/Qwen2-1.5B",
    "Qwen/Qwen2-7B",
    "Qwen/Qwen2.5-0.5B",
    "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen/Qwen2.5-1.5B",
    "Qwen/Qwen2.5-1.5B-Instruct",
    "Qwen/Qwen2.5-3B",
    "Qwen/Qwen2.5-7B",
    "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen2.5-14B-Instruct",
    "Qwen/Qwen2.5-32B-Instruct",
    "Qwen/Qwen2.5-72B-Instruct",
    "Qwen/Qwen2.5-Coder-7B",
    "Qwen/Qwen3-0.6B",
    "Qwen/Qwen3-1.7B",
    "Qwen/Qwen3-4B",
    "Qwen/Qwen3-8B",
    "Qwen/Qwen3-14B",
    "Qwen/Qwen3-32B",
    "Qwen/Qwen1.5-MoE-A2.7B",
    "Qwen/Qwen3-30B-A3B",
    "google/gemma-2b",
    "google/gemma-7b",
    "google/gemma-2-2b-it",
    "google/gemma-2-9b-it",
    "google/gemma-2-27b-it",
    "google/gemma-3-1b-it",
    "microsoft/Phi-3-mini-4k-instruct",
    "microsoft/Phi-3.5-mini-instruct",
    "allenai/OLMo-2-1124-7B",
]

REQUIRED_GPUS = [
    "Tesla P100", "Tesla T4", "Tesla V100 16GB", "Tesla V100 32GB", "A10", "A10G", "L4", "L40S",
    "A100 40GB PCIe", "A100 40GB SXM", "A100 80GB PCIe", "A100 80GB SXM",
    "H100 PCIe", "H100 SXM", "H100 NVL", "H200", "GH200", "B200", "MI250X", "MI300X", "MI325X",
    "RTX A4000", "RTX A5000", "RTX A6000", "RTX 6000 Ada",
    "RTX 3060 12GB", "RTX 3080", "RTX 3090", "RTX 4060 Ti 16GB", "RTX 4070", "RTX 4080", "RTX 4090",
    "RTX 5080", "RTX 5090",
]  # fmt: skip

ARCH_FIELDS = (
    "model_type", "architectures", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "tie_word_embeddings", "max_position_embeddings",
    "torch_dtype", "rms_norm_eps",
)  # fmt: skip


def test_counts():
    assert len(load_models()) >= 40
    assert len(load_gpus()) >= 30


def test_loads_are_cached_and_typed():
    assert load_models() is load_models()
    assert load_gpus() is load_gpus()
    assert all(isinstance(m, CatalogModel) for m in load_models())
    assert all(isinstance(g, CatalogGPU) for g in load_gpus())


def test_every_family_present():
    assert {m.family for m in load_models()} >= REQUIRED_FAMILIES


@pytest.mark.parametrize("model_id", REQUIRED_MODELS)
def test_required_model_present(model_id):
    m = find_model(model_id)
    assert m is not None and m.id == model_id


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_required_gpu_present(name):
    g = find_gpu(name)
    assert g is not None and g.name == name


def test_no_apple_gpus():
    assert not [g for g in load_gpus() if g.vendor not in ("nvidia", "amd")]


def test_ids_and_names_unique():
    ids = [m.id for m in load_models()]
    assert len(ids) == len(set(ids))
    names = [g.name for g in load_gpus()]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("model", load_models(), ids=lambda m: m.id)
def test_model_entry_well_formed(model):
    assert "/" in model.id
    assert model.params_published > 0 and model.params_source
    assert model.config_source
    assert isinstance(model.gated, bool)
    cfg = model.config_dict()
    vision = cfg["model_type"] in ESTIMATED_VISION_TYPES
    # a VLM's language model may leave its shape to its config class's defaults (llava-1.5's text_config does): the
    # text fields are checked on the spec read from it
    for key in ("model_type", "architectures") if vision else ARCH_FIELDS:
        assert key in model.config, key
    assert cfg["model_type"] == model.family
    # a causal LM, or a vision-language model the estimate reads (its ForConditionalGeneration wrapper)
    head = "ForConditionalGeneration" if vision else "ForCausalLM"
    assert isinstance(cfg["architectures"], list) and cfg["architectures"][0].endswith(head)
    if vision:
        spec = ModelSpec.from_config(cfg)
        assert spec.vision is not None and spec.num_heads % spec.num_kv_heads == 0
    else:
        assert cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0
        assert "head_dim" in cfg or cfg["hidden_size"] % cfg["num_attention_heads"] == 0
    # the weights' dtype: top-level torch_dtype, or (transformers 4.56+ configs: Qwen3-VL) dtype in its text_config
    dtype = cfg.get("torch_dtype") or (cfg.get("text_config") or {}).get("dtype") if vision else cfg["torch_dtype"]
    assert dtype in ("bfloat16", "float16", "float32")
    if model.is_moe:
        assert "num_experts_per_tok" in cfg
    json.dumps(cfg)  # plain JSON, usable as a config.json


def test_config_is_read_only_and_copies_are_fresh():
    m = find_model("Qwen/Qwen2.5-1.5B-Instruct")
    with pytest.raises(TypeError):
        m.config["hidden_size"] = 1  # type: ignore[index]
    cfg = m.config_dict()
    cfg["hidden_size"] = 1
    assert m.config["hidden_size"] == 1536


def test_moe_fields():
    mixtral = find_model("mistralai/Mixtral-8x7B-v0.1").config
    assert (mixtral["num_local_experts"], mixtral["num_experts_per_tok"]) == (8, 2)
    qmoe = find_model("Qwen/Qwen1.5-MoE-A2.7B").config
    assert (qmoe["num_experts"], qmoe["num_experts_per_tok"], qmoe["moe_intermediate_size"]) == (60, 4, 1408)
    assert qmoe["shared_expert_intermediate_size"] == 5632 and qmoe["decoder_sparse_step"] == 1
    q3 = find_model("Qwen/Qwen3-30B-A3B").config
    assert (q3["num_experts"], q3["num_experts_per_tok"], q3["moe_intermediate_size"]) == (128, 8, 768)
    assert q3["norm_topk_prob"] is True and tuple(q3["mlp_only_layers"]) == ()


# ------------------------------------------------------------------------------------------ lookups


@pytest.mark.parametrize(
    "query, expected",
    [
        ("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct"),
        ("qwen/qwen2.5-1.5b-instruct", "Qwen/Qwen2.5-1.5B-Instruct"),
        ("Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct"),
        ("qwen2.5 1.5b instruct", "Qwen/Qwen2.5-1.5B-Instruct"),
        ("  QWEN 2.5 1.5B  INSTRUCT ", "Qwen/Qwen2.5-1.5B-Instruct"),
        ("qwen2.5_1.5b_instruct", "Qwen/Qwen2.5-1.5B-Instruct"),
        ("llama 3.1 8b", "meta-llama/Llama-3.1-8B"),
        ("Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
        ("llama 3 8b", "meta-llama/Meta-Llama-3-8B"),
        ("llama 2 7b", "meta-llama/Llama-2-7b-hf"),
        ("tinyllama", "TinyLlama/TinyLlama-1.1B-Chat-v1.0"),
        ("mistral 7b", "mistralai/Mistral-7B-v0.1"),
        ("mixtral 8x7b", "mistralai/Mixtral-8x7B-v0.1"),
        ("qwen3 8b", "Qwen/Qwen3-8B"),
        ("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B"),
        ("gemma 2 9b it", "google/gemma-2-9b-it"),
        ("gemma-3-1b-it", "google/gemma-3-1b-it"),
        ("phi-3-mini", "microsoft/Phi-3-mini-4k-instruct"),
        ("olmo 2 7b", "allenai/OLMo-2-1124-7B"),
    ],
)
def test_find_model_forgiving(query, expected):
    m = find_model(query)
    assert m is not None, query
    assert m.id == expected


@pytest.mark.parametrize(
    "query, expected",
    [
        ("rtx4090", "RTX 4090"),
        ("RTX 4090", "RTX 4090"),
        ("4090", "RTX 4090"),
        ("GeForce RTX 4090", "RTX 4090"),
        ("a100 80gb", "A100 80GB SXM"),
        ("A100-SXM4-80GB", "A100 80GB SXM"),
        ("a100 80gb pcie", "A100 80GB PCIe"),
        ("a100 40gb", "A100 40GB SXM"),
        ("h100", "H100 SXM"),
        ("H100 PCIe", "H100 PCIe"),
        ("t4", "Tesla T4"),
        ("v100 32gb", "Tesla V100 32GB"),
        ("mi300x", "MI300X"),
        ("rtx 6000 ada", "RTX 6000 Ada"),
        ("4060ti", "RTX 4060 Ti 16GB"),
        ("3060", "RTX 3060 12GB"),
        ("a6000", "RTX A6000"),
    ],
)
def test_find_gpu_forgiving(query, expected):
    g = find_gpu(query)
    assert g is not None, query
    assert g.name == expected


@pytest.mark.parametrize("query", ["", "   ", "gpt-5", "nonexistent/model", "qwen2.5 1.5 instrct", "!!!"])
def test_find_model_unknown(query):
    assert find_model(query) is None


@pytest.mark.parametrize("query", ["", "rtx 4900", "apple m2", "tpu v5"])
def test_find_gpu_unknown(query):
    assert find_gpu(query) is None


def test_non_string_lookups_are_none():
    assert find_model(None) is None  # type: ignore[arg-type]
    assert find_gpu(4090) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("query", ["qwen 1.5b", "qwen2.5", "smollm2", "llama"])
def test_ambiguous_model_is_none(query):
    assert find_model(query) is None
    assert len(suggest_models(query)) >= 2


@pytest.mark.parametrize("query", ["a100", "v100", "a100 pcie"])
def test_ambiguous_gpu_is_none(query):
    assert find_gpu(query) is None


def test_ambiguous_gpu_suggests_the_candidates():
    assert set(suggest_gpus("a100")[:4]) == {"A100 40GB PCIe", "A100 40GB SXM", "A100 80GB PCIe", "A100 80GB SXM"}
    assert set(suggest_gpus("v100")[:2]) == {"Tesla V100 16GB", "Tesla V100 32GB"}


def test_clearly_best_candidate_resolves():
    # base model (no extra tokens) beats its Instruct sibling
    assert find_model("qwen2.5 7b").id == "Qwen/Qwen2.5-7B"
    assert find_model("mixtral").id == "mistralai/Mixtral-8x7B-v0.1"


def test_suggestions_for_typos():
    assert suggest_models("qwen2.5 1.5 instrct")[0] == "Qwen/Qwen2.5-1.5B-Instruct"
    assert suggest_gpus("rtx 4900")[0] == "RTX 4090"
    assert "meta-llama/Llama-3.1-8B" in suggest_models("lama 3.1 8b")
    assert suggest_gpus("h200x")[0] == "H200"


def test_suggestions_limit_and_junk():
    assert len(suggest_models("qwen", limit=3)) == 3
    assert suggest_models("qwen", limit=0) == []
    assert suggest_models("") == [] and suggest_gpus("   ") == []
    assert suggest_gpus("zzzzzzzz") == []


def test_search():
    assert len(search_models("")) == len(load_models())
    qwen3 = {m.id for m in search_models("qwen3")}
    assert "Qwen/Qwen3-8B" in qwen3 and "Qwen/Qwen2.5-3B" not in qwen3
    assert {m.id for m in search_models("qwen3_moe")} == {"Qwen/Qwen3-30B-A3B"}
    assert all("gemma" in m.id for m in search_models("gemma it"))
    assert {g.name for g in search_gpus("amd")} == {"MI250X", "MI300X", "MI325X"}
    consumer = search_gpus("consumer")
    assert consumer and all(g.category == "consumer" for g in consumer)
    assert "RTX 4090" in {g.name for g in search_gpus("rtx 40")}
    assert search_gpus("nothing-like-this") == []


def test_lookups_are_fast():
    import time

    start = time.perf_counter()
    for _ in range(200):
        find_model("qwen2.5 1.5b instruct")
        find_gpu("rtx4090")
        find_model("qwen 1.5b")
    assert time.perf_counter() - start < 1.0


# ------------------------------------------------------------------------------------------ GPU numbers

PRE_AMPERE = {"Tesla P100", "Tesla T4", "Tesla V100 16GB", "Tesla V100 32GB"}


@pytest.mark.parametrize("gpu", load_gpus(), ids=lambda g: g.name)
def test_gpu_numbers(gpu):
    assert gpu.memory_gb > 0 and gpu.total_memory_bytes > 0
    per_device_gb = gpu.memory_gb / gpu.runtime_devices
    assert gpu.total_memory_bytes <= per_device_gb * GIB * 1.01
    assert gpu.total_memory_bytes >= per_device_gb * GIB * 0.9
    assert gpu.tflops_fp16_dense > 0 and gpu.memory_bandwidth_gbs > 0
    assert gpu.source and gpu.total_memory_source
    assert gpu.vendor in ("nvidia", "amd") and gpu.category in ("datacenter", "workstation", "consumer")
    if gpu.bf16:
        assert gpu.tflops_bf16_dense is not None and gpu.tflops_bf16_dense > 0
    else:
        assert gpu.tflops_bf16_dense is None


def test_bf16_false_exactly_for_pre_ampere_nvidia():
    no_bf16 = {g.name for g in load_gpus() if not g.bf16}
    assert no_bf16 == PRE_AMPERE


def test_known_totals():
    assert find_gpu("t4").total_memory_bytes == 15360 * 2**20
    assert find_gpu("p100").total_memory_bytes == 16280 * 2**20
    assert find_gpu("a100 80gb").total_memory_bytes == 81920 * 2**20
    assert find_gpu("h100").total_memory_bytes == 81559 * 2**20
    assert find_gpu("mi250x").runtime_devices == 2


# ------------------------------------------------------------------------------------------ software per card

AMD_TARGETS = {"bitsandbytes": {"gfx908", "gfx90a", "gfx942", "gfx950"},  # bitsandbytes 0.50.2 README (Linux)
               "flash_attention_2": {"gfx90a", "gfx942", "gfx950"},  # flash-attn 2.8.3 setup.py allowed_archs
               "triton": {"gfx908", "gfx90a", "gfx942", "gfx950"}}  # triton's AMD TargetUtils.cpp (CDNA1-4)
NVIDIA_MIN_CC = {"bitsandbytes": (6, 0), "flash_attention_2": (8, 0), "triton": (7, 0)}


def _rule(gpu: CatalogGPU, backend: str) -> bool:
    """The rule docs/catalogs.md states for each backend, from the card's architecture alone."""
    if gpu.vendor == "amd":
        return gpu.arch in AMD_TARGETS[backend]
    return gpu.compute_capability >= NVIDIA_MIN_CC[backend]


@pytest.mark.parametrize("gpu", load_gpus(), ids=lambda g: g.name)
def test_every_card_records_its_architecture_backends_and_node_size(gpu):
    assert gpu.arch_source and ("https://" in gpu.arch_source)
    if gpu.vendor == "nvidia":
        assert gpu.arch.startswith("sm_") and gpu.compute_capability is not None
    else:
        assert gpu.arch.startswith("gfx") and gpu.compute_capability is None
    assert set(gpu.backends) == set(catalog.BACKENDS)
    for backend in catalog.BACKENDS:
        assert gpu.runs(backend) == _rule(gpu, backend), (gpu.name, backend)
        assert gpu.name in gpu.backend_source(backend) and gpu.arch in gpu.backend_source(backend)
    assert set(gpu.backend_notes) <= set(catalog.BACKENDS)
    assert isinstance(gpu.max_per_node, int) and 1 <= gpu.max_per_node <= 8
    if gpu.max_per_node_source is None:  # the rule: 8 in a datacenter machine, 4 in a workstation or desktop
        assert gpu.max_per_node == (8 if gpu.category == "datacenter" else 4), gpu.name


def test_backends_have_a_rule_and_a_source():
    backends = catalog.load_backends()
    assert tuple(backends) == catalog.BACKENDS == ("bitsandbytes", "flash_attention_2", "triton")
    for name, info in backends.items():
        assert info.name == name and info.provides and info.runs_on and info.source
    assert "0.50.2" in backends["bitsandbytes"].source
    assert "2.8.3" in backends["flash_attention_2"].source
    assert "torch/_inductor/exc.py" in backends["triton"].source


@pytest.mark.parametrize("name, bnb, fa2, triton", [
    ("Tesla P100", True, False, False),  # Pascal sm_60: bitsandbytes' minimum, below Triton's 7.0
    ("Tesla T4", True, False, True),  # Turing: no FlashAttention-2
    ("Tesla V100 16GB", True, False, True),  # Volta: no FlashAttention-2
    ("A10G", True, True, True),
    ("A100 80GB SXM", True, True, True),
    ("H100 SXM", True, True, True),
    ("B200", True, True, True),
    ("RTX 3090", True, True, True),
    ("RTX 5090", True, True, True),
    ("MI250X", True, True, True),  # gfx90a: in bitsandbytes' and flash-attn's ROCm targets
    ("MI300X", True, True, True),
    ("MI325X", True, True, True),  # gfx942, as the MI300X
])  # fmt: skip
def test_what_runs_on_known_cards(name, bnb, fa2, triton):
    gpu = find_gpu(name)
    assert (gpu.runs("bitsandbytes"), gpu.runs("flash_attention_2"), gpu.runs("triton")) == (bnb, fa2, triton)


def test_runs_refuses_an_unknown_backend():
    with pytest.raises(ValueError, match="flash_attention_2"):
        find_gpu("h100").runs("flash_attention_3")
    with pytest.raises(ValueError):
        find_gpu("h100").backend_source("deepspeed")


def test_compute_capability_and_node_sizes():
    assert find_gpu("t4").compute_capability == (7, 5)
    assert find_gpu("B200").compute_capability == (10, 0)
    assert find_gpu("RTX 5090").compute_capability == (12, 0)
    assert find_gpu("mi300x").compute_capability is None and find_gpu("mi300x").arch == "gfx942"
    assert find_gpu("h100").max_per_node == 8 and find_gpu("rtx 4090").max_per_node == 4
    assert find_gpu("RTX A6000").max_per_node == 4
    assert find_gpu("GH200").max_per_node == 4 and "GH200" in find_gpu("GH200").max_per_node_source
    assert find_gpu("MI250X").max_per_node == 8 and "GCD" in find_gpu("MI250X").max_per_node_source


def test_backend_caveats_are_recorded():
    assert "CUDA 11.8-12.6" in find_gpu("p100").backend_notes["bitsandbytes"]
    assert "CUDA 13" in find_gpu("v100 32gb").backend_notes["bitsandbytes"]
    assert "12.8" in find_gpu("rtx 5090").backend_source("flash_attention_2")


def test_catalog_gpus_hash_and_compare_by_their_fields():
    t4 = find_gpu("t4")
    assert t4 == find_gpu("Tesla T4") and hash(t4) == hash(find_gpu("T4"))
    assert len(set(load_gpus())) == len(load_gpus())


@pytest.mark.parametrize("query, expected", [
    ("Tesla T4", "Tesla T4"), ("T4", "Tesla T4"), ("Tesla P100", "Tesla P100"), ("P100", "Tesla P100"),
    ("Tesla P100-PCIE-16GB", "Tesla P100"), ("V100 16GB", "Tesla V100 16GB"), ("colab t4", "Tesla T4"),
    ("kaggle p100", "Tesla P100"), ("colab a100", "A100 40GB SXM"), ("colab l4", "L4"),
])  # fmt: skip
def test_find_gpu_old_and_hosted_names(query, expected):
    assert find_gpu(query).name == expected


def test_v100_stays_ambiguous():
    assert find_gpu("V100") is None and find_gpu("Tesla V100") is None


# ------------------------------------------------------------------------------------------ import hygiene


def test_import_does_not_pull_torch():
    code = (
        "import sys\n"
        "import canifinetune.estimator.catalog as c\n"
        "c.find_model('qwen2.5 1.5b instruct'); c.find_gpu('4090'); c.suggest_gpus('rtx 4900')\n"
        "bad = [m for m in ('torch', 'transformers', 'requests', 'huggingface_hub') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------------------ real parameter counts


def _meta_param_count(config: dict) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = dict(config)
    model_type = cfg.pop("model_type")
    hf_config = transformers.AutoConfig.for_model(model_type, **cfg)
    auto = (transformers.AutoModelForImageTextToText if model_type in ESTIMATED_VISION_TYPES
            else transformers.AutoModelForCausalLM)
    with torch.device("meta"):
        model = auto.from_config(hf_config)
    # parameters() yields a tied tensor once, so tied embeddings count once
    return sum(p.numel() for p in model.parameters())


_COUNT_CACHE: dict[str, int] = {}


@pytest.mark.slow
@pytest.mark.parametrize("model", load_models(), ids=lambda m: m.id)
def test_parameter_count_matches_published(model):
    pytest.importorskip("transformers")
    cfg = model.config_dict()
    key = json.dumps(cfg, sort_keys=True)
    if key not in _COUNT_CACHE:
        _COUNT_CACHE[key] = _meta_param_count(cfg)
    n = _COUNT_CACHE[key]
    rel = abs(n / model.params_published - 1)
    assert rel <= model.params_tolerance, (
        f"{model.id}: built {n:,} parameters, published {model.params_published:,} ({rel:.2%} off)"
    )


def test_tolerance_exceptions_are_explained():
    for m in load_models():
        if m.params_tolerance != 0.01:
            assert m.notes, m.id
            assert m.params_tolerance <= 0.05


def test_module_has_no_heavy_imports_at_top():
    with open(catalog.__file__, encoding="utf-8") as handle:
        src = handle.read()
    for mod in ("torch", "transformers", "requests", "huggingface_hub", "urllib"):
        assert f"import {mod}" not in src
