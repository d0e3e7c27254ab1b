"""A vision-language model's images as its processor makes them: the tokens each becomes in the language model's
sequence and the patches its vision tower runs, and what is refused until measured (issue 26).

estimator/resolved.py reads these facts into ``ResolvedPlan.images``; estimator/vision_memory.py turns them into
bytes. The Qwen-VL, LLaVA and Gemma 3 processors are mirrored by estimator/vision_tokens.py (imported only for a VLM).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from .errors import PlanError
from .plan import TrainingPlan
from .spec import ModelSpec
from .vision_spec import IDEFICS3_TYPES, UNCHECKPOINTED_TOWER_TYPES, language_model_path

# Qwen/Qwen2.5-VL-3B-Instruct's and -7B-Instruct's preprocessor_config.json (what AutoProcessor.from_pretrained loads):
# min_pixels 3136 (56 x 56), max_pixels 12845056 (28 x 28 x 16384). The processor class's own default max_pixels is
# lower (1003520, image_processing_qwen2_vl.py): the checkpoint's is the one a user's run gets.
QWEN25_VL_MIN_PIXELS = 3136
QWEN25_VL_MAX_PIXELS = 12845056
# The Qwen3-VL checkpoints' preprocessor_config.json: size {"shortest_edge": 65536, "longest_edge": 16777216} (256 x 256
# to 4096 x 4096 pixels) with patch_size 16, merge_size 2 (processor_class Qwen3VLProcessor, Qwen2VLImageProcessorFast)
QWEN3_VL_MIN_PIXELS = 65536
QWEN3_VL_MAX_PIXELS = 16777216
# (min_pixels, max_pixels) a checkpoint's processor loads with, by family; Qwen/Qwen2-VL-2B's preprocessor_config.json
# (347 bytes, the Hub page for commit 258ddfb) has Qwen2.5-VL's bounds, and so do the 2B- and 7B-Instruct copies
QWEN_PIXEL_BOUNDS = {"qwen2_vl": (QWEN25_VL_MIN_PIXELS, QWEN25_VL_MAX_PIXELS),
                     "qwen2_5_vl": (QWEN25_VL_MIN_PIXELS, QWEN25_VL_MAX_PIXELS),
                     "qwen3_vl": (QWEN3_VL_MIN_PIXELS, QWEN3_VL_MAX_PIXELS),
                     "qwen3_vl_moe": (QWEN3_VL_MIN_PIXELS, QWEN3_VL_MAX_PIXELS)}

class ImageFacts(NamedTuple):
    """What the processor makes of a sample's images (estimator/vision_tokens.py mirrors it)."""

    width: int
    height: int
    images_per_sample: int
    lm_tokens_per_image: int  # placeholders plus the two markers the chat template writes around them
    image_tokens_per_image: int  # the placeholders alone (what the image's features replace)
    patches_per_image: int  # the vision tower's sequence for one image (before its 2x2 merge)
    pixel_values_per_image: int  # elements of the processor's pixel_values for one image
    processor: str  # what the processor did to the image, in words (its family and knobs)
    # Mllama: the vision states per image its cross-attention layers read (tiles x positions); 0 elsewhere
    cross_attention_tokens_per_image: int = 0
    # LLaVA-NeXT: the rows its projector maps per image (every crop's features, before unpadding); 0 where that is
    # image_tokens_per_image
    projected_per_image: int = 0

    @property
    def lm_tokens_per_sample(self) -> int:
        return self.lm_tokens_per_image * self.images_per_sample

    @property
    def patches_per_sample(self) -> int:
        return self.patches_per_image * self.images_per_sample

    @property
    def cross_attention_tokens_per_sample(self) -> int:
        return self.cross_attention_tokens_per_image * self.images_per_sample

    def words(self) -> str:
        """'1 image of 1280x720 per sample -> 1,198 tokens each (1,196 image tokens + 2 markers; ...)', for the
        assumptions."""
        images = f"{self.images_per_sample} image{'s' if self.images_per_sample != 1 else ''}"
        markers = self.lm_tokens_per_image - self.image_tokens_per_image
        marker_words = f" + {markers} markers" if markers else ""
        if self.cross_attention_tokens_per_image:
            return (f"{images} of {self.width}x{self.height} per sample -> {self.lm_tokens_per_image:,} token each "
                    f"in the text and {self.cross_attention_tokens_per_image:,} vision states its cross-attention "
                    f"layers read ({self.patches_per_image:,} vision positions), {self.processor}")
        return (f"{images} of {self.width}x{self.height} per sample -> {self.lm_tokens_per_image:,} tokens each "
                f"({self.image_tokens_per_image:,} image tokens{marker_words}; {self.patches_per_image:,} "
                f"vision positions), {self.processor}")


