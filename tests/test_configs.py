"""Bring your own config (issue 16): the user's Axolotl, LLaMA-Factory, TRL, TrainingArguments, PEFT, accelerate and
DeepSpeed files read into a plan, what was used and not, flags over the file, suggestions handed back as edits to
the same file, hostile files refused in bounded time and memory; through the core, the CLI and the MCP tools."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from canifinetune.estimator.configs import (
    MAX_CONFIG_BYTES,
    ConfigError,
    apply_edits,
    config_edits,
    load_configs,
    suggestion_edits,
)
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.search import suggest
from canifinetune.server import cli

DATA = Path(__file__).parent / "data" / "configs"


def load(*names: str, overrides: dict | None = None, formats: list | None = None):
    return load_configs([(str(DATA / n), (DATA / n).read_bytes()) for n in names], formats=formats,
                        overrides=overrides)


def used(loaded) -> dict[str, tuple]:
    return {u.key: (u.field, u.plan_value) for u in loaded.report.used}


def warnings(loaded) -> str:
    return "\n".join(f"{w.key}: {w.message}" for w in loaded.report.not_modelled)


# ------------------------------------------------------------------------------------------- each format


def test_axolotl_qlora_example():
    cfg = load("axolotl_qlora.yml")
    p = cfg.plan
    assert cfg.report.framework == p.framework == "axolotl"
    assert (p.model, p.method, p.lora_r, p.lora_alpha, p.lora_dropout) == (
        "meta-llama/Llama-3.1-8B",
        "qlora",
        32,
        16,
        0.05,
    )
    assert p.target_modules == sorted(["gate_proj", "down_proj", "up_proj", "q_proj", "v_proj", "k_proj", "o_proj"])
    assert (p.seq_len, p.batch_size, p.gradient_accumulation_steps) == (4096, 2, 4)
    assert (p.optim, p.gradient_checkpointing, p.attn_implementation, p.packing) == (
        "paged_adamw_32bit", True, "flash_attention_2", True)
    u = used(cfg)
    assert u["micro_batch_size"] == ("batch_size", 2) and u["sequence_len"] == ("seq_len", 4096)
    assert u["flash_attention"] == ("attn_implementation", "flash_attention_2")
    assert "bf16 'auto'" in warnings(cfg)  # an assumption, said
    assert cfg.report.ignored >= 10 and "datasets" in cfg.report.ignored_keys
    assert cfg.report.files[0].defaults_from.startswith("axolotl 0.18.0")


def test_axolotl_defaults_are_axolotls():
    cfg = load_configs([("a.yml", "base_model: Qwen/Qwen2.5-0.5B\nadapter: lora\nlora_r: 8\nmicro_batch_size: 1\n")])
    p = cfg.plan
    assert (p.lora_dropout, p.seq_len, p.gradient_checkpointing, p.optim, p.dtype, p.target_modules) == (
        0.0, 512, False, "adamw_torch_fused", "bf16", None)
    assert cfg.report.defaults["seq_len"] == 512 and cfg.report.defaults["gradient_checkpointing"] is False
    full = load_configs([("f.yml", "base_model: Qwen/Qwen2.5-0.5B\nmicro_batch_size: 2\nlora_target_linear: true\n")])
    assert full.plan.method == "full"
    linear = load_configs(
        [
            (
                "l.yml",
                "base_model: Qwen/Qwen2.5-0.5B\nadapter: lora\nlora_r: 4\nlora_target_linear: true\n"
                "lora_modules_to_save: [embed_tokens, lm_head]\npeft_use_dora: true\n",
            )
        ]
    )
    assert linear.plan.target_modules == "all-linear" and linear.plan.modules_to_save == ["embed_tokens", "lm_head"]
    assert linear.plan.use_dora


@pytest.mark.parametrize("text,needle", [
    ("base_model: m\nadapter: lora\n", "lora_r"),
    ("base_model: m\nadapter: llama-adapter\nlora_r: 8\n", "llama-adapter"),
    ("base_model: m\nrl: dpo\nadapter: lora\nlora_r: 8\n", "dpo trainer is not estimated"),
    ("base_model: m\nload_in_4bit: true\n", "adapter lora or qlora"),
])
def test_axolotl_refusals(text, needle):
    with pytest.raises(ConfigError) as err:
        load_configs([("bad.yml", text)])
    assert needle in str(err.value) and "bad.yml" in str(err.value)


def test_axolotl_not_modelled_keys_are_named():
    cfg = load_configs([("a.yml", "base_model: Qwen/Qwen2.5-0.5B\nadapter: lora\nlora_r: 8\n"
                                  "gradient_checkpointing: offload\nlora_mlp_kernel: true\nplugins:\n"
                                  "  - axolotl.integrations.liger.LigerPlugin\nliger_rms_norm: true\n"
                                  "unfrozen_parameters: ['^lm_head']\n")])
    text = warnings(cfg)
    for key in ("gradient_checkpointing", "lora_mlp_kernel", "plugins", "liger_rms_norm", "unfrozen_parameters"):
        assert f"{key}:" in text, key
    assert cfg.plan.gradient_checkpointing is True and not cfg.plan.use_liger_kernel


def test_llama_factory_lora_example():
    cfg = load("llama3_lora_sft.yaml")
    p = cfg.plan
    assert p.framework == "llama_factory" and p.method == "lora"
    assert (p.lora_r, p.lora_alpha, p.lora_dropout, p.target_modules) == (8, 16, 0.0, "all-linear")
    assert (p.seq_len, p.batch_size, p.gradient_accumulation_steps, p.gradient_checkpointing) == (2048, 1, 8, True)
    assert used(cfg)["lora_target"] == ("target_modules", "all-linear")
    assert cfg.report.defaults["gradient_checkpointing"] is True  # on unless disable_gradient_checkpointing


def test_llama_factory_qlora_and_defaults():
    p = load("llama3_qlora_bnb.yaml").plan
    assert p.method == "qlora" and p.bnb_4bit_quant_type == "nf4" and p.bnb_4bit_use_double_quant
    bare = load_configs([("lf.yaml", "model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\ntemplate: qwen\n")]).plan
    assert (bare.method, bare.lora_r, bare.lora_alpha, bare.seq_len, bare.batch_size) == ("lora", 8, 16, 2048, 8)
    eight = load_configs([("lf.yaml", "model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\nquantization_bit: 8\n"
                                      "lora_rank: 32\nflash_attn: fa2\ndisable_gradient_checkpointing: true\n")]).plan
    assert eight.load_in_8bit and eight.lora_alpha == 64 and eight.attn_implementation == "flash_attention_2"
    assert eight.gradient_checkpointing is False
    q = load_configs([("lf.yaml", "model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\nquantization_bit: 4\n"
                                  "lora_rank: 32\nlora_target: q_proj,v_proj\ndouble_quantization: false\n")]).plan
    assert (q.method, q.lora_r, q.lora_alpha, q.target_modules, q.bnb_4bit_use_double_quant) == (
        "qlora", 32, 64, ["q_proj", "v_proj"], False)
    pt = load_configs([("pt.yaml", "model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: pt\nfinetuning_type: full\n")]).plan
    assert pt.packing and pt.method == "full"


@pytest.mark.parametrize("text,needle", [
    ("model_name_or_path: m\nstage: dpo\n", "dpo trainer is not estimated"),
    ("model_name_or_path: m\nstage: sft\nfinetuning_type: freeze\n", "freeze"),
    ("model_name_or_path: m\nstage: sft\nquantization_bit: 3\n", "3-bit"),
    ("model_name_or_path: m\nstage: sft\nfinetuning_type: full\nquantization_bit: 4\n", "finetuning_type lora"),
])
def test_llama_factory_refusals(text, needle):
    with pytest.raises(ConfigError) as err:
        load_configs([("lf.yaml", text)])
    assert needle in str(err.value) and "lf.yaml line" in str(err.value)


def test_llama_factory_deepspeed_named_not_given_is_read_from_the_name_and_said():
    cfg = load("llama3_full_sft_ds3.yaml")
    assert cfg.plan.method == "full" and cfg.plan.sharding == "zero3"
    assert "read from the file name" in warnings(cfg) and "how many GPUs" in warnings(cfg)


def test_trl_examples():
    p = load("trl_sft.yaml").plan
    assert p.framework == "trl" and p.method == "lora" and p.target_modules == "all-linear"
    assert (p.lora_r, p.lora_alpha, p.seq_len, p.batch_size, p.packing) == (32, 16, 4096, 4, True)
    q = load("trl_qlora.yaml")
    assert q.plan.method == "qlora" and q.plan.bnb_4bit_use_double_quant and q.plan.attn_implementation == "sdpa"
    assert used(q)["dtype"] == ("dtype", "bf16")
    full = load_configs([("t.yaml", "model_name_or_path: Qwen/Qwen2.5-0.5B\ndataset_name: x\nmax_length: 512\n")]).plan
    assert full.method == "full" and full.gradient_checkpointing and full.seq_len == 512  # TRL: no use_peft = full
    with pytest.raises(ConfigError, match="max_length: null"):
        load_configs([("t.yaml", "model_name_or_path: m\nuse_peft: true\nmax_length: null\n")])


def test_trl_liger_is_warned_and_offloading_is_read():
    cfg = load_configs([("t.yaml", "model_name_or_path: Qwen/Qwen2.5-0.5B\nuse_peft: true\nuse_liger_kernel: true\n"
                                   "activation_offloading: true\nmax_length: 1024\n")])
    assert "use_liger_kernel" in warnings(cfg) and "activation_offloading" not in warnings(cfg)
    assert not cfg.plan.use_liger_kernel and cfg.plan.activation_offloading


def test_trl_offloading_without_checkpointing_is_refused_naming_the_setting():
    with pytest.raises(ConfigError, match="gradient_checkpointing"):
        load_configs([("t.yaml", "model_name_or_path: Qwen/Qwen2.5-0.5B\nuse_peft: true\nmax_length: 1024\n"
                                 "activation_offloading: true\ngradient_checkpointing: false\n")])


def test_training_arguments_json_needs_a_model():
    with pytest.raises(ConfigError) as err:
        load("training_args.json")
    assert "training_args.json line 1" in str(err.value) and "--model" in str(err.value)
    cfg = load("training_args.json", overrides={"model": "Qwen/Qwen2.5-0.5B"})
    p = cfg.plan
    assert p.framework == "transformers" and p.method == "full"
    assert (p.batch_size, p.gradient_accumulation_steps, p.optim, p.gradient_checkpointing) == (
        4,
        4,
        "paged_adamw_8bit",
        True,
    )
    assert "no sequence length" in warnings(cfg)


def test_peft_adapter_config_and_with_training_arguments():
    cfg = load("adapter_config.json")
    p = cfg.plan
    assert (p.model, p.method, p.lora_r, p.lora_alpha, p.lora_dropout) == (
        "mistralai/Mistral-7B-v0.1",
        "lora",
        16,
        32,
        0.1,
    )
    assert p.target_modules == ["k_proj", "o_proj", "q_proj", "v_proj"] and p.framework == "transformers"
    assert "--method qlora" in warnings(cfg)
    assert load("adapter_config.json", overrides={"method": "qlora"}).plan.method == "qlora"
    both = load("training_args.json", "adapter_config.json").plan
    assert both.method == "lora" and both.batch_size == 4 and both.optim == "paged_adamw_8bit"


def test_deepspeed_and_accelerate_alone_need_a_model():
    with pytest.raises(ConfigError, match="nothing to train"):
        load("zero3_bf16.json")
    p = load("ds_zero2_offload.json", "accelerate_deepspeed.yaml", overrides={"model": "Qwen/Qwen2.5-0.5B"}).plan
    assert (p.sharding, p.offload_optimizer, p.num_gpus) == ("zero2", True, 4)


# ------------------------------------------------------------------------------------------- several files


def test_axolotl_with_its_deepspeed_json():
    cfg = load("axolotl_full_ds.yml", "zero3_bf16.json")
    p = cfg.plan
    assert (p.method, p.sharding, p.optim, p.seq_len) == ("full", "zero3", "paged_adamw_8bit", 8192)
    assert used(cfg)["zero_optimization.stage"] == ("sharding", "zero3")
    assert used(cfg)["train_micro_batch_size_per_gpu"][0] is None  # "auto": the trainer's value
    assert [f.format for f in cfg.report.files] == ["axolotl", "deepspeed"]
    with_gpus = load("axolotl_full_ds.yml", "zero3_bf16.json", overrides={"num_gpus": 8})
    assert with_gpus.plan.num_gpus == 8 and with_gpus.plan.sharding == "zero3"
    assert "how many GPUs" not in warnings(with_gpus)
    stage0 = load_configs([("a.yml", "base_model: Qwen/Qwen2.5-0.5B\nmicro_batch_size: 1\ndeepspeed: ds.json\n"),
                           ("ds.json", '{"zero_optimization": {"stage": 0}}')], overrides={"num_gpus": 4})
    assert (stage0.plan.sharding, stage0.plan.num_gpus) == ("ddp", 4)


def test_trl_with_accelerate_fsdp():
    cfg = load("trl_sft.yaml", "fsdp_accelerate.yaml")
    p = cfg.plan
    assert (p.sharding, p.num_gpus, p.offload_params, p.framework) == ("fsdp_full_shard", 8, False, "trl")
    assert used(cfg)["num_processes"] == ("num_gpus", 8)
    ds = load("trl_sft.yaml", "accelerate_deepspeed.yaml").plan
    assert (ds.sharding, ds.num_gpus) == ("zero3", 4)


def test_two_training_configs_are_refused():
    with pytest.raises(ConfigError, match="more than one training config"):
        load("trl_sft.yaml", "axolotl_qlora.yml")


# ------------------------------------------------------------------------------------------- flags win


def test_flags_override_the_file_and_say_so():
    cfg = load("axolotl_qlora.yml", overrides={"seq_len": 1024, "model": "Qwen/Qwen2.5-7B-Instruct"})
    assert cfg.plan.seq_len == 1024 and cfg.plan.model == "Qwen/Qwen2.5-7B-Instruct"
    overrides = {o.field: (o.file_value, o.value) for o in cfg.report.overrides}
    assert overrides == {"seq_len": (4096, 1024), "model": ("meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-7B-Instruct")}


def test_a_bad_value_names_the_key_and_line():
    with pytest.raises(ConfigError) as err:
        load_configs([("a.yml", "base_model: m\nadapter: lora\nlora_r: 8\nlora_dropout: 3\n")])
    assert "lora_dropout" in str(err.value) and "a.yml line 4" in str(err.value)
    with pytest.raises(ConfigError, match=r"a.yml line 2: micro_batch_size"):
        load_configs([("a.yml", "base_model: m\nmicro_batch_size: many\n")])


# ------------------------------------------------------------------------------------------- detection


@pytest.mark.parametrize("name,fmt", [
    ("axolotl_qlora.yml", "axolotl"), ("axolotl_full_ds.yml", "axolotl"), ("llama3_lora_sft.yaml", "llama_factory"),
    ("llama3_full_sft_ds3.yaml", "llama_factory"), ("trl_sft.yaml", "trl"), ("trl_qlora.yaml", "trl"),
    ("training_args.json", "transformers"), ("adapter_config.json", "peft"), ("zero3_bf16.json", "deepspeed"),
    ("ds_zero2_offload.json", "deepspeed"), ("fsdp_accelerate.yaml", "accelerate"),
    ("accelerate_deepspeed.yaml", "accelerate"),
])
def test_detection(name, fmt):
    from canifinetune.estimator.configs import detect, parse

    assert detect.detect(parse.parse(name, (DATA / name).read_bytes())) == fmt


def test_unknown_format_and_explicit_format():
    with pytest.raises(ConfigError, match="cannot tell which framework"):
        load_configs([("x.yaml", "foo: 1\nbar: 2\n")])
    p = load_configs([("x.yaml", "model_name_or_path: Qwen/Qwen2.5-0.5B\n")], formats=["llama_factory"]).plan
    assert p.framework == "llama_factory" and p.lora_r == 8
    with pytest.raises(ConfigError, match="not known"):
        load_configs([("x.yaml", "a: 1\n")], formats=["megatron"])


# ------------------------------------------------------------------------------------------- edits round-trip


def _reread(cfg, edits):
    edited = apply_edits(cfg, edits)
    files = [(r.doc.name, edited.get(r.doc.name, r.doc.text)) for r in cfg.readings]
    return load_configs(files, formats=[r.format for r in cfg.readings], overrides=_kept(cfg))


def _kept(cfg):  # what the files cannot say (the GPU) stays a flag
    return {k: getattr(cfg.plan, k) for k in ("gpu", "gpu_vram_gb", "model") if k in cfg.report.plan_fields or
            (getattr(cfg.plan, k) is not None and k != "model")}


ROUND_TRIPS = [
    (("axolotl_qlora.yml",), {"gpu": "RTX 3060"}),
    (("axolotl_qlora.yml",), {"gpu": "RTX 4090"}),
    (("axolotl_full_ds.yml", "zero3_bf16.json"), {"gpu": "A100 80GB", "num_gpus": 2}),
    (("llama3_lora_sft.yaml",), {"gpu": "RTX 3060", "batch_size": 8}),
    (("llama3_qlora_bnb.yaml",), {"gpu_vram_gb": 8}),
    (("trl_sft.yaml",), {"gpu": "RTX 4090"}),
    (("trl_qlora.yaml",), {"gpu_vram_gb": 6}),
    (("trl_sft.yaml", "fsdp_accelerate.yaml"), {"gpu": "RTX 4090"}),
    (("adapter_config.json",), {"gpu": "RTX 3060"}),
]


@pytest.mark.parametrize("names,flags", ROUND_TRIPS, ids=lambda v: "+".join(v) if isinstance(v, tuple) else str(v))
def test_edits_round_trip_to_the_suggested_plan(names, flags):
    cfg = load(*names, overrides=flags)
    result = suggest(cfg.plan, max_suggestions=4)
    assert result.suggestions or result.fits_already
    for group, s in zip(suggestion_edits(cfg, result), result.suggestions, strict=False):
        unexpressed = {f for e in group.edits if e.key is None for f in e.fields}
        again = _reread(cfg, group.edits).plan
        for name in TrainingPlan.model_fields:
            if name in unexpressed or name in ("gpu", "gpu_vram_gb"):
                continue
            got, want = getattr(again, name), getattr(s.plan, name)
            assert got == want, (s.rank, name, got, want, [e.model_dump() for e in group.edits])
        for e in group.edits:
            assert e.key is not None or e.note, e
            assert e.key is None or e.old != e.new


def test_edits_keep_comments_and_other_keys():
    cfg = load("axolotl_qlora.yml", overrides={"gpu": "RTX 3060"})
    result = suggest(cfg.plan, max_suggestions=3)
    text = apply_edits(cfg, config_edits(cfg, result.suggestions[0].plan))[str(DATA / "axolotl_qlora.yml")]
    original = (DATA / "axolotl_qlora.yml").read_text()
    assert "# optionally might have model_type or tokenizer_type" in text
    assert "datasets:\n  - path: aaditya/alpaca_subset_1" in text
    changed = [a for a, b in zip(original.splitlines(), text.splitlines(), strict=False) if a != b]
    assert len(changed) <= 4


def test_yaml_set_nested_and_inline():
    from canifinetune.estimator.configs.edits import yaml_set

    text = "a: 1\nfsdp_config:\n  fsdp_offload_params: false  # keep\n  other: x\nb: [1, 2]\n"
    out = yaml_set(text, "fsdp_config.fsdp_offload_params", True)
    assert "  fsdp_offload_params: true  # keep\n  other: x" in out
    out = yaml_set(out, "fsdp_config.new_key", 3)
    assert "  new_key: 3\nb: [1, 2]" in out
    out = yaml_set(out, "lora_target_modules", ["q_proj", "v_proj"])
    assert out.endswith("lora_target_modules: [q_proj, v_proj]\n")
    flow = yaml_set("z: {stage: 2}\n", "z.stage", 3)
    assert flow == "z: {stage: 3}\n"
    blocks = yaml_set("targets:\n- q\n- v\nnext: 1\n", "targets", ["o"])
    assert blocks == "targets: [o]\nnext: 1\n"
    # issue 22.5/22.6: a document end, an indented or a flow top-level mapping, CRLF and an empty value
    assert yaml_set("a: 1\n...\n", "b", 2) == "a: 1\nb: 2\n...\n"
    assert yaml_set("  a: 1\n  b: 2\n", "c", 3) == "  a: 1\n  b: 2\n  c: 3\n"
    assert yaml_set("# c\n{a: 1}\n", "b", 2) == "# c\n{a: 1, b: 2}\n"
    assert yaml_set("a: 1\r\nb:\r\n  c: 2\r\n", "b.d", 3) == "a: 1\r\nb:\r\n  c: 2\r\n  d: 3\r\n"
    assert yaml_set("a:  # why\nb: 2\n", "a", "x") == "a: x  # why\nb: 2\n"
    assert yaml_set("a: |\n  x\n  y\nb: 1\n", "a", "z") == "a: z\nb: 1\n"


# ------------------------------------------------------------------------------------------- hostile files


def _bounded(text_or_bytes, needle: str, name: str = "evil.yaml", seconds: float = 2.0, mib: float = 64):
    start = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        load_configs([(name, text_or_bytes)])
    elapsed = time.perf_counter() - start
    tracemalloc.start()  # again, for the memory (tracemalloc slows Python down several times)
    try:
        with pytest.raises(ConfigError):
            load_configs([(name, text_or_bytes)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(err.value)
    assert needle in message, message
    assert name in message and "\n" not in message and len(message) < 1200
    assert elapsed < seconds, elapsed
    assert peak < mib * 2**20, peak
    return elapsed, peak


HOSTILE = [
    ("huge", b"a: " + b"x" * (MAX_CONFIG_BYTES + 10) + b"\n", "at most 256 KB"),
    (
        "deep_yaml",
        ("a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 200)) + "  " * 200 + "v: 1\n"),
        "nested deeper",
    ),
    ("deep_flow", "a: " + "[" * 5000 + "]" * 5000 + "\n", "nested deeper"),
    ("deep_json", '{"a": ' + "[" * 100000 + "]" * 100000 + "}", "nested deeper"),
    ("python_tag", "base_model: !!python/object/apply:os.system ['echo pwned']\n", "YAML tag"),
    ("custom_tag", "base_model: !Ref something\n", "YAML tag"),
    (
        "billion_laughs",
        "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n",
        "alias",
    ),
    ("merge_key", "base: &base {lora_r: 8}\nother:\n  <<: *base\n", "alias"),
    ("latin1", "base_model: caf\xe9\n".encode("latin-1"), "not UTF-8"),
    ("utf16", "base_model: m\n".encode("utf-16"), "not UTF-8"),
    ("duplicate", "base_model: a\nadapter: lora\nbase_model: b\n", "appears twice"),
    ("not_a_mapping", "- a\n- b\n", "mapping"),
    ("empty", "", "empty"),
    ("bad_yaml", "base_model: m\nadapter: [lora\n", "not valid YAML"),
    ("bad_json", '{"a": 1,\n "b": }', "not valid JSON"),
    ("json_nan", '{"per_device_train_batch_size": NaN}', "not a JSON number"),
    ("huge_int", "base_model: m\nsequence_len: " + "9" * 5000 + "\n", "evil.yaml"),
    ("many_keys", "".join(f"k{i}: {i}\n" for i in range(12000)), "more than"),
]


@pytest.mark.parametrize("label,content,needle", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_files_fail_clearly_in_bounded_time_and_memory(label, content, needle):
    name = "evil.json" if label.startswith(("deep_json", "bad_json", "json_")) else "evil.yaml"
    _bounded(content, needle, name=name)


def test_the_python_tag_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(ConfigError):
        load_configs([("e.yaml", f"a: !!python/object/apply:os.system ['touch {marker}']\n")])
    assert not marker.exists()


def test_a_line_is_named_for_invalid_yaml():
    with pytest.raises(ConfigError, match=r"bad.yaml line 3: not valid YAML: while parsing a flow sequence"):
        load_configs([("bad.yaml", "base_model: m\nadapter: lora\nlora_r: [8\n")])
    with pytest.raises(ConfigError, match=r"bad.yaml line 2: not valid YAML"):
        load_configs([("bad.yaml", "base_model: m\n  adapter: lora\n")])


# ------------------------------------------------------------------------------------------- CLI


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_estimate_with_config(capsys):
    code, out, err = run_cli(capsys, "estimate", "--config", str(DATA / "axolotl_qlora.yml"), "--gpu", "A100 80GB",
                             "--offline")
    assert code == 0, err
    assert out.startswith("FITS on A100 80GB") and "stack: Axolotl" in out
    assert "used  micro_batch_size: 2 -> batch_size = 2" in out and "ignored: " in out and "warning: bf16" in out


def test_cli_flags_win_and_json_carries_the_report(capsys):
    _code, out, _err = run_cli(capsys, "estimate", "--config", str(DATA / "trl_sft.yaml"), "--config",
                             str(DATA / "fsdp_accelerate.yaml"), "--seq-len", "1024", "--gpu", "RTX 4090", "--json",
                             "--offline")
    data = json.loads(out)
    assert data["plan"]["seq_len"] == 1024 and data["plan"]["sharding"] == "fsdp_full_shard"
    assert {"field": "seq_len", "file_value": 4096, "value": 1024} in data["config"]["overrides"]
    assert data["config"]["framework"] == "trl" and data["config"]["ignored"] > 0


def test_cli_model_replaces_the_base_model(capsys):
    code, _out, err = run_cli(capsys, "estimate", "--config", str(DATA / "training_args.json"), "--model",
                             "Qwen/Qwen2.5-0.5B", "--offline")
    assert code == 0, err
    code, _out, err = run_cli(capsys, "estimate", "--config", str(DATA / "training_args.json"), "--offline")
    assert code == 2 and "names no model" in err and "training_args.json line 1" in err


def test_cli_without_model_or_config(capsys):
    code, _out, err = run_cli(capsys, "estimate", "--gpu", "RTX 4090")
    assert code == 2 and "--model" in err


def test_cli_suggest_shows_edits_and_writes_a_copy(capsys, tmp_path):
    src = tmp_path / "qlora.yml"
    src.write_bytes((DATA / "axolotl_qlora.yml").read_bytes())
    out_file = tmp_path / "qlora-fits.yml"
    code, out, err = run_cli(capsys, "suggest", "--config", str(src), "--gpu", "RTX 3060", "--offline",
                             "--write-config", str(out_file))
    assert code == 0, err
    assert "as edits to your config:" in out and "micro_batch_size: 2 -> 1" in out
    assert "wrote suggestion #1" in out and out_file.is_file()
    assert src.read_bytes() == (DATA / "axolotl_qlora.yml").read_bytes()  # never the original
    code, out, err = run_cli(capsys, "estimate", "--config", str(out_file), "--gpu", "RTX 3060", "--offline")
    assert code in (0, 4), err  # the edited copy fits (or is tight)
    code, out, err = run_cli(capsys, "suggest", "--config", str(src), "--gpu", "RTX 3060", "--offline",
                             "--write-config", str(out_file))
    assert code == 2 and "already exists" in err and "--force" in err
    code, out, err = run_cli(capsys, "suggest", "--config", str(src), "--gpu", "RTX 3060", "--offline",
                             "--write-config", str(out_file), "--force")
    assert code == 0, err
    code, out, err = run_cli(capsys, "suggest", "--config", str(src), "--gpu", "RTX 3060", "--offline",
                             "--write-config", str(src), "--force")
    assert code == 2 and "original" in err
    link = tmp_path / "link.yml"
    link.symlink_to(tmp_path / "elsewhere.yml")
    code, out, err = run_cli(capsys, "suggest", "--config", str(src), "--gpu", "RTX 3060", "--offline",
                             "--write-config", str(link), "--force")
    assert code == 2 and "symbolic link" in err and not (tmp_path / "elsewhere.yml").exists()


def test_cli_suggest_json_has_config_edits(capsys, tmp_path):
    _code, out, err = run_cli(capsys, "suggest", "--config", str(DATA / "axolotl_full_ds.yml"), "--config",
                             str(DATA / "zero3_bf16.json"), "--gpu", "RTX 4090", "--num-gpus", "2", "--json",
                             "--offline", "--write-config", str(tmp_path / "out"))
    data = json.loads(out)
    assert data["config_edits"] and data["config_edits"][0]["rank"] == 1
    for group in data["config_edits"]:
        for e in group["edits"]:
            assert e["format"] in ("axolotl", "deepspeed") and (e["key"] or e["note"])
    assert "wrote" in err or "nothing written" in err


def test_cli_recipe_with_config(capsys, tmp_path):
    code, out, err = run_cli(capsys, "recipe", "--config", str(DATA / "trl_qlora.yaml"), "--gpu", "RTX 4090",
                             "--out", str(tmp_path / "r"), "--offline")
    assert code == 0, err
    assert (tmp_path / "r" / "recipe.yaml").is_file() and "config: " in out


@pytest.mark.parametrize("content,needle", [
    (b"base_model: m\nadapter: [lora\n", "line 2"),
    (b"\xff\xfe\x00bad", "not UTF-8"),
])
def test_cli_bad_config_is_one_line_exit_2(capsys, tmp_path, content, needle):
    bad = tmp_path / "bad.yml"
    bad.write_bytes(content)
    code, _out, err = run_cli(capsys, "estimate", "--config", str(bad))
    assert code == 2 and needle in err and str(bad) in err and err.count("\n") == 1


def test_cli_refuses_a_huge_or_special_file_before_reading(capsys, tmp_path):
    huge = tmp_path / "huge.yml"
    with open(huge, "wb") as handle:
        handle.truncate(1 << 30)  # a sparse 1 GiB file: refused from its size, never read
    start = time.perf_counter()
    code, _out, err = run_cli(capsys, "estimate", "--config", str(huge))
    assert code == 2 and "at most 256 KB" in err and time.perf_counter() - start < 2
    code, _out, err = run_cli(capsys, "estimate", "--config", str(tmp_path))
    assert code == 2 and "not a regular file" in err
    code, _out, err = run_cli(capsys, "estimate", "--config", str(tmp_path / "missing.yml"))
    assert code == 2 and "cannot open" in err


# ------------------------------------------------------------------------------------------- MCP


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_mcp_tools_take_the_config_text():
    from mcp import Client

    from canifinetune.server.mcp_server import build_server

    text = (DATA / "llama3_lora_sft.yaml").read_text()
    async with Client(build_server(offline=True)) as client:
        est = await client.call_tool("estimate_memory", {"config": text, "gpu": "RTX 4090"})
        assert not est.is_error, est.content
        assert est.structured_content["plan"]["framework"] == "llama_factory"
        assert est.structured_content["config"]["files"][0]["format"] == "llama_factory"
        sug = await client.call_tool("suggest_cheaper_config", {"config": text, "gpu": "RTX 3060", "batch_size": 8})
        data = sug.structured_content
        assert {"field": "batch_size", "file_value": 1, "value": 8} in data["config"]["overrides"]
        assert data["config_edits"] and all(e["file"] == "config" for g in data["config_edits"] for e in g["edits"])
        assert "as edits to your config" in sug.content[0].text
        fmt = await client.call_tool("estimate_memory", {"config": "model_name_or_path: Qwen/Qwen2.5-0.5B\n",
                                                         "config_format": "llama_factory"})
        assert fmt.structured_content["plan"]["lora_r"] == 8
        recipe = await client.call_tool(
            "make_recipe", {"config": (DATA / "trl_qlora.yaml").read_text(), "gpu": "RTX 4090"}
        )
        assert not recipe.is_error and recipe.structured_content["config"]["framework"] == "trl"
        plain = await client.call_tool("estimate_memory", {"model": "Qwen/Qwen2.5-0.5B"})
        assert plain.structured_content.get("config") is None


@pytest.mark.anyio
@pytest.mark.parametrize("arguments,needle", [
    ({"config": "a: !!python/name:os.system\n"}, "YAML tag"),
    ({"config": "base_model: m\nadapter: qlora\n"}, "lora_r"),
    ({"config": "x" * (MAX_CONFIG_BYTES + 1)}, "262144"),
    ({"config": "a: 1\n", "config_format": "nope"}, "config_format"),
])
async def test_mcp_bad_config_is_a_tool_error(arguments, needle):
    from mcp import Client

    from canifinetune.server.mcp_server import build_server

    async with Client(build_server(offline=True)) as client:
        result = await client.call_tool("estimate_memory", arguments)
    text = result.content[0].text
    assert result.is_error and needle in text and text.startswith("estimate_memory:"), text


@pytest.mark.anyio
async def test_mcp_config_over_http_with_a_real_client():
    from mcp import Client
    from mcp_helpers import http_server

    text = (DATA / "axolotl_qlora.yml").read_text()
    with http_server(extra=["--offline"]) as (url, _proc):
        async with Client(url) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert "config" in tools["suggest_cheaper_config"].input_schema["properties"]
            result = await client.call_tool("suggest_cheaper_config", {"config": text, "gpu": "RTX 3060"})
    assert not result.is_error
    edits = result.structured_content["config_edits"][0]["edits"]
    assert any(e["key"] == "micro_batch_size" and e["old"] == 2 for e in edits)


# ------------------------------------------------------------------------------------------- packaging


def test_the_package_installs_as_canifinetune_estimator_configs(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import canifinetune.estimator.configs as c; print(c.__name__)"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0 and proc.stdout.strip() == "canifinetune.estimator.configs", proc.stderr


# ------------------------------------------------------------------------------------------- random shapes


def test_random_values_of_every_known_key_never_crash():
    """Every key the readers know, with values of every shape: a plan or a ConfigError, never another exception;
    and any edit of a plan that was read gives text that parses again."""
    import random

    import yaml

    from canifinetune.estimator.configs import detect, parse

    keys = sorted({k for markers in detect.MARKERS.values() for k in markers} | {
        "zero_optimization.stage", "zero_optimization.offload_optimizer.device", "deepspeed_config.zero_stage",
        "fsdp_config.fsdp_sharding_strategy", "fsdp_config.fsdp_offload_params", "lora_r", "lora_alpha", "load_in_4bit",
        "load_in_8bit", "lora_target_modules", "gradient_accumulation_steps", "gradient_checkpointing", "bf16.enabled"})
    pool = [None, True, False, "x", "auto", "all", "cpu", "lora", "qlora", "FULL_SHARD", 3, -1, 0, 1.5, 8, 10**12, [],
            {}, ["q_proj"], {"stage": 3}, "q_proj,v_proj", "bf16", "DEEPSPEED", "FSDP", "sft", "pt", "full", 2]
    rng = random.Random(16)
    plans = 0
    for _ in range(600):
        data: dict = {}
        for key in rng.sample(keys, rng.randint(1, 10)):
            node = data
            *parents, last = key.split(".")
            for part in parents:
                node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
            node[last] = rng.choice(pool)
        text = json.dumps(data) if rng.random() < 0.3 else yaml.safe_dump(data)
        fmt = rng.choice([None, "axolotl", "llama_factory", "trl", "transformers", "peft", "accelerate", "deepspeed"])
        try:
            cfg = load_configs([("f.json" if text.startswith("{") else "f.yaml", text)], formats=[fmt],
                               overrides={"model": "Qwen/Qwen2.5-0.5B"})
        except ConfigError:
            continue
        plans += 1
        try:
            new = cfg.plan.replace(batch_size=1, seq_len=256, optim="paged_adamw_8bit", num_gpus=2, sharding="zero3")
        except ValueError:
            new = cfg.plan.replace(batch_size=1)
        for name, edited in apply_edits(cfg, config_edits(cfg, new)).items():
            parse.parse(name, edited)
    assert plans > 50


def test_cli_config_format(capsys, tmp_path):
    bare = tmp_path / "x.yaml"
    bare.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\n")
    code, out, err = run_cli(capsys, "estimate", "--config", str(bare), "--json", "--offline")
    assert code == 2 and "cannot tell which framework" in err and "--config-format" in err  # TRL or LLaMA-Factory?
    code, out, err = run_cli(capsys, "estimate", "--config", str(bare), "--config-format", "llama_factory", "--json",
                             "--offline")
    assert code == 0, err
    assert json.loads(out)["plan"]["framework"] == "llama_factory" and json.loads(out)["plan"]["lora_r"] == 8
    odd = tmp_path / "odd.yaml"
    odd.write_text("foo: 1\n")
    code, out, err = run_cli(capsys, "estimate", "--config", str(odd))
    assert code == 2 and "--config-format" in err


@pytest.mark.parametrize("text,name", [
    ("base_model: Qwen/Qwen2.5-0.5B\nfp16: true\nbf16: false\nflash_attention: true\n", "ax.yml"),
    ('{"output_dir": "o", "fp16": true}', "args.json"),
])
def test_fp16_in_a_full_fine_tune_file_is_mixed_precision(text, name):
    """Trainer's fp16=True is AMP over fp32 parameters (it refuses fp16 gradients); LLaMA-Factory and Axolotl train
    through it: the plan is fp16 with fp32 masters, never the pure fp16 the plan refuses (issue 21.6)."""
    from canifinetune.estimator.configs import load_configs

    loaded = load_configs([(name, text)], overrides={"model": "Qwen/Qwen2.5-0.5B", "method": "full"})
    assert (loaded.plan.dtype, loaded.plan.precision) == ("fp16", "mixed")
    assert any(u.key == "fp16" and u.field == "precision" for u in loaded.report.used)
