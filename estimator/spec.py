"""Model specs from config.json: the shapes the memory model needs, counted tensor by tensor.

A :class:`ModelSpec` is built from a config dict alone (no weights, no transformers). It lists every
linear layer of a decoder block with its in/out features (for LoRA targeting and quantization), the
MoE experts (which transformers 5 stores as fused 3-D parameters, not ``nn.Linear``), the norms and
the embeddings, mirroring the modules of transformers' ``modeling_<family>.py``. A test builds each
family's transformers model on the meta device and checks the counts agree to within 0.1%.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import TYPE_CHECKING, Literal, overload

from .errors import ModelConfigError
from .shapes import MAX_DIM, MAX_LAYERS, MULTIMODAL_MODEL_TYPES_NOT_READ, VISION_LANGUAGE_MODEL_TYPES, LinearSpec

if TYPE_CHECKING:  # vision_spec imports this module's shapes; it is imported where a VLM config is read
    from .vision_spec import VisionSpec

# model_type -> how its decoder block is laid out. Families checked against transformers 5.24's
# modeling files; anything else with the standard keys is treated as a Llama-like block, with a warning.
SUPPORTED_FAMILIES = (
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
)

# PEFT 0.21's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING (peft/utils/constants.py): the
# modules adapted when target_modules is left unset. Families missing there make PEFT raise.
PEFT_DEFAULT_TARGETS = {
    "llama": ("q_proj", "v_proj"),
    "mistral": ("q_proj", "v_proj"),
    "mixtral": ("q_proj", "v_proj"),
    "qwen2": ("q_proj", "v_proj"),
    "qwen3": ("q_proj", "v_proj"),
    "gemma": ("q_proj", "v_proj"),
    "gemma2": ("q_proj", "v_proj"),
    "gemma3_text": ("q_proj", "v_proj"),
}

# Bounds a real config never reaches; beyond them the numbers stop meaning anything (MAX_DIM, MAX_LAYERS: shapes.py).
MAX_VOCAB = 1 << 24
MAX_EXPERTS = 4096
MAX_MODEL_TYPE = 64  # the longest transformers model_type is ~30 characters
MAX_SOFTCAP = 1e6
_MODEL_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


@dataclass(frozen=True)
class MoESpec:
    """The sparse MLP of an MoE block (transformers 5 fuses each expert set into 3-D parameters)."""

    num_experts: int
    top_k: int
    expert_intermediate: int
    shared_intermediate: int = 0  # qwen2_moe's always-on shared expert (0 when absent)

    def params(self, hidden: int) -> int:
        """gate_up_proj (E, 2I, H) + down_proj (E, H, I) + the router (E, H)."""
        experts = self.num_experts * 3 * hidden * self.expert_intermediate
        router = self.num_experts * hidden
        return experts + router


@dataclass(frozen=True)
class ModelSpec:
    """The architecture of a decoder-only causal LM, as far as memory is concerned."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool
    max_position_embeddings: int | None
    attention_bias: bool = False
    attention_out_bias: bool = False
    mlp_bias: bool = False
    fused_qkv: bool = False  # phi3: qkv_proj and gate_up_proj
    # phi3: apply_rotary_pos_emb ends in torch.cat, so q is contiguous in (B, heads, S, D) and a flash kernel's output
    # takes that layout; o_proj's input (transpose(1, 2).contiguous()) is then a copy, not a view of it
    rotary_concatenates: bool = False
    qk_norm: str = "none"  # "none", "head" (qwen3, gemma3: per head_dim), "full" (olmo2: over all heads)
    norms_per_layer: int = 2
    moe: MoESpec | None = None
    moe_layers: tuple[bool, ...] = ()  # per layer: True where the MLP is sparse
    embed_scale: bool = False  # gemma multiplies the embeddings by sqrt(hidden) (one extra tensor)
    final_logit_softcapping: float | None = None  # gemma2: tanh softcap on the logits
    attn_logit_softcapping: bool = False  # gemma2: tanh softcap on the attention scores (eager only)
    # layers attend within this window (transformers builds create_sliding_window_causal_mask for the whole model:
    # phi3, mistral, mixtral, qwen3_moe with use_sliding_window; for gemma3's "sliding_attention" layers); None:
    # causal attention only. sliding_window_layers: how many layers use it.
    sliding_window: int | None = None
    sliding_window_layers: int = 0
    known_family: bool = True
    # a vision-language model's vision side (estimator/vision_spec.py: tower, projector); None for a text model. The
    # fields above describe its language model.
    vision: VisionSpec | None = None
    warnings: tuple[str, ...] = field(default=(), compare=False)

    # ---------- construction ----------
    @classmethod
    def from_config(cls, config: dict) -> ModelSpec:
        """Read the architecture from a config.json dict; raise ModelConfigError naming a bad field."""
        return _spec_from_config(config)

    # ---------- layers ----------
    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @cached_property
    def _linears_memo(self) -> dict[tuple, tuple[LinearSpec, ...]]:
        # the linears of a block kind, made once per spec: every term of every plan a search evaluates asks for them
        return {}

    def _memo_linears(self, kind: tuple, make) -> tuple[LinearSpec, ...]:
        got = self._linears_memo.get(kind)
        if got is None:
            got = self._linears_memo[kind] = make()
        return got

    def attention_linears(self) -> tuple[LinearSpec, ...]:
        return self._memo_linears(("attention",), self._attention_linears)

    def _attention_linears(self) -> tuple[LinearSpec, ...]:
        h = self.hidden_size
        if self.fused_qkv:
            return (
                LinearSpec("qkv_proj", h, self.q_dim + 2 * self.kv_dim, self.attention_bias),
                LinearSpec("o_proj", self.q_dim, h, self.attention_out_bias),
            )
        return (
            LinearSpec("q_proj", h, self.q_dim, self.attention_bias),
            LinearSpec("k_proj", h, self.kv_dim, self.attention_bias),
            LinearSpec("v_proj", h, self.kv_dim, self.attention_bias),
            LinearSpec("o_proj", self.q_dim, h, self.attention_out_bias),
        )

    def dense_mlp_linears(self, intermediate: int | None = None) -> tuple[LinearSpec, ...]:
        return self._memo_linears(("mlp", intermediate), lambda: self._dense_mlp_linears(intermediate))

    def _dense_mlp_linears(self, intermediate: int | None) -> tuple[LinearSpec, ...]:
        h, i, b = self.hidden_size, intermediate or self.intermediate_size, self.mlp_bias
        if self.fused_qkv:
            return (LinearSpec("gate_up_proj", h, 2 * i, b), LinearSpec("down_proj", i, h, b))
        return (LinearSpec("gate_proj", h, i, b), LinearSpec("up_proj", h, i, b), LinearSpec("down_proj", i, h, b))

    def is_moe_layer(self, index: int) -> bool:
        return bool(self.moe_layers) and self.moe_layers[index]

    def layer_linears(self, index: int) -> tuple[LinearSpec, ...]:
        """Every ``nn.Linear`` of block ``index`` (MoE experts are 3-D parameters, not listed here)."""
        # blocks of one kind (dense or MoE) have the same linears
        return self._memo_linears(("layer", self.is_moe_layer(index)), lambda: self._layer_linears(index))

    def _layer_linears(self, index: int) -> tuple[LinearSpec, ...]:
        linears = self.attention_linears()
        if self.is_moe_layer(index):
            moe = self.moe
            assert moe is not None
            if moe.shared_intermediate:
                linears += self.dense_mlp_linears(moe.shared_intermediate)
                linears += (LinearSpec("shared_expert_gate", self.hidden_size, 1, False),)
            return linears
        return linears + self.dense_mlp_linears()

    def layer_norm_params(self) -> int:
        h = self.hidden_size
        qk = 0
        if self.qk_norm == "head":
            qk = 2 * self.head_dim
        elif self.qk_norm == "full":
            qk = self.q_dim + self.kv_dim
        return self.norms_per_layer * h + qk

    def layer_expert_params(self, index: int) -> int:
        """Fused expert weights plus the router of block ``index`` (0 for a dense block)."""
        if not self.is_moe_layer(index):
            return 0
        assert self.moe is not None
        return self.moe.params(self.hidden_size)

    def __hash__(self) -> int:
        # a spec keys the inventory's and the term caches' entries on every evaluation of a search: its fields are
        # hashed once (the dataclass hash would rehash every field each time; equality stays field by field)
        return self._field_hash

    @cached_property
    def _field_hash(self) -> int:
        return hash(tuple(getattr(self, f.name) for f in fields(self)))

    def layer_params(self, index: int) -> int:
        return (
            sum(lin.params for lin in self.layer_linears(index))
            + self.layer_norm_params()
            + self.layer_expert_params(index)
        )

    @cached_property
    def layer_groups(self) -> tuple[tuple[int, int], ...]:
        """(first layer index, number of layers) for each kind of block (dense, MoE): blocks of one
        kind are identical, so the memory model evaluates each kind once."""
        if not self.moe_layers:
            return ((0, self.num_layers),)
        groups: list[tuple[int, int]] = []
        for kind in (False, True):
            indices = [i for i, m in enumerate(self.moe_layers) if m == kind]
            if indices:
                groups.append((indices[0], len(indices)))
        return tuple(groups)

    # ---------- totals ----------
    @cached_property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @cached_property
    def lm_head_params(self) -> int:
        """0 when the head shares the embedding matrix."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @cached_property
    def block_params(self) -> int:
        return sum(self.layer_params(i) * n for i, n in self.layer_groups)

    @cached_property
    def linear_weight_params(self) -> int:
        """Weights of all block ``nn.Linear`` layers: what bitsandbytes quantizes (lm_head excluded)."""
        return sum(lin.weight_params * n for i, n in self.layer_groups for lin in self.layer_linears(i))

    @cached_property
    def expert_params(self) -> int:
        return sum(self.layer_expert_params(i) * n for i, n in self.layer_groups)

    @cached_property
    def total_params(self) -> int:
        """Every parameter: the language model's, and a VLM's vision tower and projector (and Mllama's extras)."""
        vision = self.vision.params_beside_language_model if self.vision is not None else 0
        return self.embedding_params + self.lm_head_params + self.block_params + self.hidden_size + vision

    @cached_property
    def largest_layer_params(self) -> int:
        return max(self.layer_params(i) for i, _ in self.layer_groups)

    def linear_names(self) -> tuple[str, ...]:
        names: list[str] = []
        for i, _ in self.layer_groups:
            for lin in self.layer_linears(i):
                if lin.name not in names:
                    names.append(lin.name)
        return tuple(names)


# ---------------------------------------------------------------------------
# Parsing


def _get(config: dict, *keys: str, default=None):
    for key in keys:
        if key in config and config[key] is not None:
            return config[key]
    return default


@overload
def _int_field(config: dict, keys: tuple[str, ...], *, required: Literal[True], default: int | None = None,
               low: int = 1, high: int = MAX_DIM) -> int: ...
@overload
def _int_field(config: dict, keys: tuple[str, ...], *, required: bool, default: int,
               low: int = 1, high: int = MAX_DIM) -> int: ...
@overload
def _int_field(config: dict, keys: tuple[str, ...], *, required: bool, default: int | None = None,
               low: int = 1, high: int = MAX_DIM) -> int | None: ...
def _int_field(config: dict, keys: tuple[str, ...], *, required: bool, default: int | None = None,
               low: int = 1, high: int = MAX_DIM) -> int | None:
    """An integer field (the first of ``keys`` present) within [low, high]; ``default`` when absent, which a
    required field must not be (an int: required fields, and fields with an int default, give an int)."""
    value = _get(config, *keys)
    name = keys[0]
    if value is None:
        if required and default is None:
            raise ModelConfigError(f"config.json has no '{name}'; a decoder config needs it")
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ModelConfigError(f"config.json field '{name}' must be an integer; got {value!r:.60}")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ModelConfigError(f"config.json field '{name}' must be an integer; got {value!r}")
        value = int(value)
    if not low <= value <= high:
        shown = value if value.bit_length() < 64 else "an integer beyond any real model"
        raise ModelConfigError(f"config.json field '{name}' must be between {low} and {high}; got {shown}")
    return value


def _softcap_field(config: dict, key: str) -> float | None:
    """A tanh softcap (gemma2): null, or a finite positive number no larger than MAX_SOFTCAP."""
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ModelConfigError(f"config.json field '{key}' must be a number or null; got {value!r:.60}")
    finite = (isinstance(value, float) and math.isfinite(value)) or isinstance(value, int)
    if not finite or not 0 < value <= MAX_SOFTCAP:
        shown = repr(value) if not isinstance(value, int) or value.bit_length() < 64 else "a huge integer"
        raise ModelConfigError(f"config.json field '{key}' must be a number above 0 and at most {MAX_SOFTCAP:g}; got "
                               f"{shown}")
    return float(value)


def _bool_field(config: dict, key: str, default: bool) -> bool:
    value = config.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ModelConfigError(f"config.json field '{key}' must be true or false; got {value!r:.60}")
    return value


def _text_config(config: dict) -> dict:
    """Multimodal wrappers (gemma3, ...) keep the language model under text_config."""
    inner = config.get("text_config")
    if isinstance(inner, dict) and "hidden_size" in inner:
        merged = dict(inner)
        merged.setdefault("tie_word_embeddings", config.get("tie_word_embeddings", inner.get("tie_word_embeddings")))
        if "model_type" not in inner:
            merged["model_type"] = str(config.get("model_type", "")) + "_text"
        return merged
    return config


@dataclass(frozen=True)
class FamilyTraits:
    """What a model family's decoder layer has beyond a Llama layer (transformers 5 modeling_<family>.py)."""

    qkv_bias: bool | None = None  # q/k/v biases whatever attention_bias says (None: attention_bias decides)
    qkv_bias_field: str | None = None  # the config field that says it instead (qwen2_moe: qkv_bias, default true)
    out_bias: bool | None = None  # o_proj's bias (None: as the q/k/v biases)
    fused_qkv: bool = False  # one qkv_proj and one gate_up_proj (phi3)
    # apply_rotary_pos_emb returns torch.cat([rotated, passed-through], dim=-1) (phi3: modeling_phi3.py, 5.24)
    rotary_concatenates: bool = False
    qk_norm: str = "none"  # "head": RMSNorm over head_dim on q and k; "full": over the whole projection
    norms_per_layer: int = 2
    embed_scale: bool = False  # embeddings scaled by sqrt(hidden) (a temporary of the embedding's size)
    logit_softcapping: bool = False  # reads final_logit_softcapping and attn_logit_softcapping (gemma2)


# One row per family that differs from Llama; every other model type (llama, mistral, mixtral, an unknown one)
# takes the defaults.
FAMILY_TRAITS: dict[str, FamilyTraits] = {
    "qwen2": FamilyTraits(qkv_bias=True, out_bias=False),  # q/k/v carry biases, o_proj does not
    "qwen2_moe": FamilyTraits(qkv_bias_field="qkv_bias", out_bias=False),
    "qwen3": FamilyTraits(qk_norm="head"),
    "qwen3_moe": FamilyTraits(qk_norm="head"),
    "gemma": FamilyTraits(embed_scale=True),
    "gemma2": FamilyTraits(embed_scale=True, norms_per_layer=4, logit_softcapping=True),
    "gemma3_text": FamilyTraits(embed_scale=True, norms_per_layer=4, qk_norm="head"),
    "phi3": FamilyTraits(fused_qkv=True, rotary_concatenates=True),
    "olmo2": FamilyTraits(qk_norm="full"),
}


# The keys that name another modality's encoder in a config.json: the wrappers' vision_config, Qwen-VL's visual, the
# original LLaVA repositories' mm_vision_tower, Phi-3-vision's img_processor, the audio models' audio_config.
ENCODER_CONFIG_KEYS = ("vision_config", "visual", "vision_tower", "mm_vision_tower", "img_processor", "audio_config")


# The vision-language families the estimate reads (estimator/vision_memory.py, measured by cohorts v21 to v32) and
# the text family of each one's language model (transformers 5.24: Qwen2VLTextModel's and Qwen2_5_VLTextModel's layers
# are Qwen2's, q/k/v with bias; Qwen3VLTextModel's are Qwen3's, q/k norms per head; LlavaConfig's text_config is a
# LlamaConfig unless it names another model_type)
ESTIMATED_VISION_TYPES = {"qwen2_vl": "qwen2", "qwen2_5_vl": "qwen2", "qwen3_vl": "qwen3", "llava": "llama",
                          # Qwen3VLMoeTextModel's decoder layers are Qwen3-MoE's (fused experts gate_up_proj (E, 2I,
                          # H) and down_proj (E, H, I), a top-k router, q/k norms), with Qwen3-VL's M-RoPE and
                          # deepstack; its tower is Qwen3-VL's
                          "qwen3_vl_moe": "qwen3_moe",
                          "gemma3": "gemma3_text",
                          # MllamaTextModel: Llama decoder layers, num_hidden_layers of them counting the
                          # cross-attention layers, which have the same linears (estimator/vision_memory.py)
                          "mllama": "llama",
                          # LlavaNextConfig's text_config is a LlamaConfig unless it names another model_type
                          "llava_next": "llama",
                          # Idefics3Config's text_config is a LlamaConfig (SmolVLM's a small Llama), and so is
                          # SmolVLMConfig's (SmolVLM2)
                          "idefics3": "llama", "smolvlm": "llama"}
# What transformers fills in for the fields a VLM's text_config leaves out: LlamaConfig's defaults (transformers 5.24,
# models/llama/configuration_llama.py; llava-hf/llava-1.5-7b-hf's text_config names only vocab_size,
# max_position_embeddings and rms_norm_eps, so its 4096-wide, 32-layer decoder comes from here)
TEXT_CONFIG_DEFAULTS = {"llava": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                                  "num_attention_heads": 32, "hidden_act": "silu", "max_position_embeddings": 2048,
                                  "vocab_size": 32000, "tie_word_embeddings": False},
                        # llava-hf/llava-v1.6-vicuna-7b-hf's text_config is as sparse as llava-1.5's
                        "llava_next": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                                       "num_attention_heads": 32, "hidden_act": "silu",
                                       "max_position_embeddings": 2048, "vocab_size": 32000,
                                       "tie_word_embeddings": False},
                        # Gemma3TextConfig's defaults (models/gemma3/configuration_gemma3.py, 5.24): the text_config
                        # of google/gemma-3-4b-it names only its width, MLP, depth, rope scaling and window; the 8
                        # heads of 256, 4 k/v heads and the 262,208-token vocabulary come from here
                        "gemma3": {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
                                   "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                                   "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
                                   "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
                                   "query_pre_attn_scalar": 256, "sliding_window": 4096, "sliding_window_pattern": 6,
                                   "tie_word_embeddings": True}}


