"""The built-in catalogs: popular Hugging Face causal LMs and GPUs, with forgiving lookups.

The data lives in ``estimator/data/models.json`` and ``estimator/data/gpus.json`` (``docs/catalogs.md``
says where every number comes from). This module reads them with :mod:`importlib.resources` and plain
:mod:`json`, once, and never imports torch or transformers or touches the network.

Lookups accept exact Hub ids and names as well as forgiving spellings: case, punctuation and spacing do
not matter, and the letters and digits of a name are matched as separate tokens ("rtx4090" is
"RTX 4090", "qwen2.5 1.5b instruct" is "Qwen/Qwen2.5-1.5B-Instruct"). A forgiving name that fits more
than one entry resolves only when one candidate is clearly best (it needs strictly fewer extra tokens
than every other); otherwise the lookup returns ``None`` and ``suggest_*`` offers the candidates.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from . import gpu_names
from .gpu_names import GPULookup, split_gpu_count
from .gpu_records import BACKENDS, Backend, CatalogGPU, load_backends, read_data_json

__all__ = [
    "BACKENDS",
    "Backend",
    "CatalogGPU",
    "CatalogModel",
    "GPULookup",
    "find_gpu",
    "find_model",
    "load_backends",
    "load_gpus",
    "load_models",
    "lookup_gpu",
    "normalize_name",
    "search_gpus",
    "search_models",
    "split_gpu_count",
    "suggest_gpus",
    "suggest_models",
]




def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class CatalogModel:
    """A catalog model: its Hub id, forgiving names, published size and the architecture of its config.json."""

    id: str
    aliases: tuple[str, ...]
    params_published: int
    params_source: str
    gated: bool
    config: Mapping[str, Any] = field(compare=False, hash=False, repr=False)
    config_source: str = ""
    params_tolerance: float = 0.01
    notes: str | None = None

    @property
    def name(self) -> str:
        """The id without its organisation ("Qwen2.5-1.5B-Instruct")."""
        return self.id.rpartition("/")[2]

    @property
    def organization(self) -> str:
        return self.id.partition("/")[0] if "/" in self.id else ""

    @property
    def model_type(self) -> str:
        return str(self.config["model_type"])

    @property
    def family(self) -> str:
        """The transformers model_type ("llama", "qwen2", "gemma2", ...)."""
        return self.model_type

    @property
    def is_moe(self) -> bool:
        return any(k in self.config for k in ("num_local_experts", "num_experts"))

    def config_dict(self) -> dict[str, Any]:
        """A fresh, mutable copy of the config fields, shaped like the model's config.json."""
        return _thaw(self.config)






# --------------------------------------------------------------------------------------------- loading


@cache
def load_models() -> tuple[CatalogModel, ...]:
    """Every catalog model, in catalog order (cached)."""
    out = []
    for raw in read_data_json("models.json")["models"]:
        out.append(
            CatalogModel(
                id=raw["id"],
                aliases=tuple(raw.get("aliases", ())),
                params_published=int(raw["params_published"]),
                params_source=raw["params_source"],
                gated=bool(raw["gated"]),
                config=_freeze(raw["config"]),
                config_source=raw.get("config_source", ""),
                params_tolerance=float(raw.get("params_tolerance", 0.01)),
                notes=raw.get("notes"),
            )
        )
    return tuple(out)


@cache
def load_gpus() -> tuple[CatalogGPU, ...]:
    """Every catalog GPU, in catalog order (cached)."""
    out = []
    for raw in read_data_json("gpus.json")["gpus"]:
        bf = raw.get("tflops_bf16_dense")
        out.append(
            CatalogGPU(
                name=raw["name"],
                aliases=tuple(raw.get("aliases", ())),
                vendor=raw["vendor"],
                category=raw["category"],
                memory_gb=float(raw["memory_gb"]),
                total_memory_bytes=int(raw["total_memory_bytes"]),
                total_memory_source=raw["total_memory_source"],
                bf16=bool(raw["bf16"]),
                tflops_bf16_dense=None if bf is None else float(bf),
                tflops_fp16_dense=float(raw["tflops_fp16_dense"]),
                memory_bandwidth_gbs=float(raw["memory_bandwidth_gbs"]),
                source=raw["source"],
                runtime_devices=int(raw.get("runtime_devices", 1)),
                notes=raw.get("notes"),
                arch=raw["arch"],
                arch_source=raw["arch_source"],
                backends=MappingProxyType({b: bool(raw["backends"][b]) for b in BACKENDS}),
                backend_notes=MappingProxyType(dict(raw.get("backend_notes", {}))),
                max_per_node=int(raw["max_per_node"]),
                max_per_node_source=raw.get("max_per_node_source"),
                interconnect_gbs=None if raw.get("interconnect_gbs") is None else float(raw["interconnect_gbs"]),
                interconnect_source=raw.get("interconnect_source"),
            )
        )
    return tuple(out)




