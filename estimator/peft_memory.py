"""PEFT's ``modules_to_save`` and ``use_dora``: what they add to a LoRA/QLoRA step's memory.

Read from PEFT 0.21.2 and TRL 1.16 in the venv (.venv/lib/python3.11/site-packages/):

**modules_to_save** (peft/utils/other.py ``ModulesToSaveWrapper.update``, ``_set_trainable``): every module whose
name ends with a listed name is wrapped, and the wrapper trains ``copy.deepcopy(original_module)`` while the original
stays frozen. The copy keeps the original's dtype: ``cast_adapter_dtype`` (peft/tuners/tuners_utils.py) upcasts only
parameters inside ``BaseTunerLayer`` modules, and the wrapper is not one. TRL 1.16 (trl/trainer/sft_trainer.py) casts
every trainable parameter to bf16 on a quantized base, the copies included (they are bf16 there already); the
``transformers`` stack copies after ``prepare_model_for_kbit_training``, so from an fp32 module. Tied embeddings
(Llama-3.2-1B, Qwen2.5-0.5B/1.5B): with ``ensure_weight_tying`` off (LoraConfig's default) each listed module gets its
own copy; ``['lm_head']`` trains a V x H copy of the head while the tied embedding/head matrix stays frozen and shared,
``['embed_tokens', 'lm_head']`` trains two independent V x H copies. So the count is one V x H per listed module,
tied or not. Modelled names: ``embed_tokens`` and ``lm_head`` (every checked family uses them); other module names
(block linears, norms) are refused until modelled.

Where their memory goes: the copy, its gradient and its optimizer states (per tensor); the head copy's gradient is
made at the loss end of backward (TRL's chunked head accumulates it in fp32, 4·V·H, then casts it to the weight
dtype, trl/kernels/chunked_logprob.py; the standard loss's lm_head matmul writes it directly), the embedding copy's at
the very end (a dense V x H from ``embedding_dense_backward``). A trainable head keeps its input for backward: the
chunked head's contiguous copy of the final hidden states is saved anyway; the standard loss's ``lm_head`` linear
saves the final norm's output, a·T·H (and, for an fp32 copy under autocast, its a·V·H cast).

**use_dora** (peft/tuners/lora/dora.py ``DoraLinearLayer``, variants.py ``DoraLinearVariant``, layer.py): each adapted
linear gains ``lora_magnitude_vector`` (out_features, trainable; fp32 by PEFT's autocast_adapter_dtype and left in
fp32 by TRL's bf16 cast, which skips names containing ``lora_magnitude_vector``). Per forward (again in a checkpointed
block's recomputation), with x the adapter input (cast to the adapter dtype, p bytes) and a the compute dtype:

1. ``get_lora_weight``: ``x_eye = torch.eye(in)`` in the adapter dtype (p·in²) goes through lora_A and lora_B under
   autocast: lora_A saves x_eye's compute-dtype cast (a·in², or x_eye itself when p == a) in a graph that lives
   until the layer returns; lora_B's output is the in x out product (a·in·out).
2. ``lora_weight.to(x.dtype)`` and ``dequantize_module_weight(base).to(x.dtype)`` (the parameter itself when the
   base is unquantized and already in x's dtype; a new tensor otherwise: bitsandbytes dequantizes a 4-bit weight);
   ``get_weight_norm`` adds ``scaling * lora_weight`` and the sum: up to four out x in tensors in x's dtype while
   ``torch.linalg.norm(dim=1)`` reduces them (autocast on CUDA gives the norm an fp32 dtype argument, not a copy).
   The norm is detached: nothing of it is saved.
3. with lora_dropout > 0, ``base_result = F.linear(dropout(x), weight)``: autograd saves the weight it multiplied,
   the compute-dtype cast of the dequantized/cast weight (a·out·in), unless that is the stored parameter itself;
   with lora_dropout == 0 the base layer's output is reused and no weight is saved.
4. ``(mag_norm_scale - 1) * base_result + mag_norm_scale * lora_result * scaling``: the products save base_result
   and lora_result (2 x a·T·out; plain LoRA's scalar scaling saves neither).

Measured (fake tensors, torch 2.13): a single 4096 -> 1024 DoRA linear at 512 tokens keeps exactly the weight copy,
base_result and lora_result beyond plain LoRA, and its forward peak is step 1 (x_eye 64 MiB fp32 + 32 MiB cast);
a 4096 -> 4096 one peaks in step 2 (four fp32 out x in tensors and the a·in² cast).
"""

