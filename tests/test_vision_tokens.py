"""estimator/vision_tokens.py against the transformers 5.24 processors and vision encoders themselves.

Every family's answer is compared with what its real image processor and processor return for real PIL images
(the PIL backend classes, built locally from their constructors: no Hub download) and, for the encoder fields, with
what a tiny randomly initialised copy of the real model does with those pixel_values. Tokens are counted by running
the processor's own prompt expansion through a tiny word-level tokenizer that holds the model's special tokens and
encodes "\\n" and "\\n\\n" as one token each (the newline convention ImageTokens.lm_tokens documents); any other
word is one token. transformers' PIL backend needs pillow; without it these comparisons skip, saying so.
"""

from __future__ import annotations

import functools
import math
import os

import pytest

from canifinetune.estimator import vision_tokens as vt
from canifinetune.estimator.vision_tokens import ImageTokens, image_tokens_for_config

# width x height: tiny (and not square, so anyres and pan-and-scan ties show), portrait, landscape, square, very
# large, odd, very wide (pan-and-scan, several tiles in one row), and one whose short side Idefics3's
# resize_for_vision_encoder rounds up a whole extra tile when the resize target is not a multiple of the tile
# (1456 px onto 512 px tiles: 490 -> 516 -> 1024, not 512)
SIZES = [(50, 40), (600, 1000), (1280, 720), (1024, 1024), (4000, 3000), (333, 777), (2000, 300), (1500, 505)]
# Pixel budgets up to 16 MP make a 12 MP image's pixel_values hundreds of MB: those cases run on these sizes only.
MODEST_SIZES = [size for size in SIZES if size[0] * size[1] <= 2_000_000]


@pytest.fixture(scope="module")
def hf():
    """transformers and pillow (the PIL image-processor backend), or a skip saying which is missing."""
    try:
        import PIL  # noqa: F401
        import transformers
    except ImportError as exc:  # CI installs both ([train], [test]): there the comparison must run, not skip
        why = (f"{exc.name} is not installed: the comparison needs transformers ([train]) and pillow ([test]), "
               "transformers' PIL image-processor backend")
        if os.environ.get("CANIFINETUNE_REQUIRE_INDEPENDENT_CHECKS"):
            pytest.fail(why)
        pytest.skip(why)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # the tiny models' configs warn about their toy vocabularies
    yield transformers
    transformers.logging.set_verbosity(verbosity)


@functools.cache
def _image(width: int, height: int):
    from PIL import Image

    return Image.new("RGB", (width, height), (200, 120, 40))


def _tokenizer(special: tuple[str, ...], bos: str | None = None, named: tuple[tuple[str, str], ...] = ()):
    """A word-level tokenizer: the given special tokens, "\\n" and "\\n\\n" as one token each, every other
    whitespace-separated word one unknown token. ``named`` become attributes such as ``boi_token``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AddedToken, PreTrainedTokenizerFast

    model = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=model, unk_token="[UNK]", bos_token=bos,
                                        extra_special_tokens=dict(named))
    tokenizer.add_tokens([AddedToken("\n", normalized=False), AddedToken("\n\n", normalized=False)])
    tokenizer.add_special_tokens({"additional_special_tokens": list(special)})
    return tokenizer


def _ids(out) -> list[int]:
    return [int(token) for token in out["input_ids"][0]]


def _first_layer_input(layer, run):
    """The shape of the hidden states entering ``layer`` while ``run()`` runs, and run()'s result."""
    seen: list[tuple[int, ...]] = []

    def hook(_module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        seen.append(tuple(hidden.shape))

    handle = layer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        import torch

        with torch.no_grad():
            result = run()
    finally:
        handle.remove()
    return seen[0], result


def _tiny_text(**extra):
    return dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=300, head_dim=8, **extra)


