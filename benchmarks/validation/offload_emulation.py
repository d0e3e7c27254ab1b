"""Activation offloading as a CUDA GPU runs it, under fake tensors on a CPU build of torch: the libraries' own code.

TRL 1.16's ``SFTConfig(activation_offloading=True)`` (trl/models/activation_offloading.py, entered by
``SFTTrainer.training_step`` around forward and backward) and torchtune 0.6.1's ``enable_activation_offloading``
(torchtune/training/_activation_offloading.py, entered by the recipes' ``_loss_step`` around the forward only) both
run an ``OffloadActivations`` ``saved_tensors_hooks``: each tensor autograd saves (at least 1024 bytes, not a
parameter or buffer; TRL: not a storage already offloaded) is copied to a pinned host tensor on a side stream,
kept on the GPU in a "forward stash" until 5 more tensors have been saved (``max_fwd_stash_size``), then dropped; in
backward it is copied back (``.to(device, non_blocking=True)``: a new GPU allocation) and dropped after the next
autograd node that brings one back has run; what is still in the stash at the end of forward is handed back as is.
Both heads (TRL's ``lm_head``, torchtune's ``output``) run under a ``NoOpManager`` that keeps their saved tensors
on the GPU -- only if the head module's forward is called (TRL's fused LM head reads ``lm_head.weight`` without
calling the module, so its saved tensors go through the offloader).

:func:`emulated_offloading` runs that code unchanged, emulating the CUDA path a CPU build cannot take. The harness's
tensors are fake tensors on the ``cpu`` device standing for the GPU's (``fake_mode.gpu_routing``); the emulated CUDA
path, each item counted or stated in the report (``activation_offloading``):

- the device: the offloaders ask ``torch.accelerator.current_accelerator().type`` and
  ``torch.get_device_module(type)`` (TRL) or ``torch.cuda`` (torchtune). Their module's ``torch`` is replaced, for
  the run, by a view of torch whose accelerator is ``cpu`` (so fake ``cpu`` tensors are the accelerator's tensors:
  TRL's ``activation.device.type != accelerator_type`` skip is not taken) and whose device module (``torch.cuda``
  too) is a stand-in: ``Stream()``, ``stream(s)`` (a null context), ``current_stream()``, ``default_stream()``,
  events (``record_event``, ``wait_event``, ``wait_stream``, ``synchronize``) and ``empty_cache()`` do nothing;
  ``Tensor.record_stream`` with a stand-in stream does nothing (counted). Why no-op streams and events give the GPU's
  timeline for ``torch.cuda.max_memory_allocated``: the caching allocator adds a block to ``allocated_bytes`` when
  it is handed out and subtracts it in ``free()``, when the last reference to the tensor dies (a Python ``del`` or
  the end of a scope), whatever is still queued on the streams; events only make the host or a stream wait, and
  ``record_stream`` only delays the block's reuse (it stays in ``active_bytes``, torchtune's
  ``peak_memory_active``), not its accounting as allocated. The offloaders' Python objects (stashes, trackers, the
  autograd hooks) run exactly as on CUDA, so every allocation and free happens at the same point of the step.
- the host copies: ``torch.empty_like(activation, pin_memory=..., device="cpu")`` and TRL's broadcast branch
  ``torch.empty(n, device="cpu", pin_memory=...)`` are pinned host memory on a GPU, which no GPU counter sees: here
  they are :class:`HostCopy` objects holding a ``meta`` tensor of the shape and strides ``empty_like`` gives (the
  counter ignores ``meta``; with real CPU tensors, in the tests, a copy of the values taken outside every dispatch
  mode, so it is not counted either). Their ``copy_`` records the offload; their ``.to(device, non_blocking=True)``
  (TRL: ``.to(accelerator_type)``; torchtune: ``.to("cuda")``) allocates a NEW tensor of the host copy's shape and
  strides on the fake ``cpu`` device, as the host-to-device copy allocates on the GPU (a plain ``.to("cpu")`` of a
  ``cpu`` tensor would hand back the same tensor without allocating). Host bytes are reported
  (``host_peak_bytes``: the pinned memory a real run needs).
- storage pointers: TRL deduplicates on ``untyped_storage().data_ptr() + storage_offset()`` and skips storages of
  parameters (``update_model_params`` collects ``p.untyped_storage().data_ptr()``); a fake tensor's storage has
  ``data_ptr() == 0`` (every tensor's key would collide, and no parameter view would be recognised: a linear's
  saved ``weight.t()`` would be offloaded and brought back). On CUDA every live storage has its own address, so
  here the key is the storage's identity (``untyped_storage()._cdata``) with the offset and dtype
  (``_get_unique_tensor_key`` replaced), and while the offloader's hooks and ``update_model_params`` run a
  storage's ``data_ptr()`` answers its ``_cdata`` (the same in the real-tensor runs of the tests, so fake and real
  take the same decisions). ``torch._C._storage_Use_Count`` works on fake storages as on real ones (checked).
- nothing else differs: ``is_torch_npu_available()`` is False on both; ``torch._C._current_graph_task_id``,
  ``_current_autograd_node``, ``Node.register_hook`` and the engine's ``queue_callback`` are CPU-build features and
  run as they are; ``psutil.virtual_memory()`` (a host-RAM warning) runs as it is; TRL's ``empty_cache()`` before
  each step (when bitsandbytes is imported) does not change allocated bytes.

Counts (``report()``): ``packed`` (tensors autograd handed to the offloader), ``offloaded`` (copied to the host),
``kept_deduplicated`` (TRL: a storage already offloaded, kept on the GPU), ``skipped_small`` (< 1024 bytes),
``skipped_parameter`` (a parameter, buffer or view of one), ``skipped_other``, ``unpacked``, ``returned_from_stash``
(an offloaded tensor still in the forward stash at its unpack: the GPU original, no copy), ``brought_back``
(host-to-GPU copies), ``record_stream``; bytes for each; and the shapes of the large tensors kept on the GPU.
"""