from __future__ import annotations

from .allocator import round_block
from .constants import DTYPE_BYTES
from .knob_terms import BlockPart, KnobTerms
from .peft_knobs import EMBEDDING, HEAD, MODELLED_MODULES_TO_SAVE
from .resolved import ResolvedPlan
from .spec import LinearSpec
from .tensor_records import Role, TensorRecord


def saved_copy_dtype(r: ResolvedPlan) -> str:
    """dtype of the modules_to_save copies: the original's (the frozen dtype: the weight dtype, fp32 after
    prepare_model_for_kbit_training), unless the stack casts the trainable parameters: TRL 1.16 to bf16 on a quantized
    base; the transformers-style stack (recipes/model_setup.py) to the plan's adapter_dtype or its framework's
    default."""
    stack = r.plan.stack
    quantized = r.quantization != "none"
    if r.framework == "trl":
        cast = stack.adapter_dtype_quantized if quantized else None
    else:
        cast = r.plan.adapter_dtype or (stack.adapter_dtype_quantized if quantized else stack.adapter_dtype_unquantized)
    return cast or r.frozen_dtype


def magnitude_dtype(r: ResolvedPlan) -> str:
    """dtype of DoRA's magnitude vectors: fp32 (PEFT's autocast_adapter_dtype; TRL's bf16 cast skips them), unless a
    non-TRL stack casts every trainable parameter to the plan's adapter_dtype."""
    if r.framework != "trl" and r.plan.adapter_dtype:
        return r.plan.adapter_dtype
    return "fp32"


def head_trains_as_copy(r: ResolvedPlan) -> bool:
    return not r.full and HEAD in r.modules_to_save


def embedding_trains_as_copy(r: ResolvedPlan) -> bool:
    return not r.full and EMBEDDING in r.modules_to_save


def dora(r: ResolvedPlan) -> bool:
    return r.use_dora and r.adapter_dtype is not None


# ---------------------------------------------------------------------------
# the knobs' tensors in the inventory (estimator/inventory.py BUILDERS)


def saved_copy_records(r: ResolvedPlan) -> list[TensorRecord]:
    """One trainable V x H copy per modules_to_save entry (tied or not), in :func:`saved_copy_dtype`."""
    if r.full:
        return []
    spec, dtype = r.spec, saved_copy_dtype(r)
    size = spec.vocab_size * spec.hidden_size
    return [TensorRecord(Role.SAVED_COPY, name, spec.vocab_size, spec.hidden_size, 1, dtype, True,
                         round_block(size * DTYPE_BYTES[dtype]))
            for name in r.modules_to_save if name in MODELLED_MODULES_TO_SAVE]


def dora_magnitude_records(r: ResolvedPlan) -> list[TensorRecord]:
    """One trainable out_features magnitude vector per DoRA-adapted linear, in :func:`magnitude_dtype`."""
    if r.full or not dora(r):
        return []
    dtype = magnitude_dtype(r)
    return [TensorRecord(Role.DORA_MAGNITUDE, f"{lin.name}.lora_magnitude_vector", lin.out_features, 1, n, dtype,
                         True, round_block(lin.out_features * DTYPE_BYTES[dtype]), i)
            for i, n in r.spec.layer_groups for lin in r.adapted_linears(i)]


# ---------------------------------------------------------------------------
# the trainable head and embedding in the step


