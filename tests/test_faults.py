"""Faults over streamable HTTP: the server refuses or drops the bad request and keeps serving the others.

One `canifinetune serve --http` on a free 127.0.0.1 port for the module. Each fault is sent with the
standard library's http.client or a raw socket (the MCP client would never send it); after each, an
MCP client (and, where it matters, the session the fault was sent on) still gets answers.
``test_faults_while_a_client_works`` fires them all while another client calls the tools in a loop,
and checks every one of its calls succeeded.
"""

from __future__ import annotations

import http.client
import json
import socket
import struct
import time

import anyio
import pytest
from mcp import Client
from mcp_helpers import free_port, http_server

from canifinetune.server.mcp_server import MAX_REQUEST_BODY_BYTES

pytestmark = pytest.mark.anyio

HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
PROTOCOL = "2025-06-18"
# A slow call (~50-150 ms): nothing fits, so the search runs and then the smallest GPU and GPU count are sought.
SLOW_CALL = {"name": "suggest_cheaper_config",
             "arguments": {"model": "meta-llama/Llama-3.1-70B", "method": "full", "gpu": "RTX 3060 12GB"}}
FAST_CALL = {"name": "estimate_memory", "arguments": {"model": "Qwen/Qwen2.5-0.5B", "gpu": "RTX 4090"}}
MALFORMED = [
    b"{not json",
    b"",
    b"\xff\xfe\x00garbage",
    b"[]",
    b"null",
    b'"a string"',
    b'{"jsonrpc":"2.0"}',
    b'{"jsonrpc":"1.0","id":1,"method":"ping"}',
    b'{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}',
    b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"x"}',
    b"[" * 50_000 + b"]" * 50_000,
    b'{"jsonrpc":"2.0","id":1,"method":"ping"' + b" " * 1000,
]


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def server():
    port = free_port()
    with http_server(port) as (url, proc):
        yield {"url": url, "port": port, "proc": proc}
        assert proc.poll() is None, "the server died"
        proc.stderr_file.seek(0)
        log = proc.stderr_file.read()
        # no request reached uvicorn as an unhandled exception, no session crashed; the only errors logged are
        # the SDK's for a client that vanished halfway through sending its body (ClientDisconnect)
        assert "Exception in ASGI application" not in log and "crashed" not in log, log[-4000:]
        assert log.count(" ERROR ") == log.count("ClientDisconnect"), log[-4000:]


def _request(port: int, body: bytes, headers: dict | None = None, session: str | None = None,
             method: str = "POST") -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        h = {**HEADERS, **(headers or {})}
        if session:
            h["mcp-session-id"] = session
        conn.request(method, "/mcp", body=body, headers=h)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _rpc(id_: int, method: str, params: dict | None = None) -> bytes:
    msg = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        msg["params"] = params
    return json.dumps(msg).encode()


def _sse_result(body: bytes) -> dict:
    """The JSON-RPC message of an SSE (or JSON) response."""
    text = body.decode("utf-8")
    for line in text.splitlines():
        if line.startswith("data: "):
            return json.loads(line[6:])
    return json.loads(text)


