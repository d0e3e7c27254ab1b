"""No context variable carries a tool call's data (issue 23, item 8): the texts of ``config`` / ``model_config`` as the
client sent them travel in the arguments themselves (mcp_views.SentText, which the SDK's pre-parsing of JSON strings
passes by), and how the call's model was read travels in the call's own ToolCall, which CanIFinetuneServer.call_tool
hands to the tool function and then gives to the answer cache. A direct call of an implementation takes the same
path and can read the same notes."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver.exceptions import ToolError

from canifinetune.server import mcp_server, mcp_views
from canifinetune.server.mcp_server import (
    TOOL_CALL_ARGUMENT,
    ToolCall,
    build_server,
    estimate_memory_impl,
    recipe_impl,
    suggest_impl,
)
from canifinetune.server.mcp_views import MAX_MODEL_CONFIG_CHARS, SentText, keep_texts_as_sent

SERVER_DIR = Path(mcp_server.__file__).parent
TRAINING_ARGS = (Path(__file__).parent / "data" / "configs" / "training_args.json").read_text()  # batch size 4
CATALOG = {"model": "Qwen/Qwen2.5-0.5B", "gpu": "RTX 4090"}
# a JSON training config whose key appears twice: the SDK's json.loads keeps the last, the config reader refuses it
TWICE = '{\n  "per_device_train_batch_size": 4,\n  "per_device_train_batch_size": 2\n}\n'


@pytest.fixture
def anyio_backend():
    return "asyncio"


def text_of(result) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def _mistral_config() -> dict:
    from canifinetune.estimator.catalog import find_model

    return find_model("mistralai/Mistral-7B-v0.1", forgiving=False).config_dict()


def _from_the_hub(name, offline):
    """What the Hub would answer: a model read over the network."""
    from canifinetune.estimator.model_sources import ResolvedModel
    from canifinetune.estimator.spec import ModelSpec

    config = _mistral_config()
    return ResolvedModel(name, "hub", config, ModelSpec.from_config(config))


def _count_estimates(monkeypatch) -> list[int]:
    calls = [0]
    real = mcp_server._estimate

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(mcp_server, "_estimate", counted)
    return calls


# ------------------------------------------------------------------------------------------ no context variable


def test_the_server_holds_no_context_variable():
    for path in sorted(SERVER_DIR.glob("*.py")):
        source = path.read_text(encoding="utf-8")
        assert "ContextVar" not in source and "contextvars" not in source, path.name
    assert not hasattr(mcp_views, "RAW_TEXTS") and not hasattr(mcp_server, "_CALL_MODELS")
    assert not hasattr(mcp_server, "_note_model") and not hasattr(mcp_server, "SENT_ARGUMENT")


# ------------------------------------------------------------------------------------------ texts as sent


def test_a_direct_call_uses_its_json_config_text():
    """The implementation, called directly with a JSON training config's text, reads that config: its format, and its
    batch size over the default (8)."""
    result = estimate_memory_impl({**CATALOG, "config": TRAINING_ARGS}, offline=True)
    assert not result.is_error, text_of(result)
    assert result.structured_content["config"]["files"][0]["format"] == "transformers"
    assert result.structured_content["plan"]["batch_size"] == 4
    with pytest.raises(ToolError, match="'per_device_train_batch_size' appears twice"):
        estimate_memory_impl({**CATALOG, "config": TWICE}, offline=True)


def test_the_sdk_pre_parsing_passes_a_sent_text_by():
    """The SDK's argument validation turns a JSON string into an object (then back into JSON, without the duplicate
    key); the same text marked as sent (what call_tool hands on) comes through unchanged."""
    fn_metadata = build_server(offline=True)._tool_manager.get_tool("estimate_memory").fn_metadata
    parsed = fn_metadata.validate_arguments({"config": TWICE, "model_config": "[1, 2]"})
    assert parsed["config"] == '{"per_device_train_batch_size": 2}' and parsed["model_config"] == "[1, 2]"
    marked = keep_texts_as_sent({"config": TWICE, "model_config": "[1, 2]", "model": "x", "plan": "{}"})
    assert marked == {"config": SentText(TWICE), "model_config": SentText("[1, 2]"), "model": "x", "plan": "{}"}
    kept = fn_metadata.validate_arguments(marked)
    assert kept["config"] == TWICE and kept["model_config"] == "[1, 2]"


@pytest.mark.anyio
async def test_a_json_config_sent_over_mcp_is_read_as_its_text():
    """Over MCP, the JSON config is read as the client wrote it: the key that appears twice is named (had the SDK's
    object been written back as JSON, the config would have passed with the last value)."""
    async with Client(build_server(offline=True)) as client:
        read = await client.call_tool("estimate_memory", {**CATALOG, "config": TRAINING_ARGS})
        twice = await client.call_tool("estimate_memory", {**CATALOG, "config": TWICE})
    assert not read.is_error and read.structured_content["plan"]["batch_size"] == 4
    assert twice.is_error and "'per_device_train_batch_size' appears twice" in text_of(twice), text_of(twice)


@pytest.mark.anyio
async def test_a_model_config_sent_over_mcp_is_checked_as_its_text():
    """A model_config's length limit counts the text the client sent (whitespace included), not the SDK's object
    written back as compact JSON; a text within it is used."""
    config = json.dumps(_mistral_config(), indent=1)
    padded = config + " " * (MAX_MODEL_CONFIG_CHARS - len(config) + 1)
    async with Client(build_server(offline=True)) as client:
        used = await client.call_tool("estimate_memory", {"model_config": config, "gpu": "H100"})
        too_long = await client.call_tool("estimate_memory", {"model_config": padded, "gpu": "H100"})
    assert not used.is_error, text_of(used)
    assert too_long.is_error and "model_config" in text_of(too_long), text_of(too_long)


# ------------------------------------------------------------------------------------------ how the model was read


def test_a_direct_call_notes_how_its_model_was_read(monkeypatch, tmp_path):
    """The call's ToolCall is filled in by the implementation itself: catalog (valid while no local folder takes the
    name), model_config (pure), local folder (its files' fingerprint), Hub (never kept)."""
    catalog = ToolCall()
    estimate_memory_impl(dict(CATALOG), offline=True, tool_call=catalog)
    assert catalog.models == [("not-local", "Qwen/Qwen2.5-0.5B", None)]

    pure = ToolCall()
    suggest_impl({"model_config": json.dumps(_mistral_config()), "gpu": "RTX 4090"}, offline=True, tool_call=pure)
    assert pure.models == [("pure", None, None)]

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_mistral_config()))
    local = ToolCall()
    recipe_impl({"model": str(folder), "gpu": "H100"}, offline=True, tool_call=local)
    ((kind, where, fingerprint),) = local.models
    assert kind == "files" and Path(where) == folder and fingerprint is not None

    monkeypatch.setattr(mcp_server, "_resolve", _from_the_hub)
    hub = ToolCall()
    estimate_memory_impl({"model": "someone/some-model", "gpu": "H100"}, tool_call=hub)
    assert hub.models == [("uncacheable", None, None)]
    assert catalog.models == [("not-local", "Qwen/Qwen2.5-0.5B", None)]  # each call keeps its own notes


