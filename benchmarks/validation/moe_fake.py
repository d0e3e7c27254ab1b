"""MoE experts under fake tensors as a GPU runs them: torch's meta kernel of ``aten._grouped_mm`` is stricter than CUDA.

transformers 5.24 runs MoE experts with ``torch.nn.functional.grouped_mm`` (integrations/moe.py,
``grouped_mm_experts_forward``), the default ``experts_implementation``. On CUDA, torch >= 2.9 accepts float32 and
float16 there as well as bfloat16: the CUTLASS fast path is bf16-only and other dtypes take the fallback that loops
over the groups into one output (pytorch/pytorch#162059, "enable float32 and float16 in torch._grouped_mm fallback").
torch 2.13's meta kernel (torch/_meta_registrations.py ``_meta_grouped_mm_common``, which fake tensors use) still
checks for bf16 only, so a fake run of an MoE model whose experts are fp32 (after peft's
``prepare_model_for_kbit_training``, or ``precision: mixed``) fails with "Expected inputs of BF16 type" where the GPU
would run. The patch below keeps every other check of the meta kernel and gives the output the inputs' dtype, as the
CUDA fallback does. Its output and backward allocate what the bf16 path allocates, in the wider dtype.
"""

from __future__ import annotations


def grouped_mm_meta_patch():
    """(module, attribute, replacement) for fake_mode.gpu_routing's patch list."""
    import torch
    from torch import _meta_registrations as meta

    original = meta._meta_grouped_mm_common

    def common(mat_a, mat_b, scale_a, scale_b, offs=None, bias=None, scale_result=None, out_dtype=None,
               use_fast_accum=False):
        wide = (torch.float32, torch.float16)
        if scale_a is None and scale_b is None and mat_a.dtype == mat_b.dtype and mat_a.dtype in wide:
            dtype = mat_a.dtype
            # run the shape/stride/offset checks on bf16 stand-ins with the same sizes and strides
            a = torch.empty_strided(mat_a.shape, mat_a.stride(), dtype=torch.bfloat16, device="meta")
            b = torch.empty_strided(mat_b.shape, mat_b.stride(), dtype=torch.bfloat16, device="meta")
            original(a, b, None, None, offs=offs, bias=bias, scale_result=scale_result, out_dtype=None,
                     use_fast_accum=use_fast_accum)
            return meta._create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype or dtype)
        return original(mat_a, mat_b, scale_a, scale_b, offs=offs, bias=bias, scale_result=scale_result,
                        out_dtype=out_dtype, use_fast_accum=use_fast_accum)

    return meta, "_meta_grouped_mm_common", common
