"""The MCP App (server/app.py): bound to estimate_memory and suggest_cheaper_config, self-contained, and it draws.

The drawing tests feed a real tool result to the page in headless Chromium, two ways: inlined (the
preview path), and through a stand-in host page that speaks the Apps postMessage protocol to the app in
an iframe (ui/initialize -> ui/notifications/initialized -> ui/notifications/tool-result), with a host
theme and style variables and a later host-context-changed. They check the screenshot is not blank and
that the labels are in the DOM. The picture's own promises (issue 15, point 5) are checked on the 16
screenshots of docs/screenshots/make_screenshots.py (four states, 900 and 420 px, light and dark), taken
into a temporary folder: the verdict and its number first, an axis whose ticks and GPU line sit at their
values, colours by component name, no sideways scroll at 420 px, cards stacked there and side by side at
900, the recommended card marked, changes as flags and fields, no raw scores, the theme followed.
Chromium: Debian's `chromium` package (.ci/run installs it); without it these tests skip and say so.
"""

from __future__ import annotations

import html
import importlib.util
import json
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from mcp import Client
from mcp.server.apps import APP_MIME_TYPE

from canifinetune.estimator.constants import GIB
from canifinetune.server.app import BUDGET_APP_URI, budget_app_html, preview_html
from canifinetune.server.mcp_server import build_server, estimate_memory_impl, suggest_impl
from canifinetune.server.palette import COMPONENT_COLORS, THEMES, VERDICT_COLORS, component_color

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
    largest = max(est.structured_content["breakdown"], key=lambda c: c["bytes"])["name"]
    assert text.startswith("FITS") and largest in text
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
    return len(_png_pixels(path))


def _png_pixels(path: Path) -> dict[bytes, int]:
    """RGB colour -> pixel count of an 8-bit RGB/RGBA PNG (what Chromium writes), with a minimal decoder."""
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
    prev, colors, i = bytearray(stride), {}, 0
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
        for x in range(0, stride, bpp):
            px = bytes(line[x:x + 3])
            colors[px] = colors.get(px, 0) + 1
        prev = line
    return colors


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
        assert f'data-rank="{i}"' in dom
        for c in s["changes"]:  # as the user would type them: the field with old -> new, and the CLI flag
            assert _field(c) in dom
            assert "--" + c["field"].replace("_", "-") in dom
        for d in s["cost"]["details"]:
            assert html.escape(d, quote=False) in dom or d in dom
    assert "recommended: " in dom and "smallest catalog GPU for the plan unchanged: " + sug["smallest_gpu"] in dom
    assert f"fewest GPUs for the plan unchanged: {sug['min_gpus']:d} x RTX 4090" in dom
    assert "quality penalty" not in _text(dom) and "THAT FIT" not in _text(dom)
    assert colors > 8, f"the screenshot looks blank ({colors} colours)"


@needs_chromium
def test_nothing_fits_names_the_hardware(tmp_path):
    args = {"model": "Qwen/Qwen2.5-7B", "method": "full", "gpu": "RTX 4090",
            "keep": ["method", "sharding", "gpu", "num_gpus"]}
    sug = suggest_impl(args).structured_content
    assert sug["nothing_fits"] and not sug["suggestions"] and sug["smallest_gpu"]
    page = tmp_path / "nothing.html"
    page.write_text(preview_html(sug), encoding="utf-8")
    dom, _ = _render(tmp_path, page)
    assert (
        'data-rendered="suggestions"' in dom
        and "DOES NOT FIT" in dom
        and "pinned: method, sharding, gpu, num_gpus" in dom
    )
    assert "nothing fits on the RTX 4090 with the allowed changes" in dom
    assert f"smallest catalog GPU for the plan unchanged: {sug['smallest_gpu']}" in dom


@needs_chromium
def test_a_slimmer_result_still_draws(tmp_path):
    """The structured content may shrink (no plan, no per-suggestion breakdown or cost details): the page still
    draws the verdict, the cards and the changes, and shows no raw score from the cost's summary."""
    sug = suggest_impl(dict(SUGGEST_ARGS)).structured_content
    sug.pop("plan", None)
    sug["original"].pop("plan", None)
    for s in sug["suggestions"]:
        s.pop("plan", None)
        s["estimate"].pop("breakdown", None)
        s["cost"].pop("details", None)
    page = tmp_path / "slim.html"
    page.write_text(preview_html(sug), encoding="utf-8")
    dom, _ = _render(tmp_path, page, "420,900")
    text = _text(dom)
    assert 'data-rendered="suggestions"' in dom and "RECOMMENDED" in text and "DOES NOT FIT" in text
    assert all(f"--{c['field'].replace('_', '-')}" in text for s in sug["suggestions"] for c in s["changes"])
    assert "quality penalty" not in text and not re.search(r"\d+\.\d{4,}", text)


