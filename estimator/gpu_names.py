"""GPU names as people write them: nvidia-smi's, with a memory suffix, in any case, spacing or punctuation.

A name is read as three parts (``parse_gpu_name``):

* the model words: letter runs and numbers ("RTX 4090" and "rtx4090" are ``rtx 4090``), without the
  brand words nvidia-smi and rocm-smi print in front (``BRAND_WORDS``: "NVIDIA GeForce RTX 4090" is
  ``rtx 4090``, "Tesla T4" is ``t 4``, "AMD Instinct MI300X" is ``mi 300 x``);
* the memory, when the name states it: a number followed by g, gb or gib ("24GB", "80g", "40 GB");
* the form factor, when the name states it: PCIe or SXM (SXM2/SXM4/SXM5 are SXM); HBM3/HBM3e are dropped.

``lookup_gpu`` then decides among the GPUs the catalog hands it (parsed once as ``GPUNames``: the catalog calls
down into this module, never the reverse), by these rules (docs/catalogs.md, "Matching rules"):

1. an exact name or alias (case-insensitive), or one equal to it once parsed, wins;
2. otherwise the entries whose name or an alias has exactly the query's model words are the family;
   a stated memory keeps those of that size (as sold, or as the runtime reports it in GiB), a stated
   form factor keeps those of that form factor when the family has it (a form factor the catalog does
   not list separately is ignored: "V100-PCIE-32GB" is the catalog's one V100 32GB);
3. one entry left: that entry. Several: the name is ambiguous, and the answer lists them ("A100": 40
   and 80 GB, PCIe and SXM). None, with a family: the memory or form factor does not exist in the
   catalog ("RTX 4090 16GB"), and the answer says which sizes it has. No family: unknown, with the
   closest names ("did you mean") ranked by the whole name, memory included.

A deliberate alias settles a few names that would otherwise be ambiguous ("H100" is the H100 SXM,
"A100 80GB" the SXM card: PCIe has the same memory). Apple silicon and laptop GPUs are not in the
catalog; their names get a sentence that says so. Pure Python: no torch, no network.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # the catalog imports this module and hands it its GPUs; their type is only needed for annotations
    from .catalog import CatalogGPU

# Words that name the maker or the product line, not the GPU: nvidia-smi prints "NVIDIA GeForce RTX 4090",
# "Tesla T4", "NVIDIA RTX 6000 Ada Generation"; rocm-smi "AMD Instinct MI300X".
BRAND_WORDS = frozenset({"nvidia", "geforce", "tesla", "amd", "instinct", "gpu", "graphics", "generation"})
# A stated memory size: a number not glued to a letter before it, then g/gb/gib ("A10G" is not 10 GB).
_MEMORY = re.compile(r"(?<![a-z0-9.])(\d+(?:\.\d+)?)\s*-?\s*(?:gib|gb|g)(?![a-z])")
# Form factors (SXM2/SXM4/SXM5 are all SXM) and memory types (dropped: HBM3 says nothing the size does not).
_FORM = re.compile(r"(?<![a-z])(sxm\d?|pci-?e|hbm\d?e?)(?![a-z])")
_TOKEN = re.compile(r"\d+(?:\.\d+)*|[a-z]+")
# A stated size matches an entry within this many GB of its size as sold or as the runtime reports it
# (a T4 sold as 16 GB shows 15.0 GiB in nvidia-smi and Colab, so "T4 15GB" is the T4).
MEMORY_MATCH_GB = 0.5
MAX_NAME = 512
# Apple silicon: M1..M9 with an optional tier; the catalog leaves it out (not a CUDA/ROCm device).
_APPLE_TIERS = frozenset({"pro", "max", "ultra"})
_APPLE_WORDS = frozenset({"apple", "mps", "macbook", "mac", "macstudio", "imac"})
_LAPTOP_WORDS = frozenset({"laptop", "mobile", "notebook"})

Form = Literal["sxm", "pcie"]


@dataclass(frozen=True)
class ParsedName:
    """A GPU name in parts: model words, stated memory in GB (or None), stated form factor (or None)."""

    model: tuple[str, ...]
    memory_gb: float | None
    form: Form | None

    @property
    def key(self) -> tuple:
        return (self.model, self.memory_gb, self.form)

    def text(self) -> str:
        """The canonical spelling used for similarity: 'rtx 4090 24gb'."""
        mem = f" {self.memory_gb:g}gb" if self.memory_gb is not None else ""
        return " ".join(self.model) + mem + (f" {self.form}" if self.form else "")


def parse_gpu_name(name: str) -> ParsedName:
    """Model words, memory and form factor of a GPU name ('NVIDIA A100-SXM4-80GB' -> a 100, 80, sxm)."""
    text = name[:MAX_NAME].lower()
    memory = None
    found = _MEMORY.search(text)
    if found:
        memory = float(found.group(1))
        text = text[: found.start()] + " " + text[found.end():]
    form: Form | None = None
    for m in _FORM.finditer(text):
        word = m.group(1)
        if word.startswith("sxm"):
            form = "sxm"
        elif word.startswith("pci"):
            form = "pcie"
    text = _FORM.sub(" ", text)
    model = tuple(t for t in _TOKEN.findall(text) if t not in BRAND_WORDS)
    return ParsedName(model, memory, form)


LookupStatus = Literal["found", "ambiguous", "no_such_size", "unknown", "apple", "laptop", "empty"]


@dataclass(frozen=True)
class GPULookup:
    """The outcome of a lookup: the entry, or why there is none (with the names to offer)."""

    query: str
    entry: CatalogGPU | None
    status: LookupStatus
    candidates: tuple[str, ...] = ()
    memory_gb: float | None = None  # the size the name stated (no_such_size)

    def message(self) -> str:
        """One sentence for the user, starting with the quoted name ('' when found)."""
        return _message(self)


class GPUNames:
    """Every catalog GPU's names, parsed once (the catalog builds it from its GPUs and keeps it)."""

    def __init__(self, gpus: tuple[CatalogGPU, ...]):
        self.gpus = gpus
        self.exact: dict[str, set[int]] = {}
        self.keys: dict[tuple, set[int]] = {}
        self.parsed: list[list[ParsedName]] = []
        for g in gpus:
            self.parsed.append([parse_gpu_name(n) for n in (g.name, *g.aliases)])
        # an alias ending in a bare size ('a100 80') is read as a query is: that size, of the family before it
        self.parsed = [[_bare_size(p, self.family) or p for p in names] for names in self.parsed]
        for i, g in enumerate(gpus):
            for n, p in zip((g.name, *g.aliases), self.parsed[i], strict=True):
                self.exact.setdefault(n.strip().lower(), set()).add(i)
                if p.model:
                    self.keys.setdefault(p.key, set()).add(i)

    def family(self, model: tuple[str, ...]) -> list[int]:
        return [i for i, names in enumerate(self.parsed) if any(p.model == model for p in names)]

    def size_matches(self, i: int, memory: float) -> bool:
        g = self.gpus[i]
        sizes = (g.memory_gb, g.memory_gb / g.runtime_devices, g.total_memory_bytes / 2**30)
        return any(abs(memory - s) <= MEMORY_MATCH_GB for s in sizes)

    def has_form(self, i: int, form: str) -> bool:
        return any(p.form == form for p in self.parsed[i])