def check_images(plan: TrainingPlan, spec: ModelSpec) -> None:
    """A text model takes no images; a VLM needs them, and only what cohorts v21 to v26 and v28 measured is
    estimated."""
    if spec.vision is None:
        if plan.image_size is not None:
            raise PlanError.about("image_size", f"{plan.model} is a text model: it reads no images; drop image_size")
        return
    if plan.image_size is None:
        raise PlanError.about(
            "image_size", f"{plan.model} is a vision-language model: give the training images' size "
            "('WIDTHxHEIGHT', e.g. '1280x720') and images_per_sample; each image becomes image tokens in every "
            "sample, so the estimate needs them")
    refusals = (
        (plan.vision_tower == "full" and plan.method != "full", "vision_tower",
         f"'full' trains the tower's own weights, which a {plan.method} plan leaves frozen (PEFT would need it in "
         "modules_to_save, not estimated); train it with method full, or adapt it with vision_tower lora"),
        (plan.vision_tower == "lora" and not plan.uses_adapters, "vision_tower",
         f"'lora' puts adapters on the tower of a LoRA or QLoRA plan; method is {plan.method!r}"),
        (plan.vision_tower != "frozen" and not plan.gradient_checkpointing
         and spec.vision.model_type not in UNCHECKPOINTED_TOWER_TYPES, "vision_tower",
         f"{plan.vision_tower!r} without gradient checkpointing is not estimated yet for {spec.vision.model_type}'s "
         "tower (RMSNorm, SwiGLU, rotary attention: every block then keeps all its activations, not measured); "
         "with checkpointing it is"),
        (plan.framework != "trl", "framework", "vision-language models are estimated with TRL's SFTTrainer only"),
        (plan.trainer != "sft", "trainer", "vision-language models are estimated for SFT only"),
        (plan.num_gpus > 1, "num_gpus", "vision-language models are estimated on one GPU only"),
        (plan.sharding not in ("none", "ddp") or plan.offload_optimizer or plan.offload_params, "sharding",
         "vision-language models are estimated without DeepSpeed or FSDP (nor their CPU offload) yet"),
        (plan.packing or plan.padding_free, "packing", "TRL 1.16 refuses packing and padding-free rows for images"),
        (plan.effective_loss_implementation != "chunked", "loss_implementation",
         "vision-language models are estimated with TRL's default loss only"),
        (plan.attn_implementation not in (None, "sdpa"), "attn_implementation",
         "vision-language models are estimated with sdpa attention only"),
        (bool(plan.modules_to_save) or plan.use_dora, "modules_to_save",
         "modules_to_save and DoRA are not estimated for vision-language models yet"),
    )
    for refused, field, words in refusals:
        if refused:
            raise PlanError.about(field, words)
    if not has_pixel_bounds(spec):
        for name in ("min_pixels", "max_pixels"):
            if getattr(plan, name) is not None:
                does = _what_the_processor_does(spec)
                raise PlanError.about(name, f"is a Qwen-VL processor setting; {plan.model}'s processor "
                                            f"({spec.vision.model_type}) has none: it {does}; drop it")
    for name in ("do_image_splitting", "longest_edge", "max_image_size"):
        if getattr(plan, name) is not None and spec.vision.model_type not in IMAGE_SPLITTING_TYPES:
            raise PlanError.about(name, f"is an Idefics3/SmolVLM processor setting; {plan.model}'s processor "
                                        f"({spec.vision.model_type}) has none; drop it")