# --------------------------------------------------------------------------------------------- names

_TOKEN = re.compile(r"\d+(?:\.\d+)*|[a-z]+")
_MAX_QUERY = 512


def _tokens(text: str) -> tuple[str, ...]:
    """Lower-case letter runs and numbers (decimals kept whole): 'Qwen2.5-1.5B' -> ('qwen', '2.5', '1.5', 'b')."""
    return tuple(_TOKEN.findall(text[:_MAX_QUERY].lower()))


def normalize_name(text: str) -> str:
    """The canonical form used for matching: tokens joined by single spaces ('rtx4090' -> 'rtx 4090')."""
    return " ".join(_tokens(text))


def _is_subsequence(needle: tuple[str, ...], hay: tuple[str, ...]) -> bool:
    it = iter(hay)
    return all(any(tok == h for h in it) for tok in needle)


T = TypeVar("T")


class _Index(Generic[T]):
    """Precomputed lookup keys for one catalog."""

    def __init__(self, entries: Iterable[T], names_of) -> None:
        self.entries: tuple[T, ...] = tuple(entries)
        self.exact: dict[str, set[int]] = {}  # lower-cased literal id/name/alias -> entries
        self.norm: dict[str, set[int]] = {}  # normalized key -> entries
        self.token_keys: list[list[tuple[str, ...]]] = []  # per entry: token tuples of each name
        self.search_text: list[str] = []
        self.display: dict[str, int] = {}  # normalized key -> entry, for suggestions
        for i, entry in enumerate(self.entries):
            names = names_of(entry)
            keys = []
            for n in names:
                self.exact.setdefault(n.strip().lower(), set()).add(i)
                toks = _tokens(n)
                if not toks:
                    continue
                key = " ".join(toks)
                self.norm.setdefault(key, set()).add(i)
                keys.append(toks)
                self.display.setdefault(key, i)
            self.token_keys.append(keys)
            self.search_text.append(" " + " ".join(" ".join(k) for k in keys) + " ")

    def find(self, query: str, forgiving: bool = True) -> T | None:
        if not isinstance(query, str) or len(query) > _MAX_QUERY:
            return None
        q = query.strip().lower()
        if not q:
            return None
        hit = self.exact.get(q)
        if hit and len(hit) == 1:
            return self.entries[next(iter(hit))]
        toks = _tokens(q)
        if not toks:
            return None
        hit = self.norm.get(" ".join(toks))
        if hit:
            return self.entries[next(iter(hit))] if len(hit) == 1 else None
        if not forgiving:
            return None
        # forgiving: every query token, in order, inside a name; fewest extra tokens wins, ties are ambiguous
        best: dict[int, int] = {}
        for i, keys in enumerate(self.token_keys):
            for k in keys:
                if _is_subsequence(toks, k):
                    extra = len(k) - len(toks)
                    if i not in best or extra < best[i]:
                        best[i] = extra
        if not best:
            return None
        ranked = sorted(best.items(), key=lambda kv: kv[1])
        if len(ranked) > 1 and ranked[1][1] == ranked[0][1]:
            return None
        return self.entries[ranked[0][0]]

    def suggest(self, query: str, limit: int, label) -> list[str]:
        if not isinstance(query, str) or limit <= 0:
            return []
        key = normalize_name(query)
        if not key:
            return []
        qtoks = key.split()
        from difflib import SequenceMatcher  # near misses only: kept out of every start

        scores: dict[int, float] = {}
        for cand, i in self.display.items():
            ratio = SequenceMatcher(None, key, cand).ratio()
            ctoks = cand.split()
            matched = sum(max(_token_similarity(t, c) for c in ctoks) for t in qtoks)
            score = 0.5 * ratio + 0.5 * matched / max(len(qtoks), len(ctoks))
            if _is_subsequence(tuple(qtoks), tuple(ctoks)):  # a candidate of an ambiguous name ranks first
                score = 1.0 + 1.0 / (1 + len(ctoks) - len(qtoks))
            if score > scores.get(i, 0.0):
                scores[i] = score
        ranked = sorted(((s, i) for i, s in scores.items() if s >= 0.45), key=lambda si: (-si[0], si[1]))
        return [label(self.entries[i]) for _, i in ranked[:limit]]

    def search(self, query: str) -> list[T]:
        words = [_tokens(w) for w in (query or "")[:_MAX_QUERY].split()]
        words = [w for w in words if w]
        if not words:
            return list(self.entries)
        return [e for e, keys in zip(self.entries, self.token_keys, strict=True)
                if all(any(_contains_run(w, k) for k in keys) for w in words)]