def _refuse_multimodal(config: dict) -> None:
    """A model with a vision (or audio) encoder beside its language model that the estimate does not read yet: the
    encoder's weights, its activations and the tokens it adds would be missing, and the language model alone would be
    an underestimate, so it is an error, not a text-only estimate."""
    model_type = config.get("model_type")
    keys = [k for k in ENCODER_CONFIG_KEYS if config.get(k)]
    if model_type in VISION_LANGUAGE_MODEL_TYPES or model_type in MULTIMODAL_MODEL_TYPES_NOT_READ or keys:
        what = f"model_type '{model_type}'" if isinstance(model_type, str) else "this config.json"
        beside = f" (its {', '.join(keys)})" if keys else ""
        raise ModelConfigError(
            f"{what} is a multimodal model: an image or audio encoder{beside} beside its language model. Its "
            "encoder's weights and activations and the tokens it adds are not estimated yet (of the vision-language "
            f"families, {' and '.join(ESTIMATED_VISION_TYPES)} are), and the language model alone would be too low an "
            "estimate")


def _vision_language_model(config: dict) -> tuple[dict, VisionSpec]:
    """A VLM config.json read as its language model's config (the text_config, or the top-level fields older
    checkpoints keep it in, under its text family's model_type) and its vision side."""
    from .vision_spec import vision_spec_from_config

    vision = vision_spec_from_config(config)
    assert vision is not None
    if config["model_type"] in ("llava", "llava_next"):
        _only_measured_llava(config, vision)
    inner = config.get("text_config")
    text = {k: v for k, v in config.items() if k not in ENCODER_CONFIG_KEYS and k != "text_config"}
    defaults = TEXT_CONFIG_DEFAULTS.get(config["model_type"])
    if defaults is not None:  # the wrapper's own fields (its vocab_size, ...) are not the text model's
        inner_type = inner.get("model_type") if isinstance(inner, dict) else None
        if inner_type not in (None, ESTIMATED_VISION_TYPES[config["model_type"]]):
            raise ModelConfigError(f"text_config.model_type '{inner_type}': {config['model_type']} is estimated with "
                                   f"a {ESTIMATED_VISION_TYPES[config['model_type']]} language model only")
        text = {**defaults, **{k: v for k, v in text.items() if k in ("torch_dtype", "dtype")}}
    if isinstance(inner, dict):
        text.update(inner)
    if "tie_word_embeddings" in config:
        # the wrapper's own value decides: transformers 5.24 ties lm_head to the embeddings by the top-level
        # config's tie_word_embeddings (PreTrainedModel.get_expanded_tied_weights_keys reads self.config), which
        # Qwen3VLMoeConfig's default text_config contradicts (True inside, False outside: the model is untied)
        text["tie_word_embeddings"] = config["tie_word_embeddings"]
    text["model_type"] = ESTIMATED_VISION_TYPES[config["model_type"]]
    return text, vision


