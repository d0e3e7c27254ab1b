"""A real HTTP server answering the Hugging Face Hub endpoints huggingface_hub 2.x calls, for tests.

It serves a handful of repos from memory on 127.0.0.1 (a free port): ``HEAD``/``GET``
``/{repo}/resolve/{revision}/{file}`` (with ``Range``), ``/api/models/{repo}`` and
``/api/models/{repo}/revision/{revision}``, with the headers huggingface_hub reads
(``X-Repo-Commit``, ``ETag``/``X-Linked-Etag``, ``X-Linked-Size``, ``X-Error-Code``). Safetensors files
are virtual: a real header (8-byte little-endian length + JSON) followed by zeros that are never
materialized, so a test can tell a header read (a ``Range`` request) from a weight download.
Every request is recorded in ``HubServer.requests``.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DTYPE_SIZES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I8": 1, "U8": 1, "F8_E4M3": 1}


@dataclass
class VirtualFile:
    """A file whose first bytes are ``head`` and whose remaining ``size - len(head)`` bytes are zeros."""

    head: bytes
    size: int
    lfs: bool = False

    @classmethod
    def of(cls, data: bytes | str) -> VirtualFile:
        raw = data.encode() if isinstance(data, str) else data
        return cls(raw, len(raw))

    def read(self, start: int, end: int) -> bytes:  # inclusive end, as in HTTP ranges
        end = min(end, self.size - 1)
        if start > end:
            return b""
        head = self.head[start:end + 1]
        return head + b"\0" * (end + 1 - start - len(head))

    @property
    def etag(self) -> str:
        return hashlib.sha256(self.head + str(self.size).encode()).hexdigest()


def safetensors_file(tensors: dict[str, tuple[str, list[int]]]) -> VirtualFile:
    """A safetensors file per the format spec: u64 LE header length, JSON header (space-padded to 8), data."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = DTYPE_SIZES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    head = struct.pack("<Q", len(text)) + text
    return VirtualFile(head, len(head) + offset, lfs=True)


def llama_tensors(config: dict, layers: range, *, embed: bool, final: bool, dtype: str = "BF16") -> dict:
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    hd = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    out: dict[str, tuple[str, list[int]]] = {}
    if embed:
        out["model.embed_tokens.weight"] = (dtype, [v, h])
    for n in layers:
        p = f"model.layers.{n}."
        out[p + "self_attn.q_proj.weight"] = (dtype, [q, h])
        out[p + "self_attn.k_proj.weight"] = (dtype, [kv, h])
        out[p + "self_attn.v_proj.weight"] = (dtype, [kv, h])
        out[p + "self_attn.o_proj.weight"] = (dtype, [h, q])
        out[p + "mlp.gate_proj.weight"] = (dtype, [i, h])
        out[p + "mlp.up_proj.weight"] = (dtype, [i, h])
        out[p + "mlp.down_proj.weight"] = (dtype, [h, i])
        out[p + "input_layernorm.weight"] = (dtype, [h])
        out[p + "post_attention_layernorm.weight"] = (dtype, [h])
    if final:
        out["model.norm.weight"] = (dtype, [h])
        if not config.get("tie_word_embeddings"):
            out["lm_head.weight"] = (dtype, [v, h])
    return out


@dataclass
class Repo:
    files: dict[str, VirtualFile]
    commit: str = ""
    gated_token: str | None = None  # when set: gated, only this token gets in
    delay: float = 0.0  # seconds every request waits before answering

    def __post_init__(self):
        if not self.commit:
            self.commit = hashlib.sha1(json.dumps(sorted(self.files)).encode()).hexdigest()


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None


@dataclass
class HubServer:
    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    httpd: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.httpd is not None
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> HubServer:
        hub = self

        class Handler(_Handler):
            server_state = hub

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_state: HubServer

    def log_message(self, *args):  # quiet
        pass

    def do_HEAD(self):
        self._answer(head=True)

    def do_GET(self):
        self._answer(head=False)

    def _send(self, status: int, headers: dict[str, str], body: bytes = b"", head: bool = False) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        if "Content-Length" not in headers:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head and body:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, head: bool, extra: dict | None = None) -> None:
        body = json.dumps({"error": message}).encode()
        headers = {
            "Content-Type": "application/json",
            "X-Error-Code": code,
            "X-Error-Message": message,
            **(extra or {}),
        }
        self._send(status, headers, body, head)

    def _answer(self, head: bool) -> None:
        state = self.server_state
        path = self.path.split("?", 1)[0]
        state.requests.append(Request(self.command, path, self.headers.get("Range"), self.headers.get("Authorization")))
        m = _RESOLVE.match(path) or _API.match(path)
        if not m:
            return self._error(404, "NotFound", "no such endpoint", head)
        repo = state.repos.get(m["repo"])
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found", head)
        if repo.delay:
            time.sleep(repo.delay)
        if repo.gated_token is not None and self.headers.get("Authorization") != f"Bearer {repo.gated_token}":
            return self._error(
                401,
                "GatedRepo",
                f"Access to model {m['repo']} is restricted. "
                "You must have access to it and be authenticated to access it. Please log in.",
                head,
            )
        commit = {"X-Repo-Commit": repo.commit}
        if path.startswith("/api/"):
            info = {"id": m["repo"], "modelId": m["repo"], "sha": repo.commit, "private": False,
                    "gated": "manual" if repo.gated_token else False,
                    "siblings": [{"rfilename": name} for name in sorted(repo.files)]}
            return self._send(200, {"Content-Type": "application/json"}, json.dumps(info).encode(), head)
        name = m["file"]
        f = repo.files.get(name)
        if f is None:
            return self._error(404, "EntryNotFound", f"{name} does not exist on \"{m['rev']}\"", head, commit)
        headers = {
            **commit,
            "ETag": f'"{f.etag}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if f.lfs:
            headers["X-Linked-Etag"] = f'"{f.etag}"'
            headers["X-Linked-Size"] = str(f.size)
        rng = self.headers.get("Range")
        if rng:
            rm = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if not rm:
                return self._error(416, "RangeNotSatisfiable", "bad range", head)
            start = int(rm[1])
            end = int(rm[2]) if rm[2] else f.size - 1
            if start >= f.size:
                return self._error(
                    416, "RangeNotSatisfiable", "bad range", head, {"Content-Range": f"bytes */{f.size}"}
                )
            end = min(end, f.size - 1)
            body = b"" if head else f.read(start, end)
            headers.update({"Content-Range": f"bytes {start}-{end}/{f.size}", "Content-Length": str(end - start + 1)})
            return self._send(206, headers, body, head)
        headers["Content-Length"] = str(f.size)
        if head:
            return self._send(200, headers, head=True)
        # A whole-file GET: stream it (a weight download; tests assert safetensors never get one).
        self.send_response(200)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        pos = 0
        while pos < f.size:
            chunk = f.read(pos, min(pos + (1 << 20), f.size) - 1)
            try:
                self.wfile.write(chunk)
            except OSError:
                return
            pos += len(chunk)
