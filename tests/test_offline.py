"""Offline guarantee: with `--offline` or HF_HUB_OFFLINE=1 every MCP tool answers without opening a socket.

Sockets are blocked (connect, connect_ex, create_connection, getaddrinfo record the attempt and fail) and
every tool runs on catalog models, a local folder and a model that is only in a (temporary) Hugging Face
cache; a Hub id that is not cached is a tool error naming ``model`` and offline mode, not a network
attempt. In process through the in-memory client, and end to end: `canifinetune serve --offline` (and
`serve` with HF_HUB_OFFLINE=1) as a stdio subprocess whose sockets are blocked the same way.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters
from mcp_helpers import ROOT

from canifinetune.estimator.catalog import load_models
from canifinetune.estimator.spec import ESTIMATED_VISION_TYPES, PEFT_DEFAULT_TARGETS

pytestmark = pytest.mark.anyio

HAVE_HUB = importlib.util.find_spec("canifinetune.server.hub") is not None
CACHED = "acme/cached-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32000, "hidden_size": 512,
    "intermediate_size": 1376, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
    "max_position_embeddings": 2048, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
CATALOG = [m.id for m in load_models()]
VISION_MODELS = {m.id for m in load_models() if m.family in ESTIMATED_VISION_TYPES}
NO_PEFT_DEFAULT = {model for model in VISION_MODELS
                   if ESTIMATED_VISION_TYPES[next(m.family for m in load_models() if m.id == model)]
                   not in PEFT_DEFAULT_TARGETS}
SUGGEST_MODELS = [
    "Qwen/Qwen2.5-7B-Instruct",
    "meta-llama/Llama-3.1-70B",
    "google/gemma-2-2b-it",
    "mistralai/Mixtral-8x7B-v0.1",
]

BLOCKER = """
import socket, sys
_log = sys.argv.pop(1)
def _refuse(*args, **kwargs):
    with open(_log, "a") as f:
        f.write(repr(args[1:] if args and isinstance(args[0], socket.socket) else args) + "\\n")
    raise OSError("network access blocked by the offline test")
socket.socket.connect = _refuse
socket.socket.connect_ex = _refuse
socket.create_connection = _refuse
socket.getaddrinfo = _refuse
from canifinetune.server.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def hf_cache(tmp_path, monkeypatch) -> Path:
    """A Hugging Face cache (HF_HOME) holding one model's config.json, laid out as hf_hub_download leaves it."""
    home = tmp_path / "hf home"
    repo = home / "hub" / ("models--" + CACHED.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT, encoding="utf-8")
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    (repo / "snapshots" / COMMIT / "config.json").write_text(json.dumps(LLAMA), encoding="utf-8")
    monkeypatch.setenv("HF_HOME", str(home))
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_ASSETS_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    return home


@pytest.fixture
def local_model(tmp_path) -> str:
    folder = tmp_path / "local model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA), encoding="utf-8")
    return str(folder)


@pytest.fixture
def no_sockets(monkeypatch) -> list:
    attempts: list = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network access blocked by the offline test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return attempts