from __future__ import annotations

import contextlib
import importlib
import weakref
from collections import Counter
from typing import Any

EMULATIONS = [
    "activation offloading: the offloader's accelerator is the fake cpu device (torch.accelerator / "
    "torch.get_device_module / torch.cuda in its module answer a stand-in); CUDA streams, events, stream contexts, "
    "empty_cache and record_stream are no-ops (max_memory_allocated frees a block when its tensor dies, whatever the "
    "streams do)",
    "activation offloading: host copies (empty_like/empty on device cpu, pinned) are meta tensors, not counted; "
    "bringing one back (.to(device)) allocates a new tensor of its shape on the fake cpu device, as the "
    "host-to-device copy does on a GPU",
    "activation offloading: storage pointers (TRL's deduplication key, its parameter-storage filter) are the "
    "storage's identity (_cdata) with its offset: fake storages have data_ptr() 0",
]


# ----------------------------------------------------------------------------------------------
# the device's stand-ins


class StandInEvent:
    """A CUDA event: recording, waiting and synchronizing do nothing (the GPU's allocation timeline does not wait)."""

    def record(self, stream=None):
        return None

    def wait(self, stream=None):
        return None

    def synchronize(self):
        return None

    def query(self):
        return True


class StandInStream:
    """A CUDA stream: work is ordered by Python's calls; waits and syncs do nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_event(self, event):
        return None

    def wait_stream(self, stream):
        return None

    def record_event(self, event=None):
        return event if event is not None else StandInEvent()

    def synchronize(self):
        return None

    def query(self):
        return True


class StandInDeviceModule:
    """What the offloaders call of ``torch.cuda`` / ``torch.get_device_module(...)``; anything else fails loudly."""

    Stream = StandInStream
    Event = StandInEvent

    def __init__(self):
        self._default = StandInStream()

    def current_stream(self, device=None):
        return self._default

    def default_stream(self, device=None):
        return self._default

    def stream(self, stream):
        return contextlib.nullcontext(stream)

    def empty_cache(self):
        return None

    def synchronize(self, device=None):
        return None

    def is_available(self):
        return True

    def __getattr__(self, name):
        raise AttributeError(f"offload_emulation: the offloader asked the device module for {name!r}, which the "
                             "emulation does not stand in for")


# ----------------------------------------------------------------------------------------------
# host memory


class HostCopy:
    """A pinned host tensor of the offloader: a ``meta`` tensor (shape, strides, dtype) that the counter ignores, plus
    (real CPU tensors only: the tests) a copy of the values taken outside every dispatch mode. ``.to(device)`` makes
    the host-to-device copy: a new tensor on the fake ``cpu`` device, counted as a GPU allocation."""

    def __init__(self, meta, stats: OffloadStats):
        self.meta = meta
        self.values = None
        self.stats = stats
        self.nbytes = meta.element_size() * meta.nelement()
        stats.host_live += self.nbytes
        stats.host_peak = max(stats.host_peak, stats.host_live)
        weakref.finalize(self, _host_free, stats, self.nbytes)

    # what a tensor answers that the offloaders or a reader may ask
    @property
    def shape(self):
        return self.meta.shape

    @property
    def dtype(self):
        return self.meta.dtype

    @property
    def device(self):
        import torch

        return torch.device("cpu")

    def size(self, dim=None):
        return self.meta.size() if dim is None else self.meta.size(dim)

    def stride(self, dim=None):
        return self.meta.stride() if dim is None else self.meta.stride(dim)

    def element_size(self):
        return self.meta.element_size()

    def nelement(self):
        return self.meta.nelement()

    numel = nelement

    def is_pinned(self):
        return True

    def copy_(self, src, non_blocking: bool = False):
        from torch._subclasses.fake_tensor import FakeTensor
        from torch.utils._python_dispatch import _disable_current_modes

        if not isinstance(src, FakeTensor):  # real tensors (tests): keep the values, outside the counter
            with _disable_current_modes():
                self.values = src.detach().clone()
        return self

    def to(self, device=None, *args, non_blocking: bool = False, **kwargs):
        import torch

        kind = torch.device(device).type if device is not None else None
        if kind not in ("cpu", "cuda"):  # "cpu": TRL's accelerator_type here; "cuda": torchtune's literal
            raise RuntimeError(f"offload_emulation: a host copy moved to {device!r}")
        out = torch.empty_strided(tuple(self.meta.shape), tuple(self.meta.stride()), dtype=self.meta.dtype,
                                  device="cpu")
        if self.values is not None:
            out.copy_(self.values)
        self.stats.brought_back += 1
        self.stats.brought_back_bytes += self.nbytes
        return out


def _host_free(stats, nbytes):
    stats.host_live -= nbytes


def _host_like(tensor, stats):
    """``torch.empty_like(tensor, device="cpu", pin_memory=...)``: ``empty_like``'s strides (preserved when dense)."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        meta = torch.empty_like(torch.empty_strided(tuple(tensor.shape), tuple(tensor.stride()), dtype=tensor.dtype,
                                                    device="meta"))
    return HostCopy(meta, stats)


