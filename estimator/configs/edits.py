"""A suggestion as edits to the user's own files (in each format's key names), and the edited text."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ..errors import safe_text
from ..plan import TrainingPlan
from . import accelerate, deepspeed, parse
from .combine import READERS, LoadedConfig, load_configs
from .reading import Reading
from .types import ConfigEdit, ConfigError

NOT_IN_CONFIGS = ("model", "gpu", "gpu_vram_gb", "dataset", "output_dir", "truncation", "learning_rate", "max_steps",
                  "num_train_epochs", "framework")
DISTRIBUTION = ("sharding", "offload_optimizer", "offload_params")
ADAPTER_FIELDS = ("lora_r", "lora_alpha", "lora_dropout", "target_modules", "modules_to_save", "use_dora")
FOUR_BIT_FIELDS = ("bnb_4bit_quant_type", "bnb_4bit_use_double_quant")


def _changes(loaded: LoadedConfig, plan: TrainingPlan) -> dict[str, Any]:
    """Plan fields whose suggested value differs from what the files alone say."""
    base = TrainingPlan.model_fields
    out = {}
    for name in base:
        if name in NOT_IN_CONFIGS and not (name == "model" and "model" in loaded.report.plan_fields):
            continue  # the model only where a file names one (--model over it: the copy names the flag's)
        if (plan.method == "full" and name in ADAPTER_FIELDS) or (plan.method != "qlora" and name in FOUR_BIT_FIELDS):
            continue  # settings the plan's method does not use: no reader reads them back, nothing to write
        # what the files alone say (a flag the files cannot hold is written too, or said in a note)
        file_value = loaded.file_values[name] if name in loaded.file_values else base[name].default
        new = getattr(plan, name)
        if _norm(new) != _norm(file_value):
            out[name] = new
    return out


MULTI_NODE_ONLY = ("zero3_hpz", "fsdp_hybrid_shard")  # shardings only a multi-node recipe expresses


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
    if new["sharding"] in MULTI_NODE_ONLY:
        # ZeRO++ hpZ and FSDP hybrid shard span nodes (issue 27); the training files' own keys cannot say them
        return [*out, _edit(main or loaded.readings[0], (None, new["sharding"], sorted(moved),
                f"sharding {new['sharding']} over {new.get('num_nodes')} nodes: no key of these files says it; "
                "use the accelerate config (and ds_config.json) `canifinetune recipe` writes for it"))]
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
    ds, acc = loaded.reading("deepspeed"), loaded.reading("accelerate")
    if main is not None and rest:
        edits += [_edit(main, item) for item in READERS[main.format].edits(rest, new, main)]
    if ds is not None and rest:
        edits += _deepspeed_batch(ds, rest)
    if main is None and "dtype" in rest:  # launchers alone (with --model): their precision is the plan's
        edits += _launcher_dtype(ds, acc, rest["dtype"])
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
    """The DeepSpeed file's own batch numbers ("auto" defers to the trainer and stays)."""
    out = []
    for key, name in (("train_micro_batch_size_per_gpu", "batch_size"),
                      ("gradient_accumulation_steps", "gradient_accumulation_steps")):
        if name in rest and isinstance(ds.get(key), int) and not isinstance(ds.get(key), bool):
            out.append(_edit(ds, (key, rest[name], [name])))
    return out


def _launcher_dtype(ds: Reading | None, acc: Reading | None, dtype: str) -> list[ConfigEdit]:
    """The precision of a DeepSpeed or accelerate file given without a training config."""
    if ds is not None and dtype in ("bf16", "fp16"):
        other = "fp16" if dtype == "bf16" else "bf16"
        out = [_edit(ds, (f"{dtype}.enabled", True, ["dtype"]))]
        if ds.get(f"{other}.enabled") is True:
            out.append(_edit(ds, (f"{other}.enabled", False, ["dtype"])))
        return out
    if acc is not None and dtype in ("bf16", "fp16"):
        return [_edit(acc, ("mixed_precision", dtype, ["dtype"]))]
    return []


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


def _content_end(text: str, node: Any) -> int:
    """One past the last character of ``node``'s own text (a block collection's trailing line breaks, and a block
    scalar's, are not its content)."""
    if isinstance(node, (MappingNode, SequenceNode)) and not node.flow_style and node.value:
        last = node.value[-1]
        end = _content_end(text, last[1] if isinstance(node, MappingNode) else last)
    else:
        end = node.end_mark.index
    while end > node.start_mark.index and text[end - 1] in "\r\n":
        end -= 1
    return end


def _after_line(text: str, index: int) -> int:
    """The start of the line after the one holding ``index`` (the text's end when it is the last line)."""
    eol = text.find("\n", index)
    return len(text) if eol < 0 else eol + 1


def _colon_after(text: str, key: Node) -> int:
    """The index just past the ':' that follows a block mapping's key."""
    i = key.end_mark.index
    while i < len(text) and text[i] in " \t":
        i += 1
    if i >= len(text) or text[i] != ":":
        raise ConfigError(f"key '{safe_text(key.value, 60)}' is not written as 'key: value'")
    return i + 1


def _splice(text: str, start: int, end: int, new: str) -> str:
    return text[:start] + new + text[end:]


def _replace_value(text: str, key: Node, value_node: Any, value: Any) -> str:
    """``key``'s value written again as ``value``, on the key's line; comments around it stay."""
    flow = yaml_value(value)
    if isinstance(value_node, ScalarNode) and value_node.value == "" and value_node.style is None:
        at = _colon_after(text, key)  # an empty value: 'key:' (maybe with a comment after it)
        return _splice(text, at, at, " " + flow)
    if isinstance(value_node, ScalarNode) or value_node.flow_style:
        return _splice(text, value_node.start_mark.index, _content_end(text, value_node), flow)
    # a block list or mapping below the key: it becomes one flow value on the key's line
    return _splice(text, _colon_after(text, key), _content_end(text, value_node), " " + flow)


