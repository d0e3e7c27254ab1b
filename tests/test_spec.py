"""Model specs from config.json: counts tensor by tensor, checked against transformers on the meta device."""

import pytest

from canifinetune.estimator.errors import ModelConfigError
from canifinetune.estimator.spec import ModelSpec

# Small configs of every supported family, exercising biases, GQA, qk-norms, fused projections,
# tied/untied heads, MoE with shared experts, sparse steps and dense-only layers.
FAMILY_CONFIGS = {
    "llama": dict(model_type="llama", vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=3,
                  num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False),
    "llama_bias_tied": dict(model_type="llama", vocab_size=32000, hidden_size=512, intermediate_size=1024,
                            num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4, attention_bias=True,
                            mlp_bias=True, tie_word_embeddings=True),
    "mistral": dict(model_type="mistral", vocab_size=32768, hidden_size=512, intermediate_size=1024,
                    num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4, head_dim=128),
    "mixtral": dict(model_type="mixtral", vocab_size=32000, hidden_size=512, intermediate_size=1024,
                    num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, num_local_experts=8,
                    num_experts_per_tok=2),
    "qwen2": dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=2,
                  num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen3": dict(model_type="qwen3", vocab_size=151936, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=128, tie_word_embeddings=True),
    "qwen2_moe": dict(model_type="qwen2_moe", vocab_size=1000, hidden_size=512, intermediate_size=1024,
                      moe_intermediate_size=256, shared_expert_intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=8, num_experts=8, num_experts_per_tok=2,
                      decoder_sparse_step=2, mlp_only_layers=[0]),
    "qwen3_moe": dict(model_type="qwen3_moe", vocab_size=1000, hidden_size=512, intermediate_size=1024,
                      moe_intermediate_size=256, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4,
                      head_dim=128, num_experts=8, num_experts_per_tok=2),
    "gemma": dict(model_type="gemma", vocab_size=1000, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=1, head_dim=256),
    "gemma2": dict(model_type="gemma2", vocab_size=1000, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                   num_attention_heads=8, num_key_value_heads=4, head_dim=256),
    "gemma3_text": dict(model_type="gemma3_text", vocab_size=1000, hidden_size=512, intermediate_size=1024,
                        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4, head_dim=256),
    "phi3": dict(model_type="phi3", vocab_size=32064, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                 num_attention_heads=8, num_key_value_heads=4),
    "olmo2": dict(model_type="olmo2", vocab_size=100352, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=4),
}


@pytest.mark.parametrize("name", sorted(FAMILY_CONFIGS))
def test_param_count_matches_transformers_meta_model(name):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = FAMILY_CONFIGS[name]
    hf_config = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    expected = sum(p.numel() for p in model.parameters())
    spec = ModelSpec.from_config(config)
    assert abs(spec.total_params - expected) <= 0.001 * expected, (spec.total_params, expected)
    # every nn.Linear the spec lists exists in the model with that shape
    linear_shapes = {(n.rsplit(".", 1)[-1], tuple(m.weight.shape)) for n, m in model.named_modules()
                     if isinstance(m, torch.nn.Linear) and "layers." in n}
    for index, _ in spec.layer_groups:
        for lin in spec.layer_linears(index):
            assert (lin.name, (lin.out_features, lin.in_features)) in linear_shapes


def test_all_supported_families_are_covered():
    from canifinetune.estimator.spec import SUPPORTED_FAMILIES

    covered = {c["model_type"] for c in FAMILY_CONFIGS.values()}
    assert set(SUPPORTED_FAMILIES) <= covered


def test_unknown_family_with_standard_keys_warns():
    spec = ModelSpec.from_config(dict(FAMILY_CONFIGS["llama"], model_type="brandnew"))
    assert not spec.known_family and "brandnew" in spec.warnings[0]


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"hidden_size": None}, "hidden_size"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"hidden_size": -5}, "hidden_size"),
        ({"hidden_size": "big"}, "hidden_size"),
        ({"hidden_size": float("nan")}, "hidden_size"),
        ({"num_hidden_layers": 10**9}, "num_hidden_layers"),
        ({"num_attention_heads": 7}, "num_attention_heads"),
        ({"model_type": None}, "model_type"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
        ({"vocab_size": True}, "vocab_size"),
    ],
)
def test_bad_configs_are_clear_errors(change, fragment):
    config = dict(FAMILY_CONFIGS["llama"])
    for key, value in change.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    with pytest.raises(ModelConfigError) as info:
        ModelSpec.from_config(config)
    assert fragment in str(info.value)


def test_a_language_model_under_text_config_is_read():
    spec = ModelSpec.from_config({"text_config": dict(FAMILY_CONFIGS["gemma3_text"])})
    assert spec.model_type == "gemma3_text"


