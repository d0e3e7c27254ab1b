"""The training runtime on CPU: tiny random models saved from configs these tests write.

A generated recipe trains two steps with a finite loss (in a subprocess with an ASCII locale and a non-ASCII
dataset), samples longer than seq_len are refused, the estimator's resolved settings agree with what the runtime
actually builds, and the probe refuses to invent numbers without CUDA.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("peft")

from canifinetune.estimator.inventory import inventory_of
from canifinetune.estimator.model_sources import resolve_model
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.resolved import resolve
from canifinetune.recipes.render import make_recipe, write_recipe
from canifinetune.recipes.runtime import SampleTooLongError, prepare, runtime_settings
from canifinetune.recipes.schema import RecipeError
from canifinetune.server.cli import main as cli_main

ROOT = Path(__file__).resolve().parent.parent
CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def make_tiny_model(folder: Path, hidden: int = 64, layers: int = 2) -> Path:
    """A random 2-layer llama and a byte-level tokenizer, saved with save_pretrained."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>"]
    vocab = {t: i for i, t in enumerate(specials + sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", additional_special_tokens=specials[4:])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    config = AutoConfig.for_model(
        "llama", vocab_size=len(vocab), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=3,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny llama")


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


NON_ASCII_ROWS = [
    {"text": "Grüße aus Köln — 你好，世界 🙂"},
    {"messages": [{"role": "user", "content": "¿Qué tal?"}, {"role": "assistant", "content": "très bien, 谢谢"}]},
    {"text": "Ελληνικά και русский"},
    {"text": "plain ascii"},
]


# ----------------------------------------------------------------------------------------- training


def test_generated_recipe_trains_two_steps_under_an_ascii_locale(tiny_model, tmp_path):
    """The whole path as a user runs it, in a fresh process whose locale encoding is ASCII (stricter than GBK)."""
    # paths stay ASCII: under an ASCII locale the file-system encoding is ASCII too; the contents are not
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    _write_jsonl(data_dir / "train.jsonl", NON_ASCII_ROWS)
    out = tmp_path / "recipe"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONIOENCODING", "PYTHONUTF8", "LANG", "LC_CTYPE")}
    env.update({"LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0", "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_VERBOSITY": "error"})
    code = (
        "import json, locale, sys\n"
        "assert locale.getpreferredencoding(False).lower() in ('ansi_x3.4-1968', 'ascii', 'us-ascii'),"
        " locale.getpreferredencoding(False)\n"
        "from canifinetune.server.cli import main\n"
        "model, data, out = sys.argv[1:4]\n"
        "rc = main(['recipe', '--model', model, '--dataset', data, '--dtype', 'fp32', '--seq-len', '64',\n"
        "           '--batch-size', '2', '--max-steps', '2', '--learning-rate', '1e-3', '--out', out, '--offline'])\n"
        "assert rc == 0, rc\n"
        "from canifinetune.recipes.train import train\n"
        "result = train(out + '/recipe.yaml', out=sys.stderr, device='cpu')\n"
        "print(json.dumps({'steps': result.steps, 'losses': result.losses, 'output': str(result.output_dir)}))\n"
    )
    run = subprocess.run([sys.executable, "-c", code, str(tiny_model), str(data_dir / "train.jsonl"), str(out)],
                         env=env, capture_output=True, timeout=300, cwd=tmp_path)
    stderr = run.stderr.decode("utf-8", "replace")
    assert run.returncode == 0, stderr[-3000:]
    result = json.loads(run.stdout.decode("ascii").strip().splitlines()[-1])
    assert result["steps"] == 2
    assert len(result["losses"]) == 2 and all(math.isfinite(x) and x > 0 for x in result["losses"])
    assert Path(result["output"]) == out / "outputs"
    assert (out / "outputs" / "adapter_model.safetensors").exists()


def _plan(model: Path, **kw) -> TrainingPlan:
    base = {"model": str(model), "dtype": "fp32", "seq_len": 32, "batch_size": 2, "max_steps": 1}
    return TrainingPlan(**{**base, **kw})


def test_samples_longer_than_seq_len_are_refused(tiny_model, tmp_path):
    rows = [{"text": "short"}, {"text": "also short"}, {"text": "x" * 100}, {"text": "y" * 80}]
    data = _write_jsonl(tmp_path / "data.jsonl", [*rows[:2], {"text": "ok"}])
    with open(data, "a", encoding="utf-8") as handle:
        handle.write("\n")  # a blank line still counts in the line numbers
        for row in rows[2:]:
            handle.write(json.dumps(row) + "\n")
    plan = _plan(tiny_model, dataset=str(data))
    with pytest.raises(SampleTooLongError) as info:
        prepare(plan, output_dir=tmp_path / "o")
    message = str(info.value)
    assert "line 5" in message and "101 tokens" in message and "seq_len 32" in message  # 100 bytes + EOS
    assert "line 6: 81" in message and "truncation: true" in message
    # the recipe can say truncation: true
    prepared = prepare(plan.replace(truncation=True), output_dir=tmp_path / "o")
    assert prepared.truncated == 2
    assert max(len(x) for x in prepared.trainer.train_dataset["input_ids"]) == 32
    # and the CLI says it in one line, exit 2
    recipe_dir = tmp_path / "r"
    write_recipe(make_recipe(plan), recipe_dir)
    assert cli_main(["train", str(recipe_dir / "recipe.yaml")]) == 2


def test_dataset_folder_and_standard_loss(tiny_model, tmp_path):
    from datasets import Dataset

    Dataset.from_list([{"text": "hello there"}, {"text": "général Kenobi"}] * 2).save_to_disk(str(tmp_path / "ds"))
    plan = _plan(tiny_model, dataset=str(tmp_path / "ds"), loss_implementation="standard", gradient_checkpointing=False)
    prepared = prepare(plan, output_dir=tmp_path / "o")
    assert type(prepared.trainer).__name__ == "StandardLossSFTTrainer"
    output = prepared.trainer.train()
    assert output.global_step == 1 and math.isfinite(output.training_loss)


def test_dataset_errors_name_the_row(tiny_model, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"prompt": 1}\n', encoding="utf-8")
    with pytest.raises(RecipeError, match=r"line 2.*'text' string or a 'messages' list"):
        prepare(_plan(tiny_model, dataset=str(bad)), output_dir=tmp_path / "o")
    with pytest.raises(RecipeError, match="does not exist"):
        prepare(_plan(tiny_model, dataset=str(tmp_path / "nope.jsonl")), output_dir=tmp_path / "o")
    with pytest.raises(RecipeError, match="names no dataset"):
        prepare(_plan(tiny_model), output_dir=tmp_path / "o")


def test_model_folder_without_weights_is_refused(tmp_path):
    folder = tmp_path / "cfg"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}), encoding="utf-8")
    with pytest.raises(RecipeError, match="no weights"):
        prepare(_plan(folder, dataset="x.jsonl"), output_dir=tmp_path / "o")


