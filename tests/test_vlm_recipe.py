"""The vision-language recipe end to end on CPU (issue 26): `canifinetune recipe` for a tiny LLaVA saved with its
processor, two training steps on the example image rows it ships, and the dataset checks that keep a run to what was
estimated (images per sample, image tokens, row length)."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")
pytest.importorskip("PIL")

from tiny_vlms import TINY_GEMMA3 as HARNESS_TINY_GEMMA3
from tiny_vlms import TINY_IDEFICS3 as HARNESS_TINY_IDEFICS3
from tiny_vlms import TINY_LLAVA as HARNESS_TINY_LLAVA
from tiny_vlms import TINY_LLAVA_NEXT as HARNESS_TINY_LLAVA_NEXT
from tiny_vlms import TINY_MLLAMA as HARNESS_TINY_MLLAMA

from canifinetune.estimator.errors import DatasetError, SampleTooLongError
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.recipes.runtime import prepare
from canifinetune.server.cli import main as cli_main

# test_vlm_fake's tiny LLaVA (2-layer Llama decoder, 3-layer CLIP tower on 56 x 56 crops: 16 tokens an image) with the
# word-level tokenizer's vocabulary and ids
TINY_LLAVA = {**HARNESS_TINY_LLAVA, "image_token_index": 4}
TINY_LLAVA["text_config"] = {**TINY_LLAVA["text_config"], "vocab_size": 64, "max_position_embeddings": 512,
                             "pad_token_id": 0, "eos_token_id": 1}
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{% for p in m['content'] %}{% if p['type'] == 'image' %}"
                 "<image>{% else %}{{ p['text'] }}{% endif %}{% endfor %}</s>{% endfor %}")


# the words of the rows these tests write (_row) and of the shapes, one token each; any other word is <unk>
WORDS = ["what", "shape", "is", "in", "this", "picture", "?", "a", "an", "and", "red", "blue", "green", "orange",
         "circle", "square", "triangle", "diamond", "."]


def _word_tokenizer(specials: list[str], *, named: dict[str, str] | None = None, added: tuple[str, ...] = ()):
    """A word-level tokenizer: <pad>, </s>, <unk>, <s> (ids 0-3), then ``specials`` (special tokens, from id 4), the
    ``added`` plain tokens kept whole, and WORDS; ``named`` sets attributes such as ``boi_token``."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, "<s>": 3}
    for token in (*specials, *added, *WORDS):
        vocab[token] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.add_tokens([AddedToken(text, normalized=False) for text in added])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   bos_token="<s>", additional_special_tokens=list(specials),
                                   # an empty extra_special_tokens would drop the additional special tokens
                                   **({"extra_special_tokens": named} if named else {}))


def _save_tiny(folder: Path, processor, model_class, config: dict) -> Path:
    """The processor and a random model of ``config`` (seeded), saved as a checkpoint folder."""
    import torch
    from transformers import AutoConfig

    folder.mkdir(parents=True, exist_ok=True)
    processor.save_pretrained(folder)
    torch.manual_seed(0)
    model_config = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    model_class(model_config).save_pretrained(folder)
    return folder