def _bare_size(p: ParsedName, family) -> ParsedName | None:
    """'rtx 4090 24' as 'rtx 4090' with 24 GB, when the words before the number name a family; else None."""
    if p.memory_gb is not None or len(p.model) < 2 or not p.model[-1].isdigit() or not family(p.model[:-1]):
        return None
    return ParsedName(p.model[:-1], float(p.model[-1]), p.form)


def _is_apple(model: tuple[str, ...]) -> bool:
    if set(model) & _APPLE_WORDS:
        return True
    return (len(model) >= 2 and model[0] == "m" and model[1].isdigit() and len(model[1]) == 1
            and set(model[2:]) <= _APPLE_TIERS)


def lookup_gpu(name: str, idx: GPUNames) -> GPULookup:
    """The GPU of ``idx`` a name means, or why it means none (see the module docstring for the rules)."""
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME:
        return GPULookup(str(name)[:80] if isinstance(name, str) else repr(name)[:80], None, "empty")
    hit = idx.exact.get(name.strip().lower())
    if hit and len(hit) == 1:
        return GPULookup(name, idx.gpus[next(iter(hit))], "found")
    q = parse_gpu_name(name)
    if not q.model:
        return GPULookup(name, None, "empty")
    hit = idx.keys.get(q.key)
    if hit and len(hit) == 1:
        return GPULookup(name, idx.gpus[next(iter(hit))], "found")
    bare = _bare_size(q, idx.family)  # 'rtx 4090 24': a size without its GB
    if bare is not None:
        q = bare
        hit = idx.keys.get(q.key)
        if hit and len(hit) == 1:
            return GPULookup(name, idx.gpus[next(iter(hit))], "found")
    family = idx.family(q.model)
    if not family:
        status: LookupStatus = (
            "apple" if _is_apple(q.model) else "laptop" if set(q.model) & _LAPTOP_WORDS else "unknown")
        return GPULookup(name, None, status, tuple(suggest_gpu_names(name, idx, 5)))
    fits = [i for i in family if q.memory_gb is None or idx.size_matches(i, q.memory_gb)]
    if q.form and any(idx.has_form(i, q.form) for i in fits):
        fits = [i for i in fits if idx.has_form(i, q.form)]
    if len(fits) == 1:
        return GPULookup(name, idx.gpus[fits[0]], "found")
    if fits:
        return GPULookup(name, None, "ambiguous", tuple(idx.gpus[i].name for i in fits))
    return GPULookup(name, None, "no_such_size", tuple(idx.gpus[i].name for i in family), q.memory_gb)


