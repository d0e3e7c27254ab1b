"""What PEFT's modules_to_save and DoRA need to run under fake tensors (used by fake_mode.py).

Two obstacles, each seen with torch 2.13, peft 0.21.2, bitsandbytes 0.50.2:

- ``copy.deepcopy`` of a fake parameter builds the copy in a *new* FakeTensorMode (``Tensor.__deepcopy__`` takes the
  storage route), and the first op mixing it with the model's tensors fails ("Mixing fake modes NYI"). PEFT deep-copies
  the module in ``ModulesToSaveWrapper.update`` (peft/utils/other.py) and the 4-bit base layer in
  ``DoraLinearLayer.update_layer`` (peft/tuners/lora/dora.py). :func:`same_mode_deepcopy` clones fake tensors in the
  active mode instead (a real copy: the clone is counted like any allocation), keeping the attributes a tensor carries
  (``quant_state`` and the like on the fake 4-bit weights, shared with the original).
- PEFT dequantizes a 4-bit base weight only when its class is named ``Params4bit``
  (peft/utils/integrations.py ``dequantize_module_weight``); under fake tensors the packed weight is a fake tensor
  carrying ``quant_state`` (recipes/model_setup.py ``_quantize_model``), so DoRA would get the packed codes.
  :func:`fake_4bit_dequantize` makes PEFT dequantize those with bitsandbytes' ``dequantize_4bit`` (which has a fake
  kernel), as it does a real Params4bit.
"""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def same_mode_deepcopy():
    """While active, ``copy.deepcopy`` of a fake tensor clones it in the fake mode that is running."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.overrides import TorchFunctionMode

    class SameModeDeepcopy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.Tensor.__deepcopy__ and isinstance(args[0], FakeTensor):
                tensor, memo = args
                if id(tensor) in memo:
                    return memo[id(tensor)]
                with torch._C.DisableTorchFunctionSubclass():
                    out = tensor.detach().clone()
                if isinstance(tensor, torch.nn.Parameter) or getattr(tensor, "_is_param", False):
                    out = torch.nn.Parameter(out, requires_grad=tensor.requires_grad)
                memo[id(tensor)] = out
                # attributes by reference: inside this handler the mode is off, so a nested deepcopy of quant_state's
                # tensors would land in a new fake mode again; PEFT only reads them (DoRA dequantizes its copy)
                for key, value in tensor.__dict__.items():
                    if key not in out.__dict__:
                        setattr(out, key, value)
                return out
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)

    with SameModeDeepcopy():
        yield


@contextlib.contextmanager
def fake_peft_support(fake: bool = True):
    """Both patches, for a fake run (nothing for a real one): the deepcopy one only while the model is built."""
    if not fake:
        yield contextlib.nullcontext
        return
    with fake_4bit_dequantize():
        yield same_mode_deepcopy


@contextlib.contextmanager
def fake_4bit_dequantize():
    """PEFT's dequantize_module_weight, also for the fake path's 4-bit weights (a fake tensor with quant_state)."""
    import bitsandbytes as bnb
    from peft.tuners.lora import dora
    from peft.utils import integrations

    original = integrations.dequantize_module_weight

    def dequantize_module_weight(module):
        weight = getattr(module, "weight", None)
        state = getattr(weight, "quant_state", None)
        if state is not None and type(weight).__name__ != "Params4bit" and hasattr(state, "blocksize"):
            return bnb.functional.dequantize_4bit(weight.data, state)
        return original(module)

    targets = [(integrations, "dequantize_module_weight"), (dora, "dequantize_module_weight")]
    saved = [(obj, name, getattr(obj, name)) for obj, name in targets]
    for obj, name in targets:
        setattr(obj, name, dequantize_module_weight)
    try:
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)