def _only_measured_llava(config: dict, vision: VisionSpec) -> None:
    """LLaVA as cohort v22 measured it (llava-1.5): a CLIP tower, one feature layer, the CLS position dropped."""
    if vision.tower.family != "clip":
        raise ModelConfigError(f"llava with a {vision.tower.family} vision tower is not estimated yet (a CLIP tower, "
                               "as in llava-1.5, is)")
    if isinstance(config.get("vision_feature_layer"), list):
        raise ModelConfigError("llava with several vision_feature_layer entries is not estimated yet (one layer, as "
                               "in llava-1.5, is)")
    if config.get("vision_feature_select_strategy", "default") != "default":
        raise ModelConfigError(f"llava with vision_feature_select_strategy "
                               f"{config.get('vision_feature_select_strategy')!r:.40} is not estimated yet ('default', "
                               "as in llava-1.5, is)")


def _spec_from_config(config: dict) -> ModelSpec:
    if not isinstance(config, dict):
        raise ModelConfigError(f"config.json must be a JSON object; got {type(config).__name__}")
    vision = None
    if config.get("model_type") in ESTIMATED_VISION_TYPES:
        config, vision = _vision_language_model(config)
    else:
        _refuse_multimodal(config)
        config = _text_config(config)
    model_type = _model_type(config)
    warnings: list[str] = []
    known = model_type in SUPPORTED_FAMILIES
    if not known:
        warnings.append(
            f"model_type '{model_type}' is not one of the families canifinetune checks against transformers "
            f"({', '.join(SUPPORTED_FAMILIES)}); it is estimated as a Llama-like decoder from its standard "
            "config fields. Measure a short run before relying on it."
        )
    shape = _shape_fields(config)
    layers = shape["num_layers"]
    max_pos = _int_field(config, ("max_position_embeddings", "n_positions"), required=False, default=None,
                         high=1 << 31)
    tie = _bool_field(config, "tie_word_embeddings", model_type.startswith("gemma"))
    traits = _trait_fields(config, model_type)
    moe, moe_layers = _moe_fields(config, model_type, known, layers, shape["intermediate_size"], warnings)
    if shape["intermediate_size"] is None:
        if moe is None or any(not m for m in moe_layers):
            raise ModelConfigError("config.json has no 'intermediate_size'; a decoder config needs it")
        shape["intermediate_size"] = moe.expert_intermediate if moe else 0
    window, window_layers = _sliding_window(config, model_type, layers)
    return ModelSpec(
        model_type=model_type,
        **shape,
        tie_word_embeddings=tie,
        max_position_embeddings=max_pos,
        **traits,
        moe=moe,
        moe_layers=moe_layers,
        sliding_window=window,
        sliding_window_layers=window_layers,
        known_family=known,
        vision=vision,
        warnings=tuple(warnings),
    )


