"""The faces of `--config` (CLI) and `config` (MCP): read the user's files, show what was read, and write the
edited copy. The reading itself is canifinetune.estimator.configs; this module only reads files, prints and writes."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from canifinetune.estimator.bounded_io import read_regular_file
from canifinetune.estimator.configs import (
    MAX_CONFIG_BYTES,
    ConfigError,
    ConfigReport,
    LoadedConfig,
    edited_copies,
    load_configs,
    suggestion_edits,
)
from canifinetune.estimator.errors import safe_text

MAX_SHOWN = 60


def read_config_file(path: str) -> tuple[str, bytes]:
    """(name, bytes) of one config file: a regular file, at most MAX_CONFIG_BYTES, read without following FIFOs."""
    shown = safe_text(path, 200)

    def too_large(size: int) -> str:
        return f"{shown} is {size} bytes; a training config is at most {MAX_CONFIG_BYTES // 1024} KB"

    raw = read_regular_file(path, MAX_CONFIG_BYTES, lambda reason: ConfigError(f"--config: {safe_text(reason, 400)}"),
                            too_large)
    return path, raw


def load_from_paths(paths: list[str], overrides: dict[str, Any], formats: list[str] | None = None) -> LoadedConfig:
    if formats and len(formats) > len(paths):
        raise ConfigError(f"--config-format: {len(formats)} formats for {len(paths)} --config files")
    return load_configs([read_config_file(p) for p in paths], formats=list(formats or []), overrides=overrides)


def _value(value: Any) -> str:
    return safe_text(repr(value) if isinstance(value, str) else str(value), 120)


def format_report(report: ConfigReport) -> str:
    """The plain-text account of a config: files, keys used, flags over them, defaults, not modelled, ignored."""
    lines = ["config: " + "; ".join(f"{safe_text(f.name, 200)} ({f.format}; defaults: {f.defaults_from})"
                                    for f in report.files)]
    lines.append(f"  trainer: {report.framework}")
    for use in report.used[:MAX_SHOWN]:
        target = f"{use.field} = {_value(use.plan_value)}" if use.field else "(read; nothing to set)"
        lines.append(f"  used  {safe_text(use.key, 80)}: {_value(use.value)} -> {target}")
    if len(report.used) > MAX_SHOWN:
        lines.append(f"  ... and {len(report.used) - MAX_SHOWN} more keys used")
    for o in report.overrides:
        lines.append(f"  flag  {o.field}: {_value(o.value)} replaces the file's {_value(o.file_value)}")
    if report.defaults:
        shown = ", ".join(f"{k} {_value(v)}" for k, v in report.defaults.items())
        lines.append(f"  defaults the file leaves to {report.framework}: {shown}")
    for w in report.not_modelled:
        lines.append(f"  warning: {safe_text(w.key + ': ' if w.key else '', 80)}{safe_text(w.message, 600)}")
    if report.ignored:
        lines.append(f"  ignored: {report.ignored} keys that do not change GPU memory:")
        by_reason: dict[str, list[str]] = {}
        for key in report.ignored_keys:
            by_reason.setdefault(report.ignored_reasons.get(key, "no memory"), []).append(key)
        for reason, keys in by_reason.items():
            lines.append(f"    {', '.join(safe_text(k, 60) for k in keys)} ({safe_text(reason, 200)})")
        if report.ignored > len(report.ignored_keys):
            lines.append(f"    ... and {report.ignored - len(report.ignored_keys)} more")
    return "\n".join(lines)


def format_edits(groups) -> str:
    """Each suggestion as edits to the user's files."""
    lines = ["as edits to your config:"]
    for group in groups:
        lines.append(f"  #{group.rank}:" + ("" if group.edits else " no change to the files"))
        for e in group.edits:
            if e.key:
                old = "(not set)" if e.old is None else _value(e.old)
                lines.append(f"    {safe_text(e.file, 120)}: {safe_text(e.key, 80)}: {old} -> {_value(e.new)}"
                             + (f"  ({safe_text(e.note, 300)})" if e.note else ""))
            else:
                lines.append(f"    ({', '.join(e.fields)}) {safe_text(e.note or '', 300)}")
    return "\n".join(lines)


def with_config(structured: dict, loaded: LoadedConfig, result=None) -> dict:
    """The tool's structured content with the config report and, for a search, config_edits."""
    out = dict(structured)
    out["config"] = loaded.report.model_dump(mode="json")
    if result is not None:
        out["config_edits"] = [g.model_dump(mode="json") for g in suggestion_edits(loaded, result)]
    return out