def _published_vlm_configs() -> list[dict]:
    import json
    from importlib import resources

    text = (resources.files("canifinetune.estimator") / "data" / "vlm_configs.json").read_text(encoding="utf-8")
    data = json.loads(text)
    return data if isinstance(data, list) else data.get("models") or data.get("configs") or list(data.values())


def _vlm_entries(estimated: bool) -> list[dict]:
    from canifinetune.estimator.spec import ESTIMATED_VISION_TYPES

    return [e for e in _published_vlm_configs() if (e["config"]["model_type"] in ESTIMATED_VISION_TYPES) == estimated]


# Families the estimate does not read yet, as their wrappers' config.json (a published one where the catalog has it,
# else the wrapper with its text model: the refusal reads model_type and the encoder keys, not sizes)
_NOT_YET_ESTIMATED = [
    *(e["config"] for e in _vlm_entries(estimated=False)),
    {"model_type": "paligemma", "architectures": ["PaliGemmaForConditionalGeneration"],
     "text_config": dict(FAMILY_CONFIGS["gemma"]), "vision_config": {"model_type": "siglip_vision_model"}},
]


@pytest.mark.parametrize("config", _NOT_YET_ESTIMATED, ids=lambda c: c["model_type"])
def test_a_vision_language_model_not_yet_estimated_is_refused_not_estimated_as_its_language_model(config):
    """Qwen2.5-VL-3B was once estimated as its 3.09B-parameter language model ("fits"), without its 632M-parameter
    vision tower and its image tokens: too low. A family the estimate does not read yet is an error that says why."""
    with pytest.raises(ModelConfigError, match="multimodal model") as info:
        ModelSpec.from_config(config)
    assert config["model_type"] in str(info.value)


@pytest.mark.parametrize("entry", _vlm_entries(estimated=True), ids=lambda e: e["id"])
def test_an_estimated_vision_language_model_is_read_whole(entry):
    """Qwen2.5-VL: the language model (a Qwen2 decoder: q/k/v with bias) and the vision side; Qwen3-VL: a Qwen3 decoder
    (q/k norms per head) from its text_config; LLaVA-1.5: a Llama decoder whose text_config leaves its shape to
    LlamaConfig's defaults, a CLIP tower and the MLP projector; Gemma 3: a Gemma3 decoder whose text_config leaves its
    heads and vocabulary to Gemma3TextConfig's defaults, a SigLIP tower and the pooling projector. Every parameter: the
    counts are the checkpoints' safetensors total_size / 2 exactly where the entry records it."""
    spec = ModelSpec.from_config(entry["config"])
    assert spec.vision is not None
    if entry["config"]["model_type"] == "qwen3_vl":
        assert spec.model_type == "qwen3" and spec.qk_norm == "head" and not spec.attention_bias
        assert (spec.hidden_size, spec.num_layers, spec.head_dim) == (4096, 36, 128)
        assert spec.total_params == 8_767_123_696 and spec.vision.vision_params == 576_388_336
    elif entry["config"]["model_type"] == "gemma3":
        # Gemma 3 4B: the report's 417M vision encoder, 3,209M non-embedding parameters; heads, k/v heads, head size
        # and the 262,208-token vocabulary from Gemma3TextConfig's defaults (the text_config leaves them out)
        assert spec.model_type == "gemma3_text" and spec.qk_norm == "head" and spec.tie_word_embeddings
        assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim,
                spec.vocab_size) == (2560, 34, 8, 4, 256, 262208)
        assert (spec.sliding_window, spec.sliding_window_layers) == (1024, 29)
        assert spec.total_params == 4_300_079_472 and spec.vision.tower_params == 416_866_032
    elif entry["config"]["model_type"] == "mllama":
        # Llama 3.2 90B Vision: a Llama decoder of all 100 text layers (the 20 cross-attention layers have a Llama
        # layer's linears), the vision_config's tower and projector, and the cross-attention layers' norms and gates
        # and embed_tokens' 8 extra rows; transformers 5.24 builds exactly this many parameters from the config
        assert spec.model_type == "llama" and not spec.attention_bias
        assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.vocab_size) == (
            8192, 100, 64, 8, 128256)
        assert spec.vision.cross_attention_layers == tuple(range(3, 100, 5))
        assert spec.total_params == 88_593_355_323
    elif entry["config"]["model_type"] == "idefics3":
        # SmolVLM-256M-Instruct: a 30-layer, 576-wide Llama decoder (9 heads of 64, 3 k/v heads), a 12-layer SigLIP
        # tower on 512 px tiles of 16 px patches and the pixel-shuffle connector (4 x 4 patches a token)
        assert spec.model_type == "llama" and spec.vision.projector.merge_factor == 16
        assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.vocab_size) == (
            576, 30, 9, 3, 49280)
        assert spec.total_params == 256_484_928
    elif entry["config"]["model_type"] == "llava_next":
        # llava-v1.6-vicuna-7b: llava-1.5-7b's tower, projector and decoder (LlamaConfig's defaults) and image_newline
        assert spec.model_type == "llama" and spec.vision.image_grid_pinpoints == (
            (336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))
        assert (spec.hidden_size, spec.num_layers, spec.intermediate_size, spec.vocab_size) == (4096, 32, 11008, 32064)
        assert spec.total_params == 7_063_431_168
    elif entry["config"]["model_type"] == "qwen3_vl_moe":
        # Qwen3-VL-30B-A3B: a Qwen3-MoE decoder (48 layers of 128 experts, top 8, experts 768 wide; q/k norms) and
        # Qwen3-VL's tower; the checkpoint's safetensors hold exactly this many parameters (checked below)
        assert spec.model_type == "qwen3_moe" and spec.qk_norm == "head" and spec.moe is not None
        assert (spec.moe.num_experts, spec.moe.top_k, spec.moe.expert_intermediate) == (128, 8, 768)
        assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads) == (2048, 48, 32, 4)
        assert spec.total_params == 31_070_754_032 and spec.vision.vision_params == 538_631_408
    elif entry["config"]["model_type"] == "llava":
        assert spec.model_type == "llama" and not spec.attention_bias
        assert (spec.hidden_size, spec.num_layers, spec.intermediate_size, spec.vocab_size) == (4096, 32, 11008, 32064)
        assert spec.total_params > spec.vision.vision_params > 300_000_000
    else:
        assert spec.model_type == "qwen2" and spec.attention_bias
        assert spec.total_params > spec.vision.vision_params > 600_000_000
    safetensors = entry.get("safetensors")
    if safetensors:
        assert spec.total_params == safetensors["total_size"] // safetensors["bytes_per_param"]


