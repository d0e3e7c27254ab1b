"""Vision-language specs from config.json, checked tensor by tensor against transformers models on the meta device.

Each family's ``<Family>ForConditionalGeneration`` is built from a small config and from the published configs of
estimator/data/vlm_configs.json; its ``model`` (the ``<Family>Model``) is split by parameter name into the vision
tower, the projector and the language model, and the spec must name every tower and projector parameter with its
shape and count each part exactly.
"""

import json
from pathlib import Path

import pytest

import canifinetune.estimator as estimator_package
from canifinetune.estimator.errors import ModelConfigError
from canifinetune.estimator.spec import (
    ENCODER_CONFIG_KEYS,
    ESTIMATED_VISION_TYPES,
    TEXT_CONFIG_DEFAULTS,
    VISION_LANGUAGE_MODEL_TYPES,
    ModelSpec,
    _text_config,
)
from canifinetune.estimator.vision_spec import VISION_MODEL_TYPES, VisionSpec, vision_spec_from_config

VLM_CONFIGS = Path(estimator_package.__file__).parent / "data" / "vlm_configs.json"
PUBLISHED = {entry["id"]: entry for entry in json.loads(VLM_CONFIGS.read_text())["configs"]}

# A small Llama text config for the wrappers whose language model is an AutoModel of text_config.
LLAMA_TEXT = dict(model_type="llama", vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
# Qwen-VL text sizes (flat in Qwen2-VL and Qwen2.5-VL configs): head_dim 128, whose rotary half the default
# mrope_section [16, 24, 24] fills.
QWEN_TEXT = dict(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, bos_token_id=1, eos_token_id=2)
CLIP_SMALL = dict(model_type="clip_vision_model", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, image_size=56, patch_size=14)

# Small configs of every family, exercising windowed and deepstack Qwen towers, the SigLIP pooling head, CLIP and
# SigLIP LLaVA towers, several vision_feature_layer entries, projector biases off, Mllama's local, global and
# cross-attention layers and pixel-shuffle factors.
SMALL_CONFIGS = {
    "qwen2_vl": dict(model_type="qwen2_vl", **QWEN_TEXT, vision_config=dict(
        depth=2, embed_dim=64, hidden_size=256, num_heads=4, mlp_ratio=4, patch_size=14)),
    "qwen2_5_vl": dict(model_type="qwen2_5_vl", **QWEN_TEXT, vision_config=dict(
        depth=4, hidden_size=64, intermediate_size=96, num_heads=4, out_hidden_size=256, patch_size=14,
        fullatt_block_indexes=[1, 3], window_size=112)),
    "qwen3_vl": dict(model_type="qwen3_vl", text_config=dict(
        QWEN_TEXT, head_dim=128, rope_scaling={"rope_type": "default", "mrope_section": [24, 20, 20]}),
        vision_config=dict(depth=3, hidden_size=64, intermediate_size=96, num_heads=4, out_hidden_size=256,
                           patch_size=16, num_position_embeddings=64, deepstack_visual_indexes=[0, 2])),
    "qwen3_vl_moe": dict(model_type="qwen3_vl_moe", text_config=dict(
        QWEN_TEXT, model_type="qwen3_vl_moe_text", head_dim=128, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=64, decoder_sparse_step=1, mlp_only_layers=[],
        rope_scaling={"rope_type": "default", "mrope_section": [24, 20, 20]}),
        vision_config=dict(depth=3, hidden_size=64, intermediate_size=96, num_heads=4, out_hidden_size=256,
                           patch_size=16, num_position_embeddings=64, deepstack_visual_indexes=[0, 2])),
    "gemma3": dict(model_type="gemma3", mm_tokens_per_image=4, text_config=dict(
        model_type="gemma3_text", vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=128), vision_config=dict(
        model_type="siglip_vision_model", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, image_size=56, patch_size=14, vision_use_head=False)),
    "mllama": dict(model_type="mllama", vision_config=dict(
        hidden_size=64, num_hidden_layers=4, num_global_layers=2, attention_heads=4, intermediate_size=128,
        vision_output_dim=192, intermediate_layers_indices=[1, 3], image_size=28, patch_size=14, max_num_tiles=2,
        supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]]), text_config=dict(
        vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, cross_attention_layers=[1, 3], bos_token_id=1, eos_token_id=2, pad_token_id=0)),
    "llava": dict(model_type="llava", vision_feature_layer=[-2, -1], multimodal_projector_bias=False,
                  vision_config=CLIP_SMALL, text_config=LLAMA_TEXT),
    "llava_siglip": dict(model_type="llava", vision_config=dict(CLIP_SMALL, model_type="siglip_vision_model"),
                         text_config=LLAMA_TEXT),
    "llava_next": dict(model_type="llava_next", vision_config=CLIP_SMALL, text_config=LLAMA_TEXT),
    "idefics3": dict(model_type="idefics3", scale_factor=2, text_config=LLAMA_TEXT, vision_config=dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=56,
        patch_size=14)),
    "smolvlm": dict(model_type="smolvlm", scale_factor=4, text_config=LLAMA_TEXT, vision_config=dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=56,
        patch_size=14)),
}
# transformers' own default config of each family (Gemma3Config's pairs a 224-pixel SigLIP with 256 tokens per
# image, more than its 196 patches, which the spec refuses): full-size towers, resolved when transformers is there.
DEFAULT_CASES = tuple(f"default:{model_type}" for model_type in VISION_MODEL_TYPES if model_type != "gemma3")
CASES: dict[str, dict | None] = {**{f"small:{name}": config for name, config in SMALL_CONFIGS.items()},
                                 **{entry_id: entry["config"] for entry_id, entry in PUBLISHED.items()},
                                 **dict.fromkeys(DEFAULT_CASES)}