def _safe_target(target: Path, inputs: list[Path], force: bool) -> None:
    if any(target.resolve() == p.resolve() for p in inputs):
        raise ConfigError(f"--write-config {safe_text(target, 200)}: that is your original config; the edited copy "
                          "is always a new file")
    if target.is_symlink():
        raise ConfigError(f"--write-config {safe_text(target, 200)}: a symbolic link; name a new file")
    if target.exists() and (not force or not target.is_file()):
        raise ConfigError(f"--write-config {safe_text(target, 200)}: already exists; give --force to replace it")


def _original_mode(name: str) -> int:
    """The permission bits of the user's file (an edited copy gets the same); 0o644 when it cannot be read."""
    try:
        return os.stat(name).st_mode & 0o777
    except OSError:
        return 0o644


def _write(target: Path, data: bytes, mode: int) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".canifinetune-", dir=target.parent)  # mkstemp makes it 0600
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)  # the original's permissions, not mkstemp's 0600
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_edited(loaded: LoadedConfig, plan, out: str, force: bool) -> list[Path]:
    """Write the files edited to say ``plan``: OUT itself for one edited file, OUT/<name> for several.
    Every copy is read back first by the same readers and must give ``plan``'s values (edited_copies); two edited
    files of the same name, an input file or an existing file without ``force`` are refused before anything is
    written. Each copy keeps its original's permissions, line endings and byte-order mark. Returns the paths
    written."""
    edited = edited_copies(loaded, plan)
    if not edited:
        return []
    inputs = [Path(r.doc.name) for r in loaded.readings]
    base = Path(out)
    folder = len(edited) > 1 or base.is_dir()
    targets = {name: (base / Path(name).name if folder else base) for name in edited}
    seen: dict[Path, str] = {}
    for name, target in targets.items():
        if target in seen:
            raise ConfigError(f"--write-config {safe_text(base, 200)}: {safe_text(seen[target], 200)} and "
                              f"{safe_text(name, 200)} would both be written as {safe_text(target, 200)}, one over the "
                              "other; nothing written: give the files different names")
        seen[target] = name
    for target in targets.values():
        _safe_target(target, inputs, force)
    docs = {r.doc.name: r.doc for r in loaded.readings}
    for name, target in targets.items():
        doc = docs[name]
        data = ("\ufeff" if doc.bom else "") + edited[name]
        _write(target, data.encode("utf-8"), _original_mode(name))
    return list(targets.values())


# ------------------------------------------------------------------ the CLI's wiring (server/cli.py calls these)

def cli_json(args, result, search: bool = False) -> str:
    """--json output: the tool's structure, plus config (and config_edits) when --config was given."""
    import json

    loaded = getattr(args, "loaded_config", None)
    if loaded is None:
        return result.model_dump_json(indent=2)
    return json.dumps(with_config(result.model_dump(mode="json"), loaded, result if search else None), indent=2)


def cli_text(args, result=None) -> str | None:
    """The config account (and, for a search, the edits) printed after the estimate or the suggestions."""
    loaded = getattr(args, "loaded_config", None)
    if loaded is None:
        return None
    text = format_report(loaded.report)
    if result is not None and result.suggestions:
        text += "\n" + format_edits(suggestion_edits(loaded, result))
    return text


def cli_write(args, result) -> str | None:
    """suggest --write-config OUT: the best suggestion written as an edited copy of the user's config."""
    out = getattr(args, "write_config", None)
    if out is None:
        return None
    loaded = getattr(args, "loaded_config", None)
    if loaded is None:
        raise ConfigError("--write-config: needs --config FILE (the config to edit)")
    if not result.suggestions:
        return "nothing written: " + ("the plan fits as it is" if result.fits_already else "no suggestion fits")
    paths = write_edited(loaded, result.suggestions[0].plan, out, force=bool(getattr(args, "force", False)))
    if not paths:
        return "nothing written: suggestion #1 changes nothing a key of your config can say (see the edits above)"
    return "wrote suggestion #1 as an edited copy of your config: " + ", ".join(str(p) for p in paths)


# ------------------------------------------------------------------ the MCP tools' wiring (server/mcp_server.py)