def _feature_count(features) -> int:
    """Vision features a get_image_features call returned (a tensor or a list of per-image tensors), each
    a vector of the LM's width."""
    parts = features if isinstance(features, (list, tuple)) else [features]
    return sum(math.prod(part.shape[:-1]) for part in parts)


TINY_VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)


# --- Qwen2-VL, Qwen2.5-VL, Qwen3-VL --------------------------------------------------------------------------------

QWEN_PROMPT = "<|vision_start|><|image_pad|><|vision_end|>"  # how the Qwen chat templates write an image
QWEN_PATCH = {"qwen2_vl": 14, "qwen2_5_vl": 14, "qwen3_vl": 16}
QWEN_DEFAULTS: dict = {}
QWEN_USER = {"min_pixels": 256 * 28 * 28, "max_pixels": 1024 * 28 * 28}  # the Qwen model cards' suggestion
QWEN2_CHECKPOINT = {"min_pixels": 3136, "max_pixels": 12845056}  # Qwen2(.5)-VL-7B-Instruct preprocessor_config
QWEN3_CHECKPOINT = {"min_pixels": 65536, "max_pixels": 16777216}  # Qwen3-VL preprocessor_config size


def _qwen_config(family: str) -> dict:
    return {"model_type": family, "vision_config": {"patch_size": QWEN_PATCH[family], "spatial_merge_size": 2,
                                                    "temporal_patch_size": 2, "in_chans": 3}}


@functools.cache
def _qwen_processor(family: str, knobs: tuple):
    import transformers as hf

    processor_class = {"qwen2_vl": hf.Qwen2VLProcessor, "qwen2_5_vl": hf.Qwen2_5_VLProcessor,
                       "qwen3_vl": hf.Qwen3VLProcessor}[family]

    class WithoutVideo(processor_class):  # the video processor needs torchvision; images do not
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    image_processor = hf.Qwen2VLImageProcessorPil(patch_size=QWEN_PATCH[family], merge_size=2,
                                                  temporal_patch_size=2, **dict(knobs))
    tokenizer = _tokenizer(("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"))
    return WithoutVideo(image_processor=image_processor, tokenizer=tokenizer, video_processor=None)


def _check_qwen(family: str, knobs: dict, width: int, height: int) -> None:
    processor = _qwen_processor(family, tuple(sorted(knobs.items())))
    out = processor(text=QWEN_PROMPT, images=[_image(width, height)], return_tensors="np")
    got = image_tokens_for_config(family, width, height, _qwen_config(family), knobs)
    ids = _ids(out)
    assert len(ids) == got.lm_tokens
    assert ids.count(processor.image_token_id) == got.image_tokens
    assert tuple(out["pixel_values"].shape) == got.pixel_values_shape
    assert out["pixel_values"].dtype.name == "float32"
    assert [int(v) for v in out["image_grid_thw"][0]] == [1, *got.grid]
    # the encoder's one sequence is the image's patches: pixel_values' rows
    assert (got.encoder_crops, got.encoder_sequences) == (1, 1)
    assert got.encoder_seq_len == got.encoder_positions_per_crop == out["pixel_values"].shape[0]


# Qwen2.5-VL's image processing is Qwen2-VL's (the same Qwen2VLImageProcessor); its user budgets run below.
@pytest.mark.parametrize(("family", "knobs"), [
    ("qwen2_vl", QWEN_DEFAULTS), ("qwen2_vl", QWEN_USER), ("qwen2_5_vl", QWEN_DEFAULTS), ("qwen3_vl", QWEN_DEFAULTS),
    ("qwen3_vl", QWEN_USER)], ids=["qwen2-defaults", "qwen2-user", "qwen2.5-defaults", "qwen3-defaults", "qwen3-user"])
@pytest.mark.parametrize(("width", "height"), SIZES)
def test_qwen_matches_processor(hf, family, knobs, width, height):
    _check_qwen(family, knobs, width, height)


