"""A suggestion as edits to the user's own files (in each format's key names), and the edited text."""

from __future__ import annotations

import json
import re
from typing import Any

from ..plan import TrainingPlan
from . import accelerate, deepspeed, parse
from .combine import READERS, LoadedConfig
from .reading import Reading
from .types import ConfigEdit

NOT_IN_CONFIGS = ("model", "gpu", "gpu_vram_gb", "dataset", "output_dir", "truncation", "learning_rate", "max_steps",
                  "num_train_epochs", "framework")
DISTRIBUTION = ("sharding", "offload_optimizer", "offload_params")


def _changes(loaded: LoadedConfig, plan: TrainingPlan) -> dict[str, Any]:
    """Plan fields whose suggested value differs from what the files alone say."""
    base = TrainingPlan.model_fields
    out = {}
    for name in base:
        if name in NOT_IN_CONFIGS:
            continue
        # what the files alone say (a flag the files cannot hold is written too, or said in a note)
        file_value = loaded.file_values[name] if name in loaded.file_values else base[name].default
        new = getattr(plan, name)
        if _norm(new) != _norm(file_value):
            out[name] = new
    return out


def _norm(value: Any) -> Any:
    return sorted(value) if isinstance(value, list) else value


def _edit(r: Reading, item: tuple) -> ConfigEdit:
    key, new, fields = item[0], item[1], item[2]
    if isinstance(new, float) and new.is_integer() and fields != ["lora_dropout"]:
        new = int(new)  # lora_alpha: 32, as people write it
    note = item[3] if len(item) > 3 else None
    old = r.get(key, None) if key else None
    return ConfigEdit(file=r.doc.name, format=r.format, key=key, old=old, new=new, fields=fields, note=note)


def _distribution_edits(loaded: LoadedConfig, changes: dict, new: dict) -> list[ConfigEdit]:
    out: list[ConfigEdit] = []
    moved = {k: v for k, v in changes.items() if k in DISTRIBUTION}
    ds, acc, main = loaded.reading("deepspeed"), loaded.reading("accelerate"), loaded.training
    if "num_gpus" in changes:
        if acc is not None:
            out.append(_edit(acc, ("num_processes", changes["num_gpus"], ["num_gpus"])))
        else:
            out.append(_edit(main or loaded.readings[0], (None, None, ["num_gpus"],
                       f"launch on {changes['num_gpus']} GPUs (accelerate launch --num_processes "
                       f"{changes['num_gpus']}, or torchrun --nproc_per_node {changes['num_gpus']})")))
    if not moved:
        return out
    if ds is not None and new["sharding"] in ("zero1", "zero2", "zero3", "ddp"):
        out += [_edit(ds, item) for item in deepspeed.edits(moved, new)]
        if acc is not None and str(acc.get("distributed_type", "")).upper() != "DEEPSPEED":
            out.append(_edit(acc, ("distributed_type", "DEEPSPEED", ["sharding"])))
    elif acc is not None:
        out += [_edit(acc, item) for item in accelerate.edits(moved, new, acc)]
    elif main is not None:
        out += [_edit(main, item) for item in READERS[main.format].distribution_edits(moved, new, main)]
    return out


def config_edits(loaded: LoadedConfig, plan: TrainingPlan) -> list[ConfigEdit]:
    """The edits that make the user's files say ``plan``; a field no key carries is an edit with key null."""
    changes = _changes(loaded, plan)
    new = plan.model_dump()
    edits = _distribution_edits(loaded, changes, new)
    main = loaded.training
    rest = {k: v for k, v in changes.items() if k not in DISTRIBUTION and k != "num_gpus"}
    if main is not None and rest:
        edits += [_edit(main, item) for item in READERS[main.format].edits(rest, new, main)]
        ds = loaded.reading("deepspeed")
        if ds is not None:
            edits += _deepspeed_batch(ds, rest)
    covered = {f for e in edits for f in e.fields}
    target = main or loaded.readings[0]
    for name in ("gpu", "gpu_vram_gb"):
        value = getattr(plan, name)
        if value is not None and value != getattr(loaded.plan, name):
            edits.append(_edit(target, (None, value, [name], f"on a different GPU: {name}={value!r} (no config "
                                        "key: the GPU is where you run it)")))
    for name, value in rest.items():
        if name not in covered:
            edits.append(_edit(target, (None, value, [name], f"{name}={value!r}: no key of {target.format} configs "
                                        "sets this; it is how the estimate differs from your trainer's default")))
    return _dedupe(edits)


def _deepspeed_batch(ds: Reading, rest: dict) -> list[ConfigEdit]:
    out = []
    for key, name in (("train_micro_batch_size_per_gpu", "batch_size"),
                      ("gradient_accumulation_steps", "gradient_accumulation_steps")):
        if name in rest and isinstance(ds.get(key), int) and not isinstance(ds.get(key), bool):
            out.append(_edit(ds, (key, rest[name], [name])))
    return out


