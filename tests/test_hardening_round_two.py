"""Issue 22, "nothing lost, nothing silent, round two": each defect reproduced first, then fixed."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import stat
import warnings
from pathlib import Path

import pytest
from pydantic import ValidationError

from canifinetune.estimator.configs import ConfigError, config_edits, load_configs
from canifinetune.estimator.errors import CanIFinetuneError
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.plan import TrainingPlan

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
REFUSED = (CanIFinetuneError, ValidationError)


# ---------------------------------------------------------------- 8: GRPO settings TRL 1.16 refuses


@pytest.mark.parametrize("fields,field", [
    ({"generation_batch_size": 16, "steps_per_generation": 2}, "steps_per_generation"),  # "can not be both"
    ({"loss_type": "sigmoid"}, "loss_type"),  # a DPO loss
    ({"loss_type": "luspo"}, "loss_type"),  # needs importance_sampling_level 'sequence'
    ({"num_generations": 1}, "num_generations"),  # at least 2 for an advantage
    ({"use_vllm": True, "vllm_max_model_length": 512}, "vllm_max_model_length"),  # below seq_len 1024
    ({"generation_batch_size": 12, "num_generations": 4}, "generation_batch_size"),  # not a multiple of batch 8
])
def test_grpo_settings_trl_refuses_are_refused(fields, field):
    plan = TrainingPlan(model=MODEL, trainer="grpo", gpu="A100 80GB SXM", **fields)
    with pytest.raises(REFUSED) as info:
        estimate(plan)
    assert str(info.value).startswith(f"{field}:"), str(info.value)


def test_grpo_settings_trl_takes_are_taken():
    for fields in ({"generation_batch_size": 16}, {"steps_per_generation": 2}, {"loss_type": "dr_grpo"},
                   {"use_vllm": True, "vllm_max_model_length": 1024}, {"num_generations": 2}):
        est = estimate(TrainingPlan(model=MODEL, trainer="grpo", gpu="A100 80GB SXM", **fields))
        assert est.verdict == "fits"


# ---------------------------------------------------------------- what is estimated is what runs: adapter dtype


@pytest.mark.parametrize("method,adapter_dtype,expected", [
    ("lora", None, "float32"),  # PEFT keeps fp32 adapters on a 16-bit base (TRL's default)
    ("lora", "bf16", "bfloat16"),  # cohort v9 n04: the runtime ignored this and trained fp32 adapters
    ("qlora", None, "bfloat16"),  # TRL casts adapters to bf16 on a quantized base
    ("qlora", "fp32", "float32"),  # ... unless the plan says otherwise
])
def test_the_runtime_trains_the_adapter_dtype_the_estimate_counts(method, adapter_dtype, expected):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    if method == "qlora":
        pytest.importorskip("bitsandbytes")
    from canifinetune.estimator.model_sources import resolve_model
    from canifinetune.recipes import model_setup

    config = {**resolve_model("HuggingFaceTB/SmolLM2-135M").config, "num_hidden_layers": 1}
    plan = TrainingPlan(model="HuggingFaceTB/SmolLM2-135M", method=method, adapter_dtype=adapter_dtype,
                        gradient_checkpointing=False)
    with torch.device("meta"):
        model = model_setup.build_model(plan, config)
    dtypes = {str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.requires_grad}
    assert dtypes == {expected}


# ================================================================ the config files (issue 22: 1, 3, 4, 5, 6, 10, 11, A)

CONFIGS = Path(__file__).parent / "data" / "configs"
GRPO_FILE = ("model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct\nuse_peft: true\nnum_generations: 64\n"
             "generation_batch_size: 64\nuse_vllm: true\nvllm_gpu_memory_utilization: 0.9\n")
DPO_FILE = ("model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct\nuse_peft: true\nmax_length: 1024\nbeta: 0.3\n"
            "precompute_ref_log_probs: true\nloss_type: ipo\n")


def cli(*argv: str) -> tuple[int, str, str]:
    from canifinetune.server.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def report_text(cfg) -> str:
    r = cfg.report
    return json.dumps({"used": [u.key for u in r.used], "warned": [f"{w.key}: {w.message}" for w in r.not_modelled],
                       "ignored": r.ignored_keys})


# ---------------------------------------------------------------- 1: a TRL DPO or GRPO file is its trainer's


@pytest.mark.parametrize("trainer", [None, "grpo"])
def test_trl_grpo_file_is_estimated_as_grpo_like_the_same_plan_as_flags(trainer):
    overrides = {"gpu": "RTX 4090", **({"trainer": trainer} if trainer else {})}
    cfg = load_configs([("grpo.yaml", GRPO_FILE)], overrides=overrides)
    p = cfg.plan
    assert (p.trainer, p.num_generations, p.generation_batch_size, p.use_vllm, p.vllm_gpu_memory_utilization) == (
        "grpo", 64, 64, True, 0.9)
    assert not {"num_generations", "use_vllm", "vllm_gpu_memory_utilization"} & set(cfg.report.ignored_keys)
    flags = TrainingPlan(model="Qwen/Qwen2.5-0.5B-Instruct", method="lora", framework="trl", trainer="grpo",
                         num_generations=64, generation_batch_size=64, use_vllm=True, vllm_gpu_memory_utilization=0.9,
                         gpu="RTX 4090")
    from_file, from_flags = estimate(p), estimate(flags)
    assert from_file.verdict == from_flags.verdict == "does_not_fit"
    assert from_file.total_bytes == from_flags.total_bytes


def test_trl_grpo_file_through_the_cli_matches_the_flags(tmp_path):
    path = tmp_path / "grpo.yaml"
    path.write_text(GRPO_FILE)
    code, out, err = cli("estimate", "--config", str(path), "--trainer", "grpo", "--gpu", "RTX 4090", "--offline")
    flags = cli("estimate", "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--method", "lora", "--trainer", "grpo",
                "--num-generations", "64", "--generation-batch-size", "64", "--use-vllm",
                "--vllm-gpu-memory-utilization", "0.9", "--gpu", "RTX 4090", "--offline")
    assert code == flags[0] == 3, (err, flags[2])
    assert out.splitlines()[0] == flags[1].splitlines()[0]  # "DOES NOT FIT on RTX 4090: needs 24.21 GiB ..."
    assert "ignored" not in out.split("config:")[1] or "num_generations" not in out.split("ignored")[-1]


def test_trl_dpo_keys_are_read_into_the_plan():
    cfg = load_configs([("dpo.yaml", DPO_FILE)], overrides={"trainer": "dpo"})
    p = cfg.plan
    assert (p.trainer, p.beta, p.precompute_ref_log_probs, p.loss_type) == ("dpo", 0.3, True, "ipo")
    assert not {"beta", "precompute_ref_log_probs", "loss_type"} & set(cfg.report.ignored_keys)


def test_trl_keys_several_trainers_share_ask_for_the_trainer():
    with pytest.raises(ConfigError) as err:
        load_configs([("dpo.yaml", DPO_FILE)])
    text = str(err.value)
    assert "precompute_ref_log_probs" in text and "--trainer" in text and "dpo" in text and "kto" in text


@pytest.mark.parametrize("key,value,trainer", [
    ("num_generations", 4, "grpo"), ("label_smoothing", 0.1, "dpo"), ("desirable_weight", 1.0, "kto"),
    ("generate_during_eval", False, "orpo"), ("center_rewards_coefficient", 0.01, "reward"),
    ("completion_only_loss", True, "sft"),
])
def test_trl_trainer_is_detected_from_its_own_keys(key, value, trainer):
    text = f"model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct\nuse_peft: true\n{key}: {json.dumps(value)}\n"
    cfg = load_configs([("t.yaml", text)])
    assert cfg.plan.trainer == trainer
    assert key not in cfg.report.ignored_keys or trainer == "sft" or key in cfg.report.ignored_reasons


@pytest.mark.parametrize("text,given,needles", [
    (GRPO_FILE, "dpo", ["num_generations", "'dpo'", "--trainer"]),
    (DPO_FILE, "grpo", ["precompute_ref_log_probs", "'grpo'"]),
    ("model_name_or_path: m\nuse_peft: true\npacking: true\n", "dpo", ["packing", "'dpo'"]),
])
def test_trl_keys_of_another_trainer_than_the_one_given_are_an_error_naming_both(text, given, needles):
    with pytest.raises(ConfigError) as err:
        load_configs([("t.yaml", text)], overrides={"trainer": given})
    assert all(n in str(err.value) for n in needles), str(err.value)


def test_trl_keys_of_two_trainers_in_one_file_are_an_error():
    with pytest.raises(ConfigError, match="keys of different TRL trainers"):
        load_configs([("t.yaml", "model_name_or_path: m\nnum_generations: 4\ndesirable_weight: 1.0\n")])
    with pytest.raises(ConfigError, match="rloo trainer, which is not estimated"):
        load_configs([("t.yaml", "model_name_or_path: m\nnum_generations: 4\nnormalize_advantages: true\n")])


def test_trl_key_the_trainer_lacks_is_warned_not_dropped():
    cfg = load_configs([("g.yaml", GRPO_FILE + "max_length: 2048\n")])
    assert cfg.plan.seq_len == 1024  # GRPOConfig has no max_length: not read, and said
    assert "max_length: not a key of GRPOConfig" in report_text(cfg)
    assert "prompt-length" in report_text(cfg)


# ---------------------------------------------------------------- 3: control characters are one clear error


CONTROL = [("\x07", "U+0007"), ("\x00", "U+0000"), ("\x1b", "U+001B"), ("\x7f", "U+007F"), ("\x85", "U+0085"),
           ("\x9b", "U+009B"), ("\ufffe", "U+FFFE"), ("\u2028", "U+2028"), ("\x0c", "U+000C")]


@pytest.mark.parametrize("char,code", CONTROL, ids=[c[1] for c in CONTROL])
def test_a_control_character_is_a_config_error_naming_file_line_and_character(char, code):
    for name, text in (("c.yaml", f"base_model: m\nadapter: lora{char}\n"),
                       ("c.json", f'{{"per_device_train_batch_size": 2,\n "output_dir": "o{char}"}}')):
        with pytest.raises(ConfigError) as err:
            load_configs([(name, text.encode("utf-8"))], overrides={"model": MODEL})
        message = str(err.value)
        assert message.startswith(f"{name} line 2:") and code in message and "\n" not in message, message


@pytest.mark.parametrize("char,code", CONTROL[:4], ids=[c[1] for c in CONTROL[:4]])
def test_a_control_character_in_a_config_is_exit_2_on_the_command_line(tmp_path, char, code):
    path = tmp_path / "c.yaml"
    path.write_bytes(f"base_model: {MODEL}\nadapter: lora{char}\nlora_r: 8\n".encode())
    rc, _out, err = cli("estimate", "--config", str(path), "--offline")
    assert rc == 2 and "internal error" not in err and err.count("\n") == 1, err
    assert str(path) in err and "line 2" in err and code in err


def test_proc_self_environ_as_a_config_is_exit_2_without_showing_it():
    if not Path("/proc/self/environ").exists():
        pytest.skip("no /proc on this system")
    rc, _out, err = cli("estimate", "--config", "/proc/self/environ", "--offline")
    assert rc == 2 and "internal error" not in err and err.count("\n") == 1, err
    assert "/proc/self/environ" in err and "U+0000" in err and "PATH=" not in err


def test_a_control_character_over_mcp_is_a_tool_error_without_a_traceback(caplog):
    from mcp.server.mcpserver.exceptions import ToolError

    from canifinetune.server.mcp_server import estimate_memory_impl

    with pytest.raises(ToolError) as err:
        estimate_memory_impl({"config": f"base_model: {MODEL}\nadapter: lora\x07\nlora_r: 8\n"}, offline=True)
    text = str(err.value)
    assert "config line 2" in text and "U+0007" in text and "internal error" not in text, text
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


# ---------------------------------------------------------------- 4: two files of one name, one folder


def test_write_config_refuses_two_edited_files_of_the_same_name(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "l").mkdir()
    training, launcher = tmp_path / "t" / "cfg.yaml", tmp_path / "l" / "cfg.yaml"
    training.write_text((CONFIGS / "trl_sft.yaml").read_text())
    launcher.write_text((CONFIGS / "fsdp_accelerate.yaml").read_text().replace("num_processes: 8", "num_processes: 2"))
    out = tmp_path / "out"
    rc, stdout, err = cli("suggest", "--config", str(training), "--config", str(launcher), "--gpu", "RTX 3060",
                          "--keep", "method", "--keep", "seq_len", "--offline", "--write-config", str(out))
    assert "l/cfg.yaml: fsdp_config" in stdout and "t/cfg.yaml: per_device_train_batch_size" in stdout  # both edited
    assert rc == 2 and "cfg.yaml" in err and "both" in err and "nothing written" in err, (rc, stdout, err)
    assert not out.exists() or not any(out.iterdir())


def test_write_edited_refuses_two_files_of_one_name_before_writing(tmp_path):
    from canifinetune.server.config_face import write_edited

    (tmp_path / "t").mkdir()
    (tmp_path / "d").mkdir()
    training, ds = tmp_path / "t" / "cfg.json", tmp_path / "d" / "cfg.json"
    training.write_text((CONFIGS / "training_args.json").read_text())
    ds.write_text('{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}')
    cfg = load_configs([(str(training), training.read_bytes()), (str(ds), ds.read_bytes())],
                       overrides={"model": MODEL, "num_gpus": 2})
    plan = cfg.plan.replace(batch_size=1, sharding="zero3")
    assert {e.file for e in config_edits(cfg, plan) if e.key} == {str(training), str(ds)}
    with pytest.raises(ConfigError, match="would both be written as"):
        write_edited(cfg, plan, str(tmp_path / "out"), force=False)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- 5: each edited copy is read back before writing


ODD_YAML = {
    "document_end": "base_model: Qwen/Qwen2.5-7B\nadapter: lora\nlora_r: 16\nsequence_len: 4096\nmicro_batch_size: 8\n"
                    "...\n",
    "indented": "  base_model: Qwen/Qwen2.5-7B\n  adapter: lora\n  lora_r: 16\n  sequence_len: 4096\n"
                "  micro_batch_size: 8\n",
    "flow_after_comment": "# my run\n{base_model: Qwen/Qwen2.5-7B, adapter: lora, lora_r: 16, sequence_len: 4096, "
                          "micro_batch_size: 8}\n",
    "document_start_and_end": "---\nbase_model: Qwen/Qwen2.5-7B\nadapter: lora\nlora_r: 16\nsequence_len: 4096\n"
                              "micro_batch_size: 8\n...\n",
}


@pytest.mark.parametrize("label", sorted(ODD_YAML))
def test_write_config_copies_read_back_to_the_suggested_plan(tmp_path, label):
    src = tmp_path / "ax.yml"
    src.write_text(ODD_YAML[label])
    out = tmp_path / "fits.yml"
    rc, stdout, err = cli("suggest", "--config", str(src), "--gpu", "RTX 3060", "--offline", "--json",
                          "--write-config", str(out))
    assert rc in (0, 3, 4) and "internal error" not in err, err
    assert "wrote suggestion #1" in err, err  # --json: the plain lines go to stderr
    suggested = json.loads(stdout)["suggestions"][0]["plan"]
    again = load_configs([(str(out), out.read_bytes())], overrides={"gpu": "RTX 3060"}).plan
    for field in ("method", "seq_len", "batch_size", "gradient_checkpointing", "loss_implementation"):
        assert getattr(again, field) == suggested[field], (field, out.read_text())


def test_an_edited_copy_that_does_not_read_back_is_not_written(tmp_path, monkeypatch):
    from canifinetune.estimator.configs import edits

    src = tmp_path / "ax.yml"
    src.write_text((CONFIGS / "axolotl_qlora.yml").read_text())
    out = tmp_path / "fits.yml"
    monkeypatch.setattr(edits, "yaml_set", lambda text, key, value, name="config": text)  # an edit that is lost
    rc, _out, err = cli("suggest", "--config", str(src), "--gpu", "RTX 3060", "--offline", "--write-config", str(out))
    assert rc == 2 and "reads back differently" in err and "nothing written" in err, err
    assert not out.exists()


def test_a_broken_edited_text_blames_the_copy_not_the_users_file(tmp_path, monkeypatch):
    from canifinetune.estimator.configs import edits

    src = tmp_path / "ax.yml"
    src.write_text((CONFIGS / "axolotl_qlora.yml").read_text())
    out = tmp_path / "fits.yml"
    monkeypatch.setattr(edits, "yaml_set", lambda text, key, value, name="config": text + "  : [\n")
    rc, _out, err = cli("suggest", "--config", str(src), "--gpu", "RTX 3060", "--offline", "--write-config", str(out))
    assert rc == 2 and "edited copy" in err and "nothing written" in err, err
    assert not out.exists()


# ---------------------------------------------------------------- 6: the copy keeps mode, line endings, comments, order


def test_edited_copy_keeps_mode_line_endings_comments_and_order(tmp_path):
    original = (CONFIGS / "axolotl_qlora.yml").read_text().replace("\n", "\r\n")
    src = tmp_path / "qlora.yml"
    src.write_bytes(b"\xef\xbb\xbf" + original.encode())
    os.chmod(src, 0o640)
    out = tmp_path / "fits.yml"
    rc, stdout, err = cli("suggest", "--config", str(src), "--gpu", "RTX 3060", "--offline", "--write-config", str(out))
    assert rc in (0, 3, 4) and "wrote" in stdout, err
    data = out.read_bytes()
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert data.startswith(b"\xef\xbb\xbf")
    text = data[3:].decode()
    assert "\r\n" in text and "\n" not in text.replace("\r\n", "")
    assert "# optionally might have model_type or tokenizer_type" in text
    keys = [line.split(":")[0] for line in text.splitlines() if line and line[0] not in " #-"]
    original_keys = [line.split(":")[0] for line in original.splitlines() if line and line[0] not in " #-"]
    assert keys[: len(original_keys)] == original_keys


def test_edited_copy_of_a_0644_file_is_0644_and_json_keeps_crlf(tmp_path):
    src = tmp_path / "args.json"
    src.write_bytes((CONFIGS / "training_args.json").read_text().replace("\n", "\r\n").encode())
    os.chmod(src, 0o644)
    out = tmp_path / "out.json"
    rc, stdout, err = cli("suggest", "--config", str(src), "--model", "Qwen/Qwen2.5-7B", "--gpu", "RTX 3060",
                          "--offline", "--write-config", str(out))
    assert rc in (0, 3, 4) and "wrote" in stdout, err
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    text = out.read_bytes().decode()
    assert "\r\n" in text and "\n" not in text.replace("\r\n", "")
    assert list(json.loads(text))[:3] == ["output_dir", "per_device_train_batch_size", "gradient_accumulation_steps"]


# ---------------------------------------------------------------- 10: nonsense sharding values are errors


@pytest.mark.parametrize("line,key", [
    ("fsdp: 7", "fsdp"), ("fsdp_version: 9", "fsdp_version"), ("deepspeed: 7", "deepspeed"),
    ("fsdp_config: 7", "fsdp_config"), ("fsdp: [full_shard, sideways]", "fsdp"), ("fsdp: [no_shard]", "fsdp"),
    ("fsdp_config: {fsdp_version: 3}", "fsdp_config.fsdp_version"),
    ("fsdp_config: {reshard_after_forward: maybe}", "fsdp_config.reshard_after_forward"),
])
def test_axolotl_sharding_nonsense_is_an_error_naming_the_key(line, key):
    text = f"base_model: {MODEL}\nadapter: lora\nlora_r: 8\n{line}\n"
    with pytest.raises(ConfigError) as err:
        load_configs([("a.yml", text)])
    message = str(err.value)
    assert f"a.yml line 4: {key}:" in message and ("expected" in message or "not" in message), message


@pytest.mark.parametrize("text,key", [
    ('{"fsdp": 7, "per_device_train_batch_size": 2}', "fsdp"),
    ('{"deepspeed": 7, "per_device_train_batch_size": 2}', "deepspeed"),
])
def test_training_arguments_sharding_nonsense_is_an_error(text, key):
    with pytest.raises(ConfigError, match=rf"t.json line 1: {key}: expected"):
        load_configs([("t.json", text)], overrides={"model": MODEL})


def test_axolotl_fsdp_version_alone_cites_only_keys_the_file_has():
    cfg = load_configs([("a.yml", f"base_model: {MODEL}\nadapter: lora\nlora_r: 8\nfsdp_version: 2\n")])
    assert cfg.plan.sharding == "none"
    assert all(u.key in ("base_model", "adapter", "lora_r", "fsdp_version") for u in cfg.report.used)
    assert "fsdp_version: fsdp_version without fsdp_config" in report_text(cfg)
    sharded = load_configs([("a.yml", f"base_model: {MODEL}\nadapter: lora\nlora_r: 8\nfsdp_version: 2\n"
                                      "fsdp_config:\n  reshard_after_forward: true\n  offload_params: true\n")])
    assert (sharded.plan.sharding, sharded.plan.offload_params) == ("fsdp_full_shard", True)


# ---------------------------------------------------------------- 11: every field a reader sets has an edit back


AXOLOTL_8BIT = f"base_model: {MODEL}\nadapter: lora\nload_in_8bit: true\nlora_r: 16\nsequence_len: 2048\n"


def test_axolotl_turning_8bit_off_edits_load_in_8bit():
    cfg = load_configs([("a.yml", AXOLOTL_8BIT)])
    for change, expected in (({"method": "qlora", "load_in_8bit": False},
                              {"adapter": "qlora", "load_in_4bit": True, "load_in_8bit": False}),
                             ({"load_in_8bit": False}, {"load_in_8bit": False}),
                             ({"method": "full", "load_in_8bit": False}, {"adapter": None, "load_in_8bit": False})):
        edits = config_edits(cfg, cfg.plan.replace(**change))
        assert all(e.key for e in edits), [e.model_dump() for e in edits]
        assert {e.key: e.new for e in edits} == expected


def _plans(fmt: str) -> list[tuple[str, str, dict]]:
    """(label, file text, overrides) per format: the files whose every settable field is changed below."""
    return {
        "axolotl": [("lora8", AXOLOTL_8BIT, {}), ("qlora", (CONFIGS / "axolotl_qlora.yml").read_text(), {}),
                    ("full", f"base_model: {MODEL}\nmicro_batch_size: 2\nbf16: false\n", {})],
        "llama_factory": [("lora", (CONFIGS / "llama3_lora_sft.yaml").read_text(), {}),
                          ("qlora", (CONFIGS / "llama3_qlora_bnb.yaml").read_text(), {})],
        "trl": [("sft", (CONFIGS / "trl_sft.yaml").read_text(), {}), ("qlora", (CONFIGS / "trl_qlora.yaml").read_text(),
                                                                        {}),
                ("grpo", GRPO_FILE, {}), ("dpo", DPO_FILE, {"trainer": "dpo"})],
        "transformers": [("args", (CONFIGS / "training_args.json").read_text(), {"model": MODEL}),
                         ("args-lora", (CONFIGS / "training_args.json").read_text(),
                          {"model": MODEL, "method": "lora"})],
        "peft": [("adapter", (CONFIGS / "adapter_config.json").read_text(), {})],
    }[fmt]


CHANGES: dict[str, list] = {  # plan field -> values to move it to (those a reader can say)
    "model": ["Qwen/Qwen2.5-1.5B"], "method": ["full", "lora", "qlora"], "load_in_8bit": [True, False],
    "lora_r": [4], "lora_alpha": [7], "lora_dropout": [0.2], "target_modules": [["q_proj", "o_proj"], "all-linear"],
    "modules_to_save": [["lm_head"]], "use_dora": [True, False], "seq_len": [777], "batch_size": [3],
    "gradient_accumulation_steps": [5], "packing": [True, False], "padding_free": [True, False],
    "optim": ["paged_adamw_8bit", "adamw_torch"], "gradient_checkpointing": [True, False],
    "attn_implementation": ["eager", "sdpa"],
    "dtype": ["fp16", "bf16"], "loss_implementation": ["chunked"], "bnb_4bit_quant_type": ["fp4"],
    "bnb_4bit_use_double_quant": [True, False], "sharding": ["zero2", "zero3", "fsdp_full_shard"],
    "offload_optimizer": [True], "offload_params": [True], "num_gpus": [4],
    "precompute_ref_log_probs": [False], "loss_type": ["hinge"], "beta": [0.5], "num_generations": [16],
    "max_completion_length": [256], "generation_batch_size": [128], "steps_per_generation": [8],
    "use_vllm": [False], "vllm_mode": ["server"], "vllm_gpu_memory_utilization": [0.5],
    "vllm_max_model_length": [1024], "activation_offloading": [True, False],
}
# the trainer is `trl <trainer>`, the command: a note, not a key; GRPOConfig has no prompt length (the GRPO reader
# never sets seq_len either)
KEYLESS_BY_DESIGN = {("trl", "*", "trainer"), ("trl", "grpo", "seq_len")}


@pytest.mark.parametrize("fmt", ["axolotl", "llama_factory", "trl", "transformers", "peft"])
def test_every_field_a_reader_sets_has_an_edit_back(fmt):
    from canifinetune.estimator.configs.combine import READERS
    from canifinetune.estimator.configs.edits import edited_copies

    fields = READERS[fmt].FIELDS
    tried: set[str] = set()
    for label, text, overrides in _plans(fmt):
        name = "f.json" if text.lstrip().startswith("{") else "f.yaml"
        cfg = load_configs([(name, text)], formats=[fmt], overrides=overrides)
        for field in fields:
            if {(fmt, "*", field), (fmt, label, field)} & KEYLESS_BY_DESIGN or field not in CHANGES:
                continue
            if field in NO_OTHER_VALUE.get(fmt, set()):
                continue
            for value in CHANGES[field]:
                if value in CANNOT_SAY.get((fmt, field), ()):
                    continue
                plan = _moved(cfg.plan, field, value)
                if plan is None:
                    continue
                edits = config_edits(cfg, plan)
                keyless = [e for e in edits if e.key is None and field in e.fields]
                assert not keyless, (fmt, label, field, value, [e.model_dump() for e in edits])
                copies = edited_copies(cfg, plan)  # read back by the same reader: raises when it does not
                assert copies or getattr(cfg.plan, field) == value, (fmt, label, field, value)
                tried.add(field)
    missing = {f for f in fields if (fmt, "*", f) not in KEYLESS_BY_DESIGN} - tried
    assert not missing - NO_OTHER_VALUE.get(fmt, set()), (fmt, sorted(missing))


# an adapter_config.json is LoRA: the reader says method lora only; torch_compile true is refused by the plan, so no
# plan moves it off false
NO_OTHER_VALUE = {"peft": {"method"}, **{fmt: {"torch_compile"} for fmt in ("axolotl", "llama_factory", "trl",
                                                                             "transformers")}}
# values no key of the format says (the reader never gives them): a note instead (LLaMA-Factory's FSDP is accelerate's;
# TrainingArguments has no dtype key, so fp32 is the script's)
CANNOT_SAY = {("llama_factory", "sharding"): {"fsdp_full_shard"}, ("transformers", "dtype"): {"fp32"}}


def _moved(plan, field: str, value):
    """``plan`` with ``field`` moved to ``value`` (with what that value needs), or None when it cannot be."""
    if getattr(plan, field) == value:
        return None
    extra: dict = {}
    if field == "load_in_8bit":
        extra = {"method": "lora"} if value else {}
    if field in ("bnb_4bit_quant_type", "bnb_4bit_use_double_quant"):
        extra = {"method": "qlora", "load_in_8bit": False}
    if field == "method":
        extra = {"load_in_8bit": False}
    if field in ("offload_optimizer", "offload_params"):
        extra = {"sharding": "zero3"}
    if field == "num_gpus":
        extra = {"sharding": "ddp"}
    if field == "steps_per_generation":
        extra = {"generation_batch_size": None}
    if field == "generation_batch_size":
        extra = {"steps_per_generation": None}
    if plan.method == "full" and field in ("lora_r", "lora_alpha", "lora_dropout", "target_modules",
                                           "modules_to_save", "use_dora"):
        return None  # adapter settings of a full fine-tune say nothing
    try:
        moved = plan.replace(**{field: value, **extra})
        estimate_ready = moved.model_copy()
        from canifinetune.estimator.trainers import check_supported

        if moved.trainer != "sft":
            check_supported(estimate_ready)
        return moved
    except (ValueError, CanIFinetuneError):
        return None


def test_every_plan_field_a_reader_sets_is_declared():
    """The fields each reader sets, over the example files and a set of variants, are its FIELDS."""
    from canifinetune.estimator.configs.combine import READERS

    samples = [[n] for n in sorted(p.name for p in CONFIGS.iterdir())]
    texts = [("a.yml", AXOLOTL_8BIT), ("a.yml", f"base_model: {MODEL}\nfsdp_config:\n  activation_checkpointing: "
                                                 "true\n  offload_params: true\ncut_cross_entropy: true\n"),
             ("g.yaml", GRPO_FILE), ("d.yaml", DPO_FILE), ("t.yaml", "model_name_or_path: m\nuse_peft: true\n"
                                                                    "padding_free: true\nload_in_8bit: true\n")]
    loaded = [load_configs([(str(CONFIGS / n[0]), (CONFIGS / n[0]).read_bytes())], overrides={"model": MODEL})
              for n in samples]
    loaded += [load_configs([t], overrides={"trainer": "dpo"} if t[0] == "d.yaml" else {}) for t in texts]
    for cfg in loaded:
        for r in cfg.readings:
            fields = {u.field for u in r.used if u.field}
            assert fields <= set(READERS[r.format].FIELDS), (r.doc.name, fields - set(READERS[r.format].FIELDS))


# ---------------------------------------------------------------- A: every key of every format is classified


def _schema(*classes) -> dict[str, object]:
    out: dict[str, object] = {}
    for cls in classes:
        for f in dataclasses.fields(cls):
            out.setdefault(f.name, f.default if f.default is not dataclasses.MISSING else None)
    return out


def _installed_schemas() -> dict[str, dict[str, object]]:
    """Each format's full key list from its framework's own config classes, where the package is installed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers = pytest.importorskip("transformers")  # transformers 5.x
        trl = pytest.importorskip("trl")  # trl 1.16
        peft = pytest.importorskip("peft")
        accelerate_args = pytest.importorskip("accelerate.commands.config.config_args")
        from trl.experimental.orpo import ORPOConfig
        from trl.scripts.grpo import GRPOScriptArguments
        from trl.scripts.utils import DatasetMixtureConfig
    ta = _schema(transformers.TrainingArguments)
    return {
        "transformers": ta,
        "trl": _schema(trl.SFTConfig, trl.DPOConfig, ORPOConfig, trl.KTOConfig, trl.RewardConfig, trl.GRPOConfig,
                       trl.ModelConfig, trl.ScriptArguments, DatasetMixtureConfig, GRPOScriptArguments),
        "peft": _schema(peft.LoraConfig),
        "accelerate": _schema(accelerate_args.ClusterConfig),
    }