def _what_the_processor_does(spec: ModelSpec) -> str:
    """A fixed-size processor's handling of an image, in words (for refusing Qwen's pixel knobs)."""
    assert spec.vision is not None
    tower = spec.vision.tower
    side = f"{tower.image_size}x{tower.image_size}"
    if spec.vision.model_type == "mllama":
        tiles = tower.max_num_tiles
        return f"tiles every image into up to {tiles} tiles of {side} and always runs {tiles}"
    if spec.vision.model_type == "llava_next":
        return f"tiles every image to the best of its image_grid_pinpoints in {side} crops, plus the whole image"
    if spec.vision.model_type in IDEFICS3_TYPES:
        return (f"resizes every image's longest edge to {IDEFICS3_LONGEST_EDGE_TILES} tiles and splits it into {side} "
                "tiles plus a global image")
    return f"resizes every image to the tower's {side}"


def has_pixel_bounds(spec: ModelSpec) -> bool:
    """Whether the model's processor takes min_pixels/max_pixels (the Qwen-VL families of QWEN_PIXEL_BOUNDS); the
    others resize every image to their tower's fixed size."""
    return spec.vision is not None and spec.vision.model_type in QWEN_PIXEL_BOUNDS


def resolve_images(plan: TrainingPlan, spec: ModelSpec) -> ImageFacts | None:
    """The images' tokens and patches as the checkpoint's processor makes them (None for a text model)."""
    check_images(plan, spec)
    if spec.vision is None:
        return None
    size = plan.image_width_height
    assert size is not None
    if spec.vision.model_type == "gemma3":
        return _gemma3_images(plan, spec, size)
    if spec.vision.model_type == "mllama":
        return _mllama_images(plan, spec, size)
    if spec.vision.model_type == "llava_next":
        return _llava_next_images(plan, spec, size)
    if spec.vision.model_type in IDEFICS3_TYPES:
        return _idefics3_images(plan, spec, size)
    if not has_pixel_bounds(spec):
        return _llava_images(plan, spec, size)
    from .vision_tokens import qwen_vl_image_tokens  # a VLM's only: kept out of a text model's start

    tower = spec.vision.tower
    min_pixels, max_pixels = pixel_bounds(plan, spec)
    if min_pixels > max_pixels:
        raise PlanError.about("min_pixels", f"{min_pixels} is above max_pixels {max_pixels}")
    try:
        one = qwen_vl_image_tokens(size[0], size[1], patch_size=tower.patch_size,
                                   merge_size=_merge(spec),
                                   temporal_patch_size=tower.temporal_patch_size, min_pixels=min_pixels,
                                   max_pixels=max_pixels, num_channels=tower.in_channels)
    except ValueError as exc:
        raise PlanError.about("image_size", str(exc)) from None
    return ImageFacts(size[0], size[1], plan.images_per_sample, one.lm_tokens, one.image_tokens, one.encoder_seq_len,
                      one.pixel_values_numel,
                      f"Qwen-VL processor min_pixels {min_pixels:,}, max_pixels {max_pixels:,}")


def _llava_images(plan: TrainingPlan, spec: ModelSpec, size: tuple[int, int]) -> ImageFacts:
    """LLaVA-1.5: the CLIP processor resizes the shortest edge to the tower's size and centre-crops the square, so
    every image is the same tokens whatever its size (vision_tokens.llava_image_tokens, the "default" strategy: the
    CLS position is dropped)."""
    from .vision_tokens import llava_image_tokens

    assert spec.vision is not None
    tower = spec.vision.tower
    assert tower.image_size is not None
    try:
        one = llava_image_tokens(size[0], size[1], image_size=tower.image_size, patch_size=tower.patch_size,
                                 num_additional_image_tokens=1 if tower.has_cls_token else 0,
                                 num_channels=tower.in_channels)
    except ValueError as exc:
        raise PlanError.about("image_size", str(exc)) from None
    side = f"{tower.image_size}x{tower.image_size}"
    return ImageFacts(size[0], size[1], plan.images_per_sample, one.lm_tokens, one.image_tokens, one.encoder_seq_len,
                      one.pixel_values_numel, f"LLaVA processor: resized and centre-cropped to {side}")


