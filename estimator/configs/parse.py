"""Reading a config file safely: a size cap before parsing, UTF-8 only, YAML without tags or aliases, bounded
nesting, no duplicate keys. Every failure is one :class:`ConfigError` naming the file and the line."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.events import AliasEvent, CollectionStartEvent, ScalarEvent
from yaml.nodes import MappingNode, SequenceNode

from ..bounded_io import json_nesting_breach
from ..errors import safe_text
from .types import ConfigError

MAX_CONFIG_BYTES = 256 * 1024  # the biggest real training config is a few KB
MAX_DEPTH = 32  # real configs nest three or four levels
MAX_ITEMS = 10_000  # keys and list items in one file


@dataclass
class Doc:
    """A parsed config: its top-level mapping and the line of each key path ("a" or "a.b")."""

    name: str
    text: str
    data: dict
    syntax: str  # "yaml" or "json"
    lines: dict[str, int] = field(default_factory=dict)
    node: Any = None  # YAML: the composed top-level mapping node (its marks locate every key for the edits)
    bom: bool = False  # the file began with a UTF-8 byte-order mark (an edited copy keeps it)

    @property
    def newline(self) -> str:
        """The file's line ending: an edited copy keeps it."""
        return "\r\n" if "\r\n" in self.text else "\n"

    def line(self, key: str) -> int | None:
        return self.lines.get(key)

    def where(self, key: str | None = None) -> str:
        line = self.line(key) if key else None
        return f"{self.name} line {line}" if line else self.name


# Characters no training config holds: C0 controls but tab, line feed and carriage return; DEL; the C1 block (NEL
# too: YAML reads it as a line break, so lines would be counted differently); the Unicode line and paragraph
# separators; lone surrogates; the noncharacters U+FFFE and U+FFFF. PyYAML refuses most of them in its reader's
# constructor, JSON inside strings only: both are refused here first, with the line and the character.
CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\ufffe\uffff]")
_CONTROL_NAMES = {0x00: "NUL", 0x07: "BEL", 0x08: "backspace", 0x0B: "vertical tab", 0x0C: "form feed",
                  0x1B: "ESC", 0x7F: "DEL", 0x85: "NEL", 0x2028: "line separator", 0x2029: "paragraph separator",
                  0xFFFE: "noncharacter", 0xFFFF: "noncharacter"}


def check_characters(name: str, text: str) -> None:
    """Refuse a control character (or another character no config holds), naming the file, the line and it."""
    bad = CONTROL.search(text)
    if bad is None:
        return
    code = ord(bad.group())
    what = _CONTROL_NAMES.get(code) or ("a lone surrogate" if 0xD800 <= code <= 0xDFFF else "a control character")
    line = text.count("\n", 0, bad.start()) + 1
    column = bad.start() - (text.rfind("\n", 0, bad.start()) + 1) + 1
    raise ConfigError(f"{name} line {line}: character U+{code:04X} ({what}) at column {column}; a training config "
                      "is plain text: remove it")