def _model_type(config: dict) -> str:
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ModelConfigError("config.json has no 'model_type'; cannot tell the architecture")
    if len(model_type) > MAX_MODEL_TYPE or not _MODEL_TYPE.fullmatch(model_type):
        shown = repr(model_type[:40]) + ("..." if len(model_type) > 40 else "")
        raise ModelConfigError(
            f"config.json field 'model_type' must be a transformers model type (letters, digits, '_', '.', '-', "
            f"at most {MAX_MODEL_TYPE} characters); got {shown}"
        )
    return model_type


def _shape_fields(config: dict) -> dict:
    """The decoder's sizes (ModelSpec's fields by name), checked; intermediate_size may be None (an MoE's)."""
    hidden = _int_field(config, ("hidden_size", "n_embd", "d_model"), required=True)
    layers = _int_field(config, ("num_hidden_layers", "n_layer", "num_layers"), required=True, high=MAX_LAYERS)
    heads = _int_field(config, ("num_attention_heads", "n_head"), required=True, high=MAX_DIM)
    kv_heads = _int_field(config, ("num_key_value_heads",), required=False, default=heads, high=MAX_DIM)
    vocab = _int_field(config, ("vocab_size",), required=True, high=MAX_VOCAB)
    intermediate = _int_field(config, ("intermediate_size", "n_inner", "ffn_dim"), required=False,
                              default=None, high=MAX_DIM)
    head_dim = _int_field(config, ("head_dim",), required=False, default=None, high=MAX_DIM)
    if head_dim is None:
        if hidden % heads:
            raise ModelConfigError(
                f"config.json: hidden_size {hidden} is not divisible by num_attention_heads {heads} and no head_dim is "
                "given"
            )
        head_dim = hidden // heads
    if heads % kv_heads:
        raise ModelConfigError(
            f"config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
        )
    layer_types = config.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list) or len(layer_types) != layers
                                    or not all(isinstance(t, str) and len(t) <= MAX_MODEL_TYPE for t in layer_types)):
        raise ModelConfigError(f"config.json field 'layer_types' must be a list of num_hidden_layers ({layers}) "
                               "layer type names")
    return dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_layers=layers,
                num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim)