def test_the_schemas_walked_are_the_versions_the_readers_name():
    import accelerate
    import peft
    import transformers
    import trl

    assert trl.__version__.startswith("1.16") and transformers.__version__.startswith("5.")
    assert peft.__version__ >= "0.17" and accelerate.__version__.startswith("1.")


@pytest.mark.parametrize("fmt", ["transformers", "trl", "peft", "accelerate"])
def test_every_key_of_the_frameworks_own_schema_is_classified(fmt):
    """Each key of the framework's config classes is read, warned about as not modelled, or ignored with a reason;
    no key is unclassified, and no key the readers read or warn about is in the ignore table."""
    from canifinetune.estimator.configs.combine import READERS

    module = READERS[fmt]
    schema = _installed_schemas()[fmt]
    warned = {k for k, v in module.NOT_MODELLED.items()}
    unclassified = sorted(k for k in schema if k not in module.READS and k not in warned and k not in module.IGNORED)
    assert not unclassified, (fmt, unclassified)
    assert not set(module.IGNORED) & (set(module.READS) | warned), sorted(set(module.IGNORED) & (set(module.READS)
                                                                                                   | warned))
    assert all(isinstance(why, str) and len(why) > 8 for why in module.IGNORED.values())


@pytest.mark.parametrize("fmt", ["transformers", "trl", "peft", "accelerate"])
def test_each_schema_key_in_a_file_is_used_warned_or_ignored_with_its_reason(fmt):
    """Every key of the schema, set in a file to its own default: never the 'does not have' warning."""
    schema = _installed_schemas()[fmt]
    base = {"transformers": {}, "trl": {"model_name_or_path": MODEL}, "peft": {"peft_type": "LORA", "r": 8},
            "accelerate": {"distributed_type": "NO"}}[fmt]
    for key, default in schema.items():
        try:
            value = json.loads(json.dumps(default))
        except (TypeError, ValueError):
            value = None
        text = json.dumps({**base, key: value})
        try:
            cfg = load_configs([("f.json", text)], formats=[fmt], overrides={"model": MODEL})
        except ConfigError as exc:  # a value the reader checks and refuses: read, and named
            assert key in str(exc) or "trainer" in str(exc) or "generation" in str(exc), (key, str(exc))
            continue
        r = cfg.readings[0]
        unknown = [w.message for w in r.warnings if "does not have" in w.message]
        assert not unknown, (fmt, key, unknown)
        if key in cfg.report.ignored_keys:
            assert cfg.report.ignored_reasons[key], key


