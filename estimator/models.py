"""Finding a model's config: the built-in catalog first, then a local folder with config.json.

Only config fields are read; weights never are. Reading from the Hugging Face Hub lives outside the
pure core (it needs the network); this module resolves what can be resolved offline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from . import catalog
from .errors import ModelConfigError, UnknownModelError
from .spec import ModelSpec

# config.json files are a few KB; anything near this is not a model config.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
# Nesting beyond this is no config a model ships (json's default recursion limit is ~1000).
MAX_CONFIG_DEPTH = 32


@dataclass(frozen=True)
class ResolvedModel:
    """A model name resolved to its config and architecture."""

    id: str
    source: str  # "catalog" or "local"; server/hub.py adds "hub-cache" and "hub"
    config: dict
    spec: ModelSpec
    params_exact: int | None = None  # from safetensors metadata, when known


def read_config_file(path: Path) -> dict:
    """Read a config.json with bounds on size and nesting, and a clear error for anything else."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ModelConfigError(f"model: cannot read {path}: {exc.strerror}") from None
    if size > MAX_CONFIG_BYTES:
        raise ModelConfigError(
            f"model: {path} is {size / 1e6:.1f} MB; a config.json is a few KB (limit {MAX_CONFIG_BYTES // 1048576} MiB)"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"model: cannot read {path} as UTF-8 text: {exc}") from None
    return parse_config_text(text, str(path))


def parse_config_text(text: str, where: str) -> dict:
    if len(text) > MAX_CONFIG_BYTES:
        raise ModelConfigError(f"model: {where} is larger than a config.json can be")
    depth = 0
    deepest = 0
    in_string = False
    escaped = False
    for ch in text:  # bound nesting before json recursion can
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_CONFIG_DEPTH:
                raise ModelConfigError(f"model: {where} nests deeper than {MAX_CONFIG_DEPTH} levels; not a model config")
        elif ch in "]}":
            depth -= 1
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise ModelConfigError(f"model: {where} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"model: {where} must hold a JSON object; got {type(data).__name__}")
    return data


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a valid config value")


def local_config_path(name: str) -> Path | None:
    """A local folder holding config.json, or a path to a config.json file; None when ``name`` is not one."""
    path = Path(name).expanduser()
    try:
        if path.is_dir() and (path / "config.json").is_file():
            return path / "config.json"
        if path.is_file() and path.name.endswith(".json"):
            return path
    except OSError:
        return None
    return None


def resolve_model(name: str) -> ResolvedModel:
    """Catalog (exact id or forgiving name) -> local folder; else UnknownModelError with suggestions."""
    entry = catalog.find_model(name)
    if entry is not None:
        config = entry.config_dict()
        return ResolvedModel(entry.id, "catalog", config, ModelSpec.from_config(config))
    path = local_config_path(name)
    if path is not None:
        config = read_config_file(path)
        return ResolvedModel(str(path.parent if path.name == "config.json" else path), "local", config,
                             ModelSpec.from_config(config))
    raise UnknownModelError(unknown_model_message(name))


def unknown_model_message(name: str) -> str:
    suggestions = catalog.suggest_models(name, limit=5)
    message = f"model: '{name}' is not in the built-in catalog and is not a local folder with config.json"
    if suggestions:
        message += "; did you mean " + ", ".join(f"'{s}'" for s in suggestions) + "?"
    message += " (`canifinetune models` lists the catalog; a local path to a folder with config.json also works)"
    return message
