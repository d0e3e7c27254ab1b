"""Vision-language model specs from config.json: the vision tower and the projector, counted tensor by tensor.

:func:`vision_spec_from_config` reads a multimodal wrapper's config.json (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma 3,
Mllama, LLaVA, LLaVA-NeXT, Idefics3, SmolVLM) into a :class:`VisionSpec`: the tower's shape (width, depth, heads,
MLP, norms, patching, position embeddings, attention layout), every parameter of the tower and of the projector that
feeds the language model, and, for Mllama, the cross-attention layers that live inside the language model. It
mirrors the modules of transformers 5.24 (``transformers/models/<family>/modeling_<family>.py``; each reader names
its file and classes) and needs no transformers: a test builds each family's model on the meta device and checks
every count and shape here against it.

Module paths are relative to the ``<Family>Model`` that ``<Family>ForConditionalGeneration`` keeps as ``model``:
``visual.blocks.0.attn.qkv`` here is ``model.visual.blocks.0.attn.qkv`` in the ForConditionalGeneration model.
A parameter's name is ``<group path>.<index>.<name>.weight`` (``.bias``), as ``named_parameters`` spells it.

Sizes the tower cannot do without (its width, depth, heads, MLP width, patch and image size, and the projector's
output width) are required: transformers would fall back to its config class defaults, which describe some other
checkpoint. Keys with a default that every checkpoint of the family shares (input channels, temporal patch size,
merge size, ...) take transformers' default, named beside it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from .errors import ModelConfigError
from .shapes import MAX_DIM, MAX_LAYERS, VISION_LANGUAGE_MODEL_TYPES, LinearSpec

MlpKind = Literal["gelu_mlp", "gated_mlp"]  # fc1 -> act -> fc2, or down(act(gate) * up) (Qwen2.5-VL)
NormKind = Literal["layernorm", "rmsnorm"]  # nn.LayerNorm (weight and bias), or an RMSNorm (weight only)

# The wrapper model types read here (the ones spec.py refuses as text models); every other config.json gives None.
VISION_MODEL_TYPES = VISION_LANGUAGE_MODEL_TYPES

# transformers 5.24 defaults of a text config's hidden_size, for wrappers whose text_config may leave it out
# (llava-hf/llava-1.5-7b-hf's does): LlamaConfig (models/llama/configuration_llama.py) and MistralConfig
# (models/mistral/configuration_mistral.py) both default hidden_size to 4096.
TEXT_HIDDEN_DEFAULTS = {"llama": 4096, "mistral": 4096}


# ---------------------------------------------------------------------------
# Shapes


@dataclass(frozen=True)
class NormSpec:
    """A norm over ``size`` features: an ``nn.LayerNorm`` (weight and bias) or an RMSNorm (weight only)."""

    name: str
    size: int
    bias: bool

    @property
    def params(self) -> int:
        return self.size * (2 if self.bias else 1)


@dataclass(frozen=True)
class TensorSpec:
    """A parameter that is not part of an ``nn.Linear`` or a norm: a patch convolution, an embedding, a gate."""

    name: str
    shape: tuple[int, ...]

    @property
    def params(self) -> int:
        return math.prod(self.shape)


def _join(*parts: str) -> str:
    return ".".join(part for part in parts if part)


@dataclass(frozen=True)
class ModuleGroup:
    """Identical modules at ``path.<i>`` for each i in ``indices``, or the one module at ``path`` (indices None)."""

    path: str
    indices: tuple[int, ...] | None = None
    linears: tuple[LinearSpec, ...] = ()
    norms: tuple[NormSpec, ...] = ()
    tensors: tuple[TensorSpec, ...] = ()

    @property
    def count(self) -> int:
        return 1 if self.indices is None else len(self.indices)

    @property
    def params_each(self) -> int:
        return (sum(lin.params for lin in self.linears) + sum(norm.params for norm in self.norms)
                + sum(tensor.params for tensor in self.tensors))

    @property
    def params(self) -> int:
        return self.params_each * self.count

    def module_paths(self) -> tuple[str, ...]:
        if self.indices is None:
            return (self.path,)
        return tuple(_join(self.path, str(i)) for i in self.indices)

    def module_parameter_shapes(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        """(name, shape) of the parameters of one of the group's modules, named relative to it."""
        for lin in self.linears:
            yield _join(lin.name, "weight"), (lin.out_features, lin.in_features)
            if lin.bias:
                yield _join(lin.name, "bias"), (lin.out_features,)
        for norm in self.norms:
            yield _join(norm.name, "weight"), (norm.size,)
            if norm.bias:
                yield _join(norm.name, "bias"), (norm.size,)
        for tensor in self.tensors:
            yield tensor.name, tensor.shape

    def parameter_shapes(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        """(name, shape) of every parameter, as ``named_parameters`` of the ``<Family>Model`` names it."""
        for module in self.module_paths():
            for name, shape in self.module_parameter_shapes():
                yield _join(module, name), shape


def _groups_params(groups: tuple[ModuleGroup, ...]) -> int:
    return sum(group.params for group in groups)


@dataclass(frozen=True)
class VisionTowerSpec:
    """The vision encoder: its shape, attention layout and parameters (``groups``: embeddings, blocks, norms)."""

    family: str  # the tower's own kind: qwen2_vl, qwen2_5_vl, qwen3_vl, siglip, clip, mllama, idefics3, smolvlm
    module_class: str  # the transformers class, e.g. "Qwen2_5_VisionTransformerPretrainedModel"
    module_path: str  # where the tower sits in the <Family>Model: "visual", "vision_tower", "vision_model"
    hidden_size: int
    num_layers: int  # every encoder block (Mllama: local plus global)
    num_heads: int
    head_dim: int
    intermediate_size: int
    mlp_kind: MlpKind
    hidden_act: str
    norm_kind: NormKind
    patch_size: int
    temporal_patch_size: int  # frames per patch (Conv3d); 1 for a 2-D patch convolution
    in_channels: int
    image_size: int | None  # the fixed input size; None for native-resolution towers (Qwen-VL)
    num_position_embeddings: int | None  # learned position embeddings; None when positions are rotary only
    has_cls_token: bool
    attention: str  # how the blocks attend, in words
    full_attention_layers: tuple[int, ...] | None = None  # Qwen2.5-VL fullatt_block_indexes; the rest are windowed
    window_size: int | None = None  # Qwen2.5-VL: the attention window in pixels
    global_layers: int = 0  # Mllama: gated global encoder layers after the local ones
    intermediate_layers: tuple[int, ...] = ()  # Mllama: local layers whose outputs join the final one
    deepstack_layers: tuple[int, ...] = ()  # Qwen3-VL: blocks whose outputs feed the deepstack mergers
    max_num_tiles: int = 1  # Mllama: the tiles every image is padded to (vision_config.max_num_tiles)
    groups: tuple[ModuleGroup, ...] = ()

    @property
    def params(self) -> int:
        return _groups_params(self.groups)

    @property
    def block_linears(self) -> tuple[LinearSpec, ...]:
        """The ``nn.Linear`` layers of one encoder block (names relative to the block), for LoRA targeting."""
        return next(group.linears for group in self.groups if group.indices is not None)

    @property
    def patches_per_image(self) -> int | None:
        """Patch tokens of one image (or tile) at the fixed input size, CLS excluded; None for native resolution."""
        if self.image_size is None:
            return None
        return (self.image_size // self.patch_size) ** 2


@dataclass(frozen=True)
class ProjectorSpec:
    """What maps the tower's output into the language model's embedding space (merger, connector, projector)."""

    kind: str  # "qwen_patch_merger", "llava_mlp", "gemma3_soft_embedding", "pixel_shuffle_linear", "mllama_linear"
    module_class: str
    module_paths: tuple[str, ...]  # its modules in the <Family>Model (Qwen: inside the tower module, "visual.merger")
    in_features: int  # per output token, after any merging of patches
    out_features: int  # the language model's hidden size
    merge_factor: int  # patches merged into one language-model token (1: none)
    groups: tuple[ModuleGroup, ...] = ()

    @property
    def params(self) -> int:
        return _groups_params(self.groups)

    @property
    def linears(self) -> tuple[LinearSpec, ...]:
        return tuple(lin for group in self.groups for lin in group.linears)


# Where the language model sits in a <Family>Model (transformers 5.24) when it is not ``language_model``: Idefics3Model
# names it text_model. The recipe's LoRA regex and the estimate's warnings both read it.
LANGUAGE_MODEL_PATHS = {"idefics3": "text_model", "smolvlm": "text_model"}
# Idefics3's layout: Idefics3ForConditionalGeneration and SmolVLM(2)'s SmolVLMForConditionalGeneration (transformers'
# modular_smolvlm.py derives it from Idefics3: the same tower, pixel-shuffle connector, text_model and image splitting;
# SmolVLM's processor adds video, which the estimate does not read)
IDEFICS3_TYPES = ("idefics3", "smolvlm")
# The families whose LoRA or trained tower is estimated without gradient checkpointing: LayerNorm ViT towers (SigLIP,
# CLIP, Idefics3's; estimator/vision_memory.py ``_uncheckpointed_block_bytes``) and Llama 3.2 Vision, whose layers are
# not checkpointing layers anyway. Qwen's towers (RMSNorm, SwiGLU, rotary and windowed attention) are not measured so.
UNCHECKPOINTED_TOWER_TYPES = ("gemma3", "llava", "llava_next", "mllama", *IDEFICS3_TYPES)


def language_model_path(model_type: str) -> str:
    """The language model's attribute in the family's <Family>Model (``model.<path>.layers`` in the full name)."""
    return LANGUAGE_MODEL_PATHS.get(model_type, "language_model")

@dataclass(frozen=True)
class VisionSpec:
    """A vision-language model's vision side: tower, projector, and vision-only layers inside the language model."""

    model_type: str
    tower: VisionTowerSpec
    projector: ProjectorSpec
    # Mllama: the cross-attention decoder layers (MllamaCrossAttentionDecoderLayer) at these indices of the
    # language model's layers. They exist only to read the image, but transformers builds them into the language
    # model (model.language_model.layers.<i>), so a count of the language model includes them.
    cross_attention_layers: tuple[int, ...] = ()
    language_model_groups: tuple[ModuleGroup, ...] = ()
    # Mllama: what the language model holds beyond a Llama of the same num_hidden_layers, which is how the estimate
    # reads it (estimator/spec.py): each cross-attention layer's q_norm, k_norm and two tanh gates, and embed_tokens'
    # extra rows (MllamaTextModel: vocab_size + 8, the <|image|> token among them)
    language_model_extra_params: int = 0
    # LLaVA-NeXT: the config's image_grid_pinpoints ([height, width] pairs), the resolutions anyres tiles an image to
    image_grid_pinpoints: tuple[tuple[int, int], ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def tower_params(self) -> int:
        return self.tower.params

    @property
    def projector_params(self) -> int:
        return self.projector.params

    @property
    def language_model_vision_params(self) -> int:
        """Vision-only parameters that transformers counts in the language model (Mllama's cross-attention)."""
        return _groups_params(self.language_model_groups)

    @property
    def vision_params(self) -> int:
        return self.tower_params + self.projector_params + self.language_model_vision_params

    @property
    def params_beside_language_model(self) -> int:
        """What a count of the language model read as its text family misses: the tower, the projector, and
        Mllama's extras (:attr:`language_model_extra_params`; its cross-attention layers' linears and layer norms
        are layers of that count)."""
        return self.tower_params + self.projector_params + self.language_model_extra_params

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter listed here, by its name in the ``<Family>Model``."""
        groups = self.tower.groups + self.projector.groups + self.language_model_groups
        return dict(item for group in groups for item in group.parameter_shapes())


# ---------------------------------------------------------------------------
# Reading config.json


class _Fields:
    """Typed reads from one section of a config.json; every error names the key's path and the model_type."""

    def __init__(self, values: dict, where: str, model_type: str):
        self.values = values
        self.where = where  # "" for the top level, "vision_config." for a section
        self.model_type = model_type

    def error(self, key: str, problem: str) -> ModelConfigError:
        return ModelConfigError(f"config.json of a '{self.model_type}' model: '{self.where}{key}' {problem}")

    def section(self, key: str) -> _Fields:
        value = self.values.get(key)
        if not isinstance(value, dict):
            problem = "is missing" if value is None else f"must be an object; got {value!r:.60}"
            raise self.error(key, f"{problem}; the vision spec needs it")
        return _Fields(value, f"{self.where}{key}.", self.model_type)

    def number(self, key: str, default: int | None = None, *, low: int = 1, high: int = MAX_DIM) -> int:
        """An integer in [low, high]; ``default`` when absent (a required key has none)."""
        value = self.values.get(key)
        if value is None:
            if default is None:
                raise self.error(key, "is missing; the vision spec needs it")
            return default
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.error(key, f"must be an integer from {low} to {high}; got {value!r:.60}")
        return value

    def ratio(self, key: str, default: float) -> float:
        value = self.values.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_DIM:
            raise self.error(key, f"must be a positive number; got {value!r:.60}")
        return float(value)

    def indices(self, key: str, default: tuple[int, ...], *, below: int) -> tuple[int, ...]:
        """A list of distinct layer indices in [0, below)."""
        value = self.values.get(key)
        if value is None:
            return default
        if not isinstance(value, list) or len(value) > below or len(set(map(repr, value))) != len(value):
            raise self.error(key, f"must be a list of distinct layer indices below {below}; got {value!r:.60}")
        if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < below for i in value):
            raise self.error(key, f"must hold layer indices from 0 to {below - 1}; got {value!r:.60}")
        return tuple(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.values.get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false; got {value!r:.60}")
        return value

    def word(self, key: str, default: str) -> str:
        value = self.values.get(key, default)
        if not isinstance(value, str) or not value or len(value) > 64:
            raise self.error(key, f"must be a short string; got {value!r:.60}")
        return value

    def length(self, key: str, default: int) -> int:
        """How many entries a list holds (Mllama's supported_aspect_ratios); ``default`` when absent."""
        value = self.values.get(key)
        if value is None:
            return default
        if not isinstance(value, list) or not value or len(value) > MAX_LAYERS:
            raise self.error(key, f"must be a non-empty list; got {value!r:.60}")
        return len(value)

    def head_dim(self, width: int, heads_key: str) -> tuple[int, int]:
        """(heads, head_dim) of an attention whose heads split ``width`` evenly."""
        heads = self.number(heads_key)
        if width % heads:
            raise self.error(heads_key, f"({heads}) must divide the width {width}")
        return heads, width // heads


def vision_spec_from_config(config: dict) -> VisionSpec | None:
    """The vision side of a multimodal config.json; None for a text-only (or unknown) model type.

    Raises ModelConfigError (a ValueError) naming the key and the model_type when a required key is missing or bad.
    """
    if not isinstance(config, dict):
        raise ModelConfigError(f"config.json must be an object; got {type(config).__name__}")
    model_type = config.get("model_type")
    reader = _READERS.get(model_type) if isinstance(model_type, str) else None
    if reader is None:
        return None
    assert isinstance(model_type, str)
    return reader(_Fields(config, "", model_type))


def _text_hidden(fields: _Fields, default_text_type: str) -> int:
    """The language model's width, which the projector maps into: text_config.hidden_size, or the transformers
    default of its text model type when a published config leaves it out (TEXT_HIDDEN_DEFAULTS)."""
    text = fields.section("text_config")
    text_type = text.values.get("model_type", default_text_type)
    default = TEXT_HIDDEN_DEFAULTS.get(text_type) if isinstance(text_type, str) else None
    return text.number("hidden_size", default)


# ---------------------------------------------------------------------------
# Building blocks shared by the towers


def _layer_norms(*names: str, size: int, bias: bool) -> tuple[NormSpec, ...]:
    return tuple(NormSpec(name, size, bias) for name in names)


def _gelu_mlp(prefix: str, width: int, intermediate: int, fc1: str = "fc1", fc2: str = "fc2") -> tuple[LinearSpec, ...]:
    """fc1 -> activation -> fc2, both with biases (CLIPMLP, SiglipMLP, VisionMlp, Qwen3VLVisionMLP)."""
    return (LinearSpec(_join(prefix, fc1), width, intermediate, True),
            LinearSpec(_join(prefix, fc2), intermediate, width, True))


def _separate_qkv(prefix: str, width: int, out_name: str, bias: bool) -> tuple[LinearSpec, ...]:
    """q_proj, k_proj, v_proj and the output projection, all width x width (ViT attention has no GQA)."""
    names = ("q_proj", "k_proj", "v_proj", out_name)
    return tuple(LinearSpec(_join(prefix, name), width, width, bias) for name in names)


def _fused_qkv(width: int) -> tuple[LinearSpec, ...]:
    """Qwen-VL vision attention: one qkv projection and proj, both with biases."""
    return LinearSpec("attn.qkv", width, 3 * width, True), LinearSpec("attn.proj", width, width, True)


def _vit_encoder_layers(path: str, width: int, intermediate: int, depth: int) -> ModuleGroup:
    """SigLIP/CLIP/Idefics3 encoder layers: layer_norm1, self_attn (q/k/v/out_proj with biases), layer_norm2, mlp."""
    return ModuleGroup(
        path,
        tuple(range(depth)),
        linears=_separate_qkv("self_attn", width, "out_proj", True) + _gelu_mlp("mlp", width, intermediate),
        norms=_layer_norms("layer_norm1", "layer_norm2", size=width, bias=True),
    )


def _vit_shape(vision: _Fields, heads_key: str = "num_attention_heads") -> dict:
    """Width, depth, heads, MLP width, patch and image size of a fixed-resolution ViT section (all required)."""
    width = vision.number("hidden_size")
    heads, head_dim = vision.head_dim(width, heads_key)
    patch = vision.number("patch_size")
    image = vision.number("image_size")
    if image < patch:
        raise vision.error("image_size", f"({image}) must be at least patch_size ({patch})")
    return dict(hidden_size=width, num_layers=vision.number("num_hidden_layers", high=MAX_LAYERS), num_heads=heads,
                head_dim=head_dim, intermediate_size=vision.number("intermediate_size"), patch_size=patch,
                image_size=image)


# ---------------------------------------------------------------------------
# Qwen-VL: native-resolution towers with a patch merger (the merger is a submodule of the tower in transformers)


def _qwen_patching(vision: _Fields) -> dict:
    """Patch embedding sizes shared by the Qwen-VL vision configs, whose classes (Qwen2VLVisionConfig,
    Qwen2_5_VLVisionConfig, Qwen3VLVisionConfig) all default temporal_patch_size to 2 and in_channels to 3
    (transformers reads in_channels; the in_chans that published Qwen2-VL/2.5-VL configs carry is not read)."""
    return dict(patch_size=vision.number("patch_size"), temporal_patch_size=vision.number("temporal_patch_size", 2),
                in_channels=vision.number("in_channels", 3))


def _qwen_merge(vision: _Fields) -> int:
    """Patches merged per side into one language-model token (all three Qwen-VL config classes default to 2)."""
    return vision.number("spatial_merge_size", 2)


def _qwen_patch_kernel(vision: _Fields, width: int) -> tuple[int, ...]:
    """The Conv3d patch embedding's weight: (width, channels, frames, patch, patch)."""
    patching = _qwen_patching(vision)
    patch = patching["patch_size"]
    return width, patching["in_channels"], patching["temporal_patch_size"], patch, patch


def _qwen_merger(width: int, merge: int, out: int, *, norm: NormSpec, fc_names: tuple[str, str],
                 path: str = "visual.merger", indices: tuple[int, ...] | None = None) -> ModuleGroup:
    """A patch merger: a norm, then two linears over merge x merge neighbouring patches concatenated."""
    merged = width * merge**2
    linears = (LinearSpec(fc_names[0], merged, merged, True), LinearSpec(fc_names[1], merged, out, True))
    return ModuleGroup(path, indices, linears=linears, norms=(norm,))


def _qwen_tower(vision: _Fields, family: str, module_class: str, *, width: int, depth: int, intermediate: int,
                mlp_kind: MlpKind, hidden_act: str, norm_kind: NormKind, attention: str,
                groups: tuple[ModuleGroup, ...], num_position_embeddings: int | None = None,
                **layout) -> VisionTowerSpec:
    """A Qwen-VL tower: native resolution (no fixed image size), no CLS token; ``layout`` holds the family's
    attention fields (full_attention_layers, window_size, deepstack_layers)."""
    heads, head_dim = vision.head_dim(width, "num_heads")
    return VisionTowerSpec(
        family=family, module_class=module_class, module_path="visual", hidden_size=width, num_layers=depth,
        num_heads=heads, head_dim=head_dim, intermediate_size=intermediate, mlp_kind=mlp_kind, hidden_act=hidden_act,
        norm_kind=norm_kind, **_qwen_patching(vision), image_size=None,
        num_position_embeddings=num_position_embeddings, has_cls_token=False, attention=attention, groups=groups,
        **layout)


_QWEN_NOTES = ("transformers builds the patch merger inside the vision tower module (model.visual.merger); it is "
               "counted here as the projector, not the tower",)


def _qwen2_vl(fields: _Fields) -> VisionSpec:
    """Qwen2VLForConditionalGeneration (models/qwen2_vl/modeling_qwen2_vl.py): Qwen2VisionTransformerPretrainedModel
    with PatchEmbed (Conv3d, no bias), Qwen2VLVisionBlock (LayerNorm norm1/norm2, VisionAttention qkv/proj, VisionMlp
    fc1/fc2) and PatchMerger (LayerNorm ln_q, mlp.0, mlp.2). Sizes from Qwen2VLVisionConfig: embed_dim is the
    tower's width, hidden_size the merger's output (the language model's width)."""
    vision = fields.section("vision_config")
    width = vision.number("embed_dim")
    depth = vision.number("depth", high=MAX_LAYERS)
    intermediate = int(width * vision.ratio("mlp_ratio", 4))  # Qwen2VLVisionConfig.mlp_ratio = 4
    hidden_act = vision.word("hidden_act", "quick_gelu")  # Qwen2VLVisionConfig default
    merge, out = _qwen_merge(vision), vision.number("hidden_size")
    stem = ModuleGroup("visual", tensors=(TensorSpec("patch_embed.proj.weight", _qwen_patch_kernel(vision, width)),))
    blocks = ModuleGroup("visual.blocks", tuple(range(depth)),
                         linears=_fused_qkv(width) + _gelu_mlp("mlp", width, intermediate),
                         norms=_layer_norms("norm1", "norm2", size=width, bias=True))
    tower = _qwen_tower(vision, "qwen2_vl", "Qwen2VisionTransformerPretrainedModel", width=width, depth=depth,
                        intermediate=intermediate, mlp_kind="gelu_mlp", hidden_act=hidden_act, norm_kind="layernorm",
                        attention="full bidirectional attention within each image; 2-D rotary positions",
                        groups=(stem, blocks))
    merger = _qwen_merger(width, merge, out, norm=NormSpec("ln_q", width, True), fc_names=("mlp.0", "mlp.2"))
    projector = ProjectorSpec("qwen_patch_merger", "PatchMerger", ("visual.merger",), width * merge**2, out,
                              merge**2, (merger,))
    return VisionSpec(fields.model_type, tower, projector, notes=_QWEN_NOTES)


def _qwen2_5_vl(fields: _Fields) -> VisionSpec:
    """Qwen2_5_VLForConditionalGeneration (models/qwen2_5_vl/modeling_qwen2_5_vl.py):
    Qwen2_5_VisionTransformerPretrainedModel with Qwen2_5_VisionPatchEmbed (Conv3d, no bias), Qwen2_5_VLVisionBlock
    (Qwen2_5_VLRMSNorm norm1/norm2, Qwen2_5_VLVisionAttention qkv/proj, Qwen2_5_VLMLP gate/up/down_proj with biases)
    and Qwen2_5_VLPatchMerger (RMSNorm ln_q, mlp.0, mlp.2). Windowed attention except in fullatt_block_indexes."""
    vision = fields.section("vision_config")
    width = vision.number("hidden_size")
    depth = vision.number("depth", high=MAX_LAYERS)
    intermediate = vision.number("intermediate_size")
    hidden_act = vision.word("hidden_act", "silu")  # Qwen2_5_VLVisionConfig default
    merge, out = _qwen_merge(vision), vision.number("out_hidden_size")
    # Qwen2_5_VLVisionConfig defaults: fullatt_block_indexes (7, 15, 23, 31), window_size 112
    full = vision.indices("fullatt_block_indexes", tuple(i for i in (7, 15, 23, 31) if i < depth), below=depth)
    window = vision.number("window_size", 112)
    gated = tuple(LinearSpec(f"mlp.{name}", a, b, True) for name, a, b in (
        ("gate_proj", width, intermediate), ("up_proj", width, intermediate), ("down_proj", intermediate, width)))
    stem = ModuleGroup("visual", tensors=(TensorSpec("patch_embed.proj.weight", _qwen_patch_kernel(vision, width)),))
    blocks = ModuleGroup("visual.blocks", tuple(range(depth)), linears=_fused_qkv(width) + gated,
                         norms=_layer_norms("norm1", "norm2", size=width, bias=False))
    tower = _qwen_tower(
        vision, "qwen2_5_vl", "Qwen2_5_VisionTransformerPretrainedModel", width=width, depth=depth,
        intermediate=intermediate, mlp_kind="gated_mlp", hidden_act=hidden_act, norm_kind="rmsnorm",
        attention="windowed attention (windows of window_size pixels a side) except in the full-attention blocks "
                  "(fullatt_block_indexes); 2-D rotary positions",
        groups=(stem, blocks), full_attention_layers=full, window_size=window)
    merger = _qwen_merger(width, merge, out, norm=NormSpec("ln_q", width, False), fc_names=("mlp.0", "mlp.2"))
    projector = ProjectorSpec("qwen_patch_merger", "Qwen2_5_VLPatchMerger", ("visual.merger",), width * merge**2,
                              out, merge**2, (merger,))
    return VisionSpec(fields.model_type, tower, projector, notes=_QWEN_NOTES)


def _qwen3_vl(fields: _Fields) -> VisionSpec:
    """Qwen3VLForConditionalGeneration (models/qwen3_vl/modeling_qwen3_vl.py): Qwen3VLVisionModel with
    Qwen3VLVisionPatchEmbed (Conv3d with bias), a learned pos_embed (nn.Embedding, bilinearly resampled),
    Qwen3VLVisionBlock (LayerNorm norm1/norm2, qkv/proj, Qwen3VLVisionMLP linear_fc1/linear_fc2), the merger
    Qwen3VLVisionPatchMerger (LayerNorm over the width) and one deepstack merger per deepstack_visual_indexes entry
    (LayerNorm over the merged width), whose outputs are added to the language model's first hidden states."""
    vision = fields.section("vision_config")
    width = vision.number("hidden_size")
    depth = vision.number("depth", high=MAX_LAYERS)
    intermediate = vision.number("intermediate_size")
    hidden_act = vision.word("hidden_act", "gelu_pytorch_tanh")  # Qwen3VLVisionConfig default
    merge, out = _qwen_merge(vision), vision.number("out_hidden_size")
    positions = vision.number("num_position_embeddings", 2304)  # Qwen3VLVisionConfig default
    # Qwen3VLVisionConfig default deepstack_visual_indexes: (8, 16, 24)
    deepstack = vision.indices("deepstack_visual_indexes", tuple(i for i in (8, 16, 24) if i < depth), below=depth)
    stem = ModuleGroup("visual", tensors=(TensorSpec("patch_embed.proj.weight", _qwen_patch_kernel(vision, width)),
                                          TensorSpec("patch_embed.proj.bias", (width,)),
                                          TensorSpec("pos_embed.weight", (positions, width))))
    blocks = ModuleGroup("visual.blocks", tuple(range(depth)),
                         linears=_fused_qkv(width) + _gelu_mlp("mlp", width, intermediate, "linear_fc1", "linear_fc2"),
                         norms=_layer_norms("norm1", "norm2", size=width, bias=True))
    tower = _qwen_tower(
        vision, "qwen3_vl", "Qwen3VLVisionModel", width=width, depth=depth, intermediate=intermediate,
        mlp_kind="gelu_mlp", hidden_act=hidden_act, norm_kind="layernorm",
        attention="full bidirectional attention within each image; 2-D rotary plus learned (resampled) positions",
        groups=(stem, blocks), num_position_embeddings=positions, deepstack_layers=deepstack)
    fc_names = ("linear_fc1", "linear_fc2")
    merged = width * merge**2
    mergers = (_qwen_merger(width, merge, out, norm=NormSpec("norm", width, True), fc_names=fc_names),
               _qwen_merger(width, merge, out, norm=NormSpec("norm", merged, True), fc_names=fc_names,
                            path="visual.deepstack_merger_list", indices=tuple(range(len(deepstack)))))
    projector = ProjectorSpec("qwen_patch_merger", "Qwen3VLVisionPatchMerger",
                              ("visual.merger", "visual.deepstack_merger_list"), merged, out, merge**2, mergers)
    notes = (*_QWEN_NOTES, "the deepstack mergers (visual.deepstack_merger_list) are counted with the projector")
    return VisionSpec(fields.model_type, tower, projector, notes=notes)


# ---------------------------------------------------------------------------
# Fixed-resolution ViTs: SigLIP (Gemma 3, some LLaVAs), CLIP (LLaVA), Idefics3/SmolVLM


def _siglip_tower(vision: _Fields, path: str) -> VisionTowerSpec:
    """SiglipVisionModel (models/siglip/modeling_siglip.py): SiglipVisionEmbeddings (Conv2d with bias, one learned
    position per patch, no CLS), SiglipEncoder layers, post_layernorm, and SiglipMultiheadAttentionPoolingHead when
    vision_use_head (SiglipVisionConfig default: true; Gemma 3 configs set it false). Defaults of
    SiglipVisionConfig: num_channels 3, hidden_act gelu_pytorch_tanh."""
    shape = _vit_shape(vision)
    width, channels, patch = shape["hidden_size"], vision.number("num_channels", 3), shape["patch_size"]
    positions = (shape["image_size"] // patch) ** 2
    stem = ModuleGroup(path, norms=(NormSpec("post_layernorm", width, True),), tensors=(
        TensorSpec("embeddings.patch_embedding.weight", (width, channels, patch, patch)),
        TensorSpec("embeddings.patch_embedding.bias", (width,)),
        TensorSpec("embeddings.position_embedding.weight", (positions, width))))
    groups: tuple[ModuleGroup, ...] = (stem, _vit_encoder_layers(f"{path}.encoder.layers", width,
                                                                  shape["intermediate_size"], shape["num_layers"]))
    if vision.flag("vision_use_head", True):
        groups += (_siglip_pooling_head(f"{path}.head", width, shape["intermediate_size"]),)
    return VisionTowerSpec(
        family="siglip", module_class="SiglipVisionModel", module_path=path, **shape, mlp_kind="gelu_mlp",
        hidden_act=vision.word("hidden_act", "gelu_pytorch_tanh"), norm_kind="layernorm", temporal_patch_size=1,
        in_channels=channels, num_position_embeddings=positions, has_cls_token=False,
        attention="full bidirectional attention over the patches", groups=groups)


def _siglip_pooling_head(path: str, width: int, intermediate: int) -> ModuleGroup:
    """SiglipMultiheadAttentionPoolingHead: a probe token, torch.nn.MultiheadAttention (packed in_proj and an
    out_proj Linear, all with biases), a LayerNorm and a SiglipMLP."""
    return ModuleGroup(
        path,
        linears=(LinearSpec("attention.out_proj", width, width, True), *_gelu_mlp("mlp", width, intermediate)),
        norms=(NormSpec("layernorm", width, True),),
        tensors=(TensorSpec("probe", (1, 1, width)), TensorSpec("attention.in_proj_weight", (3 * width, width)),
                 TensorSpec("attention.in_proj_bias", (3 * width,))))


def _clip_tower(vision: _Fields, path: str) -> VisionTowerSpec:
    """CLIPVisionModel (models/clip/modeling_clip.py): CLIPVisionEmbeddings (class_embedding, Conv2d without bias,
    one learned position per patch plus the CLS token), pre_layrnorm, CLIPEncoder layers, post_layernorm.
    CLIPVisionConfig defaults: num_channels 3, hidden_act quick_gelu."""
    shape = _vit_shape(vision)
    width, channels, patch = shape["hidden_size"], vision.number("num_channels", 3), shape["patch_size"]
    positions = (shape["image_size"] // patch) ** 2 + 1
    stem = ModuleGroup(path, norms=_layer_norms("pre_layrnorm", "post_layernorm", size=width, bias=True), tensors=(
        TensorSpec("embeddings.class_embedding", (width,)),
        TensorSpec("embeddings.patch_embedding.weight", (width, channels, patch, patch)),
        TensorSpec("embeddings.position_embedding.weight", (positions, width))))
    layers = _vit_encoder_layers(f"{path}.encoder.layers", width, shape["intermediate_size"], shape["num_layers"])
    return VisionTowerSpec(
        family="clip", module_class="CLIPVisionModel", module_path=path, **shape, mlp_kind="gelu_mlp",
        hidden_act=vision.word("hidden_act", "quick_gelu"), norm_kind="layernorm", temporal_patch_size=1,
        in_channels=channels, num_position_embeddings=positions, has_cls_token=True,
        attention="full bidirectional attention over the CLS token and the patches", groups=(stem, layers))


def _gemma3(fields: _Fields) -> VisionSpec:
    """Gemma3ForConditionalGeneration (models/gemma3/modeling_gemma3.py): a SigLIP vision_tower (AutoModel of
    vision_config, siglip_vision_model) and Gemma3MultiModalProjector: average pooling down to mm_tokens_per_image
    tokens, Gemma3RMSNorm mm_soft_emb_norm, and mm_input_projection_weight, a bare (vision width x text width)
    parameter applied with torch.matmul, not an nn.Linear (LoRA cannot target it)."""
    vision = fields.section("vision_config")
    vision_type = vision.word("model_type", "siglip_vision_model")  # Gemma3Config.sub_configs_defaults
    if vision_type != "siglip_vision_model":
        raise vision.error("model_type", f"'{vision_type}' is not a tower Gemma 3 is built with (siglip_vision_model)")
    tower = _siglip_tower(vision, "vision_tower")
    text_width = _text_hidden(fields, "gemma3_text")
    tokens = fields.number("mm_tokens_per_image", 256)  # Gemma3Config default
    patches_side = (tower.image_size or 0) // tower.patch_size
    kernel = patches_side // math.isqrt(tokens)  # Gemma3MultiModalProjector's avg_pool kernel_size
    if not kernel:
        raise fields.error("mm_tokens_per_image", f"({tokens}) must be at most the {patches_side ** 2} patches")
    group = ModuleGroup("multi_modal_projector", norms=(NormSpec("mm_soft_emb_norm", tower.hidden_size, False),),
                        tensors=(TensorSpec("mm_input_projection_weight", (tower.hidden_size, text_width)),))
    projector = ProjectorSpec("gemma3_soft_embedding", "Gemma3MultiModalProjector", ("multi_modal_projector",),
                              tower.hidden_size, text_width, kernel**2, (group,))
    return VisionSpec(fields.model_type, tower, projector)


def _llava(fields: _Fields) -> VisionSpec:
    """LlavaForConditionalGeneration (models/llava/modeling_llava.py) and LlavaNextForConditionalGeneration
    (models/llava_next/modeling_llava_next.py): the vision_tower is AutoModel of vision_config (CLIP by default,
    or SigLIP), LlavaMultiModalProjector / LlavaNextMultiModalProjector are linear_1 (vision width x number of
    vision_feature_layer entries -> text width), an activation, linear_2; LLaVA-NeXT adds image_newline, a learned
    text-width vector placed after each row of image features (counted with the projector)."""
    vision = fields.section("vision_config")
    vision_type = vision.word("model_type", "clip_vision_model")  # LlavaConfig.sub_configs_defaults
    towers = {"clip_vision_model": _clip_tower, "siglip_vision_model": _siglip_tower}
    if vision_type not in towers:
        raise vision.error("model_type", f"'{vision_type}' is not a vision tower read here ({', '.join(towers)})")
    tower = towers[vision_type](vision, "vision_tower")
    text_width = _text_hidden(fields, "llama")  # LlavaConfig's text_config defaults to a llama config
    feature_layer = fields.values.get("vision_feature_layer", -2)  # LlavaConfig default
    layers = _feature_layers(fields, feature_layer)
    bias = fields.flag("multimodal_projector_bias", True)  # LlavaConfig default
    width = tower.hidden_size * layers
    group = ModuleGroup("multi_modal_projector", linears=(LinearSpec("linear_1", width, text_width, bias),
                                                          LinearSpec("linear_2", text_width, text_width, bias)))
    groups: tuple[ModuleGroup, ...] = (group,)
    paths: tuple[str, ...] = ("multi_modal_projector",)
    if fields.model_type == "llava_next":
        groups += (ModuleGroup("", tensors=(TensorSpec("image_newline", (text_width,)),)),)
        paths += ("image_newline",)
    module_class = "LlavaNextMultiModalProjector" if fields.model_type == "llava_next" else "LlavaMultiModalProjector"
    projector = ProjectorSpec("llava_mlp", module_class, paths, width, text_width, 1, groups)
    notes = (f"the projector reads vision_feature_layer {feature_layer!r}: later tower layers are built (and loaded) "
             "but do not feed it",)
    pinpoints: tuple[tuple[int, int], ...] = ()
    if fields.model_type == "llava_next":
        from .vision_tokens import LLAVA_NEXT_GRID_PINPOINTS, _pinpoints

        try:
            pinpoints = _pinpoints(fields.values.get("image_grid_pinpoints", LLAVA_NEXT_GRID_PINPOINTS))
        except ValueError as exc:
            raise fields.error("image_grid_pinpoints", str(exc)) from None
    return VisionSpec(fields.model_type, tower, projector, image_grid_pinpoints=pinpoints, notes=notes)


def _feature_layers(fields: _Fields, value: object) -> int:
    """How many tower layers' outputs the LLaVA projector concatenates: vision_feature_layer is one layer index
    or a non-empty list of them."""
    def is_index(item: object) -> bool:
        return isinstance(item, int) and not isinstance(item, bool)

    if is_index(value):
        return 1
    if isinstance(value, list) and value and len(value) <= MAX_LAYERS and all(map(is_index, value)):
        return len(value)
    raise fields.error("vision_feature_layer", f"must be a layer index or a list of them; got {value!r:.60}")


def _idefics3(fields: _Fields) -> VisionSpec:
    """Idefics3ForConditionalGeneration (models/idefics3/modeling_idefics3.py) and SmolVLMForConditionalGeneration
    (models/smolvlm/modeling_smolvlm.py), the same layout: Idefics3VisionTransformer / SmolVLMVisionTransformer (a
    SigLIP encoder whose Conv2d has a bias, one learned position per patch, post_layernorm, no head) and
    Idefics3Connector / SmolVLMConnector: pixel shuffle by scale_factor (scale_factor^2 patches into one token),
    then modality_projection.proj, one Linear without bias."""
    vision = fields.section("vision_config")
    shape = _vit_shape(vision)
    smol = fields.model_type == "smolvlm"
    prefix = "SmolVLM" if smol else "Idefics3"
    width, channels, patch = shape["hidden_size"], vision.number("num_channels", 3), shape["patch_size"]
    positions = (shape["image_size"] // patch) ** 2
    stem = ModuleGroup("vision_model", norms=(NormSpec("post_layernorm", width, True),), tensors=(
        TensorSpec("embeddings.patch_embedding.weight", (width, channels, patch, patch)),
        TensorSpec("embeddings.patch_embedding.bias", (width,)),
        TensorSpec("embeddings.position_embedding.weight", (positions, width))))
    layers = _vit_encoder_layers("vision_model.encoder.layers", width, shape["intermediate_size"], shape["num_layers"])
    tower = VisionTowerSpec(
        family=fields.model_type, module_class=f"{prefix}VisionTransformer", module_path="vision_model", **shape,
        mlp_kind="gelu_mlp", hidden_act=vision.word("hidden_act", "gelu_pytorch_tanh"), norm_kind="layernorm",
        temporal_patch_size=1, in_channels=channels, num_position_embeddings=positions, has_cls_token=False,
        attention="full bidirectional attention over the patches of each image tile", groups=(stem, layers))
    scale = fields.number("scale_factor", 2)  # Idefics3Config / SmolVLMConfig default
    text_width = _text_hidden(fields, "llama")  # Idefics3Config / SmolVLMConfig text_config defaults to llama
    group = ModuleGroup("connector.modality_projection",
                        linears=(LinearSpec("proj", width * scale**2, text_width, False),))
    projector = ProjectorSpec("pixel_shuffle_linear", f"{prefix}Connector", ("connector",), width * scale**2,
                              text_width, scale**2, (group,))
    return VisionSpec(fields.model_type, tower, projector)


# ---------------------------------------------------------------------------
# Mllama (Llama 3.2 Vision): tiled ViT with local and gated global layers, cross-attention into the language model


# MllamaTextModel: nn.Embedding(config.vocab_size + 8, hidden_size), the image token (id vocab_size) among the 8
MLLAMA_EXTRA_EMBEDDING_ROWS = 8


def _mllama(fields: _Fields) -> VisionSpec:
    """MllamaForConditionalGeneration (models/mllama/modeling_mllama.py): MllamaVisionModel, the linear
    multi_modal_projector (vision_output_dim -> text width, with bias), and MllamaCrossAttentionDecoderLayer at each
    text_config.cross_attention_layers index of MllamaTextModel."""
    vision = fields.section("vision_config")
    tower = _mllama_tower(vision)
    text = fields.section("text_config")
    text_width = text.number("hidden_size")
    output = vision.number("vision_output_dim")  # the concatenated final and intermediate layer outputs
    group = ModuleGroup("", linears=(LinearSpec("multi_modal_projector", output, text_width, True),))
    projector = ProjectorSpec("mllama_linear", "nn.Linear", ("multi_modal_projector",), output, text_width, 1,
                              (group,))
    cross = _mllama_cross_attention(text)
    notes = ("the cross-attention layers (MllamaCrossAttentionDecoderLayer, model.language_model.layers.<i>) read "
             "only the image; transformers counts them in the language model",
             "the language model's embed_tokens has vocab_size + 8 rows (the image token among them); they are "
             "counted with the language model, not here")
    # a cross-attention layer's linears and its two layer norms are a Llama decoder layer's; these are not
    beyond_llama_layer = sum(norm.params for norm in cross.norms if norm.name.startswith("cross_attn.")) + sum(
        tensor.params for tensor in cross.tensors)
    extra = cross.count * beyond_llama_layer + MLLAMA_EXTRA_EMBEDDING_ROWS * text_width
    return VisionSpec(fields.model_type, tower, projector, cross_attention_layers=cross.indices or (),
                      language_model_groups=(cross,), language_model_extra_params=extra, notes=notes)


def _mllama_tower(vision: _Fields) -> VisionTowerSpec:
    """MllamaVisionModel: Conv2d patch_embedding (no bias), class_embedding, MllamaPrecomputedPositionEmbedding
    (gate, per-patch embedding, per-aspect-ratio tile embedding), pre/post MllamaPrecomputedAspectRatioEmbedding
    (gated), layernorm_pre/post, a local `transformer` of num_hidden_layers MllamaVisionEncoderLayer and a
    `global_transformer` of num_global_layers gated ones (gate_attn, gate_ffn). MllamaVisionConfig defaults:
    num_channels 3, 8 supported_aspect_ratios, intermediate_layers_indices [3, 7, 15, 23, 30]."""
    shape = _vit_shape(vision, heads_key="attention_heads")
    width, channels, patch = shape["hidden_size"], vision.number("num_channels", 3), shape["patch_size"]
    local = shape.pop("num_layers")
    global_layers = vision.number("num_global_layers", low=0, high=MAX_LAYERS)
    tiles = vision.number("max_num_tiles")
    aspect_ids = vision.length("supported_aspect_ratios", 8) + 1  # max_aspect_ratio_id + 1 embedding rows
    positions = (shape["image_size"] // patch) ** 2 + 1  # patches plus the class token
    tile_embedding = (TensorSpec("embedding.weight", (aspect_ids, tiles * width)), TensorSpec("gate", (1,)))
    stem = ModuleGroup("vision_model", norms=_layer_norms("layernorm_pre", "layernorm_post", size=width, bias=True),
                       tensors=(TensorSpec("patch_embedding.weight", (width, channels, patch, patch)),
                                TensorSpec("class_embedding", (width,)),
                                TensorSpec("gated_positional_embedding.gate", (1,)),
                                TensorSpec("gated_positional_embedding.embedding", (positions, width)),
                                TensorSpec("gated_positional_embedding.tile_embedding.weight",
                                           (aspect_ids, tiles * positions * width))))
    tile_groups = tuple(ModuleGroup(f"vision_model.{name}", tensors=tile_embedding)
                        for name in ("pre_tile_positional_embedding", "post_tile_positional_embedding"))
    linears = (tuple(LinearSpec(f"self_attn.{name}", width, width, False) for name in ("q_proj", "k_proj", "v_proj",
                                                                                       "o_proj"))
               + _gelu_mlp("mlp", width, shape["intermediate_size"]))
    norms = _layer_norms("input_layernorm", "post_attention_layernorm", size=width, bias=True)
    blocks = (ModuleGroup("vision_model.transformer.layers", tuple(range(local)), linears=linears, norms=norms),
              ModuleGroup("vision_model.global_transformer.layers", tuple(range(global_layers)), linears=linears,
                          norms=norms, tensors=(TensorSpec("gate_attn", (1,)), TensorSpec("gate_ffn", (1,)))))
    intermediate = vision.indices("intermediate_layers_indices", tuple(i for i in (3, 7, 15, 23, 30) if i < local),
                                  below=max(local, 1))
    return VisionTowerSpec(
        family="mllama", module_class="MllamaVisionModel", module_path="vision_model", num_layers=local + global_layers,
        **shape, mlp_kind="gelu_mlp", hidden_act=vision.word("hidden_act", "gelu"), norm_kind="layernorm",
        temporal_patch_size=1, in_channels=channels, num_position_embeddings=positions, has_cls_token=True,
        attention="full bidirectional attention within each tile (local layers), then across all tiles (gated "
                  "global layers)", global_layers=global_layers, intermediate_layers=intermediate, max_num_tiles=tiles,
        groups=(stem, *tile_groups, *blocks))


def _mllama_cross_attention(text: _Fields) -> ModuleGroup:
    """MllamaCrossAttentionDecoderLayer: MllamaTextCrossAttention (q/k/v/o_proj without biases, RMSNorm q_norm and
    k_norm over head_dim), input_layernorm, cross_attn_attn_gate, MllamaTextMLP, post_attention_layernorm,
    cross_attn_mlp_gate. MllamaTextConfig default cross_attention_layers: [3, 8, 13, 18, 23, 28, 33, 38]."""
    width = text.number("hidden_size")
    heads, head_dim = text.head_dim(width, "num_attention_heads")
    kv_heads = text.number("num_key_value_heads")
    intermediate = text.number("intermediate_size")
    layers = text.number("num_hidden_layers", high=MAX_LAYERS)
    default = tuple(i for i in (3, 8, 13, 18, 23, 28, 33, 38) if i < layers)
    indices = text.indices("cross_attention_layers", default, below=layers)
    attention = (LinearSpec("cross_attn.q_proj", width, heads * head_dim), LinearSpec("cross_attn.k_proj", width,
                 kv_heads * head_dim), LinearSpec("cross_attn.v_proj", width, kv_heads * head_dim),
                 LinearSpec("cross_attn.o_proj", heads * head_dim, width))
    mlp = (LinearSpec("mlp.gate_proj", width, intermediate), LinearSpec("mlp.up_proj", width, intermediate),
           LinearSpec("mlp.down_proj", intermediate, width))
    norms = (_layer_norms("cross_attn.q_norm", "cross_attn.k_norm", size=head_dim, bias=False)
             + _layer_norms("input_layernorm", "post_attention_layernorm", size=width, bias=False))
    return ModuleGroup("language_model.layers", indices, linears=attention + mlp, norms=norms,
                       tensors=(TensorSpec("cross_attn_attn_gate", (1,)), TensorSpec("cross_attn_mlp_gate", (1,))))


_READERS = {
    "qwen2_vl": _qwen2_vl,
    "qwen2_5_vl": _qwen2_5_vl,
    "qwen3_vl": _qwen3_vl,
    "qwen3_vl_moe": _qwen3_vl,  # Qwen3VLMoeVisionModel is Qwen3VLVisionModel (modular_qwen3_vl_moe.py)
    "gemma3": _gemma3,
    "mllama": _mllama,
    "llava": _llava,
    "llava_next": _llava,
    "idefics3": _idefics3,
    "smolvlm": _idefics3,
}