@pytest.mark.parametrize("config", [
    {"model_type": "paligemma", "text_config": dict(FAMILY_CONFIGS["gemma"])},  # the tower's config left default
    {**FAMILY_CONFIGS["llama"], "mm_vision_tower": "openai/clip-vit-large-patch14-336"},  # an original LLaVA repo
    {**FAMILY_CONFIGS["llama"], "model_type": "qwen2_audio_like", "audio_config": {"d_model": 1280}},
])
def test_any_encoder_beside_the_language_model_is_refused(config):
    with pytest.raises(ModelConfigError, match="multimodal model"):
        ModelSpec.from_config(config)


@pytest.mark.parametrize("model_type, text", [("gemma3", "gemma3_text"), ("mllama", "llama"), ("smolvlm", "llama")])
def test_an_estimated_wrapper_without_its_tower_config_names_the_key(model_type, text):
    """Gemma 3, Llama 3.2 Vision and SmolVLM2 are estimated: a config.json without its vision_config is an error
    naming it, never a text-only estimate."""
    with pytest.raises(ModelConfigError, match="'vision_config' is missing"):
        ModelSpec.from_config({"model_type": model_type, "text_config": dict(FAMILY_CONFIGS[text])})


@pytest.mark.parametrize("change, fragment", [
    ({"vision_feature_select_strategy": "full"}, "vision_feature_select_strategy 'full'"),
    ({"vision_feature_layer": [-2, -5]}, "several vision_feature_layer"),
    ({"vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "image_size": 384,
                        "intermediate_size": 4304, "num_attention_heads": 16, "num_hidden_layers": 27,
                        "patch_size": 14}}, "siglip vision tower"),
    ({"text_config": {"model_type": "mistral"}}, "text_config.model_type 'mistral'"),
])
def test_a_llava_variant_cohort_v22_did_not_measure_is_refused_by_name(change, fragment):
    """Cohort v22 measured llava-1.5 (CLIP tower, one feature layer, the CLS position dropped, a Llama decoder); a
    variant would be read wrong (its image tokens, its tower), so it is refused naming what differs."""
    entry = next(e for e in _published_vlm_configs() if e["config"]["model_type"] == "llava")
    with pytest.raises(ModelConfigError, match=r"llava|mistral") as info:
        ModelSpec.from_config({**entry["config"], **change})
    assert fragment in str(info.value)


def test_the_cli_refuses_a_local_vision_language_model_in_one_line(tmp_path, capsys):
    import json

    from canifinetune.server.cli import main as cli_main

    (tmp_path / "config.json").write_text(json.dumps(_NOT_YET_ESTIMATED[0]), encoding="utf-8")
    code = cli_main(["estimate", "--model", str(tmp_path), "--method", "lora", "--target-modules", "all-linear",
                     "--gpu-vram-gb", "24"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "multimodal model" in err