def _trait_fields(config: dict, model_type: str) -> dict:
    """ModelSpec's per-family fields, from FAMILY_TRAITS and the config's bias and softcapping fields."""
    traits = FAMILY_TRAITS.get(model_type, FamilyTraits())
    attention_bias = _bool_field(config, "attention_bias", False)
    mlp_bias = _bool_field(config, "mlp_bias", False)
    if traits.qkv_bias is not None:
        attention_bias = traits.qkv_bias
    elif traits.qkv_bias_field is not None:
        attention_bias = _bool_field(config, traits.qkv_bias_field, True)
    softcap = None
    attn_softcap = False
    if traits.logit_softcapping:
        softcap = _softcap_field(config, "final_logit_softcapping")
        attn_softcap = _softcap_field(config, "attn_logit_softcapping") is not None
    return dict(
        attention_bias=attention_bias,
        attention_out_bias=attention_bias if traits.out_bias is None else traits.out_bias,
        mlp_bias=mlp_bias,
        fused_qkv=traits.fused_qkv,
        rotary_concatenates=traits.rotary_concatenates,
        qk_norm=traits.qk_norm,
        norms_per_layer=traits.norms_per_layer,
        embed_scale=traits.embed_scale,
        attn_logit_softcapping=attn_softcap,
        final_logit_softcapping=(float(softcap) if isinstance(softcap, (int, float)) and not isinstance(softcap, bool)
                                 else None),
    )