# ----------------------------------------------------------------------------------------- estimate == runtime


AGREEMENT_PLANS = [
    {"method": "lora", "dtype": "bf16"},
    {"method": "lora", "dtype": "fp32", "target_modules": "all-linear", "gradient_checkpointing": False},
    {"method": "lora", "dtype": "bf16", "target_modules": ["q_proj", "o_proj"], "lora_r": 4},
    {"method": "qlora", "dtype": "bf16", "optim": "adamw_torch"},
    {"method": "qlora", "dtype": "bf16", "target_modules": "all-linear", "gradient_checkpointing": False},
    {"method": "full", "dtype": "bf16", "optim": "adafactor"},
    {"method": "full", "dtype": "bf16", "precision": "mixed", "optim": "sgd", "gradient_checkpointing": False},
]
OPTIMIZER_CLASSES = {
    "adamw_torch_fused": ("torch.optim.adamw.AdamW", {"fused": True}),
    "adamw_torch": ("torch.optim.adamw.AdamW", {"fused": None}),
    "adafactor": ("transformers.optimization.Adafactor", {"scale_parameter": False, "relative_step": False}),
    "sgd": ("torch.optim.sgd.SGD", {"momentum": 0}),
}


@pytest.mark.parametrize("kw", AGREEMENT_PLANS, ids=lambda kw: "-".join(f"{v}" for v in kw.values()))
def test_estimate_and_runtime_agree_on_every_knob(kw, tiny_model, tmp_path):
    plan = _plan(tiny_model, **kw)
    spec = resolve_model(plan.model).spec
    est = resolve(plan, spec)
    prepared = prepare(plan, token_ids=[[5] * 8] * 4, output_dir=tmp_path / "o", max_steps=1)
    got = runtime_settings(prepared)

    # weights: stored dtype of the unquantized base; quantization of the linear layers
    base = got["base_weight_dtypes"]
    if est.quantization == "none":
        assert base == {DTYPES[est.weight_dtype]: spec.total_params}
    else:
        assert set(base) == {DTYPES[est.weight_dtype], f"4bit-{est.quantization}"}
        assert got["quantized_params"] > 0
    assert got["embedding_dtype"] == DTYPES[est.weight_dtype]
    # compute dtype: autocast through the trainer's bf16/fp16 flags
    assert got["trainer"]["bf16"] == (est.autocast and est.compute_dtype == "bf16")
    assert got["trainer"]["fp16"] == (est.autocast and est.compute_dtype == "fp16")
    # adapters: dtype, targets, trainable count
    if est.adapter_dtype is None:
        assert got["adapter_dtypes"] == {} and got["adapted_modules"] == []
    else:
        assert got["adapter_dtypes"] == {DTYPES[est.adapter_dtype]: inventory_of(est).adapter_params}
        assert got["adapted_modules"] == sorted(est.target_modules)
    assert got["trainable_params"] == inventory_of(est).trainable_params
    assert got["total_params"] - (inventory_of(est).adapter_params if est.adapter_dtype else 0) == spec.total_params
    # checkpointing, attention, micro-batch, seq_len, optimizer
    assert got["gradient_checkpointing"] is plan.gradient_checkpointing
    assert got["trainer"]["activation_checkpointing"] is plan.gradient_checkpointing
    if plan.gradient_checkpointing:
        assert got["trainer"]["activation_checkpointing_kwargs"] == {"use_reentrant": False}
    assert got["attn_implementation"] == est.attn_implementation
    assert got["trainer"]["per_device_train_batch_size"] == plan.batch_size
    assert got["trainer"]["gradient_accumulation_steps"] == plan.gradient_accumulation_steps
    assert got["trainer"]["max_length"] == plan.seq_len
    cls, flags = OPTIMIZER_CLASSES[plan.optim]
    assert got["optimizer"] == cls
    for key, value in flags.items():
        assert got["optimizer_flags"].get(key) == value, (key, got["optimizer_flags"])
    assert got["trainer"]["trainer_class"] == ("SFTTrainer" if plan.effective_loss_implementation == "chunked"
                                            else "StandardLossSFTTrainer")