def _built(make, tmp_path_factory, name: str) -> Path:
    """A tiny checkpoint folder made by ``make`` (a module fixture's), transformers' warnings about toy sizes muted."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make(tmp_path_factory.mktemp("models") / name)


def _make_tiny_llava(folder: Path) -> Path:
    """A random tiny LLaVA and its processor (CLIP image processor, a word-level tokenizer, the chat template)."""
    from transformers import LlavaForConditionalGeneration, LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56})
    processor = LlavaProcessor(image_processor=image_processor,
                               tokenizer=_word_tokenizer(["<image>", "<|user|>", "<|assistant|>"]), patch_size=14,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                               chat_template=CHAT_TEMPLATE)
    return _save_tiny(folder, processor, LlavaForConditionalGeneration, TINY_LLAVA)


# test_vlm_fake's tiny Gemma 3 (2-layer Gemma3 decoder, 2-layer SigLIP tower on 56 x 56 images: 4 soft tokens an
# image, framed by <start_of_image>, <end_of_image> and two "\n\n") with the word-level tokenizer's ids
TINY_GEMMA3 = {**HARNESS_TINY_GEMMA3, "boi_token_index": 4, "eoi_token_index": 7, "image_token_index": 8}
TINY_GEMMA3["text_config"] = {**TINY_GEMMA3["text_config"], "vocab_size": 64, "max_position_embeddings": 512,
                              "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 3}
GEMMA3_CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{% for p in m['content'] %}"
                        "{% if p['type'] == 'image' %}<start_of_image>{% else %}{{ p['text'] }}{% endif %}{% endfor %}"
                        "</s>{% endfor %}")


def _make_tiny_gemma3(folder: Path) -> Path:
    """A random tiny Gemma 3 and its processor (Gemma 3 image processor at 56 px, a word-level tokenizer that names its
    boi/eoi/image tokens and keeps "\n\n" whole, the chat template)."""
    from transformers import Gemma3ForConditionalGeneration, Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    markers = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    tokenizer = _word_tokenizer(["<start_of_image>", "<|user|>", "<|assistant|>", "<end_of_image>",
                                 "<image_soft_token>"], named=markers, added=("\n\n",))
    processor = Gemma3Processor(image_processor=Gemma3ImageProcessorPil(size={"height": 56, "width": 56}),
                                tokenizer=tokenizer, image_seq_length=4, chat_template=GEMMA3_CHAT_TEMPLATE)
    return _save_tiny(folder, processor, Gemma3ForConditionalGeneration, TINY_GEMMA3)


# test_vlm_fake's tiny LLaVA-NeXT (TINY_LLAVA's model, anyres over 56 px crops) with the word-level tokenizer's ids
TINY_LLAVA_NEXT = {**HARNESS_TINY_LLAVA_NEXT, "image_token_index": 4, "text_config": TINY_LLAVA["text_config"]}


def _make_tiny_llava_next(folder: Path) -> Path:
    """A random tiny LLaVA-NeXT and its processor (LLaVA-NeXT image processor on 56 px crops over the config's grid,
    a word-level tokenizer, the chat template)."""
    from transformers import LlavaNextForConditionalGeneration, LlavaNextProcessor
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    image_processor = LlavaNextImageProcessorPil(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56},
                                                 image_grid_pinpoints=TINY_LLAVA_NEXT["image_grid_pinpoints"])
    processor = LlavaNextProcessor(image_processor=image_processor,
                                   tokenizer=_word_tokenizer(["<image>", "<|user|>", "<|assistant|>"]), patch_size=14,
                                   vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                   chat_template=CHAT_TEMPLATE)
    return _save_tiny(folder, processor, LlavaNextForConditionalGeneration, TINY_LLAVA_NEXT)


@pytest.fixture(scope="module")
def tiny_llava_next(tmp_path_factory) -> Path:
    return _built(_make_tiny_llava_next, tmp_path_factory, "tiny-llava-next")


# test_vlm_fake's tiny Idefics3 (SmolVLM's layout on 56 px tiles) with the word-level tokenizer's ids
TINY_IDEFICS3 = {**HARNESS_TINY_IDEFICS3, "image_token_id": 4}
TINY_IDEFICS3["text_config"] = {**TINY_IDEFICS3["text_config"], "vocab_size": 128, "max_position_embeddings": 2048,
                                "eos_token_id": 1, "bos_token_id": 3}
IDEFICS3_MARKERS = ("<fake_token_around_image>", "<global-img>", "<end_of_utterance>",
                    *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)))


def _make_tiny_idefics3(folder: Path) -> Path:
    """A random tiny Idefics3 and its processor (Idefics3 image processor splitting into 56 px tiles, a word-level
    tokenizer with the processor's markers and newlines as tokens, the chat template)."""
    from transformers import Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tokenizer = _word_tokenizer(["<image>", *IDEFICS3_MARKERS, "<|user|>", "<|assistant|>"], added=("\n", "\n\n"))
    image_processor = Idefics3ImageProcessorPil(size={"longest_edge": 4 * 56}, max_image_size={"longest_edge": 56})
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=4,
                                  chat_template=CHAT_TEMPLATE)
    return _save_tiny(folder, processor, Idefics3ForConditionalGeneration, TINY_IDEFICS3)