def test_the_trainer_key_table_is_trl_1_16s():
    from canifinetune.estimator.configs import trl as reader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trl = pytest.importorskip("trl")
        from trl.experimental.orpo import ORPOConfig
    classes = {"sft": trl.SFTConfig, "dpo": trl.DPOConfig, "orpo": ORPOConfig, "kto": trl.KTOConfig,
               "reward": trl.RewardConfig, "grpo": trl.GRPOConfig}
    keys = {t: {f.name for f in dataclasses.fields(c)} for t, c in classes.items()}
    every = set.intersection(*keys.values())
    expected = {k: tuple(t for t in classes if k in keys[t]) for k in set.union(*keys.values()) - every}
    assert expected == reader.KEY_TRAINERS
    from canifinetune.estimator.trainers import TRAINER_FIELDS

    assert set(reader.TRAINER_KEYS) == set(TRAINER_FIELDS) - {"reference_model"}  # TRL's names, each one read
    for key in reader.TRAINER_KEYS:
        assert set(TRAINER_FIELDS[key]) <= set(reader.KEY_TRAINERS[key]), key


def _words(text: str) -> list[str]:
    return text.split()


AXOLOTL_DOCUMENTED = _words(
    "base_model adapter load_in_4bit load_in_8bit lora_r lora_alpha lora_dropout lora_target_modules "
    "lora_target_linear lora_modules_to_save peft_use_dora sequence_len micro_batch_size batch_size "
    "gradient_accumulation_steps "
    "sample_packing optimizer gradient_checkpointing flash_attention sdp_attention eager_attention bf16 fp16 "
    "cut_cross_entropy deepspeed fsdp fsdp_version fsdp_config rl unfrozen_parameters lora_layers_to_transform "
    "lora_mlp_kernel tiled_mlp fp8 torch_compile activation_offloading gpu_memory_limit max_memory "
    "chunked_cross_entropy")