@pytest.mark.parametrize(("family", "knobs"), [("qwen2_5_vl", QWEN2_CHECKPOINT), ("qwen3_vl", QWEN3_CHECKPOINT)])
@pytest.mark.parametrize(("width", "height"), MODEST_SIZES)
def test_qwen_checkpoint_pixel_budgets_match_processor(hf, family, knobs, width, height):
    _check_qwen(family, knobs, width, height)


def test_qwen_aspect_ratio_limit_matches_processor(hf):
    with pytest.raises(ValueError, match="aspect ratio"):
        _qwen_processor("qwen2_vl", ())(text=QWEN_PROMPT, images=[_image(5000, 20)])
    with pytest.raises(ValueError, match=r"aspect ratio must be at most 200 .* for 5000x20"):
        image_tokens_for_config("qwen2_vl", 5000, 20, _qwen_config("qwen2_vl"))


def _qwen_model(hf, family: str):
    text = _tiny_text()
    if family == "qwen2_vl":
        return hf.Qwen2VLModel(hf.Qwen2VLConfig(text_config=text, vision_config=dict(
            depth=1, embed_dim=16, hidden_size=16, num_heads=2, mlp_ratio=2)))
    if family == "qwen2_5_vl":
        return hf.Qwen2_5_VLModel(hf.Qwen2_5_VLConfig(text_config=text, vision_config=dict(
            depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=16,
            fullatt_block_indexes=[0])))
    return hf.Qwen3VLModel(hf.Qwen3VLConfig(text_config=text, vision_config=dict(
        depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=16,
        deepstack_visual_indexes=[], num_position_embeddings=64)))


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_qwen_encoder_runs_what_the_module_says(hf, family):
    import torch

    width, height = 333, 777
    model = _qwen_model(hf, family).eval()
    out = _qwen_processor(family, ())(text=QWEN_PROMPT, images=[_image(width, height)], return_tensors="pt")
    got = image_tokens_for_config(family, width, height, _qwen_config(family))
    shape, features = _first_layer_input(model.visual.blocks[0], lambda: model.get_image_features(
        pixel_values=out["pixel_values"], image_grid_thw=out["image_grid_thw"]))
    assert shape[0] == got.encoder_seq_len  # the blocks run one (patches, hidden) sequence
    assert _feature_count(features.pooler_output) == got.image_tokens
    assert isinstance(out["pixel_values"], torch.Tensor)


# --- Gemma 3 -------------------------------------------------------------------------------------------------------

GEMMA3_CONFIG = {"model_type": "gemma3", "mm_tokens_per_image": 256,
                 "vision_config": {"image_size": 896, "patch_size": 14, "model_type": "siglip_vision_model"}}
GEMMA3_PAS = {"do_pan_and_scan": True}
GEMMA3_PAS_CUSTOM = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 128, "pan_and_scan_max_num_crops": 8,
                     "pan_and_scan_min_ratio_to_activate": 1.1}


@functools.cache
def _gemma3_processor():
    import transformers as hf

    tokenizer = _tokenizer((), bos="<bos>", named=(("boi_token", "<start_of_image>"), ("eoi_token", "<end_of_image>"),
                                                   ("image_token", "<image_soft_token>")))
    image_processor = hf.Gemma3ImageProcessorPil(size={"height": 896, "width": 896})
    return hf.Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_length=256)


@pytest.mark.parametrize("knobs", [{}, GEMMA3_PAS, GEMMA3_PAS_CUSTOM], ids=["defaults", "pan-and-scan", "pas-custom"])
@pytest.mark.parametrize(("width", "height"), SIZES)
def test_gemma3_matches_processor(hf, knobs, width, height):
    processor = _gemma3_processor()
    out = processor(text="<start_of_image>", images=[_image(width, height)], return_tensors="np", **knobs)
    got = image_tokens_for_config("gemma3", width, height, GEMMA3_CONFIG, knobs)
    ids = _ids(out)
    # the tiny tokenizer makes each word of the pan-and-scan prose one token
    assert len(ids) == got.lm_tokens + len(got.extra_text.split())
    assert ids.count(processor.tokenizer.image_token_id) == got.image_tokens
    assert tuple(out["pixel_values"].shape) == got.pixel_values_shape
    assert got.encoder_crops == got.encoder_sequences == out["pixel_values"].shape[0]
    rows, cols = got.grid
    assert (rows * cols > 0) == bool(got.extra_text)


