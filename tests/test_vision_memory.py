"""Vision-language estimates (estimator/vision_memory.py, issue 26): images as plan fields, the image tokens in the
language model's sequence, the tower's weights and what it keeps, and every refusal by name."""

from __future__ import annotations

import pytest

from canifinetune.estimator import vision_memory
from canifinetune.estimator.errors import PlanError
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.model_sources import resolve_model
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.resolved import resolve

VL3B = "Qwen/Qwen2.5-VL-3B-Instruct"


def _plan(**kw) -> TrainingPlan:
    return TrainingPlan(**{"model": VL3B, "method": "lora", "seq_len": 512, "batch_size": 1,
                           "image_size": "1280x720", "gpu_vram_gb": 24, **kw})


def _resolved(**kw):
    plan = _plan(**kw)
    return resolve(plan, resolve_model(plan.model).spec)


def test_the_image_tokens_join_the_sequence():
    """1280x720 under the checkpoint's processor (max_pixels 12845056): smart_resize to 1288 x 728, 92 x 52 patches,
    1,196 merged tokens plus the two markers."""
    r = _resolved()
    assert r.images.patches_per_image == 92 * 52 and r.images.lm_tokens_per_image == 1196 + 2
    assert r.sequence_length == 512 + 1198 and r.tokens == 1710
    est = estimate(_plan())
    assert est.image_tokens_per_sample == 1198
    assert "1,198 tokens each" in est.assumptions[0]


def test_max_pixels_bounds_a_large_image():
    big = _resolved(image_size="3000x2000")
    bounded = _resolved(image_size="3000x2000", max_pixels=1003520)
    assert bounded.images.lm_tokens_per_image < big.images.lm_tokens_per_image
    assert bounded.images.patches_per_image * 14 * 14 <= 1003520
    assert estimate(_plan(image_size="3000x2000", max_pixels=1003520)).peak_allocated_bytes < \
        estimate(_plan(image_size="3000x2000")).peak_allocated_bytes


@pytest.mark.parametrize("change", [{"image_size": "1920x1080"}, {"images_per_sample": 3}, {"batch_size": 2},
                                    {"gradient_checkpointing": False}])
def test_more_pixels_images_or_rows_never_need_less(change):
    assert estimate(_plan(**change)).peak_allocated_bytes > estimate(_plan()).peak_allocated_bytes


def test_the_vision_tower_weights_are_counted_frozen():
    text = estimate(TrainingPlan(model="Qwen/Qwen2.5-3B-Instruct", method="lora", seq_len=512 + 1198, batch_size=1,
                                 gpu_vram_gb=24))
    vlm = estimate(_plan())
    weights = {c.name: c.bytes for c in vlm.breakdown}["weights"]
    assert vlm.params_total == 3_754_622_976 and vlm.params_trainable == text.params_trainable
    assert weights == pytest.approx(2 * 3_754_622_976, rel=1e-6)


def test_the_tower_keeps_its_inputs_only_with_checkpointing():
    """Without checkpointing the frozen tower builds no graph; with it, each block's input, the merger's three
    tensors and the rotary cos/sin (measured: docs/memory_model.md)."""
    assert vision_memory.tower_saved_bytes(_resolved(gradient_checkpointing=False)) == 0
    r = _resolved()
    patches, width, head_dim = 92 * 52, 1280, 80
    expected = (32 + 2) * patches * width * 2 + patches * width * 4 + 2 * patches * head_dim * 4
    assert vision_memory.tower_saved_bytes(r) == pytest.approx(expected, abs=64 * 512)


@pytest.mark.parametrize(("model", "kw", "field"), [
    ("Qwen/Qwen2.5-7B-Instruct", {"image_size": "640x480"}, "image_size"),  # a text model takes no images
    (VL3B, {"image_size": None}, "image_size"),  # a VLM needs them
    (VL3B, {"vision_tower": "full"}, "vision_tower"),  # beside LoRA adapters: modules_to_save, not estimated
    (VL3B, {"vision_tower": "full", "method": "full", "gradient_checkpointing": False}, "vision_tower"),
    (VL3B, {"vision_tower": "lora", "gradient_checkpointing": False}, "vision_tower"),
    (VL3B, {"vision_tower": "lora", "method": "full"}, "vision_tower"),
    (VL3B, {"framework": "axolotl"}, "framework"),
    (VL3B, {"num_gpus": 2, "sharding": "ddp"}, "num_gpus"),
    (VL3B, {"sharding": "zero3", "offload_params": True}, "sharding"),
    (VL3B, {"packing": True}, "packing"),
    (VL3B, {"attn_implementation": "eager"}, "attn_implementation"),
])
def test_what_is_not_measured_is_refused_by_name(model, kw, field):
    with pytest.raises(PlanError) as info:
        estimate(_plan(model=model, **kw))
    assert info.value.field == field


@pytest.mark.parametrize("model", [VL3B, "Qwen/Qwen3-VL-8B-Instruct", "llava-hf/llava-1.5-7b-hf",
                                   "google/gemma-3-4b-it", "HuggingFaceTB/SmolVLM-256M-Instruct",
                                   "llava-hf/llava-v1.6-vicuna-7b-hf", "Qwen/Qwen2-VL-2B-Instruct",
                                   "Qwen/Qwen3-VL-30B-A3B-Thinking"])
def test_a_trained_tower_adds_its_weights_training_state(model):
    """vision_tower full (method full, checkpointing on): every tower and projector parameter trains, so the
    trainable count is the whole model's and the tower adds its AdamW states (2 x 2 bytes a bf16 parameter) and at
    least its gradients (2 bytes) beside the frozen tower's plan."""
    frozen = estimate(_plan(model=model, method="full"))
    trained = estimate(_plan(model=model, method="full", vision_tower="full"))
    assert trained.params_trainable == trained.params_total > frozen.params_trainable
    tower = trained.params_trainable - frozen.params_trainable
    parts = {p.name: p.bytes for p in trained.breakdown}
    before = {p.name: p.bytes for p in frozen.breakdown}
    # the gradients live at the peak moment: at least the tower's own (the moment may move to a later one)
    assert parts["gradients"] - before["gradients"] >= 0.99 * 2 * tower
    assert parts["optimizer_states"] - before["optimizer_states"] == pytest.approx(4 * tower, rel=0.01)
    assert trained.peak_allocated_bytes > frozen.peak_allocated_bytes


def test_the_search_offers_to_freeze_a_trained_tower():
    """A full fine-tuning plan with its tower trained that does not fit is offered the tower frozen, worded as the
    recipes' default, with the tower's gradients and states gone."""
    from canifinetune.estimator.search import suggest

    plan = _plan(model=VL3B, method="full", vision_tower="full", seq_len=512, gpu_vram_gb=34)
    trained, frozen = estimate(plan), estimate(plan.replace(vision_tower="frozen"))
    assert trained.verdict == "tight" and frozen.verdict == "fits"
    pinned = ["method", "optim", "batch_size", "seq_len", "max_pixels", "images_per_sample", "activation_offloading",
              "sharding", "offload_optimizer", "offload_params", "num_gpus", "attn_implementation"]
    result = suggest(plan, keep=pinned)
    freeze = next(s for s in result.suggestions if {c.field for c in s.changes} == {"vision_tower"})
    assert freeze.changes[0].new == "frozen" and "tower keeps its pretrained weights" in freeze.cost.details[0]


