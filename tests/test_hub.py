"""Models from the Hub and its cache (server/hub.py), against a real local HTTP server (tests/hub_server.py).

huggingface_hub itself runs unmocked: HF_ENDPOINT points it at the server, HF_HOME at a temporary
folder. The server answers the endpoints huggingface_hub 2.x calls (HEAD/GET /{repo}/resolve/...,
Range reads of safetensors headers) for a few repos: a sharded llama-like model, a single-file one
with extra tensors, a gated one (401 GatedRepo), a missing one (404 RepoNotFound), a slow one, hostile
configs. Offline tests block every socket.
"""

from __future__ import annotations

import json
import math
import socket
import time

import pytest
from hub_server import HubServer, Repo, VirtualFile, llama_tensors, safetensors_file

from canifinetune.estimator.errors import CanIFinetuneError, ModelConfigError, UnknownModelError
from canifinetune.estimator.estimate import estimate
from canifinetune.estimator.plan import TrainingPlan
from canifinetune.server import hub as hubmod
from canifinetune.server.cli import main as cli_main
from canifinetune.server.hub import GatedModelError, HubError, HubUnreachableError, OfflineNotCachedError, resolve_any

LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512, "intermediate_size": 1408,
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 32000,
    "max_position_embeddings": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5,
}
SHARD1, SHARD2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


def _tensor_names(f: VirtualFile) -> list[str]:
    n = int.from_bytes(f.head[:8], "little")
    return [k for k in json.loads(f.head[8:8 + n]) if k != "__metadata__"]


def _repos() -> dict[str, Repo]:
    s1 = safetensors_file(llama_tensors(LLAMA, range(0, 2), embed=True, final=False))
    s2 = safetensors_file(llama_tensors(LLAMA, range(2, 4), embed=False, final=True))
    weight_map = dict.fromkeys(_tensor_names(s1), SHARD1) | dict.fromkeys(_tensor_names(s2), SHARD2)
    index = {"metadata": {"total_size": s1.size + s2.size}, "weight_map": weight_map}
    config = VirtualFile.of(json.dumps(LLAMA))

    vlm = llama_tensors(LLAMA, range(4), embed=True, final=True)
    vlm["vision_tower.patch_embed.weight"] = ("BF16", [1024, 4096])  # +4.2M params, ~10% more than the decoder
    prequant = {k: ("I32" if k.endswith("proj.weight") else dt, shape)
                for k, (dt, shape) in llama_tensors(LLAMA, range(4), embed=True, final=True).items()}
    custom = {**LLAMA, "model_type": "acme_lm", "architectures": ["AcmeForCausalLM"],
              "auto_map": {"AutoConfig": "configuration_acme.AcmeConfig",
                           "AutoModelForCausalLM": "modeling_acme.AcmeForCausalLM"}}
    bare = {"model_type": "acme_lm", "auto_map": {"AutoModelForCausalLM": "modeling_acme.AcmeForCausalLM"},
            "d_hidden": 512, "blocks": 4}
    evil_code = VirtualFile.of("raise SystemExit('remote code was executed')\n")
    return {
        "acme/tiny-llama": Repo(
            {
                "config.json": config,
                "model.safetensors.index.json": VirtualFile.of(json.dumps(index)),
                SHARD1: s1,
                SHARD2: s2,
            }
        ),
        "acme/vlm-one-file": Repo({"config.json": config, "model.safetensors": safetensors_file(vlm)}),
        "acme/prequantized": Repo({"config.json": config, "model.safetensors": safetensors_file(prequant)}),
        "acme/config-only": Repo({"config.json": config}),
        "acme/custom-code": Repo({"config.json": VirtualFile.of(json.dumps(custom)), "modeling_acme.py": evil_code}),
        "acme/custom-code-bare": Repo({"config.json": VirtualFile.of(json.dumps(bare)), "modeling_acme.py": evil_code}),
        "acme/gated": Repo({"config.json": config}, gated_token="hf_granted"),
        "acme/slow": Repo({"config.json": config}, delay=5.0),
        "acme/huge-config": Repo({"config.json": VirtualFile(b'{"model_type": "llama", "pad": "', 6 * 1024 * 1024)}),
        "acme/nan-config": Repo({"config.json": VirtualFile.of(json.dumps(LLAMA).replace("512", "NaN", 1))}),
    }