def test_gemma3_pan_and_scan_crops_match_image_processor(hf):
    """The crop grid itself, from Gemma3ImageProcessorPil.pan_and_scan on the original image."""
    import numpy as np

    image_processor = _gemma3_processor().image_processor
    for width, height in SIZES:
        array = np.zeros((3, height, width), dtype=np.uint8)
        crops = image_processor.pan_and_scan(array, 256, 4, 1.2)
        got = vt.gemma3_image_tokens(width, height, do_pan_and_scan=True)
        assert len(crops) == got.grid[0] * got.grid[1]
        if crops:  # a landscape image is cut into columns, a portrait one into rows
            assert got.grid == ((len(crops), 1) if height > width else (1, len(crops)))


def test_gemma3_encoder_runs_what_the_module_says(hf):
    width, height = 1280, 720
    model = hf.Gemma3Model(hf.Gemma3Config(text_config=_tiny_text(), mm_tokens_per_image=256, vision_config=dict(
        TINY_VISION, image_size=896, patch_size=14, model_type="siglip_vision_model"))).eval()
    out = _gemma3_processor()(text="<start_of_image>", images=[_image(width, height)], return_tensors="pt",
                              **GEMMA3_PAS)
    got = image_tokens_for_config("gemma3", width, height, GEMMA3_CONFIG, GEMMA3_PAS)
    layer = model.vision_tower.encoder.layers[0]
    shape, features = _first_layer_input(layer, lambda: model.get_image_features(pixel_values=out["pixel_values"]))
    assert shape[:2] == (got.encoder_sequences, got.encoder_seq_len) == (3, 4096)  # the image and 2 crops
    assert _feature_count(features.pooler_output) == got.image_tokens


# --- Llama 3.2 Vision (Mllama) -------------------------------------------------------------------------------------

MLLAMA_CONFIG = {"model_type": "mllama", "vision_config": {"image_size": 560, "patch_size": 14, "max_num_tiles": 4}}


@functools.cache
def _mllama_processor(max_image_tiles: int):
    import transformers as hf

    tokenizer = _tokenizer(("<|image|>", "<|python_tag|>"), bos="<|begin_of_text|>")
    image_processor = hf.MllamaImageProcessorPil(size={"height": 560, "width": 560}, max_image_tiles=max_image_tiles)
    return hf.MllamaProcessor(image_processor=image_processor, tokenizer=tokenizer)


@pytest.mark.parametrize("knobs", [{}, {"max_image_tiles": 2}, {"max_image_tiles": 6}], ids=["default", "2", "6"])
@pytest.mark.parametrize(("width", "height"), SIZES)
def test_mllama_matches_processor(hf, knobs, width, height):
    from transformers.models.mllama.image_processing_pil_mllama import get_all_supported_aspect_ratios

    processor = _mllama_processor(knobs.get("max_image_tiles", 4))
    out = processor(text="<|begin_of_text|><|image|>", images=[_image(width, height)], return_tensors="np")
    got = image_tokens_for_config("mllama", width, height, MLLAMA_CONFIG, knobs)
    ids = _ids(out)
    assert len(ids) - 1 == got.lm_tokens  # less the <|begin_of_text|> the prompt starts with
    assert ids.count(processor.image_token_id) == got.image_tokens
    assert tuple(out["pixel_values"].shape) == got.pixel_values_shape
    assert got.encoder_crops == out["pixel_values"].shape[2]  # padding tiles included
    used_tiles = int(out["aspect_ratio_mask"][0, 0].sum())
    assert used_tiles == got.grid[0] * got.grid[1]
    max_tiles = knobs.get("max_image_tiles", 4)
    assert get_all_supported_aspect_ratios(max_tiles)[int(out["aspect_ratio_ids"][0, 0]) - 1] == got.grid
    # every text token after <|image|> attends to the used tiles
    assert int(out["cross_attention_mask"][0, -1, 0].sum()) == used_tiles


