"""Colours shared by the terminal (server/rich_view.py) and the MCP App (server/app.py).

One fixed colour per budget component, by name (never by row position), from the Okabe-Ito palette
(Okabe & Ito 2008, "Color Universal Design") completed with Paul Tol's muted scheme, both chosen to stay
distinguishable with the common colour-vision deficiencies (checked by simulation in tests/test_palette.py).
The colours are the component table's (estimator/components.py: there with each component's lifetime and doc anchor);
components that never appear together share a colour there.
The safety margin is hatched, not coloured, and the GPU's usable-memory line is drawn in the text colour, so
neither can be mistaken for a component. Every component is also named, with its size, next to its colour
(legend or table).

Text colours come as pairs (text on background) for a light and a dark theme; tests/test_palette.py
checks each pair's WCAG 2 contrast ratio is at least 4.5:1. The terminal uses only the verdict badges'
pairs (truecolor hex, not named ANSI colours, which each terminal theme redefines) and the component
colours for bar cells; all other terminal text is in the terminal's own foreground.
"""

from __future__ import annotations

from canifinetune.estimator.components import ComponentKind

# name -> colour (hex), from the component table. Every two colours stay at least 10 CIE76 units apart with normal
# vision and simulated protanopia, deuteranopia and tritanopia (tests/test_palette.py).
COMPONENT_COLORS: dict[str, str] = {c.key: c.color for c in ComponentKind if c is not ComponentKind.SAFETY_MARGIN}
OTHER_COLOR = "#99DDFF"  # Tol light cyan: a component this table does not name yet
MARGIN_COLOR = ComponentKind.SAFETY_MARGIN.color  # the safety margin's hatching (the background between the stripes)

# Verdict badges: (text, background), the same in both themes (the pair itself carries the contrast).
VERDICT_COLORS: dict[str, tuple[str, str]] = {
    "fits": ("#FFFFFF", "#0B6E3A"),
    "tight": ("#1F1F1F", "#F0B429"),
    "does_not_fit": ("#FFFFFF", "#B3261E"),
    "unknown": ("#FFFFFF", "#5B6475"),
}

# The App's own theme (used where the host passes no style variables). Keys become CSS variables --cf-KEY.
THEMES: dict[str, dict[str, str]] = {
    "light": {"bg": "#FFFFFF", "fg": "#1D2433", "muted": "#545D6E", "line": "#D5D9E0", "panel": "#EEF1F5",
              "danger": "#B3261E", "success": "#0B6E3A", "warning": "#8A5A00", "accent": "#0060A8"},
    "dark": {"bg": "#161A22", "fg": "#E6E9EF", "muted": "#A3ABBA", "line": "#394150", "panel": "#232936",
             "danger": "#FF8A80", "success": "#6FD39A", "warning": "#F0B429", "accent": "#7CC4FF"},
}
# Every text colour of a theme and the backgrounds it is drawn on.
TEXT_ON = {"fg": ("bg", "panel"), "muted": ("bg", "panel"), "danger": ("bg", "panel"), "success": ("bg", "panel"),
           "warning": ("bg", "panel"), "accent": ("bg", "panel")}


def component_color(name: str) -> str:
    return COMPONENT_COLORS.get(name, OTHER_COLOR)


def _linear(channel: int) -> float:
    c = channel / 255
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def relative_luminance(hex_color: str) -> float:
    """WCAG 2 relative luminance of an sRGB colour '#RRGGBB'."""
    h = hex_color.lstrip("#")
    r, g, b = (_linear(int(h[i:i + 2], 16)) for i in (0, 2, 4))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast_ratio(a: str, b: str) -> float:
    """WCAG 2 contrast ratio of two colours, from 1 to 21."""
    hi, lo = sorted((relative_luminance(a), relative_luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def text_pairs() -> list[tuple[str, str, str, str]]:
    """Every (where, what, text colour, background colour) pair the App and the terminal define."""
    pairs = []
    for theme, colors in THEMES.items():
        for text, backgrounds in TEXT_ON.items():
            for bg in backgrounds:
                pairs.append((theme, f"{text} on {bg}", colors[text], colors[bg]))
        for verdict, (fg, bg) in VERDICT_COLORS.items():
            pairs.append((theme, f"{verdict} badge", fg, bg))
    return pairs


def palette_json() -> dict:
    """What the App's script receives: the same tables, so the App and the terminal cannot drift apart."""
    return {"components": COMPONENT_COLORS, "other": OTHER_COLOR, "margin": MARGIN_COLOR,
            "verdicts": {k: {"fg": fg, "bg": bg} for k, (fg, bg) in VERDICT_COLORS.items()}}
