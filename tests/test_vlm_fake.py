"""The vision-language measurement (benchmarks/validation/vlm_fake.py, issue 26): TRL's SFTTrainer on a Qwen2.5-VL
model with images its own collator prepares. Under fake tensors the harness keeps the data's integer values (image
grids, token positions) and computes the vision tower's windows and M-RoPE positions from them; these tests run a tiny
model both ways and find the fake count equal to what real CPU tensors hold, and the image tokens the processor's."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")
pytest.importorskip("PIL")

from harness_modules import load_harness as _load
from tiny_vlms import TINY_GEMMA3, TINY_IDEFICS3, TINY_LLAVA, TINY_LLAVA_NEXT, TINY_MLLAMA

from canifinetune.estimator.plan import TrainingPlan

vlm_fake = _load("vlm_fake")

# A Qwen2.5-VL of the published layout at toy sizes: 2 text layers, 4 vision blocks (one of full attention), a window
# of 2x2 merged tokens, so a 112 x 84 image has several windows
TINY_QWEN_VL = {
    "model_type": "qwen2_5_vl",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 4096,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    "tie_word_embeddings": True,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "vision_config": {"depth": 4, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "in_chans": 3,
                      "out_hidden_size": 64, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                      "window_size": 56, "fullatt_block_indexes": [3], "hidden_act": "silu"},
}


def _plan(**kw) -> TrainingPlan:
    return TrainingPlan(**{"model": "tiny-vl", "method": "lora", "seq_len": 32, "batch_size": 2,
                           "gradient_checkpointing": True, **kw})


def _fake_equals_real(config: dict, images: dict, **plan) -> None:
    """The fake count of a tiny model's two steps equals what real CPU tensors hold (within 1%), at the same phase
    and with the same batch."""
    fake = vlm_fake.run_vlm_steps(_plan(**plan), config, images, fake=True, route_sdpa=False)
    real = vlm_fake.run_vlm_steps(_plan(**plan), config, images, fake=False, route_sdpa=False)
    assert real["peak_allocated_bytes"] > 0
    assert fake["peak_allocated_bytes"] == pytest.approx(real["peak_allocated_bytes"], rel=0.01)
    assert fake["peak_phase"] == real["peak_phase"]
    assert fake["sequence"] == real["sequence"]
    assert fake["scalar_reads"] == 0 or fake["scalar_reads"] < fake["known_scalar_reads"]


@pytest.mark.parametrize(("method", "tower", "ckpt"), [
    ("lora", "frozen", True), ("lora", "frozen", False), ("lora", "lora", True), ("full", "frozen", True),
])
def test_fake_tensors_count_what_real_tensors_hold(method, tower, ckpt):
    _fake_equals_real(TINY_QWEN_VL, {"size": [112, 84], "per_sample": 2, "vision_tower": tower}, method=method,
                      gradient_checkpointing=ckpt)


def test_the_batch_holds_the_processors_image_tokens():
    """112 x 84 px: smart_resize keeps 112 x 84 (multiples of 28), 8 x 6 patches, merged 2 x 2: 12 tokens per image,
    two images and their start/end markers beside the 32 text tokens."""
    fake = vlm_fake.run_vlm_steps(_plan(), TINY_QWEN_VL, {"size": [112, 84], "per_sample": 2}, fake=True)
    assert fake["sequence"] == {"tokens": 32 + 2 * (12 + 2), "image_tokens": 24, "pixel_rows": 2 * 2 * 48}


def test_a_bad_vision_tower_mode_is_refused():
    with pytest.raises(ValueError, match="vision_tower"):
        vlm_fake.run_vlm_steps(_plan(), TINY_QWEN_VL, {"size": [112, 84], "vision_tower": "half"}, fake=True)


@pytest.mark.parametrize(("method", "ckpt"), [("lora", True), ("lora", False), ("full", True), ("full", False),
                                             ("qlora", True)])
def test_llava_fake_tensors_count_what_real_tensors_hold(method, ckpt):
    _fake_equals_real(TINY_LLAVA, {"size": [90, 60], "per_sample": 2}, method=method, gradient_checkpointing=ckpt)


def test_the_llava_batch_holds_the_processors_image_tokens():
    """Any image is resized and centre-cropped to 56 x 56: 4 x 4 patches and the CLS position, which the "default"
    strategy drops: 16 image tokens per image, no markers; pixel values one 3 x 56 x 56 crop per image."""
    fake = vlm_fake.run_vlm_steps(_plan(), TINY_LLAVA, {"size": [90, 60], "per_sample": 2}, fake=True)
    assert fake["sequence"] == {"tokens": 32 + 2 * 16, "image_tokens": 32, "pixel_rows": 2 * 2}


# A Qwen3-VL of the published layout at toy sizes: a 2-layer Qwen3 decoder (q/k norms, interleaved M-RoPE), a 4-block
# tower on 16-pixel patches merged 2 x 2 with deepstack mergers after blocks 1 and 2 (feeding the first two decoder
# layers), learned positions resampled from a 4 x 4 grid
TINY_QWEN3_VL = {
    "model_type": "qwen3_vl",
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "tie_word_embeddings": False,
    "text_config": {"model_type": "qwen3_vl_text", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512,
                    "max_position_embeddings": 4096, "rope_theta": 5000000,
                    "rope_scaling": {"rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": True}},
    "vision_config": {"model_type": "qwen3_vl", "depth": 4, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                      "in_channels": 3, "out_hidden_size": 64, "patch_size": 16, "spatial_merge_size": 2,
                      "temporal_patch_size": 2, "num_position_embeddings": 16, "deepstack_visual_indexes": [1, 2],
                      "hidden_act": "gelu_pytorch_tanh"},
}
# the processor's bounds for images this small (the checkpoint's min_pixels, 65,536, would upscale them to 256 x 256)
TINY_QWEN3_PIXELS = {"min_pixels": 32 * 32, "max_pixels": 16777216}


@pytest.mark.parametrize(("method", "ckpt"), [("lora", True), ("lora", False), ("full", True)])
def test_qwen3_vl_fake_tensors_count_what_real_tensors_hold(method, ckpt):
    images = {"size": [128, 96], "per_sample": 2, "processor": TINY_QWEN3_PIXELS}
    _fake_equals_real(TINY_QWEN3_VL, images, method=method, gradient_checkpointing=ckpt)


def test_the_qwen3_vl_batch_holds_the_processors_image_tokens():
    """128 x 96 px at 32 px a token: 8 x 6 patches of 16 px, merged 2 x 2: 12 tokens per image and its two markers;
    pixel rows: 48 patches of an image."""
    images = {"size": [128, 96], "per_sample": 2, "processor": TINY_QWEN3_PIXELS}
    fake = vlm_fake.run_vlm_steps(_plan(), TINY_QWEN3_VL, images, fake=True)
    assert fake["sequence"] == {"tokens": 32 + 2 * (12 + 2), "image_tokens": 24, "pixel_rows": 2 * 2 * 48}


# Qwen3-VL-MoE at toy sizes: TINY_QWEN3_VL's tower and a 2-layer Qwen3-MoE decoder of 4 experts, 2 a token
TINY_QWEN3_VL_MOE = {**TINY_QWEN3_VL, "model_type": "qwen3_vl_moe",
                     "architectures": ["Qwen3VLMoeForConditionalGeneration"],
                     "text_config": {**TINY_QWEN3_VL["text_config"], "model_type": "qwen3_vl_moe_text",
                                     "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                     "decoder_sparse_step": 1, "mlp_only_layers": []},
                     "vision_config": {**TINY_QWEN3_VL["vision_config"], "model_type": "qwen3_vl_moe"}}


@pytest.mark.parametrize(("method", "ckpt"), [("lora", True), ("lora", False), ("full", True)])
def test_qwen3_vl_moe_fake_tensors_count_what_real_tensors_hold(method, ckpt):
    """Qwen3-VL-MoE: the experts run transformers' grouped-mm path (fake_mode.gpu_routing's meta patch for fp32)
    and the M-RoPE positions come from the data's values (vlm_fake.qwen3_moe_metadata_from_values)."""
    images = {"size": [128, 96], "per_sample": 2, "processor": TINY_QWEN3_PIXELS}
    targets = {"target_modules": "all-linear"} if method != "full" else {}  # PEFT has no qwen3_moe default
    _fake_equals_real(TINY_QWEN3_VL_MOE, images, method=method, gradient_checkpointing=ckpt, **targets)
    fake = vlm_fake.run_vlm_steps(_plan(target_modules="all-linear"), TINY_QWEN3_VL_MOE, images, fake=True)
    assert fake["sequence"] == {"tokens": 32 + 2 * (12 + 2), "image_tokens": 24, "pixel_rows": 2 * 2 * 48}