def test_mllama_encoder_runs_what_the_module_says(hf):
    width, height = 1280, 720
    vision = hf.MllamaVisionModel(hf.MllamaVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_global_layers=1, attention_heads=2,
        image_size=560, patch_size=14, max_num_tiles=4, intermediate_layers_indices=[0])).eval()
    out = _mllama_processor(4)(text="<|begin_of_text|><|image|>", images=[_image(width, height)],
                               return_tensors="pt")
    got = image_tokens_for_config("mllama", width, height, MLLAMA_CONFIG)
    shape, states = _first_layer_input(vision.transformer.layers[0], lambda: vision(
        pixel_values=out["pixel_values"], aspect_ratio_ids=out["aspect_ratio_ids"],
        aspect_ratio_mask=out["aspect_ratio_mask"]))
    assert shape[:2] == (got.encoder_sequences, got.encoder_seq_len) == (1, 4 * 1608)
    tiles, positions = states.last_hidden_state.shape[2:4]  # (batch, images, tiles, positions, hidden)
    assert (tiles, positions) == (got.encoder_crops, got.encoder_positions_per_crop) == (4, 1601)
    assert tiles * positions == got.cross_attention_tokens


# --- LLaVA-1.5 and LLaVA-NeXT --------------------------------------------------------------------------------------

LLAVA_CONFIG = {"model_type": "llava", "vision_feature_select_strategy": "default",
                "vision_config": {"image_size": 336, "patch_size": 14, "model_type": "clip_vision_model"}}
LLAVA_NEXT_CONFIG = {**LLAVA_CONFIG, "model_type": "llava_next",
                     "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]}
# a wider anyres grid, as llava-onevision-style checkpoints use
WIDE_PINPOINTS = [[336, 336], [336, 1344], [1344, 336], [672, 1008], [1008, 672], [1008, 1008]]


@functools.cache
def _llava_processor(strategy: str):
    import transformers as hf

    image_processor = hf.CLIPImageProcessorPil(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336})
    return hf.LlavaProcessor(image_processor=image_processor, tokenizer=_tokenizer(("<image>",)), patch_size=14,
                             vision_feature_select_strategy=strategy, num_additional_image_tokens=1)


@functools.cache
def _llava_next_processor(strategy: str, pinpoints: tuple):
    import transformers as hf

    image_processor = hf.LlavaNextImageProcessorPil(size={"shortest_edge": 336},
                                                    crop_size={"height": 336, "width": 336},
                                                    image_grid_pinpoints=[list(pin) for pin in pinpoints])
    return hf.LlavaNextProcessor(image_processor=image_processor, tokenizer=_tokenizer(("<image>",)), patch_size=14,
                                 vision_feature_select_strategy=strategy, num_additional_image_tokens=1)


@pytest.mark.parametrize("strategy", ["default", "full"])
@pytest.mark.parametrize(("width", "height"), SIZES)
def test_llava_matches_processor(hf, strategy, width, height):
    processor = _llava_processor(strategy)
    out = processor(text="<image>", images=[_image(width, height)], return_tensors="np")
    got = image_tokens_for_config("llava", width, height, LLAVA_CONFIG,
                                  {"vision_feature_select_strategy": strategy})
    ids = _ids(out)
    assert len(ids) == got.lm_tokens == ids.count(processor.image_token_id) == got.image_tokens
    assert got.image_tokens == (576 if strategy == "default" else 577)
    assert tuple(out["pixel_values"].shape) == got.pixel_values_shape