LLAMA_FACTORY_DOCUMENTED = _words("model_name_or_path stage finetuning_type quantization_bit quantization_method "
                            "quantization_type double_quantization lora_rank lora_alpha lora_dropout lora_target "
                            "additional_target use_dora cutoff_len per_device_train_batch_size "
                            "gradient_accumulation_steps disable_gradient_checkpointing flash_attn bf16 fp16 optim "
                            "deepspeed use_unsloth use_unsloth_gc enable_liger_kernel upcast_layernorm "
                            "upcast_lmhead_output pure_bf16 neat_packing shift_attn use_llama_pro train_mm_proj_only "
                            "torch_compile use_kt")


@pytest.mark.parametrize("fmt,keys", [("axolotl", AXOLOTL_DOCUMENTED), ("llama_factory", LLAMA_FACTORY_DOCUMENTED)])
def test_documented_keys_of_uninstalled_frameworks_are_classified(fmt, keys):
    """Axolotl and LLaMA-Factory are not installed here: their readers' documented key lists (docs/configs.md) are
    walked instead of the frameworks' schemas."""
    from canifinetune.estimator.configs.combine import READERS

    module = READERS[fmt]
    docs = (Path(__file__).parent.parent / "docs" / "configs.md").read_text()
    for key in keys:
        assert re.search(rf"`{key}[`:\s/]", docs), key  # `key`, `key: value`
        assert key in module.READS or key in module.NOT_MODELLED or key in module.IGNORED, key
    assert not set(module.IGNORED) & (set(module.READS) | set(module.NOT_MODELLED))
    assert "covers the installed frameworks only" in docs