def _host_empty(size, dtype, stats):
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        meta = torch.empty(size, dtype=dtype, device="meta")
    return HostCopy(meta, stats)


def _is_host(device) -> bool:
    return device is not None and str(device) == "cpu"


class _AcceleratorView:
    """``torch.accelerator`` with the fake ``cpu`` device as the current accelerator."""

    def __init__(self, real):
        self._real = real

    def current_accelerator(self, check_available: bool = False):
        import torch

        return torch.device("cpu")

    def is_available(self):
        return True

    def __getattr__(self, name):
        return getattr(self._real, name)


class _TorchView:
    """The ``torch`` an offloader module sees: the real one, with the accelerator, the device module and host
    allocations emulated."""

    def __init__(self, real, device_module: StandInDeviceModule, stats: OffloadStats):
        self._real = real
        self._stats = stats
        self.accelerator = _AcceleratorView(real.accelerator)
        self.cuda = device_module
        self._device_module = device_module

    def get_device_module(self, device=None):
        return self._device_module

    def empty_like(self, tensor, *args, device=None, pin_memory=False, **kwargs):
        if _is_host(device):
            return _host_like(tensor, self._stats)
        return self._real.empty_like(tensor, *args, device=device, pin_memory=pin_memory, **kwargs)

    def empty(self, *size, device=None, pin_memory=False, dtype=None, **kwargs):
        if _is_host(device):
            shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)
            return _host_empty(shape, dtype or self._real.get_default_dtype(), self._stats)
        return self._real.empty(*size, device=device, pin_memory=pin_memory, dtype=dtype, **kwargs)

    def __getattr__(self, name):
        return getattr(self._real, name)


