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
catalog; their names get a sentence that says so.

A name may state how many cards ("2x RTX 4090", "8xH100", "Kaggle T4 x2"; x, * or the multiplication sign):
``split_gpu_count`` reads the count and the card apart, and ``lookup_gpu`` resolves the card (the count is in
``GPULookup.count``). Hosted notebooks are named by their service ("Colab T4", "Google Colab A100", "colab free",
"Kaggle P100"): the catalog's aliases say which cards each offers (``PLATFORM_WORDS``), a bare "colab" or "kaggle"
is ambiguous among them, and "Colab Pro A100" is read as the Colab card named "A100". Pure Python: no torch, no network.
"""

from __future__ import annotations

import contextlib
import functools
import re
from dataclasses import dataclass
from typing import Literal, NamedTuple

from .errors import UnknownGPUError
from .gpu_records import CatalogGPU

# Words that name the maker or the product line, not the GPU: nvidia-smi prints "NVIDIA GeForce RTX 4090",
# "Tesla T4", "NVIDIA RTX 6000 Ada Generation"; rocm-smi "AMD Instinct MI300X".
# "Google" names the maker of Colab, never a GPU in the catalog ("Google Colab T4" is "colab t4").
BRAND_WORDS = frozenset({"nvidia", "geforce", "tesla", "amd", "instinct", "gpu", "gpus", "graphics", "generation",
                         "google"})
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
# Hosted notebook services: a gpu value may name the card by the service ("Colab T4", "Kaggle P100"). Which cards
# each offers is data: the catalog aliases that start with the service's word ("colab t4", "kaggle p100").
PLATFORM_WORDS = frozenset({"colab", "kaggle"})
# Words around a service's name that say nothing about the card ("Colab Pro+ A100", "T4 on Kaggle").
_PLATFORM_FILLER = frozenset({"pro", "plus", "free", "tier", "paid", "notebook", "notebooks", "runtime",
                              "accelerator", "on", "in", "at", "from", "via", "with"})

# How many cards a gpu value states: plan.num_gpus allows 1..MAX_GPU_COUNT (estimator/plan.py's MAX_NUM_GPUS).
MAX_GPU_COUNT = 1024
_TIMES = "[x*\u00d7]"  # x, * or the multiplication sign
_NUMBER = r"(\d+(?:[.,]\d+)?)"
# "2x RTX 4090", "2 x RTX 4090", "8xH100", "8*A100 80GB": a count in front, glued or spaced.
_COUNT_LEAD = re.compile(rf"^{_NUMBER}\s*{_TIMES}\s*(?=\S)", re.IGNORECASE)
# "Kaggle 2xT4", "Google Colab 2 x T4": a count after leading words, before a word that starts with a letter.
_COUNT_INNER = re.compile(rf"(?<=\s){_NUMBER}\s*{_TIMES}\s*(?=[a-z])", re.IGNORECASE)
# "RTX 4090 x2", "Kaggle T4 x 2", "H100*8", "T4 (x2)", "T4x2": a count at the end (x glued only after a digit).
_COUNT_TRAIL = re.compile(rf"(?:\s+\(?\s*{_TIMES}|\(\s*{_TIMES}|\s*[*\u00d7]|(?<=\d)x)\s*{_NUMBER}\s*\)?\s*$",
                          re.IGNORECASE)
# "Dual RTX 3090", "quad A6000": a count word in front.
_COUNT_WORDS = {"single": 1, "dual": 2, "twin": 2, "quad": 4}
_COUNT_WORD = re.compile(r"^(single|dual|twin|quad)\b[\s-]*(?=\S)", re.IGNORECASE)

Form = Literal["sxm", "pcie"]


def split_gpu_count(text: str) -> tuple[int | None, str]:
    """The number of cards a gpu value states, and the card it names: '2x RTX 4090' -> (2, 'RTX 4090'),
    'Kaggle T4 x2' -> (2, 'Kaggle T4'), 'H100' -> (None, 'H100').

    A count is written in front ('8xH100', '2 x RTX 4090', '8*A100 80GB', 'dual RTX 3090'), after a service's name
    ('Kaggle 2xT4') or at the end ('RTX 4090 x2', 'T4 (x2)'). It must be a whole number from 1 to
    ``MAX_GPU_COUNT``: '0x H100', '1.5x H100' or '2x H100 x4' raise ``UnknownGPUError`` (a ValueError, field
    'gpu'). The card name is returned as written, without the count; it is not looked up here."""
    if not isinstance(text, str):
        raise TypeError(f"a GPU name is a string, not {type(text).__name__}")
    return _split_gpu_count(text)


@functools.lru_cache(maxsize=1024)  # every plan validation reads its gpu; a search validates a hundred plans a call
def _split_gpu_count(text: str) -> tuple[int | None, str]:
    card = text.strip()[:MAX_NAME]
    found: list[str] = []
    word = _COUNT_WORD.match(card)
    if word:
        found.append(str(_COUNT_WORDS[word.group(1).lower()]))
        card = card[word.end():]
    for pattern in (_COUNT_LEAD, _COUNT_INNER, _COUNT_TRAIL):
        hit = pattern.search(card)
        if hit and (rest := (card[: hit.start()] + " " + card[hit.end():]).strip()):
            found.append(hit.group(1))
            card = " ".join(rest.split()) if pattern is _COUNT_INNER else rest
    if not found:
        return None, text.strip()
    if len(found) > 1:
        raise UnknownGPUError.about("gpu", f"'{text.strip()[:80]}' states the number of GPUs twice "
                                           f"({', '.join(found)}); write it once, as in '2x RTX 4090'")
    return _count(found[0], text), card


def _count(written: str, text: str) -> int:
    value = float(written.replace(",", "."))
    if value != int(value) or not 1 <= value <= MAX_GPU_COUNT:
        raise UnknownGPUError.about("gpu", f"'{text.strip()[:80]}' asks for {written} GPUs; the count must be a "
                                           f"whole number from 1 to {MAX_GPU_COUNT}, as in '2x RTX 4090'")
    return int(value)


class ParsedName(NamedTuple):
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


LookupStatus = Literal["found", "ambiguous", "no_such_size", "unknown", "apple", "laptop", "empty", "bad_count"]


@dataclass(frozen=True)
class GPULookup:
    """The outcome of a lookup: the entry, or why there is none (with the names to offer)."""

    query: str
    entry: CatalogGPU | None
    status: LookupStatus
    candidates: tuple[str, ...] = ()
    memory_gb: float | None = None  # the size the name stated (no_such_size)
    count: int | None = None  # the number of cards the name stated ('2x RTX 4090'), None when it states none
    detail: str = ""  # bad_count: what is wrong with the count

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

    def offered(self, service: str) -> list[int]:
        """The entries a hosted service offers: those with an alias naming the service ('colab t4')."""
        return [i for i, names in enumerate(self.parsed) if any(service in p.model for p in names)]

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
    """The GPU of ``idx`` a name means, or why it means none (see the module docstring for the rules). A count in
    the name ('2x RTX 4090') is read apart (``split_gpu_count``) and kept in the answer's ``count``."""
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME:
        return GPULookup(str(name)[:80] if isinstance(name, str) else repr(name)[:80], None, "empty")
    try:
        count, card = split_gpu_count(name)
    except UnknownGPUError as err:
        return GPULookup(name, None, "bad_count", detail=err.reason or str(err))
    hit = idx.exact.get(card.lower())
    if hit and len(hit) == 1:
        return GPULookup(name, idx.gpus[next(iter(hit))], "found", count=count)
    q = parse_gpu_name(card)
    if not q.model:
        return GPULookup(name, None, "empty", count=count)
    found = _resolve(name, q, idx)
    return found if count is None else GPULookup(found.query, found.entry, found.status, found.candidates,
                                                 found.memory_gb, count)


