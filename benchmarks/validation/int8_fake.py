"""bitsandbytes LLM.int8 (8-bit base) matmuls under fake tensors, as a CUDA GPU runs them.

``Linear8bitLt.forward`` calls ``bnb.matmul``, which for a training step on a CPU tensor takes ``MatMul8bitFp``
(dequantize the whole weight, then a dense matmul) and on CUDA ``MatMul8bitLt`` (int8 input, int8 matmul); the fake
harness's tensors are on ``cpu``, so the matmul is routed to ``MatMul8bitLt`` as on a GPU. Three of the ops it calls
cannot run as the GPU runs them under fake tensors (bitsandbytes 0.50.2):

- ``int8_vectorwise_quant`` with the default ``llm_int8_threshold`` 6.0: the columns holding an outlier are found on
  the data (``argwhere``), so the fake kernel returns a data-dependent size, which a FakeTensorMode without a shape
  environment refuses. Here: the CUDA kernel's search is allocated as it runs (``A.abs() >= threshold``, then
  ``any`` over rows) and no column is an outlier, which is what random weights give (every |activation| < 6);
  pretrained models have a few outlier columns, whose fp16 slice (tokens x columns) this leaves out.
- ``int8_mixed_scaled_mm`` (its fake kernel asks for a data-dependent size even with no outlier): the default
  kernel, which CUDA uses, with no outlier column: ``int8_scaled_mm`` and an empty ``subA``.
- ``int8_scaled_mm``: its fake kernel returns the output only; on CUDA the default kernel runs, which allocates the
  int32 product (``int8_linear_matmul``) and then ``int8_mm_dequant``'s fp16 output, cast to the requested dtype.
"""

from __future__ import annotations

from typing import Any


class _Op:
    """Stands in for an op packet of ``torch.ops.bitsandbytes``: callable, and as ``.default``."""

    def __init__(self, fn):
        self.default = fn

    def __call__(self, *args, **kwargs):
        return self.default(*args, **kwargs)


def patches() -> list[tuple[Any, str, Any]]:
    """(object, attribute, replacement) triples for the int8 path; empty when bitsandbytes is not installed."""
    try:
        import bitsandbytes as bnb
        import bitsandbytes.functional as F
        import torch
        from bitsandbytes.autograd import _functions as fns
    except Exception:  # pragma: no cover - bitsandbytes missing
        return []
    ops = torch.ops.bitsandbytes
    original_quant = F.int8_vectorwise_quant

    def matmul(A, B, out=None, state=None, threshold=0.0, bias=None):  # bnb.matmul as on CUDA
        state = state or fns.MatmulLtState()
        if threshold > 0.0:
            state.threshold = threshold
        return fns.MatMul8bitLt.apply(A, B, out, bias, state)

    def int8_vectorwise_quant(A, threshold=0.0):
        if threshold == 0.0:
            return original_quant(A, threshold)
        out_row, row_stats, _ = original_quant(A, 0.0)  # the CUDA kernel allocates these first
        outliers = A.abs() >= threshold  # then searches the outlier columns
        outliers.any(dim=0)
        del outliers
        return out_row, row_stats, A.new_empty(0, dtype=torch.int64)  # none: random weights

    def int8_mm_dequant(A, row_stats, col_stats, dtype=None, bias=None):  # the CUDA kernel: fp16 out, then cast
        out = torch.empty_like(A, dtype=torch.float16)
        if bias is not None and bias.dtype != torch.float16:
            out.add_(bias)
        return out.to(dtype or torch.float16)

    def int8_scaled_mm(A, B, row_stats, col_stats, bias=None, dtype=None):  # the default kernel
        out_i32 = ops.int8_linear_matmul.default(A, B)
        return int8_mm_dequant(out_i32, row_stats, col_stats, dtype=dtype or torch.float16, bias=bias)

    def int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, outlier_cols=None, bias=None):  # the default kernel
        if outlier_cols is not None and outlier_cols.numel():
            raise NotImplementedError("int8 outlier columns under fake tensors")
        subA = torch.empty(0, device=A.device, dtype=A.dtype)
        return int8_scaled_mm(CA, CB, SCA, SCB, bias=bias, dtype=A.dtype), subA

    return [
        (bnb, "matmul", matmul),
        (F, "int8_vectorwise_quant", int8_vectorwise_quant),
        (ops, "int8_scaled_mm", _Op(int8_scaled_mm)),
        (ops, "int8_mixed_scaled_mm", _Op(int8_mixed_scaled_mm)),
    ]
