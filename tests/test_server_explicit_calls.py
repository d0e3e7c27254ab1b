"""The MCP tools hand a call's inputs on explicitly (issue 23, item 8): the names of the arguments the client sent and
the user's training config as read travel as parameters and return values (mcp_server.call_inputs, CallInputs,
ToolCall, config_face.load_call_config, mcp_text, mcp_structured), never through context variables. So a direct
call of the core path takes the server's path, and nothing of one call reaches the next."""

from __future__ import annotations

import contextvars
from pathlib import Path

import pytest
from mcp import Client

from canifinetune.server import config_face, mcp_server
from canifinetune.server.mcp_server import (
    TOOL_CALL_ARGUMENT,
    ToolCall,
    build_server,
    call_inputs,
    estimate_memory_impl,
    suggest_impl,
)

CONFIGS = Path(__file__).parent / "data" / "configs"
LLAMA_FACTORY = (CONFIGS / "llama3_lora_sft.yaml").read_text()  # cutoff_len 2048, per_device_train_batch_size 1
PLAIN = {"model": "Qwen/Qwen2.5-0.5B", "gpu": "RTX 4090"}
WITH_CONFIG = {"config": LLAMA_FACTORY, "gpu": "RTX 4090"}


@pytest.fixture
def anyio_backend():
    return "asyncio"


def text_of(result) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def answer(result) -> tuple[bool, str, dict | None]:
    return bool(result.is_error), text_of(result), result.structured_content


def test_no_context_variable_carries_a_call():
    for module in (config_face, mcp_server):
        assert not hasattr(module, "RAW_ARGUMENTS") and not hasattr(module, "_LOADED")
    assert not [name for name, value in vars(config_face).items() if isinstance(value, contextvars.ContextVar)]


def test_a_config_does_not_outlive_its_call():
    """A direct call with a config, then one without: the second answers as if it came first (no config account, the
    same text and structured content), and the first, made again, as before."""
    plain_first = answer(estimate_memory_impl(dict(PLAIN), offline=True))
    configured = answer(estimate_memory_impl(dict(WITH_CONFIG), offline=True))
    plain_after = answer(estimate_memory_impl(dict(PLAIN), offline=True))
    configured_again = answer(estimate_memory_impl(dict(WITH_CONFIG), offline=True))

    assert not configured[0] and configured[2]["config"]["framework"] == "llama_factory"
    assert any(line.startswith("config: llama_factory file") for line in configured[1].splitlines())
    assert plain_after == plain_first
    assert "config" not in plain_after[2] and "config:" not in plain_after[1]
    assert configured_again == configured


def test_a_suggestion_with_config_edits_then_one_without():
    with_config = suggest_impl({**WITH_CONFIG, "gpu": "RTX 3060", "batch_size": 8}, offline=True)
    assert with_config.structured_content["config_edits"] and "as edits to your config" in text_of(with_config)
    plain = suggest_impl({**PLAIN, "gpu": "RTX 3060"}, offline=True)
    assert "config_edits" not in plain.structured_content and "config" not in plain.structured_content
    assert "as edits to your config" not in text_of(plain)


def test_the_sent_names_belong_to_their_call_only():
    """``sent`` says which arguments the client gave (the SDK fills the others with defaults): only those go over the
    file's values. The next call, without it, takes every argument it holds as given."""
    filled = {**WITH_CONFIG, "model": None, "seq_len": 1024, "batch_size": 8}  # as the SDK fills them in
    first = call_inputs(filled, sent=frozenset(WITH_CONFIG))
    assert (first.plan.seq_len, first.plan.batch_size) == (2048, 1)  # the file's cutoff_len and batch size
    assert first.config is not None and not first.config.report.overrides

    second = call_inputs({**WITH_CONFIG, "seq_len": 1024})  # a direct call: what it holds was given
    assert second.plan.seq_len == 1024 and second.plan.batch_size == 1
    assert [(o.field, o.file_value, o.value) for o in second.config.report.overrides] == [("seq_len", 2048, 1024)]

    third = call_inputs(dict(PLAIN))
    assert third.config is None and third.model_config is None
    assert (third.plan.model, third.plan.seq_len) == ("Qwen/Qwen2.5-0.5B", 1024)


def test_a_model_config_and_a_config_without_a_model():
    """A training config that names no model beside a model_config: the model_config's name, said as given."""
    import json

    from canifinetune.estimator.catalog import find_model

    config = json.dumps({**find_model("mistralai/Mistral-7B-v0.1", forgiving=False).config_dict(),
                         "_name_or_path": "acme/mistral-internal"})
    call = call_inputs({"config": "adapter: lora\nlora_r: 8\nsequence_len: 512\n", "model_config": config})
    assert call.plan.model == "acme/mistral-internal" and call.plan.seq_len == 512
    assert call.model_config is not None and call.config is not None
    assert call_inputs(dict(PLAIN)).config is None


@pytest.mark.anyio
async def test_a_server_call_leaves_nothing_to_a_direct_call():
    """A call through the server (in this event loop), then a direct call: the direct call's arguments all count
    (a context variable the server set once made it drop seq_len here)."""
    async with Client(build_server(offline=True)) as client:
        served = await client.call_tool("estimate_memory", dict(PLAIN))
    assert not served.is_error
    direct = estimate_memory_impl({**PLAIN, "seq_len": 2048}, offline=True)
    assert direct.structured_content["plan"]["seq_len"] == 2048


@pytest.mark.anyio
async def test_the_server_and_a_direct_call_give_the_same_answer():
    """The tool function hands the SDK's filled-in arguments and the names sent to the same function a test calls:
    given the same, both answer alike; without the names sent, the filled-in defaults would win over the file."""
    arguments = {**WITH_CONFIG, "batch_size": 4}
    server = build_server(offline=True)
    async with Client(server) as client:
        served = await client.call_tool("estimate_memory", arguments)
    assert not served.is_error, text_of(served)
    assert served.structured_content["plan"]["seq_len"] == 2048  # the file's: seq_len was not sent

    filled = server._tool_manager.get_tool("estimate_memory").fn_metadata.validate_arguments(arguments)
    filled.pop(TOOL_CALL_ARGUMENT)
    direct = estimate_memory_impl(dict(filled), offline=True, tool_call=ToolCall(sent=frozenset(arguments)))
    assert answer(direct) == answer(served)
    assert answer(estimate_memory_impl(dict(arguments), offline=True)) == answer(served)
    defaults_win = estimate_memory_impl(dict(filled), offline=True)
    overrides = defaults_win.structured_content["config"]["overrides"]
    assert {"field": "seq_len", "file_value": 2048, "value": 1024} in overrides
    assert served.structured_content["config"]["overrides"] == [{"field": "batch_size", "file_value": 1, "value": 4}]


@pytest.mark.anyio
async def test_the_sent_names_are_not_an_argument_a_client_can_give():
    async with Client(build_server(offline=True)) as client:
        tools = (await client.list_tools()).tools
        assert all(TOOL_CALL_ARGUMENT not in t.input_schema["properties"] for t in tools)
        result = await client.call_tool("estimate_memory", {**WITH_CONFIG, TOOL_CALL_ARGUMENT: {"sent": ["gpu"]}})
    assert result.is_error and f"'{TOOL_CALL_ARGUMENT}' is not an argument of estimate_memory" in text_of(result)