def test_the_ignored_list_carries_each_reason(tmp_path):
    cfg = load_configs([(str(CONFIGS / "axolotl_qlora.yml"), (CONFIGS / "axolotl_qlora.yml").read_bytes())])
    reasons = cfg.report.ignored_reasons
    assert set(reasons) == set(cfg.report.ignored_keys) and all(reasons.values())
    assert "logging" in reasons["logging_steps"] and "datasets" in reasons["datasets"]
    rc, out, err = cli("estimate", "--config", str(CONFIGS / "axolotl_qlora.yml"), "--offline")
    assert rc in (0, 3, 4), err
    assert "logging_steps" in out and "(logging and tracking only)" in out


@pytest.mark.parametrize("fmt,text", [
    ("trl", "model_name_or_path: m\nuse_peft: true\nper_device_train_batchsize: 4\n"),
    ("axolotl", f"base_model: {MODEL}\nmicro_batchsize: 4\n"),
    ("transformers", '{"per_device_train_batchsize": 4}'),
])
def test_a_key_no_reader_knows_is_warned_not_ignored(fmt, text):
    name = "f.json" if text.startswith("{") else "f.yaml"
    cfg = load_configs([(name, text)], formats=[fmt], overrides={"model": MODEL})
    assert "batchsize" not in " ".join(cfg.report.ignored_keys)
    assert "does not have, not read" in report_text(cfg) and "batchsize" in report_text(cfg)


