"""Serving over HTTP (issue 22, defect 7 and item 7): the network mode's Host check and bearer scheme, a burst of
clients answered in full, no access log, the answer cache, output schemas without prose, and the benchmark against
a bare SDK server. Every socket is on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
from mcp import Client

from canifinetune.server import mcp_server
from canifinetune.server.cli import build_parser
from canifinetune.server.cli import main as cli_main

TOKEN = "a-long-enough-token-for-the-tests"
INITIALIZE = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})


@pytest.fixture
def anyio_backend():
    return "asyncio"


# ------------------------------------------------------------------------------------------ helpers


class InThreadServer:
    """The real MCP app (``http_app``) served by uvicorn in a thread, listening on a 127.0.0.1 socket whatever
    ``host`` the app was built for (so a wildcard bind's configuration is tested without leaving this machine)."""

    def __init__(self, host: str, **kwargs):
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        app = mcp_server.http_app(host, self.port, offline=True, **kwargs)
        config = uvicorn.Config(app, log_level="critical", http=mcp_server.limited_h11_protocol())
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.server.started
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)

    def post(self, headers: dict[str, str]) -> int:
        """An initialize POST to 127.0.0.1 with these headers (Host among them); the response's status."""
        head = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                "Content-Length": str(len(INITIALIZE)), "Connection": "close", **headers}
        raw = "POST /mcp HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items()) + "\r\n"
        with socket.create_connection(("127.0.0.1", self.port)) as s:
            s.settimeout(20)
            s.sendall(raw.encode() + INITIALIZE.encode())
            return int(s.recv(200).split(b" ", 2)[1])


# ------------------------------------------------------------------------------------------ defect 7: network mode


def test_a_wildcard_bind_serves_any_host_name_to_a_client_with_the_token():
    """`serve --http --host 0.0.0.0 --auth-token T` answered 421 to every network client (the Host check allowed only
    loopback names); the token is the guard, so any Host name the client used is served, and nothing without it."""
    with InThreadServer("0.0.0.0", auth_token=TOKEN) as srv:
        lan = {"Host": f"gpu-box.lan:{srv.port}"}
        assert srv.post({**lan, "Authorization": f"Bearer {TOKEN}"}) == 200
        assert srv.post({"Host": f"192.168.1.20:{srv.port}", "Authorization": f"Bearer {TOKEN}"}) == 200
        assert srv.post({**lan, "Origin": f"http://gpu-box.lan:{srv.port}", "Authorization": f"Bearer {TOKEN}"}) == 200
        assert srv.post(lan) == 401
        assert srv.post({**lan, "Authorization": "Bearer wrong-token-of-some-length"}) == 401
        assert srv.post({"Host": f"127.0.0.1:{srv.port}"}) == 401


def test_the_bearer_scheme_is_case_insensitive():
    """RFC 7235: auth schemes are case-insensitive; `Authorization: bearer T` got 401."""
    with InThreadServer("0.0.0.0", auth_token=TOKEN) as srv:
        host = {"Host": f"gpu-box.lan:{srv.port}"}
        for scheme in ("bearer", "BEARER", "Bearer", "bEaReR"):
            assert srv.post({**host, "Authorization": f"{scheme} {TOKEN}"}) == 200, scheme
        assert srv.post({**host, "Authorization": f"Bearer  {TOKEN}"}) == 200  # 1*SP
        assert srv.post({**host, "Authorization": f"Basic {TOKEN}"}) == 401
        assert srv.post({**host, "Authorization": TOKEN}) == 401
        assert srv.post({**host, "Authorization": f"Bearer {TOKEN}x"}) == 401
        assert srv.post({**host, "Authorization": "Bearer"}) == 401