# ----------------------------------------------------------------------------------------- probe


def test_probe_refuses_to_measure_without_cuda(tiny_model, tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the probe would measure")
    from canifinetune.recipes.probe import ProbeError, probe

    with pytest.raises(ProbeError, match=r"only be measured on a CUDA GPU.*nothing was measured"):
        probe(_plan(tiny_model), 3)
    recipe_dir = tmp_path / "r"
    write_recipe(make_recipe(_plan(tiny_model, dataset="x.jsonl")), recipe_dir)
    assert cli_main(["train", str(recipe_dir / "recipe.yaml"), "--probe", "3"]) == 2
    captured = capsys.readouterr()
    assert "CUDA" in captured.err and "GiB" not in captured.out + captured.err


def test_probe_report_format():
    from canifinetune.recipes.probe import GPUProcess, ProbeResult, format_probe
    from canifinetune.recipes.schema import EstimateSummary

    g = 1024**3
    est = EstimateSummary(peak_allocated_bytes=4 * g, peak_reserved_bytes=5 * g, total_bytes=6 * g, budget_bytes=7 * g,
                          peak_phase="backward", verdict="fits", gpu="A100 80GB", gpu_usable_bytes=79 * g,
                          params_total=1, params_trainable=1, calibration_version="x")
    result = ProbeResult(steps=3, device="cuda:0", gpu_name="NVIDIA A100", device_total_bytes=80 * g,
                         free_bytes_before=70 * g, other_processes=[GPUProcess(pid=42, bytes=2 * g)],
                         other_processes_bytes=2 * g, peak_allocated_bytes=int(4.2 * g), peak_reserved_bytes=5 * g,
                         process_total_bytes=int(5.5 * g), process_total_source="NVML", estimate=est,
                         losses=[2.0, 1.9, 1.8], samples="synthetic")
    text = format_probe(result)
    assert "pid 42" in text and "peak allocated" in text and "1.05" in text and "process total" in text
