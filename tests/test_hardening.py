"""Issue 14: nothing lost, nothing silent. Each finding of the attack report, reproduced, and what it now gets.

1. recipe writing never replaces a file without --force, writes all files or none, refuses links;
2. `train` keeps its output inside the recipe folder after resolving links and never trains on the CPU silently;
3. a name resolves to exactly one model or is an error (a path is only a local folder);
4. bounded work: keep lists, config.json lists, non-regular files;
5. no internal errors and no raw text: huge numbers, hostile model_type, tampered recipe.yaml;
6. safetensors parameter counts (Hub and local) are checked before they are used;
7. minor: the same error for any path, plain decimal numbers, zero-width characters, HTTP limits and auth.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from canifinetune.estimator.errors import MAX_ERROR_CHARS, ModelConfigError, PlanError, UnknownModelError, safe_text
from canifinetune.estimator.model_sources import local_safetensors_params, read_config_file, resolve_model
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.estimator.spec import ModelSpec
from canifinetune.recipes.render import FILE_NAMES, make_recipe, write_recipe
from canifinetune.recipes.schema import RecipeError, load_recipe
from canifinetune.server.cli import main as cli_main

MODEL = "Qwen/Qwen2.5-0.5B"
TINY = {
    "model_type": "llama", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 256, "tie_word_embeddings": False,
}
RECIPE = ["recipe", "--model", MODEL, "--gpu", "RTX 4090", "--offline"]


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _stderr_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line
    assert "internal error" not in err and "Traceback" not in err
    return err


def _folder(tmp_path: Path, name: str, config: dict) -> Path:
    folder = tmp_path / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def _cpu_seconds(fn):
    start = time.process_time()
    result = fn()
    return result, time.process_time() - start


# ------------------------------------------------------------------------------------ 1. recipe writing


def test_recipe_never_replaces_the_users_files_without_force(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    mine = {"requirements.txt": "numpy\n", "launch.sh": "echo mine\n", "recipe.yaml": "mine: 1\n"}
    for name, text in mine.items():
        (tmp_path / name).write_text(text)
    assert cli_main([*RECIPE, "--out", "."]) == 2
    assert "already exists" in _stderr_line(capsys) and "--force" in capsys.readouterr().err + "--force"
    assert {n: (tmp_path / n).read_text() for n in mine} == mine  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(mine)  # and nothing else written
    assert cli_main([*RECIPE, "--out", ".", "--force"]) == 0
    capsys.readouterr()
    assert (tmp_path / "recipe.yaml").read_text().startswith("# canifinetune recipe")
    written = sorted(p.name for p in tmp_path.iterdir())
    assert set(written) <= set(FILE_NAMES) and "recipe.yaml" in written  # the recipe's own files, no temp folder


def test_out_must_name_a_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for out in ("", "  "):
        assert cli_main([*RECIPE, "--out", out]) == 2
        assert "--out" in _stderr_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_a_hard_link_is_refused_even_with_force(tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    os.link(elsewhere, out / "requirements.txt")
    for extra in ([], ["--force"]):
        assert cli_main([*RECIPE, "--out", str(out), *extra]) == 2
        assert "hard link" in _stderr_line(capsys)
    assert elsewhere.read_text() == "precious\n"
    assert sorted(p.name for p in out.iterdir()) == ["requirements.txt"]  # nothing written before the refusal


def test_a_symlink_is_refused_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "launch.sh").symlink_to(tmp_path / "target.sh")  # late in the write order: nothing may precede it
    assert cli_main([*RECIPE, "--out", str(out), "--force"]) == 2
    assert "symbolic link" in _stderr_line(capsys)
    assert sorted(p.name for p in out.iterdir()) == ["launch.sh"]
    assert not (tmp_path / "target.sh").exists()


def test_recipe_files_are_written_all_or_none(tmp_path, monkeypatch):
    recipe = make_recipe(TrainingPlan(model=MODEL, gpu="RTX 4090"))
    out = tmp_path / "out"
    out.mkdir()
    (out / "ESTIMATE.txt").write_text("old estimate\n")
    real_link, real_rename = os.link, os.rename

    def no_links(src, dst, *args, **kwargs):  # a file system without hard links: the rename fallback
        raise PermissionError(1, "Operation not permitted")

    def failing_rename(src, dst, *args, **kwargs):  # the last file cannot be placed
        if str(dst).endswith("launch.sh"):
            raise PermissionError(13, "Permission denied")
        return real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", no_links)
    monkeypatch.setattr(os, "rename", failing_rename)
    with pytest.raises(RecipeError, match="nothing was changed"):
        write_recipe(recipe, out, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["ESTIMATE.txt"]  # the placed files taken back, no temp
    assert (out / "ESTIMATE.txt").read_text() == "old estimate\n"  # the replaced one put back

    calls = []

    def racing_link(src, dst, *args, **kwargs):  # a file appears at the third name meanwhile
        calls.append(dst)
        if len(calls) == 3:
            raise FileExistsError(17, "File exists")
        return real_link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", racing_link)
    monkeypatch.setattr(os, "rename", real_rename)
    with pytest.raises(RecipeError, match="appeared"):
        write_recipe(recipe, out, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["ESTIMATE.txt"]
    assert (out / "ESTIMATE.txt").read_text() == "old estimate\n"


# ------------------------------------------------------------------------------------ 2. train


def _recipe_folder(tmp_path: Path, **plan) -> Path:
    folder = tmp_path / "recipe"
    write_recipe(make_recipe(TrainingPlan(model=MODEL, gpu="RTX 4090", **plan)), folder)
    return folder


def test_output_dir_through_a_symlink_is_refused(tmp_path):
    from canifinetune.recipes.runtime import checked_output_dir

    folder = _recipe_folder(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "README.md").write_text("mine\n")
    (folder / "outputs").symlink_to(other)
    plan = load_recipe(folder / "recipe.yaml").plan
    with pytest.raises(RecipeError, match=r"output_dir: 'outputs' leads to .* outside"):
        checked_output_dir(plan, folder)
    (folder / "outputs").unlink()
    (folder / "deep").symlink_to(other)  # a link on the way counts too
    with pytest.raises(RecipeError, match="outside"):
        checked_output_dir(plan.replace(output_dir="deep/run1"), folder)
    assert checked_output_dir(plan.replace(output_dir="runs/a"), folder) == (folder / "runs" / "a").resolve()
    assert (other / "README.md").read_text() == "mine\n" and sorted(p.name for p in other.iterdir()) == ["README.md"]


def test_train_refuses_a_symlinked_output_dir_before_loading_anything(tmp_path, capsys):
    for module in ("torch", "transformers", "peft", "trl", "accelerate", "datasets"):
        pytest.importorskip(module)
    folder = _recipe_folder(tmp_path)
    (tmp_path / "other").mkdir()
    (folder / "outputs").symlink_to(tmp_path / "other")
    assert cli_main(["train", str(folder / "recipe.yaml"), "--device", "cpu"]) == 2
    assert "output_dir" in _stderr_line(capsys)
    assert list((tmp_path / "other").iterdir()) == []


def test_train_without_a_gpu_needs_device_cpu(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    for module in ("transformers", "peft", "trl", "accelerate", "datasets"):
        pytest.importorskip(module)
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    folder = _recipe_folder(tmp_path, method="lora")
    assert cli_main(["train", str(folder / "recipe.yaml")]) == 2
    assert "--device cpu" in _stderr_line(capsys)


# ------------------------------------------------------------------------------------ 3. one name, one model


@pytest.mark.parametrize("name", ["./x", "x", "~/x", "../x", "/x", "qwen", "tiny"])
def test_no_name_silently_becomes_another_model(name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnknownModelError):
        resolve_model(name)
    assert cli_main(["estimate", "--model", name, "--gpu", "RTX 4090", "--offline"]) == 2
    err = _stderr_line(capsys)
    assert "is not in the built-in catalog" in err or "no model folder with a config.json" in err


def test_a_bare_word_is_suggested_not_taken():
    with pytest.raises(UnknownModelError, match="did you mean 'mistralai/Mixtral-8x7B"):
        resolve_model("mixtral 8x7")  # the forgiving catalog lookup would take Mixtral-8x7B-v0.1


def test_relative_and_absolute_paths_give_the_same_local_model(tmp_path, monkeypatch):
    big = {**TINY, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
           "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256}
    folder = _folder(tmp_path, "qwen2.5-0.5b", big)
    monkeypatch.chdir(tmp_path)
    names = ["./qwen2.5-0.5b/", "./qwen2.5-0.5b", "qwen2.5-0.5b", str(folder), str(folder) + "/"]
    models = [resolve_model(n) for n in names]
    assert {m.source for m in models} == {"local"}
    assert {m.spec.total_params for m in models} == {ModelSpec.from_config(big).total_params}
    assert models[0].spec.total_params > 60e9  # the folder's own 69B config, never the catalog's 0.5B


def test_a_path_without_config_is_the_same_error_whether_it_exists_or_not(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x")
    messages = []
    for name in (str(tmp_path / "empty"), str(tmp_path / "file.txt"), str(tmp_path / "missing"), "/etc/shadow"):
        with pytest.raises(UnknownModelError) as err:
            resolve_model(name)
        messages.append(str(err.value).replace(repr(name), "PATH"))
    assert len(set(messages)) == 1 and "no model folder with a config.json at PATH" in messages[0]


@pytest.mark.anyio
async def test_mcp_model_error_does_not_reveal_whether_a_path_exists():
    from mcp import Client

    from canifinetune.server.mcp_server import build_server

    texts = []
    async with Client(build_server(offline=True)) as client:
        for path in ("/etc/shadow", "/etc/no-such-file-here", "/etc"):
            result = await client.call_tool("estimate_memory", {"model": path})
            assert result.is_error
            texts.append(result.content[0].text.replace(repr(path), "PATH"))
    assert len(set(texts)) == 1 and texts[0].startswith("estimate_memory: model: no model folder")


# ------------------------------------------------------------------------------------ 4. bounded work


def test_a_huge_keep_list_is_refused_before_any_work(monkeypatch):
    """Timing-free: the model lookup and the estimate (the search's first work) fail the test if reached, and the
    keep list is a generator that counts what is drawn from it: at most MAX_KEEP + 1 names are ever looked at."""
    from canifinetune.estimator import search
    from canifinetune.estimator.search import MAX_KEEP, PLAN_FIELDS, suggest

    def no_work(*args, **kwargs):
        raise AssertionError("suggest did work (resolve_model / estimate) before refusing the keep list")

    monkeypatch.setattr(search, "resolve_model", no_work)
    monkeypatch.setattr(search, "estimate", no_work)
    plan = TrainingPlan(model=MODEL, gpu="RTX 4090")
    drawn = []

    def counted(names):
        for name in names:
            drawn.append(name)
            yield name

    for keep in (["seq_len"] * 100_000, [f"bogus{i}" for i in range(100_000)], ["x" * 10_000_000]):
        drawn.clear()
        with pytest.raises(PlanError) as err:
            suggest(plan, keep=counted(keep))
        # bounded: at most 64 characters of what was sent, beside the list of valid fields
        assert str(err.value).startswith("keep:") and len(str(err.value)) < 200 + len(", ".join(PLAN_FIELDS))
        assert len(drawn) <= MAX_KEEP + 1, len(drawn)  # counted before any is looked at, never read to the end
    assert MAX_KEEP == 64


@pytest.mark.anyio
async def test_mcp_keep_of_250000_entries_is_a_short_error():
    from mcp import Client

    from canifinetune.server.mcp_server import build_server

    async with Client(build_server(offline=True)) as client:
        start = time.monotonic()
        result = await client.call_tool("suggest_cheaper_config",
                                        {"model": MODEL, "gpu": "RTX 4090", "keep": ["seq_len"] * 250_000})
        assert time.monotonic() - start < 5
    assert result.is_error and len(result.content[0].text) <= MAX_ERROR_CHARS
    assert result.content[0].text.startswith("suggest_cheaper_config: keep: ")


def test_a_config_with_millions_of_mlp_only_layers_is_refused_fast(tmp_path):
    mixtral = {**TINY, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2,
               "num_hidden_layers": 4096, "mlp_only_layers": list(range(4096)) * 150}
    folder = _folder(tmp_path, "m", mixtral)
    def refuse():
        with pytest.raises(ModelConfigError):
            resolve_model(str(folder))

    (_, cpu) = _cpu_seconds(refuse)
    assert cpu < 1.5
    for bad in ([5000], [-1], [True], "0,1"):
        with pytest.raises(ModelConfigError, match="mlp_only_layers"):
            ModelSpec.from_config({**mixtral, "num_hidden_layers": 4, "mlp_only_layers": bad})
    with pytest.raises(ModelConfigError, match="layer_types"):
        ModelSpec.from_config({**TINY, "layer_types": ["full_attention"] * 3_000})


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_config_json_that_is_no_regular_file_is_refused_at_once(tmp_path):
    fifo_folder = tmp_path / "fifo"
    fifo_folder.mkdir()
    os.mkfifo(fifo_folder / "config.json")  # would block a plain open() forever
    dev_folder = tmp_path / "dev"
    dev_folder.mkdir()
    (dev_folder / "config.json").symlink_to("/dev/zero")
    for folder in (fifo_folder, dev_folder):
        with pytest.raises(UnknownModelError, match="no model folder"):
            resolve_model(str(folder))
    for path in (fifo_folder / "config.json", dev_folder / "config.json"):
        with pytest.raises(ModelConfigError, match="not a regular file"):  # even when asked directly
            read_config_file(path)


# ----------------------------------------------------------------------------------- 5. no internal errors, no raw text


@pytest.mark.parametrize("softcap", ["9" * 400, "1e400", "-5", "true", '"x"'])
def test_an_impossible_softcap_is_a_config_error(softcap, tmp_path, capsys):
    folder = tmp_path / "g"
    folder.mkdir()
    config = (
        json.dumps({**TINY, "model_type": "gemma2", "head_dim": 16})[:-1] + f', "final_logit_softcapping": {softcap}}}'
    )
    (folder / "config.json").write_text(config)
    assert cli_main(["estimate", "--model", str(folder)]) == 2
    assert len(_stderr_line(capsys)) < 400


@pytest.mark.parametrize("model_type", ["llama\x1b[2J\nFAKE: fits", "x" * 3_000_000, "llama\u202e", "ll ama"])
def test_a_hostile_model_type_is_refused_and_never_printed_raw(model_type, tmp_path, capsys):
    folder = _folder(tmp_path, "m", {**TINY, "model_type": model_type})
    assert cli_main(["estimate", "--model", str(folder)]) == 2
    err = _stderr_line(capsys)
    assert "model_type" in err and "\x1b" not in err and "\u202e" not in err and len(err) < 400


def test_every_error_line_is_bounded_and_escaped():
    line = safe_text("a\nb\x1b[31m\u200b" + "x" * 10_000)
    assert "\n" not in line and "\x1b" not in line and "\u200b" not in line and "\\x1b" in line
    assert len(line) == MAX_ERROR_CHARS and line.endswith("...")


@pytest.mark.parametrize("plan_text", [
    "  seq_len: " + "[" * 5000,
    "  seq_len: " + "9" * 5000,
    "  seq_len: " + "9" * 4000,
    "  seq_len: true",
    "  lora_alpha: false",
    "  batch_size: .nan",
    "  model: {a: [[[[[[[[[[]]]]]]]]]]}",
])
def test_a_tampered_recipe_is_a_clear_error(plan_text, tmp_path, capsys):
    path = tmp_path / "recipe.yaml"
    path.write_text(f"canifinetune_recipe: 1\nplan:\n  model: {MODEL}\n{plan_text}\n".replace(
        f"  model: {MODEL}\n  model:", "  model:"))
    assert cli_main(["train", str(path)]) == 2
    _stderr_line(capsys)


def test_true_is_not_a_number_anywhere_in_the_plan():
    from pydantic import ValidationError

    for field in ("seq_len", "batch_size", "lora_r", "lora_alpha", "gpu_vram_gb", "max_steps", "num_gpus",
                  "learning_rate", "num_train_epochs", "gradient_accumulation_steps", "lora_dropout"):
        with pytest.raises(ValidationError, match=r"must be a number, not true|must be a number, not false"):
            TrainingPlan(model=MODEL, **{field: field != "lora_dropout"})
    assert TrainingPlan(model=MODEL, gradient_checkpointing=False, load_in_8bit=False).load_in_8bit is False


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_recipe_that_is_a_fifo_is_refused_at_once(tmp_path, capsys):
    os.mkfifo(tmp_path / "recipe.yaml")
    assert cli_main(["train", str(tmp_path / "recipe.yaml")]) == 2
    assert "not a regular file" in _stderr_line(capsys)


# ------------------------------------------------------------------------------------ 6. safetensors counts


def _safetensors(path: Path, tensors: dict) -> None:
    header = json.dumps({name: {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]}
                         for name, (dtype, shape) in tensors.items()}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)


def test_local_safetensors_headers_give_a_checked_exact_count(tmp_path):
    folder = _folder(tmp_path, "m", TINY)
    spec = ModelSpec.from_config(TINY)
    _safetensors(folder / "model.safetensors", {"w": ("BF16", [spec.total_params])})
    rm = resolve_model(str(folder))
    assert rm.params_exact == spec.total_params
    assert not any("safetensors" in w for w in rm.spec.warnings)


@pytest.mark.parametrize("shape", [[-1000000, 1000], [1e9, 1e9], [10**9, 10**9], [True, 5], ["12"], [0]])
def test_impossible_local_safetensors_counts_are_refused_with_a_warning(shape, tmp_path):
    folder = _folder(tmp_path, "m", TINY)
    _safetensors(folder / "model.safetensors", {"w": ("BF16", shape)})
    rm = resolve_model(str(folder))
    assert rm.params_exact is None
    assert any("safetensors" in w and "config.json" in w for w in rm.spec.warnings)
    est_params = cli_main(["estimate", "--model", str(folder), "--json"])
    assert est_params == 0


def test_a_lying_safetensors_header_length_is_refused(tmp_path):
    folder = _folder(tmp_path, "m", TINY)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 60) + b"{}")
    exact, warning = local_safetensors_params(folder, ModelSpec.from_config(TINY))
    assert exact is None and "could not be read" in warning


@pytest.mark.parametrize("counts", [{"BF16": -1_000_000_000}, {"BF16": 10**18}, {"BF16": float("inf")},
                                    {"BF16": float("nan")}, {"BF16": "12"}])
def test_impossible_hub_safetensors_counts_are_refused_with_a_warning(counts, tmp_path):
    from canifinetune.server.hub import _resolved

    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    rm = _resolved("acme/tiny", "hub", path, {"available": True, "parameter_count": counts})
    assert rm.params_exact is None
    assert any("safetensors" in w for w in rm.spec.warnings)


# ------------------------------------------------------------------------------------ 7. minor


@pytest.mark.parametrize("value", ["١٦", "1_000", "+5", "1e-320", "0x10", "inf", "nan", "1e999", " 16", "16 ", "٣"])
def test_numbers_on_the_command_line_are_plain_decimals(value, capsys):
    assert cli_main(["estimate", "--model", MODEL, "--gpu-vram-gb", value]) == 2
    assert "--gpu-vram-gb" in _stderr_line(capsys)
    assert cli_main(["estimate", "--model", MODEL, "--seq-len", value]) == 2
    _stderr_line(capsys)


@pytest.mark.parametrize("args", [["--gpu-vram-gb", "16"], ["--gpu-vram-gb", "16.5"], ["--learning-rate", "2e-4"],
                                  ["--max-steps", "-1"], ["--learning-rate", ".001"]])
def test_plain_numbers_still_work(args, capsys):
    assert cli_main(["estimate", "--model", MODEL, *args]) in (0, 3, 4)
    capsys.readouterr()


@pytest.mark.parametrize("char", ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"])
def test_zero_width_characters_are_refused_in_plan_strings(char, capsys):
    for flag in ("--model", "--gpu", "--dataset", "--output-dir"):
        args = {"--model": MODEL, "--gpu": "RTX 4090"}
        args[flag] = "ab" + char + "c"
        argv = ["estimate"] + [x for kv in args.items() for x in kv]
        assert cli_main(argv) == 2
        assert "control characters" in _stderr_line(capsys)


def test_serving_beyond_loopback_needs_a_token(monkeypatch, capsys):
    monkeypatch.delenv("CANIFINETUNE_AUTH_TOKEN", raising=False)
    assert cli_main(["serve", "--http", "--host", "0.0.0.0"]) == 2
    assert "--auth-token" in _stderr_line(capsys)
    assert cli_main(["serve", "--http", "--host", "127.0.0.1", "--auth-token", "short"]) == 2
    _stderr_line(capsys)


def _serve(app, protocol) -> tuple[int, object, threading.Thread]:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="critical", http=protocol, lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    return port, server, thread


async def _ok_app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def test_half_sent_headers_are_cut_off_and_connections_are_capped():
    from canifinetune.server.mcp_server import limited_h11_protocol

    port, server, thread = _serve(_ok_app, limited_h11_protocol(header_timeout=0.5, max_connections=3))
    try:
        slow = socket.create_connection(("127.0.0.1", port))
        slow.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the rest
        slow.settimeout(5)
        start = time.monotonic()
        assert slow.recv(100) == b""  # closed by the server
        assert time.monotonic() - start < 3
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", port))
        extra.settimeout(5)
        assert extra.recv(100) == b""  # beyond the cap: closed at once
        for s in [*held, slow, extra]:
            s.close()
        ok = socket.create_connection(("127.0.0.1", port))
        ok.settimeout(5)
        time.sleep(0.2)
        ok.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert ok.recv(1000).startswith(b"HTTP/1.1 200")
        ok.close()
    finally:
        server.should_exit = True
        thread.join(10)


def test_every_http_request_needs_the_bearer_token():
    from canifinetune.server.mcp_server import bearer_auth, limited_h11_protocol

    token = "s3cret-token-of-some-length"
    port, server, thread = _serve(bearer_auth(_ok_app, token), limited_h11_protocol())
    try:
        def status(headers: str) -> bytes:
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.settimeout(5)
                s.sendall(f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}Connection: close\r\n\r\n".encode())
                return s.recv(1000).split(b"\r\n", 1)[0]

        assert status("") == b"HTTP/1.1 401 Unauthorized"
        assert status("Authorization: Bearer wrong\r\n") == b"HTTP/1.1 401 Unauthorized"
        assert status(f"Authorization: Basic {token}\r\n") == b"HTTP/1.1 401 Unauthorized"
        assert status(f"Authorization: Bearer {token}\r\n") == b"HTTP/1.1 200 OK"
    finally:
        server.should_exit = True
        thread.join(10)


def test_the_http_server_is_configured_with_its_limits(monkeypatch):
    import uvicorn

    from canifinetune.server import mcp_server

    seen = {}

    class FakeServer:
        def __init__(self, config):
            seen["config"] = config

        async def serve(self):
            return None

    monkeypatch.setattr(uvicorn, "Server", FakeServer)
    monkeypatch.setattr(mcp_server, "tune_gc_for_serving", lambda: seen.setdefault("gc_tuned", True))
    mcp_server.run_http("127.0.0.1", 8765, offline=True)
    config = seen["config"]
    assert seen.get("gc_tuned"), "the HTTP server tunes the garbage collector before it serves"
    assert config.timeout_keep_alive == mcp_server.KEEP_ALIVE_TIMEOUT_S
    assert config.h11_max_incomplete_event_size == mcp_server.MAX_HEADER_BYTES
    # admission matches the connection cap (issue 22): uvicorn's limit_concurrency would answer 503 below it
    assert config.limit_concurrency is None and mcp_server.MAX_CONCURRENT_REQUESTS == mcp_server.MAX_CONNECTIONS
    assert config.http.__name__ == "LimitedH11Protocol" and config.access_log is False


def test_a_non_loopback_bind_warns(monkeypatch, capsys):
    import uvicorn

    from canifinetune.server import mcp_server

    class FakeServer:
        def __init__(self, config):
            pass

        async def serve(self):
            return None

    monkeypatch.setattr(uvicorn, "Server", FakeServer)
    monkeypatch.setattr(mcp_server, "tune_gc_for_serving", lambda: None)
    mcp_server.run_http("0.0.0.0", 8765, offline=True, auth_token="a-token-long-enough-1234")
    assert "warning" in capsys.readouterr().err


def test_a_lan_bind_serves_nobody_without_the_token(tmp_path):
    """The finding: `--host 0.0.0.0` served a LAN client sending `Host: 127.0.0.1:PORT` with no authentication."""
    from mcp_helpers import http_server

    token = "a-long-enough-token-for-tests"
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})

    def post(port: int, auth: str | None) -> bytes:
        headers = (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                   f"Accept: application/json, text/event-stream\r\nContent-Length: {len(body)}\r\n"
                   + (f"Authorization: Bearer {auth}\r\n" if auth else "") + "Connection: close\r\n\r\n")
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.settimeout(20)
            s.sendall(headers.encode() + body.encode())
            return s.recv(200).split(b"\r\n", 1)[0]

    env_before = os.environ.pop("CANIFINETUNE_AUTH_TOKEN", None)
    try:
        with http_server(extra=["--host", "0.0.0.0", "--auth-token", token, "--offline"]) as (url, proc):
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            assert post(port, None) == b"HTTP/1.1 401 Unauthorized"
            assert post(port, "wrong-token-of-some-length") == b"HTTP/1.1 401 Unauthorized"
            assert post(port, token) == b"HTTP/1.1 200 OK"
            proc.stderr_file.seek(0)
            assert "warning: --host 0.0.0.0" in proc.stderr_file.read()
    finally:
        if env_before is not None:
            os.environ["CANIFINETUNE_AUTH_TOKEN"] = env_before


def test_serving_tunes_the_garbage_collector():
    """What exists when serving starts is frozen out of every collection, and the young generation is collected every
    GC_YOUNG_THRESHOLD allocations (the default, 700, took 16.6% of the tools' CPU: benchmarks/bench_tool_cpu.py); the
    stdio server does it too. The collector is put back for the rest of the tests."""
    import gc

    from canifinetune.server import mcp_server

    before, frozen_before = gc.get_threshold(), gc.get_freeze_count()
    sentinel = object.__new__(type("LongLived", (), {}))  # a container made before serving: frozen with the rest
    try:
        mcp_server.tune_gc_for_serving()
        assert gc.get_threshold() == (mcp_server.GC_YOUNG_THRESHOLD, *mcp_server.GC_OLDER_THRESHOLDS)
        assert gc.get_freeze_count() > frozen_before and gc.is_tracked(sentinel)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
    calls = []

    class FakeServer:
        def run(self):
            calls.append("run")

    import pytest

    with pytest.MonkeyPatch.context() as m:
        m.setattr(mcp_server, "build_server", lambda offline=None: FakeServer())
        m.setattr(mcp_server, "tune_gc_for_serving", lambda: calls.append("gc"))
        mcp_server.run_stdio(offline=True)
    assert calls == ["gc", "run"]