def decode(name: str, raw: bytes | str) -> str:
    """The file's text: at most MAX_CONFIG_BYTES, UTF-8 (a BOM is dropped), without control characters."""
    size = len(raw.encode("utf-8", "surrogatepass")) if isinstance(raw, str) else len(raw)
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{name}: {size} bytes; a training config is at most {MAX_CONFIG_BYTES // 1024} KB")
    if isinstance(raw, str):
        text = raw.lstrip("\ufeff")
    else:
        try:
            text = raw.decode("utf-8").lstrip("\ufeff")
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            bom = " (a UTF-16 byte-order mark)" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
            raise ConfigError(f"{name} line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}{bom}); save the "
                              "file as UTF-8") from None
    check_characters(name, text)
    return text


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses aliases (billion laughs) and explicit tags, and bounds nesting and size."""

    def __init__(self, stream, name: str):
        super().__init__(stream)
        self.config_name = name
        self.depth = 0
        self.items = 0

    def _refuse(self, event, what: str):
        line = event.start_mark.line + 1 if event.start_mark else "?"
        raise ConfigError(f"{self.config_name} line {line}: {what}")

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            self._refuse(event, f"YAML alias '*{safe_text(event.anchor, 40)}' is not accepted in a training config; "
                                "write the value out")
        if isinstance(event, (ScalarEvent, CollectionStartEvent)) and event.tag not in (None, "!"):
            self._refuse(event, f"YAML tag '{safe_text(event.tag, 60)}' is not accepted in a training config")
        self.items += 1
        if self.items > MAX_ITEMS:
            self._refuse(event, f"more than {MAX_ITEMS} values; this is not a training config")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self._refuse(event, f"nested deeper than {MAX_DEPTH} levels; this is not a training config")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = key_node.value if isinstance(key_node.value, str) else None
            if key is not None and key in seen:
                raise ConfigError(f"{self.config_name} line {key_node.start_mark.line + 1}: key "
                                  f"'{safe_text(key, 60)}' appears twice; keep one")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _node_lines(node, prefix: str, out: dict[str, int]) -> None:
    if not isinstance(node, MappingNode):
        return
    for key_node, value_node in node.value:
        if not isinstance(key_node.value, str):
            continue
        path = f"{prefix}.{key_node.value}" if prefix else key_node.value
        out[path] = key_node.start_mark.line + 1
        if isinstance(value_node, MappingNode) and prefix.count(".") < 2:
            _node_lines(value_node, path, out)
        elif isinstance(value_node, SequenceNode):
            continue


_BRACKET_RUN = re.compile(r"(?:[\[{][ \t]*){" + str(MAX_DEPTH + 1) + "}")


def parse_yaml(name: str, text: str) -> Doc:
    run = _BRACKET_RUN.search(text)
    if run:  # PyYAML's scanner looks ~1024 characters ahead inside flow brackets: refuse the runs before it does
        raise ConfigError(f"{name} line {text.count(chr(10), 0, run.start()) + 1}: nested deeper than {MAX_DEPTH} "
                          "levels; this is not a training config")
    check_characters(name, text)
    loader = None
    try:
        loader = _Loader(text, name)  # PyYAML's reader checks the characters here: inside the try
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except ConfigError:
        raise
    except yaml.reader.ReaderError as exc:  # a character check_characters let through (defence in depth)
        row = text.count("\n", 0, max(0, exc.position)) + 1
        code = ord(exc.character) if isinstance(exc.character, str) else int(exc.character)
        raise ConfigError(f"{name} line {row}: character U+{code:04X} is not accepted in YAML; remove it") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.context_mark or exc.problem_mark  # where the unclosed or broken construct starts
        line = f" line {mark.line + 1}" if mark else ""
        what = "; ".join(safe_text(t, 120) for t in (exc.context, exc.problem) if t)
        raise ConfigError(f"{name}{line}: not valid YAML: {what}") from None
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as exc:
        raise ConfigError(f"{name}: not valid YAML: {safe_text(exc, 200)}") from None
    finally:
        if loader is not None:
            loader.dispose()
    lines: dict[str, int] = {}
    _node_lines(node, "", lines)
    return Doc(name, text, _top_mapping(name, data), "yaml", lines, node)


def _top_mapping(name: str, data: Any) -> dict:
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise ConfigError(f"{name} line 1: the file is {kind}; a training config is a mapping of keys to values")
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(f"{name}: key {safe_text(repr(key), 60)} is not text")
    return data


def _json_depth(name: str, text: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH before json (recursive in C) sees it."""
    line = json_nesting_breach(text, MAX_DEPTH)
    if line is not None:
        raise ConfigError(f"{name} line {line}: nested deeper than {MAX_DEPTH} levels; this is not a training config")


def _json_pairs(name: str):
    def hook(pairs):
        out: dict = {}
        for key, value in pairs:
            if key in out:
                raise ConfigError(f"{name}: key '{safe_text(key, 60)}' appears twice; keep one")
            out[key] = value
        return out
    return hook


def _json_constant(name: str):
    def refuse(token):
        raise ConfigError(f"{name}: {token} is not a JSON number; write a finite number")
    return refuse


def _json_float(name: str):
    def finite(token: str) -> float:
        value = float(token)
        if not math.isfinite(value):  # 1e999: a number too large for a float
            raise ConfigError(f"{name}: {safe_text(token, 40)} is too large a number; write a finite number")
        return value
    return finite


def parse_json(name: str, text: str) -> Doc:
    _json_depth(name, text)
    try:
        data = json.loads(text, object_pairs_hook=_json_pairs(name), parse_constant=_json_constant(name),
                          parse_float=_json_float(name))
    except ConfigError:
        raise
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{name} line {exc.lineno}: not valid JSON: {safe_text(exc.msg, 200)}") from None
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{name}: not valid JSON: {safe_text(exc, 200)}") from None
    data = _top_mapping(name, data)
    return Doc(name, text, data, "json", _json_lines(text, data))


def _json_lines(text: str, data: dict) -> dict[str, int]:
    """Approximate key lines of a JSON file: the first line holding '"key"' (JSON configs are small)."""
    lines: dict[str, int] = {}
    rows = text.splitlines()

    def find(key: str, start: int) -> int | None:
        needle = json.dumps(key) + ":"
        for i in range(start, len(rows)):
            if needle in rows[i].replace('" :', '":'):
                return i
        return None

    for key, value in data.items():
        at = find(key, 0)
        if at is None:
            continue
        lines[key] = at + 1
        if isinstance(value, dict):
            for sub in value:
                sub_at = find(sub, at)
                if sub_at is not None:
                    lines[f"{key}.{sub}"] = sub_at + 1
    return lines


def parse(name: str, raw: bytes | str) -> Doc:
    """Parse a config: JSON when it looks like JSON (or ends in .json), YAML otherwise."""
    text = decode(name, raw)
    if not text.strip():
        raise ConfigError(f"{name} line 1: the file is empty; a training config is a mapping of keys to values")
    if text.lstrip().startswith("{") or name.lower().endswith(".json"):
        doc = parse_json(name, text)
    else:
        doc = parse_yaml(name, text)
    doc.bom = raw.startswith(b"\xef\xbb\xbf") if isinstance(raw, bytes) else raw.startswith("\ufeff")
    return doc