def _token_similarity(a: str, b: str) -> float:
    if a == b:
        return 1.0
    if len(a) == len(b) and sorted(a) == sorted(b):
        return 0.9  # transposed characters: "4900" for "4090"
    if a.isdigit() != b.isdigit():
        return 0.0
    r = difflib.SequenceMatcher(None, a, b).ratio()
    return r if r >= 0.75 else 0.0


def _similarity(q: ParsedName, p: ParsedName, memory_gb: float) -> float:
    """How alike two names are, as a whole: the model words (spelling and tokens), then the memory."""
    a, b = " ".join(q.model), " ".join(p.model)
    ratio = difflib.SequenceMatcher(None, a, b).ratio()
    matched = sum(max((_token_similarity(t, c) for c in p.model), default=0.0) for t in q.model)
    score = 0.5 * ratio + 0.5 * matched / max(len(q.model), len(p.model), 1)
    if q.memory_gb is not None:  # a stated size counts as one more word of the name
        same = abs(q.memory_gb - memory_gb) <= MEMORY_MATCH_GB
        score = (score * len(q.model) + (1.0 if same else 0.0)) / (len(q.model) + 1)
    return score


SUGGEST_THRESHOLD = 0.45  # below this similarity a catalog name is not offered as "did you mean"


def suggest_gpu_names(name: str, idx: GPUNames, limit: int = 5) -> list[str]:
    """The names of ``idx``'s GPUs closest to ``name`` as a whole (model words and memory), best first."""
    if not isinstance(name, str) or limit <= 0:
        return []
    q = parse_gpu_name(name)
    if not q.model:
        return []
    family = set(idx.family(q.model))
    scores: dict[int, float] = {}
    for i, names in enumerate(idx.parsed):
        g = idx.gpus[i]
        best = max(_similarity(q, p, g.memory_gb) for p in names if p.model)
        if i in family or any(_prefix_of(q.model, p.model) for p in names):
            best = 1.0 + best  # a candidate of an ambiguous or partial name ranks first
        elif any(_prefix_of(p.model, q.model) for p in names):
            best = 0.5 + best  # the name plus a word the catalog lacks ('H200 NVL', 'RTX 3090 Ti'): its base card
        scores[i] = best
    ranked = sorted(((s, i) for i, s in scores.items() if s >= SUGGEST_THRESHOLD), key=lambda si: (-si[0], si[1]))
    return [idx.gpus[i].name for _, i in ranked[:limit]]


def _prefix_of(query: tuple[str, ...], model: tuple[str, ...]) -> bool:
    """Whether the query's words start the name's ('rtx 6000' of 'rtx 6000 ada'; 'mi 300' of 'mi 300 x')."""
    return len(query) < len(model) and model[: len(query)] == query


def _message(r: GPULookup) -> str:
    name = f"gpu: '{r.query}'"
    listed = ", ".join(f"'{c}'" for c in r.candidates)
    escape = "or give the memory size with gpu_vram_gb"
    if r.status == "found":
        return ""
    if r.status == "ambiguous":
        return (f"{name} is ambiguous: it could be {listed}; name one (with its memory, e.g. '{r.candidates[0]}'), "
                f"{escape}.")
    if r.status == "no_such_size":
        return (f"{name}: the catalog has no {r.memory_gb:g} GB version of it (it has {listed}); "
                f"for your card give gpu_vram_gb={r.memory_gb:g}.")
    if r.status == "apple":
        return (f"{name} is Apple silicon, which the GPU catalog leaves out: the estimate is for CUDA/ROCm "
                "training stacks (bitsandbytes, DeepSpeed, flash attention). To size a plan against its unified "
                "memory anyway, give gpu_vram_gb (the share of unified memory the GPU may use).")
    if r.status == "laptop":
        hint = f" ({r.candidates[0]})" if r.candidates else ""
        return (f"{name} is a laptop GPU, which the catalog leaves out: it is a different chip with less memory than "
                f"the desktop card of the same name{hint}; give its memory with gpu_vram_gb.")
    if r.status == "empty":
        return f"{name} names no GPU; give a catalog name ('RTX 4090', 'A100 80GB', 'H100') or gpu_vram_gb."
    if not listed:
        return f"{name} is not in the GPU catalog; give the memory size with gpu_vram_gb."
    return f"{name} is not in the GPU catalog; did you mean {listed}? Or give the memory size with gpu_vram_gb."