def test_allowed_host_restricts_the_host_names():
    with InThreadServer("0.0.0.0", auth_token=TOKEN, allowed_hosts=["gpu-box.lan"]) as srv:
        auth = {"Authorization": f"bearer {TOKEN}"}
        assert srv.post({"Host": f"gpu-box.lan:{srv.port}", **auth}) == 200
        assert srv.post({"Host": "gpu-box.lan", **auth}) == 200  # behind a proxy on port 80
        assert srv.post({"Host": f"127.0.0.1:{srv.port}", **auth}) == 200  # this machine stays allowed
        assert srv.post({"Host": f"other.lan:{srv.port}", **auth}) == 421
        assert srv.post({"Host": f"gpu-box.lan:{srv.port}", "Origin": f"http://gpu-box.lan:{srv.port}", **auth}) == 200
        assert srv.post({"Host": f"gpu-box.lan:{srv.port}", "Origin": "http://attacker.example", **auth}) == 403
        assert srv.post({"Host": f"gpu-box.lan:{srv.port}"}) == 401


def test_a_loopback_bind_keeps_its_host_check_and_takes_allowed_hosts():
    with InThreadServer("127.0.0.1") as srv:
        assert srv.post({"Host": f"127.0.0.1:{srv.port}"}) == 200
        assert srv.post({"Host": f"gpu-box.lan:{srv.port}"}) == 421  # a DNS-rebinding page's Host
    with InThreadServer("127.0.0.1", allowed_hosts=["mcp.example.org"]) as srv:  # behind a reverse proxy
        assert srv.post({"Host": "mcp.example.org"}) == 200
        assert srv.post({"Host": f"gpu-box.lan:{srv.port}"}) == 421


def test_the_allowed_host_option(monkeypatch, capsys):
    args = build_parser().parse_args(["serve", "--http", "--allowed-host", "a.lan", "--allowed-host", "10.0.0.2"])
    assert args.allowed_host == ["a.lan", "10.0.0.2"]
    monkeypatch.delenv(mcp_server.AUTH_TOKEN_ENV, raising=False)
    seen = {}
    monkeypatch.setattr(mcp_server, "run_http", lambda *a, **k: seen.update(k))
    assert cli_main(["serve", "--http", "--host", "0.0.0.0", "--auth-token", TOKEN, "--allowed-host", "a.lan"]) == 0
    assert seen["allowed_hosts"] == ["a.lan"]
    for bad in ("http://a.lan", "a.lan/mcp", "a.lan:8080", "*", "a b", ""):
        assert cli_main(["serve", "--http", "--allowed-host", bad]) == 2, bad
        assert "--allowed-host" in capsys.readouterr().err
    assert cli_main(["serve", "--allowed-host", "a.lan"]) == 2  # stdio has no Host header
    assert "only with --http" in capsys.readouterr().err
    assert seen == {"offline": False, "auth_token": TOKEN, "allowed_hosts": ["a.lan"]}  # no server was started since


# ------------------------------------------------------------------------------------------ item 7: serving


def _burst(port: int, connections: int) -> list[int]:
    """Open ``connections`` connections to 127.0.0.1:``port`` at once, then send an initialize POST on each while all
    are open; the statuses."""

    async def run() -> list[int]:
        opened = [await asyncio.open_connection("127.0.0.1", port) for _ in range(connections)]
        head = ("POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                "Accept: application/json, text/event-stream\r\nContent-Length: {n}\r\n\r\n")

        async def one(reader, writer) -> int:
            writer.write(head.format(port=port, n=len(INITIALIZE)).encode() + INITIALIZE.encode())
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), 60)
            writer.close()
            return int(line.split(b" ", 2)[1]) if line else 0

        return list(await asyncio.gather(*(one(r, w) for r, w in opened)))

    return asyncio.run(run())


def test_every_open_connection_is_admitted():
    """The server answered 503 above 256 concurrent requests while it accepted 512 connections (uvicorn counts open
    connections against limit_concurrency): admission now matches the connection cap. 600 connections, as 300 MCP
    clients hold (a POST connection and the GET stream each), all answered."""
    assert mcp_server.MAX_CONNECTIONS >= 1024
    from mcp_helpers import http_server

    with http_server(extra=["--offline"]) as (url, _proc):
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        statuses = _burst(port, 600)
    assert statuses.count(200) == 600, {s: statuses.count(s) for s in set(statuses)}


def test_a_500_client_burst_is_answered_in_full():
    """500 MCP SDK clients (which do not retry a 503) open their sessions at once and each make a call: every call is
    answered, none fails."""
    from benchmarks.bench_http_load import run

    r = run(clients=500, calls=1, seed=3, call_timeout=300.0)
    assert r["errors"] == 0 and r["calls_answered"] == 500, r["error_samples"]