def _config(case: str) -> dict:
    config = CASES[case]
    if config is None:
        transformers = pytest.importorskip("transformers")
        config = transformers.AutoConfig.for_model(case.removeprefix("default:")).to_dict()
    return config


def _meta_model(config: dict):
    """The transformers <Family>ForConditionalGeneration of ``config``, its parameters on the meta device."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.CONFIG_MAPPING[config["model_type"]].from_dict(json.loads(json.dumps(config)))
    with torch.device("meta"):
        return transformers.AutoModelForImageTextToText.from_config(hf_config)


def _part(name: str, spec: VisionSpec) -> str:
    """Which part of the <Family>Model a parameter belongs to: projector, tower or language model."""
    if any(name == path or name.startswith(path + ".") for path in spec.projector.module_paths):
        return "projector"
    if name.startswith(spec.tower.module_path + "."):
        return "tower"
    return "language_model"


def _measured(model, spec: VisionSpec) -> dict[str, int]:
    counts = {"tower": 0, "projector": 0, "language_model": 0, "cross_attention": 0}
    cross = tuple(f"language_model.layers.{i}." for i in spec.cross_attention_layers)
    for name, parameter in model.model.named_parameters():
        counts[_part(name, spec)] += parameter.numel()
        if name.startswith(cross):
            counts["cross_attention"] += parameter.numel()
    return counts


def _language_model_params(model, spec: VisionSpec) -> int:
    """The language model's parameters with its head (named_parameters lists a tied lm_head once, as the
    embedding)."""
    return sum(p.numel() for name, p in model.named_parameters()
               if not name.startswith("model.") or _part(name.removeprefix("model."), spec) == "language_model")


@pytest.fixture(scope="module")
def built():
    """(spec, model) per case, built once for the module's tests."""
    cache: dict[str, tuple] = {}

    def build(case: str):
        if case not in cache:
            config = _config(case)
            spec = vision_spec_from_config(config)
            assert spec is not None
            cache[case] = (spec, _meta_model(config))
        return cache[case]

    return build


