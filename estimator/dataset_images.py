"""A vision-language dataset's images, measured without decoding them: each image's width and height from its file
header (PNG, JPEG, GIF, WebP, BMP: stdlib only, as the core loads no imaging library), and the most images a row
holds. The estimate takes a VLM plan's ``image_size`` and ``images_per_sample`` from them when the plan gives a
``dataset`` and no image_size (estimator/estimate.py), so the run that counts is the one on the user's images.

Rows are the recipe's format (recipes/vision_data.py): ``{"images": [path, ...], "messages": [...]}``, paths relative
to the dataset file; ``example:`` images (drawn at the plan's size) carry no size of their own and are skipped.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from .bounded_io import open_regular
from .errors import PlanError

if TYPE_CHECKING:
    from .spec import ModelSpec

MAX_DATASET_BYTES = 256 * 2**20  # as estimator/dataset_lengths.py: the first 256 MiB of rows
MAX_ROWS = 200_000
MAX_HEADER_BYTES = 4 * 2**20  # a JPEG's size marker may follow EXIF data and thumbnails (tens to hundreds of KB)
EXAMPLE_PREFIX = "example:"  # recipes/vision_data.py EXAMPLE_IMAGE_PREFIX (the core cannot import recipes)
# JPEG start-of-frame markers (ITU T.81 table B.1): 0xC0-0xCF but DHT (C4), JPG (C8) and DAC (CC)
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


class DatasetImages(NamedTuple):
    """The distinct (width, height) of a dataset's images and the most images one row holds."""

    sizes: tuple[tuple[int, int], ...]
    most_per_row: int
    rows: int


def _head(path: str, limit: int, refuse) -> bytes:
    """The first ``limit`` bytes of a regular file (bounded_io.open_regular refuses anything else)."""
    with open_regular(path, refuse) as (fd, _info):
        chunks: list[bytes] = []
        size = 0
        while size < limit and (chunk := os.read(fd, min(1 << 20, limit - size))):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)


def _be(data: bytes, at: int, n: int) -> int:
    return int.from_bytes(data[at:at + n], "big")


def _le(data: bytes, at: int, n: int) -> int:
    return int.from_bytes(data[at:at + n], "little")


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X" and len(data) >= 30:
        return 1 + _le(data, 24, 3), 1 + _le(data, 27, 3)
    if chunk == b"VP8 " and len(data) >= 30:
        return _le(data, 26, 2) & 0x3FFF, _le(data, 28, 2) & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25:
        b = data[21:25]
        return 1 + (((b[1] & 0x3F) << 8) | b[0]), 1 + (((b[3] & 0x0F) << 10) | (b[2] << 2) | ((b[1] & 0xC0) >> 6))
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0x01, *range(0xD0, 0xDA)):  # markers without a length
            at += 2
            continue
        if marker in _JPEG_SOF and at + 9 <= len(data):
            return _be(data, at + 7, 2), _be(data, at + 5, 2)
        at += 2 + _be(data, at + 2, 2)
    return None


def header_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from an image file's first bytes, or None for a format not read here."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24:
        return _be(data, 16, 4), _be(data, 20, 4)
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return _le(data, 6, 2), _le(data, 8, 2)
    if data.startswith(b"BM") and len(data) >= 26:
        return abs(int.from_bytes(data[18:22], "little", signed=True)), abs(
            int.from_bytes(data[22:26], "little", signed=True))
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return _webp_size(data)
    if data.startswith(b"\xff\xd8"):
        return _jpeg_size(data)
    return None


def image_file_size(file: Path, where: str) -> tuple[int, int]:
    """An image file's (width, height); a PlanError naming ``where`` when it cannot be read or is no such image."""
    def refuse(message: str) -> Exception:
        return PlanError.about("dataset", f"{where}: {message}; give image_size instead")

    try:
        data = _head(str(file), MAX_HEADER_BYTES, refuse)
    except OSError as exc:
        raise PlanError.about("dataset", f"{where}: image {str(file)!r} cannot be read ({exc.strerror or exc}); "
                                         "give image_size instead") from None
    size = header_size(data)
    if size is None or min(size) < 1:
        raise PlanError.about("dataset", f"{where}: {str(file)!r} is not a PNG, JPEG, GIF, WebP or BMP image whose "
                                         "size its header gives; give image_size instead")
    return size


@lru_cache(maxsize=8)
def _read(path: str, size: int, mtime: float) -> DatasetImages | None:
    def refuse(message: str) -> Exception:
        return PlanError.about("dataset", message)

    raw = _head(path, MAX_DATASET_BYTES, refuse)
    folder = Path(path).parent
    sizes: dict[tuple[int, int], None] = {}
    most = rows = 0
    lines = raw.decode("utf-8", errors="replace").splitlines()
    if len(raw) == MAX_DATASET_BYTES:
        lines = lines[:-1]  # the last line may be cut by the bound
    for number, line in enumerate(lines[:MAX_ROWS], start=1):
        try:
            row = json.loads(line) if line.strip() else None
        except ValueError:
            continue
        images = row.get("images") if isinstance(row, dict) else None
        if not isinstance(images, list):
            continue
        rows += 1
        most = max(most, len(images))
        for ref in images:
            if isinstance(ref, str) and ref and not ref.startswith(EXAMPLE_PREFIX):
                file = Path(ref) if Path(ref).is_absolute() else folder / ref
                sizes.setdefault(image_file_size(file, f"line {number} of {path!r}"), None)
    return DatasetImages(tuple(sizes), most, rows) if rows else None


@lru_cache(maxsize=32)  # every plan a search evaluates on one dataset asks again
def largest_image(found: DatasetImages, spec: ModelSpec, model: str, min_pixels: int | None,
                  max_pixels: int | None, do_image_splitting: bool | None = None,
                  longest_edge: int | None = None, max_image_size: int | None = None) -> tuple[int, int, int]:
    """(width, height, tokens) of the image of ``found`` that ``model``'s processor (with these pixel bounds and
    tiling) makes the most tokens of; the larger image on a tie."""
    from .plan import TrainingPlan
    from .vision_images import resolve_images

    def tokens(size: tuple[int, int]) -> int:
        plan = TrainingPlan(model=model, image_size=f"{size[0]}x{size[1]}", min_pixels=min_pixels,
                            max_pixels=max_pixels, do_image_splitting=do_image_splitting, longest_edge=longest_edge,
                            max_image_size=max_image_size)
        images = resolve_images(plan, spec)
        return images.lm_tokens_per_image if images is not None else 0

    counted = {size: tokens(size) for size in found.sizes}
    width, height = max(counted, key=lambda size: (counted[size], size[0] * size[1]))
    return width, height, counted[(width, height)]


def dataset_images(dataset: str) -> DatasetImages | None:
    """The images of a local JSONL ``dataset`` in the recipe's format, or None (not a JSONL file, no image rows)."""
    if not dataset.endswith((".jsonl", ".json")):
        return None
    try:
        st = Path(dataset).stat()
    except OSError:
        return None
    return _read(dataset, st.st_size, st.st_mtime)