def _resolve(name: str, q: ParsedName, idx: GPUNames) -> GPULookup:
    """Rules 1-3 of the module docstring for a parsed name (``name`` is what the answer quotes)."""
    hit = idx.keys.get(q.key)
    if hit and len(hit) == 1:
        return GPULookup(name, idx.gpus[next(iter(hit))], "found")
    bare = _bare_size(q, idx.family)  # 'rtx 4090 24': a size without its GB
    if bare is not None:
        q = bare
        hit = idx.keys.get(q.key)
        if hit and len(hit) == 1:
            return GPULookup(name, idx.gpus[next(iter(hit))], "found")
    if set(q.model) & PLATFORM_WORDS:
        return _on_platform(name, q, idx)
    family = idx.family(q.model)
    if not family and len(q.model) >= 2 and q.model[-1] == "s" and q.model[-2].isdigit():
        return _resolve(name, ParsedName(q.model[:-1], q.memory_gb, q.form), idx)  # a plural: '2x RTX 4090s'
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


def _on_platform(name: str, q: ParsedName, idx: GPUNames) -> GPULookup:
    """A name with a hosted service's word that is not one of its aliases: 'Colab Pro A100', 'T4 on Kaggle', 'colab'.

    Without a card's words it is ambiguous among the service's cards; with them, the one card of the service those
    words name, or else whatever they name in the whole catalog ('Colab A100 80GB' is the A100 80GB)."""
    service = next(w for w in q.model if w in PLATFORM_WORDS)
    offered = idx.offered(service)
    rest = tuple(w for w in q.model if w not in PLATFORM_WORDS and w not in _PLATFORM_FILLER)
    if not rest:
        if len(offered) == 1:
            return GPULookup(name, idx.gpus[offered[0]], "found")
        return GPULookup(name, None, "ambiguous", tuple(idx.gpus[i].name for i in offered))
    own = [i for i in offered if any(p.model in (rest, (service, *rest)) for p in idx.parsed[i])
           and (q.memory_gb is None or idx.size_matches(i, q.memory_gb))]
    if len(own) == 1:
        return GPULookup(name, idx.gpus[own[0]], "found")
    return _resolve(name, ParsedName(rest, q.memory_gb, q.form), idx)


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


def _similarity(q: ParsedName, p: ParsedName, memory_gb: float) -> float:
    """How alike two names are, as a whole: the model words (spelling and tokens), then the memory."""
    from difflib import SequenceMatcher  # near misses only: kept out of every start
    a, b = " ".join(q.model), " ".join(p.model)
    ratio = SequenceMatcher(None, a, b).ratio()
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
    with contextlib.suppress(UnknownGPUError):
        name = split_gpu_count(name)[1]  # '2x RTX 4900': the card's name
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
    if r.status == "bad_count":
        return f"gpu: {r.detail}"
    if r.status == "empty":
        return f"{name} names no GPU; give a catalog name ('RTX 4090', 'A100 80GB', 'H100') or gpu_vram_gb."
    if not listed:
        return f"{name} is not in the GPU catalog; give the memory size with gpu_vram_gb."
    return f"{name} is not in the GPU catalog; did you mean {listed}? Or give the memory size with gpu_vram_gb."