def test_the_uvicorn_access_log_is_off(monkeypatch):
    """The configuration meant to turn the access log off, but log_level="info" turned it back on: one stderr line
    per request."""
    import uvicorn
    from mcp_helpers import http_server

    seen = {}

    class FakeServer:
        def __init__(self, config):
            seen["config"] = config

        async def serve(self):
            return None

    with monkeypatch.context() as m:
        m.setattr(uvicorn, "Server", FakeServer)
        m.setattr(mcp_server, "tune_gc_for_serving", lambda: None)  # the test process keeps its own collector
        mcp_server.run_http("127.0.0.1", 8765, offline=True)
    assert seen["config"].access_log is False

    import http.client

    with http_server(extra=["--offline"]) as (url, proc):
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        for _ in range(3):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("POST", "/mcp", body=INITIALIZE, headers={
                "Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
            assert conn.getresponse().status == 200
            conn.close()
        proc.terminate()
        proc.wait(10)
        proc.stderr_file.seek(0)
        log = proc.stderr_file.read()
    assert '"POST /mcp' not in log and "HTTP/1.1\" 200" not in log, log[-2000:]


# ------------------------------------------------------------------------------------------ item 7: the cache


ARGS = {"model": "Qwen/Qwen2.5-7B-Instruct", "gpu": "RTX 4090", "seq_len": 2048}


def _count_estimates(monkeypatch) -> list[int]:
    calls = [0]
    real = mcp_server._estimate

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(mcp_server, "_estimate", counted)
    return calls


@pytest.mark.anyio
async def test_repeated_identical_calls_are_answered_from_the_cache(monkeypatch):
    calls = _count_estimates(monkeypatch)
    async with Client(mcp_server.build_server(offline=True)) as client:
        first = await client.call_tool("estimate_memory", ARGS)
        # the same arguments in another order, and once more: the same answer, computed once
        again = await client.call_tool("estimate_memory", dict(reversed(list(ARGS.items()))))
        third = await client.call_tool("estimate_memory", ARGS)
        assert calls[0] == 1
        assert not first.is_error and again.structured_content == first.structured_content == third.structured_content
        assert [c.text for c in again.content] == [c.text for c in first.content]
        # other arguments, another tool, a value of another type: computed
        await client.call_tool("estimate_memory", {**ARGS, "seq_len": 1024})
        assert calls[0] == 2
        await client.call_tool("make_recipe", ARGS)
        assert calls[0] == 3
        bad = await client.call_tool("estimate_memory", {**ARGS, "seq_len": True})
        assert bad.is_error and calls[0] == 3
        await client.call_tool("estimate_memory", {**ARGS, "seq_len": 2048.0})  # validated to 2048, a new key
        assert calls[0] == 4


@pytest.mark.anyio
async def test_errors_are_not_cached(monkeypatch):
    calls = _count_estimates(monkeypatch)
    async with Client(mcp_server.build_server(offline=True)) as client:
        for _ in range(2):
            bad = await client.call_tool("estimate_memory", {"model": "Qwen/Qwen2.5-7B", "gpu": "T4", "dtype": "bf16"})
            assert bad.is_error
        assert calls[0] == 2


@pytest.mark.anyio
async def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(mcp_server, "ANSWER_CACHE_ENTRIES", 2)
    calls = _count_estimates(monkeypatch)
    server = mcp_server.build_server(offline=True)
    async with Client(server) as client:
        for seq_len in (512, 1024, 2048, 512):
            await client.call_tool("estimate_memory", {**ARGS, "seq_len": seq_len})
        assert calls[0] == 4  # 512 was evicted by 2048
        await client.call_tool("estimate_memory", {**ARGS, "seq_len": 2048})
        assert calls[0] == 4
    assert len(server.answer_cache) == 2


@pytest.mark.anyio
async def test_only_answers_that_did_not_touch_the_network_are_cached(monkeypatch, tmp_path):
    from canifinetune.estimator.catalog import find_model
    from canifinetune.estimator.model_sources import ResolvedModel
    from canifinetune.estimator.spec import ModelSpec

    calls = _count_estimates(monkeypatch)
    config = find_model("Qwen/Qwen2.5-0.5B-Instruct").config_dict()

    def from_the_hub(name, offline):  # what the Hub would answer: a model read over the network
        return ResolvedModel(name, "hub", config, ModelSpec.from_config(config))

    monkeypatch.setattr(mcp_server, "_resolve", from_the_hub)
    hub_args = {"model": "someone/some-model", "gpu": "RTX 4090"}
    async with Client(mcp_server.build_server(offline=False)) as client:
        for _ in range(2):
            assert not (await client.call_tool("estimate_memory", hub_args)).is_error
        assert calls[0] == 2
    monkeypatch.undo()

    # a local folder: cached while its files are unchanged, computed again once they change
    calls = _count_estimates(monkeypatch)
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    local = {"model": str(folder), "gpu": "RTX 4090"}
    async with Client(mcp_server.build_server(offline=False)) as client:
        first = await client.call_tool("estimate_memory", local)
        await client.call_tool("estimate_memory", local)
        assert calls[0] == 1 and not first.is_error
        bigger = {**config, "num_hidden_layers": config["num_hidden_layers"] * 2}
        (folder / "config.json").write_text(json.dumps(bigger, indent=1))
        changed = await client.call_tool("estimate_memory", local)
        assert calls[0] == 2
        assert changed.structured_content["params_total"] > first.structured_content["params_total"]


# ------------------------------------------------------------------------------------------ item 7: output schemas


def test_output_schemas_carry_no_prose():
    """outputSchema is for validating the structured content: types, required fields, enums; no descriptions or
    defaults (docs/mcp.md describes the fields)."""
    server = mcp_server.build_server(offline=True)

    def annotations(node, path=""):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("properties", "$defs") and isinstance(value, dict):
                    for name, sub in value.items():
                        yield from annotations(sub, f"{path}/{key}/{name}")
                elif key in ("description", "default", "title", "examples"):
                    yield f"{path}/{key}"
                else:
                    yield from annotations(value, f"{path}/{key}")
        elif isinstance(node, list):
            for i, item in enumerate(node):
                yield from annotations(item, f"{path}[{i}]")

    for tool in server._tool_manager.list_tools():
        schema = tool.fn_metadata.output_schema
        assert schema["type"] == "object" and schema["required"], tool.name
        assert list(annotations(schema)) == [], tool.name


# ------------------------------------------------------------------------------------------ the benchmark


def test_the_http_vs_bare_benchmark_runs():
    """The benchmark itself, tiny (figures only; no timing is asserted)."""
    from benchmarks.bench_http_vs_bare import run

    r = run(levels=[2], calls=2, repeat=True)
    (row,) = r["rows"]
    for side in ("canifinetune", "bare"):
        assert row[side]["errors"] == 0 and row[side]["calls_answered"] == 4, row[side]
    assert row["throughput_ratio"] > 0 and row["p99_ratio"] > 0
    assert r["answer_bytes"]["bare"] == r["answer_bytes"]["canifinetune"]



def test_the_tool_cpu_benchmark_runs(capsys):
    """benchmarks/bench_tool_cpu.py, tiny: both collector settings measured in their own processes, every tool of the
    mix reported (figures only; no timing is asserted)."""
    from benchmarks.bench_tool_cpu import main

    assert main(["--clients", "2", "--calls", "5", "--passes", "1"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("gc ")]
    assert [line.split(":")[0].split()[1] for line in lines] == ["default", "tuned"]
    for line in lines:
        assert "estimate_memory" in line and "garbage collector" in line


def test_a_failed_session_names_its_innermost_exception():
    """The load harness reports what ended a session, not 'unhandled errors in a TaskGroup'."""
    import builtins

    from benchmarks.bench_http_load import _innermost

    group = getattr(builtins, "ExceptionGroup", None) or pytest.importorskip("exceptiongroup").ExceptionGroup
    exc = group("unhandled errors in a TaskGroup", [group("inner", [TimeoutError("read timed out")])])
    assert _innermost(exc) == "ExceptionGroup(1) > ExceptionGroup(1) > TimeoutError: read timed out"
    assert _innermost(ValueError("x")) == "ValueError: x"