def _moe_fields(config: dict, model_type: str, known: bool, layers: int, intermediate: int | None,
                warnings: list[str]) -> tuple[MoESpec | None, tuple[bool, ...]]:
    """(the experts, which layers are sparse), or (None, ()) for a dense model; appends an assumption's warning."""
    experts = _int_field(config, ("num_local_experts", "num_experts", "n_routed_experts"), required=False,
                         default=None, high=MAX_EXPERTS)
    if not experts or experts <= 1:
        return None, ()
    top_k = _int_field(config, ("num_experts_per_tok", "top_k", "moe_topk"), required=False, default=2,
                       high=MAX_EXPERTS)
    expert_i = _int_field(config, ("moe_intermediate_size",), required=False, default=intermediate)
    if expert_i is None:
        raise ModelConfigError("config.json: an MoE config needs 'moe_intermediate_size' or 'intermediate_size'")
    shared_i = _int_field(config, ("shared_expert_intermediate_size",), required=False, default=0, low=0)
    if top_k > experts:
        raise ModelConfigError(f"config.json: num_experts_per_tok {top_k} exceeds the {experts} experts")
    moe = MoESpec(experts, top_k, expert_i, shared_i if model_type == "qwen2_moe" else 0)
    step = _int_field(config, ("decoder_sparse_step",), required=False, default=1, high=MAX_LAYERS)
    dense_only = config.get("mlp_only_layers") or []
    if not isinstance(dense_only, list) or len(dense_only) > layers:
        raise ModelConfigError(f"config.json field 'mlp_only_layers' must be a list of at most num_hidden_layers "
                               f"({layers}) layer indices")
    if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < layers for x in dense_only):
        raise ModelConfigError(f"config.json field 'mlp_only_layers' must hold layer indices from 0 to {layers - 1}")
    dense = frozenset(dense_only)
    moe_layers = tuple((i not in dense) and ((i + 1) % step == 0) for i in range(layers))
    if not known or model_type not in ("mixtral", "qwen2_moe", "qwen3_moe"):
        warnings.append(f"MoE layout of '{model_type}' assumed to follow Mixtral/Qwen-MoE (fused experts, top-k "
                        "routing)")
    return moe, moe_layers