@pytest.fixture(scope="module")
def tiny_idefics3(tmp_path_factory) -> Path:
    return _built(_make_tiny_idefics3, tmp_path_factory, "tiny-idefics3")


# test_vlm_fake's tiny Llama 3.2 Vision (3-layer decoder, layer 1 cross-attention; a 3 + 1-layer tower on 56 px
# tiles, up to 4 an image) with the word-level tokenizer's ids
TINY_MLLAMA = {**HARNESS_TINY_MLLAMA, "image_token_index": 4}
TINY_MLLAMA["text_config"] = {**TINY_MLLAMA["text_config"], "vocab_size": 64, "max_position_embeddings": 512,
                              "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 3}
MLLAMA_CHAT_TEMPLATE = CHAT_TEMPLATE.replace("<image>", "<|image|>")


def _make_tiny_mllama(folder: Path) -> Path:
    """A random tiny Llama 3.2 Vision and its processor (Mllama image processor with 56 px tiles, a word-level
    tokenizer with <|image|> and the bos token the processor writes after the images, the chat template)."""
    from transformers import MllamaForConditionalGeneration, MllamaProcessor
    from transformers.models.mllama.image_processing_pil_mllama import MllamaImageProcessorPil

    tokenizer = _word_tokenizer(["<|image|>", "<|user|>", "<|assistant|>"])
    image_processor = MllamaImageProcessorPil(size={"height": 56, "width": 56}, max_image_tiles=4)
    processor = MllamaProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                chat_template=MLLAMA_CHAT_TEMPLATE)
    return _save_tiny(folder, processor, MllamaForConditionalGeneration, TINY_MLLAMA)


@pytest.fixture(scope="module")
def tiny_mllama(tmp_path_factory) -> Path:
    return _built(_make_tiny_mllama, tmp_path_factory, "tiny-mllama")


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory) -> Path:
    return _built(_make_tiny_gemma3, tmp_path_factory, "tiny-gemma3")


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory) -> Path:
    return _built(_make_tiny_llava, tmp_path_factory, "tiny-llava")


def _plan(model: Path, **kw) -> TrainingPlan:
    base = {"model": str(model), "method": "lora", "dtype": "fp32", "seq_len": 24, "batch_size": 2, "max_steps": 2,
            "image_size": "90x60", "target_modules": "all-linear", "learning_rate": 1e-3}
    return TrainingPlan(**{**base, **kw})