@pytest.mark.parametrize(("method", "ckpt"), [("lora", True), ("lora", False), ("full", True), ("qlora", True)])
def test_gemma3_fake_tensors_count_what_real_tensors_hold(method, ckpt):
    _fake_equals_real(TINY_GEMMA3, {"size": [90, 60], "per_sample": 2}, method=method, gradient_checkpointing=ckpt)


def test_the_gemma3_batch_holds_the_processors_image_tokens():
    """Any image is resized to 56 x 56: 16 patches pooled into 4 soft tokens, framed by <start_of_image>,
    <end_of_image> and two "\\n\\n" tokens; pixel values one 3 x 56 x 56 image per image."""
    fake = vlm_fake.run_vlm_steps(_plan(), TINY_GEMMA3, {"size": [90, 60], "per_sample": 2}, fake=True)
    assert fake["sequence"] == {"tokens": 32 + 2 * (4 + 4), "image_tokens": 8, "pixel_rows": 2 * 2}


def test_a_trl_run_cannot_turn_gemma3_pan_and_scan_on():
    """Why do_pan_and_scan is not a plan field (docs/how-it-works.md): Gemma3Processor's own call defaults
    (images_kwargs do_pan_and_scan False, transformers 5.24) override the image processor's attribute, and TRL 1.16's
    vision collator passes no do_pan_and_scan, so the attribute set True still gives one view of a 600 x 300 image;
    only the call's own argument makes its two crops. If this changes, the field can be measured and added."""
    import tempfile
    from pathlib import Path

    from PIL import Image

    with tempfile.TemporaryDirectory() as folder:
        processor = vlm_fake.gemma3_processor(TINY_GEMMA3, Path(folder), {})
        processor.image_processor.do_pan_and_scan = True
        image = Image.new("RGB", (600, 300))
        as_trl_calls = processor(text=["<start_of_image>"], images=[[image]], return_tensors="np")
        with_the_argument = processor(text=["<start_of_image>"], images=[[image]], return_tensors="np",
                                      do_pan_and_scan=True)
    assert as_trl_calls["pixel_values"].shape[0] == 1
    assert with_the_argument["pixel_values"].shape[0] == 3