def test_a_trained_qwen3_vl_merger_keeps_its_linears_inputs():
    """Qwen3-VL's tower keeps nothing when frozen (no hook reaches it); trained, its blocks keep their inputs and
    each of its four mergers (the main one and three deepstack mergers) keeps, beyond the adapted tower's terms, its
    two linears' inputs (N x W each)."""
    frozen = _resolved(model="Qwen/Qwen3-VL-8B-Instruct", method="full")
    trained = _resolved(model="Qwen/Qwen3-VL-8B-Instruct", method="full", vision_tower="full")
    assert trained.images is not None
    assert vision_memory.tower_saved_bytes(frozen) == 0
    patches, width, depth = trained.images.patches_per_sample, 1152, 27
    unit = patches * width * 2
    expected = depth * unit + 4 * (unit + 2 * unit) + unit + 2 * patches * 72 * 4
    assert vision_memory.tower_saved_bytes(trained) == pytest.approx(expected, abs=64 * 512)


@pytest.mark.parametrize(("given", "stored"), [("1280X720", "1280x720"), (" 1280 x 720 ", "1280x720"),
                                               ("1280\u00d7720", "1280x720"), ("1280*720", "1280x720")])
def test_image_size_is_read_as_people_write_it(given, stored):
    assert TrainingPlan(model=VL3B, image_size=given).image_size == stored


@pytest.mark.parametrize("kw", [{"image_size": "1280"}, {"image_size": "0x720"}, {"image_size": 1280},
                                {"images_per_sample": 2}, {"max_pixels": 1000},
                                {"image_size": "64x64", "min_pixels": 5000, "max_pixels": 4000}])
def test_bad_image_fields_are_errors(kw):
    with pytest.raises(ValueError):
        TrainingPlan(model=VL3B, **kw)


def test_make_recipe_writes_a_vision_language_recipe_with_example_image_rows():
    """Without a dataset, the recipe ships example rows ({images, messages}, one image part per image) whose images the
    runtime draws at the plan's size; its requirements add pillow and torchvision."""
    import json

    from canifinetune.recipes.examples import EXAMPLE_DATA_FILE
    from canifinetune.recipes.render import make_recipe

    recipe = make_recipe(_plan(images_per_sample=2))
    assert recipe.plan.dataset == EXAMPLE_DATA_FILE
    rows = [json.loads(line) for line in recipe.files[EXAMPLE_DATA_FILE].splitlines()]
    assert rows and all(len(r["images"]) == 2 and r["images"][0].startswith("example:") for r in rows)
    assert all(sum(p.get("type") == "image" for p in r["messages"][0]["content"]) == 2 for r in rows)
    assert "pillow" in recipe.requirements_txt and "torchvision" in recipe.requirements_txt


def test_the_cli_states_the_whole_sequence_and_offers_a_recipe_without_the_probe(capsys):
    from canifinetune.server.cli import main as cli_main

    code = cli_main(["estimate", "--model", VL3B, "--gpu", "RTX 4090", "--seq-len", "512", "--batch-size", "1",
                     "--image-size", "1280x720", "--offline"])
    out = capsys.readouterr().out
    assert code == 0
    assert "seq_len 512 + 1,198 image tokens (1 x 1280x720) = 1,710" in out
    assert "canifinetune recipe" in out and "the probe measures text samples only" in out


def test_the_mcp_tool_takes_the_image_fields_in_the_plan():
    from canifinetune.server import mcp_server

    result = mcp_server.estimate_memory_impl(
        {"model": VL3B, "gpu": "RTX 4090", "seq_len": 512, "batch_size": 1, "plan": {"image_size": "1280x720"}},
        offline=True)
    assert not result.is_error
    assert result.structured_content["image_tokens_per_sample"] == 1198


def test_the_search_offers_fewer_image_tokens_and_nothing_refused():
    """A VLM that does not fit: the search may cut its image tokens (max_pixels or fewer images, priced per halving of
    a sample's image tokens) or go to 4 bits (QLoRA, measured by cohort v24) but never offers what the estimate
    refuses for images (8-bit, several GPUs, offload)."""
    from canifinetune.estimator.search import suggest

    plan = TrainingPlan(model="Qwen/Qwen2.5-VL-7B-Instruct", method="lora", seq_len=1024, batch_size=1,
                        image_size="1920x1080", images_per_sample=2, gpu="RTX 4090")
    result = suggest(plan, keep=["batch_size"])
    kinds = {s.cost.kind: s for s in result.suggestions}
    assert "fewer_image_tokens" in kinds
    change = kinds["fewer_image_tokens"]
    # a downscale before dropping images: the practitioner's first move for Qwen-VL (max_pixels)
    assert [c.field for c in change.changes] == ["max_pixels"] and change.estimate.verdict == "fits"
    assert change.cost.quality_penalty > 0 and "tokens each" in " ".join(change.cost.details)
    for s in result.suggestions:
        assert not s.plan.load_in_8bit and s.plan.num_gpus == 1 and s.plan.sharding in ("none", "ddp")
        assert not (s.plan.offload_optimizer or s.plan.offload_params)


def test_the_search_offers_fewer_images_a_sample():
    """Pinned resolution: the search halves the images a sample instead, priced by the image tokens a sample loses."""
    from canifinetune.estimator.search import suggest

    plan = TrainingPlan(model="Qwen/Qwen2.5-VL-7B-Instruct", method="lora", seq_len=1024, batch_size=1,
                        image_size="1280x720", images_per_sample=4, gpu="RTX 4090")
    result = suggest(plan, keep=["batch_size", "max_pixels"])
    fewer = next(s for s in result.suggestions if s.cost.kind == "fewer_image_tokens")
    assert {c.field: c.new for c in fewer.changes} == {"images_per_sample": 2}
    assert fewer.cost.quality_penalty == pytest.approx(3.0) and "4,792 -> 2,396 image tokens" in fewer.cost.details[0]


@pytest.mark.parametrize(("targets", "warned"), [("all-linear", True), (["q_proj", "v_proj"], False),
                                                 (["q_proj", "gate_proj"], True), (None, False)])
def test_target_names_the_tower_shares_are_warned_about(targets, warned):
    """PEFT matches gate_proj/up_proj/down_proj (and all-linear every linear) in the vision tower too: the user's own
    run would train adapters there, which a frozen-tower estimate does not count; the answer says so."""
    est = estimate(_plan(target_modules=targets))
    assert any("vision tower" in w and "PEFT would also put adapters" in w for w in est.warnings) == warned


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_the_image_fields_through_a_real_mcp_client(anyio_backend):
    """The protocol face: the plan object carries the image fields; a VLM without them is a tool error naming
    image_size; make_recipe writes the VLM recipe with its example rows."""
    from mcp import Client

    from canifinetune.server.mcp_server import build_server

    async with Client(build_server(offline=True)) as client:
        est = await client.call_tool("estimate_memory", {"model": VL3B, "gpu": "RTX 4090", "seq_len": 512,
                                                         "batch_size": 1, "plan": {"image_size": "1280x720"}})
        assert not est.is_error and est.structured_content["image_tokens_per_sample"] == 1198
        missing = await client.call_tool("estimate_memory", {"model": VL3B, "gpu": "RTX 4090"})
        assert missing.is_error and "image_size" in missing.content[0].text
        recipe = await client.call_tool("make_recipe", {"model": VL3B, "gpu": "RTX 4090",
                                                        "plan": {"image_size": "1280x720"}})
        assert not recipe.is_error and "example_data.jsonl" in recipe.structured_content["files"]


# ------------------------------------------------------------------------------------------------- LLaVA-1.5 (v22)

LLAVA = "llava-hf/llava-1.5-7b-hf"


@pytest.mark.parametrize("size", ["224x224", "800x600", "3000x2000", "336x1008"])
def test_llava_images_are_576_tokens_whatever_their_size(size):
    """The CLIP processor resizes the shortest edge to 336 and centre-crops: 24 x 24 patches and the CLS position,
    which the "default" strategy drops; no markers."""
    r = _resolved(model=LLAVA, image_size=size, images_per_sample=2)
    images = r.images
    assert (images.lm_tokens_per_image, images.image_tokens_per_image, images.patches_per_image) == (576, 576, 577)
    assert r.images.pixel_values_per_image == 3 * 336 * 336 and r.sequence_length == 512 + 2 * 576
    assert "576 tokens each (576 image tokens; 577 vision positions), LLaVA processor" in r.images.words()