@pytest.mark.parametrize("knobs", [{}, {"vision_feature_select_strategy": "full"},
                                   {"image_grid_pinpoints": WIDE_PINPOINTS}], ids=["default", "full", "wide-grid"])
@pytest.mark.parametrize(("width", "height"), SIZES)
def test_llava_next_matches_processor(hf, knobs, width, height):
    from transformers.image_processing_utils import select_best_resolution

    grid = knobs.get("image_grid_pinpoints", LLAVA_NEXT_CONFIG["image_grid_pinpoints"])
    pinpoints = tuple(tuple(pin) for pin in grid)
    processor = _llava_next_processor(knobs.get("vision_feature_select_strategy", "default"), pinpoints)
    out = processor(text="<image>", images=[_image(width, height)], return_tensors="np")
    got = image_tokens_for_config("llava_next", width, height, LLAVA_NEXT_CONFIG, knobs)
    ids = _ids(out)
    assert len(ids) == got.lm_tokens == ids.count(processor.image_token_id) == got.image_tokens
    assert tuple(out["pixel_values"].shape) == got.pixel_values_shape
    assert [int(v) for v in out["image_sizes"][0]] == [height, width]
    # the processor's own count for an image of this size (it checks pixel_values against it, too)
    counted = processor._get_num_multimodal_tokens(image_sizes=[[height, width]])["num_image_tokens"][0]
    assert counted == got.image_tokens
    best_height, best_width = select_best_resolution((height, width), [list(pin) for pin in pinpoints])
    assert got.grid == (best_height // 336, best_width // 336)


def test_llava_encoders_run_what_the_module_says(hf):
    width, height = 1280, 720
    vision = dict(TINY_VISION, image_size=336, patch_size=14, model_type="clip_vision_model", projection_dim=8)
    llava = hf.LlavaModel(hf.LlavaConfig(text_config=_tiny_text(model_type="llama"), vision_config=vision)).eval()
    out = _llava_processor("default")(text="<image>", images=[_image(width, height)], return_tensors="pt")
    got = image_tokens_for_config("llava", width, height, LLAVA_CONFIG)
    shape, features = _first_layer_input(llava.vision_tower.encoder.layers[0], lambda: (
        llava.get_image_features(pixel_values=out["pixel_values"], vision_feature_layer=-1,
                                 vision_feature_select_strategy="default")))
    assert shape[:2] == (got.encoder_sequences, got.encoder_seq_len) == (1, 577)
    assert _feature_count(features.pooler_output) == got.image_tokens

    nxt = hf.LlavaNextModel(hf.LlavaNextConfig(text_config=_tiny_text(model_type="llama"), vision_config=vision)).eval()
    pinpoints = tuple(tuple(pin) for pin in LLAVA_NEXT_CONFIG["image_grid_pinpoints"])
    out = _llava_next_processor("default", pinpoints)(text="<image>", images=[_image(width, height)],
                                                      return_tensors="pt")
    got = image_tokens_for_config("llava_next", width, height, LLAVA_NEXT_CONFIG)
    shape, features = _first_layer_input(nxt.vision_tower.encoder.layers[0], lambda: (
        nxt.get_image_features(pixel_values=out["pixel_values"], image_sizes=out["image_sizes"],
                               vision_feature_layer=-1, vision_feature_select_strategy="default")))
    assert shape[:2] == (got.encoder_sequences, got.encoder_seq_len) == (got.encoder_crops, 577)
    assert _feature_count(features.pooler_output) == got.image_tokens


# --- Idefics3 and SmolVLM ------------------------------------------------------------------------------------------

IDEFICS3_CONFIG = {"model_type": "idefics3", "scale_factor": 2, "vision_config": {"image_size": 364, "patch_size": 14}}
SMOLVLM_CONFIG = {"model_type": "smolvlm", "scale_factor": 4, "vision_config": {"image_size": 512, "patch_size": 16}}
# SmolVLM-256M/500M-Instruct's preprocessor_config values
SMOLVLM_CHECKPOINT = {"size": {"longest_edge": 2048}, "max_image_size": {"longest_edge": 512}}
IDEFICS3_SPECIAL = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>",
                    *(f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)))