@pytest.mark.parametrize(("method", "ckpt"), [("lora", True), ("lora", False), ("full", True), ("qlora", True)])
def test_mllama_fake_tensors_count_what_real_tensors_hold(method, ckpt):
    """Llama 3.2 Vision: the tower runs every tile (padding tiles too) and the cross-attention layer reads the vision
    states through its mask; the fake count equals the real one."""
    _fake_equals_real(TINY_MLLAMA, {"size": [90, 60], "per_sample": 2}, method=method, gradient_checkpointing=ckpt)


def test_the_mllama_batch_holds_the_processors_image_tokens():
    """One <|image|> token per image and the bos token the processor writes after them; the pixel values hold one
    row per sample (samples x images x 4 tiles x 3 x 56 x 56)."""
    fake = vlm_fake.run_vlm_steps(_plan(), TINY_MLLAMA, {"size": [90, 60], "per_sample": 2}, fake=True)
    assert fake["sequence"] == {"tokens": 32 + 2 + 1, "image_tokens": 2, "pixel_rows": 2}


def test_a_misaligned_sdpa_bias_is_copied_as_cuda_pads_it():
    """torch's SDPA composite (attention.cpp preprocess_mask) hands the memory-efficient kernel a bias whose strides
    but the last are multiples of 8 elements, padding any other in its last dimension (a copy the kernel then saves);
    Mllama's 6,404 vision states are such a bias, an aligned one is passed through."""
    import torch

    fm = _load("fake_mode")
    misaligned = torch.zeros(1, 1, 5, 6404, dtype=torch.bfloat16)
    padded = fm.aligned_bias(misaligned)
    assert padded.shape == misaligned.shape and padded.untyped_storage().nbytes() == 5 * 6408 * 2
    assert padded.stride()[-2] % fm.MEM_EFFICIENT_BIAS_ALIGNMENT == 0
    aligned = torch.zeros(1, 1, 5, 6432, dtype=torch.bfloat16)
    assert fm.aligned_bias(aligned) is aligned
    assert fm.aligned_bias(aligned.expand(2, 4, 5, 6432)).stride()[:2] == (0, 0)  # an expanded bias stays a view


