"""Finding a model's config: the built-in catalog first, then a local folder with config.json.

Only config fields are read; weights never are. Reading from the Hugging Face Hub lives outside the
pure core (it needs the network); this module resolves what can be resolved offline.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from . import bounded_io, catalog
from .errors import ModelConfigError, UnknownModelError
from .errors import SafetensorsHeaderError as SafetensorsHeaderError  # declared in errors.py, raised here
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


def read_regular_file(path: Path, limit: int, what: str = "model") -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``limit`` bytes; else a ModelConfigError
    (:func:`bounded_io.read_regular_file`: a FIFO, a device or a socket is refused at once)."""

    def too_large(size: int) -> str:
        return f"{path} is {size / 1e6:.1f} MB; a config.json is a few KB (limit {limit // 1048576} MiB)"

    return bounded_io.read_regular_file(path, limit, lambda reason: ModelConfigError(f"{what}: {reason}"), too_large)


def read_config_file(path: Path) -> dict:
    """Read a config.json with bounds on size and nesting, and a clear error for anything else."""
    data = read_regular_file(path, MAX_CONFIG_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelConfigError(f"model: cannot read {path} as UTF-8 text: {exc.reason} at byte {exc.start}") from None
    return parse_config_text(text, str(path))


def parse_config_text(text: str, where: str) -> dict:
    if len(text) > MAX_CONFIG_BYTES:
        raise ModelConfigError(f"model: {where} is larger than a config.json can be")
    if bounded_io.json_nesting_breach(text, MAX_CONFIG_DEPTH) is not None:  # before json's recursion can
        raise ModelConfigError(f"model: {where} nests deeper than {MAX_CONFIG_DEPTH} levels; not a model config")
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise ModelConfigError(f"model: {where} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"model: {where} must hold a JSON object; got {type(data).__name__}")
    return data


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a valid config value")


def looks_like_path(name: str) -> bool:
    """Whether ``name`` is written as a path (``./``, ``../``, ``~``, ``/``, a backslash or a drive), never a model
    id."""
    return name.startswith(("/", "./", "../", "~", "\\", ".\\", "..\\")) or "\\" in name or name in (".", "..") or (
        len(name) > 2 and name[1] == ":" and name[2] in "/\\")


def is_local_name(name: str) -> bool:
    """A path-like name, or one naming something that exists here: it can only ever be a local folder."""
    if looks_like_path(name):
        return True
    try:
        return Path(name).exists()
    except (OSError, ValueError):
        return False


def local_config_path(name: str) -> Path | None:
    """A local folder holding config.json, or a path to a config.json file; None when ``name`` is not one."""
    try:
        path = Path(name).expanduser()
        if path.is_dir() and (path / "config.json").is_file():
            return path / "config.json"
        if path.is_file() and path.name.endswith(".json"):
            return path
    except (OSError, RuntimeError, ValueError):
        return None
    return None


def no_local_model_message(name: str) -> str:
    """The one message for a path that holds no model (the same whether it exists or not: it reveals nothing)."""
    return (f"model: no model folder with a config.json at {name!r}; give a local folder holding the model's "
            "config.json, a Hub id ('org/name') or a catalog name (`canifinetune models` lists it)")


# A catalog model's spec, read once per process: the catalog does not change while it runs, and a spec is frozen, so
# every estimate of the model shares one (and its hash, which the term caches key on, is computed once)
_CATALOG_SPECS: dict[str, ModelSpec] = {}


def resolve_model(name: str) -> ResolvedModel:
    """A local folder when ``name`` is a path (or names one that exists), else the catalog (an exact id or a
    name that matches one exactly, ignoring case and punctuation); else UnknownModelError with suggestions.

    A name resolves to exactly one model or is an error: a path never falls back to the catalog, and a near
    name is only suggested ("did you mean"), never taken."""
    if is_local_name(name):
        path = local_config_path(name)
        if path is None:
            raise UnknownModelError(no_local_model_message(name))
        config = read_config_file(path)
        spec = ModelSpec.from_config(config)
        folder = path.parent if path.name == "config.json" else None
        exact, warning = (None, None)
        if folder is not None:
            exact, warning = local_safetensors_params(folder, spec)
        if warning:
            spec = replace(spec, warnings=(*spec.warnings, warning))
        return ResolvedModel(str(path.parent if path.name == "config.json" else path), "local", config, spec,
                             params_exact=exact)
    entry = catalog.find_model(name, forgiving=False)
    if entry is not None:
        config = entry.config_dict()
        known = _CATALOG_SPECS.get(entry.id)
        if known is None:
            known = _CATALOG_SPECS[entry.id] = ModelSpec.from_config(config)
        return ResolvedModel(entry.id, "catalog", config, known)
    raise UnknownModelError(unknown_model_message(name))


def unknown_model_message(name: str) -> str:
    suggestions = catalog.suggest_models(name, limit=5)
    message = f"model: {name!r} is not in the built-in catalog and is not a local folder with config.json"
    if suggestions:
        message += "; did you mean " + ", ".join(f"'{s}'" for s in suggestions) + "?"
    message += " (`canifinetune models` lists the catalog; a local path to a folder with config.json also works)"
    return message


# ------------------------------------------------------------------------------------------ safetensors headers

# A safetensors header is JSON describing each tensor; real ones are at most a few MB.
MAX_SAFETENSORS_HEADER = 32 * 1024 * 1024
MAX_SAFETENSORS_FILES = 2048
# A checkpoint count further than this from config.json's own count is not believed (a tampered header).
PARAMS_RATIO_BOUNDS = (0.5, 2.0)
PACKED_DTYPES = ("I32", "U32", "I8", "U8", "I16", "U16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2")
_MAX_TENSOR_ELEMENTS = 1 << 48


def safetensors_header_counts(header: object) -> dict[str, int]:
    """Element counts per dtype of a parsed safetensors header; SafetensorsHeaderError for anything impossible."""
    if not isinstance(header, dict):
        raise SafetensorsHeaderError("the header is not a JSON object")
    counts: dict[str, int] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict):
            raise SafetensorsHeaderError("a tensor entry is not an object")
        dtype, shape = info.get("dtype"), info.get("shape")
        if not isinstance(dtype, str) or not re.fullmatch(r"[A-Z0-9_]{1,16}", dtype):
            raise SafetensorsHeaderError("a tensor has no valid dtype")
        if not isinstance(shape, list) or len(shape) > 8:
            raise SafetensorsHeaderError("a tensor has no valid shape")
        n = 1
        for dim in shape:
            if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0 or dim > _MAX_TENSOR_ELEMENTS:
                raise SafetensorsHeaderError(f"a tensor dimension is not a non-negative integer ({str(dim)[:20]})")
            n *= dim
            if n > _MAX_TENSOR_ELEMENTS:
                raise SafetensorsHeaderError("a tensor is larger than any real one")
        counts[dtype] = counts.get(dtype, 0) + n
    return counts


def checked_params_exact(counts: dict, spec: ModelSpec, where: str) -> tuple[int | None, str | None]:
    """(the checkpoint's parameter count, None) when it is believable; else (None, a warning saying why).

    Believable: every count a finite non-negative integer, no packed (pre-quantized) dtype, and the total
    within PARAMS_RATIO_BOUNDS of the count config.json gives."""
    total = 0
    for n in counts.values():
        if isinstance(n, bool) or not isinstance(n, (int, float)) or (isinstance(n, float) and not math.isfinite(n)):
            return None, (f"{where}: a parameter count in the safetensors headers is not a number; counted from "
                          "config.json")
        if n < 0 or n != int(n):
            return None, f"{where}: a parameter count in the safetensors headers is negative; counted from config.json"
        total += int(n)
    packed = sorted(str(d) for d in counts if d in PACKED_DTYPES)
    if packed:
        return None, (f"the checkpoint stores tensors in {', '.join(packed)} (a pre-quantized checkpoint): its "
                      "element counts are not parameter counts, so the estimate uses the config's count")
    counted = spec.total_params
    low, high = PARAMS_RATIO_BOUNDS
    if not counted or not low * counted <= total <= high * counted:
        return None, (f"{where}: the safetensors headers hold {total:,} parameters, not within {low:g}x-{high:g}x of "
                      f"the {counted:,} config.json describes; the headers were not used (counted from config.json)")
    return total, None


def read_safetensors_header(path: Path) -> object:
    """The parsed JSON header of one .safetensors file (8-byte little-endian length, then JSON); bounded."""
    with bounded_io.open_regular(path, SafetensorsHeaderError) as (fd, info):
        head = os.read(fd, 8)
        if len(head) != 8:
            raise SafetensorsHeaderError(f"{path.name} is shorter than a safetensors header")
        size = int.from_bytes(head, "little")
        if size > MAX_SAFETENSORS_HEADER or size > info.st_size - 8:
            raise SafetensorsHeaderError(f"{path.name} declares a {size}-byte header")
        chunks, got = [], 0
        while got < size:
            chunk = os.read(fd, min(1 << 20, size - got))
            if not chunk:
                raise SafetensorsHeaderError(f"{path.name} ends inside its header")
            chunks.append(chunk)
            got += len(chunk)
    return json.loads(b"".join(chunks).decode("utf-8"), parse_constant=_reject_constant)


def local_safetensors_params(folder: Path, spec: ModelSpec) -> tuple[int | None, str | None]:
    """The parameter count of a local checkpoint's *.safetensors headers (never the weights), checked against
    config.json's count: (count, None), (None, a warning), or (None, None) when the folder has no safetensors."""
    try:
        files = sorted(p for p in folder.glob("*.safetensors"))[: MAX_SAFETENSORS_FILES + 1]
    except OSError:
        return None, None
    if not files:
        return None, None
    where = f"model: {folder}"
    if len(files) > MAX_SAFETENSORS_FILES:
        return None, f"{where} holds more than {MAX_SAFETENSORS_FILES} safetensors files; counted from config.json"
    counts: dict[str, int] = {}
    try:
        for path in files:
            for dtype, n in safetensors_header_counts(read_safetensors_header(path)).items():
                counts[dtype] = counts.get(dtype, 0) + n
    except (OSError, ValueError, RecursionError, ModelConfigError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return None, f"{where}: a safetensors header could not be read ({why[:160]}); counted from config.json"
    return checked_params_exact(counts, spec, where)