def open_session(port: int) -> str:
    status, headers, body = _request(port, _rpc(1, "initialize", {
        "protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "faults", "version": "1"}}))
    assert status == 200, body
    session = headers["mcp-session-id"]
    status, _, _ = _request(port, json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode(),
                            session=session, headers={"mcp-protocol-version": PROTOCOL})
    assert status == 202
    return session


def call_on(port: int, session: str, call: dict = FAST_CALL, id_: int = 99) -> dict:
    status, _, body = _request(port, _rpc(id_, "tools/call", call), session=session,
                               headers={"mcp-protocol-version": PROTOCOL})
    assert status == 200, body
    message = _sse_result(body)
    assert message.get("id") == id_ and "result" in message, message
    return message["result"]


async def still_serving(url: str) -> None:
    async with Client(url) as client:
        result = await client.call_tool(FAST_CALL["name"], FAST_CALL["arguments"])
        assert not result.is_error and result.structured_content["verdict"] == "fits"


# ----------------------------------------------------------------------------------------- faults


def malformed_messages(port: int) -> None:
    session = open_session(port)
    for body in MALFORMED:
        for sid in (None, session):
            status, _, reply = _request(port, body, session=sid, headers={"mcp-protocol-version": PROTOCOL})
            if status == 202:  # the SDK reads a request with an object id as a notification: dropped, no reply
                assert not reply and b'"id":{' in body, (body[:60], reply[:200])
                continue
            assert status == 400, (body[:60], status, reply[:200])
            error = json.loads(reply)["error"]
            assert error["code"] in (-32700, -32600, -32602), error
    # valid JSON-RPC that makes no sense to the server: answered as errors on the same session
    for i, (method, params) in enumerate(
        [
            ("no/such/method", {}),
            ("tools/call", {"name": "estimate_memory", "arguments": "x"}),
            ("tools/call", {"name": "rm -rf", "arguments": {}}),
        ]
    ):
        status, _, reply = _request(port, _rpc(10 + i, method, params), session=session,
                                    headers={"mcp-protocol-version": PROTOCOL})
        assert status == 200
        message = _sse_result(reply)
        assert "error" in message or message["result"].get("isError"), message
    assert call_on(port, session)["structuredContent"]["verdict"] == "fits"  # the session lives on


def oversized_bodies(port: int) -> None:
    session = open_session(port)
    big = b'{"jsonrpc":"2.0","id":7,"method":"ping","params":{"pad":"' + b"x" * MAX_REQUEST_BODY_BYTES + b'"}}'
    status, _, reply = _request(port, big, session=session)
    assert status == 413, reply[:200]
    # no Content-Length: the same body streamed in chunks is cut off at the limit too
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        chunks = (big[i:i + 65536] for i in range(0, len(big), 65536))
        conn.request("POST", "/mcp", body=chunks, encode_chunked=True,
                     headers={**HEADERS, "mcp-session-id": session, "Transfer-Encoding": "chunked"})
        assert conn.getresponse().status == 413
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may answer 413 and close before the client finished sending: refused either way
    finally:
        conn.close()
    # a lying Content-Length (huge) is refused before anything is read
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        sock.sendall(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                     f"Accept: application/json, text/event-stream\r\nContent-Length: {10**12}\r\n\r\n{{".encode())
        assert b" 413 " in sock.recv(4096).split(b"\r\n")[0]
    finally:
        sock.close()
    # just under the limit is read, parsed and answered (here: a tool error for the over-long model name)
    model = "x" * (MAX_REQUEST_BODY_BYTES - 300)
    result = call_on(port, session, {"name": "estimate_memory", "arguments": {"model": model}})
    assert result["isError"] and "model" in result["content"][0]["text"]
    assert call_on(port, session)["structuredContent"]["verdict"] == "fits"


def foreign_host_and_origin(port: int) -> None:
    session = open_session(port)
    foreign = [
        ({"Host": "attacker.example"}, 421),
        ({"Host": f"attacker.example:{port}"}, 421),
        ({"Host": f"127.0.0.1.attacker.example:{port}"}, 421),
        ({"Host": f"localhost.:{port}"}, 421),
        ({"Host": f"127.0.0.1:{port}", "Origin": "http://attacker.example"}, 403),
        ({"Host": f"127.0.0.1:{port}", "Origin": f"http://attacker.example:{port}"}, 403),
        ({"Host": f"127.0.0.1:{port}", "Origin": "null"}, 403),
        ({"Host": f"127.0.0.1:{port}", "Origin": f"http://127.0.0.1:{port + 1}"}, 403),
        ({"Host": f"127.0.0.1:{port}", "Origin": f"https://localhost:{port}"}, 403),
    ]
    for headers, expected in foreign:
        for sid, body in ((None, _rpc(1, "initialize", {"protocolVersion": PROTOCOL, "capabilities": {},
                                                          "clientInfo": {"name": "evil", "version": "1"}})),
                          (session, _rpc(5, "tools/call", FAST_CALL))):
            status, _, _ = _request(port, body, headers=headers, session=sid)
            assert status == expected, (headers, sid, status)
        status, _, _ = _request(port, b"", headers=headers, session=session, method="DELETE")
        assert status == expected, (headers, "DELETE", status)  # a foreign page cannot end the session either
    assert call_on(port, session)["structuredContent"]["verdict"] == "fits"


def disconnects_mid_call(port: int, times: int = 10) -> None:
    session = open_session(port)
    for i in range(times):
        body = _rpc(100 + i, "tools/call", SLOW_CALL)
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                     f"Accept: application/json, text/event-stream\r\nmcp-session-id: {session}\r\n"
                     f"mcp-protocol-version: {PROTOCOL}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(0.005 * (i % 4))  # before, or during, the call
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST, not FIN
        sock.close()
    # a client that promises a body and vanishes halfway through it
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                 f"Accept: application/json, text/event-stream\r\nmcp-session-id: {session}\r\n"
                 f"Content-Length: 1000\r\n\r\n{{\"jsonrpc\":".encode())
    sock.close()
    # the session that lost those calls still answers, with the slow call too
    assert call_on(port, session, SLOW_CALL, id_=500)["structuredContent"]["nothing_fits"] in (True, False)
    assert call_on(port, session)["structuredContent"]["verdict"] == "fits"


# ----------------------------------------------------------------------------------------- tests


async def test_malformed_json_rpc(server):
    await anyio.to_thread.run_sync(malformed_messages, server["port"])
    await still_serving(server["url"])


async def test_oversized_request_body(server):
    assert MAX_REQUEST_BODY_BYTES == 1024 * 1024
    await anyio.to_thread.run_sync(oversized_bodies, server["port"])
    await still_serving(server["url"])


async def test_foreign_host_or_origin(server):
    await anyio.to_thread.run_sync(foreign_host_and_origin, server["port"])
    await still_serving(server["url"])


async def test_client_disconnects_mid_call(server):
    await anyio.to_thread.run_sync(disconnects_mid_call, server["port"])
    await still_serving(server["url"])


async def test_mcp_client_cancels_mid_call(server):
    """The SDK's own client giving up on a call (a timeout in an assistant) leaves its session usable."""
    async with Client(server["url"]) as client:
        for delay in (0.0, 0.002, 0.01, 0.03):
            with anyio.move_on_after(delay):
                await client.call_tool(SLOW_CALL["name"], SLOW_CALL["arguments"])
        result = await client.call_tool(FAST_CALL["name"], FAST_CALL["arguments"])
        assert not result.is_error
    await still_serving(server["url"])


async def test_faults_while_a_client_works(server):
    """Every fault at once, beside a client calling all three tools: each of its calls succeeds."""
    calls = [FAST_CALL, {"name": "make_recipe", "arguments": {"model": "Qwen/Qwen2.5-1.5B", "gpu": "RTX 4090"}},
             {"name": "suggest_cheaper_config", "arguments": {"model": "Qwen/Qwen2.5-7B", "gpu": "RTX 3060 12GB",
                                                             "method": "full"}}]
    done: list[bool] = []
    faults_over = anyio.Event()

    async def worker():
        async with Client(server["url"]) as client:
            while not faults_over.is_set() or len(done) < 30:
                call = calls[len(done) % len(calls)]
                result = await client.call_tool(call["name"], call["arguments"])
                done.append(not result.is_error)

    async def faults():
        try:
            for fault in (malformed_messages, oversized_bodies, foreign_host_and_origin, disconnects_mid_call):
                await anyio.to_thread.run_sync(fault, server["port"])
        finally:
            faults_over.set()

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker)
            tg.start_soon(faults)
    assert len(done) >= 30 and all(done), done


def test_load_benchmark_smoke():
    """benchmarks/bench_http_load.py, small: the full run (200 clients x 20 calls) is a benchmark, not a test."""
    from benchmarks.bench_http_load import run

    result = run(clients=12, calls=3, seed=1)
    assert result["errors"] == 0, result["error_samples"]
    assert result["calls_answered"] == 36 and result["server_alive_after"]
    assert result["p50_ms"] <= result["p99_ms"] and result["server_peak_rss_mib"] > 0
