"""Images as tokens: what a vision-language model's processor makes of one image of WIDTH x HEIGHT pixels.

For each supported family this module answers, from the image size, config.json's vision fields and the user's
processor knobs alone (stdlib only: no torch, numpy or transformers):

* how many tokens the image occupies in the language model's input sequence (they count in its sequence length,
  its logits and its loss), and how many of them are image placeholders that receive vision features;
* what the vision encoder runs: how many crops / tiles / views, how many positions each has, and how those
  positions are grouped into the attention sequences the encoder actually runs;
* the shape of the ``pixel_values`` tensor the processor returns for that one image (so its bytes can be counted);
* for Mllama, the vision states handed to the language model's cross-attention layers.

Each family mirrors the transformers 5.24 image processor and processor named in its function's docstring; the
tests compare every answer against those classes run on real images. Knobs carry the processors' own names and
default to the processor-class defaults, except knobs that must agree with the model's weights (the encoder's crop
or tile resolution, tokens per tile, patch and merge sizes), which come from config.json because a checkpoint
whose processor disagreed with its model could not run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FAMILY_KNOBS",
    "ImageTokens",
    "gemma3_image_tokens",
    "idefics3_image_tokens",
    "image_tokens_for_config",
    "llava_image_tokens",
    "llava_next_image_tokens",
    "mllama_image_tokens",
    "qwen_vl_image_tokens",
]


@dataclass(frozen=True)
class ImageTokens:
    """What the processor produces for one image, and what the model then runs on it.

    Attributes:
        lm_tokens: tokens this image occupies in the language model's ``input_ids`` when the prompt holds the image
            the way the model's chat template writes it: the image placeholders plus the marker tokens the processor
            (or, for Qwen, the chat template) puts around them. Each run of newlines the processor inserts between
            special tokens ("\\n", "\\n\\n") counts as one token: Idefics3Processor._get_num_multimodal_tokens's
            count for a tokenizer with a "\\n\\n" token; a tokenizer without one adds a token per such run.
        image_tokens: placeholder tokens in ``input_ids`` (the processor's ``image_token_id``) whose embeddings
            are replaced by vision features; for Mllama the single ``<|image|>`` token, whose embedding is an
            ordinary learned one (its vision states reach the LM through cross-attention instead).
        encoder_crops: images the vision encoder embeds for this one image: crops, tiles, pan-and-scan views and
            the global view, including Mllama's all-zero padding tiles (they run through the encoder too).
        encoder_positions_per_crop: positions per crop after patch embedding, including a CLS token where the
            encoder has one (CLIP: 577 at 336 px; Mllama: 1601 at 560 px); for Qwen, the patches of the image.
        encoder_sequences: independent attention sequences the encoder runs (its batch dimension).
        encoder_seq_len: length of each of those sequences, padding included (Mllama concatenates its tiles,
            each padded to a multiple of 8 positions, into one sequence).
        pixel_values_shape: the shape of the ``pixel_values`` the processor returns for this image alone.
        grid: the layout the processor chose: Qwen (grid_h, grid_w) patches; Mllama, LLaVA-NeXT and
            Idefics3/SmolVLM (rows, cols) of tiles ((0, 0) for Idefics3/SmolVLM when the image is not split);
            Gemma 3 (rows, cols) of pan-and-scan crops ((0, 0) without them); LLaVA (1, 1).
        cross_attention_tokens: vision states per image handed to Mllama's cross-attention layers (0 elsewhere).
        extra_text: prose the processor inserts that ``lm_tokens`` does not count (Gemma 3's pan-and-scan
            sentences); tokenize it with the model's tokenizer to add its few tokens. Empty elsewhere.
    """

    lm_tokens: int
    image_tokens: int
    encoder_crops: int
    encoder_positions_per_crop: int
    encoder_sequences: int
    encoder_seq_len: int
    pixel_values_shape: tuple[int, ...]
    grid: tuple[int, int]
    cross_attention_tokens: int = 0
    extra_text: str = ""

    @property
    def pixel_values_numel(self) -> int:
        """Elements of ``pixel_values`` (the processors return float32: 4 bytes each before any cast)."""
        return math.prod(self.pixel_values_shape)


# --- shared -------------------------------------------------------------------------------------------------------

# RGB: every processor here converts to RGB (do_convert_rgb) and every config's vision num_channels defaults to 3.
RGB_CHANNELS = 3
# The CLS token CLIP's vision embeddings prepend (CLIPVisionEmbeddings: num_positions = num_patches + 1); it is also
# the "+1" of LlavaProcessor's num_additional_image_tokens for CLIP towers. SigLIP towers have none.
CLS_TOKENS = 1


def _check_size(width: int, height: int) -> None:
    for name, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"image {name} must be a whole number of pixels; got {value!r}")
        if value < 1:
            raise ValueError(f"image {name} must be at least 1; got {value}")


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive whole number; got {value!r}")
    return value


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false; got {value!r}")
    return value


# --- Qwen2-VL, Qwen2.5-VL, Qwen3-VL --------------------------------------------------------------------------------

# Qwen2VLImageProcessor.size = {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280} (class default, used for
# qwen2_vl, qwen2_5_vl and qwen3_vl by AutoImageProcessor). The published preprocessor_config.json differs:
# Qwen2-VL-7B-Instruct and Qwen2.5-VL-7B-Instruct set max_pixels 12845056 (28 * 28 * 16384), and the Qwen3-VL
# checkpoints set size {"shortest_edge": 65536, "longest_edge": 16777216} with patch_size 16.
QWEN_MIN_PIXELS = 56 * 56
QWEN_MAX_PIXELS = 28 * 28 * 1280
# smart_resize (image_processing_qwen2_vl.py) refuses images whose long side exceeds 200 times the short side.
QWEN_MAX_ASPECT_RATIO = 200
# The chat template writes each image as <|vision_start|><|image_pad|><|vision_end|>; the processor expands only
# <|image_pad|>, so the two boundary tokens are in the sequence as well.
QWEN_BOUNDARY_TOKENS = 2


def _smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Mirror of ``smart_resize`` in transformers/models/qwen2_vl/image_processing_qwen2_vl.py."""
    if max(height, width) / min(height, width) > QWEN_MAX_ASPECT_RATIO:
        raise ValueError(
            f"image aspect ratio must be at most {QWEN_MAX_ASPECT_RATIO} for Qwen-VL (smart_resize); "
            f"got {max(height, width) / min(height, width):.1f} for {width}x{height}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def qwen_vl_image_tokens(
    width: int,
    height: int,
    *,
    patch_size: int = 14,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
    min_pixels: int = QWEN_MIN_PIXELS,
    max_pixels: int = QWEN_MAX_PIXELS,
    num_channels: int = RGB_CHANNELS,
) -> ImageTokens:
    """Qwen2-VL / Qwen2.5-VL / Qwen3-VL: ``Qwen2VLImageProcessor._preprocess`` (smart_resize with factor
    patch_size * merge_size, then ``patchify``) and ``Qwen2VLProcessor.replace_image_token``
    (grid_t * grid_h * grid_w // merge_size**2 placeholders), transformers/models/qwen2_vl/.

    The encoder runs one sequence of grid_h * grid_w patches (grid_t = 1 for an image: the frame is repeated
    temporal_patch_size times inside each patch), each of num_channels * temporal_patch_size * patch_size**2 values.
    """
    _check_size(width, height)
    for name, value in (("patch_size", patch_size), ("merge_size", merge_size),
                        ("temporal_patch_size", temporal_patch_size), ("min_pixels", min_pixels),
                        ("max_pixels", max_pixels), ("num_channels", num_channels)):
        _positive_int(name, value)
    if min_pixels > max_pixels:
        raise ValueError(f"min_pixels must not exceed max_pixels; got min_pixels={min_pixels}, max_pixels={max_pixels}")
    resized_height, resized_width = _smart_resize(height, width, patch_size * merge_size, min_pixels, max_pixels)
    grid_h, grid_w = resized_height // patch_size, resized_width // patch_size
    patches = grid_h * grid_w
    placeholders = patches // merge_size**2
    return ImageTokens(
        lm_tokens=placeholders + QWEN_BOUNDARY_TOKENS,
        image_tokens=placeholders,
        encoder_crops=1,
        encoder_positions_per_crop=patches,
        encoder_sequences=1,
        encoder_seq_len=patches,
        pixel_values_shape=(patches, num_channels * temporal_patch_size * patch_size * patch_size),
        grid=(grid_h, grid_w),
    )


# --- Gemma 3 -------------------------------------------------------------------------------------------------------

# Gemma3Processor.images_kwargs (processing_gemma3.py): the processor's defaults, as the checkpoints' preprocessor
# configs leave these null (Gemma3ImageProcessor's class attributes are None).
GEMMA3_DO_PAN_AND_SCAN = False
GEMMA3_PAN_AND_SCAN_MIN_CROP_SIZE = 256
GEMMA3_PAN_AND_SCAN_MAX_NUM_CROPS = 4
GEMMA3_PAN_AND_SCAN_MIN_RATIO_TO_ACTIVATE = 1.2
# Gemma3Processor.full_image_sequence = "\n\n" + boi + image_token * image_seq_length + eoi + "\n\n": two marker
# tokens (<start_of_image>, <end_of_image>) and two "\n\n" runs around each view's soft tokens.
GEMMA3_MARKER_TOKENS = 2
GEMMA3_NEWLINE_RUNS = 2
# Gemma3Processor.replace_image_token's prose around pan-and-scan views (not counted in lm_tokens).
GEMMA3_PAN_AND_SCAN_TEXT = "Here is the original image and here are some crops to help you see better"


def _pan_and_scan_grid(
    width: int, height: int, min_crop_size: int, max_num_crops: int, min_ratio_to_activate: float
) -> tuple[int, int]:
    """Mirror of ``Gemma3ImageProcessor.pan_and_scan`` (image_processing_gemma3.py): (rows, cols) of crops of the
    original image, or (0, 0) when pan-and-scan does not apply."""
    if width >= height:
        if width / height < min_ratio_to_activate:
            return 0, 0
        num_crops_w = math.floor(width / height + 0.5)
        num_crops_w = min(math.floor(width / min_crop_size), num_crops_w)
        num_crops_w = min(max_num_crops, max(2, num_crops_w))
        num_crops_h = 1
    else:
        if height / width < min_ratio_to_activate:
            return 0, 0
        num_crops_h = math.floor(height / width + 0.5)
        num_crops_h = min(math.floor(height / min_crop_size), num_crops_h)
        num_crops_h = min(max_num_crops, max(2, num_crops_h))
        num_crops_w = 1
    crop_size_w = math.ceil(width / num_crops_w)
    crop_size_h = math.ceil(height / num_crops_h)
    if min(crop_size_w, crop_size_h) < min_crop_size:
        return 0, 0
    return num_crops_h, num_crops_w


def gemma3_image_tokens(
    width: int,
    height: int,
    *,
    image_size: int = 896,
    patch_size: int = 14,
    mm_tokens_per_image: int = 256,
    do_pan_and_scan: bool = GEMMA3_DO_PAN_AND_SCAN,
    pan_and_scan_min_crop_size: int = GEMMA3_PAN_AND_SCAN_MIN_CROP_SIZE,
    pan_and_scan_max_num_crops: int = GEMMA3_PAN_AND_SCAN_MAX_NUM_CROPS,
    pan_and_scan_min_ratio_to_activate: float = GEMMA3_PAN_AND_SCAN_MIN_RATIO_TO_ACTIVATE,
    num_channels: int = RGB_CHANNELS,
) -> ImageTokens:
    """Gemma 3 (Gemma3ForConditionalGeneration): ``Gemma3ImageProcessor._preprocess`` (the image plus its
    pan-and-scan crops, each resized to image_size x image_size) and ``Gemma3Processor.replace_image_token``
    (one full_image_sequence of mm_tokens_per_image soft tokens per view), transformers/models/gemma3/.

    The SigLIP encoder runs (image_size // patch_size)**2 positions per view (4096 at 896 px, no CLS);
    Gemma3MultiModalProjector average-pools them to mm_tokens_per_image (256). image_size defaults to the
    checkpoints' 896: Gemma3ImageProcessor's class default size (224) matches no Gemma 3 model.
    """
    _check_size(width, height)
    for name, value in (("image_size", image_size), ("patch_size", patch_size),
                        ("mm_tokens_per_image", mm_tokens_per_image), ("num_channels", num_channels),
                        ("pan_and_scan_min_crop_size", pan_and_scan_min_crop_size),
                        ("pan_and_scan_max_num_crops", pan_and_scan_max_num_crops)):
        _positive_int(name, value)
    ratio = pan_and_scan_min_ratio_to_activate
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not ratio > 0:
        raise ValueError(f"pan_and_scan_min_ratio_to_activate must be a positive number; got {ratio!r}")
    rows, cols = (0, 0)
    if _flag("do_pan_and_scan", do_pan_and_scan):
        rows, cols = _pan_and_scan_grid(width, height, pan_and_scan_min_crop_size, pan_and_scan_max_num_crops, ratio)
    views = 1 + rows * cols
    positions = (image_size // patch_size) ** 2
    per_view = mm_tokens_per_image + GEMMA3_MARKER_TOKENS + GEMMA3_NEWLINE_RUNS
    return ImageTokens(
        lm_tokens=views * per_view,
        image_tokens=views * mm_tokens_per_image,
        encoder_crops=views,
        encoder_positions_per_crop=positions,
        encoder_sequences=views,
        encoder_seq_len=positions,
        pixel_values_shape=(views, num_channels, image_size, image_size),
        grid=(rows, cols),
        extra_text=GEMMA3_PAN_AND_SCAN_TEXT if views > 1 else "",
    )


# --- Llama 3.2 Vision (Mllama) -------------------------------------------------------------------------------------

# MllamaImageProcessor.max_image_tiles (class default); it must equal vision_config.max_num_tiles (4 in the
# Llama-3.2-Vision configs) for the tile embeddings to line up.
MLLAMA_MAX_IMAGE_TILES = 4
# MllamaVisionModel.forward pads each tile's positions (patches + CLS) to a multiple of 8 before its encoders.
MLLAMA_POSITION_PAD_MULTIPLE = 8
# The processor leaves the prompt's <|image|> as it is: one token per image (build_string_from_input).
MLLAMA_IMAGE_TOKENS_PER_IMAGE = 1


def _mllama_canvas(height: int, width: int, max_image_tiles: int, tile_size: int) -> tuple[int, int]:
    """Mirror of ``get_optimal_tiled_canvas`` (image_processing_mllama.py): the canvas (height, width) in pixels.

    Arrangements come from ``get_all_supported_aspect_ratios``; as in the source, each pair's first number scales
    the height. The smallest upscale >= 1 wins, else the largest downscale; ties go to the smallest canvas area."""
    arrangements = [(a, b) for a in range(1, max_image_tiles + 1) for b in range(1, max_image_tiles + 1)
                    if a * b <= max_image_tiles]
    canvases = [(a * tile_size, b * tile_size) for a, b in arrangements]
    scales = []
    for canvas_h, canvas_w in canvases:
        scale_h, scale_w = canvas_h / height, canvas_w / width
        scales.append(scale_h if scale_w > scale_h else scale_w)
    upscales = [scale for scale in scales if scale >= 1]
    selected = min(upscales) if upscales else max(scale for scale in scales if scale < 1)
    chosen = [canvas for canvas, scale in zip(canvases, scales, strict=True) if scale == selected]
    return min(chosen, key=lambda canvas: canvas[0] * canvas[1])  # min keeps the first of equal areas, as argmin


def mllama_image_tokens(
    width: int,
    height: int,
    *,
    image_size: int = 560,
    patch_size: int = 14,
    max_image_tiles: int = MLLAMA_MAX_IMAGE_TILES,
    num_channels: int = RGB_CHANNELS,
) -> ImageTokens:
    """Llama 3.2 Vision (Mllama): ``MllamaImageProcessor.resize`` / ``_preprocess`` (tile arrangement by
    get_optimal_tiled_canvas, tiles of image_size px, ``pack_images`` pads to max_image_tiles) and
    ``MllamaProcessor`` (one <|image|> token per image), transformers/models/mllama/.

    The vision model (``MllamaVisionModel.forward``) embeds all max_image_tiles tiles, padding tiles included:
    (image_size // patch_size)**2 + 1 positions per tile (1601 at 560 px), padded to a multiple of 8 (1608) and
    concatenated into one sequence per image for its local and global encoders; the LM's cross-attention then
    sees max_image_tiles * 1601 vision states per image. image_size defaults to the checkpoints' 560: the
    processor's class default size (224) matches no Llama 3.2 Vision model.
    """
    _check_size(width, height)
    for name, value in (("image_size", image_size), ("patch_size", patch_size),
                        ("max_image_tiles", max_image_tiles), ("num_channels", num_channels)):
        _positive_int(name, value)
    canvas_h, canvas_w = _mllama_canvas(height, width, max_image_tiles, image_size)
    rows, cols = canvas_h // image_size, canvas_w // image_size
    positions = (image_size // patch_size) ** 2 + CLS_TOKENS
    padded = -(-positions // MLLAMA_POSITION_PAD_MULTIPLE) * MLLAMA_POSITION_PAD_MULTIPLE
    return ImageTokens(
        lm_tokens=MLLAMA_IMAGE_TOKENS_PER_IMAGE,
        image_tokens=MLLAMA_IMAGE_TOKENS_PER_IMAGE,
        encoder_crops=max_image_tiles,
        encoder_positions_per_crop=positions,
        encoder_sequences=1,
        encoder_seq_len=max_image_tiles * padded,
        pixel_values_shape=(1, 1, max_image_tiles, num_channels, image_size, image_size),
        grid=(rows, cols),
        cross_attention_tokens=max_image_tiles * positions,
    )


# --- LLaVA-1.5 and LLaVA-NeXT --------------------------------------------------------------------------------------

# LlavaConfig / LlavaNextConfig.vision_feature_select_strategy default: "default" drops the CLS feature, "full"
# keeps it (LlavaModel.get_image_features).
LLAVA_FEATURE_STRATEGIES = ("default", "full")
# LlavaNextConfig.image_grid_pinpoints default (also LlavaNextImageProcessor's class default and llava-v1.6's).
LLAVA_NEXT_GRID_PINPOINTS = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))


def _llava_strategy(value: Any) -> str:
    if value not in LLAVA_FEATURE_STRATEGIES:
        raise ValueError(f"vision_feature_select_strategy must be one of {', '.join(LLAVA_FEATURE_STRATEGIES)}; "
                         f"got {value!r}")
    return str(value)


def llava_image_tokens(
    width: int,
    height: int,
    *,
    image_size: int = 336,
    patch_size: int = 14,
    vision_feature_select_strategy: str = "default",
    num_additional_image_tokens: int = CLS_TOKENS,
    num_channels: int = RGB_CHANNELS,
) -> ImageTokens:
    """LLaVA-1.5: the CLIP image processor (resize the shortest edge, centre-crop to image_size) and
    ``LlavaProcessor.replace_image_token`` ((h // patch) * (w // patch) + num_additional_image_tokens, minus one
    for the "default" strategy), transformers/models/llava/processing_llava.py. The count does not depend on the
    image size. num_additional_image_tokens is 1 for a CLIP tower (its CLS token) and 0 for a tower without one,
    so that the count equals the features ``LlavaModel.get_image_features`` returns; LlavaProcessor's class
    default (0) would count one token fewer than a CLIP model's features.
    """
    _check_size(width, height)
    for name, value in (("image_size", image_size), ("patch_size", patch_size), ("num_channels", num_channels)):
        _positive_int(name, value)
    strategy = _llava_strategy(vision_feature_select_strategy)
    positions = (image_size // patch_size) ** 2 + num_additional_image_tokens
    placeholders = positions - (1 if strategy == "default" else 0)
    return ImageTokens(
        lm_tokens=placeholders,
        image_tokens=placeholders,
        encoder_crops=1,
        encoder_positions_per_crop=positions,
        encoder_sequences=1,
        encoder_seq_len=positions,
        pixel_values_shape=(1, num_channels, image_size, image_size),
        grid=(1, 1),
    )


def _select_best_resolution(height: int, width: int, pinpoints: Sequence[Sequence[int]]) -> tuple[int, int]:
    """Mirror of ``select_best_resolution`` (transformers/image_processing_utils.py): the pinpoint (height, width)
    that keeps the most of the image's resolution, then wastes the least."""
    best_fit = (0, 0)
    max_effective, min_wasted = 0, float("inf")
    for pin_h, pin_w in pinpoints:
        scale = min(pin_w / width, pin_h / height)
        down_w, down_h = int(width * scale), int(height * scale)
        effective = min(down_w * down_h, width * height)
        wasted = pin_w * pin_h - effective
        if effective > max_effective or (effective == max_effective and wasted < min_wasted):
            max_effective, min_wasted, best_fit = effective, wasted, (pin_h, pin_w)
    return best_fit


def _unpadded_features(height: int, width: int, patches_h: int, patches_w: int, scale_h: int,
                       scale_w: int) -> tuple[int, int]:
    """Mirror of ``LlavaNextProcessor._get_unpadded_features``: (unpadded features, newline features)."""
    current_height, current_width = patches_h * scale_h, patches_w * scale_w
    if width / height > current_width / current_height:
        new_height = int(round(height * (current_width / width), 7))
        current_height -= (current_height - new_height) // 2 * 2
    else:
        new_width = int(round(width * (current_height / height), 7))
        current_width -= (current_width - new_width) // 2 * 2
    return current_height * current_width, current_height


def _pinpoints(value: Any) -> tuple[tuple[int, int], ...]:
    if not isinstance(value, (list, tuple)) or not value or not all(
            isinstance(pin, (list, tuple)) and len(pin) == 2 for pin in value):
        raise ValueError(f"image_grid_pinpoints must be a non-empty list of [height, width] pairs; got {value!r}")
    return tuple((_positive_int("image_grid_pinpoints height", h), _positive_int("image_grid_pinpoints width", w))
                 for h, w in value)


def llava_next_image_tokens(
    width: int,
    height: int,
    *,
    image_size: int = 336,
    patch_size: int = 14,
    image_grid_pinpoints: Sequence[Sequence[int]] = LLAVA_NEXT_GRID_PINPOINTS,
    vision_feature_select_strategy: str = "default",
    num_additional_image_tokens: int = CLS_TOKENS,
    num_channels: int = RGB_CHANNELS,
) -> ImageTokens:
    """LLaVA-NeXT (anyres): ``LlavaNextImageProcessor.get_image_patches`` (the base image plus tiles of the best
    pinpoint, select_best_resolution) and ``LlavaNextProcessor._get_number_of_features`` (base features + unpadded
    tile features + one newline feature per row, minus one for the "default" strategy),
    transformers/models/llava_next/. The encoder runs each crop separately: image_size px, (image_size //
    patch_size)**2 + CLS positions (577 at 336 px); ``LlavaNextModel.get_image_features`` keeps the same crops.
    """
    _check_size(width, height)
    for name, value in (("image_size", image_size), ("patch_size", patch_size), ("num_channels", num_channels)):
        _positive_int(name, value)
    strategy = _llava_strategy(vision_feature_select_strategy)
    pinpoints = _pinpoints(image_grid_pinpoints)
    best_h, best_w = _select_best_resolution(height, width, pinpoints)
    # get_image_patches -> divide_to_patches steps over the padded best resolution in image_size strides
    tiles_h, tiles_w = -(-best_h // image_size), -(-best_w // image_size)
    crops = 1 + tiles_h * tiles_w
    patches_side = image_size // patch_size
    unpadded, newlines = _unpadded_features(height, width, patches_side, patches_side,
                                            best_h // image_size, best_w // image_size)
    base = patches_side * patches_side + num_additional_image_tokens
    placeholders = unpadded + newlines + base - (1 if strategy == "default" else 0)
    positions = patches_side * patches_side + num_additional_image_tokens
    return ImageTokens(
        lm_tokens=placeholders,
        image_tokens=placeholders,
        encoder_crops=crops,
        encoder_positions_per_crop=positions,
        encoder_sequences=crops,
        encoder_seq_len=positions,
        pixel_values_shape=(1, crops, num_channels, image_size, image_size),
        grid=(tiles_h, tiles_w),
    )


# --- Idefics3 and SmolVLM ------------------------------------------------------------------------------------------

# Idefics3ImageProcessor / SmolVLMImageProcessor class defaults: size {"longest_edge": 4 * 364}, splitting on.
# The SmolVLM-256M/500M-Instruct preprocessor_config.json sets size {"longest_edge": 2048} and max_image_size
# {"longest_edge": 512} instead.
IDEFICS3_SIZE_LONGEST_EDGE = 4 * 364
IDEFICS3_DO_IMAGE_SPLITTING = True
# MAX_IMAGE_SIZE in image_processing_idefics3.py: "4k resolution as absolute maximum" (a longer size["longest_edge"]
# is capped to it, so a plan's longest_edge stops there).
IDEFICS3_MAX_IMAGE_SIDE = 4096
# Idefics3Processor.replace_image_token / smolvlm's get_image_prompt_string: each tile is
# <fake_token_around_image><row_i_col_j> + image_seq_len <image>; the global image is
# <fake_token_around_image><global-img> + image_seq_len <image> + <fake_token_around_image>; each row of tiles ends
# in "\n" and one more "\n" precedes the global image (the last two make one "\n\n" run: one token, see
# ImageTokens.lm_tokens).
IDEFICS3_TILE_MARKERS = 2
IDEFICS3_GLOBAL_MARKERS = 3
# The checkpoints' tokenizers hold <row_i_col_j> as one added token for i, j up to 6 (SmolVLM's added tokens: 36 of
# them), which the default longest edge (4 tiles) never exceeds; a longer edge or a smaller tile makes grids past 6,
# whose markers the tokenizer splits into several tokens. They are counted as one token each, as the harness's
# stand-in tokenizer makes them (what cohorts v33 and v40 measured), and the estimate warns with the bound
# (vision_images.tile_marker_warning)
IDEFICS3_MARKED_GRID = 6


def _idefics3_unmarked_extra_tokens(rows: int, cols: int) -> int:
    """At most how many tokens beyond one each <row_i_col_j> past IDEFICS3_MARKED_GRID may take (one a character:
    a tokenizer never makes more tokens than an ASCII text has characters)."""
    return sum(len(f"<row_{i}_col_{j}>") - 1 for i in range(1, rows + 1) for j in range(1, cols + 1)
               if i > IDEFICS3_MARKED_GRID or j > IDEFICS3_MARKED_GRID)


def _rescale_to_max_len(height: int, width: int, max_len: int) -> tuple[int, int]:
    """Mirror of ``_resize_output_size_rescale_to_max_len`` (image_processing_idefics3.py; min_len 1)."""
    aspect_ratio = width / height
    if width >= height:
        width = max_len
        height = int(width / aspect_ratio)
        height += height % 2
    else:
        height = max_len
        width = int(height * aspect_ratio)
        width += width % 2
    return max(height, 1), max(width, 1)


def _scale_below_upper_bound(height: int, width: int, max_len: int) -> tuple[int, int]:
    """Mirror of ``_resize_output_size_scale_below_upper_bound`` (image_processing_idefics3.py)."""
    aspect_ratio = width / height
    if width >= height and width > max_len:
        width = max_len
        height = int(width / aspect_ratio)
    elif height > width and height > max_len:
        height = max_len
        width = int(height * aspect_ratio)
    return max(height, 1), max(width, 1)


def _resize_for_vision_encoder(height: int, width: int, tile: int) -> tuple[int, int]:
    """Mirror of ``Idefics3ImageProcessor.resize_for_vision_encoder``: both sides up to multiples of the tile."""
    aspect_ratio = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect_ratio) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect_ratio) / tile) * tile
    return height, width


def _longest_edge(name: str, value: Any) -> int:
    if isinstance(value, Mapping):
        if set(value) != {"longest_edge"}:
            raise ValueError(f'{name} must be {{"longest_edge": N}}; got {dict(value)!r}')
        value = value["longest_edge"]
    return _positive_int(f"{name} longest_edge", value)


def idefics3_image_tokens(
    width: int,
    height: int,
    *,
    image_size: int = 364,
    patch_size: int = 14,
    scale_factor: int = 2,
    do_image_splitting: bool = IDEFICS3_DO_IMAGE_SPLITTING,
    size: int | Mapping[str, int] = IDEFICS3_SIZE_LONGEST_EDGE,
    max_image_size: int | Mapping[str, int] | None = None,
    num_channels: int = RGB_CHANNELS,
) -> ImageTokens:
    """Idefics3 and SmolVLM: ``Idefics3ImageProcessor._preprocess`` (resize so the longest edge is
    size["longest_edge"], up or down; with do_image_splitting, round both sides up to multiples of
    max_image_size["longest_edge"] and cut tiles plus a resized global image, else one max_image_size square) and
    ``Idefics3Processor.replace_image_token`` / ``_get_num_multimodal_tokens`` (image_seq_len = (image_size //
    patch_size)**2 // scale_factor**2 <image> tokens per tile), transformers/models/idefics3/ (SmolVLM's files are
    copies). max_image_size defaults to the encoder's image_size: the class default (364) is Idefics3's tile and
    would not fit a SmolVLM encoder. The SigLIP encoder runs each tile separately, (tile // patch_size)**2
    positions (no CLS).
    """
    _check_size(width, height)
    for name, value in (("image_size", image_size), ("patch_size", patch_size), ("scale_factor", scale_factor),
                        ("num_channels", num_channels)):
        _positive_int(name, value)
    longest = _longest_edge("size", size)
    tile = image_size if max_image_size is None else _longest_edge("max_image_size", max_image_size)
    resized_h, resized_w = _rescale_to_max_len(height, width, longest)
    resized_h, resized_w = _scale_below_upper_bound(resized_h, resized_w, IDEFICS3_MAX_IMAGE_SIDE)
    rows = cols = 0
    if _flag("do_image_splitting", do_image_splitting):
        canvas_h, canvas_w = _resize_for_vision_encoder(resized_h, resized_w, tile)
        if canvas_h > tile or canvas_w > tile:
            rows, cols = (canvas_h - tile) // tile + 1, (canvas_w - tile) // tile + 1
    frames = rows * cols + 1
    image_seq_len = int(((image_size // patch_size) ** 2) / (scale_factor**2))
    lm_tokens = image_seq_len + IDEFICS3_GLOBAL_MARKERS
    if rows:
        lm_tokens += rows * (cols * (image_seq_len + IDEFICS3_TILE_MARKERS) + 1)
    positions = (tile // patch_size) ** 2
    return ImageTokens(
        lm_tokens=lm_tokens,
        image_tokens=frames * image_seq_len,
        encoder_crops=frames,
        encoder_positions_per_crop=positions,
        encoder_sequences=frames,
        encoder_seq_len=positions,
        pixel_values_shape=(1, frames, num_channels, tile, tile),
        grid=(rows, cols),
    )


# --- config.json dispatch ------------------------------------------------------------------------------------------

# The processor knobs each family accepts, named as its processor names them.
_QWEN_KNOBS = ("min_pixels", "max_pixels")
_IDEFICS3_KNOBS = ("do_image_splitting", "size", "max_image_size")
FAMILY_KNOBS: dict[str, tuple[str, ...]] = {
    "qwen2_vl": _QWEN_KNOBS,
    "qwen2_5_vl": _QWEN_KNOBS,
    "qwen3_vl": _QWEN_KNOBS,
    "qwen3_vl_moe": _QWEN_KNOBS,
    "gemma3": ("do_pan_and_scan", "pan_and_scan_min_crop_size", "pan_and_scan_max_num_crops",
               "pan_and_scan_min_ratio_to_activate"),
    "mllama": ("max_image_tiles",),
    "llava": ("vision_feature_select_strategy",),
    "llava_next": ("vision_feature_select_strategy", "image_grid_pinpoints"),
    "idefics3": _IDEFICS3_KNOBS,
    "smolvlm": _IDEFICS3_KNOBS,
}

# Vision-config values transformers fills in when config.json leaves them out (the config classes' defaults in
# 5.24: Qwen2VLVisionConfig / Qwen2_5_VLVisionConfig / Qwen3VLVisionConfig, SiglipVisionConfig for Gemma3Config,
# MllamaVisionConfig, LlavaConfig's CLIP sub-config spec, Idefics3VisionConfig, SmolVLMVisionConfig).
_VISION_DEFAULTS: dict[str, dict[str, int]] = {
    "qwen2_vl": {"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
    "qwen2_5_vl": {"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
    "qwen3_vl": {"patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2},
    "qwen3_vl_moe": {"patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2},
    "gemma3": {"image_size": 224, "patch_size": 16},
    "mllama": {"image_size": 448, "patch_size": 14, "max_num_tiles": 4},
    "llava": {"image_size": 336, "patch_size": 14},
    "llava_next": {"image_size": 336, "patch_size": 14},
    "idefics3": {"image_size": 224, "patch_size": 32},
    "smolvlm": {"image_size": 224, "patch_size": 32},
}
# Top-level defaults: Gemma3Config.mm_tokens_per_image, Idefics3Config / SmolVLMConfig.scale_factor.
_TOP_DEFAULTS: dict[str, dict[str, int]] = {"gemma3": {"mm_tokens_per_image": 256},
                                            "idefics3": {"scale_factor": 2}, "smolvlm": {"scale_factor": 2}}
# Vision towers whose embeddings carry no CLS token (LLaVA's num_additional_image_tokens is then 0).
_NO_CLS_TOWERS = ("siglip_vision_model",)


def _config_int(config: Mapping[str, Any], family: str, name: str) -> int:
    vision = config.get("vision_config") or {}
    if name in _TOP_DEFAULTS.get(family, {}):
        value = config.get(name, _TOP_DEFAULTS[family][name])
        label = name
    else:
        value = vision.get(name, _VISION_DEFAULTS[family][name])
        label = f"vision_config.{name}"
    if isinstance(value, (list, tuple)) and len(value) == 2 and value[0] == value[1]:
        value = value[0]  # a square [n, n] patch or image size
    return _positive_int(f"config.json {label}", value)


def _channels(config: Mapping[str, Any]) -> int:
    vision = config.get("vision_config") or {}
    value = vision.get("num_channels", vision.get("in_channels", vision.get("in_chans", RGB_CHANNELS)))
    return _positive_int("config.json vision_config.num_channels", value)


def _family_kwargs(family: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The model-bound arguments of ``family``'s function, read from config.json."""
    def get(name: str) -> int:
        return _config_int(config, family, name)

    if family.startswith("qwen"):
        return dict(patch_size=get("patch_size"), merge_size=get("spatial_merge_size"),
                    temporal_patch_size=get("temporal_patch_size"))
    if family == "gemma3":
        return dict(image_size=get("image_size"), patch_size=get("patch_size"),
                    mm_tokens_per_image=get("mm_tokens_per_image"))
    if family == "mllama":
        return dict(image_size=get("image_size"), patch_size=get("patch_size"), max_image_tiles=get("max_num_tiles"))
    if family in ("llava", "llava_next"):
        tower = (config.get("vision_config") or {}).get("model_type", "clip_vision_model")
        kwargs: dict[str, Any] = dict(
            image_size=get("image_size"), patch_size=get("patch_size"),
            vision_feature_select_strategy=config.get("vision_feature_select_strategy", "default"),
            num_additional_image_tokens=0 if tower in _NO_CLS_TOWERS else CLS_TOKENS)
        if family == "llava_next":
            kwargs["image_grid_pinpoints"] = config.get("image_grid_pinpoints") or LLAVA_NEXT_GRID_PINPOINTS
        return kwargs
    return dict(image_size=get("image_size"), patch_size=get("patch_size"), scale_factor=get("scale_factor"))


_FAMILY_FUNCTIONS: dict[str, Callable[..., ImageTokens]] = {
    "qwen2_vl": qwen_vl_image_tokens, "qwen2_5_vl": qwen_vl_image_tokens, "qwen3_vl": qwen_vl_image_tokens,
    "qwen3_vl_moe": qwen_vl_image_tokens,
    "gemma3": gemma3_image_tokens, "mllama": mllama_image_tokens, "llava": llava_image_tokens,
    "llava_next": llava_next_image_tokens, "idefics3": idefics3_image_tokens, "smolvlm": idefics3_image_tokens,
}


def image_tokens_for_config(
    model_type: str,
    width: int,
    height: int,
    config: Mapping[str, Any] | None = None,
    knobs: Mapping[str, Any] | None = None,
) -> ImageTokens:
    """What ``model_type``'s processor makes of one ``width`` x ``height`` image.

    ``model_type`` is the wrapper's config.json ``model_type`` (a key of FAMILY_KNOBS); ``config`` is that
    config.json as a dict (its vision_config and the top-level fields the count needs are read; missing ones take
    the transformers config-class defaults); ``knobs`` are the user's processor settings, named as the processor
    names them (FAMILY_KNOBS[model_type]); the rest take the processor-class defaults.
    Raises ValueError, naming the field and the value, for an unknown family or knob or a bad value.
    """
    if model_type not in FAMILY_KNOBS:
        raise ValueError(f"model_type {model_type!r} has no image-token rules; known: {', '.join(FAMILY_KNOBS)}")
    knobs = dict(knobs or {})
    unknown = sorted(set(knobs) - set(FAMILY_KNOBS[model_type]))
    if unknown:
        raise ValueError(f"unknown processor knob {unknown[0]!r} for {model_type}; "
                         f"known: {', '.join(FAMILY_KNOBS[model_type])}")
    kwargs = _family_kwargs(model_type, config or {})
    kwargs["num_channels"] = _channels(config or {})
    kwargs.update(knobs)
    return _FAMILY_FUNCTIONS[model_type](width, height, **kwargs)
