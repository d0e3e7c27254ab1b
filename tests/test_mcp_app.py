"""The MCP App (server/app.py): bound to estimate_memory and suggest_cheaper_config, self-contained, and it draws.

The drawing tests feed a real tool result to the page in headless Chromium, two ways: inlined (the
preview path), and through a stand-in host page that speaks the Apps postMessage protocol to the app in
an iframe (ui/initialize -> ui/notifications/initialized -> ui/notifications/tool-result). They check
the screenshot is not blank and that the labels are in the DOM. Chromium: Debian's `chromium` package
(.ci/run installs it); without it these tests skip and say so.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from mcp import Client
from mcp.server.apps import APP_MIME_TYPE

from canifinetune.server.app import BUDGET_APP_URI, budget_app_html, preview_html
from canifinetune.server.mcp_server import build_server, estimate_memory_impl, suggest_impl

pytestmark = pytest.mark.anyio

ESTIMATE_ARGS = {"model": "Qwen/Qwen2.5-7B-Instruct", "method": "qlora", "gpu": "RTX 4090", "seq_len": 2048}
SUGGEST_ARGS = {"model": "Qwen/Qwen2.5-7B-Instruct", "method": "lora", "gpu": "RTX 4090", "seq_len": 2048}


@pytest.fixture
def anyio_backend():
    return "asyncio"


# ------------------------------------------------------------------------------ protocol and content


async def test_tools_bound_to_the_app_and_resource_served():
    async with Client(build_server()) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        resources = {str(r.uri): r for r in (await client.list_resources()).resources}
        read = await client.read_resource(BUDGET_APP_URI)
    for name in ("estimate_memory", "suggest_cheaper_config"):
        assert tools[name].meta == {"ui": {"resourceUri": BUDGET_APP_URI}}
    assert not (tools["make_recipe"].meta or {}).get("ui")
    assert resources[BUDGET_APP_URI].mime_type == APP_MIME_TYPE
    assert read.contents[0].mime_type == APP_MIME_TYPE
    assert read.contents[0].text == budget_app_html()


async def test_text_and_structured_results_stay_complete_without_apps():
    """A host without Apps still gets the whole answer: the text and the structured content."""
    async with Client(build_server()) as client:
        est = await client.call_tool("estimate_memory", ESTIMATE_ARGS)
        sug = await client.call_tool("suggest_cheaper_config", SUGGEST_ARGS)
    assert not est.is_error and not sug.is_error
    text = est.content[0].text
    assert text.startswith("FITS") and all(c["name"] in text for c in est.structured_content["breakdown"])
    assert sug.structured_content["suggestions"] and "next:" in sug.content[0].text


def test_html_is_self_contained():
    page = budget_app_html()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page, re.I)
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"\b(fetch|XMLHttpRequest|WebSocket|EventSource|importScripts)\b", page)
    assert "@import" not in page and "url(" not in page
    assert "<style>" in page and "<script>" in page


def test_preview_escapes_the_inlined_result():
    page = preview_html({"breakdown": [], "model": "</script><script>alert(1)</script>"})
    assert "</script><script>alert(1)" not in page


# ------------------------------------------------------------------------------ headless Chromium

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed (apt-get install -y chromium; .ci/run does)")


def _chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", "--hide-scrollbars", "--force-color-profile=srgb",
           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=3000", *args, page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


def _png_colors(path: Path) -> int:
    """Distinct RGB colours of an 8-bit RGB/RGBA PNG (what Chromium writes), with a minimal decoder."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6), f"unexpected PNG format depth={depth} color={color}"
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride = zlib.decompress(idat), width * bpp
    prev, colors, i = bytearray(stride), set(), 0
    for _ in range(height):
        f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], (prev[x - bpp] if x >= bpp else 0)
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        colors.update(bytes(line[x:x + 3]) for x in range(0, stride, bpp))
        prev = line
    return len(colors)


