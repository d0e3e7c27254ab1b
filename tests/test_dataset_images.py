"""A vision-language dataset's image sizes read from file headers (estimator/dataset_images.py, issue 26), and the
estimate taking image_size and images_per_sample from them when the plan gives a dataset and no image_size."""

from __future__ import annotations

import io
import json

import pytest

from canifinetune.estimator.dataset_images import dataset_images, header_size
from canifinetune.estimator.errors import PlanError
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.plan import TrainingPlan

PIL = pytest.importorskip("PIL.Image")

VL3B = "Qwen/Qwen2.5-VL-3B-Instruct"


@pytest.mark.parametrize("fmt, kw", [("PNG", {}), ("JPEG", {}), ("JPEG", {"progressive": True}), ("GIF", {}),
                                     ("BMP", {}), ("WEBP", {}), ("WEBP", {"lossless": True})])
@pytest.mark.parametrize("size", [(1280, 720), (333, 1001), (1, 7)])
def test_header_sizes_match_what_pillow_wrote(fmt, kw, size):
    buf = io.BytesIO()
    PIL.new("RGB", size, (10, 200, 30)).save(buf, fmt, **kw)
    assert header_size(buf.getvalue()) == size


def test_a_jpeg_size_after_its_exif_block_is_found():
    exif = PIL.Exif()
    exif[0x010E] = "x" * 5000  # ImageDescription: a long APP1 segment before the frame header
    buf = io.BytesIO()
    PIL.new("RGB", (640, 480)).save(buf, "JPEG", exif=exif.tobytes())
    assert header_size(buf.getvalue()) == (640, 480)


def _dataset(tmp_path, rows: list[dict]) -> str:
    PIL.new("RGB", (1920, 1080)).save(tmp_path / "big.jpg")
    PIL.new("RGB", (640, 480)).save(tmp_path / "small.png")
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _row(*images: str) -> dict:
    return {"images": list(images), "messages": [
        {"role": "user", "content": [*({"type": "image"} for _ in images), {"type": "text", "text": "?"}]}]}


def test_the_estimate_takes_the_largest_image_and_the_most_images_a_row(tmp_path):
    data = _dataset(tmp_path, [_row("big.jpg", "small.png"), _row("small.png"), _row("example:red circle")])
    found = dataset_images(data)
    assert set(found.sizes) == {(1920, 1080), (640, 480)} and found.most_per_row == 2 and found.rows == 3
    est = estimate(TrainingPlan(model=VL3B, method="lora", seq_len=512, batch_size=1, gpu_vram_gb=24, dataset=data))
    assert (est.plan.image_size, est.plan.images_per_sample) == ("1920x1080", 2)
    assert any("image_size 1920x1080" in c and "images_per_sample 2" in c for c in est.chosen_defaults)
    given = estimate(TrainingPlan(model=VL3B, method="lora", seq_len=512, batch_size=1, gpu_vram_gb=24, dataset=data,
                                  image_size="1920x1080", images_per_sample=2))
    assert given.peak_allocated_bytes == est.peak_allocated_bytes  # the same run, said two ways


def test_an_explicit_images_per_sample_is_kept_and_a_text_model_ignores_images(tmp_path):
    data = _dataset(tmp_path, [_row("big.jpg", "small.png")])
    est = estimate(TrainingPlan(model=VL3B, method="lora", seq_len=512, batch_size=1, gpu_vram_gb=24, dataset=data,
                                images_per_sample=1))
    assert (est.plan.image_size, est.plan.images_per_sample) == ("1920x1080", 1)
    text = estimate(TrainingPlan(model="Qwen/Qwen2.5-0.5B-Instruct", method="lora", seq_len=512, batch_size=1,
                                 gpu_vram_gb=24, dataset=data))
    assert text.plan.image_size is None


def test_an_unreadable_image_is_an_error_naming_the_row(tmp_path):
    (tmp_path / "notes.txt").write_text("not an image", encoding="utf-8")
    data = _dataset(tmp_path, [_row("small.png"), _row("notes.txt")])
    with pytest.raises(PlanError, match=r"line 2 of .*not a PNG, JPEG, GIF, WebP or BMP") as info:
        estimate(TrainingPlan(model=VL3B, method="lora", seq_len=512, batch_size=1, gpu_vram_gb=24, dataset=data))
    assert info.value.field == "dataset"
    missing = _dataset(tmp_path, [_row("nowhere.png")])
    with pytest.raises(PlanError, match=r"line 1 of .*nowhere\.png.*give image_size instead"):
        estimate(TrainingPlan(model=VL3B, method="lora", seq_len=512, batch_size=1, gpu_vram_gb=24, dataset=missing))