@pytest.mark.parametrize(("method", "ckpt"), [("lora", True), ("lora", False), ("full", True), ("qlora", True)])
def test_llava_next_fake_tensors_count_what_real_tensors_hold(method, ckpt):
    """LLaVA-NeXT: every crop through the tower and the projector, the tile features unpadded with image_newline
    between rows; the fake count equals the real one."""
    _fake_equals_real(TINY_LLAVA_NEXT, {"size": [90, 60], "per_sample": 2}, method=method,
                      gradient_checkpointing=ckpt)


def test_the_llava_next_batch_holds_the_processors_image_tokens():
    """The processor's count (vision_tokens.llava_next_image_tokens) is what the batch holds; the pixel values hold
    one row of crops (the base image and its tiles) per image."""
    from canifinetune.estimator.vision_tokens import llava_next_image_tokens

    one = llava_next_image_tokens(90, 60, image_size=56, patch_size=14, image_grid_pinpoints=[[56, 112], [112, 56],
                                                                                             [112, 112]])
    fake = vlm_fake.run_vlm_steps(_plan(), TINY_LLAVA_NEXT, {"size": [90, 60], "per_sample": 2}, fake=True)
    assert fake["sequence"] == {"tokens": 32 + 2 * one.lm_tokens, "image_tokens": 2 * one.image_tokens,
                                "pixel_rows": 2 * 2}  # one row of crops per image


@pytest.mark.parametrize(("method", "ckpt"), [("lora", True), ("lora", False), ("full", True), ("qlora", True)])
def test_idefics3_fake_tensors_count_what_real_tensors_hold(method, ckpt):
    """Idefics3 / SmolVLM: every tile and the global image through the tower, the pixel shuffle; the harness's
    all-real-images mask (idefics3_every_image_real) stands in for the one transformers reads from pixel values, and
    the fake count equals the real one (which runs transformers' own mask)."""
    _fake_equals_real(TINY_IDEFICS3, {"size": [90, 60], "per_sample": 2}, method=method, gradient_checkpointing=ckpt)


def test_the_idefics3_batch_holds_the_processors_image_tokens():
    """The processor's count (vision_tokens.idefics3_image_tokens: tokens, row/column markers and newlines, each a
    token of the stand-in tokenizer as of the checkpoints') is what the batch holds."""
    from canifinetune.estimator.vision_tokens import idefics3_image_tokens

    one = idefics3_image_tokens(90, 60, image_size=56, patch_size=14, scale_factor=2, size=4 * 56, max_image_size=56)
    fake = vlm_fake.run_vlm_steps(_plan(), TINY_IDEFICS3, {"size": [90, 60], "per_sample": 2}, fake=True)
    assert fake["sequence"]["tokens"] == 32 + 2 * one.lm_tokens
    assert fake["sequence"]["image_tokens"] == 2 * one.image_tokens


@pytest.mark.parametrize(("knobs", "tiles"), [({"longest_edge": 112}, (2, 2)), ({"do_image_splitting": False}, (0, 0)),
                                              ({"longest_edge": 112, "do_image_splitting": True}, (2, 2)),
                                              ({"max_image_size": 28}, (6, 8))])
def test_the_idefics3_processor_takes_the_plans_knobs(knobs, tiles):
    """A plan's longest_edge, do_image_splitting and max_image_size reach the harness's processor (images_of_plan,
    then idefics3_processor): a 90x60 image at longest edge 112 is 2x2 tiles of 56 px and the global image, at
    tiles of 28 px (one token each, image_seq_len set to match) 6x8 tiles, as the estimate counts them, and the
    model runs the batch, which holds those tokens."""
    from canifinetune.estimator.vision_tokens import idefics3_image_tokens

    plan = _plan(model="HuggingFaceTB/SmolVLM-256M-Instruct", image_size="90x60", images_per_sample=2, **knobs)
    images = vlm_fake.images_of_plan(plan, TINY_IDEFICS3)
    assert images["processor"] == knobs
    tile = knobs.get("max_image_size", 56)  # image_seq_len follows the tile, as the recipe sets it
    one = idefics3_image_tokens(90, 60, image_size=tile, patch_size=14, scale_factor=2,
                                size=knobs.get("longest_edge", 4 * 56), max_image_size=tile,
                                do_image_splitting=knobs.get("do_image_splitting", True))
    assert one.grid == tiles
    fake = vlm_fake.run_vlm_steps(_plan(), TINY_IDEFICS3, images, fake=True)
    # a marker past the 6 x 6 grid is one token of the stand-in tokenizer, and so the estimate counts it (with a
    # warning that the checkpoint's tokenizer may split it)
    assert fake["sequence"]["tokens"] == 32 + 2 * one.lm_tokens
    assert fake["sequence"]["image_tokens"] == 2 * one.image_tokens