def _render(tmp_path: Path, page: Path, size: str = "900,700") -> tuple[str, int]:
    shot = tmp_path / "shot.png"
    dom = _chromium(tmp_path, page, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    pic = _chromium(tmp_path, page, f"--screenshot={shot}", f"--window-size={size}")
    assert pic.returncode == 0 and shot.is_file(), pic.stderr[-2000:]
    return html.unescape(dom.stdout), _png_colors(shot)


@needs_chromium
def test_estimate_picture_renders(tmp_path):
    est = estimate_memory_impl(dict(ESTIMATE_ARGS)).structured_content
    page = tmp_path / "estimate.html"
    page.write_text(preview_html(est), encoding="utf-8")
    dom, colors = _render(tmp_path, page)
    assert 'data-rendered="estimate"' in dom
    assert "FITS" in dom and "Qwen/Qwen2.5-7B-Instruct on RTX 4090" in dom
    assert "GPU usable 23.88 GiB" in dom
    for c in est["breakdown"]:  # one bar segment and one table row per component
        assert f'data-component="{c["name"]}"' in dom and c["name"] in dom
    assert colors > 12, f"the screenshot looks blank ({colors} colours)"


@needs_chromium
def test_suggestions_side_by_side_render(tmp_path):
    sug = suggest_impl(dict(SUGGEST_ARGS)).structured_content
    assert sug["suggestions"]
    page = tmp_path / "suggest.html"
    page.write_text(preview_html(sug), encoding="utf-8")
    dom, colors = _render(tmp_path, page)
    assert 'data-rendered="suggestions"' in dom and "your plan" in dom and "DOES NOT FIT" in dom
    for i, s in enumerate(sug["suggestions"], 1):  # the SuggestResult: each card its changes, estimate and cost
        assert f"suggestion {i}" in dom and s["cost"]["summary"] in dom
        assert all(c["field"] in dom for c in s["changes"])
    assert "apply the first: " in dom and "smallest catalog GPU for the plan unchanged: " + sug["smallest_gpu"] in dom
    assert "fewest GPUs for the plan unchanged: %d x RTX 4090" % sug["min_gpus"] in dom
    assert colors > 8, f"the screenshot looks blank ({colors} colours)"


@needs_chromium
def test_nothing_fits_names_the_hardware(tmp_path):
    args = {"model": "Qwen/Qwen2.5-7B", "method": "full", "gpu": "RTX 4090", "keep": ["method", "sharding"]}
    sug = suggest_impl(args).structured_content
    assert sug["nothing_fits"] and not sug["suggestions"] and sug["smallest_gpu"]
    page = tmp_path / "nothing.html"
    page.write_text(preview_html(sug), encoding="utf-8")
    dom, _ = _render(tmp_path, page)
    assert 'data-rendered="suggestions"' in dom and "NOTHING FITS" in dom and "pinned: method, sharding" in dom
    assert "nothing fits on the RTX 4090 with the allowed changes" in dom
    assert f"smallest catalog GPU for the plan unchanged: {sug['smallest_gpu']}" in dom


HOST_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><style>body{margin:0}iframe{border:0;width:100%%;height:680px}</style></head>
<body><iframe id="app"></iframe><pre id="log"></pre><pre id="mirror"></pre>
<script>
var app = document.getElementById("app"), log = document.getElementById("log");
var RESULT = %s;
window.addEventListener("message", function (e) {
  var m = e.data; log.textContent += m.method + (m.id !== undefined ? "#" + m.id : "") + "\\n";
  if (m.method === "ui/initialize") {
    app.contentWindow.postMessage({jsonrpc: "2.0", id: m.id, result: {protocolVersion: m.params.protocolVersion,
      hostInfo: {name: "test-host", version: "1"}, hostCapabilities: {}, hostContext: {}}}, "*");
  } else if (m.method === "ui/notifications/initialized") {
    app.contentWindow.postMessage({jsonrpc: "2.0", method: "ui/notifications/tool-result", params: RESULT}, "*");
  } else if (m.method === "ui/notifications/size-changed") {
    document.getElementById("mirror").textContent = app.contentDocument.body.innerText;
  }
});
app.srcdoc = %s;
</script></body></html>"""


@needs_chromium
async def test_app_draws_a_result_a_host_sends(tmp_path):
    """The real path: the host reads the ui:// resource over MCP and sends the tool result by postMessage."""
    async with Client(build_server()) as client:
        app_html = (await client.read_resource(BUDGET_APP_URI)).contents[0].text
        result = await client.call_tool("estimate_memory", ESTIMATE_ARGS)
    wire = {"content": [c.model_dump(mode="json") for c in result.content],
            "structuredContent": result.structured_content}
    page = tmp_path / "host.html"
    page.write_text(HOST_PAGE % (json.dumps(wire), json.dumps(app_html).replace("</", "<\\/")), encoding="utf-8")
    dom, colors = _render(tmp_path, page)
    log = dom.split('<pre id="log">', 1)[1].split("</pre>", 1)[0]
    assert log.split() == ["ui/initialize#1", "ui/notifications/initialized", "ui/notifications/size-changed"]
    mirror = dom.split('<pre id="mirror">', 1)[1].split("</pre>", 1)[0]
    assert "FITS" in mirror and "GPU usable 23.88 GiB" in mirror and "activations" in mirror
    assert colors > 12, f"the screenshot looks blank ({colors} colours)"