@pytest.fixture(scope="module")
def server():
    s = HubServer(_repos()).start()
    yield s
    s.stop()


@pytest.fixture
def hub(server, tmp_path, monkeypatch):
    """HF_ENDPOINT -> the local server, HF_HOME -> a fresh folder, online, no token."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_CACHE",
                "HUGGINGFACE_HUB_CACHE", "HF_ASSETS_CACHE"):
        monkeypatch.setenv(key, "")  # restored afterwards, even if a CLI run sets it
    # huggingface_hub reads these at import; another test may have imported it with other values.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "hf" / "stored_tokens"))
    server.requests.clear()
    return server


@pytest.fixture
def no_sockets(monkeypatch):
    """Every attempt to open a connection or resolve a name raises (and is counted)."""
    attempts: list[object] = []
    _block(monkeypatch, attempts)
    return attempts


def safetensors_requests(server: HubServer):
    return [r for r in server.requests if r.path.endswith(".safetensors")]


# ------------------------------------------------------------------------------------------ the Hub


def test_hub_model_config_and_exact_params_from_safetensors_headers(hub):
    rm = resolve_any("acme/tiny-llama")
    assert rm.source == "hub" and rm.id == "acme/tiny-llama"
    assert rm.spec.num_layers == 4 and rm.spec.model_type == "llama"
    assert rm.params_exact == rm.spec.total_params  # the headers agree with the config, tensor by tensor
    reads = safetensors_requests(hub)
    assert {r.path.rsplit("/", 1)[1] for r in reads} == {SHARD1, SHARD2}
    for r in reads:  # only header reads: a Range from byte 0, never a whole-file GET of the weights
        assert r.method == "GET" and r.range and r.range.startswith("bytes=0-"), r
    est = estimate(TrainingPlan(model="acme/tiny-llama", gpu_vram_gb=24), model=rm)
    assert est.model == "acme/tiny-llama" and est.model_source == "hub"
    assert est.params_exact == est.params_total and est.params_source == "safetensors"
    assert est.verdict == "fits"
    assert not any("safetensors" in w for w in est.warnings)


def test_second_lookup_comes_from_the_cache_without_requests(hub):
    first = resolve_any("acme/tiny-llama")
    hub.requests.clear()
    again = resolve_any("acme/tiny-llama")
    assert again.source == "hub-cache" and again.params_exact == first.params_exact
    assert hub.requests == []


def test_checkpoint_with_more_params_than_the_config_warns_and_counts_them(hub):
    rm = resolve_any("acme/vlm-one-file")
    assert rm.params_exact == rm.spec.total_params + 1024 * 4096
    est = estimate(TrainingPlan(model="acme/vlm-one-file"), model=rm)
    assert any("safetensors headers hold" in w for w in est.warnings)
    extra = [c for c in est.breakdown if c.name == "unmodelled_checkpoint_weights"]
    assert extra and extra[0].bytes == 1024 * 4096 * 2  # bf16
    plain = estimate(TrainingPlan(model="acme/vlm-one-file"), model=resolve_any("acme/tiny-llama"))
    assert est.peak_allocated_bytes == plain.peak_allocated_bytes + extra[0].bytes


def test_prequantized_checkpoint_keeps_the_config_count(hub):
    rm = resolve_any("acme/prequantized")
    assert rm.params_exact is None
    assert any("pre-quantized" in w for w in rm.spec.warnings)


def test_repo_without_safetensors_is_estimated_from_its_config(hub):
    rm = resolve_any("acme/config-only")
    assert rm.params_exact is None and rm.source == "hub"
    assert any("no safetensors" in w for w in rm.spec.warnings)
    assert estimate(TrainingPlan(model="acme/config-only"), model=rm).params_source == "config"


def test_remote_code_is_never_run_and_standard_fields_suffice(hub):
    rm = resolve_any("acme/custom-code")
    assert rm.spec.hidden_size == 512
    est = estimate(TrainingPlan(model="acme/custom-code", target_modules="all-linear"), model=rm)
    assert any("never runs it" in w for w in est.warnings)
    with pytest.raises(ModelConfigError) as err:
        resolve_any("acme/custom-code-bare")
    text = str(err.value)
    assert "acme/custom-code-bare" in text and "custom modeling code" in text and "hidden_size" in text
    assert not any(r.path.endswith(".py") for r in hub.requests)


def test_gated_repo_without_token_says_how_to_get_access(hub):
    with pytest.raises(GatedModelError) as err:
        resolve_any("acme/gated")
    text = str(err.value)
    assert "gated" in text and "https://huggingface.co/acme/gated" in text and "HF_TOKEN" in text
    assert err.value.field == "model"


def test_hf_token_opens_a_gated_repo(hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_granted")
    rm = resolve_any("acme/gated")
    assert rm.source == "hub"
    assert any(r.authorization == "Bearer hf_granted" for r in hub.requests)


def test_wrong_token_says_to_request_access(hub):
    with pytest.raises(GatedModelError) as err:
        resolve_any("acme/gated", token="hf_other")
    assert "has no access" in str(err.value) and "request access at https://huggingface.co/acme/gated" in str(err.value)


def test_missing_repo_is_a_clear_error(hub):
    with pytest.raises(HubError) as err:
        resolve_any("acme/does-not-exist")
    text = str(err.value)
    assert "acme/does-not-exist" in text and "no such repo" in text
    assert isinstance(err.value, UnknownModelError)


def test_slow_hub_times_out_in_bounded_time(hub):
    start = time.monotonic()
    with pytest.raises(HubUnreachableError) as err:
        resolve_any("acme/slow", timeout=0.5)
    assert time.monotonic() - start < 3.0
    assert "no answer within 0.5 s" in str(err.value) and "--offline" in str(err.value)


def test_unreachable_hub_is_a_clear_error(hub, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(HubUnreachableError) as err:
        resolve_any("acme/tiny-llama", timeout=2)
    assert "could not be reached" in str(err.value)


def test_huge_config_on_the_hub_is_refused_before_download(hub):
    start = time.monotonic()
    with pytest.raises(ModelConfigError) as err:
        resolve_any("acme/huge-config")
    assert time.monotonic() - start < 2.0
    assert "a few KB" in str(err.value)
    assert not any(r.method == "GET" and r.path.endswith("config.json") for r in hub.requests)


def test_nan_config_on_the_hub_is_a_clear_error(hub):
    with pytest.raises(ModelConfigError) as err:
        resolve_any("acme/nan-config")
    assert "NaN" in str(err.value) and "acme/nan-config" in str(err.value)


# ------------------------------------------------------------------------------------------ offline


def test_offline_estimates_cached_and_catalog_models_without_any_socket(hub, monkeypatch):
    online = resolve_any("acme/tiny-llama")  # cache it first, online
    attempts: list[object] = []
    _block(monkeypatch, attempts)
    hub.requests.clear()

    cached = resolve_any("acme/tiny-llama", offline=True)
    assert cached.source == "hub-cache" and cached.params_exact == online.params_exact
    est = estimate(TrainingPlan(model="acme/tiny-llama", gpu_vram_gb=16), model=cached)
    assert est.params_source == "safetensors" and est.verdict == "fits"

    catalog = resolve_any("Qwen/Qwen2.5-0.5B", offline=True)
    assert catalog.source == "catalog"
    assert estimate(TrainingPlan(model="Qwen/Qwen2.5-0.5B", gpu="RTX 4090"), model=catalog).verdict == "fits"

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the environment variable means the same as offline=True
    assert resolve_any("acme/tiny-llama").source == "hub-cache"
    code = cli_main(["estimate", "--model", "acme/tiny-llama", "--gpu-vram-gb", "16", "--offline", "--json"])
    assert code == 0
    assert attempts == [] and hub.requests == []


def test_offline_and_not_cached_names_the_closest_catalog_models(hub, no_sockets):
    start = time.monotonic()
    with pytest.raises(OfflineNotCachedError) as err:
        resolve_any("Qwen/Qwen2.5-0.6B-Instruct", offline=True)
    assert time.monotonic() - start < 2.0
    text = str(err.value)
    assert "offline" in text and "Closest catalog models" in text and "Qwen/Qwen2.5-0.5B-Instruct" in text
    assert no_sockets == [] and hub.requests == []


def test_names_that_are_no_repo_id_never_reach_the_network(hub, no_sockets):
    with pytest.raises(UnknownModelError) as err:
        resolve_any("qwen 2.5 seven b instruct")
    assert "not in the built-in catalog" in str(err.value)
    with pytest.raises(UnknownModelError) as err:
        resolve_any("./no/such/folder")
    assert "no model folder with a config.json at './no/such/folder'" in str(err.value)
    assert no_sockets == [] and hub.requests == []


def _block(monkeypatch, attempts):
    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network access blocked by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


# ------------------------------------------------------------------------------------------ hostile configs

DEEP = "[" * 10_000 + "]" * 10_000


@pytest.mark.parametrize("text,expected", [
    ('{"model_type": "llama", "pad": "' + "x" * (5 * 1024 * 1024) + '"}', "a few KB"),
    ('{"model_type": "llama", "x": ' + DEEP + "}", "nests deeper"),
    ("[" * 100_000, "nests deeper"),
    (json.dumps({**LLAMA, "hidden_size": "512"}), "must be an integer"),
    (json.dumps({**LLAMA, "num_hidden_layers": [4]}), "must be an integer"),
    (json.dumps({**LLAMA, "tie_word_embeddings": "yes"}), "true or false"),
    (json.dumps(LLAMA).replace('"hidden_size": 512', '"hidden_size": NaN'), "NaN"),
    (json.dumps(LLAMA).replace('"hidden_size": 512', '"hidden_size": Infinity'), "Infinity"),
    (json.dumps({**LLAMA, "hidden_size": 0}), "between 1"),
    (json.dumps({**LLAMA, "num_hidden_layers": -4}), "between 1"),
    (json.dumps({**LLAMA, "vocab_size": 10 ** 30}), "between 1"),
    (json.dumps({**LLAMA, "intermediate_size": 1408.5}), "must be an integer"),
    (json.dumps({k: v for k, v in LLAMA.items() if k != "num_attention_heads"}), "num_attention_heads"),
    ("[1, 2, 3]", "JSON object"),
    ("\ufeff{", "not valid JSON"),
    ("{" + '"a": 1, ' * 600_000 + '"b": 2}', "a few KB"),
], ids=["huge-string", "deep-10k", "unclosed-100k", "str-size", "list-layers", "str-bool", "nan", "infinity", "zero",
        "negative", "huge-int", "fraction", "missing-field", "not-object", "bom-garbage", "many-keys"])
def test_hostile_local_config_is_a_clear_error_in_bounded_time(tmp_path, text, expected, no_sockets):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(text, encoding="utf-8")
    start = time.monotonic()
    with pytest.raises(CanIFinetuneError) as err:
        resolve_any(str(folder))
    assert time.monotonic() - start < 2.0
    assert expected in str(err.value), str(err.value)
    assert err.value.field == "model"
    assert no_sockets == []


def test_local_folder_with_remote_code_config_warns(tmp_path, no_sockets):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "auto_map": {"AutoModelForCausalLM": "m.M"}}))
    (tmp_path / "m.py").write_text("raise SystemExit('remote code was executed')\n")
    rm = resolve_any(str(tmp_path))
    assert rm.source == "local" and any("never runs it" in w for w in rm.spec.warnings)


# ------------------------------------------------------------------------------------------ CLI and MCP


def test_cli_estimates_a_hub_model_and_a_local_folder(hub, tmp_path, capsys):
    assert cli_main(["estimate", "--model", "acme/tiny-llama", "--gpu-vram-gb", "24", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model_source"] == "hub" and out["params_source"] == "safetensors"
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    assert cli_main(["estimate", "--model", str(tmp_path), "--gpu-vram-gb", "24", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model_source"] == "local"
    assert cli_main(["suggest", "--model", "acme/tiny-llama", "--gpu-vram-gb", "1", "--json"]) in (0, 3)
    capsys.readouterr()
    assert cli_main(["estimate", "--model", "acme/gated"]) == 2
    assert "request access" in capsys.readouterr().err


def test_cli_offline_flag_refuses_uncached_without_writing_the_environment(hub, no_sockets, capsys):
    import os

    before = dict(os.environ)
    assert cli_main(["estimate", "--model", "acme/never-cached", "--offline"]) == 2
    err = capsys.readouterr().err
    assert "offline" in err and err.count("\n") == 1
    assert dict(os.environ) == before  # the flag travels as a value (server/hub.py resolve_any(offline=))
    assert no_sockets == [] and hub.requests == []


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_mcp_tools_are_open_world_only_when_they_may_reach_the_hub(hub, monkeypatch):
    from mcp import Client

    from canifinetune.server.mcp_server import build_server

    async def hints(**kwargs):
        async with Client(build_server(**kwargs)) as client:
            return {t.name: t.annotations.open_world_hint for t in (await client.list_tools()).tools}

    assert set((await hints(offline=False)).values()) == {True}
    assert set((await hints(offline=True)).values()) == {False}
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert set((await hints()).values()) == {False}


@pytest.mark.anyio
async def test_mcp_accepts_hub_ids_and_local_paths(hub, tmp_path):
    from mcp import Client

    from canifinetune.server.mcp_server import build_server

    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    async with Client(build_server(offline=False)) as client:
        r = await client.call_tool("estimate_memory", {"model": "acme/tiny-llama", "gpu_vram_gb": 24})
        assert not r.is_error, r.content
        assert r.structured_content["params_source"] == "safetensors"
        r = await client.call_tool("estimate_memory", {"model": str(tmp_path), "gpu_vram_gb": 24})
        assert not r.is_error and r.structured_content["model_source"] == "local"
        r = await client.call_tool("suggest_cheaper_config", {"model": "acme/tiny-llama", "gpu_vram_gb": 1})
        assert not r.is_error, r.content
        r = await client.call_tool("make_recipe", {"model": "acme/tiny-llama", "gpu_vram_gb": 24})
        assert not r.is_error, r.content
        r = await client.call_tool("estimate_memory", {"model": "acme/gated"})
        assert r.is_error and "request access" in r.content[0].text
        spec = json.loads((await client.read_resource("canifinetune://spec/acme/tiny-llama")).contents[0].text)
        assert spec["id"] == "acme/tiny-llama" and spec["params_exact"] == spec["params_total"]
    async with Client(build_server(offline=True)) as client:
        r = await client.call_tool("estimate_memory", {"model": "acme/config-only"})
        assert r.is_error and "offline" in r.content[0].text


def test_env_helpers_read_the_environment_now(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    assert hubmod.hub_cache_dir() == tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_OFFLINE", "true")
    assert hubmod.env_offline() and not hubmod.may_reach_hub()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "")
    assert not hubmod.env_offline()
    assert math.isfinite(hubmod.DEFAULT_TIMEOUT)