def load_call_config(arguments: dict[str, Any], data: dict[str, Any], sent: frozenset[str]) -> LoadedConfig | None:
    """The config text in ``arguments`` read, with the plan fields in ``data`` that the call set (``sent``) over the
    file's values (its plan is ``.plan``); None when the call gave no config."""
    if arguments.get("config") is None:
        return None
    overrides = {k: v for k, v in data.items() if k in sent and not (k == "model" and v is None)}
    return load_configs([("config", arguments["config"])], formats=[arguments.get("config_format")],
                        overrides=overrides)


MCP_IGNORED_SHOWN = 12


def compact_report(report: ConfigReport) -> dict:
    """The config account as the MCP tools send it, once per answer: the file's format, each key used with the plan
    field it set (the values are the plan's, in the answer), the arguments that replaced the file's values, the
    defaults it leaves to the framework, the keys not modelled (each with its warning) and the ignored ones."""
    used: dict[str, str | None] = {}
    for use in report.used:
        used[use.key if len(report.files) == 1 else f"{use.file}:{use.key}"] = use.field
    return {
        "files": [{"name": f.name, "format": f.format, "defaults_from": f.defaults_from} for f in report.files],
        "framework": report.framework,
        "used": used,
        "overrides": [o.model_dump(mode="json") for o in report.overrides],
        "defaults": report.defaults,
        "not_modelled": [{"key": w.key, "message": w.message} for w in report.not_modelled],
        "ignored": report.ignored,
        "ignored_keys": report.ignored_keys[:MCP_IGNORED_SHOWN],
    }


def compact_edits(groups) -> list[dict]:
    """Each suggestion as edits to the file (its format is the config's, said once in ``config.files``)."""
    return [{"rank": g.rank, "edits": [{k: v for k, v in e.model_dump(mode="json").items()
                                        if k != "format" and not (k == "note" and v is None)} for e in g.edits]}
            for g in groups]


def summary_line(report: ConfigReport) -> str:
    """'config: axolotl file, 12 keys used, 2 not modelled (warned), 5 ignored; details in structured content'."""
    formats = ", ".join(dict.fromkeys(f.format for f in report.files))
    parts = [f"{len(report.used)} keys used"]
    if report.overrides:
        parts.append(f"{len(report.overrides)} replaced by arguments")
    parts.append(f"{len(report.not_modelled)} not modelled (warned)")
    parts.append(f"{report.ignored} ignored")
    files = "file" if len(report.files) == 1 else f"{len(report.files)} files"
    return f"config: {formats} {files}, " + ", ".join(parts) + "; details in structured content"


def _file_value(value: Any) -> str:
    """A value as the file writes it: 'lora', true, 8192."""
    import json

    if isinstance(value, str):
        return _value(value)
    try:
        return safe_text(json.dumps(value), 120)
    except (TypeError, ValueError):
        return _value(value)


def _edit_words(e) -> str:
    if not e.key:
        return f"({', '.join(e.fields)}) {safe_text(e.note or '', 200)}"
    old = "(not set)" if e.old is None else _file_value(e.old)
    return f"{safe_text(e.key, 80)}: {old} -> {_file_value(e.new)}"


def mcp_structured(structured: dict, loaded: LoadedConfig | None, result=None) -> dict:
    """The structured content, with `config` (and `config_edits` for a search) when the call gave a config
    (``loaded``, None without one): the account once, compact (:func:`compact_report`)."""
    if loaded is None:
        return structured
    out = dict(structured)
    out["config"] = compact_report(loaded.report)
    if result is not None:
        out["config_edits"] = compact_edits(suggestion_edits(loaded, result))
    return out


def mcp_text(text: str, loaded: LoadedConfig | None, result=None) -> str:
    """The tool's text with the config ``loaded`` (None: the call gave none, the text unchanged) in one line (the
    account is in the structured content), the warnings about keys that are not modelled, and for a search the first
    suggestion as edits to the file."""
    if loaded is None:
        return text
    report = loaded.report
    lines = [summary_line(report)]
    lines += [f"warning: {safe_text(w.key + ': ' if w.key else '', 80)}{safe_text(w.message, 600)}"
              for w in report.not_modelled]
    if result is not None and result.suggestions:
        first = suggestion_edits(loaded, result)[0]
        edits = "; ".join(_edit_words(e) for e in first.edits) or "no change to the file"
        lines.append(f"as edits to your config, #{first.rank}: {edits} (all: config_edits)")
    head, sep, last = text.rpartition("\n")
    if sep and last.startswith("next"):  # the next step stays the last line
        return "\n".join([head, *lines, last])
    return "\n".join([text, *lines])