def _contains_run(run: tuple[str, ...], hay: tuple[str, ...]) -> bool:
    """Whether ``run`` occurs as consecutive tokens of ``hay``; its final token may be a prefix."""
    n = len(run)
    for start in range(len(hay) - n + 1):
        window = hay[start : start + n]
        if window[:-1] != run[:-1]:
            continue
        last, got = run[-1], window[-1]
        if got.startswith(last):
            return True
    return False


def _token_similarity(a: str, b: str) -> float:
    if a == b:
        return 1.0
    if len(a) == len(b) and sorted(a) == sorted(b):
        return 0.9  # transposed characters: "4900" for "4090"
    if a.isdigit() != b.isdigit():
        return 0.0
    from difflib import SequenceMatcher  # near misses only: kept out of every start
    r = SequenceMatcher(None, a, b).ratio()
    return r if r >= 0.75 else 0.0


def _model_names(m: CatalogModel) -> list[str]:
    return [m.id, m.name, *m.aliases]


def _gpu_names(g: CatalogGPU) -> list[str]:
    return [g.name, *g.aliases]


@cache
def _model_index() -> _Index[CatalogModel]:
    return _Index(load_models(), _model_names)


@cache
def _gpu_index() -> _Index[CatalogGPU]:
    return _Index(load_gpus(), _gpu_names)


@cache
def _gpu_name_index() -> gpu_names.GPUNames:
    return gpu_names.GPUNames(load_gpus())


# --------------------------------------------------------------------------------------------- public API


def find_model(name: str, *, forgiving: bool = True) -> CatalogModel | None:
    """The catalog model for an exact Hub id or a forgiving name, or None (unknown or ambiguous).

    ``forgiving=False`` (what resolving a plan's model uses) takes only an exact id, name or alias, or one
    equal to it up to case, punctuation and spacing; a partial name ('x', 'qwen 7b') is then None, and
    ``suggest_models`` offers the candidates."""
    return _model_index().find(name, forgiving)


def find_gpu(name: str) -> CatalogGPU | None:
    """The catalog GPU for a name as people write it ("NVIDIA GeForce RTX 4090", "a100 80g", "h100"), or None
    (unknown or ambiguous: ``lookup_gpu`` says which, and lists the candidates)."""
    return lookup_gpu(name).entry


def lookup_gpu(name: str) -> GPULookup:
    """The catalog GPU a name means, or why it means none (the rules: estimator/gpu_names.py)."""
    return gpu_names.lookup_gpu(name, _gpu_name_index())


def suggest_models(name: str, limit: int = 5) -> list[str]:
    """Hub ids of the catalog models closest to ``name``, best first, for "did you mean" messages."""
    return _model_index().suggest(name, limit, lambda m: m.id)


def suggest_gpus(name: str, limit: int = 5) -> list[str]:
    """Names of the catalog GPUs closest to ``name`` as a whole (memory included), best first, for "did you mean"."""
    return gpu_names.suggest_gpu_names(name, _gpu_name_index(), limit)


def search_models(query: str = "") -> list[CatalogModel]:
    """Catalog models whose id, name or alias holds every query word (as a word prefix); all for ''."""
    idx = _model_index()
    hits = idx.search(query)
    key = normalize_name(query or "")
    if key:  # a family name ("qwen3_moe", "gemma2") also lists by model_type
        hits.extend(m for m in idx.entries if normalize_name(m.model_type) == key and m not in hits)
    return hits


def search_gpus(query: str = "") -> list[CatalogGPU]:
    """Catalog GPUs whose name or alias holds every query word, or whose vendor/category is the query."""
    idx = _gpu_index()
    q = (query or "").strip().lower()
    if q and any(q == g.vendor or q == g.category for g in idx.entries):
        return [g for g in idx.entries if q in (g.vendor, g.category)]
    hits = idx.search(query)
    if not hits and q:  # a whole name as nvidia-smi prints it ("NVIDIA GeForce RTX 4090"): what it resolves to
        found = lookup_gpu(query)
        hits = [found.entry] if found.entry else [g for g in idx.entries if g.name in found.candidates
                                                   and found.status in ("ambiguous", "no_such_size")]
    return hits