@pytest.mark.parametrize("fmt", ["axolotl", "llama_factory", "trl", "transformers", "peft", "accelerate", "deepspeed"])
def test_a_key_that_changes_memory_is_never_listed_as_ignored(fmt):
    """Every not-modelled key, set on, is warned about, never ignored."""
    from canifinetune.estimator.configs.combine import READERS

    module = READERS[fmt]
    base = {"axolotl": {"base_model": MODEL}, "llama_factory": {"model_name_or_path": MODEL, "stage": "sft"},
            "trl": {"model_name_or_path": MODEL}, "transformers": {}, "peft": {"peft_type": "LORA"},
            "accelerate": {"distributed_type": "NO"}, "deepspeed": {"zero_optimization": {"stage": 2}}}[fmt]
    for key, message in module.NOT_MODELLED.items():
        if message is None or "." in key:
            continue
        on = {"optimizer": {"type": "Lamb"}, "env": {"PYTORCH_CUDA_ALLOC_CONF": "x"},
              "dynamo_config": {"dynamo_backend": "INDUCTOR"}}.get(key, True)
        try:
            cfg = load_configs([("f.json", json.dumps({**base, key: on}))], formats=[fmt], overrides={"model": MODEL})
        except ConfigError as exc:
            assert key in str(exc), (fmt, key, str(exc))
            continue
        assert key not in cfg.report.ignored_keys, (fmt, key)
        assert any(w.key and w.key.split(".")[0] == key for w in cfg.report.not_modelled) or any(
            u.key.split(".")[0] == key for u in cfg.report.used), (fmt, key, report_text(cfg))


