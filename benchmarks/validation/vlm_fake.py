"""A vision-language SFT step run by TRL's own trainer under fake tensors (issue 26): images as TRL's collator
prepares them, the model as transformers builds it.

What runs is what a GPU run of TRL 1.16's ``SFTTrainer`` on a vision dataset runs, with transformers 5.24's model
class for the checkpoint (``AutoModelForImageTextToText``, from its config.json, random weights):

- the dataset rows hold real PIL images of the stated size (generated: the memory does not depend on the pixels) and
  a conversational message of ``seq_len`` text tokens after the images;
- ``SFTTrainer`` gets the family's real processor (its image processor with the stated knobs, a stand-in tokenizer
  whose words are one token each, and a chat template that places each image's markers), so its own
  ``DataCollatorForVisionLanguageModeling`` turns each batch into ``input_ids`` (the image placeholders expanded by
  the processor), ``pixel_values``, the family's grid or mask tensors and ``labels`` (padding masked, as TRL 1.16
  does; image tokens stay in the labels, as TRL 1.16 leaves them);
- each step is ``trainer.training_step`` (TRL's fused LM head, its metrics) and Trainer's optimizer phase, through
  ``sft_trainer_fake``'s counter and phases.

Emulated (docs/validation.md, "Emulated CUDA paths"): the GPU routing of ``fake_mode.gpu_routing``; the all-ones
``attention_mask`` of unpadded rows is not passed to the model, as in ``sft_trainer_fake`` (transformers reads the mask
on a GPU, finds no padding and uses ``is_causal``; it treats a fake mask as unreadable and would build a 4-D mask,
keep GQA's expanded keys and values and rule out the flash kernel); and the values of
small integer tensors made from the data. A fake tensor has no values, yet the Qwen-VL families read them (the image
grid for the vision tower's sequence lengths, windows and position ids, the placeholder positions for M-RoPE): torch
keeps the values of tensors made from data (``torch.tensor``) as the fake tensor's ``constant`` up to
``CONSTANT_NUMEL_LIMIT`` elements (1 in torch 2.13), and here the limit is raised to :data:`DATA_CONSTANT_LIMIT`, so
the batch's integer tensors keep their values and every shape the model derives from them is the real one. Parameters,
activations and pixel values are made without data and stay value-less.

    python benchmarks/validation/vlm_fake.py --model Qwen/Qwen2.5-VL-3B-Instruct --method lora \\
        --image-size 1280x720 --images-per-sample 1 --seq-len 512
    python benchmarks/validation/vlm_fake.py --plan plan.json --config config.json --out measured.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# Integer tensors from the data (input ids, masks, image grids) up to this many elements keep their values under fake
# tensors: a batch of 8 rows of 16k tokens; far below a parameter or activation of the models measured.
DATA_CONSTANT_LIMIT = 1 << 17
# The stand-in tokenizer: one id per word ("w" is every text token), and the family's markers (set in the config too,
# so the model finds its placeholders where the processor put them)
PAD, EOS, UNK, WORD = 0, 1, 2, 3
QWEN_MARKERS = {"vision_start_token_id": ("<|vision_start|>", 4), "vision_end_token_id": ("<|vision_end|>", 5),
                "image_token_id": ("<|image_pad|>", 6), "video_token_id": ("<|video_pad|>", 7),
                "vision_token_id": ("<|vision_pad|>", 8)}
QWEN_TEMPLATE = ("{% for message in messages %}{% for part in message['content'] %}"
                 "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
                 "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endfor %}")
# LLaVA-1.5 (llava-hf): the <image> placeholder (config image_token_index) and its chat template's image slot
LLAVA_MARKERS = {"image_token_index": ("<image>", 4)}
LLAVA_TEMPLATE = ("{% for message in messages %}{% for part in message['content'] %}"
                  "{% if part['type'] == 'image' %}<image>"
                  "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endfor %}")
# Gemma 3 (google/gemma-3-4b-it): the config's boi/eoi/image ids and Gemma3Processor's tokens for them; "\n\n" is one
# token of Gemma's tokenizer (id 108), which Gemma3Processor writes twice around every image
GEMMA3_MARKERS = {"boi_token_index": ("<start_of_image>", 4), "eoi_token_index": ("<end_of_image>", 5),
                  "image_token_index": ("<image_soft_token>", 6)}
GEMMA3_NEWLINES = ("\n\n", 7)
GEMMA3_TEMPLATE = ("{% for message in messages %}{% for part in message['content'] %}"
                   "{% if part['type'] == 'image' %}<start_of_image>"
                   "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endfor %}")
# Llama 3.2 Vision (Mllama): the config's image_token_index and MllamaProcessor's tokens; the processor writes the
# tokenizer's bos token after the leading image tokens of every sample (build_string_from_input)
MLLAMA_MARKERS = {"image_token_index": ("<|image|>", 4)}
MLLAMA_BOS = ("<|begin_of_text|>", 5)
MLLAMA_TEMPLATE = LLAVA_TEMPLATE.replace("<image>", "<|image|>")
# Idefics3 / SmolVLM: the config's image_token_id and Idefics3Processor's tokens: the tile and global markers it
# writes around every image's <image> runs, and the newlines between rows and before the global image, which the
# checkpoints' tokenizers keep as tokens of their own ("\n", "\n\n")
IDEFICS3_MARKERS = {"image_token_id": ("<image>", 4)}
IDEFICS3_SPECIALS = ("<fake_token_around_image>", "<global-img>", "<end_of_utterance>",
                     *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)))
IDEFICS3_NEWLINES = ("\n", "\n\n")
# the checkpoints' preprocessor_config.json resize the longest edge to 4 tiles (SmolVLM-256M: 2048 = 4 x 512;
# Idefics3-8B: 1456 = 4 x 364, the class default)
IDEFICS3_LONGEST_EDGE_TILES = 4
# Vision tower training: frozen (the default of VLM recipes), LoRA on its linears too, or fully trained
VISION_TOWER_MODES = ("frozen", "lora", "full")


def _beside(name: str):
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    return __import__(name)


def vlm_config(model_id: str) -> dict:
    """A published VLM config.json from estimator/data/vlm_configs.json."""
    data = json.loads((ROOT / "estimator" / "data" / "vlm_configs.json").read_text())
    for entry in data["configs"]:
        if entry["id"] == model_id:
            return entry["config"]
    raise SystemExit(f"{model_id}: not among the published VLM configs ({', '.join(e['id'] for e in data['configs'])})")


def _stand_in_tokenizer(folder: Path, markers: dict[str, int], *, named: dict[str, str] | None = None,
                        added: dict[str, int] | None = None, bos: str | None = None):
    """A tokenizer TRL and the processor can hold: pad/eos/unk, one word, and the family's marker tokens; ``named``
    sets attributes such as ``boi_token`` (Gemma3Processor reads them), ``added`` are plain tokens kept whole (Gemma's
    "\n\n")."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "</s>": EOS, "<unk>": UNK, "w": WORD, **markers, **(added or {})}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_tokens([AddedToken(text, normalized=False) for text in added or {}])
    # (an empty extra_special_tokens would drop the additional special tokens in transformers 5: passed only when set)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   **({"bos_token": bos} if bos else {}),
                                   **({"extra_special_tokens": named} if named else {}))
    fast.add_special_tokens({"additional_special_tokens": list(markers)})
    fast.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def qwen_processor(config: dict, folder: Path, knobs: dict):
    """Qwen2.5-VL's or Qwen3-VL's processor: the Qwen2-VL image processor with the tower's patch and merge sizes and
    ``knobs`` (min_pixels, max_pixels), the stand-in tokenizer."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor, Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = _stand_in_tokenizer(folder, dict(QWEN_MARKERS.values()))
    size = {}
    if "min_pixels" in knobs:
        size["shortest_edge"] = int(knobs["min_pixels"])
    if "max_pixels" in knobs:
        size["longest_edge"] = int(knobs["max_pixels"])
    vision = config.get("vision_config") or {}
    image_processor = Qwen2VLImageProcessorPil(patch_size=int(vision.get("patch_size", 14)),
                                               merge_size=int(vision.get("spatial_merge_size", 2)),
                                               **({"size": size} if size else {}))
    base = {"qwen3_vl": Qwen3VLProcessor, "qwen3_vl_moe": Qwen3VLProcessor,
            "qwen2_vl": Qwen2VLProcessor}.get(config.get("model_type"), Qwen2_5_VLProcessor)

    class ImagesOnlyProcessor(base):  # type: ignore[valid-type,misc]
        """Without a video processor (transformers' needs torchvision, absent from this environment; the rows have no
        videos), which the class check would refuse."""

        def check_argument_for_proper_class(self, argument_name, argument):
            if argument is None and argument_name == "video_processor":
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return ImagesOnlyProcessor(image_processor=image_processor, tokenizer=tokenizer, video_processor=None,
                               chat_template=QWEN_TEMPLATE)


def llava_processor(config: dict, folder: Path, knobs: dict):
    """LLaVA-1.5's processor as llava-hf/llava-1.5-7b-hf's processor files set it up: the CLIP image processor
    (shortest edge and centre crop at the tower's image size), patch size 14, the "default" feature strategy and one
    additional (CLS) token, so each image becomes (336 / 14)^2 = 576 <image> tokens; the stand-in tokenizer."""
    from transformers import LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    if knobs:
        raise ValueError(f"LLaVA's processor has no knobs measured here; got {sorted(knobs)}")
    vision = config.get("vision_config") or {}
    side = int(vision.get("image_size", 336))
    tokenizer = _stand_in_tokenizer(folder, dict(LLAVA_MARKERS.values()))
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    return LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer,
                          patch_size=int(vision.get("patch_size", 14)),
                          vision_feature_select_strategy=config.get("vision_feature_select_strategy", "default"),
                          num_additional_image_tokens=1, chat_template=LLAVA_TEMPLATE)


def gemma3_processor(config: dict, folder: Path, knobs: dict):
    """Gemma 3's processor as google/gemma-3-4b-it's processor files set it up: Gemma3ImageProcessor resizing every
    image to the tower's image_size square (pan-and-scan off, the checkpoint's default), mm_tokens_per_image soft
    tokens between <start_of_image> and <end_of_image>, each run framed by "\n\n"; the stand-in tokenizer."""
    from transformers import Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    if knobs:
        raise ValueError(f"Gemma 3's processor knobs are not measured here; got {sorted(knobs)}")
    side = int((config.get("vision_config") or {}).get("image_size", 896))
    names = dict(zip(("boi_token", "eoi_token", "image_token"), (text for text, _ in GEMMA3_MARKERS.values()),
                     strict=True))
    tokenizer = _stand_in_tokenizer(folder, dict(GEMMA3_MARKERS.values()), named=names,
                                    added=dict([GEMMA3_NEWLINES]))
    image_processor = Gemma3ImageProcessorPil(size={"height": side, "width": side})
    return Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer,
                           image_seq_length=int(config.get("mm_tokens_per_image", 256)),
                           chat_template=GEMMA3_TEMPLATE)


def llava_next_processor(config: dict, folder: Path, knobs: dict):
    """LLaVA-NeXT's processor as llava-hf's llava-v1.6 processor files set it up: LlavaNextImageProcessor (shortest
    edge and crops at the tower's image size, the config's image_grid_pinpoints: the base image and a grid of tiles),
    patch size 14, the "default" feature strategy and one additional (CLS) token; the stand-in tokenizer."""
    from transformers import LlavaNextProcessor
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    if knobs:
        raise ValueError(f"LLaVA-NeXT's processor knobs are not measured here; got {sorted(knobs)}")
    vision = config.get("vision_config") or {}
    side = int(vision.get("image_size", 336))
    tokenizer = _stand_in_tokenizer(folder, dict(LLAVA_MARKERS.values()))
    image_processor = LlavaNextImageProcessorPil(size={"shortest_edge": side},
                                                 crop_size={"height": side, "width": side},
                                                 image_grid_pinpoints=config.get("image_grid_pinpoints"))
    return LlavaNextProcessor(image_processor=image_processor, tokenizer=tokenizer,
                              patch_size=int(vision.get("patch_size", 14)),
                              vision_feature_select_strategy=config.get("vision_feature_select_strategy", "default"),
                              num_additional_image_tokens=1, chat_template=LLAVA_TEMPLATE)


def idefics3_processor(config: dict, folder: Path, knobs: dict):
    """Idefics3's (and SmolVLM's) processor as HuggingFaceTB/SmolVLM-256M-Instruct's processor files set it up:
    Idefics3ImageProcessor resizing the longest edge to 2048 px (the plan's longest_edge where it sets one) and
    splitting the image into tiles of the tower's image_size plus a global image, image_seq_len (image_size /
    patch)² / scale_factor² <image> tokens a tile framed by its markers; the stand-in tokenizer with the markers
    and newlines as tokens of their own."""
    from transformers import Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    unknown = sorted(set(knobs) - {"do_image_splitting", "longest_edge", "max_image_size"})
    if unknown:
        raise ValueError(f"Idefics3's processor knobs measured here: do_image_splitting, longest_edge, max_image_size; "
                         f"got {unknown}")
    vision = config.get("vision_config") or {}
    side, patch = int(vision.get("image_size", 364)), int(vision.get("patch_size", 14))
    scale = int(config.get("scale_factor", 2))
    ids = {text: 5 + k for k, text in enumerate(IDEFICS3_SPECIALS)}
    newlines = {text: 5 + len(ids) + k for k, text in enumerate(IDEFICS3_NEWLINES)}
    tokenizer = _stand_in_tokenizer(folder, {**dict(IDEFICS3_MARKERS.values()), **ids}, added=newlines)
    longest = int(knobs.get("longest_edge", IDEFICS3_LONGEST_EDGE_TILES * side))
    tile = int(knobs.get("max_image_size", side))  # the recipe's image_seq_len follows the tile (runtime.py)
    image_processor = Idefics3ImageProcessorPil(size={"longest_edge": longest},
                                               max_image_size={"longest_edge": tile},
                                               do_image_splitting=bool(knobs.get("do_image_splitting", True)))
    return Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer,
                             image_seq_len=(tile // patch) ** 2 // scale**2, chat_template=LLAVA_TEMPLATE)


def idefics3_every_image_real():
    """Idefics3Model.get_image_features drops padding images (all-zero pixel values) with a boolean mask made from
    the pixel values, which a fake tensor has no values for. Every row here holds the same images, so the processor
    pads none: the mask is all True, made from data (its values kept, DATA_CONSTANT_LIMIT) by comparing the pixel
    values' image count with itself; everything else is transformers' own function."""
    from transformers.models.idefics3 import modeling_idefics3 as idefics3

    return _every_image_real(idefics3.Idefics3Model)


def smolvlm_every_image_real():
    """SmolVLMModel.get_image_features (SmolVLM2's class, derived from Idefics3's), as for Idefics3."""
    from transformers.models.smolvlm import modeling_smolvlm as smolvlm

    return _every_image_real(smolvlm.SmolVLMModel)


@contextlib.contextmanager
def _every_image_real(model_class):
    """``model_class.get_image_features`` with its padding-image mask made from data (all images real)."""
    import torch

    original = model_class.get_image_features
    real_sum = torch.Tensor.sum

    def get_image_features(self, pixel_values, pixel_attention_mask=None, **kwargs):
        images = pixel_values.shape[0] * pixel_values.shape[1]
        values = pixel_values.shape[2:].numel()

        def counted_zeros(tensor, *args, **kw):  # (pixel_values == 0.0).sum(dim=(-1, -2, -3)) of real images
            if tensor.dtype == torch.bool and tensor.dim() == 4 and tensor.shape[0] == images and kw.get("dim") == (
                    -1, -2, -3):
                return torch.tensor([values - 1] * images)
            return real_sum(tensor, *args, **kw)

        torch.Tensor.sum = counted_zeros
        try:
            return original(self, pixel_values, pixel_attention_mask, **kwargs)
        finally:
            torch.Tensor.sum = real_sum

    model_class.get_image_features = get_image_features
    try:
        yield
    finally:
        model_class.get_image_features = original


def mllama_processor(config: dict, folder: Path, knobs: dict):
    """Llama 3.2 Vision's processor as meta-llama/Llama-3.2-*-Vision-Instruct's processor files set it up:
    MllamaImageProcessor (560 px tiles, up to max_num_tiles of them, the canvas chosen by the image's aspect ratio,
    always padded to max_num_tiles), one <|image|> token per image and the bos token after them; the stand-in
    tokenizer."""
    from transformers import MllamaProcessor
    from transformers.models.mllama.image_processing_pil_mllama import MllamaImageProcessorPil

    if knobs:
        raise ValueError(f"Mllama's processor knobs are not measured here; got {sorted(knobs)}")
    vision = config.get("vision_config") or {}
    side = int(vision.get("image_size", 560))
    markers = dict(MLLAMA_MARKERS.values())
    tokenizer = _stand_in_tokenizer(folder, {**markers, MLLAMA_BOS[0]: MLLAMA_BOS[1]}, bos=MLLAMA_BOS[0])
    image_processor = MllamaImageProcessorPil(size={"height": side, "width": side},
                                              max_image_tiles=int(vision.get("max_num_tiles", 4)))
    return MllamaProcessor(image_processor=image_processor, tokenizer=tokenizer, chat_template=MLLAMA_TEMPLATE)


@contextlib.contextmanager
def llava_image_size_from_shape():
    """LlavaProcessor.replace_image_token reads each image's height and width through numpy, which a fake tensor
    cannot give; the same count from the pixel values' shape (channels first, as the CLIP processor returns them)."""
    from transformers.models.llava import processing_llava

    original = processing_llava.LlavaProcessor.replace_image_token

    def replace_image_token(self, image_inputs: dict, image_idx: int, **kwargs) -> str:
        height, width = image_inputs["pixel_values"][image_idx].shape[-2:]
        tokens = (height // self.patch_size) * (width // self.patch_size) + self.num_additional_image_tokens
        return self.image_token * (tokens - (1 if self.vision_feature_select_strategy == "default" else 0))

    processing_llava.LlavaProcessor.replace_image_token = replace_image_token
    try:
        yield
    finally:
        processing_llava.LlavaProcessor.replace_image_token = original


@contextlib.contextmanager
def value_free_truncated_normal():
    """SigLIP's weight init (Gemma 3's tower) draws truncated normals, whose resampling loop reads the values
    (``mask.any()``), which a fake tensor has not; under fake tensors it draws a plain normal in place instead (the
    same allocation: none). Weight values do not change memory."""
    from transformers import initialization

    original = initialization.TORCH_INIT_FUNCTIONS["trunc_normal_"]

    def normal_in_place(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
        return tensor.normal_(mean, std, generator=generator)

    initialization.TORCH_INIT_FUNCTIONS["trunc_normal_"] = normal_in_place
    try:
        yield
    finally:
        initialization.TORCH_INIT_FUNCTIONS["trunc_normal_"] = original


class Family(NamedTuple):
    """What the harness needs of one vision-language family: its stand-in markers (config key -> (text, id)), the
    config key of the image placeholder, its processor, and the data-only functions run on real values (a context
    manager)."""

    markers: dict
    image_token_key: str
    processor: Any
    values: Any


def _family(config: dict) -> Family:
    model_type = config.get("model_type")
    if model_type == "qwen2_5_vl":
        return Family(QWEN_MARKERS, "image_token_id", qwen_processor, qwen_vision_metadata_from_values)
    if model_type == "qwen3_vl":
        return Family(QWEN_MARKERS, "image_token_id", qwen_processor, qwen3_metadata_from_values)
    if model_type == "qwen3_vl_moe":
        return Family(QWEN_MARKERS, "image_token_id", qwen_processor, qwen3_moe_metadata_from_values)
    if model_type == "qwen2_vl":
        return Family(QWEN_MARKERS, "image_token_id", qwen_processor, qwen2_vl_metadata_from_values)
    if model_type == "llava":
        return Family(LLAVA_MARKERS, "image_token_index", llava_processor, llava_image_size_from_shape)
    if model_type == "gemma3":
        return Family(GEMMA3_MARKERS, "image_token_index", gemma3_processor, contextlib.nullcontext)
    if model_type == "mllama":
        return Family(MLLAMA_MARKERS, "image_token_index", mllama_processor, contextlib.nullcontext)
    if model_type == "idefics3":
        return Family(IDEFICS3_MARKERS, "image_token_id", idefics3_processor, idefics3_every_image_real)
    if model_type == "smolvlm":  # SmolVLMProcessor needs torchvision for its video processor: Idefics3's, for images
        return Family(IDEFICS3_MARKERS, "image_token_id", idefics3_processor, smolvlm_every_image_real)
    if model_type == "llava_next":
        return Family(LLAVA_MARKERS, "image_token_index", llava_next_processor, contextlib.nullcontext)
    raise ValueError(f"model_type {model_type!r}: the harness runs qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_vl_moe, "
                     "llava, llava_next, gemma3, mllama, idefics3 and smolvlm")


def with_stand_in_markers(config: dict) -> dict:
    """The config with its marker ids moved to the stand-in tokenizer's (ids only: no size changes)."""
    out = json.loads(json.dumps(config))
    for key, (_text, token_id) in _family(config).markers.items():
        if key in out:
            out[key] = token_id
    return out


def image_rows(count: int, size: tuple[int, int], per_sample: int, seq_len: int) -> list[dict]:
    """Conversational rows, each with ``per_sample`` images of ``size`` (width, height) and ``seq_len`` text tokens."""
    from PIL import Image

    rows = []
    for i in range(count):
        images = [Image.new("RGB", size, color=((37 * i + 11 * k) % 256, 90, 160)) for k in range(per_sample)]
        content = [{"type": "image"} for _ in images] + [{"type": "text", "text": " ".join(["w"] * seq_len)}]
        rows.append({"images": images, "messages": [{"role": "user", "content": content}]})
    return rows


def _from_values(fn):
    """``fn`` (a data-only function of integer tensors: an image grid to window indices) run on real tensors: its
    tensor arguments are read (their fake values are the data's, :data:`DATA_CONSTANT_LIMIT`), ``fn`` runs outside
    the fake mode and the counter, and its tensor results are made again under them from their values (small integer
    tensors, counted as the model makes them). transformers computes these on the GPU from the same values; a fake
    tensor cannot index by a mask it has no values for."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    def remake(value):
        if isinstance(value, torch.Tensor):
            return torch.tensor(value.tolist(), dtype=value.dtype)
        if isinstance(value, tuple):
            return tuple(remake(v) for v in value)
        return value

    def read(value):
        return ("tensor", value.tolist(), value.dtype) if isinstance(value, torch.Tensor) else ("value", value)

    def real(read_value):
        return torch.tensor(read_value[1], dtype=read_value[2]) if read_value[0] == "tensor" else read_value[1]

    def run(*args, **kwargs):
        arg_values = [read(a) for a in args]
        kwarg_values = {k: read(v) for k, v in kwargs.items()}
        with _disable_current_modes():  # the fake mode and the counter (whose scalar stub would answer 1)
            out = fn(*map(real, arg_values), **{k: real(v) for k, v in kwarg_values.items()})
        return remake(out)

    return run


@contextlib.contextmanager
def _computed_from_values(*functions: tuple[Any, str]):
    """Each (owner, name) function run on the data's values (:func:`_from_values`) while the context lasts."""
    originals = [(owner, name, getattr(owner, name)) for owner, name in functions]
    for owner, name, function in originals:
        setattr(owner, name, _from_values(function))
    try:
        yield
    finally:
        for owner, name, function in originals:
            setattr(owner, name, function)


def qwen_vision_metadata_from_values():
    """Qwen2.5-VL's vision-tower window indices and its language model's M-RoPE positions computed from the data's
    values (:func:`_from_values`)."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen

    return _computed_from_values((qwen, "get_vision_window_index"), (qwen.Qwen2_5_VLModel, "get_rope_index"))


def qwen2_vl_metadata_from_values():
    """Qwen2-VL's language-model M-RoPE positions computed from the data's values (:func:`_from_values`); its tower
    attends over whole images (no windows), whose lengths transformers' vision_utils reads from the image grid, which
    keeps its values."""
    from transformers.models.qwen2_vl import modeling_qwen2_vl as qwen2

    return _computed_from_values((qwen2.Qwen2VLModel, "get_rope_index"))


def qwen3_metadata_from_values():
    """Qwen3-VL's language-model M-RoPE positions computed from the data's values (:func:`_from_values`)."""
    from transformers.models.qwen3_vl import modeling_qwen3_vl as qwen3

    return _computed_from_values((qwen3.Qwen3VLModel, "get_rope_index"))


def qwen3_moe_metadata_from_values():
    """Qwen3-VL-MoE's M-RoPE positions computed from the data's values, as Qwen3-VL's (its own Qwen3VLMoeModel)."""
    from transformers.models.qwen3_vl_moe import modeling_qwen3_vl_moe as qwen3_moe

    return _computed_from_values((qwen3_moe.Qwen3VLMoeModel, "get_rope_index"))


def lora_targets(vision_tower: str, plan, config: dict) -> Any:
    """PEFT target_modules for ``plan`` with ``vision_tower``: recipes/vision_setup.py's regex (the runtime's)."""
    from canifinetune.recipes.vision_setup import lora_target_regex

    return lora_target_regex(plan.model_copy(update={"vision_tower": vision_tower}), config)


def build_vlm(plan, config: dict, vision_tower: str):
    """The model as the training runtime builds it (recipes/vision_setup.py ``build_vlm``), from ``config`` with
    random weights, the vision tower as ``vision_tower`` says."""
    from canifinetune.recipes.vision_setup import build_vlm as build

    return build(plan.model_copy(update={"vision_tower": vision_tower}), config)


def run_vlm_steps(plan, config: dict, images: dict, *, steps: int = 2, fake: bool = True,
                  route_sdpa: bool = True) -> dict:
    """``steps`` SFT steps of ``plan`` on ``config`` with ``images`` ({"size": [w, h], "per_sample": k,
    "vision_tower": frozen|lora|full, "processor": {knobs}}), counting live memory: under fake tensors, or
    (``fake`` False: tiny models only) with real CPU tensors and none of the fake path's emulation, which a test
    compares it with; ``route_sdpa`` False keeps SDPA's CPU kernels, which real tensors need)."""
    import torch._subclasses.fake_tensor as fake_tensor
    from datasets import Dataset
    from torch._subclasses.fake_tensor import FakeTensorMode
    from trl import SFTConfig, SFTTrainer

    from canifinetune.recipes import model_setup, runtime

    fm = _beside("fake_mode")
    sft = _beside("sft_trainer_fake")
    counter = sft.scalar_read_counter_class(fm)()
    vision_tower = images.get("vision_tower", "frozen")
    if vision_tower not in VISION_TOWER_MODES:
        raise ValueError(f"vision_tower: one of {', '.join(VISION_TOWER_MODES)}; got {vision_tower!r}")
    size = tuple(images["size"])
    per_sample = int(images.get("per_sample", 1))
    family = _family(config)
    config = with_stand_in_markers(config)
    folder = Path(tempfile.mkdtemp(prefix="canifinetune-vlm-fake-"))
    processor = family.processor(config, folder / "processor", images.get("processor") or {})
    image_token = family.markers[family.image_token_key][1]
    micro_steps = sft.accumulated_micro_steps(plan)
    rows = image_rows(plan.batch_size * steps * micro_steps, size, per_sample, plan.seq_len)
    dataset = Dataset.from_list(rows[:1])  # the trainer only reads its columns; batches come from ``rows``
    model = optimizer = None
    timeline: list[dict] = []
    state: dict[str, Any] = {}
    sequence: dict[str, int] = {}

    counter.category_tensors = sft.category_tensors_of(fm, lambda: (model, optimizer))
    limit = fake_tensor.CONSTANT_NUMEL_LIMIT
    if fake:
        fake_tensor.CONSTANT_NUMEL_LIMIT = DATA_CONSTANT_LIMIT
    peft_ctx = fm._beside("peft_fake").fake_peft_support(fake)
    fake_mode = FakeTensorMode(allow_fallback_kernels=False) if fake else contextlib.nullcontext()
    apply_ctx = fm.classic_module_apply() if fake else contextlib.nullcontext()
    values_ctx = family.values() if fake else contextlib.nullcontext()
    try:
        with fm.gpu_routing(route_sdpa) as routed, apply_ctx, values_ctx, peft_ctx as build_ctx, fake_mode, counter:
            counter.set_phase("build")
            with build_ctx(), (value_free_truncated_normal() if fake else contextlib.nullcontext()):
                model = build_vlm(plan, config, vision_tower)
            kwargs = runtime.sft_config_kwargs(plan, output_dir=str(folder / "out"), use_cpu=True, max_steps=steps)
            kwargs["max_length"] = None  # TRL's VLM guidance: image tokens are never truncated away
            trainer = SFTTrainer(model=model, args=SFTConfig(**kwargs), train_dataset=dataset,
                                 processing_class=processor)
            optimizer = model_setup.build_optimizer(plan, trainer.model)
            trainer.optimizer = optimizer
            resolved = model_setup.resolved_settings(plan, trainer.model, optimizer)
            sft._without_all_ones_mask(trainer.model)
            wrapped, _ = trainer.accelerator.prepare(trainer.model, optimizer)
            model = trainer.model
            trainable = [p for p in model.parameters() if p.requires_grad]
            step_now = sft.backward_phases_after_build(trainer, counter, state)
            trainer.current_gradient_accumulation_steps = micro_steps  # as Trainer's loop sets it per step
            row = 0
            for step in range(1, steps + 1):
                step_now["n"] = step
                start = counter.current
                for _ in range(micro_steps):
                    batch = trainer.data_collator([dict(r) for r in rows[row:row + plan.batch_size]])
                    row += plan.batch_size
                    sequence = {"tokens": int(batch["input_ids"].shape[1]),
                                "image_tokens": int((batch["input_ids"] == image_token)
                                                    .sum().item()) // plan.batch_size,
                                "pixel_rows": int(batch["pixel_values"].shape[0])}
                    scored = plan.batch_size * (sequence["tokens"] - 1)
                    sft.training_step_in_phase(counter, trainer, wrapped, batch, scored, step, fake)
                    del batch
                fm.optimizer_phase(counter, optimizer, trainable, step, steps, state)
                timeline.append({"step": step, "start": start, "end": counter.current})
            counter.set_phase("done")
    finally:
        fake_tensor.CONSTANT_NUMEL_LIMIT = limit
    report = fm.measurement_report(counter, state, timeline, routed, resolved)
    return {**report, "sequence": sequence, "images": {**images, "vision_tower": vision_tower}, "fake": fake,
            "driver": "trainer", "trainer_class": type(trainer).__name__, "scalar_reads": counter.scalar_reads,
            "known_scalar_reads": counter.known_scalar_reads}


def images_of_plan(plan, config: dict | None = None) -> dict:
    """The images a plan describes, for a Qwen-VL model (``config``'s model_type; Qwen when not given) with the
    checkpoint processor's min_pixels/max_pixels where it sets none (estimator/vision_images.py: what
    AutoProcessor.from_pretrained loads); LLaVA's processor has no knobs."""
    from canifinetune.estimator import vision_images

    size = plan.image_width_height
    if size is None:
        raise ValueError("the plan has no image_size: not a vision-language plan")
    knobs = {}
    model_type = "qwen2_5_vl" if config is None else str(config.get("model_type", ""))
    if model_type in vision_images.QWEN_PIXEL_BOUNDS:
        low, high = vision_images.QWEN_PIXEL_BOUNDS[model_type]
        knobs = {"min_pixels": plan.min_pixels or low, "max_pixels": plan.max_pixels or high}
    if model_type in vision_images.IMAGE_SPLITTING_TYPES:
        knobs = {name: getattr(plan, name) for name in ("do_image_splitting", "longest_edge", "max_image_size")
                 if getattr(plan, name) is not None}
    return {"size": list(size), "per_sample": plan.images_per_sample, "vision_tower": plan.vision_tower,
            "processor": knobs}


def measure_vlm(plan, config: dict, images: dict | None = None) -> dict:
    """The fake-tensor measurement of a VLM plan (its images from the plan unless given), with its wall time and
    library versions."""
    from canifinetune.estimator.plan import TrainingPlan

    if not isinstance(plan, TrainingPlan):
        plan = TrainingPlan(**plan)
    t0 = time.perf_counter()
    result = run_vlm_steps(plan, config, images or images_of_plan(plan, config))
    result["wall_seconds"] = round(time.perf_counter() - t0, 2)
    result["versions"] = _beside("fake_mode").library_versions()
    result["plan"] = plan.model_dump(mode="json")
    return result


def _size(text: str) -> tuple[int, int]:
    width, _, height = text.lower().partition("x")
    return int(width), int(height)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", help="a TrainingPlan as JSON (a file), images in its image fields")
    parser.add_argument("--config", help="config.json of the model (a file); default: the published one")
    parser.add_argument("--model", help="a published VLM (estimator/data/vlm_configs.json), with the flags below")
    parser.add_argument("--method", default="lora", choices=("lora", "qlora", "full"))
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--target-modules", default="all-linear")
    parser.add_argument("--image-size", default="1280x720")
    parser.add_argument("--images-per-sample", type=int, default=1)
    parser.add_argument("--vision-tower", choices=VISION_TOWER_MODES, default="frozen")
    parser.add_argument("--min-pixels", type=int)
    parser.add_argument("--max-pixels", type=int)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.plan:
        plan = json.loads(Path(args.plan).read_text())
    elif args.model:
        plan = {"model": args.model, "method": args.method, "seq_len": args.seq_len, "batch_size": args.batch_size,
                "gradient_checkpointing": args.gradient_checkpointing, "gpu_vram_gb": 80,
                "target_modules": None if args.method == "full" else args.target_modules,
                "image_size": args.image_size, "images_per_sample": args.images_per_sample,
                "vision_tower": args.vision_tower, "min_pixels": args.min_pixels, "max_pixels": args.max_pixels}
    else:
        parser.error("give --plan or --model")
    config = json.loads(Path(args.config).read_text()) if args.config else vlm_config(plan["model"])
    result = measure_vlm(plan, config)
    text = json.dumps(result, indent=1, default=str)
    if args.out:
        Path(args.out).write_text(text)
    print(json.dumps({k: result[k] for k in ("peak_allocated_bytes", "peak_phase", "sequence", "wall_seconds")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