@pytest.mark.parametrize("case", sorted(CASES))
def test_counts_match_transformers_exactly(case, built):
    spec, model = built(case)
    measured = _measured(model, spec)
    assert (spec.tower_params, spec.projector_params, spec.language_model_vision_params) == (
        measured["tower"], measured["projector"], measured["cross_attention"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_parameter_named_with_its_shape(case, built):
    """The spec lists every tower and projector parameter (and Mllama's cross-attention ones) with its shape."""
    spec, model = built(case)
    actual = {name: tuple(p.shape) for name, p in model.model.named_parameters()}
    expected = spec.parameter_shapes()
    assert {name: actual.get(name) for name in expected} == expected
    vision_side = {name for name in actual if _part(name, spec) != "language_model"}
    assert vision_side <= set(expected)


@pytest.mark.parametrize("case", sorted(CASES))
def test_listed_linears_are_linears_of_that_shape(case, built):
    torch = pytest.importorskip("torch")
    spec, model = built(case)
    groups = spec.tower.groups + spec.projector.groups + spec.language_model_groups
    checked = 0
    for group in groups:
        paths = group.module_paths()
        for path in {paths[0], paths[-1]} if paths else set():
            for lin in group.linears:
                module = model.model.get_submodule(".".join(p for p in (path, lin.name) if p))
                assert isinstance(module, torch.nn.Linear), (path, lin.name)
                assert (module.in_features, module.out_features, module.bias is not None) == (
                    lin.in_features, lin.out_features, lin.bias), (path, lin.name)
                checked += 1
    assert checked and spec.tower.block_linears


@pytest.mark.parametrize("case", sorted(CASES))
def test_language_model_part_matches_the_text_spec(case, built):
    """What is left after the tower and the projector is the language model that spec.ModelSpec counts (to 0.5%:
    ModelSpec reads these text model types as Llama-like, without Qwen2's q/k/v biases or Qwen3's q/k norms)."""
    spec, model = built(case)
    text = _text_config(_config(case))
    if "hidden_size" not in text:
        pytest.skip("text_config leaves hidden_size to transformers' defaults; ModelSpec needs it")
    # the language model alone (ModelSpec refuses the whole multimodal config): Qwen2/2.5-VL keep it at the top level
    text = {k: v for k, v in text.items() if k not in ENCODER_CONFIG_KEYS}
    if text.get("model_type") in VISION_LANGUAGE_MODEL_TYPES:
        text["model_type"] = f"{text['model_type']}_text"
    if ESTIMATED_VISION_TYPES.get(_config(case)["model_type"]) == "qwen3_moe":
        text["model_type"] = "qwen3_moe"  # an MoE read as a dense Llama-like model would be far off, not 0.5%
    if "tie_word_embeddings" in _config(case):  # the wrapper's value ties the head (estimator/spec.py)
        text["tie_word_embeddings"] = _config(case)["tie_word_embeddings"]
    # what transformers' text config class fills in where the published text_config is silent (gemma-3-4b-it's heads)
    text = {**TEXT_CONFIG_DEFAULTS.get(_config(case).get("model_type"), {}), **text}
    expected = ModelSpec.from_config(text).total_params
    measured = _language_model_params(model, spec)
    assert abs(measured - expected) <= 0.005 * expected, (measured, expected)


@pytest.mark.parametrize("checkpoint", sorted(i for i, entry in PUBLISHED.items() if "safetensors" in entry))
def test_published_checkpoint_size_matches(checkpoint, built):
    """The checkpoint's safetensors index (total_size) holds exactly the model's parameters: tower, projector
    (both from the spec) and language model."""
    spec, model = built(checkpoint)
    stored = PUBLISHED[checkpoint]["safetensors"]
    total = spec.tower_params + spec.projector_params + _language_model_params(model, spec)
    assert total * stored["bytes_per_param"] == stored["total_size"]


def test_published_configs_cover_these_families():
    covered = {entry["config"]["model_type"] for entry in PUBLISHED.values()}
    assert covered <= set(VISION_MODEL_TYPES)
    assert all(entry["config_source"] for entry in PUBLISHED.values())


def test_small_configs_cover_every_family():
    assert {config["model_type"] for config in SMALL_CONFIGS.values()} == set(VISION_MODEL_TYPES)


# ---------------------------------------------------------------------------
# What the spec records


def test_qwen2_5_vl_7b_layout():
    spec = vision_spec_from_config(PUBLISHED["Qwen/Qwen2.5-VL-7B-Instruct"]["config"])
    assert spec is not None
    tower = spec.tower
    assert (tower.hidden_size, tower.num_layers, tower.num_heads, tower.head_dim) == (1280, 32, 16, 80)
    assert (tower.mlp_kind, tower.norm_kind, tower.patch_size, tower.temporal_patch_size) == (
        "gated_mlp", "rmsnorm", 14, 2)
    assert tower.full_attention_layers == (7, 15, 23, 31) and tower.window_size == 112
    assert tower.image_size is None and not tower.has_cls_token
    assert [lin.name for lin in tower.block_linears] == [
        "attn.qkv", "attn.proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    assert (spec.projector.in_features, spec.projector.out_features, spec.projector.merge_factor) == (5120, 3584, 4)


def test_llava_1_5_layout():
    spec = vision_spec_from_config(PUBLISHED["llava-hf/llava-1.5-7b-hf"]["config"])
    assert spec is not None
    assert spec.tower.family == "clip" and spec.tower.has_cls_token
    assert (spec.tower.image_size, spec.tower.patches_per_image, spec.tower.num_position_embeddings) == (336, 576, 577)
    # the text_config leaves hidden_size to LlamaConfig's default, 4096
    assert [(lin.in_features, lin.out_features) for lin in spec.projector.linears] == [(1024, 4096), (4096, 4096)]


def test_mllama_cross_attention_lives_in_the_language_model():
    spec = vision_spec_from_config(SMALL_CONFIGS["mllama"])
    assert spec is not None
    assert spec.cross_attention_layers == (1, 3)
    assert spec.tower.num_layers == 6 and spec.tower.global_layers == 2
    assert spec.tower.intermediate_layers == (1, 3)
    assert spec.language_model_vision_params > 0
    assert spec.vision_params == spec.tower_params + spec.projector_params + spec.language_model_vision_params


def test_gemma3_projection_is_not_a_linear():
    spec = vision_spec_from_config(SMALL_CONFIGS["gemma3"])
    assert spec is not None
    assert spec.projector.linears == () and spec.projector.merge_factor == 4


# ---------------------------------------------------------------------------
# Inputs that are not a vision-language config, and bad ones


@pytest.mark.parametrize("config", [{"model_type": "llama", "hidden_size": 4096}, {"model_type": "gemma3_text"},
                                    {"model_type": 3}, {}])
def test_text_only_configs_give_none(config):
    assert vision_spec_from_config(config) is None


def test_a_non_object_config_is_refused():
    with pytest.raises(ModelConfigError):
        vision_spec_from_config(["qwen2_vl"])  # type: ignore[arg-type]


def _without(config: dict, section: str | None, key: str) -> dict:
    changed = json.loads(json.dumps(config))
    del (changed[section] if section else changed)[key]
    return changed


@pytest.mark.parametrize(
    "name, section, key, fragment",
    [
        ("qwen2_vl", None, "vision_config", "'vision_config'"),
        ("qwen2_vl", "vision_config", "embed_dim", "'vision_config.embed_dim'"),
        ("qwen2_5_vl", "vision_config", "out_hidden_size", "'vision_config.out_hidden_size'"),
        ("qwen3_vl", "vision_config", "depth", "'vision_config.depth'"),
        ("gemma3", "vision_config", "image_size", "'vision_config.image_size'"),
        ("gemma3", "text_config", "hidden_size", "'text_config.hidden_size'"),
        ("mllama", "vision_config", "vision_output_dim", "'vision_config.vision_output_dim'"),
        ("mllama", "text_config", "num_key_value_heads", "'text_config.num_key_value_heads'"),
        ("llava", "vision_config", "num_hidden_layers", "'vision_config.num_hidden_layers'"),
        ("llava_next", None, "text_config", "'text_config'"),
        ("idefics3", "vision_config", "intermediate_size", "'vision_config.intermediate_size'"),
        ("smolvlm", "vision_config", "patch_size", "'vision_config.patch_size'"),
    ],
)
def test_a_missing_key_is_named_with_the_model_type(name, section, key, fragment):
    config = _without(SMALL_CONFIGS[name], section, key)
    with pytest.raises(ValueError) as raised:
        vision_spec_from_config(config)
    assert isinstance(raised.value, ModelConfigError)
    assert fragment in str(raised.value) and f"'{config['model_type']}'" in str(raised.value)


def test_a_text_config_without_hidden_size_needs_a_known_text_type():
    config = json.loads(json.dumps(SMALL_CONFIGS["llava"]))
    del config["text_config"]["hidden_size"]
    spec = vision_spec_from_config(config)  # llama: LlamaConfig's default hidden_size
    assert spec is not None and spec.projector.out_features == 4096
    config["text_config"]["model_type"] = "qwen2"
    with pytest.raises(ModelConfigError, match=r"text_config\.hidden_size"):
        vision_spec_from_config(config)


@pytest.mark.parametrize(
    "name, section, change, fragment",
    [
        ("qwen2_5_vl", "vision_config", {"fullatt_block_indexes": [4]}, "fullatt_block_indexes"),
        ("qwen2_5_vl", "vision_config", {"num_heads": 5}, "num_heads"),
        ("qwen3_vl", "vision_config", {"deepstack_visual_indexes": [1, 1]}, "deepstack_visual_indexes"),
        ("qwen2_vl", "vision_config", {"embed_dim": True}, "embed_dim"),
        ("qwen2_vl", "vision_config", {"mlp_ratio": "4"}, "mlp_ratio"),
        ("gemma3", None, {"mm_tokens_per_image": 64}, "mm_tokens_per_image"),
        ("gemma3", "vision_config", {"model_type": "clip_vision_model"}, "vision_config.model_type"),
        ("llava", "vision_config", {"model_type": "pixtral"}, "vision_config.model_type"),
        ("llava", None, {"multimodal_projector_bias": "yes"}, "multimodal_projector_bias"),
        ("llava_next", None, {"vision_feature_layer": []}, "vision_feature_layer"),
        ("mllama", "text_config", {"cross_attention_layers": [9]}, "cross_attention_layers"),
        ("idefics3", "vision_config", {"image_size": 7}, "image_size"),
        ("smolvlm", None, {"scale_factor": 0}, "scale_factor"),
    ],
)
def test_bad_values_are_refused(name, section, change, fragment):
    config = json.loads(json.dumps(SMALL_CONFIGS[name]))
    (config[section] if section else config).update(change)
    with pytest.raises(ModelConfigError, match=fragment):
        vision_spec_from_config(config)
