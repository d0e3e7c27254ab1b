"""The LitGPT stack (``framework: litgpt``): where LitGPT 0.5.13's fine-tuning step differs from transformers'.

Read from LitGPT 0.5.13 (litgpt/model.py, litgpt/lora.py, litgpt/utils.py ``chunked_cross_entropy``,
litgpt/finetune/lora.py and full.py ``fit``) and Lightning 2.6 (``HalfPrecision.convert_output``), and measured
tensor by tensor under fake tensors with LitGPT's own code (benchmarks/validation/litgpt_fake.py):

- **The loss.** ``fit`` calls ``model(input_ids, lm_head_chunk_size=128)``: the head runs on 128-token chunks, and
  Fabric's bf16-true precision converts every chunk the wrapped module returns to fp32, so the step's logits are a
  list of fp32 chunks, 4·T·V in all (:func:`logits_bytes`). ``chunked_cross_entropy`` runs ``F.cross_entropy`` per
  chunk (each keeps its fp32 log-softmax output, 4·B·(S-1)·V in all). ``fit`` keeps the list in a local until the
  next step's forward returns, so one list is alive through the whole step, the optimizer step included
  (:func:`held_logits_bytes`), and two at the end of a forward.
- **The block.** Grouped-query attention expands k and v to every head before scaled_dot_product_attention
  (``k.expand(...)``, saved by the kernel: 2·a·T·(q_dim - kv_dim) more than transformers' native GQA); without it,
  v is a view of the fused qkv output, which the kernel's saved v then keeps whole (a·T·(q_dim + 2·kv_dim)); the rotary
  embedding ends in ``torch.cat``, so o_proj's input is a copy of the kernel's output (memory.o_proj_input_copy_bytes,
  as for Phi-3); an RMSNorm whose weight trains keeps its fp32 normalized input (``x_normed * weight.float()``),
  4·T·H where transformers keeps a·T·H; LoRA on the fused qkv linear (``LoRAQKVLinear``) drops out its input once,
  not once per adapted projection, and keeps lora_B's output (a·T·(sum of the adapted outputs)) and its int64 index
  for ``index_copy``.
- **The model.** An ``lm_head`` of its own even where the checkpoint ties it (estimator/resolved.py), every parameter
  in bf16 with no autocast, torch AdamW (foreach on CUDA), no activation checkpointing (refused by the plan).
"""

from __future__ import annotations

from .allocator import round_block
from .knob_terms import BlockPart, KnobTerms
from .resolved import ResolvedPlan

# litgpt/finetune/lora.py and full.py fit(): model(input_ids, lm_head_chunk_size=128)
LM_HEAD_CHUNK = 128


def _chunks(seq_len: int) -> list[int]:
    """The token counts of the head's chunks of one row (the last may be shorter)."""
    full, rest = divmod(seq_len, LM_HEAD_CHUNK)
    return [LM_HEAD_CHUNK] * full + ([rest] if rest else [])


def logits_bytes(r: ResolvedPlan) -> int:
    """One step's logits: the fp32 chunks Fabric returns, 4·B·c·V each (c = 128, the last shorter)."""
    b, v = r.plan.batch_size, r.spec.vocab_size
    return sum(round_block(4 * b * c * v) for c in _chunks(r.plan.seq_len))


def held_logits_bytes(r: ResolvedPlan) -> int:
    """The logits list ``fit`` holds from one forward until the next returns: alive at every moment of a step."""
    return logits_bytes(r) if r.loss_implementation == "litgpt" else 0


def log_softmax_bytes(r: ResolvedPlan) -> int:
    """What cross_entropy keeps per chunk for backward, its fp32 log-softmax output: 4·B·c·V, the last chunk one
    position shorter (``logits[-1] = logits[-1][..., :-1, :]``)."""
    b, v = r.plan.batch_size, r.spec.vocab_size
    chunks = _chunks(r.plan.seq_len)
    chunks[-1] -= 1
    return sum(round_block(4 * b * c * v) for c in chunks if c > 0)