# transformers 5.24 families whose decoder builds ``create_sliding_window_causal_mask`` for every layer when
# config.sliding_window is set (modeling_phi3.py, modeling_mistral.py, modeling_mixtral.py, modeling_qwen3_moe.py:
# ``mask_function = create_causal_mask if self.config.sliding_window is None else create_sliding_window_causal_mask``)
SLIDING_WINDOW_FAMILIES = frozenset({"phi3", "mistral", "mixtral", "qwen3_moe"})


def _sliding_window(config: dict, model_type: str, layers: int) -> tuple[int | None, int]:
    """(window, how many layers use it), or (None, 0). Qwen3-MoE's config keeps the window only with
    use_sliding_window (configuration_qwen3_moe.py: ``self.sliding_window = self.sliding_window if
    self.use_sliding_window else None``). Gemma3 (configuration_gemma3.py, 5.24): the layers whose layer_types
    entry is "sliding_attention", by default every layer but each sliding_window_pattern-th (6)."""
    window = config.get("sliding_window")
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        return None, 0
    if model_type == "gemma3_text":
        if config.get("use_bidirectional_attention"):
            return None, 0
        types = config.get("layer_types")
        if isinstance(types, list) and len(types) == layers:
            count = sum(1 for t in types if t == "sliding_attention")
        else:
            pattern = config.get("sliding_window_pattern", 6)
            pattern = pattern if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0 else 6
            count = sum(1 for i in range(layers) if (i + 1) % pattern)
        return (window, count) if count else (None, 0)
    if model_type not in SLIDING_WINDOW_FAMILIES:
        return None, 0
    if model_type == "qwen3_moe" and not config.get("use_sliding_window", False):
        return None, 0
    return window, layers