# A Qwen2-VL of the published layout at toy sizes: TINY_QWEN_VL's decoder, a 4-block tower of full attention
# (LayerNorm, a QuickGELU MLP of mlp_ratio x width) merged 2 x 2 into the text width
TINY_QWEN2_VL = {**{k: v for k, v in TINY_QWEN_VL.items() if k != "vision_config"}, "model_type": "qwen2_vl",
                 "vision_config": {"depth": 4, "embed_dim": 32, "mlp_ratio": 2, "num_heads": 2, "in_chans": 3,
                                   "hidden_size": 64, "patch_size": 14, "spatial_merge_size": 2,
                                   "temporal_patch_size": 2}}


@pytest.mark.parametrize(("method", "ckpt"), [("lora", True), ("lora", False), ("full", True), ("qlora", True)])
def test_qwen2_vl_fake_tensors_count_what_real_tensors_hold(method, ckpt):
    """Qwen2-VL: the harness computes its language model's M-RoPE positions from the data's values; the fake count
    equals the real one."""
    _fake_equals_real(TINY_QWEN2_VL, {"size": [112, 84], "per_sample": 2}, method=method, gradient_checkpointing=ckpt)


@pytest.mark.parametrize(("targets", "tower"), [("all-linear", "frozen"), (["q_proj", "v_proj"], "frozen"),
                                                ("all-linear", "lora")])
def test_qwen3_vl_moe_adapters_are_the_estimates(tmp_path, targets, tower):
    """PEFT 0.21 converts no expert target for qwen3_vl_moe (the wrapper's model_type is not in transformers'
    conversion mapping, which its _convert_peft_config_moe reads), so all-linear adapts the attention projections
    and, with vision_tower lora, the tower's linears: the model the recipe builds trains exactly the estimate's
    parameters, and no expert or router weight."""
    import json

    from canifinetune.estimator.estimate import estimate

    (tmp_path / "config.json").write_text(json.dumps(TINY_QWEN3_VL_MOE), encoding="utf-8")
    plan = TrainingPlan(model=str(tmp_path), method="lora", seq_len=32, image_size="128x96", target_modules=targets,
                        vision_tower=tower, dtype="fp32")
    model = vlm_fake.build_vlm(plan, TINY_QWEN3_VL_MOE, tower)
    trainable = {name: p.numel() for name, p in model.named_parameters() if p.requires_grad}
    assert not any(".experts." in name or ".mlp.gate." in name for name in trainable)
    assert sum(trainable.values()) == estimate(plan).params_trainable


# SmolVLM2's class (model_type smolvlm) at TINY_IDEFICS3's sizes
TINY_SMOLVLM = {**TINY_IDEFICS3, "model_type": "smolvlm", "architectures": ["SmolVLMForConditionalGeneration"],
                "vision_config": {**TINY_IDEFICS3["vision_config"], "model_type": "smolvlm_vision"}}


@pytest.mark.parametrize(("method", "ckpt"), [("lora", True), ("lora", False), ("full", True)])
def test_smolvlm_fake_tensors_count_what_real_tensors_hold(method, ckpt):
    """SmolVLMForConditionalGeneration runs Idefics3's processor output (SmolVLMProcessor needs torchvision here):
    the fake count equals the real one, the batch holds the estimate's tokens."""
    from canifinetune.estimator.vision_tokens import idefics3_image_tokens

    images = {"size": [90, 60], "per_sample": 2}
    _fake_equals_real(TINY_SMOLVLM, images, method=method, gradient_checkpointing=ckpt)
    one = idefics3_image_tokens(90, 60, image_size=56, patch_size=14, scale_factor=2, size=4 * 56, max_image_size=56)
    fake = vlm_fake.run_vlm_steps(_plan(), TINY_SMOLVLM, images, fake=True)
    assert fake["sequence"]["tokens"] == 32 + 2 * one.lm_tokens
