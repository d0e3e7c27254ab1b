"""Any model, by name: the catalog, a local folder, the Hugging Face cache, then the Hub.

The core (``canifinetune.estimator``) resolves what needs no network: catalog names and local folders
with config.json. This module adds the rest, through ``huggingface_hub`` (imported only when the
catalog and the local lookup found nothing):

1. the local Hugging Face cache (``HF_HOME`` / ``HF_HUB_CACHE``): a config.json downloaded before;
2. the Hub (``HF_ENDPOINT``, default https://huggingface.co), unless offline: config.json, then the
   safetensors metadata (``model.safetensors.index.json`` and an HTTP Range read of each shard's
   header) for the exact parameter count and dtypes. Weights are never downloaded.

config.json and the index land in the Hugging Face cache the way ``hf_hub_download`` puts them; the
parameter counts read from the shard headers are kept beside them in huggingface_hub's assets cache
(``cached_assets_path``), keyed by commit, so a cached model resolves offline with its exact count.

Offline (``offline=True``, ``--offline``, ``HF_HUB_OFFLINE=1``) means no socket is opened. ``HF_TOKEN``
(or a token saved by ``hf auth login``) opens gated repos. No modeling code from a repo is ever run:
``trust_remote_code`` does not exist here; a config that needs custom code is estimated from its
standard fields, with a warning.
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from canifinetune.estimator import catalog
from canifinetune.estimator.errors import (  # the Hub's errors are declared in errors.py (the one error tree)
    GatedModelError,
    HubError,
    HubUnreachableError,
    ModelConfigError,
    OfflineNotCachedError,
    UnknownModelError,
)
from canifinetune.estimator.model_sources import (
    MAX_CONFIG_BYTES,
    ResolvedModel,
    checked_params_exact,
    is_local_name,
    read_config_file,
    resolve_model,
    unknown_model_message,
)
from canifinetune.estimator.spec import ModelSpec

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_TIMEOUT = 10.0  # seconds per request; one attempt each, no retries
MAX_INDEX_BYTES = 64 * 1024 * 1024  # the largest real index (a few hundred thousand tensors) is ~30 MB
MAX_SHARDS = 2048
SHARD_WORKERS = 8
CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# PACKED_DTYPES (estimator/model_sources.py): dtypes a pre-quantized checkpoint packs several parameters into
# (GPTQ/AWQ int32, bnb uint8, fp8); their element counts are not parameter counts.

_TRUE = {"1", "ON", "YES", "TRUE"}
# A Hub repo id: "name" or "namespace/name" (huggingface_hub's validate_repo_id, without importing it).
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.\-]{0,95}/)?[A-Za-z0-9][\w.\-]{0,95}$")


# ------------------------------------------------------------------------------------------ environment


def env_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as huggingface_hub reads it, but read now."""
    return any((os.environ.get(k) or "").upper() in _TRUE for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _hf_home() -> Path:
    home = os.environ.get("HF_HOME")
    if home:
        return Path(os.path.expandvars(home)).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(os.path.expandvars(xdg)).expanduser() / "huggingface"


def hub_cache_dir() -> Path:
    """Where hf_hub_download caches repos: HF_HUB_CACHE, else $HF_HOME/hub (read at call time)."""
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    return Path(os.path.expandvars(cache)).expanduser() if cache else _hf_home() / "hub"


def assets_dir() -> Path:
    cache = os.environ.get("HF_ASSETS_CACHE")
    return Path(os.path.expandvars(cache)).expanduser() if cache else _hf_home() / "assets"


def may_reach_hub(offline: bool = False) -> bool:
    """Whether a resolver started with ``offline`` may open a connection to the Hub."""
    return not (offline or env_offline())


# ------------------------------------------------------------------------------------------ public


def resolve_any(name: str, *, offline: bool = False, token: str | None = None,
                timeout: float = DEFAULT_TIMEOUT) -> ResolvedModel:
    """Resolve ``name``: catalog -> local folder -> Hugging Face cache -> the Hub (unless offline).

    Raises a :class:`~canifinetune.estimator.errors.CanIFinetuneError` (field ``model``) whose message
    says what went wrong and what to do: unknown repo, gated repo, offline and not cached, a config
    without the fields a decoder needs.
    """
    if is_local_name(name):  # a path is only ever a local folder: never the catalog, the cache or the Hub
        return _with_code_warning(resolve_model(name), name)
    try:
        return _with_code_warning(resolve_model(name), name)
    except UnknownModelError:
        pass
    name = name.strip()
    if not _REPO_ID.fullmatch(name) or "--" in name or ".." in name:
        raise UnknownModelError(unknown_model_message(name))
    offline = not may_reach_hub(offline)
    _need_huggingface_hub(name)
    cached = _from_cache(name, offline=offline, token=token, timeout=timeout)
    if cached is not None:
        return cached
    if offline:
        raise OfflineNotCachedError(_offline_message(name))
    return _from_hub(name, token=token, timeout=timeout)


def _need_huggingface_hub(name: str) -> None:
    """A clear refusal when huggingface_hub (a dependency) is missing from a broken environment, never a
    ModuleNotFoundError reported as an internal error."""
    import importlib.util

    try:
        found = importlib.util.find_spec("huggingface_hub") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise UnknownModelError(
            f"model: '{name}' is not in the built-in catalog or a local folder, and reading it from the Hugging Face "
            "Hub (or its cache) needs the huggingface_hub package, which this environment lacks: run "
            "`pip install huggingface_hub` (a dependency of canifinetune: `pip install -e .` installs it)."
            + _closest(name))


# ------------------------------------------------------------------------------------------ messages


def _closest(name: str) -> str:
    close = catalog.suggest_models(name, limit=5)
    return (" Closest catalog models: " + ", ".join(f"'{c}'" for c in close) + ".") if close else ""


def _offline_message(repo_id: str) -> str:
    return (f"model: '{repo_id}' is not in the built-in catalog and not in the local Hugging Face cache "
            f"({hub_cache_dir()}), and offline mode is on (--offline or HF_HUB_OFFLINE=1), so the Hub was not asked."
            + _closest(repo_id)
            + " Run once online (without --offline) to cache its config.json, or pass a local folder with config.json.")


def _gated_message(repo_id: str, token: str | None) -> str:
    page = f"{DEFAULT_ENDPOINT}/{repo_id}"
    if token:
        return (f"model: '{repo_id}' is a gated repo and the token given (HF_TOKEN) has no access to it yet: "
                f"request access at {page}, wait for approval, and try again." + _closest(repo_id))
    return (f"model: '{repo_id}' is a gated repo: request access at {page}, then create a read token at "
            f"{DEFAULT_ENDPOINT}/settings/tokens and set HF_TOKEN (or run `hf auth login`)." + _closest(repo_id))


def _not_found_message(repo_id: str, token: str | None) -> str:
    private = "" if token else " If it is private, set HF_TOKEN to a token with access."
    return (f"model: '{repo_id}' is not in the built-in catalog, not a local folder, and the Hub "
            f"({hub_endpoint()}) has no such repo.{private}" + _closest(repo_id)
            + " (`canifinetune models` lists the catalog.)")


def _unreachable_message(repo_id: str, why: str, timeout: float) -> str:
    return (f"model: '{repo_id}' is not in the built-in catalog or the local Hugging Face cache, and the Hub "
            f"({hub_endpoint()}) could not be reached: {why}." + _closest(repo_id)
            + " Check the connection (or HF_ENDPOINT), or use a catalog model or a local folder with config.json;"
            " --offline (HF_HUB_OFFLINE=1) never tries the network.")


def _map_error(exc: BaseException, repo_id: str, token: str | None, timeout: float) -> HubError:
    """A huggingface_hub / httpx exception as a HubError with an actionable message."""
    import httpx2
    from huggingface_hub import errors as hf

    if isinstance(exc, hf.GatedRepoError):
        return GatedModelError(_gated_message(repo_id, token))
    if isinstance(exc, hf.RepositoryNotFoundError):
        return HubError(_not_found_message(repo_id, token))
    if isinstance(exc, hf.RevisionNotFoundError):
        return HubError(f"model: '{repo_id}' has no 'main' revision on the Hub")
    if isinstance(exc, (hf.RemoteEntryNotFoundError, hf.EntryNotFoundError)):
        return HubError(f"model: '{repo_id}' exists on the Hub but has no config.json: it is not a transformers "
                        "model canifinetune can read (GGUF-only and adapter-only repos have none)." + _closest(repo_id))
    if isinstance(exc, hf.OfflineModeIsEnabled):
        return OfflineNotCachedError(_offline_message(repo_id))
    if isinstance(exc, hf.LocalEntryNotFoundError):
        cause = exc.__cause__ or exc.__context__
        if cause is not None and cause is not exc:
            return _map_error(cause, repo_id, token, timeout)
        return HubUnreachableError(_unreachable_message(repo_id, str(exc).split(". ")[0], timeout))
    if isinstance(exc, hf.FileMetadataError):
        return HubUnreachableError(_unreachable_message(repo_id, str(exc), timeout))
    if isinstance(exc, hf.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403):
            return GatedModelError(_gated_message(repo_id, token))
        return HubUnreachableError(_unreachable_message(repo_id, f"HTTP {status}", timeout))
    if isinstance(exc, httpx2.TimeoutException):
        return HubUnreachableError(_unreachable_message(repo_id, f"no answer within {timeout:g} s", timeout))
    if isinstance(exc, (httpx2.TransportError, OSError)):
        return HubUnreachableError(_unreachable_message(repo_id, f"{type(exc).__name__}: {exc}", timeout))
    return HubUnreachableError(_unreachable_message(repo_id, f"{type(exc).__name__}: {exc}", timeout))


# ------------------------------------------------------------------------------------------ configs


def _needs_remote_code(config: dict) -> bool:
    return isinstance(config.get("auto_map"), dict) and bool(config["auto_map"])


def _code_warning(config: dict) -> str | None:
    if not _needs_remote_code(config):
        return None
    return ("this model ships its own modeling code (config.json auto_map); canifinetune never runs it "
            "(no trust_remote_code) and estimates it from the standard config fields as a decoder; "
            "measure a short run before relying on it")


def _with_code_warning(rm: ResolvedModel, name: str) -> ResolvedModel:
    warning = _code_warning(rm.config)
    if warning is None or warning in rm.spec.warnings:
        return rm
    return replace(rm, spec=replace(rm.spec, warnings=(warning, *rm.spec.warnings)))


def _spec(repo_id: str, config: dict, extra_warnings: tuple[str, ...] = ()) -> ModelSpec:
    try:
        spec = ModelSpec.from_config(config)
    except ModelConfigError as exc:
        text = str(exc)
        if _needs_remote_code(config):
            text += (f"; '{repo_id}' uses custom modeling code (auto_map), which canifinetune never runs: it "
                     "estimates from the standard fields (hidden_size, num_hidden_layers, num_attention_heads, "
                     "intermediate_size, vocab_size), and this config lacks them")
        raise ModelConfigError(f"model: {repo_id}: {text}") from None
    warnings = tuple(w for w in (_code_warning(config), *extra_warnings) if w)
    return replace(spec, warnings=warnings + tuple(spec.warnings)) if warnings else spec


def _resolved(repo_id: str, source: str, config_path: Path, record: dict | None) -> ResolvedModel:
    try:
        config = read_config_file(config_path)
    except ModelConfigError as exc:
        raise ModelConfigError(str(exc).replace(str(config_path), f"{repo_id}/config.json")) from None
    extra: list[str] = []
    params_exact = None
    counts = record.get("parameter_count") if record else None
    if record and record.get("available") and isinstance(counts, dict):
        spec = _spec(repo_id, config)
        params_exact, warning = checked_params_exact({str(k): v for k, v in counts.items()}, spec,
                                                     f"model: {repo_id}")
        if warning:
            extra.append(warning)
    elif record and record.get("reason"):
        extra.append(f"exact parameter count unavailable ({record['reason']}); counted from config.json")
    spec = _spec(repo_id, config, tuple(extra))
    return ResolvedModel(repo_id, source, config, spec, params_exact=params_exact)


# ------------------------------------------------------------------------------------------ cache


def _from_cache(repo_id: str, *, offline: bool, token: str | None, timeout: float) -> ResolvedModel | None:
    from huggingface_hub import try_to_load_from_cache

    try:
        path = try_to_load_from_cache(repo_id, CONFIG_FILE, cache_dir=hub_cache_dir())
    except Exception:  # a malformed cache folder is a cache miss
        return None
    if not isinstance(path, str):
        return None
    commit = Path(path).parent.name
    record = _read_record(repo_id, commit)
    if record is None and not offline:
        record = _safetensors_record(repo_id, commit, token=token, timeout=timeout)
        _write_record(repo_id, commit, record)
    return _resolved(repo_id, "hub-cache", Path(path), record)


def _record_path(repo_id: str, commit: str) -> Path:
    from huggingface_hub import cached_assets_path

    folder = cached_assets_path(library_name="canifinetune", namespace=repo_id, subfolder="safetensors",
                                assets_dir=assets_dir())
    return folder / f"{commit}.json"


def _read_record(repo_id: str, commit: str) -> dict | None:
    try:
        path = _record_path(repo_id, commit)
        if path.is_file() and path.stat().st_size < 1 << 20:
            data = json.loads(path.read_text(encoding="utf-8"))
            return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        pass
    return None


def _write_record(repo_id: str, commit: str, record: dict) -> None:
    if record.get("transient"):
        return  # a network hiccup: ask again next time
    try:
        path = _record_path(repo_id, commit)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass


# ------------------------------------------------------------------------------------------ the Hub


def _head(repo_id: str, filename: str, *, revision: str | None, token: str | None, timeout: float):
    """One HEAD request (no retries, unlike hf_hub_download's fallbacks): the file's size and commit."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(repo_id, filename, revision=revision, endpoint=hub_endpoint())
    return get_hf_file_metadata(url, token=token, timeout=timeout)


def _download(repo_id: str, filename: str, *, revision: str | None, token: str | None, timeout: float) -> Path:
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(repo_id, filename, revision=revision, cache_dir=hub_cache_dir(),
                                endpoint=hub_endpoint(), token=token, etag_timeout=timeout))


def _from_hub(repo_id: str, *, token: str | None, timeout: float) -> ResolvedModel:
    try:
        meta = _head(repo_id, CONFIG_FILE, revision=None, token=token, timeout=timeout)
    except Exception as exc:
        raise _map_error(exc, repo_id, token, timeout) from None
    if meta.size is not None and meta.size > MAX_CONFIG_BYTES:
        raise ModelConfigError(
            f"model: {repo_id}/config.json is {meta.size / 1e6:.1f} MB on the Hub; a config.json is a few KB "
            f"(limit {MAX_CONFIG_BYTES // 1048576} MiB), so it was not downloaded"
        )
    try:
        path = _download(repo_id, CONFIG_FILE, revision=None, token=token, timeout=timeout)
    except Exception as exc:
        raise _map_error(exc, repo_id, token, timeout) from None
    commit = meta.commit_hash or path.parent.name
    record = _read_record(repo_id, commit)
    if record is None:
        record = _safetensors_record(repo_id, commit, token=token, timeout=timeout)
        _write_record(repo_id, commit, record)
    return _resolved(repo_id, "hub", path, record)


def _safetensors_record(repo_id: str, commit: str, *, token: str | None, timeout: float) -> dict:
    """Parameter counts per dtype from the safetensors headers (never the weights); never raises."""
    from huggingface_hub import HfApi
    from huggingface_hub import errors as hf

    api = HfApi(endpoint=hub_endpoint(), token=token)
    revision = commit if re.fullmatch(r"[0-9a-f]{40}", commit or "") else None
    try:
        try:
            meta = _head(repo_id, INDEX_FILE, revision=revision, token=token, timeout=timeout)
        except (hf.RemoteEntryNotFoundError, hf.EntryNotFoundError):
            meta = None
        if meta is None:  # a single model.safetensors, or none at all
            try:
                single = api.parse_safetensors_file_metadata(repo_id, SINGLE_FILE, revision=revision, timeout=timeout)
            except (hf.RemoteEntryNotFoundError, hf.EntryNotFoundError):
                return {"available": False, "reason": "the repo has no safetensors weights"}
            return {"available": True, "files": 1, "parameter_count": single.parameter_count}
        if meta.size is not None and meta.size > MAX_INDEX_BYTES:
            return {"available": False, "reason": f"{INDEX_FILE} is {meta.size / 1e6:.0f} MB, beyond any real index"}
        index_path = _download(repo_id, INDEX_FILE, revision=revision, token=token, timeout=timeout)
        if index_path.stat().st_size > MAX_INDEX_BYTES:
            return {"available": False, "reason": f"{INDEX_FILE} is beyond any real index"}
        index = json.loads(index_path.read_text(encoding="utf-8"), parse_constant=_no_constant)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            return {"available": False, "reason": f"{INDEX_FILE} has no weight_map"}
        shards = sorted({v for v in weight_map.values() if isinstance(v, str)})
        if not shards or len(shards) > MAX_SHARDS or any(not s.endswith(".safetensors") or ".." in s for s in shards):
            return {"available": False, "reason": f"{INDEX_FILE} lists no usable shards"}

        def parse(shard: str):
            return api.parse_safetensors_file_metadata(repo_id, shard, revision=revision, timeout=timeout)

        with ThreadPoolExecutor(max_workers=min(SHARD_WORKERS, len(shards))) as pool:
            files = list(pool.map(parse, shards))
        counts: dict[str, int] = {}
        for f in files:
            for dtype, n in f.parameter_count.items():
                counts[dtype] = counts.get(dtype, 0) + int(n)
        return {"available": True, "files": len(shards), "parameter_count": counts}
    except (hf.SafetensorsParsingError, ValueError, UnicodeDecodeError) as exc:
        return {"available": False, "reason": f"a safetensors header could not be parsed: {str(exc)[:160]}"}
    except Exception as exc:  # network trouble: the config alone still gives an estimate
        return {"available": False, "transient": True,
                "reason": f"the safetensors headers could not be read: {type(exc).__name__}"}


def _no_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")