def head_copy_grad_bytes(r: ResolvedPlan) -> int:
    """The head copy's gradient, V x H in its dtype (0 unless lm_head is in modules_to_save)."""
    if not head_trains_as_copy(r):
        return 0
    return r.spec.vocab_size * r.spec.hidden_size * DTYPE_BYTES[saved_copy_dtype(r)]


def head_copy_loss_backward_bytes(r: ResolvedPlan) -> int:
    """TRL's chunked head with a trainable head copy (trl/kernels/chunked_logprob.py backward): the gradient is
    accumulated in fp32 (``torch.zeros(weight.shape, dtype=float32)``, 4·V·H) and returned as
    ``grad_weight.to(weight.dtype)``, a second V x H in the copy's dtype (none when the copy is fp32)."""
    if not head_trains_as_copy(r):
        return 0
    vh = r.spec.vocab_size * r.spec.hidden_size
    per = DTYPE_BYTES[saved_copy_dtype(r)]
    return round_block(4 * vh) + (round_block(per * vh) if per != 4 else 0)


def head_copy_saved_bytes(r: ResolvedPlan, frozen_head_cast: int) -> int:
    """What a trainable head copy keeps for backward under the standard loss: lm_head's input, the final norm's
    output a·T·H (a frozen head keeps nothing: the matmul saves its input only for the weight's gradient), plus the
    compute-dtype cast of an fp32 copy under autocast (a·V·H, saved for the input's gradient). The chunked head saves
    its contiguous copy of the hidden states whether the head trains or not (loss_forward_bytes).

    ``frozen_head_cast`` is memory.lm_head_cast_bytes(r), a kbit-prepared fp32 head's cast: when there is one, the
    copy's cast is counted there, not again here (the caller passes it: memory.py sits above this module)."""
    if not head_trains_as_copy(r) or r.loss_implementation == "chunked":
        return 0
    a = r.act_bytes
    total = round_block(a * r.tokens * r.spec.hidden_size)
    if r.autocast and saved_copy_dtype(r) != r.compute_dtype and not frozen_head_cast:
        total += round_block(a * r.spec.vocab_size * r.spec.hidden_size)
    return total


# ---------------------------------------------------------------------------
# DoRA's per-forward work


def _x_bytes(r: ResolvedPlan) -> int:
    """Bytes of the adapter input x inside PEFT's Linear.forward: cast to lora_A's dtype (``_cast_input_dtype``)."""
    assert r.adapter_dtype is not None
    return DTYPE_BYTES[r.adapter_dtype]


def _weight_in_x_is_new(r: ResolvedPlan) -> bool:
    """Whether ``dequantize_module_weight(base).to(x.dtype)`` allocates: always for a 4/8-bit base (dequantized),
    for an unquantized one when its dtype differs from x's."""
    if r.quantization != "none":
        return True
    return r.frozen_dtype != r.adapter_dtype


def dora_layer_saved_bytes(r: ResolvedPlan, layer: int) -> int:
    """What DoRA adds to a block's saved tensors, per adapted linear (peft/tuners/lora/dora.py forward):
    base_result and lora_result kept by the magnitude products, 2 x a·T·out; with lora_dropout > 0 the weight
    F.linear multiplied, a·out·in, unless that is the stored parameter (unquantized, stored in the compute dtype and
    x already in it, so no cast happens)."""
    if not dora(r):
        return 0
    a = r.act_bytes
    t = r.tokens
    total = 0
    for lin in r.adapted_linears(layer):
        total += 2 * round_block(a * t * lin.out_features)
        if r.plan.lora_dropout > 0:
            param_itself = (
                r.quantization == "none"
                and r.frozen_dtype == r.compute_dtype
                and r.adapter_dtype == r.compute_dtype
            )
            if not param_itself:
                total += round_block(a * lin.weight_params)
    return total