def _rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _row(images: list[str], parts: int | None = None) -> dict:
    content = [{"type": "image"} for _ in range(len(images) if parts is None else parts)]
    return {"images": images, "messages": [
        {"role": "user", "content": [*content, {"type": "text", "text": "what shape is in this picture ?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "a red circle ."}]}]}


def _recipe(model: Path, out: Path, method: str = "lora", *flags: str) -> Path:
    """``canifinetune recipe`` for a tiny VLM: two steps of micro-batch 2, 24 text tokens and one 90x60 image a row."""
    targets = ["--target-modules", "all-linear"] if method != "full" else []
    code = cli_main(["recipe", "--model", str(model), "--method", method, *targets, "--dtype", "fp32",
                     "--seq-len", "24", "--batch-size", "2", "--max-steps", "2", "--learning-rate", "1e-3",
                     "--image-size", "90x60", "--images-per-sample", "1", *flags, "--out", str(out), "--offline"])
    assert code == 0
    return out


def _trains_two_steps(out: Path) -> None:
    """The recipe at ``out`` trains its two steps on CPU, on the example rows it ships, with finite losses."""
    from canifinetune.recipes.train import train

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = train(out / "recipe.yaml", device="cpu")
    assert result.steps == 2 and len(result.losses) == 2
    assert all(math.isfinite(x) and x > 0 for x in result.losses)


def test_the_recipe_trains_two_steps_on_its_example_image_rows(tiny_llava, tmp_path):
    out = _recipe(tiny_llava, tmp_path / "recipe")
    assert (out / "example_data.jsonl").exists()
    _trains_two_steps(out)
    assert (out / "outputs" / "adapter_model.safetensors").exists()


@pytest.mark.parametrize("method", ["lora", "full"])
def test_the_gemma3_recipe_trains_two_steps_on_its_example_image_rows(tiny_gemma3, tmp_path, method):
    """Gemma 3's processor returns token_type_ids (the image blocks' bidirectional mask), which TRL's collator passes
    to the model: the recipe trains with them, LoRA on the language model or every language-model weight and the
    projector."""
    _trains_two_steps(_recipe(tiny_gemma3, tmp_path / "recipe", method))


def test_image_rows_are_checked_against_the_plan_before_the_model_loads(tiny_llava, tmp_path):
    image = tmp_path / "one.png"
    from PIL import Image

    Image.new("RGB", (90, 60), (10, 20, 30)).save(image)
    cases = [
        (_row(["one.png", "one.png"]), SampleTooLongError, "2 images, more than images_per_sample 1"),
        (_row(["one.png"], parts=2), DatasetError, "1 images but 2"),
        (_row(["missing.png"]), DatasetError, "does not exist"),
        ({"text": "no images"}, DatasetError, "needs 'images'"),
    ]
    for row, error, words in cases:
        data = _rows(tmp_path / "rows.jsonl", [row])
        with pytest.raises(error, match=words), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prepare(_plan(tiny_llava, dataset=str(data)), output_dir=tmp_path / "o", device="cpu")


def test_a_row_longer_than_the_estimated_sequence_is_refused(tiny_llava, tmp_path):
    """seq_len 4 text tokens plus one 16-token image: the example row is longer than the sequence estimated."""
    with pytest.raises(SampleTooLongError, match="longer than the 20"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = _rows(tmp_path / "rows.jsonl", [_row(["example:red circle"])])
        prepare(_plan(tiny_llava, seq_len=4, dataset=str(data)), output_dir=tmp_path / "o", device="cpu")


@pytest.mark.parametrize("method", ["lora", "full"])
def test_the_mllama_recipe_trains_two_steps_on_its_example_image_rows(tiny_mllama, tmp_path, method):
    """Llama 3.2 Vision's processor returns the tiles' aspect-ratio ids and mask and the cross-attention mask, which
    TRL's collator passes to the model: the recipe trains with them, LoRA on the language model's linears (the
    cross-attention layer's too) or every language-model weight and the projector."""
    _trains_two_steps(_recipe(tiny_mllama, tmp_path / "recipe", method))


def test_mllama_adapters_reach_the_cross_attention_layers_not_the_tower(tmp_path):
    """PEFT's target regex for Llama 3.2 Vision (recipes/vision_setup.py, what the runtime and the harness build):
    the cross-attention layers' linears are language-model linears and get adapters; the frozen tower's do not; the
    trainable count is the estimate's."""
    import re

    from canifinetune.estimator.estimate import estimate
    from canifinetune.recipes.vision_setup import build_vlm, lora_target_regex

    (tmp_path / "config.json").write_text(json.dumps(TINY_MLLAMA), encoding="utf-8")
    plan = TrainingPlan(model=str(tmp_path), method="lora", seq_len=24, image_size="90x60",
                        target_modules="all-linear", dtype="fp32")
    regex = lora_target_regex(plan, TINY_MLLAMA)
    assert re.fullmatch(regex, "model.language_model.layers.1.cross_attn.k_proj")
    assert re.fullmatch(regex, "model.language_model.layers.0.self_attn.q_proj")
    assert re.fullmatch(regex, "model.language_model.layers.2.mlp.down_proj")
    assert not re.fullmatch(regex, "model.vision_model.transformer.layers.0.self_attn.q_proj")
    assert not re.fullmatch(regex, "model.multi_modal_projector")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_vlm(plan, TINY_MLLAMA)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == estimate(plan).params_trainable


def test_the_llava_next_recipe_trains_two_steps_on_its_example_image_rows(tiny_llava_next, tmp_path):
    """LLaVA-NeXT's processor returns image_sizes with the crops' pixel values, which TRL's collator passes to the
    model for unpadding: the recipe trains with them."""
    _trains_two_steps(_recipe(tiny_llava_next, tmp_path / "recipe"))


@pytest.mark.parametrize(("flags", "processor_set"), [
    ([], {}),
    (["--no-do-image-splitting"], {"do_image_splitting": False}),
    (["--longest-edge", "112"], {"size": {"longest_edge": 112}}),
    # a grid within the tokenizer's 6 x 6 markers (the example image at 168 px is 6 x 4 tiles of 28 px): past it
    # the markers are several tokens of this tokenizer, which the recipe's row check refuses (the estimate warns)
    (["--max-image-size", "28", "--longest-edge", "168"], {"max_image_size": {"longest_edge": 28}}),
], ids=["tiles", "global-image-only", "longest-edge-2-tiles", "28-px-tiles"])
def test_the_idefics3_recipe_trains_two_steps_on_its_example_image_rows(tiny_idefics3, tmp_path, flags,
                                                                        processor_set):
    """Idefics3's processor splits each image into tiles and a global image (or, with do_image_splitting off, keeps
    the global image alone; with longest_edge, resizes it to fewer tiles first) and returns their
    pixel_attention_mask, which TRL's collator passes to the model: the recipe trains with them, its processor set as
    the plan says (the rows' lengths are checked against the plan's before the model loads)."""
    out = _recipe(tiny_idefics3, tmp_path / "recipe", "lora", *flags)
    if processor_set:
        from canifinetune.recipes.schema import load_recipe

        recipe = load_recipe(out / "recipe.yaml")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prepared = prepare(recipe.plan, recipe_dir=out, device="cpu", output_dir=tmp_path / "o")
        for name, value in processor_set.items():
            assert getattr(prepared.tokenizer.image_processor, name) == value
        if "max_image_size" in processor_set:  # the tokens a tile's features fill follow the tile
            assert prepared.tokenizer.image_seq_len == (28 // 14) ** 2 // 2**2
    _trains_two_steps(out)


@pytest.mark.parametrize("family", ["tiny_gemma3", "tiny_llava_next", "tiny_idefics3", "tiny_mllama"])
def test_an_adapted_tower_recipe_trains_what_was_estimated(family, tmp_path, request):
    """vision_tower lora on the families that estimate it since cohorts v34 and v38: the recipe's PEFT regex reaches
    every linear of the tower and its projector (recipes/vision_setup.py), the trainable count is the estimate's, and
    the recipe trains two CPU steps with checkpointing on."""
    from canifinetune.estimator.estimate import estimate
    from canifinetune.recipes.schema import load_recipe
    from canifinetune.recipes.vision_setup import build_vlm

    folder = request.getfixturevalue(family)
    out = _recipe(folder, tmp_path / "recipe", "lora", "--vision-tower", "lora")
    plan = load_recipe(out / "recipe.yaml").plan
    assert plan.vision_tower == "lora" and plan.gradient_checkpointing
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_vlm(plan, config)
    adapted = {name.rsplit(".lora_A", 1)[0] for name, _ in model.named_parameters() if ".lora_A." in name}
    tower = {name for name in adapted if ".vision_" in name or "connector" in name or "multi_modal_projector" in name}
    assert tower, "no adapter reached the tower or its projector"
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == estimate(plan).params_trainable
    _trains_two_steps(out)


@pytest.mark.parametrize("family", ["tiny_gemma3", "tiny_llava_next", "tiny_idefics3", "tiny_llava", "tiny_mllama"])
def test_a_trained_tower_recipe_trains_the_whole_model(family, tmp_path, request):
    """vision_tower full with method full: the recipe leaves every parameter trainable (the tower, the projector,
    the language model), the count is the estimate's, and it trains two CPU steps with checkpointing on."""
    from canifinetune.estimator.estimate import estimate
    from canifinetune.recipes.schema import load_recipe
    from canifinetune.recipes.vision_setup import build_vlm

    folder = request.getfixturevalue(family)
    out = _recipe(folder, tmp_path / "recipe", "full", "--vision-tower", "full")
    plan = load_recipe(out / "recipe.yaml").plan
    assert plan.vision_tower == "full" and plan.method == "full" and plan.gradient_checkpointing
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_vlm(plan, config)
    assert all(p.requires_grad for p in model.parameters())
    result = estimate(plan)
    assert sum(p.numel() for p in model.parameters()) == result.params_trainable == result.params_total
    _trains_two_steps(out)


def test_a_tile_grid_past_the_tokenizers_markers_is_stopped_before_training(tiny_idefics3, tmp_path):
    """At 28 px tiles the example image is 6 x 8 tiles: the markers past <row_6_col_6> are several tokens of this
    tokenizer, more than the estimate counts (one each, with a warning), so the recipe's row check refuses the rows
    before the model loads instead of training past the estimate."""
    from canifinetune.recipes.schema import load_recipe

    out = _recipe(tiny_idefics3, tmp_path / "recipe", "lora", "--max-image-size", "28")
    recipe = load_recipe(out / "recipe.yaml")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(SampleTooLongError, match="tokens with its images, longer than"):
            prepare(recipe.plan, recipe_dir=out, device="cpu", output_dir=tmp_path / "o")


@pytest.mark.parametrize("family", ["tiny_idefics3", "tiny_llava"])
def test_an_8bit_recipe_quantizes_the_tower_as_estimated_and_trains(family, tmp_path, request):
    """load_in_8bit (cohort v42): the recipe's model has every linear but the LM head in 8 bits, the tower's and the
    projector's too (what the estimate's tower terms assume), its trainable count is the estimate's, and it trains
    two CPU steps."""
    import bitsandbytes as bnb

    from canifinetune.estimator.estimate import estimate
    from canifinetune.recipes.schema import load_recipe
    from canifinetune.recipes.vision_setup import build_vlm

    folder = request.getfixturevalue(family)
    out = _recipe(folder, tmp_path / "recipe", "lora", "--load-in-8bit")
    plan = load_recipe(out / "recipe.yaml").plan
    assert plan.load_in_8bit and plan.gradient_checkpointing
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_vlm(plan, config)
    eight_bit = [name for name, module in model.named_modules() if isinstance(module, bnb.nn.Linear8bitLt)]
    assert any("vision" in name for name in eight_bit), "the tower's linears stayed in 16 bits"
    assert any("connector" in name or "multi_modal_projector" in name for name in eight_bit)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == estimate(plan).params_trainable
    _trains_two_steps(out)


@pytest.mark.parametrize(("family", "method", "tower"), [("tiny_idefics3", "lora", "lora"),
                                                          ("tiny_gemma3", "full", "full")])
def test_an_uncheckpointed_tower_recipe_trains_what_was_estimated(family, method, tower, tmp_path, request):
    """A LoRA or trained tower without gradient checkpointing (estimated for the LayerNorm ViT towers and Llama 3.2
    Vision since cohort v44): the recipe leaves checkpointing off, trains the estimate's parameter count, and runs
    two CPU steps."""
    from canifinetune.estimator.estimate import estimate
    from canifinetune.recipes.schema import load_recipe
    from canifinetune.recipes.vision_setup import build_vlm

    folder = request.getfixturevalue(family)
    out = _recipe(folder, tmp_path / "recipe", method, "--vision-tower", tower, "--no-gradient-checkpointing")
    plan = load_recipe(out / "recipe.yaml").plan
    assert plan.vision_tower == tower and not plan.gradient_checkpointing
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_vlm(plan, config)
        assert not getattr(model, "is_gradient_checkpointing", False)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == estimate(plan).params_trainable
    _trains_two_steps(out)
