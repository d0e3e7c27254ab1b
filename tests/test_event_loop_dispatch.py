"""Which tool calls the server answers in its event loop and which on a worker thread (issue 22, serving): a call
that can reach neither the network nor a dataset file is a few milliseconds of computation, cheaper than the thread's
hop and the GIL passed back and forth; one that may fetch from the Hub or read a dataset must not block the loop."""

from __future__ import annotations

import anyio.to_thread
import pytest
from mcp import Client

from canifinetune.server.mcp_server import build_server, runs_in_the_event_loop


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.parametrize("arguments, offline, inline", [
    ({"model": "Qwen/Qwen2.5-0.5B"}, False, True),  # a catalog model: no network
    ({"plan": {"model": "Qwen/Qwen2.5-0.5B"}}, False, True),
    ({"model": "someone/not-in-the-catalog"}, False, False),  # may be fetched from the Hub
    ({"model": "someone/not-in-the-catalog"}, True, True),  # an offline server never fetches
    ({"model": "someone/not-in-the-catalog", "model_config_text": "{}"}, False, True),  # built from the given config
    ({"model": "Qwen/Qwen2.5-0.5B", "dataset": "data/train.jsonl"}, False, False),  # reads a file
    ({"plan": {"model": "Qwen/Qwen2.5-0.5B", "dataset": "d.jsonl"}}, True, False),
    ({"config": "base_model: someone/else\n"}, False, False),  # the model is in the config: maybe the Hub's
    ({"model": "./a/local/folder"}, False, False),  # a folder: files to read
])
def test_only_pure_computation_runs_in_the_event_loop(arguments, offline, inline):
    assert runs_in_the_event_loop(arguments, offline) is inline


@pytest.mark.parametrize("offline", [False, True])
def test_a_local_folder_is_read_on_a_worker_thread_even_offline(tmp_path, monkeypatch, offline):
    (tmp_path / "Qwen" / "Qwen2.5-0.5B").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)  # a folder that takes a catalog model's name: its files are read, not the catalog
    assert runs_in_the_event_loop({"model": "Qwen/Qwen2.5-0.5B"}, offline) is False
    assert runs_in_the_event_loop({"model": str(tmp_path)}, offline) is False
    assert runs_in_the_event_loop({"model": "Qwen/Qwen2.5-1.5B"}, offline) is True


@pytest.mark.anyio
async def test_a_catalog_call_never_takes_a_worker_thread(monkeypatch):
    def no_thread(*args, **kwargs):
        raise AssertionError("a worker thread was used")

    monkeypatch.setattr(anyio.to_thread, "run_sync", no_thread)
    async with Client(build_server(offline=False)) as client:
        result = await client.call_tool("estimate_memory", {"model": "Qwen/Qwen2.5-0.5B", "gpu": "RTX 4090"})
    assert not result.is_error and result.structured_content["verdict"] == "fits"


@pytest.mark.anyio
async def test_a_call_that_may_reach_the_hub_takes_a_worker_thread(monkeypatch):
    hops: list[object] = []
    real = anyio.to_thread.run_sync

    async def counted(fn, *args, **kwargs):
        hops.append(fn)
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    server = build_server(offline=False)  # a server that may fetch from the Hub
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # and this test's call is answered offline all the same
    async with Client(server) as client:
        result = await client.call_tool("estimate_memory", {"model": "someone/not-in-the-catalog", "gpu": "RTX 4090"})
    assert result.is_error and hops