HOST_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><style>body{margin:0}iframe{border:0;width:100%%;height:680px}</style></head>
<body><iframe id="app"></iframe><pre id="log"></pre><pre id="mirror"></pre><pre id="theme"></pre>
<script>
var app = document.getElementById("app"), log = document.getElementById("log"), sized = 0;
var RESULT = %s;
function look() {  // what the app's page paints with: its background, text colour and font
  var d = app.contentDocument, s = app.contentWindow.getComputedStyle(d.body);
  return s.backgroundColor + "|" + s.color + "|" + s.fontFamily + "|" + (d.documentElement.getAttribute("data-theme") || "");
}
window.addEventListener("message", function (e) {
  var m = e.data; log.textContent += m.method + (m.id !== undefined ? "#" + m.id : "") + "\\n";
  if (m.method === "ui/initialize") {
    app.contentWindow.postMessage({jsonrpc: "2.0", id: m.id, result: {protocolVersion: m.params.protocolVersion,
      hostInfo: {name: "test-host", version: "1"}, hostCapabilities: {},
      hostContext: {theme: "dark", styles: {variables: {"--color-background-primary": "rgb(1, 2, 3)",
        "--font-sans": "HostSans, sans-serif"}}}}}, "*");
  } else if (m.method === "ui/notifications/initialized") {
    app.contentWindow.postMessage({jsonrpc: "2.0", method: "ui/notifications/tool-result", params: RESULT}, "*");
  } else if (m.method === "ui/notifications/size-changed" && !sized++) {
    document.getElementById("mirror").textContent = app.contentDocument.body.innerText;
    var theme = document.getElementById("theme");
    theme.textContent = look() + "\\n";
    // the host switches to light and drops its background variable: the app's own light theme shows
    app.contentWindow.postMessage({jsonrpc: "2.0", method: "ui/notifications/host-context-changed",
      params: {theme: "light", styles: {variables: {"--color-background-primary": null}}}}, "*");
    setTimeout(function () { theme.textContent += look() + "\\n"; }, 200);
  }
});
app.srcdoc = %s;
</script></body></html>"""  # noqa: E501 - a page of HTML and JavaScript, not Python


@needs_chromium
async def test_app_draws_a_result_a_host_sends(tmp_path):
    """The real path: the host reads the ui:// resource over MCP and sends the tool result by postMessage; the
    app takes the host's theme and style variables from ui/initialize, and follows host-context-changed."""
    async with Client(build_server()) as client:
        app_html = (await client.read_resource(BUDGET_APP_URI)).contents[0].text
        result = await client.call_tool("estimate_memory", ESTIMATE_ARGS)
    wire = {"content": [c.model_dump(mode="json") for c in result.content],
            "structuredContent": result.structured_content}
    page = tmp_path / "host.html"
    page.write_text(HOST_PAGE % (json.dumps(wire), json.dumps(app_html).replace("</", "<\\/")), encoding="utf-8")
    dom, colors = _render(tmp_path, page)
    log = dom.split('<pre id="log">', 1)[1].split("</pre>", 1)[0]
    assert log.split()[:3] == ["ui/initialize#1", "ui/notifications/initialized", "ui/notifications/size-changed"]
    assert set(log.split()[3:]) <= {"ui/notifications/size-changed"}
    mirror = dom.split('<pre id="mirror">', 1)[1].split("</pre>", 1)[0]
    assert "FITS" in mirror and "GPU usable 23.88 GiB" in mirror and "activations" in mirror
    first, second = dom.split('<pre id="theme">', 1)[1].split("</pre>", 1)[0].strip().splitlines()[:2]
    assert first.startswith("rgb(1, 2, 3)|rgb(230, 233, 239)|HostSans") and first.endswith("|dark"), first  # dark text
    assert second.startswith("rgb(255, 255, 255)|rgb(29, 36, 51)|HostSans") and second.endswith("|light"), second
    assert colors > 12, f"the screenshot looks blank ({colors} colours)"


# ------------------------------------------------------------------------------ the 16 screenshots (issue 15, point 5)

ROOT = Path(__file__).resolve().parent.parent