# ----------------------------------------------------------------------------------------------
# the counts


class OffloadStats:
    def __init__(self):
        self.managers: list[str] = []
        self.counts: Counter = Counter()
        self.bytes: Counter = Counter()
        self.brought_back = 0
        self.brought_back_bytes = 0
        self.returned_from_stash = 0
        self.unpacked = 0
        self.record_stream = 0
        self.host_live = 0
        self.host_peak = 0
        self.kept_shapes: Counter = Counter()
        self.offloaded_shapes: Counter = Counter()

    def report(self) -> dict:
        return {
            "managers": list(self.managers),
            "packed": sum(self.counts.values()),
            **{k: self.counts.get(k, 0) for k in ("offloaded", "kept_deduplicated", "skipped_small",
                                                  "skipped_parameter", "skipped_other")},
            "bytes": {k: self.bytes.get(k, 0) for k in ("offloaded", "kept_deduplicated", "skipped_small",
                                                        "skipped_parameter", "skipped_other")},
            "unpacked": self.unpacked,
            "returned_from_stash": self.returned_from_stash,
            "brought_back": self.brought_back,
            "brought_back_bytes": self.brought_back_bytes,
            "record_stream": self.record_stream,
            "host_peak_bytes": self.host_peak,
            "offloaded_shapes": dict(self.offloaded_shapes.most_common(12)),
            "kept_on_gpu_shapes": dict(self.kept_shapes.most_common(12)),
            "emulations": list(EMULATIONS),
        }


def _shape_key(tensor) -> str:
    return f"{list(tensor.shape)} {str(tensor.dtype).replace('torch.', '')}"


# ----------------------------------------------------------------------------------------------
# the patches


class _Pointers:
    """While the offloader's own code runs, a storage's ``data_ptr()`` is its identity (CUDA: its address)."""

    def __init__(self):
        self.active = 0

    @contextlib.contextmanager
    def on(self):
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1


def _unique_tensor_key(tensor) -> tuple:
    """TRL's ``_get_unique_tensor_key`` with the storage's identity for its address (DTensor: its local tensor)."""
    actual = getattr(tensor, "_local_tensor", tensor)
    try:
        return ((actual.untyped_storage()._cdata, actual.storage_offset()), actual.dtype)
    except (RuntimeError, AttributeError):
        return (id(actual), actual.dtype)


def _classify(manager, tensor_id: int, tensor, stats: OffloadStats) -> None:
    """What the offloader did with one saved tensor, read back from its own tracker."""
    import torch

    entry = manager.tracker.get(tensor_id)
    nbytes = tensor.element_size() * tensor.nelement()
    if entry is not None and entry[1]:
        kind = "offloaded"
        stats.offloaded_shapes[_shape_key(tensor)] += 1
    elif getattr(manager, "_storage_key_by_tensor_id", {}).get(tensor_id) is not None:
        kind = "kept_deduplicated"  # TRL: only its deduplication keeps a storage key for a tensor it did not offload
    elif nbytes < manager.min_tensor_size_bytes:
        kind = "skipped_small"
    else:
        param_keys = getattr(manager, "param_storages", set())
        try:
            in_params = tensor.untyped_storage()._cdata in param_keys
        except Exception:
            in_params = False
        buffer_cls = getattr(torch.nn, "Buffer", ())
        if isinstance(tensor, torch.nn.Parameter) or (buffer_cls and isinstance(tensor, buffer_cls)) or in_params:
            kind = "skipped_parameter"
        else:
            kind = "skipped_other"
    stats.counts[kind] += 1
    stats.bytes[kind] += nbytes
    if kind in ("kept_deduplicated", "skipped_parameter", "skipped_other"):
        stats.kept_shapes[f"{kind}: {_shape_key(tensor)}"] += 1