def _insert_key(text: str, mapping: MappingNode, parts: list[str], value: Any, newline: str) -> str:
    """A key ``mapping`` (a block mapping) does not have, added after its last entry, at the column of its keys."""
    column = mapping.value[0][0].start_mark.column
    at = _after_line(text, _content_end(text, mapping))
    if at == len(text) and not text.endswith("\n"):
        text, at = text + newline, len(text) + len(newline)
    return _splice(text, at, at, newline.join(_nested(parts, value, column)) + newline)


def _rewrite_flow(text: str, node: Any, current: Any, parts: list[str], value: Any) -> str:
    """A flow mapping (``{a: 1}``) written again with ``parts`` set to ``value``."""
    merged = _set_in(copy.deepcopy(current) if isinstance(current, dict) else {}, parts, value)
    return _splice(text, node.start_mark.index, _content_end(text, node), yaml_value(merged))


def _nested(parts: list[str], value: Any, indent: int) -> list[str]:
    out = [" " * (indent + 2 * k) + f"{yaml_key(p)}:" for k, p in enumerate(parts[:-1])]
    return [*out, " " * (indent + 2 * (len(parts) - 1)) + f"{yaml_key(parts[-1])}: {yaml_value(value)}"]


def yaml_key(key: str) -> str:
    return key if _PLAIN.fullmatch(key) and key.lower() not in _RESERVED else json.dumps(key)


def yaml_set(text: str, key: str, value: Any, name: str = "config") -> str:
    """``text`` with the (dotted) ``key`` set to ``value``. Located by the parsed document's own marks, so only the
    value changes: the key order, the comments, the indentation, the line endings and a document-end marker stay;
    a missing key is added at the end of its mapping, a flow mapping is written again as one."""
    doc = parse.parse_yaml(name, text)
    node: Any = doc.node  # a MappingNode (a flow or block one), then the value nodes below it
    data: Any = doc.data
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if node.flow_style:
            return _rewrite_flow(text, node, data, parts[depth:], value)
        found = next(((k, v) for k, v in node.value if isinstance(k, ScalarNode) and k.value == part), None)
        if found is None:
            return _insert_key(text, node, parts[depth:], value, doc.newline)
        key_node, value_node = found
        data = data.get(part) if isinstance(data, dict) else None
        if depth == len(parts) - 1:
            return _replace_value(text, key_node, value_node, value)
        if not isinstance(value_node, MappingNode) or not value_node.value:  # a scalar, a list or {}: a mapping now
            return _replace_value(text, key_node, value_node, _set_in({}, parts[depth + 1:], value))
        node = value_node
    return text


def _set_in(data: dict, parts: list[str], value: Any) -> dict:
    node = data
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value
    return data


def json_text(text: str, data: dict, edits: list[tuple[str, Any]]) -> str:
    """The JSON file with the edits (dotted key, new value) applied, in its own indentation, key order and line
    endings."""
    data = copy.deepcopy(data)
    for key, new in edits:
        _set_in(data, key.split("."), new)
    rows = [line for line in text.splitlines()[1:] if line.strip()]
    indent = len(rows[0]) - len(rows[0].lstrip(" ")) if rows else 0
    newline = "\r\n" if "\r\n" in text else "\n"
    out = json.dumps(data, indent=indent or 2, ensure_ascii=False)
    # a character the file held escaped ("\u0085", "\ud800") stays escaped: the reader refuses it raw
    out = parse.CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", out)
    return out.replace("\n", newline) + (newline if text.endswith("\n") or not text.strip() else "")


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
            try:
                text = yaml_set(text, key, new, r.doc.name)
            except ConfigError as exc:  # the edited text, not the user's file: say so
                raise ConfigError(safe_text(
                    f"{r.doc.name}: the edit {key}: {yaml_value(new)} could not be written into a copy of this file "
                    f"({exc}); nothing written: make the edits shown by hand", 900)) from None
        out[r.doc.name] = text
    return out


def edited_copies(loaded: LoadedConfig, plan: TrainingPlan) -> dict[str, str]:
    """The edited text of each file ``plan`` changes (as :func:`apply_edits`), each read back first by the same
    readers, with the same formats and the flags the edits do not replace: every plan field an edit with a key
    carries must come back as ``plan`` has it. Otherwise a ConfigError says what did not, and nothing should be
    written."""
    edits = config_edits(loaded, plan)
    edited = apply_edits(loaded, edits)
    if not edited:
        return edited
    carried = sorted({f for e in edits if e.key for f in e.fields})
    files: list[tuple[str, bytes | str]] = [(r.doc.name, edited.get(r.doc.name, r.doc.text)) for r in loaded.readings]
    overrides = {k: v for k, v in loaded.overrides.items() if k not in carried}
    names = ", ".join(edited)
    try:
        again = load_configs(files, formats=[r.format for r in loaded.readings], overrides=overrides)
    except ConfigError as exc:
        raise ConfigError(safe_text(f"the edited copy of {names} does not read back: {exc}; nothing written: make "
                                    "the edits shown by hand", 900)) from None
    wrong = [f"{f} is {getattr(again.plan, f)!r}, not {getattr(plan, f)!r}" for f in carried
             if _norm(getattr(again.plan, f)) != _norm(getattr(plan, f))]
    if wrong:
        raise ConfigError(safe_text(f"the edited copy of {names} reads back differently ({'; '.join(wrong)}); nothing "
                                    "written: make the edits shown by hand", 900))
    return edited
