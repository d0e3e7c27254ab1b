"""A vision-language recipe's data: the example dataset it ships, and the user's image rows checked against the plan.

Rows are TRL 1.16's conversational vision format: ``{"images": [path, ...], "messages": [...]}`` where each user
message's ``content`` is a list of parts and each ``{"type": "image"}`` part stands for the next image of ``images``
(paths relative to the dataset file). The example dataset names images ``example:<shape>``: the runtime draws them at
the plan's image size (a few solid shapes), so a recipe runs as made without shipping binary files; they show the
format and are no training data.

Before the model loads, every row is checked against what was estimated: no more images than ``images_per_sample``,
no image that the processor turns into more tokens than the plan's ``image_size`` does, and no row longer than the
sequence the estimate ran (``seq_len`` plus the plan's image tokens), as the processor counts it. PIL is imported
only inside functions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from canifinetune.estimator.errors import DatasetError, SampleTooLongError
from canifinetune.estimator.plan import TrainingPlan

EXAMPLE_IMAGE_PREFIX = "example:"
# name -> (RGB colour, shape): drawn at the plan's image size
EXAMPLE_SHAPES: dict[str, tuple[tuple[int, int, int], str]] = {
    "red circle": ((220, 40, 40), "ellipse"),
    "blue square": ((40, 80, 220), "rectangle"),
    "green triangle": ((40, 170, 60), "triangle"),
    "orange diamond": ((240, 150, 30), "diamond"),
}
EXAMPLE_QUESTION = "What shape is in this picture?"


def example_rows(images_per_sample: int = 1) -> list[dict]:
    """One row per example shape: its image(s) and a question with its answer."""
    rows = []
    names = list(EXAMPLE_SHAPES)
    for i in range(len(names)):
        shown = [names[(i + k) % len(names)] for k in range(images_per_sample)]
        answer = " and ".join(f"a {n}" for n in shown)
        rows.append({"images": [EXAMPLE_IMAGE_PREFIX + n for n in shown], "messages": [
            {"role": "user", "content": [*({"type": "image"} for _ in shown),
                                         {"type": "text", "text": EXAMPLE_QUESTION}]},
            {"role": "assistant", "content": [{"type": "text", "text": answer[0].upper() + answer[1:] + "."}]}]})
    return rows


def example_jsonl(images_per_sample: int = 1) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in example_rows(images_per_sample))


def example_image(name: str, size: tuple[int, int]) -> Any:
    """The example image ``name`` (a key of EXAMPLE_SHAPES) drawn on white at ``size`` (width, height)."""
    from PIL import Image, ImageDraw

    colour, shape = EXAMPLE_SHAPES[name]
    width, height = size
    image = Image.new("RGB", size, (255, 255, 255))
    draw = ImageDraw.Draw(image)
    box = (width // 4, height // 4, 3 * width // 4, 3 * height // 4)
    if shape == "ellipse":
        draw.ellipse(box, fill=colour)
    elif shape == "rectangle":
        draw.rectangle(box, fill=colour)
    elif shape == "triangle":
        draw.polygon([(width // 2, height // 4), (width // 4, 3 * height // 4), (3 * width // 4, 3 * height // 4)],
                     fill=colour)
    else:
        draw.polygon([(width // 2, height // 4), (3 * width // 4, height // 2), (width // 2, 3 * height // 4),
                      (width // 4, height // 2)], fill=colour)
    return image


def _open_image(ref: Any, where: str, path: Path, size: tuple[int, int]) -> Any:
    if not isinstance(ref, str) or not ref:
        raise DatasetError(f"dataset: {where} of {str(path)!r}: each entry of 'images' must be a file path; got "
                           f"{ref!r:.60}")
    if ref.startswith(EXAMPLE_IMAGE_PREFIX):
        name = ref[len(EXAMPLE_IMAGE_PREFIX):]
        if name not in EXAMPLE_SHAPES:
            raise DatasetError(f"dataset: {where} of {str(path)!r}: {ref!r} is not an example image "
                               f"({', '.join(EXAMPLE_IMAGE_PREFIX + n for n in EXAMPLE_SHAPES)})")
        return example_image(name, size)
    from PIL import Image, UnidentifiedImageError

    file = Path(ref) if Path(ref).is_absolute() else path.parent / ref
    try:
        with Image.open(file) as opened:
            return opened.convert("RGB")
    except FileNotFoundError:
        raise DatasetError(f"dataset: {where} of {str(path)!r}: image {ref!r} does not exist (paths are relative to "
                           "the dataset file)") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise DatasetError(f"dataset: {where} of {str(path)!r}: image {ref!r} cannot be read: {exc}") from None


def _image_parts(messages: Any) -> int:
    return sum(1 for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)
               for part in m["content"] if isinstance(part, dict) and part.get("type") == "image")


def image_rows(rows: list, path: Path, plan: TrainingPlan, spec) -> list[dict]:
    """The rows as TRL's vision collator reads them (PIL images, messages), each checked against the plan: its
    images are at most ``images_per_sample``, each no more tokens than an ``image_size`` image, as the processor
    counts them (estimator/vision_images.py)."""
    from canifinetune.estimator.vision_images import resolve_images

    size = plan.image_width_height
    assert size is not None
    planned = resolve_images(plan, spec)
    assert planned is not None
    tokens_of: dict[tuple[int, int], int] = {}  # by size: a dataset repeats a few sizes over many images
    out = []
    for row in rows:
        data, where = row.data, row.where
        images, messages = data.get("images"), data.get("messages")
        if not isinstance(images, list) or not isinstance(messages, list):
            raise DatasetError(f"dataset: {where} of {str(path)!r} needs 'images' (a list of paths) and 'messages' (a "
                               f"list of turns) for a vision-language recipe; it has {sorted(map(str, data))[:8]}")
        if _image_parts(messages) != len(images):
            raise DatasetError(f"dataset: {where} of {str(path)!r} has {len(images)} images but "
                               f"{_image_parts(messages)} {{'type': 'image'}} parts in its messages; give one part "
                               "per image")
        if len(images) > plan.images_per_sample:
            raise SampleTooLongError(f"dataset: {where} of {str(path)!r} has {len(images)} images, more than "
                                     f"images_per_sample {plan.images_per_sample}; raise images_per_sample in the "
                                     "recipe and estimate again")
        opened = [_open_image(ref, where, path, size) for ref in images]
        for ref, image in zip(images, opened, strict=True):
            shape = (image.width, image.height)
            if shape not in tokens_of:
                facts = resolve_images(plan.replace(image_size=f"{shape[0]}x{shape[1]}"), spec)
                assert facts is not None
                tokens_of[shape] = facts.lm_tokens_per_image
            if tokens_of[shape] > planned.lm_tokens_per_image:
                raise SampleTooLongError(
                    f"dataset: {where} of {str(path)!r}: image {ref!r} is {image.width}x{image.height}, "
                    f"{tokens_of[shape]:,} tokens, more than the {planned.lm_tokens_per_image:,} of the "
                    f"estimated image_size {plan.image_size}; estimate again with image_size "
                    f"{image.width}x{image.height}, or lower max_pixels")
        out.append({"images": opened, "messages": messages})
    return out


def check_row_lengths(rows: list[dict], processor, plan: TrainingPlan, sequence: int, where: list[str],
                      path: Path) -> None:
    """Refuse a row the processor makes longer than ``sequence`` (seq_len plus the plan's image tokens): TRL's
    vision collator does not truncate (image tokens would be cut), so it would train longer than estimated."""
    for row, name in zip(rows, where, strict=True):
        text = processor.apply_chat_template(row["messages"], tokenize=False)
        length = len(processor(text=[text], images=row["images"])["input_ids"][0])
        if length > sequence:
            raise SampleTooLongError(
                f"dataset: {name} of {str(path)!r} is {length:,} tokens with its images, longer than the {sequence:,} "
                f"the estimate ran (seq_len {plan.seq_len} plus the images' tokens); shorten its text or raise seq_len "
                "in the recipe and estimate again")
