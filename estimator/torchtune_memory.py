"""The torchtune stack (``framework: torchtune``): where torchtune 0.6.1's single-device step differs from
transformers'.

Read from torchtune 0.6.1 (recipes/lora_finetune_single_device.py, full_finetune_single_device.py, modules/attention.py,
modules/rms_norm.py, modules/transformer.py, modules/peft/lora.py, modules/loss/ce_chunked_output_loss.py,
models/qwen2/_component_builders.py, models/qwen2/_positional_embeddings.py, models/llama3_1/_position_embeddings.py)
and torchao 0.15.0 (dtypes/nf4tensor.py), and measured tensor by tensor under fake tensors with torchtune's own
recipes (benchmarks/validation/torchtune_fake.py):

- **The model.** Built under ``training.set_default_dtype(bf16)``: every parameter, LoRA's A/B included, is bf16, with
  no autocast and no fp32 master weights; AdamW's states follow the parameters (bf16). RoPE is a module with fp32
  buffers of the model's ``max_seq_len``: Qwen2's ``cache`` is [max_seq_len, 2·head_dim] (cos and sin of the doubled
  angles), Llama 3's [max_seq_len, head_dim/2, 2]; the full builders share one module, but ``lora_qwen2`` builds one
  per layer inside ``lora_qwen2_self_attention`` (:func:`rope_cache_records`).
- **The block.** Grouped-query attention expands k and v to every query head before scaled_dot_product_attention
  (``k.unsqueeze(2).expand(...).flatten(1, 2)``: copies, which the kernel keeps); ``RMSNorm`` runs
  ``F.rms_norm(x.float(), weight=bf16 scale)``, so a norm whose weight trains keeps its fp32 normalized input
  (4·T·H where transformers keeps a·T·H); rotary embedding and LoRA (``F.linear(x, W) + scale·lora_b(lora_a(x))``, no
  dropout in the shipped YAMLs, no casts) keep what transformers' and PEFT's do (:func:`block_deltas`).
- **The loss.** ``CEWithChunkedOutputLoss`` (8 chunks): the decoder returns the head's output as a list of bf16 logit
  chunks (``chunked_output``: the hidden states split along the sequence, ``torch.chunk``), all alive until the loss
  has run; each chunk is upcast to fp32 for ``F.cross_entropy`` one at a time, and each keeps its fp32 log-softmax
  output for backward; ``_loss_step`` deletes the list before backward (:func:`logits_bytes`,
  :func:`log_softmax_bytes`, :func:`chunk_backward_bytes`). The labels are shifted by one with an ignored last
  position, so all S positions of a row run the head.
- **QLoRA.** The base linears' weights are torchao ``NF4Tensor``: two 4-bit codes a byte, an int8 scaler per 64
  weights and the scalers' bf16 quantization factors (:func:`nf4_state_bytes`); the weight is dequantized to bf16 for
  each matmul, forward and backward, as bitsandbytes' is.
"""

from __future__ import annotations

import math

from .allocator import round_block
from .constants import DTYPE_BYTES
from .knob_terms import BlockPart, KnobTerms
from .resolved import ResolvedPlan
from .tensor_records import Role, TensorRecord

# modules/loss/ce_chunked_output_loss.py CEWithChunkedOutputLoss(num_output_chunks=8); the recipes call
# model.set_num_output_chunks(self._loss_fn.num_output_chunks)
NUM_OUTPUT_CHUNKS = 8
# torchao 0.15.0 to_nf4(weight, block_size=64, scaler_block_size=256) (torchtune's FrozenNF4Linear and linear_nf4)
NF4_BLOCK_SIZE = 64
NF4_SCALER_BLOCK_SIZE = 256


def _chunk_lengths(seq_len: int) -> list[int]:
    """The sequence lengths of the hidden states' chunks: ``torch.chunk(h, 8, dim=1)`` makes chunks of
    ceil(S/8) positions, the last shorter, and fewer than 8 where S is small."""
    size = math.ceil(seq_len / NUM_OUTPUT_CHUNKS)
    full, rest = divmod(seq_len, size)
    return [size] * full + ([rest] if rest else [])


def chunks(r: ResolvedPlan) -> int:
    """How many chunks the head runs on (fewer than 8 on very short sequences)."""
    return len(_chunk_lengths(r.plan.seq_len))


def logits_bytes(r: ResolvedPlan) -> int:
    """The decoder's list of logit chunks, in the compute dtype: a·B·c·V each, alive from the head until the loss has
    run (``_loss_step`` deletes it before backward)."""
    b, v = r.plan.batch_size, r.spec.vocab_size
    return sum(round_block(r.act_bytes * b * c * v) for c in _chunk_lengths(r.plan.seq_len))


def log_softmax_bytes(r: ResolvedPlan) -> int:
    """What ``F.cross_entropy`` keeps per chunk for backward: its fp32 log-softmax output, 4·B·c·V."""
    b, v = r.plan.batch_size, r.spec.vocab_size
    return sum(round_block(4 * b * c * v) for c in _chunk_lengths(r.plan.seq_len))