@pytest.mark.parametrize("field", ["min_pixels", "max_pixels"])
def test_llava_refuses_qwens_pixel_knobs_by_name(field):
    with pytest.raises(PlanError) as info:
        estimate(_plan(model=LLAVA, **{field: 200_000}))
    assert info.value.field == field and "336x336" in str(info.value)


def test_llava_projector_trains_in_full_fine_tuning_only():
    """The projector sits outside the tower: it trains with the language model in full fine-tuning (its 20,979,712
    parameters get gradients and optimizer states), and stays frozen under LoRA; the CLIP tower is frozen in both."""
    full = estimate(_plan(model=LLAVA, method="full"))
    text_params = 7_063_427_072 - 303_507_456 - 20_979_712
    assert full.params_total == 7_063_427_072 and full.params_trainable == text_params + 20_979_712
    assert vision_memory.projector_trains(_resolved(model=LLAVA, method="full"))
    assert not vision_memory.projector_trains(_resolved(model=LLAVA))
    assert not vision_memory.projector_trains(_resolved(method="full"))  # Qwen's merger is inside the frozen tower


def test_llava_tower_and_projector_saved_tensors():
    """With checkpointing: each of 24 CLIP layers' input and pre_layrnorm's (577 x 1024), the projector's GELU input
    and output (576 x 4096), per image; without it nothing under LoRA, the projector's tensors in full fine-tuning."""
    per_image_positions, projector = 577 * 1024 * 2, 2 * 576 * 4096 * 2
    r = _resolved(model=LLAVA, images_per_sample=2, batch_size=2)
    assert vision_memory.tower_saved_bytes(r) == pytest.approx(4 * (25 * per_image_positions + projector), rel=1e-3)
    assert vision_memory.tower_saved_bytes(_resolved(model=LLAVA, gradient_checkpointing=False)) == 0
    full = _resolved(model=LLAVA, method="full", gradient_checkpointing=False)
    assert vision_memory.tower_saved_bytes(full) == pytest.approx(per_image_positions + projector, rel=1e-3)


def test_llava_search_has_no_pixel_knob_and_offers_fewer_images():
    from canifinetune.estimator.search import suggest

    plan = TrainingPlan(model=LLAVA, method="lora", seq_len=1024, batch_size=1, image_size="800x600",
                        images_per_sample=8, gpu="RTX 4090", gradient_checkpointing=False)
    result = suggest(plan, keep=["batch_size", "gradient_checkpointing"])
    assert result.suggestions
    for s in result.suggestions:
        assert s.plan.max_pixels is None and s.plan.min_pixels is None
    fewer = [s for s in result.suggestions if s.cost.kind == "fewer_image_tokens"]
    assert fewer and all("images_per_sample" in {c.field for c in s.changes} for s in fewer)


# ------------------------------------------------------------------------------------------------- Qwen3-VL (v23)

QWEN3_VL = "Qwen/Qwen3-VL-8B-Instruct"


def test_qwen3_vl_images_use_its_checkpoints_processor():
    """Patch 16 merged 2 x 2 (32 px a token) within the checkpoint's 65,536..16,777,216 pixels: 1280x720 resizes to
    1280 x 704, 80 x 44 patches, 880 tokens plus the two markers; a 200x150 image is scaled up to at least 65,536."""
    r = _resolved(model=QWEN3_VL)
    assert (r.images.patches_per_image, r.images.lm_tokens_per_image) == (80 * 44, 880 + 2)
    assert "min_pixels 65,536, max_pixels 16,777,216" in r.images.words()
    small = _resolved(model=QWEN3_VL, image_size="200x150")
    assert small.images.patches_per_image * 16 * 16 >= 65_536


def test_qwen3_vl_tower_keeps_nothing_even_with_checkpointing():
    """Qwen3VLVisionModel names no input-embedding layer, so the checkpointing hook never reaches it (measured)."""
    assert vision_memory.tower_saved_bytes(_resolved(model=QWEN3_VL)) == 0
    assert vision_memory.tower_saved_bytes(_resolved(model=QWEN3_VL, gradient_checkpointing=False)) == 0


