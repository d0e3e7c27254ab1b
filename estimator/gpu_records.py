"""The GPU catalog's records: a card (:class:`CatalogGPU`) and the GPU software whose support it records
(:class:`Backend`). Below both the catalog (estimator/catalog.py, which loads them) and the GPU-name parser
(estimator/gpu_names.py, which is handed them), so that neither needs the other's types.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any, NamedTuple

# The GPU software whose support the GPU catalog records per card (gpus.json "backends"; docs/catalogs.md).
BACKENDS: tuple[str, ...] = ("bitsandbytes", "flash_attention_2", "triton")


class Backend(NamedTuple):
    """A piece of GPU software a plan may need, and where the cards it runs on are stated (gpus.json "backends")."""

    name: str
    provides: str  # what a plan uses it for
    runs_on: str  # the rule: which architectures it runs on
    source: str  # where that rule is stated (a README, a library file and version)


@dataclass(frozen=True)
class CatalogGPU:
    """A catalog GPU. Numbers are per runtime device (see ``runtime_devices`` for multi-die boards)."""

    name: str
    aliases: tuple[str, ...]
    vendor: str
    category: str
    memory_gb: float
    total_memory_bytes: int
    total_memory_source: str
    bf16: bool
    tflops_bf16_dense: float | None
    tflops_fp16_dense: float
    memory_bandwidth_gbs: float
    source: str
    runtime_devices: int = 1
    notes: str | None = None
    # the compiler target: NVIDIA 'sm_XY' (compute capability X.Y), AMD the LLVM target ('gfx942'), and its source
    arch: str = ""
    arch_source: str = ""
    # whether each of BACKENDS runs on this card (the rule and its source: load_backends()), and caveats per backend
    backends: Mapping[str, bool] = field(default_factory=lambda: MappingProxyType({}), compare=False, hash=False)
    backend_notes: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), compare=False,
                                             hash=False)
    # how many of these one machine holds (runtime devices, as num_gpus counts them), and why when not the rule
    max_per_node: int = 1
    max_per_node_source: str | None = None
    # GPU-to-GPU bandwidth per direction (NVLink) where the datasheet gives one, and its source; None: the card talks to
    # its peers over PCIe (the throughput model's PCIE_BANDWIDTH_GBS)
    interconnect_gbs: float | None = None
    interconnect_source: str | None = None

    @property
    def total_memory_gib(self) -> float:
        return self.total_memory_bytes / 2**30

    @property
    def id(self) -> str:
        return self.name

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        """NVIDIA's compute capability ((8, 9) for 'sm_89', (12, 0) for 'sm_120'); None for AMD."""
        if not self.arch.startswith("sm_"):
            return None
        digits = self.arch[3:]
        return int(digits[:-1]), int(digits[-1])

    def runs(self, backend: str) -> bool:
        """Whether ``backend`` (one of BACKENDS: 'bitsandbytes', 'flash_attention_2', 'triton') runs on this card."""
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; the catalog records {', '.join(BACKENDS)}")
        return bool(self.backends.get(backend, False))

    def backend_source(self, backend: str) -> str:
        """Why ``runs(backend)`` says what it says: the backend's rule and source, and this card's architecture."""
        info = load_backends()[backend] if backend in BACKENDS else None
        if info is None:
            raise ValueError(f"unknown backend {backend!r}; the catalog records {', '.join(BACKENDS)}")
        note = self.backend_notes.get(backend)
        return (f"{info.name} runs on {info.runs_on} ({info.source}); the {self.name} is {self.arch} "
                f"({self.arch_source})" + (f"; {note}" if note else ""))


@cache
def read_data_json(filename: str) -> dict[str, Any]:
    """One of the catalog's data files (estimator/data/), parsed once: gpus.json serves both the cards
    (catalog.load_gpus) and the backends below."""
    text = (resources.files(__package__ or "estimator") / "data" / filename).read_text(encoding="utf-8")
    return json.loads(text)


@cache
def load_backends() -> Mapping[str, Backend]:
    """The GPU software the catalog records per card (BACKENDS), with the rule and the source of each (cached)."""
    raw = read_data_json("gpus.json")["backends"]
    return MappingProxyType({name: Backend(name, raw[name]["provides"], raw[name]["runs_on"], raw[name]["source"])
                             for name in BACKENDS})