@functools.cache
def _idefics3_processor():
    import transformers as hf

    return hf.Idefics3Processor(image_processor=hf.Idefics3ImageProcessorPil(),
                                tokenizer=_tokenizer(IDEFICS3_SPECIAL), image_seq_len=169)


@pytest.mark.parametrize("knobs", [{}, {"do_image_splitting": False}, {"size": {"longest_edge": 728}}],
                         ids=["class-defaults", "no-splitting", "size-728"])
@pytest.mark.parametrize(("width", "height"), SIZES)
def test_idefics3_matches_processor(hf, knobs, width, height):
    processor = _idefics3_processor()
    out = processor(text="<image>", images=[_image(width, height)], return_tensors="np", **knobs)
    got = image_tokens_for_config("idefics3", width, height, IDEFICS3_CONFIG, knobs)
    ids = _ids(out)
    assert len(ids) == got.lm_tokens
    assert ids.count(processor.image_token_id) == got.image_tokens
    assert tuple(out["pixel_values"].shape) == got.pixel_values_shape
    assert got.encoder_crops == got.encoder_sequences == out["pixel_values"].shape[1]


@pytest.mark.parametrize("knobs", [{}, SMOLVLM_CHECKPOINT, {**SMOLVLM_CHECKPOINT, "do_image_splitting": False},
                                   {**SMOLVLM_CHECKPOINT, "size": {"longest_edge": 1024}},
                                   {**SMOLVLM_CHECKPOINT, "size": {"longest_edge": 700}}],
                         ids=["class-defaults", "checkpoint", "no-splitting", "longest-edge-1024", "longest-edge-700"])
@pytest.mark.parametrize(("width", "height"), SIZES)
def test_smolvlm_matches_processor(hf, knobs, width, height):
    """SmolVLMProcessor needs num2words and a video processor (torchvision): its image prompt comes from the
    module's own get_image_prompt_string with the rows and columns SmolVLMImageProcessorPil returns."""
    from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

    image_processor = hf.SmolVLMImageProcessorPil(max_image_size={"longest_edge": 512})
    out = image_processor(_image(width, height), return_row_col_info=True, return_tensors="np", **knobs)
    got = image_tokens_for_config("smolvlm", width, height, SMOLVLM_CONFIG, knobs)
    rows, cols = out["rows"][0][0], out["cols"][0][0]
    prompt = get_image_prompt_string(rows, cols, 64, fake_token_around_image="<fake_token_around_image>",
                                     image_token="<image>", global_image_token="<global-img>")
    tokenizer = _idefics3_processor().tokenizer
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert len(ids) == got.lm_tokens
    assert ids.count(tokenizer.convert_tokens_to_ids("<image>")) == got.image_tokens
    assert tuple(out["pixel_values"].shape) == got.pixel_values_shape
    assert (rows, cols) == got.grid
    assert got.encoder_crops == got.encoder_sequences == out["pixel_values"].shape[1]


@pytest.mark.parametrize(("family", "config", "image_seq_len"), [("idefics3", IDEFICS3_CONFIG, 169),
                                                                 ("smolvlm", SMOLVLM_CONFIG, 64)])
