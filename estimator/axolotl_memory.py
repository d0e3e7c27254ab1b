"""Axolotl's LoRA kernels: what a block saves for backward where Axolotl replaces PEFT's adapted projections.

Axolotl 0.19.0 turns its LoRA kernels on by default for lora/qlora (``check_auto_enable_lora_kernels`` in
axolotl/utils/schemas/config.py: not for 8-bit LoRA, not on FSDP1; ``lora_qkv_kernel``, ``lora_o_kernel``,
``lora_mlp_kernel``), and ``apply_lora_kernel_patches`` (axolotl/monkeypatch/lora_kernels.py) patches a group of a
block only where every projection of it has an adapter: q, k and v (``LoRA_QKV``), o (``LoRA_O``), gate, up and down
(``LoRA_MLP``, SwiGLU or GeGLU). Each group is one autograd function (axolotl/kernels/lora.py) that saves, without
dropout and DoRA:

- ``LoRA_QKV``: its input X (the attention norm's output, a·T·H) and the six LoRA matrices cast to X's dtype (with
  lora_dropout also the dropped-out X, and the dropout's mask);
- ``LoRA_O``: its input X (the attention kernel's output, already kept by the kernel) and its two matrices cast;
- ``LoRA_MLP``: its input X (the MLP norm's output, a·T·H), gate and up (2·a·T·I) and its six matrices cast; the
  activation's product is recomputed in backward, not saved.

PEFT's path instead keeps each adapter's own input cast to the adapter dtype (Axolotl keeps fp32 adapters), its
rank-r intermediate, and the MLP's gate, act, up and the product. Measured with Axolotl's own step under fake
tensors (cohort v15 x09, Qwen3-0.6B all-linear LoRA without checkpointing: +18.0% counted as PEFT's path).

Modelled where the measured families run them (llama, mistral, qwen2, qwen3: separate q/k/v and SiLU MLPs), without
DoRA; elsewhere the estimate keeps PEFT's path, which saves more (the safe side).
"""

from __future__ import annotations

from .allocator import round_block
from .knob_terms import BlockPart
from .resolved import ResolvedPlan
from .spec import LinearSpec

# model types whose blocks Axolotl's kernels patch as measured (separate q/k/v projections, a SiLU gated MLP)
KERNEL_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def kernel_groups(r: ResolvedPlan) -> frozenset[str]:
    """The groups of every block ("qkv", "o", "mlp") that Axolotl's LoRA kernels replace for this plan (kept with the
    resolved plan: every block kind asks)."""
    groups = r.memo.get("axolotl_kernel_groups")
    if groups is None:
        groups = r.memo["axolotl_kernel_groups"] = _kernel_groups(r)
    return groups


def _kernel_groups(r: ResolvedPlan) -> frozenset[str]:
    plan = r.plan
    if (r.framework != "axolotl" or not plan.uses_adapters or plan.load_in_8bit or plan.use_dora
            or r.spec.model_type not in KERNEL_MODEL_TYPES or r.spec.moe is not None):
        return frozenset()
    attn, mlp = r.spec.attention_linears(), r.spec.dense_mlp_linears()
    groups = set()
    if all(r.adapted(lin) for lin in attn[:-1]):
        groups.add("qkv")
    if r.adapted(attn[-1]):
        groups.add("o")
    if all(r.adapted(lin) for lin in mlp):
        groups.add("mlp")
    return frozenset(groups)


def _cast_matrices(r: ResolvedPlan, linears: tuple[LinearSpec, ...]) -> int:
    """lora_A and lora_B of each linear cast to the compute dtype (``A.to(dtype)``, saved for backward; a copy when
    the adapters are in another dtype)."""
    if r.adapter_dtype == r.compute_dtype:
        return 0
    rank = r.plan.lora_r
    return sum(round_block(r.act_bytes * rank * lin.in_features) + round_block(r.act_bytes * rank * lin.out_features)
               for lin in linears)


def _dropout(r: ResolvedPlan, width: int) -> int:
    """With lora_dropout, one dropout per group (``_apply_dropout`` of the group's first projection, shared by the
    group): the dropped-out input the kernel saves (a·T·in) and native_dropout's bool mask (T·in)."""
    if r.plan.lora_dropout <= 0:
        return 0
    return round_block(r.act_bytes * r.tokens * width) + round_block(r.tokens * width)


def qkv_parts(r: ResolvedPlan) -> dict[BlockPart, int]:
    """``LoRA_QKV``'s saved tensors: the block tensor X it reads, its dropout, and the cast matrices."""
    attn = r.spec.attention_linears()[:-1]
    width = attn[0].in_features
    x = round_block(r.act_bytes * r.tokens * width)
    return {BlockPart.ADAPTER_INPUTS: x + _dropout(r, width) + _cast_matrices(r, attn)}


def o_parts(r: ResolvedPlan) -> dict[BlockPart, int]:
    """``LoRA_O``'s saved tensors: its input is the attention kernel's output, kept with the kernel (memory.py
    ``_attention_parts``); its dropout and the cast matrices."""
    o_proj = r.spec.attention_linears()[-1:]
    return {BlockPart.ADAPTER_INPUTS: _dropout(r, o_proj[0].in_features) + _cast_matrices(r, o_proj)}


def mlp_parts(r: ResolvedPlan) -> dict[BlockPart, int]:
    """``LoRA_MLP``'s saved tensors: X (the MLP norm's output), gate and up, the dropout of gate/up's input (the
    product feeding down_proj gets none), and the cast matrices."""
    mlp = r.spec.dense_mlp_linears()
    t, a, width = r.tokens, r.act_bytes, mlp[0].in_features
    saved = round_block(a * t * width) + 2 * round_block(a * t * r.spec.intermediate_size)
    return {BlockPart.MLP: saved, BlockPart.ADAPTER_INPUTS: _dropout(r, width) + _cast_matrices(r, mlp)}