def _wrap_init(cls, stats: OffloadStats, pointers: _Pointers, library: str):
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        with pointers.on():
            original(self, *args, **kwargs)
        stats.managers.append(f"{library}.{cls.__name__}")
        pack, unpack = self.pack_hook, self.unpack_hook

        def pack_hook(tensor):
            with pointers.on():
                tensor_id = pack(tensor)
            _classify(self, tensor_id, tensor, stats)
            return tensor_id

        def unpack_hook(tensor_id):
            stats.unpacked += 1
            entry = self.tracker.get(tensor_id)
            if entry is not None and entry[1] and tensor_id in getattr(self, "fwd_stash", {}):
                stats.returned_from_stash += 1
            with pointers.on():
                return unpack(tensor_id)

        self.pack_hook, self.unpack_hook = pack_hook, unpack_hook

    return original, __init__


def _offloader_modules() -> list[tuple[str, Any]]:
    """(library, module) of the installed offloaders: TRL's and torchtune's (each venv has one of them)."""
    found = []
    for library, name in (("trl", "trl.models.activation_offloading"),
                          ("torchtune", "torchtune.training._activation_offloading")):
        try:
            found.append((library, importlib.import_module(name)))
        except Exception:
            continue
    return found


@contextlib.contextmanager
def emulated_offloading():
    """Patch the installed offloaders (TRL's, torchtune's) to the emulated CUDA path for the duration; yields the
    :class:`OffloadStats` their managers count into (``.report()``)."""
    import torch

    stats = OffloadStats()
    pointers = _Pointers()
    device_module = StandInDeviceModule()
    view = _TorchView(torch, device_module, stats)
    modules = _offloader_modules()
    if not modules:
        raise RuntimeError("offload_emulation: neither TRL's nor torchtune's activation offloading is importable")
    undo: list[tuple[Any, str, Any, bool]] = []  # (object, attribute, old value, was it in the object's own dict)

    def patch(obj, name, value):
        own = name in vars(obj)
        undo.append((obj, name, vars(obj).get(name) if own else None, own))
        setattr(obj, name, value)

    for library, module in modules:
        patch(module, "torch", view)
        cls = module.OffloadActivations
        _, init = _wrap_init(cls, stats, pointers, library)
        patch(cls, "__init__", init)
        if library == "trl":
            patch(module, "_get_unique_tensor_key", _unique_tensor_key)
            original_update = cls.update_model_params

            def update_model_params(self, model, _original=original_update):
                with pointers.on():
                    return _original(self, model)

            patch(cls, "update_model_params", update_model_params)

    storage_cls = torch.UntypedStorage
    original_data_ptr = storage_cls.data_ptr

    def data_ptr(self):
        if pointers.active:
            return self._cdata
        return original_data_ptr(self)

    patch(storage_cls, "data_ptr", data_ptr)
    original_record_stream = torch.Tensor.record_stream

    def record_stream(self, stream):
        if isinstance(stream, StandInStream):
            stats.record_stream += 1
            return None
        return original_record_stream(self, stream)

    patch(torch.Tensor, "record_stream", record_stream)
    try:
        yield stats
    finally:
        for obj, name, value, own in reversed(undo):
            if own:
                setattr(obj, name, value)
            else:
                delattr(obj, name)