def dora_linear_forward_transient_bytes(r: ResolvedPlan, lin: LinearSpec) -> int:
    """The largest set DoRA allocates and frees inside one adapted linear's forward, beyond plain LoRA's:

    - step 1 (get_lora_weight): x_eye p·in², its compute-dtype cast a·in² (when p != a under autocast), lora_A's
      output a·in·r and lora_B's a·in·out;
    - step 2 (get_weight_norm): the graph-held x_eye (a·in²), ``lora_weight`` in x's dtype, the base weight in x's
      dtype when that is a new tensor, ``scaling * lora_weight`` and the sum: (3 + new)·px·out·in
      (px = bytes of x's dtype);
    the larger of the two. The weight copy saved in step 3 is counted in :func:`dora_layer_saved_bytes`.
    """
    a = r.act_bytes
    p = _x_bytes(r)
    cast = r.autocast and p != a
    i, o = lin.in_features, lin.out_features
    step1 = round_block(p * i * i) + (round_block(a * i * i) if cast else 0)
    step1 += round_block(a * i * r.plan.lora_r) + round_block(a * i * o)
    held = round_block((a if cast else p) * i * i)
    new = 1 if _weight_in_x_is_new(r) else 0
    step2 = held + (3 + new) * round_block(p * o * i)
    return max(step1, step2)


def dora_forward_transient_bytes(r: ResolvedPlan) -> int:
    """:func:`dora_linear_forward_transient_bytes` of the adapted linear where it is largest (0 without DoRA)."""
    if not dora(r):
        return 0
    return max(
        (dora_linear_forward_transient_bytes(r, lin) for i, _ in r.spec.layer_groups for lin in r.adapted_linears(i)),
        default=0,
    )


def adapter_note_suffix(r: ResolvedPlan) -> str:
    """What the lora_adapters item holds beside the LoRA matrices, for its explanation ('' without the knobs)."""
    parts = []
    if dora(r):
        mags = sum(n * lin.out_features for i, n in r.spec.layer_groups for lin in r.adapted_linears(i))
        parts.append(f"DoRA magnitude vectors ({mags / 1e6:.3g}M, {magnitude_dtype(r)})")
    copies = [n for n in r.modules_to_save if n in MODELLED_MODULES_TO_SAVE]
    if copies and not r.full:
        each = r.spec.vocab_size * r.spec.hidden_size
        parts.append(f"trainable copies of {', '.join(copies)} (modules_to_save: {len(copies) * each / 1e6:.4g}M, "
                     f"{saved_copy_dtype(r)})")
    return "; plus " + " and ".join(parts) if parts else ""


# ---------------------------------------------------------------------------
# the knobs' transient terms, as the memory terms fold them (estimator/knob_terms.py)


def _dora_block_saved(r: ResolvedPlan, layer: int) -> dict[BlockPart, int]:
    return {BlockPart.DORA: dora_layer_saved_bytes(r, layer)}


def head_copy_moment_bytes(r: ResolvedPlan, frozen_head_cast: int) -> int:
    """What a trainable head copy keeps while the standard loss's head matmul runs backward, beside the logits'
    gradient: its saved input (:func:`head_copy_saved_bytes`) and, on a kbit-prepared base, the frozen head weight's
    cast (``frozen_head_cast``: memory.lm_head_cast_bytes(r)). It writes its gradient then, once nll_loss's and
    log_softmax's fp32 gradients are freed (phases.py ``_head_moment`` takes the larger moment)."""
    if not head_trains_as_copy(r):
        return 0
    return head_copy_saved_bytes(r, frozen_head_cast) + frozen_head_cast


DORA_TERMS = KnobTerms("use_dora", block_saved=_dora_block_saved, adapter_forward=dora_forward_transient_bytes)
SAVED_COPY_TERMS = KnobTerms("modules_to_save", loss_saved=head_copy_saved_bytes,
                             loss_backward=head_copy_loss_backward_bytes, head_gradient=head_copy_grad_bytes,
                             head_moment=head_copy_moment_bytes)