def test_idefics3_encoders_run_what_the_module_says(hf, family, config, image_seq_len):
    width, height = 1280, 720
    model_class, config_class, processor_class = {
        "idefics3": (hf.Idefics3Model, hf.Idefics3Config, hf.Idefics3ImageProcessorPil),
        "smolvlm": (hf.SmolVLMModel, hf.SmolVLMConfig, hf.SmolVLMImageProcessorPil)}[family]
    vision = dict(TINY_VISION, **config["vision_config"])
    model = model_class(config_class(text_config=_tiny_text(model_type="llama"), vision_config=vision,
                                     scale_factor=config["scale_factor"])).eval()
    tile = config["vision_config"]["image_size"]
    out = processor_class(max_image_size={"longest_edge": tile})(_image(width, height), return_tensors="pt")
    got = image_tokens_for_config(family, width, height, config)
    shape, features = _first_layer_input(model.vision_model.encoder.layers[0], lambda: model.get_image_features(
        pixel_values=out["pixel_values"], pixel_attention_mask=out["pixel_attention_mask"]))
    assert shape[:2] == (got.encoder_sequences, got.encoder_seq_len) == (got.encoder_crops, (tile // 14 if
                                                                          family == "idefics3" else tile // 16) ** 2)
    assert _feature_count(features.pooler_output) == got.encoder_crops * image_seq_len == got.image_tokens


# --- the config.json entry point and its errors --------------------------------------------------------------------


def test_every_family_has_knobs_and_answers():
    for family in vt.FAMILY_KNOBS:
        result = image_tokens_for_config(family, 640, 480)
        assert isinstance(result, ImageTokens)
        assert result.lm_tokens >= result.image_tokens >= 1
        assert result.pixel_values_numel == math.prod(result.pixel_values_shape)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: image_tokens_for_config("qwen2_vl", 0, 10), "image width must be at least 1; got 0"),
    (lambda: image_tokens_for_config("gemma3", 10, -3), "image height must be at least 1; got -3"),
    (lambda: image_tokens_for_config("llava", 10.5, 10), "image width must be a whole number of pixels; got 10.5"),
    (lambda: image_tokens_for_config("paligemma", 10, 10), "model_type 'paligemma' has no image-token rules"),
    (lambda: image_tokens_for_config("qwen2_vl", 10, 10, knobs={"min_pixels": 2000, "max_pixels": 1000}),
     "min_pixels must not exceed max_pixels; got min_pixels=2000, max_pixels=1000"),
    (lambda: image_tokens_for_config("qwen2_vl", 10, 10, knobs={"do_pan_and_scan": True}),
     "unknown processor knob 'do_pan_and_scan' for qwen2_vl; known: min_pixels, max_pixels"),
    (lambda: image_tokens_for_config("gemma3", 10, 10, knobs={"do_pan_and_scan": "yes"}),
     "do_pan_and_scan must be true or false; got 'yes'"),
    (lambda: image_tokens_for_config("gemma3", 10, 10, knobs={"pan_and_scan_min_ratio_to_activate": 0}),
     "pan_and_scan_min_ratio_to_activate must be a positive number; got 0"),
    (lambda: image_tokens_for_config("mllama", 10, 10, knobs={"max_image_tiles": 0}),
     "max_image_tiles must be a positive whole number; got 0"),
    (lambda: image_tokens_for_config("llava", 10, 10, knobs={"vision_feature_select_strategy": "cls"}),
     "vision_feature_select_strategy must be one of default, full; got 'cls'"),
    (lambda: image_tokens_for_config("llava_next", 10, 10, knobs={"image_grid_pinpoints": [[336]]}),
     "image_grid_pinpoints must be a non-empty list of \\[height, width\\] pairs"),
    (lambda: image_tokens_for_config("smolvlm", 10, 10, knobs={"size": {"shortest_edge": 5}}),
     'size must be {"longest_edge": N}'),
    (lambda: image_tokens_for_config("idefics3", 10, 10, {"vision_config": {"patch_size": 0}}),
     "config.json vision_config.patch_size must be a positive whole number; got 0"),
])
def test_bad_input_raises_an_actionable_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