def bf16_logits_bytes(r: ResolvedPlan) -> int:
    """The head's chunks as the model returns them, in the compute dtype: Fabric converts the returned list to fp32
    (``apply_to_collection``) while that list is still referenced, so at the end of a forward both exist: a·T·V."""
    b, v = r.plan.batch_size, r.spec.vocab_size
    return sum(round_block(r.act_bytes * b * c * v) for c in _chunks(r.plan.seq_len))


def softcap_bytes(r: ResolvedPlan) -> int:
    """A model that softcaps its logits (Gemma 2: ``do_softcapping``, ``torch.tanh(x / thresh) * thresh``, per
    chunk in litgpt/model.py) keeps each chunk's tanh output for backward: a·T·V until the loss's backward."""
    return bf16_logits_bytes(r) if r.spec.final_logit_softcapping else 0


def chunk_backward_bytes(r: ResolvedPlan) -> int:
    """A chunk's backward: nll_loss's and log_softmax's fp32 gradients (2 x 4·B·c·V) and the cast back to bf16
    (a·B·c·V) for the head's matmul."""
    c = min(LM_HEAD_CHUNK, r.plan.seq_len)
    b, v = r.plan.batch_size, r.spec.vocab_size
    return 2 * round_block(4 * b * c * v) + round_block(r.act_bytes * b * c * v)


def block_deltas(r: ResolvedPlan, layer: int) -> dict[BlockPart, int]:
    """What a LitGPT block saves beyond transformers' block of the same plan (memory.block_saved_parts), by part;
    nothing under another framework."""
    if r.framework != "litgpt":
        return {}
    spec, t, a = r.spec, r.tokens, r.act_bytes
    parts = dict.fromkeys((BlockPart.ATTENTION, BlockPart.NORMS, BlockPart.ADAPTER_INPUTS), 0)
    if spec.num_kv_heads != spec.num_heads:  # k and v expanded to every head, and kept by the kernel
        parts[BlockPart.ATTENTION] += 2 * (round_block(a * t * spec.q_dim) - round_block(a * t * spec.kv_dim))
    else:  # v is a view of the fused qkv output, which the kernel's saved v keeps whole
        parts[BlockPart.ATTENTION] += (round_block(a * t * (spec.q_dim + 2 * spec.kv_dim))
                                       - round_block(a * t * spec.kv_dim))
    if r.full and not spec.model_type.startswith("gemma"):  # fp32 normalized input instead of its a-byte output
        widths = [spec.hidden_size] * spec.norms_per_layer
        if spec.qk_norm != "none":  # Qwen3's and OLMo2's q/k norms train too
            widths += [spec.q_dim, spec.kv_dim]
        parts[BlockPart.NORMS] += sum(round_block(4 * t * w) - round_block(a * t * w) for w in widths)
    qkv = [lin for lin in spec.attention_linears()[:-1] if r.adapted(lin)]
    if qkv:
        width = qkv[0].in_features
        if r.plan.lora_dropout > 0:  # one dropout (bool mask and dropped copy) for the fused linear, not one each
            parts[BlockPart.ADAPTER_INPUTS] -= (len(qkv) - 1) * (round_block(t * width) + round_block(a * t * width))
        outs = sum(lin.out_features for lin in qkv)
        parts[BlockPart.ADAPTER_INPUTS] += round_block(a * t * outs) + round_block(8 * outs)  # lora_B out, index
    return parts


def rope_cache_bytes(r: ResolvedPlan) -> int:
    """LitGPT's cos and sin: fp32 buffers of max_seq_length (set to the sequence) x the rotary width, which every
    block reads as views (transformers instead makes a·T·head_dim copies per forward)."""
    return 2 * round_block(4 * r.plan.seq_len * r.spec.head_dim)


# registered with the memory terms like a knob's (memory.KNOB_TERMS): the block kind's own saved tensors
LITGPT_BLOCK_TERMS = KnobTerms("framework litgpt", block_saved=block_deltas)