def _llava_next_images(plan: TrainingPlan, spec: ModelSpec, size: tuple[int, int]) -> ImageFacts:
    """LLaVA-NeXT (anyres): the processor picks the best of the config's image_grid_pinpoints for the image, cuts it
    into tiles of the tower's size and adds the whole image resized as a base crop; the CLIP tower runs every crop
    (577 positions at 336 px), the projector maps each crop's 576 features, and the language model reads the base
    features, the unpadded tile features and one image_newline a row (vision_tokens.llava_next_image_tokens)."""
    from .vision_tokens import llava_next_image_tokens

    assert spec.vision is not None
    tower = spec.vision.tower
    assert tower.image_size is not None
    try:
        one = llava_next_image_tokens(size[0], size[1], image_size=tower.image_size, patch_size=tower.patch_size,
                                      image_grid_pinpoints=spec.vision.image_grid_pinpoints,
                                      num_additional_image_tokens=1 if tower.has_cls_token else 0,
                                      num_channels=tower.in_channels)
    except ValueError as exc:
        raise PlanError.about("image_size", str(exc)) from None
    rows, cols = one.grid
    features = tower.patches_per_image
    assert features is not None
    return ImageFacts(size[0], size[1], plan.images_per_sample, one.lm_tokens, one.image_tokens,
                      one.encoder_crops * one.encoder_positions_per_crop, one.pixel_values_numel,
                      f"LLaVA-NeXT processor: a {rows}x{cols} grid of {tower.image_size} px tiles and the base image",
                      projected_per_image=one.encoder_crops * features)


# Idefics3 / SmolVLM checkpoints' preprocessor_config.json: the longest edge resized to 4 tiles of the tower's image
# size (HuggingFaceTB/SmolVLM-256M-Instruct: 2048 = 4 x 512; Idefics3-8B: 1456 = 4 x 364, the class default), image
# splitting on
IDEFICS3_LONGEST_EDGE_TILES = 4
# The families whose processor takes do_image_splitting (Idefics3ImageProcessor; checkpoints' default: on)
IMAGE_SPLITTING_TYPES = IDEFICS3_TYPES


def _idefics3_images(plan: TrainingPlan, spec: ModelSpec, size: tuple[int, int]) -> ImageFacts:
    """Idefics3 / SmolVLM: the processor resizes the image's longest edge to 4 tiles, rounds its sides up to whole
    tiles of the tower's image size and splits it into those tiles plus a global image; each runs the SigLIP tower
    ((image_size / patch)² positions) and the connector's pixel shuffle makes scale_factor² of them one token
    (vision_tokens.idefics3_image_tokens: the tokens with their row/column markers and newlines)."""
    from .vision_tokens import idefics3_image_tokens

    assert spec.vision is not None
    tower = spec.vision.tower
    assert tower.image_size is not None
    _check_tile(plan, spec)
    scale = math.isqrt(spec.vision.projector.merge_factor)
    try:
        # image_size here is the tile image_seq_len is computed from: the recipe sets it to the plan's tile
        one = idefics3_image_tokens(size[0], size[1], image_size=tile_side(plan, spec), patch_size=tower.patch_size,
                                    scale_factor=scale, size=longest_edge(plan, spec),
                                    max_image_size=tile_side(plan, spec), num_channels=tower.in_channels,
                                    do_image_splitting=splitting(plan))
    except ValueError as exc:
        raise PlanError.about("image_size", str(exc)) from None
    rows, cols = one.grid
    resized = f"longest edge {longest_edge(plan, spec):,} px, " if splitting(plan) else ""
    side = tile_side(plan, spec)
    alone = f"on: {resized}one tile" if splitting(plan) else "off"
    words = (f"{resized}{rows}x{cols} tiles of {side} px and the global image" if rows else
             f"the global image alone (do_image_splitting {alone})")
    return ImageFacts(size[0], size[1], plan.images_per_sample, one.lm_tokens, one.image_tokens,
                      one.encoder_crops * one.encoder_positions_per_crop, one.pixel_values_numel,
                      f"Idefics3 processor: {words}")