def text_of(result) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def exercise_every_tool(client: Client, models: list[str], local_model: str) -> None:
    """estimate_memory and make_recipe on every model given, suggest_cheaper_config on a few; all must answer."""
    for model in [*models, local_model]:
        if model in VISION_MODELS:  # images needed; the recipe ships example image rows
            # PEFT has no default targets for an MoE language model (Qwen3-VL-MoE): name them there
            targets = {} if model not in NO_PEFT_DEFAULT else {"target_modules": "all-linear"}
            for method in ("lora", "qlora"):
                est = await client.call_tool("estimate_memory", {"model": model, "gpu": "H100", "method": method,
                                                                  "plan": {"image_size": "640x480"}, **targets})
                assert not est.is_error, (model, text_of(est))
            recipe = await client.call_tool("make_recipe", {"model": model, "gpu_vram_gb": 80, "method": "lora",
                                                            "plan": {"image_size": "640x480"}, **targets})
            assert not recipe.is_error and "example_data.jsonl" in recipe.structured_content["files"], (
                model, text_of(recipe))
            continue
        # lora_dropout 0: PEFT refuses dropout on the fused MoE expert adapters all-linear reaches (issue 13)
        est = await client.call_tool("estimate_memory", {"model": model, "gpu": "H100", "method": "qlora",
                                                          "target_modules": "all-linear", "plan": {"lora_dropout": 0}})
        assert not est.is_error, (model, text_of(est))
        recipe = await client.call_tool("make_recipe", {"model": model, "gpu_vram_gb": 80, "method": "qlora",
                                                        "target_modules": "all-linear", "dataset": "train.jsonl",
                                                        "plan": {"lora_dropout": 0}})
        assert not recipe.is_error, (model, text_of(recipe))
        assert "recipe.yaml" in recipe.structured_content["files"]
    for model in [m for m in SUGGEST_MODELS if m in models] + [local_model] + ([CACHED] if CACHED in models else []):
        sug = await client.call_tool(
            "suggest_cheaper_config", {"model": model, "gpu": "RTX 3060 12GB", "method": "full"}
        )
        assert not sug.is_error, (model, text_of(sug))
    if HAVE_HUB:  # a Hub id that is not cached: refused offline, without trying the network
        missing = await client.call_tool("estimate_memory", {"model": "acme/not-cached", "gpu": "H100"})
        text = text_of(missing)
        assert missing.is_error and "model" in text and "offline" in text, text


async def test_env_offline_in_process(hf_cache, local_model, no_sockets, monkeypatch):
    from canifinetune.server.mcp_server import build_server

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    models = CATALOG + ([CACHED] if HAVE_HUB else [])
    async with Client(build_server()) as client:
        tools = (await client.list_tools()).tools
        assert all(t.annotations.open_world_hint is False for t in tools)  # offline: a closed world
        await exercise_every_tool(client, models, local_model)
        if HAVE_HUB:
            est = await client.call_tool("estimate_memory", {"model": CACHED, "gpu": "H100"})
            assert est.structured_content["model_source"] == "hub-cache", est.structured_content
    assert no_sockets == []


@pytest.mark.skipif(not HAVE_HUB, reason="server/hub.py (models from the Hugging Face cache) is not in this build")
async def test_cached_model_needs_no_network(hf_cache, local_model, no_sockets, monkeypatch):
    from canifinetune.server.mcp_server import build_server

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    async with Client(build_server()) as client:
        for tool in ("estimate_memory", "make_recipe"):
            result = await client.call_tool(tool, {"model": CACHED, "gpu": "RTX 4090"})
            assert not result.is_error, text_of(result)
    assert no_sockets == []


@pytest.mark.parametrize("how", ["--offline", "HF_HUB_OFFLINE=1"])
async def test_serve_offline_over_stdio_with_sockets_blocked(how, hf_cache, local_model, tmp_path):
    """The real server process: stdio needs no socket, and it must open none."""
    import os

    log = tmp_path / "socket-attempts.log"
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    args = ["-c", BLOCKER, str(log), "serve"]
    if how == "--offline":
        args.append("--offline")
    else:
        env["HF_HUB_OFFLINE"] = "1"
    params = StdioServerParameters(command=sys.executable, args=args, cwd=str(ROOT), env=env)
    models = ["Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.1-70B", "Qwen/Qwen2.5-7B-Instruct", "google/gemma-2-2b-it"]
    async with Client(params) as client:
        assert client.server_info.name == "canifinetune"
        await exercise_every_tool(client, models + ([CACHED] if HAVE_HUB else []), local_model)
    attempts = log.read_text() if log.exists() else ""
    assert attempts == "", f"the offline server tried the network: {attempts}"