def test_the_tool_function_hands_its_tool_call_to_the_implementation():
    """The tool function the SDK calls passes the hidden argument on as ``tool_call``: what it notes is the caller's."""
    tool = build_server(offline=True)._tool_manager.get_tool("estimate_memory")
    tool_call = ToolCall(sent=frozenset(CATALOG))
    arguments = tool.fn_metadata.validate_arguments({**CATALOG, TOOL_CALL_ARGUMENT: tool_call})
    assert arguments[TOOL_CALL_ARGUMENT] is tool_call
    result = anyio.run(functools.partial(tool.fn, **arguments))  # a coroutine function (runs_in_the_event_loop)
    assert not result.is_error and tool_call.models == [("not-local", "Qwen/Qwen2.5-0.5B", None)]


@pytest.mark.anyio
async def test_the_answer_cache_keeps_a_catalog_answer_and_not_a_hub_one(monkeypatch):
    calls = _count_estimates(monkeypatch)
    server = build_server(offline=False)
    async with Client(server) as client:
        for _ in range(2):
            assert not (await client.call_tool("estimate_memory", CATALOG)).is_error
        assert calls[0] == 1 and len(server.answer_cache) == 1

        monkeypatch.setattr(mcp_server, "_resolve", _from_the_hub)
        hub_args = {"model": "someone/some-model", "gpu": "RTX 4090"}
        for _ in range(2):
            assert not (await client.call_tool("estimate_memory", hub_args)).is_error
        assert calls[0] == 3 and len(server.answer_cache) == 1


@pytest.mark.anyio
async def test_the_answer_cache_checks_a_local_folder_again(tmp_path, monkeypatch):
    calls = _count_estimates(monkeypatch)
    folder = tmp_path / "m"
    folder.mkdir()
    config = _mistral_config()
    (folder / "config.json").write_text(json.dumps(config))
    local = {"model": str(folder), "gpu": "H100"}
    async with Client(build_server(offline=True)) as client:
        first = await client.call_tool("estimate_memory", local)
        await client.call_tool("estimate_memory", local)
        assert calls[0] == 1 and not first.is_error, text_of(first)
        (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 64}, indent=1))
        changed = await client.call_tool("estimate_memory", local)
        assert calls[0] == 2
    assert changed.structured_content["params_total"] > first.structured_content["params_total"]