def tile_marker_warning(plan: TrainingPlan, spec: ModelSpec) -> str | None:
    """A warning when an Idefics3 plan's tile grid passes the tokenizers' 6 x 6 row/column markers: those markers
    are counted as one token each, and the checkpoint's tokenizer may split each into up to one token a character."""
    from .vision_tokens import IDEFICS3_MARKED_GRID, _idefics3_unmarked_extra_tokens, idefics3_image_tokens

    if spec.vision is None or spec.vision.model_type not in IDEFICS3_TYPES or plan.image_width_height is None:
        return None
    tower = spec.vision.tower
    width, height = plan.image_width_height
    one = idefics3_image_tokens(width, height, image_size=tile_side(plan, spec), patch_size=tower.patch_size,
                                scale_factor=math.isqrt(spec.vision.projector.merge_factor),
                                size=longest_edge(plan, spec), max_image_size=tile_side(plan, spec),
                                num_channels=tower.in_channels, do_image_splitting=splitting(plan))
    rows, cols = one.grid
    if rows <= IDEFICS3_MARKED_GRID and cols <= IDEFICS3_MARKED_GRID:
        return None
    extra = _idefics3_unmarked_extra_tokens(rows, cols) * plan.images_per_sample
    return (f"a {rows}x{cols} tile grid: the checkpoints' tokenizers hold row/column markers up to "
            f"<row_{IDEFICS3_MARKED_GRID}_col_{IDEFICS3_MARKED_GRID}> only, and the estimate counts the others as one "
            f"token each; the checkpoint's tokenizer may split them, up to {extra:,} tokens more a sample (not read "
            "offline). Keep the grid within 6 x 6 (a lower longest_edge or a larger max_image_size) to be sure")


def tile_side(plan: TrainingPlan, spec: ModelSpec) -> int:
    """An Idefics3 plan's max_image_size (the tile side): the plan's, else the tower's image_size (the checkpoints')."""
    assert spec.vision is not None and spec.vision.tower.image_size is not None
    return plan.max_image_size or spec.vision.tower.image_size