def _dedupe(edits: list[ConfigEdit]) -> list[ConfigEdit]:
    seen: dict[tuple, ConfigEdit] = {}
    for e in edits:
        k = (e.file, e.key) if e.key else (e.file, None, tuple(e.fields))
        if k in seen and e.key:
            seen[k].fields = sorted(set(seen[k].fields) | set(e.fields))
            seen[k].new = e.new
            continue
        seen[k] = e
    return [e for e in seen.values() if e.key is None or e.old != e.new]


# ------------------------------------------------------------------ the edited text

_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./\-]*")
_RESERVED = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


def yaml_value(value: Any) -> str:
    """One value in YAML flow style (JSON-compatible where quoting is needed)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return value if _PLAIN.fullmatch(value) and value.lower() not in _RESERVED else json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{yaml_value(str(k))}: {yaml_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(str(value))


_KEY = re.compile(r"( *)([\"']?)(.+?)\2 *:(?:\s|$)")


def _key_line(line: str, key: str, indent: int) -> bool:
    m = _KEY.match(line)
    return m is not None and len(m.group(1)) == indent and m.group(3) == key


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _extent(lines: list[str], i: int, indent: int) -> int:
    """One past the last line of the value of the key on line ``i``."""
    last, j = i, i + 1
    while j < len(lines):
        stripped = lines[j].strip()
        if stripped and not stripped.startswith("#"):
            item = stripped == "-" or stripped.startswith("- ")
            if _indent(lines[j]) > indent or (_indent(lines[j]) == indent and item):
                last = j
            else:
                break
        j += 1
    return last + 1


def _inline_comment(line: str) -> str:
    value = line.split(":", 1)[1] if ":" in line else ""
    m = re.search(r"\s+#.*$", value)
    quoted = '"' in value or "'" in value
    return m.group(0) if m and not quoted else ""


def _child_indent(lines: list[str], start: int, end: int, parent: int) -> int | None:
    for j in range(start, end):
        stripped = lines[j].strip()
        if stripped and not stripped.startswith("#"):
            return _indent(lines[j]) if _indent(lines[j]) > parent else None
    return None


def _nested(parts: list[str], value: Any, indent: int) -> list[str]:
    out = [" " * (indent + 2 * k) + f"{p}:" for k, p in enumerate(parts[:-1])]
    return [*out, " " * (indent + 2 * (len(parts) - 1)) + f"{parts[-1]}: {yaml_value(value)}"]


def yaml_set(text: str, key: str, value: Any, data: dict) -> str:
    """``text`` with the (dotted) ``key`` set to ``value``: the line is replaced, comments elsewhere are kept."""
    lines, parts = text.splitlines(), key.split(".")
    start, end, indent = 0, len(lines), 0
    for depth, part in enumerate(parts):
        i = next((j for j in range(start, end) if _key_line(lines[j], part, indent)), None)
        if i is None:
            at = end
            while depth and at > start and (not lines[at - 1].strip() or lines[at - 1].strip().startswith("#")):
                at -= 1
            lines[at:at] = _nested(parts[depth:], value, indent)
            break
        stop = _extent(lines, i, indent)
        if depth == len(parts) - 1:
            head = lines[i][indent:].split(":", 1)[0]
            lines[i:stop] = [" " * indent + head + ": " + yaml_value(value) + _inline_comment(lines[i])]
            break
        child = _child_indent(lines, i + 1, stop, indent)
        if child is None:  # an inline (flow) or empty value: write the whole mapping again, merged
            current = _lookup(data, parts[: depth + 1])
            merged = _set_in(dict(current) if isinstance(current, dict) else {}, parts[depth + 1:], value)
            lines[i:stop] = [" " * indent + part + ": " + yaml_value(merged)]
            break
        start, end, indent = i + 1, stop, child
    return "\n".join(lines) + "\n"


def _lookup(data: Any, parts: list[str]) -> Any:
    for part in parts:
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _set_in(data: dict, parts: list[str], value: Any) -> dict:
    node = data
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value
    return data


def json_text(text: str, data: dict, edits: list[tuple[str, Any]]) -> str:
    """The JSON file with the edits (dotted key, new value) applied, in its own indentation (key order kept)."""
    import copy

    data = copy.deepcopy(data)
    for key, new in edits:
        _set_in(data, key.split("."), new)
    rows = [line for line in text.splitlines()[1:] if line.strip()]
    indent = _indent(rows[0]) if rows and _indent(rows[0]) else 2
    return json.dumps(data, indent=indent) + "\n"


def apply_edits(loaded: LoadedConfig, edits: list[ConfigEdit]) -> dict[str, str]:
    """The edited text of every file the edits touch: {file name: new text}. Never writes anything."""
    out: dict[str, str] = {}
    for r in loaded.readings:
        mine = [(e.key, e.new) for e in edits if e.file == r.doc.name and e.key]
        if not mine:
            continue
        if r.doc.syntax == "json":
            out[r.doc.name] = json_text(r.doc.text, r.doc.data, mine)
            continue
        text = r.doc.text
        for key, new in mine:
            text = yaml_set(text, key, new, parse.parse(r.doc.name, text).data)
        out[r.doc.name] = text
    return out