# ---------------------------------------------------------------- issue 27 x configs: several machines in a file


def test_accelerate_num_machines_is_nodes():
    from canifinetune.estimator.configs import load_configs

    acc = "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\nnum_processes: 8\nnum_machines: 2\n"
    loaded = load_configs([("acc.yaml", acc)], overrides={"model": MODEL})
    assert (loaded.plan.num_gpus, loaded.plan.num_nodes, loaded.plan.gpus_per_node) == (8, 2, 4)
    with pytest.raises(CanIFinetuneError, match="num_machines"):
        load_configs([("acc.yaml", acc.replace("num_processes: 8", "num_processes: 7"))], overrides={"model": MODEL})


@pytest.mark.parametrize("sharding", ["zero3_hpz", "fsdp_hybrid_shard"])
def test_multi_node_shardings_as_config_edits_are_said_not_crashed(sharding, tmp_path):
    """The shardings only a multi-node recipe expresses become one keyless edit naming the recipe's files."""
    from canifinetune.estimator.configs import load_configs
    from canifinetune.estimator.configs.edits import config_edits

    acc = "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\nnum_processes: 8\nnum_machines: 2\n"
    loaded = load_configs([("acc.yaml", acc)], overrides={"model": MODEL})
    edits = config_edits(loaded, loaded.plan.replace(sharding=sharding))
    assert any(e.key is None and sharding in (e.note or "") for e in edits)