def image_seq_len(plan: TrainingPlan, spec: ModelSpec) -> int:
    """The processor's image_seq_len for the plan's tile: (tile / patch_size)² / scale_factor² tokens (the recipe sets
    it; Idefics3Processor's docstring gives the formula)."""
    assert spec.vision is not None
    return (tile_side(plan, spec) // spec.vision.tower.patch_size) ** 2 // spec.vision.projector.merge_factor


def _check_tile(plan: TrainingPlan, spec: ModelSpec) -> None:
    """max_image_size within the tower's image_size and a whole number of pixel-shuffled patches a side (the
    connector reshapes each tile's (N / patch)² positions into (N / patch / scale)² tokens)."""
    assert spec.vision is not None
    tower = spec.vision.tower
    if plan.max_image_size is None or tower.image_size is None:
        return
    step = tower.patch_size * math.isqrt(spec.vision.projector.merge_factor)
    if plan.max_image_size > tower.image_size or plan.max_image_size % step:
        raise PlanError.about("max_image_size", f"{plan.max_image_size} is not a tile {plan.model}'s connector takes: "
                                                f"a multiple of {step} px (patch {tower.patch_size} x scale_factor "
                                                f"{math.isqrt(spec.vision.projector.merge_factor)}) up to the tower's "
                                                f"{tower.image_size} px, e.g. {max(step, tower.image_size - step)}")


def longest_edge(plan: TrainingPlan, spec: ModelSpec) -> int:
    """An Idefics3 plan's size["longest_edge"]: the plan's, else the checkpoints' (4 tiles of the tower's size)."""
    assert spec.vision is not None and spec.vision.tower.image_size is not None
    if plan.longest_edge is not None:
        return plan.longest_edge
    return IDEFICS3_LONGEST_EDGE_TILES * spec.vision.tower.image_size


def splitting(plan: TrainingPlan) -> bool:
    """An Idefics3 plan's do_image_splitting: the plan's, else the checkpoints' (on)."""
    from .vision_tokens import IDEFICS3_DO_IMAGE_SPLITTING

    return IDEFICS3_DO_IMAGE_SPLITTING if plan.do_image_splitting is None else plan.do_image_splitting


def _gemma3_images(plan: TrainingPlan, spec: ModelSpec, size: tuple[int, int]) -> ImageFacts:
    """Gemma 3: Gemma3ImageProcessor resizes every image to the tower's square (896 px) without pan-and-scan (the
    checkpoints' default), the SigLIP tower runs (896 / 14)² = 4,096 positions and the projector pools them to
    mm_tokens_per_image soft tokens, framed by <start_of_image>, <end_of_image> and two "\n\n" tokens
    (vision_tokens.gemma3_image_tokens)."""
    from .vision_tokens import gemma3_image_tokens

    assert spec.vision is not None
    tower = spec.vision.tower
    positions = tower.patches_per_image
    assert tower.image_size is not None and positions is not None
    tokens_per_image = positions // spec.vision.projector.merge_factor
    try:
        one = gemma3_image_tokens(size[0], size[1], image_size=tower.image_size, patch_size=tower.patch_size,
                                  mm_tokens_per_image=tokens_per_image, num_channels=tower.in_channels)
    except ValueError as exc:
        raise PlanError.about("image_size", str(exc)) from None
    side = f"{tower.image_size}x{tower.image_size}"
    return ImageFacts(size[0], size[1], plan.images_per_sample, one.lm_tokens, one.image_tokens, one.encoder_seq_len,
                      one.pixel_values_numel, f"Gemma 3 processor: resized to {side}, no pan-and-scan")


def _mllama_images(plan: TrainingPlan, spec: ModelSpec, size: tuple[int, int]) -> ImageFacts:
    """Llama 3.2 Vision: MllamaImageProcessor tiles every image into up to max_num_tiles tiles of the tower's size
    (560 px) and always pads to max_num_tiles, so every image runs the same tower sequence (4 x 1,608 positions)
    and gives the language model's cross-attention layers the same 4 x 1,601 vision states; the text holds one
    <|image|> token per image (vision_tokens.mllama_image_tokens)."""
    from .vision_tokens import mllama_image_tokens

    assert spec.vision is not None
    tower = spec.vision.tower
    assert tower.image_size is not None
    try:
        one = mllama_image_tokens(size[0], size[1], image_size=tower.image_size, patch_size=tower.patch_size,
                                  max_image_tiles=tower.max_num_tiles, num_channels=tower.in_channels)
    except ValueError as exc:
        raise PlanError.about("image_size", str(exc)) from None
    rows, cols = one.grid
    return ImageFacts(size[0], size[1], plan.images_per_sample, one.lm_tokens, one.image_tokens, one.encoder_seq_len,
                      one.pixel_values_numel,
                      f"Mllama processor: {rows}x{cols} tiles of {tower.image_size} px, padded to "
                      f"{tower.max_num_tiles}", one.cross_attention_tokens)


def pixel_bounds(plan: TrainingPlan, spec: ModelSpec) -> tuple[int, int]:
    """A Qwen-VL plan's (min_pixels, max_pixels): the plan's, else the checkpoint processor's (QWEN_PIXEL_BOUNDS)."""
    assert spec.vision is not None
    low, high = QWEN_PIXEL_BOUNDS[spec.vision.model_type]
    return (plan.min_pixels if plan.min_pixels is not None else low,
            plan.max_pixels if plan.max_pixels is not None else high)


def pixels_per_image_token(spec: ModelSpec) -> int:
    """The pixels one Qwen-VL image token covers: (patch x merge side)², 28² for Qwen2.5-VL, 32² for Qwen3-VL."""
    assert spec.vision is not None
    return spec.vision.tower.patch_size ** 2 * spec.vision.projector.merge_factor


def bidirectional_image_mask(attn_implementation: str, spec: ModelSpec, images: ImageFacts | None) -> bool:
    """Whether every language-model layer gets a 4-D mask because of the images: Gemma 3 lets each image's tokens
    attend to one another both ways. Its processor returns ``token_type_ids`` (Gemma3Processor.return_mm_token_type_ids)
    and TRL 1.16's collator passes them on; Gemma3Model.forward then builds both the full and the sliding layers' masks
    with the image blocks (``create_masks_for_vision_model``, modeling_gemma3.py, transformers 5.24), so SDPA runs the
    memory-efficient kernel on every layer, with the mask as a bias (memory.attention_mask_and_view_bytes)."""
    return (attn_implementation == "sdpa" and images is not None and spec.vision is not None
            and spec.vision.model_type == "gemma3")


def sequence_length(seq_len: int, images: ImageFacts | None) -> int:
    """S: the tokens of a row the language model runs, its text and its images' tokens."""
    return seq_len + (images.lm_tokens_per_sample if images is not None else 0)


def _merge(spec: ModelSpec) -> int:
    """The merger's side: 2 merges 2 x 2 patches into one token (merge_factor is its square)."""
    assert spec.vision is not None
    side = math.isqrt(spec.vision.projector.merge_factor)
    assert side * side == spec.vision.projector.merge_factor
    return side


def tower_target_warning(plan: TrainingPlan, spec: ModelSpec) -> str | None:
    """A warning when the plan's LoRA target names would reach the vision tower in the user's own PEFT run: PEFT
    matches a name by its last part in every sub-model, so ``gate_proj`` adapts the tower's MLP too and ``all-linear``
    every tower linear; the estimate (vision_tower frozen) counts the language model's adapters only."""
    if spec.vision is None or not plan.uses_adapters or plan.vision_tower != "frozen":
        return None
    groups = spec.vision.tower.groups + spec.vision.projector.groups
    # PEFT matches the last part of a module's name; shown with the module it sits in ("visual.blocks.mlp.gate_proj")
    shown = {f"{group.path}.{lin.name}": lin.name.rsplit(".", 1)[-1] for group in groups for lin in group.linears}
    from .spec import PEFT_DEFAULT_TARGETS

    # no names: PEFT's default for the language model's family (LLaVA's Llama: q_proj, v_proj, which CLIP has too)
    targets = plan.target_modules or PEFT_DEFAULT_TARGETS.get(spec.model_type)
    reached = [path for path, last in shown.items() if targets == "all-linear" or last in set(targets or ())]
    if not reached:
        return None
    named = "all-linear" if targets == "all-linear" else ", ".join(sorted({shown[p] for p in reached}))
    if plan.target_modules is None:
        named += f" (none given: the {spec.model_type} default the estimate uses; PEFT has no default for the wrapper)"
    cost = ("without gradient checkpointing its activations too (measured on Qwen2.5-VL-3B: +2.5 GB for one 448x448 "
            "image, 1,024 patches, where the frozen tower keeps nothing)" if not plan.gradient_checkpointing else
            "its adapters and their states, and its blocks' backward (measured on Qwen2.5-VL-3B with checkpointing: "
            "+0.15 GB for one 448x448 image)")
    language = language_model_path(spec.vision.model_type)
    restrict = (f"target_modules {named}: PEFT would also put adapters on the vision tower's {', '.join(reached)} (it "
                "matches names in every sub-model); this estimate is for a frozen tower, adapters on the language "
                f"model only. Restrict your run's target_modules to it (e.g. r'model\\.{language}\\..*\\."
                "(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)')")
    return (restrict + ", or set vision_tower lora to estimate the adapted tower (with gradient checkpointing): it "
            f"needs more, {cost}")