def test_qwen3_vl_pixel_knob_counts_its_32_pixel_tokens():
    from canifinetune.estimator.search import suggest

    plan = TrainingPlan(model=QWEN3_VL, method="lora", seq_len=1024, batch_size=1, image_size="3000x2000",
                        images_per_sample=4, gpu="RTX 4090")
    result = suggest(plan, keep=["batch_size", "images_per_sample"])
    downscales = [c.new for s in result.suggestions for c in s.changes if c.field == "max_pixels"]
    assert downscales and all(v % (32 * 32) == 0 and v // (32 * 32) in (1280, 768, 512, 256, 128) for v in downscales)


# ------------------------------------------------------------------------------------------------- QLoRA (v24)


@pytest.mark.parametrize("model", [VL3B, QWEN3_VL, LLAVA])
def test_qlora_packs_the_vision_linears_too(model):
    """transformers' bitsandbytes quantizer converts every nn.Linear but the LM head, the tower's and projector's too:
    their weights are packed 4-bit with a quantization state; norms, convolutions and positions stay 16-bit."""
    from canifinetune.estimator.tensor_records import Role

    r = _resolved(model=model, method="qlora")
    records = vision_memory.vision_weight_records(r)
    vision = r.spec.vision
    groups = vision.tower.groups + vision.projector.groups
    linears = sum(lin.weight_params * g.count for g in groups for lin in g.linears)
    packed = [x for x in records if x.role is Role.QUANTIZED_WEIGHT]
    assert sum(x.elements * x.tensors for x in packed) == linears
    assert sum(x.params for x in records) == vision.vision_params  # every parameter once
    assert any(x.role is Role.QUANTIZATION_STATE for x in records)
    sixteen = sum(x.bytes for x in records if x.role is Role.BASE_WEIGHT)
    assert sixteen < 0.1 * 2 * vision.vision_params
    assert estimate(_plan(model=model, method="qlora")).verdict == "fits"


# ------------------------------------------------------------------------------------------ LoRA on the tower (v25)


@pytest.mark.parametrize("model", [VL3B, QWEN3_VL, LLAVA])
def test_tower_lora_adds_adapters_on_every_vision_linear(model):
    """vision_tower lora: lora_A/lora_B on each tower and projector nn.Linear (what all-linear reaches there), trained
    with the language model's adapters; the frozen-tower estimate has none."""
    frozen = estimate(_plan(model=model))
    tower = estimate(_plan(model=model, vision_tower="lora"))
    r = _resolved(model=model, vision_tower="lora")
    vision = r.spec.vision
    groups = vision.tower.groups + vision.projector.groups
    expected = sum(16 * (lin.in_features + lin.out_features) * g.count for g in groups for lin in g.linears)
    assert tower.params_trainable - frozen.params_trainable == expected
    assert tower.peak_allocated_bytes > frozen.peak_allocated_bytes


def test_qwen3_tower_lora_puts_its_tower_in_the_graph():
    """Frozen, Qwen3-VL's tower keeps nothing; with its own adapters each block keeps its input and the four mergers
    their GELU input and their LoRA inputs (dropout output and mask at lora_dropout 0.05)."""
    r = _resolved(model=QWEN3_VL, vision_tower="lora")
    patches, width = 80 * 44, 1152
    unit = patches * width * 2
    expected = 27 * unit + 4 * (unit + 2 * (unit + patches * width)) + unit + 2 * patches * 72 * 4
    assert vision_memory.tower_saved_bytes(r) == pytest.approx(expected, rel=1e-3)
    no_dropout = _resolved(model=QWEN3_VL, vision_tower="lora", lora_dropout=0.0)
    assert vision_memory.tower_saved_bytes(no_dropout) == pytest.approx(expected - 8 * patches * width, rel=1e-3)


def test_the_search_can_freeze_an_adapted_tower_at_a_price():
    """vision_tower lora -> frozen is a costed change (fewer trainable parameters): the knob exists only for an adapted
    tower, and its cost says what is given up."""
    from canifinetune.estimator.costs import cost_of
    from canifinetune.estimator.knobs import build_knobs

    plan = _plan(vision_tower="lora")
    rm = resolve_model(plan.model)
    knob = next(k for k in build_knobs(plan, rm, set()) if k.name == "vision_tower")
    assert knob.levels == [{"vision_tower": "frozen"}] and knob.tier == 1
    assert not any(k.name == "vision_tower" for k in build_knobs(_plan(), rm, set()))
    cost = cost_of(plan, plan.replace(vision_tower="frozen"), rm)
    assert cost.kind == "fewer_trainable" and cost.quality_penalty == pytest.approx(1.0)
    assert any("vision tower frozen" in d for d in cost.details)


# ------------------------------------------------------------------------------------------------- Gemma 3 (v26)

GEMMA3 = "google/gemma-3-4b-it"
GEMMA3_POSITIONS, GEMMA3_WIDTH, GEMMA3_MLP, GEMMA3_DEPTH = 4096, 1152, 4304, 27


@pytest.mark.parametrize("size", ["224x224", "1280x720", "4000x3000", "300x1200"])
def test_gemma3_images_are_260_tokens_whatever_their_size(size):
    """Gemma3ImageProcessor resizes every image to 896 x 896 (pan-and-scan off): 4,096 SigLIP positions pooled 4 x 4
    into 256 soft tokens, with <start_of_image>, <end_of_image> and two "\\n\\n" around them."""
    r = _resolved(model=GEMMA3, image_size=size, images_per_sample=2)
    assert (r.images.patches_per_image, r.images.image_tokens_per_image, r.images.lm_tokens_per_image) == (
        GEMMA3_POSITIONS, 256, 260)
    assert r.sequence_length == 512 + 2 * 260
    assert "no pan-and-scan" in r.images.words()


def test_gemma3_images_put_a_4d_mask_on_every_layer():
    """token_type_ids make the image blocks attend both ways on every layer: the memory-efficient kernel everywhere,
    even below the sliding window (1,024 tokens; a text Gemma 3 below its window, 512 on the 1B, runs flash)."""
    r = _resolved(model=GEMMA3, seq_len=256)
    assert r.sequence_length < 1024 and r.attention_mask and r.attention_kernel == "efficient"
    text = resolve(TrainingPlan(model="google/gemma-3-1b-it", method="lora", seq_len=500, batch_size=1),
                   resolve_model("google/gemma-3-1b-it").spec)
    assert not text.attention_mask and text.attention_kernel == "flash"


def test_gemma3_tower_keeps_its_layers_inputs_with_checkpointing_only():
    """(27 + 2) inputs of 4,096 x 1,152 an image (the layers', post_layernorm's, avg_pool's) and the norm's fp32
    input of 256 x 1,152; nothing without checkpointing under LoRA; a training projector adds its own two tensors."""
    positions = GEMMA3_POSITIONS * GEMMA3_WIDTH * 2
    soft = 256 * GEMMA3_WIDTH
    r = _resolved(model=GEMMA3, images_per_sample=3)
    assert vision_memory.tower_saved_bytes(r) == pytest.approx(3 * (29 * positions + 4 * soft), rel=1e-3)
    assert vision_memory.tower_saved_bytes(_resolved(model=GEMMA3, gradient_checkpointing=False)) == 0
    full = _resolved(model=GEMMA3, method="full", gradient_checkpointing=False)
    assert vision_memory.projector_trains(full)
    assert vision_memory.tower_saved_bytes(full) == pytest.approx(soft * (4 + 2), rel=1e-3)


def test_gemma3_many_images_peak_in_the_towers_backward():
    """With 8 images and few text tokens the tower's backward (every gradient made, its 27 checkpoints and one block
    recomputed at 32,768 positions) is the step's peak; with one image the language model's moments are larger."""
    from canifinetune.estimator import phases

    many = _resolved(model=GEMMA3, seq_len=128, batch_size=2, images_per_sample=4)
    block = vision_memory.tower_block_backward_bytes(many)
    positions = 8 * GEMMA3_POSITIONS
    assert block == pytest.approx(8 * positions * GEMMA3_WIDTH * 2 + 3 * positions * GEMMA3_MLP * 2, rel=1e-3)
    backward = phases.step_peaks(many)[1]
    temporaries = next(item for item in backward.items if item.name == "backward_temporaries")
    assert temporaries.bytes == block and temporaries.explanation == vision_memory.TOWER_BACKWARD_NOTE
    one = _resolved(model=GEMMA3, seq_len=1024)
    one_temporaries = next(item for item in phases.step_peaks(one)[1].items if item.name == "backward_temporaries")
    assert one_temporaries.explanation != vision_memory.TOWER_BACKWARD_NOTE
    assert vision_memory.tower_block_backward_bytes(_resolved(model=GEMMA3, gradient_checkpointing=False)) == 0
    assert vision_memory.tower_block_backward_bytes(_resolved()) == 0  # Qwen2.5-VL: not this moment


def test_gemma3_tied_embeddings_last_gradient_comes_after_the_towers_backward():
    """Full fine-tuning: the embedding is looked up before the tower runs, so its gradient (the tied head's 2 x V x H
    moment) is made after the tower's checkpoints are freed: that moment does not count them."""
    r = _resolved(model=GEMMA3, method="full", seq_len=128, images_per_sample=6)
    assert vision_memory.freed_before_embedding_backward(r) == vision_memory.tower_saved_bytes(r) > 0
    assert vision_memory.freed_before_embedding_backward(_resolved(method="full")) == 0


# ---------------------------------------------------------------------------
# Llama 3.2 Vision (Mllama): cross-attention layers read the tower's states; one <|image|> token an image

MLLAMA = "meta-llama/Llama-3.2-90B-Vision-Instruct"
LLAVA_NEXT = "llava-hf/llava-v1.6-vicuna-7b-hf"
MLLAMA_STATES, MLLAMA_POSITIONS, MLLAMA_HIDDEN = 4 * 1601, 4 * 1608, 8192


@pytest.mark.parametrize("size", ["224x224", "1280x720", "560x1680", "4000x3000"])
def test_mllama_images_are_one_text_token_and_four_tiles_whatever_their_size(size):
    """MllamaImageProcessor pads every image to max_num_tiles tiles: one <|image|> token in the text, 4 x 1,608
    tower positions and 4 x 1,601 states for the cross-attention layers, 4 tiles of fp32 pixels."""
    r = _resolved(model=MLLAMA, image_size=size, images_per_sample=2)
    assert r.images is not None
    assert (r.images.lm_tokens_per_image, r.images.patches_per_image, r.images.cross_attention_tokens_per_image) == (
        1, MLLAMA_POSITIONS, MLLAMA_STATES)
    assert r.sequence_length == 512 + 2
    assert vision_memory.pixel_values_bytes(r) == 2 * 4 * 3 * 560 * 560 * 4


def test_mllama_frozen_tower_keeps_every_activation_only_with_checkpointing():
    """With checkpointing the patch-embedding hook puts the frozen tower in the graph and its 40 layers are not
    checkpointing layers: per layer 6 N x W tensors, the GELU's N x I input and the fp32 logsumexp; once, the N x N
    aspect-ratio bias and the two outer LayerNorms' inputs. About 6.7 GB an image (measured alone: 6,737 MB)."""
    n, w, i, heads = MLLAMA_POSITIONS, 1280, 5120, 16
    expected = 40 * (6 * n * w * 2 + n * i * 2 + 4 * heads * n) + n * n * 2 + 2 * n * w * 2
    with_ckpt = vision_memory._mllama_tower_saved_bytes(_resolved(model=MLLAMA))
    assert with_ckpt == pytest.approx(expected, abs=200 * 512)
    assert with_ckpt == pytest.approx(6_737e6, rel=0.005)
    assert vision_memory._mllama_tower_saved_bytes(_resolved(model=MLLAMA, gradient_checkpointing=False)) == 0
    two = vision_memory._mllama_tower_saved_bytes(_resolved(model=MLLAMA, images_per_sample=2))
    assert two == pytest.approx(2 * with_ckpt, rel=1e-4)


def test_mllama_cross_attention_layers_keep_keys_and_values_over_the_states():
    """Each cross-attention layer keeps k and v expanded to all heads over the S states (2·a·S·H) where a Llama layer
    keeps flash's 2·a·T·kv; the estimate adds that difference (and the norms, bias and adapter inputs) to each of
    the 20 such layers without checkpointing, and grows with the images."""
    one = _resolved(model=MLLAMA, gradient_checkpointing=False)
    two = _resolved(model=MLLAMA, gradient_checkpointing=False, images_per_sample=2)
    extra_one = vision_memory.cross_attention_layer_extra_bytes(one)
    assert extra_one > 2 * 2 * MLLAMA_STATES * MLLAMA_HIDDEN - 2 * 2 * 514 * 1024
    assert vision_memory.cross_attention_layer_extra_bytes(two) > 1.9 * extra_one
    assert vision_memory.cross_attention_layer_extra_bytes(_resolved()) == 0  # Qwen2.5-VL: no such layers
    text_only = estimate(_plan(model=MLLAMA, gradient_checkpointing=False))
    assert text_only.peak_allocated_bytes > 20 * extra_one


def test_mllama_states_gradient_and_bias_are_kept_and_the_tower_output_held_in_forward():
    r = _resolved(model=MLLAMA)
    states = MLLAMA_STATES * MLLAMA_HIDDEN * 2
    bias = 513 * MLLAMA_STATES * 2
    assert vision_memory.cross_attention_kept_bytes(r) == pytest.approx(2 * states + bias, abs=3 * 512)
    no_ckpt = _resolved(model=MLLAMA, gradient_checkpointing=False)
    assert vision_memory.cross_attention_kept_bytes(no_ckpt) == pytest.approx(states + bias, abs=3 * 512)
    assert vision_memory.image_outputs_bytes(r) == pytest.approx(MLLAMA_STATES * 7680 * 2, abs=512)
    assert vision_memory.image_outputs_bytes(_resolved(model=MLLAMA, method="full")) == 0  # the projector keeps it


@pytest.mark.parametrize("model", [GEMMA3, LLAVA_NEXT, "HuggingFaceTB/SmolVLM-256M-Instruct", MLLAMA])
def test_an_adapted_tower_is_estimated_and_the_warning_offers_it(model):
    """Gemma 3, LLaVA-NeXT and SmolVLM (cohort v34) and Llama 3.2 Vision (cohort v38) estimate LoRA on the tower: the
    warning about target names reaching the tower offers vision_tower lora, and that plan needs more than the frozen
    tower's."""
    warnings = estimate(_plan(model=model, target_modules="all-linear")).warnings
    tower = next(w for w in warnings if "PEFT would also put adapters" in w)
    assert "set vision_tower lora" in tower
    frozen = estimate(_plan(model=model, target_modules="all-linear"))
    adapted = estimate(_plan(model=model, target_modules="all-linear", vision_tower="lora"))
    assert adapted.peak_allocated_bytes > frozen.peak_allocated_bytes
    assert adapted.params_trainable > frozen.params_trainable


def test_an_adapted_mllama_tower_keeps_every_adapters_input():
    """Llama 3.2 Vision's tower layers are not checkpointing layers: with vision_tower lora each of its 40 layers'
    six adapted linears keeps what its lora_A reads (a dropped-out bf16 copy and its mask: 3 bytes an element) and
    lora_A's output (2 x r bytes a position), over the image's 4 x 1,608 positions; the projector's adapter the same
    over the 6,404 vision states of 7,680."""
    frozen = _resolved(model=MLLAMA, image_size="1280x720", target_modules="all-linear")
    adapted = _resolved(model=MLLAMA, image_size="1280x720", target_modules="all-linear", vision_tower="lora")
    n, w, i, rank = MLLAMA_POSITIONS, 1280, 5120, 16
    per_layer = 5 * (n * w * 3 + n * rank * 2) + (n * i * 3 + n * rank * 2)
    projector = MLLAMA_STATES * 7680 * 3 + MLLAMA_STATES * rank * 2
    extra = vision_memory.tower_saved_bytes(adapted) - vision_memory.tower_saved_bytes(frozen)
    assert extra == pytest.approx(40 * per_layer + projector, abs=250 * 512)


def test_a_trained_mllama_tower_keeps_its_linears_and_gates_inputs():
    """With vision_tower full the tower's 40 layers (not checkpointing layers) keep, beyond the hooked frozen tower's
    tensors, what their weights' gradients read: both LayerNorms' outputs and the GELU's output (2·W + I a position,
    bf16); the 8 gated global layers keep o_proj's and fc2's outputs for their gates (2·W); the patch convolution its
    bf16 pixel copy (4 tiles x 3 x 560²), and the tile-position gate its N x W embedding. The projector trains in both
    plans. Exploratory runs were -2.4% to -5.9% without these terms."""
    base = dict(model=MLLAMA, method="full", image_size="1280x720")
    frozen = _resolved(**base)
    trained = _resolved(**base, vision_tower="full")
    n, w, i = MLLAMA_POSITIONS, 1280, 5120
    expected = 40 * n * (2 * w + i) * 2 + 8 * 2 * n * w * 2 + 4 * 3 * 560 * 560 * 2 + n * w * 2
    extra = vision_memory.tower_saved_bytes(trained) - vision_memory.tower_saved_bytes(frozen)
    assert extra == pytest.approx(expected, abs=200 * 512)
    fp32 = _resolved(**base, vision_tower="full", dtype="fp32")
    fp32_frozen = _resolved(**base, dtype="fp32")
    fp32_extra = vision_memory.tower_saved_bytes(fp32) - vision_memory.tower_saved_bytes(fp32_frozen)
    assert fp32_extra == pytest.approx(2 * (expected - 4 * 3 * 560 * 560 * 2), abs=200 * 512)  # the collator's pixels
    result = estimate(_plan(**base, vision_tower="full"))
    assert result.params_trainable == result.params_total  # Mllama's cross-attention norms and gates train too
    said = next(a for a in result.assumptions if "vision tower" in a)
    assert said.startswith("vision tower trained") and "40 layers are not checkpointing layers" in said


def test_an_8bit_tower_in_the_graph_keeps_its_linears_inputs():
    """On an 8-bit base bitsandbytes' MatMul8bitLt keeps each linear's input past checkpointing whenever it requires
    grad: in SmolVLM's hooked tower (13 tiles of 1,024 positions at 1280x720) each of the 12 blocks keeps its two
    LayerNorms' outputs, the attention output (3 x N x 768) and the GELU's output (N x 3,072), and the connector its
    pixel-shuffled input (N x 768), bf16; Llama 3.2 Vision's layers keep their attention output already (2·W + I);
    nothing without checkpointing (no graph), and nothing for Qwen3-VL's frozen tower (not hooked) or a 4-bit base."""
    base = dict(model=SMOLVLM, load_in_8bit=True, target_modules="all-linear")
    r = _resolved(**base)
    n = 13 * 1024
    expected = 12 * (3 * n * 768 * 2 + n * 3072 * 2) + n * 768 * 2
    assert vision_memory.tower_int8_kept_bytes(r) == pytest.approx(expected, abs=40 * 512)
    assert vision_memory.tower_int8_kept_bytes(_resolved(**base, gradient_checkpointing=False)) == 0
    assert vision_memory.tower_int8_kept_bytes(_resolved(model=SMOLVLM, method="qlora")) == 0
    assert vision_memory.tower_int8_kept_bytes(_resolved(model=QWEN3_VL, load_in_8bit=True)) == 0
    mllama = _resolved(model=MLLAMA, load_in_8bit=True, target_modules="all-linear")
    m, w, i = MLLAMA_POSITIONS, 1280, 5120
    projector = MLLAMA_STATES * 7680 * 2
    assert vision_memory.tower_int8_kept_bytes(mllama) == pytest.approx(40 * m * (2 * w + i) * 2 + projector,
                                                                       abs=100 * 512)
    # the recomputed block at fc2's backward: the int32 product and the gradient's int8 rows beyond a 16-bit block's
    assert vision_memory._int8_recompute_bytes(r) == pytest.approx(4 * n * 3072 + n * 768, abs=2 * 512)
    assert vision_memory._int8_recompute_bytes(_resolved(model=SMOLVLM, method="qlora")) == 0
    eight = estimate(_plan(**base))
    sixteen = estimate(_plan(model=SMOLVLM, target_modules="all-linear"))
    assert eight.peak_allocated_bytes > sixteen.peak_allocated_bytes  # the kept inputs outweigh the smaller weights


def test_an_uncheckpointed_tower_in_the_graph_keeps_every_blocks_activations():
    """Without checkpointing a LoRA tower keeps, in each of SmolVLM's 12 blocks (13 tiles of 1,024 positions), its
    LayerNorms' inputs, q, k, v and the attention output (6 x N x 768), the fp32 logsumexp (4 x 12 heads x N), the
    GELU's input (N x 3,072), the padded tile mask its attention copies (13 x 1,024²) and each of its six adapters'
    dropped-out bf16 input, bool mask and lora_A output; beside the blocks the post_layernorm input (N x 768) and the
    connector's adapter's kept input. A
    trained tower's linears keep the LayerNorms' and GELU's outputs too, and its patch convolution the bf16 pixels.
    Qwen's towers are refused so (test_each_family_refuses_what_was_not_measured_by_name)."""
    n, w, i, rank = 13 * 1024, 768, 3072, 16
    lora = _resolved(model=SMOLVLM, target_modules="all-linear", vision_tower="lora", gradient_checkpointing=False)
    adapters = 5 * (3 * n * w + 2 * n * rank) + (3 * n * i + 2 * n * rank)
    block = 6 * n * w * 2 + 4 * 12 * n + n * i * 2 + 13 * 1024 * 1024 * 2 + adapters
    shuffled = n * w // 12288  # the connector's adapter over the pixel-shuffled rows of 12,288
    connector_adapter = 3 * shuffled * 12288 + 2 * shuffled * rank
    assert vision_memory.tower_saved_bytes(lora) == pytest.approx(12 * block + n * w * 2 + connector_adapter,
                                                                  abs=200 * 512)
    full = _resolved(model=SMOLVLM, method="full", vision_tower="full", gradient_checkpointing=False)
    trained = 6 * n * w * 2 + 4 * 12 * n + n * i * 2 + 13 * 1024 * 1024 * 2 + (2 * n * w + n * i) * 2
    connector = n * w * 2  # a trained connector keeps its shuffled input
    pixels = 13 * 3 * 512 * 512 * 2
    assert vision_memory.tower_saved_bytes(full) == pytest.approx(12 * trained + 2 * n * w * 2 - n * w * 2
                                                                  + connector + pixels, abs=200 * 512)
    checkpointed = _resolved(model=SMOLVLM, target_modules="all-linear", vision_tower="lora")
    assert vision_memory.tower_saved_bytes(lora) > 5 * vision_memory.tower_saved_bytes(checkpointed)


def test_adapters_reading_the_layers_own_tensors_keep_them():
    """QLoRA's bf16 adapters without dropout read the layer's own tensors (no copy): Llama 3.2 Vision's layers, which
    are not checkpointing layers, then keep both LayerNorms' outputs and the GELU's (2·W + I a position, bf16) that a
    frozen layer frees, and the projector keeps its input (7,680 a vision state); lora_A's outputs stay. Cohort v38's
    l02 was -9.69% without them."""
    base = dict(model=MLLAMA, method="qlora", image_size="1280x720", target_modules="all-linear", lora_dropout=0.0)
    frozen = _resolved(**base)
    adapted = _resolved(**base, vision_tower="lora")
    n, w, i, rank = MLLAMA_POSITIONS, 1280, 5120, 16
    per_layer = n * (2 * w + i) * 2 + 6 * n * rank * 2
    projector = MLLAMA_STATES * 7680 * 2 + MLLAMA_STATES * rank * 2
    extra = vision_memory.tower_saved_bytes(adapted) - vision_memory.tower_saved_bytes(frozen)
    assert extra == pytest.approx(40 * per_layer + projector, abs=250 * 512)


def test_a_recomputed_block_whose_adapters_read_its_tensors_saves_them():
    """SmolVLM QLoRA without dropout: the recomputed tower block's adapters make no copy, so its moment holds the two
    LayerNorms' outputs and the GELU's output (2·W + I) instead of fp32 copies."""
    r = _resolved(model=SMOLVLM, method="qlora", image_size="1280x720", target_modules="all-linear",
                  vision_tower="lora", lora_dropout=0.0)
    n, w, i, rank = 13 * 1024, 768, 3072, 16
    saved = 6 * n * rank * 2 + n * (2 * w + i) * 2
    expected = max(8 * n * w * 2 + 3 * n * i * 2 + saved, 7 * n * w * 2 + 2 * n * i * 2 + saved)
    assert vision_memory.tower_block_backward_bytes(r) == pytest.approx(expected, abs=24 * 512)


def test_an_adapted_siglip_block_is_recomputed_with_its_adapters():
    """SmolVLM with LoRA on its tower: the recomputed tower block's moment holds what its six adapters keep (with
    dropout, a bf16 dropped-out copy and a bool mask of each input, lora_A's r-wide output) and, at fc2 (the widest,
    I = 3,072), the GELU's output, its fp32 copy and that copy's fp32 dropout; 7·W + 2·I of the block beside them.
    Counted in positions of the micro-batch (13 tiles of 1,024 for 1280x720)."""
    r = _resolved(model=SMOLVLM, image_size="1280x720", target_modules="all-linear", vision_tower="lora")
    n, w, i, rank = 13 * 1024, 768, 3072, 16
    saved = 5 * (n * w * 3 + n * rank * 2) + (n * i * 3 + n * rank * 2)
    recompute = n * i * 2 + 2 * n * i * 4
    expected = max(8 * n * w * 2 + 3 * n * i * 2 + saved, 7 * n * w * 2 + 2 * n * i * 2 + saved + recompute)
    assert vision_memory.tower_block_backward_bytes(r) == pytest.approx(expected, abs=24 * 512)
    no_dropout = _resolved(model=SMOLVLM, image_size="1280x720", target_modules="all-linear", vision_tower="lora",
                           lora_dropout=0.0)
    assert vision_memory.tower_block_backward_bytes(no_dropout) < vision_memory.tower_block_backward_bytes(r)


def test_an_adapted_projector_keeps_its_adapters_inputs():
    """LLaVA-NeXT with LoRA on both towers: linear_1 (1,024 in) and linear_2 (4,096 in) of the projector keep what
    their lora_A reads over every crop's 576 rows (a dropped-out bf16 copy and its mask) and lora_A's output."""
    frozen = _resolved(model=LLAVA_NEXT, image_size="1280x720", target_modules="all-linear")
    adapted = _resolved(model=LLAVA_NEXT, image_size="1280x720", target_modules="all-linear", vision_tower="lora")
    assert adapted.images is not None
    rows = adapted.images.projected_per_image
    extra = rows * (1024 * 3 + 16 * 2) + rows * (4096 * 3 + 16 * 2)
    assert vision_memory.tower_saved_bytes(adapted) - vision_memory.tower_saved_bytes(frozen) == pytest.approx(
        extra, abs=4 * 512)


# ---------------------------------------------------------------------------
# LLaVA-NeXT: anyres crops through LLaVA-1.5's tower and projector


@pytest.mark.parametrize(("size", "crops", "tokens"), [("1280x720", 5, 1948), ("336x1008", 4, 2376),
                                                       ("336x336", 3, 1176)])
def test_llava_next_images_run_every_crop_through_the_tower(size, crops, tokens):
    """The base image and the grid's tiles all run the CLIP tower (577 positions each) and the projector (576 rows
    each); the text gets the processor's count (vision_tokens.llava_next_image_tokens)."""
    r = _resolved(model=LLAVA_NEXT, image_size=size)
    assert r.images is not None
    assert (r.images.patches_per_image, r.images.projected_per_image, r.images.image_tokens_per_image) == (
        crops * 577, crops * 576, tokens)
    assert vision_memory.pixel_values_bytes(r) == crops * 3 * 336 * 336 * 4
    layers = 24  # the CLIP tower's, every one built and run (the projector reads layer -2)
    kept = vision_memory.tower_saved_bytes(r)
    assert kept == pytest.approx((layers + 1) * crops * 577 * 1024 * 2 + 2 * crops * 576 * 4096 * 2, abs=8 * 512)


# ---------------------------------------------------------------------------
# Idefics3 / SmolVLM: tiles and a global image through a SigLIP tower, the pixel-shuffle connector

SMOLVLM = "HuggingFaceTB/SmolVLM-256M-Instruct"


@pytest.mark.parametrize(("size", "tiles"), [("1280x720", 13), ("512x512", 17), ("300x900", 9)])
def test_smolvlm_images_are_tiles_and_a_global_image(size, tiles):
    """The longest edge resized to 2,048 px, the sides rounded up to 512 px tiles, plus the global image: each tile
    1,024 tower positions and 64 tokens (4 x 4 patches a token)."""
    r = _resolved(model=SMOLVLM, image_size=size)
    assert r.images is not None
    assert (r.images.patches_per_image, r.images.image_tokens_per_image) == (tiles * 1024, tiles * 64)
    # fp32 pixel values and the int64 pixel_attention_mask of every tile
    assert vision_memory.pixel_values_bytes(r) == pytest.approx(tiles * 512 * 512 * (3 * 4 + 8), abs=2 * 512)


def test_smolvlm_tower_keeps_its_layer_inputs_and_mask_only_with_checkpointing():
    """With checkpointing the hooked frozen tower's 12 checkpointing layers keep their inputs, post_layernorm its
    own, and the tiles' bidirectional mask stays for the recomputation; without it nothing."""
    r = _resolved(model=SMOLVLM, image_size="1280x720")
    n, w = 13 * 1024, 768
    assert vision_memory.tower_saved_bytes(r) == pytest.approx(13 * n * w * 2 + 13 * 1024 * 1024 * 2, abs=16 * 512)
    assert vision_memory.tower_saved_bytes(_resolved(model=SMOLVLM, image_size="1280x720",
                                                     gradient_checkpointing=False)) == 0
    assert vision_memory.tower_block_backward_bytes(r) > 0  # its own backward moment, as Gemma 3's


def test_smolvlm_image_splitting_off_is_the_global_image_alone():
    """do_image_splitting off (Idefics3ImageProcessor's knob, a plan field): one 512 px tile of 64 tokens and its
    three markers an image, 1,024 tower positions; the estimate falls with it."""
    split = _resolved(model=SMOLVLM, image_size="1280x720")
    whole = _resolved(model=SMOLVLM, image_size="1280x720", do_image_splitting=False)
    assert whole.images is not None and split.images is not None
    assert (whole.images.lm_tokens_per_image, whole.images.patches_per_image) == (67, 1024)
    assert split.images.lm_tokens_per_image == 862
    assert estimate(_plan(model=SMOLVLM, do_image_splitting=False)).peak_allocated_bytes < estimate(
        _plan(model=SMOLVLM)).peak_allocated_bytes


@pytest.mark.parametrize(("longest_edge", "tokens", "positions"), [
    (None, 862, 13 * 1024), (2048, 862, 13 * 1024), (1536, 465, 7 * 1024), (1024, 333, 5 * 1024),
    (700, 333, 5 * 1024), (512, 67, 1024), (100, 67, 1024), (4096, 2712, 41 * 1024)])
def test_smolvlm_longest_edge_resizes_before_tiling(longest_edge, tokens, positions):
    """longest_edge (Idefics3ImageProcessor's size={"longest_edge": N}, a plan field) resizes a 1280x720 image before
    it is cut into 512 px tiles: 2048 (the checkpoint's) 3x4 tiles, 1536 2x3, 1024 and 700 2x2, 512 or less the
    global image alone, 4096 5x8; each tile 64 tokens and 1,024 tower positions (tests/test_vision_tokens.py checks the
    counts against the processor). The estimate falls with the tiles."""
    r = _resolved(model=SMOLVLM, image_size="1280x720", longest_edge=longest_edge)
    assert r.images is not None
    assert (r.images.lm_tokens_per_image, r.images.patches_per_image) == (tokens, positions)


def test_tile_markers_past_the_tokenizers_grid_are_warned_about():
    """The checkpoints' tokenizers hold <row_i_col_j> for i, j up to 6; a 1920x1080 image at longest edge 4096 is
    5 x 8 tiles of 512 px: its ten markers in columns 7 and 8 are counted as one token each (as the harness measured
    them) and the estimate warns that the checkpoint's tokenizer may make up to 12 more of each ("<row_1_col_7>",
    13 characters), 240 a sample of two images; a grid within 6 x 6 draws no warning."""
    r = _resolved(model=SMOLVLM, image_size="1920x1080", longest_edge=4096)
    assert r.images is not None and r.images.lm_tokens_per_image == 64 + 3 + 5 * (8 * 66 + 1)
    warned = estimate(_plan(model=SMOLVLM, image_size="1920x1080", longest_edge=4096, images_per_sample=2)).warnings
    assert any("a 5x8 tile grid" in w and "up to 240 tokens more a sample" in w for w in warned)
    assert not any("tile grid" in w for w in estimate(_plan(model=SMOLVLM, image_size="1920x1080")).warnings)


@pytest.mark.parametrize(("tile", "grid", "tokens"), [(512, (3, 4), 64), (448, (3, 5), 49), (256, (5, 8), 16)])
def test_smolvlm_max_image_size_cuts_smaller_tiles(tile, grid, tokens):
    """max_image_size (Idefics3ImageProcessor's tile, a plan field): a 1280x720 image resized to 2048 px is cut into
    tiles of that side, each (tile / 16)² / 16 tokens (the recipe sets image_seq_len to match); with the same longest
    edge a smaller tile makes more tiles, so it is not a memory knob by itself."""
    r = _resolved(model=SMOLVLM, image_size="1280x720", max_image_size=tile)
    assert r.images is not None
    rows, cols = grid
    assert r.images.image_tokens_per_image == (rows * cols + 1) * tokens
    assert r.images.patches_per_image == (rows * cols + 1) * (tile // 16) ** 2


@pytest.mark.parametrize("tile", [100, 576, 600])
def test_a_tile_the_connector_cannot_take_is_refused(tile):
    with pytest.raises(PlanError, match="a multiple of 64 px") as info:
        estimate(_plan(model=SMOLVLM, max_image_size=tile))
    assert info.value.field == "max_image_size"
    with pytest.raises(PlanError, match="Idefics3/SmolVLM processor setting"):
        estimate(_plan(model=GEMMA3, max_image_size=448))


def test_a_lower_longest_edge_lowers_the_smolvlm_estimate():
    peaks = [estimate(_plan(model=SMOLVLM, longest_edge=edge)).peak_allocated_bytes for edge in (2048, 1536, 1024)]
    assert peaks[0] > peaks[1] > peaks[2]
    assert estimate(_plan(model=SMOLVLM)).peak_allocated_bytes == peaks[0]  # the checkpoint's 4 tiles


@pytest.mark.parametrize("model", [VL3B, GEMMA3, MLLAMA, LLAVA_NEXT])
def test_longest_edge_is_refused_where_the_processor_has_no_such_knob(model):
    with pytest.raises(PlanError, match="Idefics3/SmolVLM processor setting") as info:
        estimate(_plan(model=model, longest_edge=1024))
    assert info.value.field == "longest_edge"


@pytest.mark.parametrize(("kw", "words"), [
    ({"longest_edge": 1024}, "longest_edge: describes the training images; give image_size too"),
    ({"longest_edge": 0, "image_size": "640x480"}, "greater than or equal to 1"),
    ({"longest_edge": 4097, "image_size": "640x480"}, "less than or equal to 4096"),
])
def test_longest_edge_is_checked(kw, words):
    with pytest.raises(ValueError, match=words):
        TrainingPlan(model=SMOLVLM, **kw)


@pytest.mark.parametrize("model", [VL3B, GEMMA3, MLLAMA, LLAVA_NEXT])
def test_image_splitting_is_refused_where_the_processor_has_no_such_knob(model):
    with pytest.raises(PlanError, match="Idefics3/SmolVLM processor setting") as info:
        estimate(_plan(model=model, do_image_splitting=False))
    assert info.value.field == "do_image_splitting"


def test_image_splitting_needs_images():
    with pytest.raises(ValueError, match="do_image_splitting: describes the training images; give image_size too"):
        TrainingPlan(model=SMOLVLM, do_image_splitting=False)


def test_the_search_offers_to_stop_splitting_smolvlm_images():
    """A SmolVLM plan that does not fit is offered do_image_splitting off as fewer image tokens, priced by the tokens
    an image loses; a plan with splitting already off is not offered it."""
    from canifinetune.estimator.search import suggest

    plan = _plan(model=SMOLVLM, seq_len=1024, batch_size=4, images_per_sample=2, gpu_vram_gb=4)
    result = suggest(plan)
    off = next(s for s in result.suggestions if {c.field for c in s.changes} == {"do_image_splitting"})
    assert off.cost.kind == "fewer_image_tokens" and "862 -> 67 tokens each" in off.cost.details[0]
    assert off.estimate.verdict != "does_not_fit"
    unsplit = suggest(plan.replace(do_image_splitting=False, seq_len=8192, batch_size=16))
    assert not any("do_image_splitting" in {c.field for c in s.changes} for s in unsplit.suggestions)


def test_the_search_offers_fewer_tiles_before_the_global_image_alone():
    """The search's image-tile knob lowers longest_edge a tile at a time (1536, 1024) before turning splitting off:
    on a GPU where 1024 px fits, that is what it offers, priced by the tokens an image loses; a plan that pins
    longest_edge is offered splitting off only."""
    from canifinetune.estimator.search import suggest

    plan = _plan(model=SMOLVLM, seq_len=1024, batch_size=4, images_per_sample=2, gpu_vram_gb=5)
    result = suggest(plan)
    fewer = next(s for s in result.suggestions if {c.field for c in s.changes} == {"longest_edge"})
    assert [c.new for c in fewer.changes] == [1024]
    assert fewer.cost.kind == "fewer_image_tokens" and "862 -> 333 tokens each" in fewer.cost.details[0]
    assert "longest edge resized to 1,024 px" in fewer.cost.details[0]
    assert fewer.estimate.verdict == "fits"
    pinned = suggest(plan.replace(gpu_vram_gb=4), keep=["longest_edge"])
    fields = [{c.field for c in s.changes} for s in pinned.suggestions]
    assert {"do_image_splitting"} in fields and not any("longest_edge" in f for f in fields)


@pytest.mark.parametrize(("model", "kw", "field", "words"), [
    (GEMMA3, {"max_pixels": 1003520}, "max_pixels", "Qwen-VL processor setting"),
    ("Qwen/Qwen3-VL-8B-Instruct", {"vision_tower": "lora", "gradient_checkpointing": False}, "vision_tower",
     "'lora' without gradient checkpointing is not estimated yet for qwen3_vl's tower"),
    (MLLAMA, {"vision_tower": "full"}, "vision_tower", "train it with method full"),
    (MLLAMA, {"max_pixels": 1003520}, "max_pixels", "tiles every image"),
    (LLAVA_NEXT, {"max_pixels": 1003520}, "max_pixels", "image_grid_pinpoints"),
    (SMOLVLM, {"max_pixels": 1003520}, "max_pixels", "splits it into"),
])
def test_each_family_refuses_what_was_not_measured_by_name(model, kw, field, words):
    """What a family's processor does not have, or what was not measured on it, is an error naming the field."""
    with pytest.raises(PlanError, match=words) as info:
        estimate(_plan(model=model, **kw))
    assert info.value.field == field


def test_fewer_mllama_images_are_priced_by_the_vision_states_they_drop():
    """Llama 3.2 Vision's images are one text token each; fewer of them a sample is worded by the vision states the
    cross-attention layers no longer read, not by '2 -> 1 image tokens'."""
    from canifinetune.estimator.search import suggest

    result = suggest(_plan(model=MLLAMA, method="qlora", seq_len=2048, images_per_sample=2, gpu_vram_gb=80))
    fewer = next(s for s in result.suggestions if {c.field for c in s.changes} == {"images_per_sample"})
    assert "12,808 -> 6,404 vision states a sample" in fewer.cost.details[0]


def test_qwen2_vl_merger_keeps_its_layernorm_input_in_bf16():
    """Qwen2-VL (Qwen2.5-VL's processor and terms): 1280x720 is the same 4,784 patches and 1,198 tokens; its merger's
    LayerNorm keeps a bf16 input where Qwen2.5-VL's RMSNorm keeps an fp32 copy; the tower's output and the merger's
    are held with the model's output through the forward."""
    r = _resolved(model="Qwen/Qwen2-VL-2B-Instruct")
    assert r.images is not None and (r.images.patches_per_image, r.images.lm_tokens_per_image) == (4784, 1198)
    patches, width, head_dim = 4784, 1280, 80
    expected = (32 + 2) * patches * width * 2 + patches * width * 2 + 2 * patches * head_dim * 4
    assert vision_memory.tower_saved_bytes(r) == pytest.approx(expected, abs=64 * 512)
    assert vision_memory.image_outputs_bytes(r) == pytest.approx((patches * width + 1196 * 1536) * 2, abs=2 * 512)
    assert vision_memory.image_outputs_bytes(_resolved()) == 0  # Qwen2.5-VL: its cohorts ran without it