def _screenshot_module():
    spec = importlib.util.spec_from_file_location(
        "make_screenshots", ROOT / "docs" / "screenshots" / "make_screenshots.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    """docs/screenshots/make_screenshots.py's 16 pictures, taken into a temporary folder: name -> Shot."""
    if CHROMIUM is None:
        pytest.skip("headless Chromium is not installed (apt-get install -y chromium; .ci/run does)")
    made = _screenshot_module().render_all(tmp_path_factory.mktemp("screenshots"), CHROMIUM)
    return {s.name: s for s in made}


def _text(dom: str) -> str:
    """The visible text of the app's DOM (tags and scripts dropped)."""
    body = dom.split("<body", 1)[1].split(">", 1)[1]
    body = re.sub(r"<script.*?</script>", " ", body, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", body))


def _shown(value) -> str:
    """A change's value as the App writes it: true/false, a list joined with commas, 'default' for none."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(value)
    return "default" if value is None else str(value)


def _field(c: dict) -> str:
    return f"{c['field']}: {_shown(c['old'])} → {_shown(c['new'])}"


def _flag(c: dict) -> str:
    name = c["field"].replace("_", "-")
    if isinstance(c["new"], bool):
        return f"--{name}" if c["new"] else f"--no-{name}"
    return f"--{name} {_shown(c['new'])}"


def _rgb(hex_color: str) -> str:
    h = hex_color.lstrip("#")
    return "rgb({:d}, {:d}, {:d})".format(*(int(h[i:i + 2], 16) for i in (0, 2, 4)))


STATES = ("fits", "tight", "does-not-fit", "suggestions")


def test_sixteen_screenshots_are_taken(shots):
    assert sorted(shots) == sorted(f"{st}-{w}-{th}" for st in STATES for w in (900, 420) for th in ("light", "dark"))
    for name, s in shots.items():
        pixels = _png_pixels(s.path)
        assert len(pixels) > 12, f"{name} looks blank"
        background = max(pixels, key=pixels.get)  # the most common colour is the page
        theme = name.rsplit("-", 1)[1]
        assert _rgb(THEMES[theme]["bg"]) == "rgb({:d}, {:d}, {:d})".format(*background), name
        assert s.bg == _rgb(THEMES[theme]["bg"]), name


def test_the_verdict_and_its_number_come_first(shots):
    expected = {
        "fits": ("FITS", r"[\d.]+ GiB free"),
        "tight": ("TIGHT", r"(only [\d.]+ GiB free|[\d.]+ GiB into the margin)"),  # under the headroom line, or past
        "does-not-fit": ("DOES NOT FIT", r"[\d.]+ GiB over"),
        "suggestions": ("DOES NOT FIT", r"[\d.]+ GiB over"),
    }
    for state, (word, number) in expected.items():
        text = " ".join(_text(shots[f"{state}-900-light"].dom).split())
        assert re.match(rf"{word} {number} ", text), text[:120]
    over = re.search(r"([\d.]+) GiB over", _text(shots["does-not-fit-900-light"].dom)).group(1)
    est = estimate_memory_impl(dict(SUGGEST_ARGS)).structured_content
    assert over == f"{(est['total_bytes'] - est['gpu_usable_bytes']) / GIB:.2f}"


def test_the_axis_ticks_and_the_gpu_line_sit_at_their_values(shots):
    for state in ("fits", "tight", "does-not-fit"):
        dom = shots[f"{state}-900-light"].dom
        ticks = [
            (float(v), float(left)) for v, left in re.findall(r'data-tick="([\d.]+)" style="left:([\d.e-]+)%', dom)
        ]
        assert ticks[0] == (0.0, 0.0) and len(ticks) >= 3
        scale = ticks[-1][0]
        assert ticks[-1][1] == pytest.approx(100)
        for value, left in ticks:  # every tick label where its value is
            assert left == pytest.approx(100 * value / scale)
        labels = re.findall(r'data-tick="[\d.]+"[^>]*>([^<]+)<', dom)
        assert labels[-1].endswith(" GiB") and float(labels[-1].split()[0]) == scale
        gpu = float(re.search(r'data-gpu-line="([\d.]+)"', dom).group(1))
        left = float(re.search(r'data-gpu-line="[\d.]+" style="left:calc\(([\d.e-]+)%', dom).group(1))
        assert left == pytest.approx(100 * gpu / scale, abs=0.01)  # the line at the GPU's usable memory...
        assert f"GPU usable {gpu:.2f} GiB" in dom  # ...and labelled with it
        segs = re.search(r'class="segs" style="width:([\d.e-]+)%', dom).group(1)
        budget = float(re.search(r'aria-label="budget ([\d.]+) GiB', dom).group(1))
        assert float(segs) == pytest.approx(100 * budget / scale, abs=0.05)  # the bar ends at the budget
        assert scale >= max(budget, gpu) and scale < 1.5 * max(budget, gpu)


def test_colours_follow_the_component_not_its_row(shots):
    seen = {}
    for name, s in shots.items():
        for comp, style in re.findall(r'data-component="([a-z_]+)"[^>]*style="([^"]*)"', s.dom):
            if comp == "safety_margin":
                assert "background" not in style  # hatched by its class, never a component's colour
                continue
            color = re.search(r"background:(#[0-9A-Fa-f]{6})", style).group(1)
            assert color == component_color(comp), (name, comp)
            seen.setdefault(comp, set()).add(color)
    # the QLoRA plan has quantization_constants in the second row, so activations moves down a row; same colour
    assert {"weights", "activations", "quantization_constants", "backward_temporaries"} <= set(seen)
    assert all(len(v) == 1 for v in seen.values())
    assert len({COMPONENT_COLORS[c] for c in seen}) == len({c.split("_temporaries")[0] for c in seen})


def test_no_sideways_scroll_and_cards_stack_on_narrow_hosts(shots):
    for name, s in shots.items():
        assert s.scroll_width <= s.client_width, f"{name} scrolls sideways ({s.scroll_width} > {s.client_width})"
    for theme in ("light", "dark"):
        narrow, wide = shots[f"suggestions-420-{theme}"], shots[f"suggestions-900-{theme}"]
        assert len(narrow.card_lefts) >= 2 and len(set(narrow.card_lefts)) == 1  # stacked
        columns = len(set(wide.card_lefts))  # side by side: the first row's cards each in their own column
        assert columns >= 2 and len(set(wide.card_lefts[:columns])) == columns


def test_suggestion_cards_mark_the_recommended_one_and_speak_flags(shots):
    sug = suggest_impl(dict(SUGGEST_ARGS)).structured_content
    dom = shots["suggestions-900-light"].dom
    text = _text(dom)
    assert dom.count('class="card recommended"') == 1 and text.count("RECOMMENDED") == 1
    first = re.search(r'class="card recommended" data-rank="(\d+)"', dom).group(1)
    assert first == "1"
    for s in sug["suggestions"]:
        for c in s["changes"]:
            assert _flag(c) in text and _field(c) in text
    assert not re.search(r"\d+\.\d{4,}", text), "a raw float is shown"
    assert "quality penalty" not in text and '"' not in " ".join(re.findall(r"→ \S+", text))
    # the header's badge is the plan's verdict (it does not fit), not a green count of suggestions
    badge = re.search(r'class="verdict v-([a-z_]+)" style="color:(#[0-9A-F]+);background:(#[0-9A-F]+)"', dom)
    assert badge.group(1) == "does_not_fit" and (badge.group(2), badge.group(3)) == VERDICT_COLORS["does_not_fit"]


def test_the_method_row_sits_under_the_verdict(shots):
    """issue 21: full / LoRA / QLoRA on this GPU under the verdict, each with its badge (a tight one amber), the
    plan's own method outlined, from the result's compact tiers."""
    tight = estimate_memory_impl({"model": "Qwen/Qwen2.5-1.5B-Instruct", "method": "lora", "gpu_vram_gb": 16,
                                  "batch_size": 1}).structured_content
    assert tight["tiers"]
    for state in ("fits", "tight", "does-not-fit"):
        dom = shots[f"{state}-900-light"].dom
        text = " ".join(_text(dom).split())
        row = re.search(r'<div class="methods"[^>]*>(.*?)</div>', dom).group(1)
        assert re.findall(r'data-tier="([a-z]+)"', row) == ["full", "lora", "qlora"], state
        assert row.count('class="method current"') == 1
        verdict = re.match(r"(FITS|TIGHT|DOES NOT FIT) ", text).group(1)
        current = re.search(r'class="method current"[^>]*><b>[^<]+</b><span class="verdict v-([a-z_]+)"', row).group(1)
        assert {"fits": "FITS", "tight": "TIGHT", "does_not_fit": "DOES NOT FIT"}[current] == verdict, state
        assert text.index("full") < text.index("GiB usable")  # under the verdict, before the picture
    tight_dom = shots["tight-900-light"].dom
    fg, bg = VERDICT_COLORS["tight"]
    assert f'class="verdict v-tight" style="color:{fg};background:{bg}"' in tight_dom  # the amber badge
    assert re.search(r"TIGHT only [\d.]+ GiB free", " ".join(_text(tight_dom).split()))


@needs_chromium
def test_what_the_estimate_chose_is_shown(tmp_path):
    est = estimate_memory_impl({"model": "Qwen/Qwen2.5-1.5B-Instruct", "gpu": "T4"}).structured_content
    assert est["chosen_defaults"]
    page = tmp_path / "chosen.html"
    page.write_text(preview_html(est), encoding="utf-8")
    dom, _ = _render(tmp_path, page)
    assert "chose: dtype fp16: the Tesla T4 has no bf16" in _text(dom)