def chunk_upcast_bytes(r: ResolvedPlan) -> int:
    """``logits.float()`` of the largest chunk, alive while cross_entropy's log-softmax writes its output."""
    b, v = r.plan.batch_size, r.spec.vocab_size
    return round_block(4 * b * _chunk_lengths(r.plan.seq_len)[0] * v)


def chunk_backward_bytes(r: ResolvedPlan) -> int:
    """A chunk's backward: nll_loss's and log_softmax's fp32 gradients (2 x 4·B·c·V) and the cast back to bf16
    (a·B·c·V) for the head's matmul."""
    b, v = r.plan.batch_size, r.spec.vocab_size
    c = _chunk_lengths(r.plan.seq_len)[0]
    return 2 * round_block(4 * b * c * v) + round_block(r.act_bytes * b * c * v)


def head_backward_moment(r: ResolvedPlan, head_grad: int) -> tuple[int, int]:
    """(loss bytes, head-gradient bytes) while a trained head's matmuls run backward, after the loss's.

    Every chunk's cross-entropy runs backward before any chunk's head matmul (the loss's nodes are created after all
    of the head's, and autograd runs the latest first), freeing each log-softmax output and leaving each chunk's bf16
    logits gradient; then the head matmuls consume those one by one, and autograd sums their weight gradients in the
    weight's input buffer before AccumulateGrad runs, out of place: the sum so far, a chunk's new gradient and their
    new sum, three V x H at the second chunk, beside the seven chunks' gradients not yet consumed. Measured: torchtune's
    full step holds exactly three V x H and the bf16 chunk gradients at its peak (cohort v20; Qwen2.5-7B was -1.55%
    with one counted at the loss's moment)."""
    lengths = _chunk_lengths(r.plan.seq_len)
    b, v, a = r.plan.batch_size, r.spec.vocab_size, r.act_bytes
    if len(lengths) == 1:
        return round_block(a * b * lengths[0] * v), head_grad
    # the last chunk (the shortest) is consumed first: the others' gradients remain at the second matmul
    return sum(round_block(a * b * c * v) for c in lengths[:-1]), 3 * head_grad


def block_deltas(r: ResolvedPlan, layer: int) -> dict[BlockPart, int]:
    """What a torchtune block saves beyond transformers' block of the same plan (memory.block_saved_parts), by part;
    nothing under another framework."""
    if r.framework != "torchtune":
        return {}
    spec, t, a = r.spec, r.tokens, r.act_bytes
    parts = dict.fromkeys((BlockPart.ATTENTION, BlockPart.NORMS), 0)
    if spec.num_kv_heads != spec.num_heads:  # k and v expanded to every head, and kept by the kernel
        parts[BlockPart.ATTENTION] += 2 * (round_block(a * t * spec.q_dim) - round_block(a * t * spec.kv_dim))
    if r.full:  # a trained norm keeps its fp32 normalized input instead of an a-byte output
        parts[BlockPart.NORMS] += spec.norms_per_layer * (round_block(4 * t * spec.hidden_size)
                                                          - round_block(a * t * spec.hidden_size))
    return parts


def rope_cache_records(r: ResolvedPlan) -> list[TensorRecord]:
    """torchtune's RoPE buffers (fp32, built for the model's max_seq_len, config.json's max_position_embeddings):
    Qwen2's ``cache`` [L, 2·head_dim] and ``theta`` [head_dim/2] per module, one module per layer in the Qwen2 LoRA
    builders and one shared elsewhere; Llama 3's ``cache`` [L, head_dim/2, 2] and ``theta``, one shared module."""
    if r.framework != "torchtune":
        return []
    spec = r.spec
    length, hd = spec.max_position_embeddings or 0, spec.head_dim
    qwen = spec.model_type == "qwen2"
    modules = spec.num_layers if (qwen and not r.full) else 1
    cache_cols = 2 * hd if qwen else hd
    return [TensorRecord(Role.BUFFER, "rope.cache", length, cache_cols, modules, "fp32", False,
                         round_block(4 * length * cache_cols)),
            TensorRecord(Role.BUFFER, "rope.theta", hd // 2, 1, modules, "fp32", False, round_block(4 * (hd // 2)))]


def nf4_state_bytes(weight_params: int) -> int:
    """One NF4Tensor's state beside its packed codes (torchao 0.15.0 ``NF4Tensor.from_tensor``): an int8 scaler per
    64 weights (``quantized_scalers``); the scalers' quantization factors, a bf16 view of a [n_scaler_blocks, 256]
    tensor whose whole storage it keeps (``quantization_factor[:, 0]`` of ``256 / (2 * scaler_absmax.expand(...))``);
    the bf16 scaler mean and the 16-entry bf16 NF4 table."""
    scalers = weight_params // NF4_BLOCK_SIZE
    return (round_block(scalers) + round_block(DTYPE_BYTES["bf16"] * scalers)
            + round_block(DTYPE_BYTES["bf16"]) + round_block(16 * DTYPE_BYTES["bf16"]))


# registered with the memory terms like a knob's (memory.KNOB_TERMS): the block kind's own saved tensors
TORCHTUNE_BLOCK_TERMS = KnobTerms("framework torchtune", block_saved=block_deltas)
