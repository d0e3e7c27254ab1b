"""Screenshots of the MCP App (server/app.py) in headless Chromium: four states, two widths, two themes.

    python docs/screenshots/make_screenshots.py            # writes docs/screenshots/*.png (16 files)
    python docs/screenshots/make_screenshots.py OUT_DIR    # elsewhere

The states are real tool results (the MCP server's estimate_memory and suggest_cheaper_config): a plan
that fits, one that is tight, one that does not fit, and the suggestions for that one; each is drawn at
900 and 420 px wide, in the App's light and dark themes (as a host's ``hostContext.theme`` sets them).
Each page is first loaded once to measure its height and whether it scrolls sideways, then captured at
that height. tests/test_mcp_app.py calls :func:`render_all` into a temporary folder and checks every
picture; this script also shrinks the committed PNGs with pngquant/optipng when they are installed.
Chromium: Debian's ``chromium`` package (``apt-get install -y chromium``).
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
WIDTHS = (900, 420)
THEMES = ("light", "dark")
MAX_HEIGHT = 1500

FITS = {"model": "Qwen/Qwen2.5-7B-Instruct", "method": "qlora", "gpu": "RTX 4090", "seq_len": 2048}
DOES_NOT_FIT = {"model": "Qwen/Qwen2.5-7B-Instruct", "method": "lora", "gpu": "RTX 4090", "seq_len": 2048}


def chromium() -> str | None:
    return next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)


def _tight() -> dict:
    """The first batch size that is tight for Qwen2.5-1.5B LoRA on a 16 GB card (found, not hard-coded)."""
    from canifinetune.server.mcp_server import estimate_memory_impl

    for batch in range(1, 129):
        args = {"model": "Qwen/Qwen2.5-1.5B-Instruct", "method": "lora", "gpu_vram_gb": 16, "batch_size": batch}
        sc = estimate_memory_impl(dict(args)).structured_content
        if sc["verdict"] == "tight":
            return sc
    raise RuntimeError("no tight batch size found for Qwen2.5-1.5B LoRA on 16 GB")


def states() -> dict[str, dict]:
    """state name -> the tool's structured content."""
    from canifinetune.server.mcp_server import estimate_memory_impl, suggest_impl

    return {
        "fits": estimate_memory_impl(dict(FITS)).structured_content,
        "tight": _tight(),
        "does-not-fit": estimate_memory_impl(dict(DOES_NOT_FIT)).structured_content,
        "suggestions": suggest_impl(dict(DOES_NOT_FIT)).structured_content,
    }


def _run(browser: str, profile: Path, page: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", "--hide-scrollbars", "--force-color-profile=srgb", "--force-device-scale-factor=1",
           f"--user-data-dir={profile}", "--virtual-time-budget=3000", *args, page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


# The measuring page: the app in an iframe exactly `width` px wide (a headless window is never narrower than
# 500 px, an iframe can be), measured from the parent once it has drawn.
MEASURE = """<!DOCTYPE html><html><head><meta charset="utf-8"><style>body{margin:0}iframe{border:0;display:block}</style></head>
<body><iframe id="app" style="width:%dpx;height:800px"></iframe><script>
var f = document.getElementById("app");
f.addEventListener("load", function () {
  var w = f.contentWindow, d = f.contentDocument.documentElement, b = f.contentDocument.body, out = document.body;
  out.setAttribute("data-page-height", String(Math.ceil(f.contentDocument.getElementById("app").getBoundingClientRect().bottom + 14)));
  out.setAttribute("data-scroll-width", String(d.scrollWidth)); out.setAttribute("data-client-width", String(d.clientWidth));
  out.setAttribute("data-bg", w.getComputedStyle(b).backgroundColor);
  out.setAttribute("data-card-lefts", JSON.stringify([].map.call(f.contentDocument.querySelectorAll(".card"), function (c) {
    return Math.round(c.getBoundingClientRect().left); })));
  var dom = document.createElement("pre"); dom.id = "app-dom"; dom.textContent = d.outerHTML; document.body.appendChild(dom);
});
f.srcdoc = %s;
</script></body></html>"""


@dataclass
class Shot:
    name: str
    path: Path
    dom: str
    width: int
    height: int
    scroll_width: int  # the app's document, in a frame exactly `width` wide
    client_width: int
    bg: str  # the computed background of the app's body, e.g. "rgb(22, 26, 34)"
    card_lefts: list[int]  # the suggestion cards' left edges (all equal: stacked)


def render_one(browser: str, structured: dict, theme: str, width: int, out: Path, work: Path) -> Shot:
    from canifinetune.server.app import preview_html

    page = work / (out.stem + ".html")
    page.write_text(preview_html(structured, theme=theme), encoding="utf-8")
    measure = work / (out.stem + "-measure.html")
    measure.write_text(MEASURE % (width, json.dumps(page.read_text(encoding="utf-8")).replace("</", "<\\/")), encoding="utf-8")
    dom_proc = _run(browser, work / "profile", measure, "--dump-dom", f"--window-size={max(width, 500)},900")
    if dom_proc.returncode != 0:
        raise RuntimeError(dom_proc.stderr[-2000:])
    body = re.search(r"<body([^>]*)>", dom_proc.stdout).group(1)
    attrs = {k: html.unescape(v) for k, v in re.findall(r'data-([a-z-]+)="([^"]*)"', body)}
    dom = html.unescape(dom_proc.stdout.split('<pre id="app-dom">', 1)[1].split("</pre>", 1)[0])
    height = min(int(attrs["page-height"]), MAX_HEIGHT)
    shot = _run(browser, work / "profile", page, f"--screenshot={out}", f"--window-size={width},{height}")
    if shot.returncode != 0 or not out.is_file():
        raise RuntimeError(shot.stderr[-2000:])
    return Shot(out.stem, out, dom, width, height, int(attrs["scroll-width"]), int(attrs["client-width"]), attrs["bg"],
                json.loads(attrs["card-lefts"]))


def render_all(out_dir: Path, browser: str | None = None) -> list[Shot]:
    """All 16 pictures into out_dir: {state}-{width}-{theme}.png."""
    browser = browser or chromium()
    if browser is None:
        raise RuntimeError("headless Chromium is not installed (apt-get install -y chromium)")
    out_dir.mkdir(parents=True, exist_ok=True)
    shots = []
    with tempfile.TemporaryDirectory() as tmp:
        for state, structured in states().items():
            for width in WIDTHS:
                for theme in THEMES:
                    shots.append(render_one(browser, structured, theme, width, out_dir / f"{state}-{width}-{theme}.png",
                                            Path(tmp)))
    return shots


def shrink(paths: list[Path]) -> None:
    """Lossy palette (pngquant) then lossless (optipng), when installed; the files stay PNGs."""
    for p in paths:
        if shutil.which("pngquant"):
            subprocess.run(["pngquant", "--force", "--skip-if-larger", "--quality=70-95", "--output", str(p), str(p)],
                           check=False)
        if shutil.which("optipng"):
            subprocess.run(["optipng", "-quiet", "-o2", str(p)], check=False)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    made = render_all(target)
    shrink([s.path for s in made])
    for s in made:
        print(f"{s.path}  {s.width}x{s.height}  {s.path.stat().st_size // 1024} KiB"
              + ("  SCROLLS SIDEWAYS" if s.scroll_width > s.client_width else ""))
