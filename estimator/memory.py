"""The memory model: one function per component of a training step's GPU memory.

Each function takes a :class:`ResolvedPlan` and returns bytes on one GPU. Its docstring states the
formula, where it comes from and what it assumes. Notation: T = batch_size x S tokens (S = seq_len, plus the
image tokens of a vision-language model), H =
hidden size, I = MLP width, V = vocabulary, L = layers, r = LoRA rank, a = bytes per activation
element of the compute dtype. ``docs/memory_model.md`` repeats every formula.

In the code (here, phases.py, sharding.py, peft_memory.py, trainer_memory.py) the parameter ``r`` is the
:class:`ResolvedPlan`, never the LoRA rank: the rank is ``r.plan.lora_r`` and only the formulas in docstrings
call it r. The short name stays because every formula reads ``r.tokens``, ``r.act_bytes``, ``r.spec`` many
times a line (docs/architecture.md says why it was not renamed).

How they combine into a peak is :mod:`canifinetune.estimator.phases`.
"""

from __future__ import annotations

from . import axolotl_memory, litgpt_memory, moe_adapter_memory, peft_memory, torchtune_memory, vision_memory
from .allocator import round_block
from .constants import DTYPE_BYTES, constant
from .inventory import inventory_of
from .knob_terms import BlockPart, KnobTerms
from .resolved import ResolvedPlan
from .spec import LinearSpec
from .tensor_records import Role

# Every knob's transient terms (estimator/knob_terms.py): the terms below fold over them. A knob that adds memory for
# part of a step appends its KnobTerms here (its static tensors go to inventory.BUILDERS).
KNOB_TERMS: tuple[KnobTerms, ...] = (
    peft_memory.DORA_TERMS,
    peft_memory.SAVED_COPY_TERMS,
    moe_adapter_memory.EXPERT_ADAPTER_TERMS,
    litgpt_memory.LITGPT_BLOCK_TERMS,
    torchtune_memory.TORCHTUNE_BLOCK_TERMS,
)

# what the lora_adapters component holds: everything that trains beside a frozen base
ADAPTER_ROLES = (Role.ADAPTER, Role.EXPERT_ADAPTER, Role.SAVED_COPY, Role.DORA_MAGNITUDE)

# ---------------------------------------------------------------------------
# Static memory: alive for the whole step


def quantized_linears(r: ResolvedPlan) -> list[tuple[LinearSpec, int]]:
    """Block linear layers bitsandbytes replaces, with how many blocks hold each (every ``nn.Linear``
    but lm_head; MoE experts are fused 3-D parameters that transformers' bitsandbytes integration
    leaves unquantized)."""
    if r.quantization == "none":
        return []
    return [(lin, n) for i, n in r.spec.layer_groups for lin in r.spec.layer_linears(i)]


def weight_bytes(r: ResolvedPlan) -> int:
    """Stored model weights: the inventory's base and quantized weights (estimator/inventory.py).

    Unquantized: every parameter x bytes of the weight dtype (fp32 master weights when precision is
    'mixed'). 4-bit (bitsandbytes Params4bit): each block linear's weight packs two 4-bit codes per
    byte, ceil(n/2) bytes; 8-bit (Int8Params): one byte per weight, each rounded to the allocator block.
    Embeddings, lm_head, norms, biases and MoE experts stay in the weight dtype, or in fp32 after peft's
    prepare_model_for_kbit_training (``r.frozen_dtype``: peft/utils/other.py 0.21 casts every bf16/fp16
    parameter whose class is not Params4bit to fp32). Counts come from :class:`ModelSpec`, tensor by tensor.
    """
    return inventory_of(r).bytes_of(Role.BASE_WEIGHT, Role.QUANTIZED_WEIGHT, Role.BUFFER)


def quantization_constant_bytes(r: ResolvedPlan) -> int:
    """Quantization state of the quantized linears (the inventory's QUANTIZATION_STATE records).

    4-bit (bitsandbytes QuantState): one fp32 absmax per NF4_BLOCKSIZE (64) weights and the 16-entry
    fp32 code. With double quantization the absmax are stored as uint8 with one fp32 absmax per
    NF4_DOUBLE_QUANT_BLOCKSIZE (256) of them, a 256-entry fp32 code and an fp32 offset (QLoRA, Dettmers
    et al. 2023, sec. 3: 0.5 -> 0.127 bits per parameter). 8-bit: one fp32 scale per output row
    (INT8_ROW_STAT_BYTES). Each tensor is rounded to the allocator's 512-byte block.
    """
    return inventory_of(r).bytes_of(Role.QUANTIZATION_STATE)


def adapter_bytes(r: ResolvedPlan) -> int:
    """LoRA adapter weights and what trains beside them (the inventory's trainable records but the base's).

    r x (in + out) per adapted linear, in the adapter dtype, plus PEFT's ParamWrapper adapters on fused
    MoE experts (per block r_gu·E·(H + 2I) on gate_up_proj, r·E·(I + H) on down_proj, r·(H + E) on the
    router; estimator/moe_adapters.py), a V x H copy per modules_to_save entry and DoRA's out_features
    magnitude vector per adapted linear (estimator/peft_memory.py), each tensor rounded to the allocator's
    block. PEFT 0.21 (get_peft_model, autocast_adapter_dtype=True) keeps adapters in fp32 on an unquantized
    bf16/fp16 base; TRL 1.16's SFTTrainer casts them to bf16 on a quantized base.
    """
    return inventory_of(r).bytes_of(*ADAPTER_ROLES)


def gradient_bytes(r: ResolvedPlan) -> int:
    """Gradients of the trainable parameters, in the parameter's dtype (autograd accumulates
    ``.grad`` in the dtype of the leaf): the inventory's trainable records, each in its own dtype."""
    return inventory_of(r).bytes_of(Role.GRADIENT)


def optimizer_state_bytes(r: ResolvedPlan) -> int:
    """Optimizer states for the trainable parameters (a fold over the inventory's trainable records).

    - adamw_torch_fused / adamw_torch: exp_avg and exp_avg_sq in the parameter's dtype
      (torch.optim.AdamW uses zeros_like(param)), 2 x bytes per param, plus one fp32 step counter
      per tensor (512 bytes each after rounding).
    - adamw_bnb_8bit / paged_adamw_8bit: two uint8 states with one fp32 absmax per
      BNB_8BIT_STATE_BLOCKSIZE (256) elements; tensors under BNB_8BIT_MIN_SIZE (4096) keep fp32
      states (bitsandbytes Optimizer2State). Paged states live in CUDA unified memory: they count on
      the GPU while it has room and are evicted to host memory under pressure, so counting them is the
      safe side.
    - paged_adamw_32bit: two fp32 states (bitsandbytes keeps 32-bit states in fp32).
    - adafactor (transformers.Adafactor as Trainer builds it: beta1=None, factored): a row and a
      column second-moment vector per matrix, a full-size one per vector, counted in the bytes of the
      plan's trainable dtype (``r.trainable_bytes_per_param``).
    - sgd: torch.optim.SGD as Trainer builds it (lr only, momentum 0) keeps no state.
    """
    return inventory_of(r).bytes_of(Role.OPTIMIZER_STATE)  # records: estimator/inventory.py optimizer_state_records


def optimizer_step_temporary_bytes(r: ResolvedPlan) -> int:
    """Memory the optimizer step allocates and frees.

    - adamw_torch (foreach): torch's _multi_tensor_adamw computes sqrt(exp_avg_sq) for all
      parameters of a group at once (torch/optim/adamw.py: exp_avg_sq_sqrt = torch._foreach_sqrt), a
      temporary the size of the trainable parameters in their dtype, plus a same-size
      ``_foreach_add``/div intermediate that reuses it; one model-sized buffer is counted.
    - adamw_torch_fused: the fused CUDA kernel updates in place: nothing.
    - bitsandbytes optimizers: in-place kernels: nothing.
    - adafactor: transformers' Adafactor (optimization.py, Adafactor.step) works on one parameter at a
      time in fp32. For a bf16/fp16 parameter it keeps ``grad = p.grad.float()`` and
      ``p_data_fp32 = p.float()`` for the whole update, and each of its three out-of-place steps
      allocates a new fp32 tensor while the previous one is still referenced: ``grad**2`` then ``+ eps``;
      ``update`` then ``_approx_sq_grad(...)`` (a full-size outer product) replacing it; ``update`` then
      ``-update`` for ``p_data_fp32.add_(-update)``. So four fp32 copies of the largest trainable tensor
      are alive at once. For an fp32 parameter ``.float()`` returns the tensor itself: two copies.
    - sgd: in place.
    Also the gradient-norm clipping Trainer runs before the step (max_grad_norm=1.0) allocates only
    per-tensor scalars.
    """
    optim = r.plan.optim
    if optim == "adamw_torch":
        return inventory_of(r).trainable_bytes
    if optim == "adafactor":
        largest = max(rec.elements for rec in inventory_of(r).trainable)
        # the largest may be a modules_to_save copy, in its own dtype
        copies = 2 if _largest_trainable_bytes_per_param(r) == DTYPE_BYTES["fp32"] else 4
        return copies * round_block(largest * 4)
    return 0


def _largest_trainable_bytes_per_param(r: ResolvedPlan) -> int:
    """bytes per parameter of the largest trainable tensor (Adafactor upcasts it to fp32: two or four copies): a
    modules_to_save copy's when it is at least as large as the largest LoRA matrix, else the trainable dtype's."""
    copies = inventory_of(r).of(Role.SAVED_COPY)
    if r.full or not copies:
        return r.trainable_bytes_per_param
    lora_largest = max((rec.elements for rec in inventory_of(r).of(Role.ADAPTER)), default=0)
    if copies[0].elements >= lora_largest:
        return DTYPE_BYTES[copies[0].dtype]
    return r.trainable_bytes_per_param


# ---------------------------------------------------------------------------
# Activations: saved in forward, freed in backward


def residual_bytes(r: ResolvedPlan) -> int:
    """Bytes per element of the residual stream (embedding output, block inputs and outputs, the final
    norm's input): ``r.residual_dtype``. After prepare_model_for_kbit_training the embedding weight is
    fp32, so its output is fp32, and every residual add (fp32 + 16-bit) stays fp32; otherwise the
    compute dtype."""
    return DTYPE_BYTES[r.residual_dtype]


def quantized_output_bytes(r: ResolvedPlan) -> int:
    """Bytes per element of a quantized linear's output: bitsandbytes' Linear4bit.forward
    (bitsandbytes/nn/modules.py 0.50) casts its input to the compute dtype and its result back to the
    input's dtype (``.to(inp_dtype)``), so a block linear fed by the fp32 residual stream of a
    kbit-prepared model returns fp32 (the gated MLP's gate, up and their product then are fp32 too);
    otherwise the compute dtype."""
    return residual_bytes(r) if r.quantization != "none" else r.act_bytes


def _consumer_saved_bytes(r: ResolvedPlan, linears: tuple[LinearSpec, ...]) -> int:
    """What linears reading one shared input keep for backward (:func:`_consumer_parts`, summed)."""
    return sum(_consumer_parts(r, linears, BlockPart.MLP).values())


def _consumer_parts(r: ResolvedPlan, linears: tuple[LinearSpec, ...], home: BlockPart) -> dict[BlockPart, int]:
    """What linears reading one shared input keep for backward, by part: the input once if any base weight trains
    (``home``: the attention's or the MLP's) or is 8-bit (INT8_INPUTS), or the block's own tensor lora_A keeps on a
    frozen base (ADAPTER_INPUTS); plus each adapter's own saved tensors (dropout mask, its input copy in the compute
    dtype, the rank-r intermediate: ADAPTER_INPUTS)."""
    plan = r.plan
    t = r.tokens
    a = r.act_bytes
    width = linears[0].in_features
    parts = dict.fromkeys((home, BlockPart.INT8_INPUTS, BlockPart.ADAPTER_INPUTS), 0)
    if r.full:
        # under mixed precision the shared input is an fp32 norm output, which autocast casts for each linear
        # separately (a cast of a non-leaf is not cached), and each linear saves its own copy (cohort v17 l09)
        copies = len(linears) if r.fp32_weight_casts else 1
        parts[home] += copies * round_block(a * t * width)
    elif r.quantization == "int8":
        parts[BlockPart.INT8_INPUTS] += round_block(_int8_input_bytes(r, linears[0]) * t * width)
    else:
        parts[BlockPart.ADAPTER_INPUTS] += lora_own_input_bytes(r, linears)
    saved = 0
    for lin in linears:
        if not r.adapted(lin):
            continue
        if plan.lora_dropout > 0:
            saved += round_block(t * lin.in_features)  # bool dropout mask
            saved += round_block(a * t * lin.in_features)  # dropped-out input, cast to compute dtype
        elif r.adapter_dtype != r.compute_dtype:
            saved += round_block(a * t * lin.in_features)  # input cast to fp32 then autocast to a
        saved += round_block(a * t * plan.lora_r)  # lora_A output, kept by lora_B
    parts[BlockPart.ADAPTER_INPUTS] += saved
    return parts


def _reads_block_tensor(r: ResolvedPlan) -> bool:
    """Whether PEFT hands lora_A the block's own tensor: no dropout (``nn.Identity``) and adapters in the compute
    dtype (PEFT 0.21 ``lora.Linear.forward`` casts x to lora_A's dtype only when they differ)."""
    return r.plan.lora_dropout == 0 and r.adapter_dtype == r.compute_dtype


def lora_own_input_bytes(r: ResolvedPlan, linears: tuple[LinearSpec, ...]) -> int:
    """What lora_A keeps of a shared input on a frozen base that keeps nothing itself (4-bit, or 16-bit: autograd
    saves a matmul's input only for its weight's gradient).

    With no dropout and adapters in the compute dtype, lora_A saves the block's own tensor (a norm output for
    q/k/v and gate/up, the attention output for o_proj, the MLP product for down_proj): once per shared input when
    it is already in the adapters' dtype, else one cast copy per adapter (``_cast_input_dtype``). Measured under fake
    tensors (issue 24: Qwen2.5-0.5B QLoRA, all-linear, no dropout, no checkpointing: -14.9% without it)."""
    adapted = [lin for lin in linears if r.adapted(lin)]
    if not adapted or not _reads_block_tensor(r):
        return 0
    width = linears[0].in_features
    if _int8_input_bytes(r, linears[0]) == r.act_bytes:
        return round_block(r.act_bytes * r.tokens * width)
    return len(adapted) * round_block(r.act_bytes * r.tokens * width)


def _int8_input_bytes(r: ResolvedPlan, lin: LinearSpec) -> int:
    """Bytes per element of an 8-bit linear's input, which bitsandbytes' MatMul8bitLt keeps: o_proj reads the
    attention output (compute dtype), down_proj the MLP product (:func:`quantized_output_bytes`), the others a norm's
    output, in the residual stream's dtype (fp32 after prepare_model_for_kbit_training: fp32 norm weights)."""
    spec = r.spec
    if lin == spec.attention_linears()[-1]:
        return r.act_bytes
    if lin == spec.dense_mlp_linears()[-1]:
        return quantized_output_bytes(r)
    return residual_bytes(r)


def int8_kept_input_bytes(r: ResolvedPlan, layer: int) -> int:
    """What one block's 8-bit linears keep beyond activation checkpointing.

    bitsandbytes 0.50.2 ``MatMul8bitLt.forward`` (autograd/_functions.py), the matmul ``Linear8bitLt`` runs on CUDA,
    keeps its input as a plain attribute, ``ctx.tensors = (CAt, subA, A)``, whenever the input requires grad, not
    through ``save_for_backward``. Non-reentrant checkpointing discards and recomputes only saved tensors (its
    saved-tensor hooks never see a ctx attribute; bitsandbytes issue #2034 describes the same for MatMul4Bit's
    weight), so every 8-bit linear's input stays alive from the block's first forward to its backward: the attention
    input (shared by q/k/v), o_proj's input, the MLP input (shared by gate/up) and down_proj's input. Measured under
    fake tensors (cohort v7: Qwen2.5-0.5B at 1024 x 2 with checkpointing holds these 24 x 30.9 MB more)."""
    if r.quantization != "int8":
        return 0
    spec = r.spec
    t = r.tokens
    attn = spec.attention_linears()
    kept = round_block(_int8_input_bytes(r, attn[0]) * t * attn[0].in_features)
    kept += round_block(_int8_input_bytes(r, attn[-1]) * t * attn[-1].in_features)
    if not spec.is_moe_layer(layer):
        mlp = spec.dense_mlp_linears()
        kept += round_block(_int8_input_bytes(r, mlp[0]) * t * mlp[0].in_features)
        kept += round_block(_int8_input_bytes(r, mlp[-1]) * t * mlp[-1].in_features)
    return kept


def down_proj_saved_bytes(r: ResolvedPlan, layer: int) -> int:
    """What a dense block's down_proj keeps for backward (the MLP product when its weight trains or is
    8-bit, its adapter's tensors when adapted); for an MoE block the experts' product when their
    weights train (full) and 0 otherwise (expert adapters: moe_adapter_memory.expert_adapter_backward_bytes)."""
    spec = r.spec
    if spec.is_moe_layer(layer):
        if not r.full:
            return 0
        moe = spec.moe
        assert moe is not None
        return round_block(r.act_bytes * r.tokens * moe.top_k * moe.expert_intermediate)
    return _consumer_saved_bytes(r, (spec.dense_mlp_linears()[-1],))


def layer_activation_bytes(r: ResolvedPlan, layer: int) -> int:
    """Tensors one decoder block saves for backward when it is not checkpointed.

    Walks the block as transformers 5 runs it (RMSNorm -> q/k/v -> RoPE -> attention -> o_proj ->
    residual -> RMSNorm -> gated MLP -> residual) and counts what autograd keeps:

    - each RMSNorm keeps its fp32 upcast input, 4·T·H (``hidden_states.to(float32)`` saved by ``pow``
      and the multiply), and, when its weight trains, the normalized a·T·H; Gemma's norm also keeps
      the fp32 normalized tensor.
    - a linear whose weight trains keeps its input (a·T·in, shared by linears reading the same
      tensor); a frozen linear keeps nothing (bitsandbytes' 4-bit matmul keeps only the packed
      weight), except an 8-bit one, which keeps its input.
    - each LoRA adapter keeps the dropout mask (1 byte·T·in when lora_dropout > 0), its own copy of
      the input in the compute dtype (a·T·in; none when it can reuse the block's tensor: no dropout
      and no dtype cast), and the rank-r intermediate a·T·r.
    - attention with flash or memory-efficient kernels keeps q, k, v and the output (a·T·(2·q_dim +
      2·kv_dim)) and an fp32 log-sum-exp per head and token; the math path (eager) also keeps the fp32
      softmax output and its cast, (4 + a)·B·heads·S², plus the tanh output a·B·heads·S² when the model
      softcaps attention scores (Gemma2), and k/v expanded to every head.
    - RoPE keeps only cos/sin (shared by all layers, counted once in :func:`shared_activation_bytes`);
      q/k norms (Qwen3, Gemma3, OLMo2) keep their fp32 inputs.
    - the gated MLP keeps gate (saved by SiLU), act and up (saved by the product), and the product
      when down_proj trains: 3 or 4 · a·T·I; an MoE block does this for top_k x T routed tokens with
      the expert width, plus the router logits.

    Source: the saved-tensor analysis of Korthikanti et al. 2022 ("Reducing Activation Recomputation
    in Large Transformer Models", sec. 4.1) redone for transformers' Llama-family blocks, flash
    attention (no s² term) and frozen bases.
    """
    return sum(block_saved_parts(r, layer).values())


def block_saved_parts(r: ResolvedPlan, layer: int) -> dict[BlockPart, int]:
    """What one block of the kind starting at ``layer`` saves for backward, by part (:class:`BlockPart`): its
    norms, its attention, its dense MLP or its MoE layer, the LoRA adapters' own tensors, what 8-bit linears keep
    and DoRA's. Each part is described once here; a new block kind (a vision tower's) is another description."""
    spec = r.spec
    h = spec.hidden_size
    parts = dict.fromkeys(BlockPart, 0)
    # input RMSNorm, post-attention RMSNorm (Gemma2/3 also pre-/post-feedforward norms, OLMo2 post-norms only)
    parts[BlockPart.NORMS] += spec.norms_per_layer * _norm_saved_bytes(r, h, r.full)
    _add(parts, _attention_parts(r))
    if spec.is_moe_layer(layer):
        parts[BlockPart.MOE] += _moe_activation_bytes(r)
    else:
        _add(parts, _mlp_parts(r, spec.dense_mlp_linears(), spec.intermediate_size, r.tokens))
    parts[BlockPart.WEIGHT_CASTS] += weight_cast_bytes(r, layer)
    for knob in KNOB_TERMS:  # DoRA's results and weight copies, expert adapters' merged weights, LitGPT's block, ...
        _add(parts, knob.block_saved(r, layer))
    return parts


def _add(parts: dict[BlockPart, int], more: dict[BlockPart, int]) -> None:
    for part, size in more.items():
        parts[part] += size


def _norm_saved_bytes(r: ResolvedPlan, width: int, trainable: bool) -> int:
    """An RMSNorm's saved tensors: its fp32 upcast input, and the normalized output when its weight trains
    (Gemma's norm keeps it in fp32)."""
    t = r.tokens
    saved = round_block(4 * t * width)  # fp32 upcast input
    if r.spec.model_type.startswith("gemma"):
        saved += round_block(4 * t * width) if trainable else 0
    elif trainable:  # ``weight * normalized``: an fp32 weight (mixed precision) promotes the product to fp32
        saved += round_block((4 if r.fp32_weight_casts else r.act_bytes) * t * width)
    return saved


def weight_cast_bytes(r: ResolvedPlan, layer: int) -> int:
    """The compute-dtype copies autocast makes of one block's fp32 linear weights (``F.linear`` under torch.autocast
    casts the weight for each matmul), which autograd keeps for the input's gradient until the block's backward:
    a·(the block's linear weights). Under mixed precision (``r.fp32_weight_casts``: fp32 weights held whole on the
    GPU under autocast); measured with LLaMA-Factory's own full fine-tuning step (fp32 weights under bf16 autocast,
    cohort v17: -13.8% without it, no checkpointing). A
    trainable weight's cast is also kept in autocast's cache until the forward returns, with checkpointing too
    (phases.py counts the other blocks' there)."""
    if not r.fp32_weight_casts:
        return 0
    return sum(round_block(r.act_bytes * lin.weight_params) for lin in r.spec.layer_linears(layer))


def _attention_parts(r: ResolvedPlan) -> dict[BlockPart, int]:
    """One block's attention: q/k/v's inputs, q/k norms, the kernel's saved tensors, the mask and o_proj's adapters."""
    spec, plan, t, a, full = r.spec, r.plan, r.tokens, r.act_bytes, r.full
    attn = spec.attention_linears()
    kernels = axolotl_memory.kernel_groups(r)  # Axolotl's LoRA kernels in place of PEFT's adapted projections
    if "qkv" in kernels:
        parts = dict.fromkeys((BlockPart.ATTENTION, BlockPart.INT8_INPUTS), 0) | axolotl_memory.qkv_parts(r)
    else:
        parts = _consumer_parts(r, attn[:-1], BlockPart.ATTENTION)  # q, k, v
    parts[BlockPart.NORMS] = 0
    # q/k norms keep their fp32 inputs
    if spec.qk_norm != "none":
        parts[BlockPart.NORMS] += _norm_saved_bytes(r, spec.q_dim, full) + _norm_saved_bytes(r, spec.kv_dim, full)
    # attention kernel
    kernel = round_block(a * t * spec.q_dim) * 2 + round_block(a * t * spec.kv_dim) * 2
    kernel += round_block(4 * plan.batch_size * spec.num_heads * r.sequence_length)  # log-sum-exp
    if r.attention_kernel == "math":
        # transformers' eager_attention_forward: softmax in fp32 keeps its output (4 bytes a score), the
        # cast back to the compute dtype is kept by the matmul with V (a), and Gemma2's tanh softcap keeps
        # its output too (a); measured on cohort case c40 (Gemma2, eager): exactly these three per layer.
        scores = plan.batch_size * spec.num_heads * r.sequence_length * r.sequence_length
        kernel += round_block(4 * scores) + round_block(a * scores)
        if spec.attn_logit_softcapping:
            kernel += round_block(a * scores)
        if spec.num_kv_heads != spec.num_heads:
            kernel += round_block(a * t * (spec.q_dim - spec.kv_dim)) * 2  # repeat_kv copies
    parts[BlockPart.ATTENTION] += kernel + attention_mask_and_view_bytes(r)
    o_proj = attn[-1]
    copy = o_proj_input_copy_bytes(r)
    if full:
        parts[BlockPart.ATTENTION] += copy  # o_proj trains and saves its input: the copy, when there is one
    # o_proj's adapters: its input is the attention output already counted (or its copy, counted here once)
    if "o" in kernels:
        _add(parts, axolotl_memory.o_parts(r))
    elif r.adapted(o_proj):
        o_parts = _consumer_parts(r, (o_proj,), BlockPart.ATTENTION)
        if r.quantization != "int8" and _reads_block_tensor(r):
            o_parts[BlockPart.ADAPTER_INPUTS] -= round_block(a * t * o_proj.in_features)
            o_parts[BlockPart.ADAPTER_INPUTS] += copy
        _add(parts, o_parts)
    elif r.quantization == "int8" and not full:
        # an unadapted 8-bit o_proj still keeps its input (MatMul8bitLt's ctx.tensors): the kernel's output, counted
        # with the kernel, or its copy, counted here (as int8_kept_input_bytes counts it under checkpointing)
        parts[BlockPart.INT8_INPUTS] += copy
    return parts


def o_proj_input_copy_bytes(r: ResolvedPlan) -> int:
    """o_proj's input as a tensor of its own, a·T·q_dim, where the flash kernel's output is not laid out as o_proj
    reads it; 0 where that input is a view of the kernel's output (counted with the kernel).

    transformers 5.24 reshapes the attention output with ``.transpose(1, 2).contiguous()``. The flash kernel's output
    takes q's layout: after an elementwise rotary (Llama, Qwen, ...) q is a (B, heads, S, D) view of a (B, S, heads, D)
    tensor, so the transpose is contiguous already and no copy is made; Phi-3's rotary ends in ``torch.cat``
    (``spec.rotary_concatenates``), q is contiguous as (B, heads, S, D), and ``.contiguous()`` copies (issue 24 item
    3; measured under fake tensors, cohort v11); so does LitGPT's for every family (resolved._litgpt_model). The
    memory-efficient and math kernels write (B, S, heads, D)."""
    if not (r.spec.rotary_concatenates and r.attention_kernel == "flash"):
        return 0
    return round_block(r.act_bytes * r.tokens * r.spec.q_dim)


def attention_mask_and_view_bytes(r: ResolvedPlan) -> int:
    """What one block's attention saves beyond q, k, v, the output and the log-sum-exp, for two layouts
    read from transformers 5.24 (integrations/sdpa_attention.py, models/phi3/modeling_phi3.py):

    - a 4-D mask (``r.attention_mask``: a whole-model sliding window no longer than the sequence,
      :func:`resolved.sliding_window_mask`): SDPA converts the boolean mask to an additive bias in the
      compute dtype (a·B·S², one per call) that the memory-efficient kernel keeps for backward; and
      ``use_gqa_in_sdpa`` is false with a mask, so for grouped-query attention ``repeat_kv`` expands k
      and v to every head before the kernel, which keeps the copies: 2·a·T·(q_dim - kv_dim) more (none
      with a single k/v head: reshaping the expanded (B, 1, n_rep, S, D) tensor is a view). Gemma3 builds
      the mask for its sliding layers only; it is counted for every block (the safe side).
    - a fused qkv_proj (Phi-3): q, k and v are slices of one output; the kernel keeps v as a view, and
      that keeps the whole a·T·(q_dim + 2·kv_dim) output alive instead of a·T·kv_dim, unless v is
      copied first (repeat_kv for grouped-query attention on the math path or with a mask; or, behind
      a quantized qkv_proj on a kbit-prepared base, the fp32 output cast to the compute dtype by
      autocast).
    """
    spec = r.spec
    plan = r.plan
    a = r.act_bytes
    t = r.tokens
    total = 0
    gqa = spec.num_kv_heads != spec.num_heads
    if r.attention_mask:  # counted for every block, also where only some use the window (Gemma3): the safe side
        total += round_block(a * plan.batch_size * r.sequence_length * r.sequence_length)
        if gqa and spec.num_kv_heads > 1:  # with one k/v head repeat_kv's reshape of the expand is a view
            total += round_block(a * t * (spec.q_dim - spec.kv_dim)) * 2
    v_copied = (gqa and (r.attention_kernel == "math" or r.attention_mask or spec.head_dim > 256)) or (
        quantized_output_bytes(r) != a
    )
    if spec.fused_qkv and not v_copied:
        total += round_block(a * t * (spec.q_dim + 2 * spec.kv_dim)) - round_block(a * t * spec.kv_dim)
    return total


def _mlp_parts(r: ResolvedPlan, linears, width: int, tokens: int) -> dict[BlockPart, int]:
    """A gated MLP: gate/up's inputs, gate (SiLU's input), act and up (the product's inputs), the product when
    down_proj trains, is adapted or is 8-bit."""
    if "mlp" in axolotl_memory.kernel_groups(r):  # Axolotl's LoRA_MLP in place of PEFT's three adapted linears
        return dict.fromkeys((BlockPart.MLP, BlockPart.ADAPTER_INPUTS), 0) | axolotl_memory.mlp_parts(r)
    a = r.act_bytes
    up_in = linears[:-1]
    down = linears[-1]
    parts = _consumer_parts(r, up_in, BlockPart.MLP)
    # gate (SiLU input), act and up (product inputs): fp32 behind quantized linears on a kbit-prepared base
    parts[BlockPart.MLP] += 3 * round_block(quantized_output_bytes(r) * tokens * width)
    if r.full:
        parts[BlockPart.MLP] += round_block(a * tokens * width)  # product, kept by down_proj
    elif r.adapted(down) or r.quantization == "int8":  # an 8-bit down_proj keeps its input (MatMul8bitLt)
        _add(parts, _consumer_parts(r, (down,), BlockPart.MLP))
    return parts


def _moe_activation_bytes(r: ResolvedPlan) -> int:
    """Routed experts: each token's hidden state is gathered top_k times and runs a gated MLP of the
    expert width; the router keeps its fp32 logits/probabilities (T x experts)."""
    spec = r.spec
    moe = spec.moe
    assert moe is not None
    a = r.act_bytes
    t = r.tokens
    routed = t * moe.top_k
    h = spec.hidden_size
    saved = round_block(4 * t * moe.num_experts) * 2  # router logits and softmax (fp32)
    saved += round_block(a * routed * h)  # gathered expert inputs
    width = moe.expert_intermediate
    saved += 3 * round_block(a * routed * width) + (round_block(a * routed * width) if r.full else 0)
    saved += round_block(a * routed * h)  # expert outputs, kept for the routing-weight product
    if moe.shared_intermediate:
        saved += 4 * round_block(a * t * moe.shared_intermediate)
        saved += round_block(a * t * h) * 2  # shared expert output and its sigmoid gate product
    return saved


def shared_activation_bytes(r: ResolvedPlan) -> int:
    """Activations outside the blocks: the embedding output (e·T·H, plus Gemma's sqrt(H)-scaled copy),
    RoPE's cos and sin (2 x e·T·head_dim, shared by all layers; transformers casts them to the hidden
    states' dtype), the final norm (as in a block) and the input ids and labels (int64, 2 x 8·T); for a
    vision-language model what its images keep (estimator/vision_memory.py: the tower's saved inputs under
    checkpointing, the pixel values, the scattered embeddings) and its int64 modality ids and 3-row M-RoPE positions
    (4 x 8·T). e = :func:`residual_bytes` (a, or 4 after prepare_model_for_kbit_training: fp32 embedding)."""
    spec = r.spec
    t = r.tokens
    a = r.act_bytes
    e = residual_bytes(r)
    h = spec.hidden_size
    total = round_block(e * t * h)
    if spec.embed_scale:
        total += round_block(e * t * h)
    if r.framework == "litgpt":  # views of its fp32 rope cache; its final norm keeps the fp32 normalized input
        total += litgpt_memory.rope_cache_bytes(r)
        total += round_block(4 * t * h) + (round_block(4 * t * h) if r.full else 0)
    elif r.framework == "torchtune":  # rotary per block (torchtune_memory); a trained final norm keeps its fp32
        # normalized input, and the head (training) its bf16 output; the recipe's shifted labels are a third int64
        total += round_block(4 * t * h) + (round_block(4 * t * h) + round_block(a * t * h) if r.full else 0)
        total += round_block(8 * t)
    else:
        total += 2 * round_block(e * t * spec.head_dim)
        total += round_block(4 * t * h) + (round_block(a * t * h) if r.full else 0)
    total += 2 * round_block(8 * t)
    if r.images is not None:
        total += vision_memory.vision_saved_bytes(r) + round_block(8 * t) + round_block(3 * 8 * t)
    return total


def checkpoint_boundary_bytes(r: ResolvedPlan) -> int:
    """With gradient checkpointing (non-reentrant, transformers' GradientCheckpointingLayer), each
    block keeps only its input hidden states: e·T·H per layer, e = :func:`residual_bytes` (fp32 after
    prepare_model_for_kbit_training)."""
    return round_block(residual_bytes(r) * r.tokens * r.spec.hidden_size)


# TRL 1.16's and torchtune 0.6.1's OffloadActivations(max_fwd_stash_size=5) (trl/models/activation_offloading.py,
# torchtune/training/_activation_offloading.py): an offloaded tensor's GPU copy stays in the forward stash until five
# more saved tensors have been packed, so the copy to the host has ended before its memory is reused
OFFLOAD_FORWARD_STASH_TENSORS = 5
# In backward a tensor brought back from the host stays in the backward stash until the next autograd node that
# unpacks one has run: the block being back-propagated has its input back, and the block before it may still have
OFFLOAD_BROUGHT_BACK_INPUTS = 2


def offload_stash_bytes(r: ResolvedPlan) -> int:
    """Activation offloading with checkpointing: what stays on the GPU of the offloaded tensors at the end of forward.

    Every tensor saved for backward of at least 1 KiB that is not a parameter is copied to pinned host memory; the
    saved tensors of a checkpointed block are its input hidden states (non-reentrant checkpoint saves them through
    ``_NoopSaveInputs``, so the offload hooks see them; the block's own saved tensors are the checkpoint's). The GPU
    copies of the last OFFLOAD_FORWARD_STASH_TENSORS packed tensors are alive: at most that many block inputs,
    5 x e·T·H (an upper bound: the last packs include the final norm's smaller tensors). The LM head is excluded by
    a NoOpManager, so the loss's tensors stay as they are (counted by the loss terms)."""
    if not r.plan.activation_offloading:
        return 0
    return OFFLOAD_FORWARD_STASH_TENSORS * checkpoint_boundary_bytes(r)


def offload_host_bytes(r: ResolvedPlan) -> int:
    """Activation offloading: the pinned host memory of the offloaded block inputs, every block's e·T·H (the host RAM
    check of the verdict reads it)."""
    if not r.plan.activation_offloading:
        return 0
    return r.spec.num_layers * checkpoint_boundary_bytes(r)


def offload_brought_back_bytes(r: ResolvedPlan) -> int:
    """Activation offloading in backward: the block inputs brought back from the host while a block is recomputed and
    back-propagated, OFFLOAD_BROUGHT_BACK_INPUTS x e·T·H (its own, and the previous block's until the next unpacking
    node's hook frees it)."""
    if not r.plan.activation_offloading:
        return 0
    return OFFLOAD_BROUGHT_BACK_INPUTS * checkpoint_boundary_bytes(r)


# ---------------------------------------------------------------------------
# Transient memory: alive during part of one phase


def loss_forward_bytes(r: ResolvedPlan) -> int:
    """What the loss keeps from forward to backward.

    chunked (TRL 1.16 fused LM head, trl/trainer/utils.py add_fused_lm_head): the final hidden
    states of the N = B·(S-1) scored positions, copied contiguous (a·N·H), and seven fp32 per-token
    statistics. standard (transformers ForCausalLMLoss): the logits a·T·V (held by the model output until
    the trainer's compute_loss returns: :func:`standard_logits_bytes`) and log_softmax's fp32 output 4·T·V
    (saved for backward); the fp32 upcast it was taken of is freed
    once log_softmax has run (:func:`loss_forward_transient_bytes`). A model that softcaps its logits
    (Gemma2: ``logits = tanh(logits / cap) * cap`` in transformers 5.24 modeling_gemma2.py) also keeps
    tanh's output for its backward, another a·T·V (found on cohort v2 case v23, where three T x V
    compute-dtype tensors were live at the peak: the logits, tanh's output and autocast's head copy).
    """
    spec = r.spec
    n = r.scored_tokens
    a = r.act_bytes
    if r.loss_implementation == "chunked":
        return round_block(a * n * spec.hidden_size) + 8 * round_block(4 * n)
    if r.loss_implementation == "litgpt":  # the new step's fp32 logit chunks beside the held ones (litgpt_memory)
        return litgpt_memory.logits_bytes(r) + litgpt_memory.softcap_bytes(r)
    if r.loss_implementation == "torchtune":  # the bf16 chunk list and every chunk's fp32 log-softmax output
        return torchtune_memory.logits_bytes(r) + torchtune_memory.log_softmax_bytes(r)
    t = r.tokens
    softcap = round_block(a * t * spec.vocab_size) if spec.final_logit_softcapping else 0
    # + what a knob keeps there (a trainable modules_to_save head's input and cast: peft_memory.SAVED_COPY_TERMS)
    cast = lm_head_cast_bytes(r)
    return (round_block(a * t * spec.vocab_size) + softcap + round_block(4 * t * spec.vocab_size)
            + sum(knob.loss_saved(r, cast) for knob in KNOB_TERMS))


def standard_logits_bytes(r: ResolvedPlan) -> int:
    """The standard loss's logits in the compute dtype, a·T·V (0 for the chunked head, where they never exist).

    They are alive through the loss forward and die before its backward: transformers 5.24's
    ``Trainer.compute_loss`` (and TRL 1.16's, which calls it or returns its own loss alone) returns only the loss,
    so the model output that holds them, and accelerate's fp32 copy of them, are freed when it returns; autograd
    keeps only log_softmax's output (measured: a real Trainer.training_step under fake tensors, cohort v11)."""
    if r.loss_implementation == "torchtune":  # _loss_step deletes the chunk list before backward
        return torchtune_memory.logits_bytes(r)
    if r.loss_implementation != "standard":
        return 0
    return round_block(r.act_bytes * r.tokens * r.spec.vocab_size)


def loss_backward_start_bytes(r: ResolvedPlan) -> int:
    """What the loss holds when its backward starts: what its forward keeps (:func:`loss_forward_bytes`, with
    autocast's head-weight cast) less the logits the trainer has freed (:func:`standard_logits_bytes`), plus the
    loss's own gradients (:func:`loss_backward_bytes`). Standard loss: log_softmax's fp32 output and the two fp32
    gradients, 12·T·V (plus tanh's output for a softcapping model); the LM head's gradient comes later, in the head
    matmul's backward (phases.py ``_head_moment``)."""
    if r.loss_implementation == "litgpt":  # the held list and each chunk's log-softmax output, a chunk's gradients
        return litgpt_memory.log_softmax_bytes(r) + litgpt_memory.softcap_bytes(r) + loss_backward_bytes(r)
    return (loss_forward_bytes(r) + lm_head_cast_bytes(r) - standard_logits_bytes(r)) + loss_backward_bytes(r) - (
        offloaded_softcap_bytes(r))


def offloaded_softcap_bytes(r: ResolvedPlan) -> int:
    """TRL's activation offloading under the standard loss: a softcapping model's tanh output, a·T·V, is not on the
    GPU when the loss's backward starts.

    TRL 1.16's SFTTrainer enters its offloader around the whole training step, compute_loss and backward included, so
    the loss's saved tensors go through it too. The tanh of the softcapped logits is packed before log_softmax's
    output and nll_loss's tensors, so it has left the forward stash (OFFLOAD_FORWARD_STASH_TENSORS) by the end of
    forward; it comes back for tanh's own backward, after log_softmax's fp32 tensors are freed. log_softmax's output
    stays: nll_loss saves it a second time and TRL keeps a storage saved twice on the GPU. Measured: cohort v27 o06
    (Gemma-2-2B LoRA 4096 x 2, standard loss): the backward 3.9 GiB (a·T·V) below the estimate without this term.
    torchtune's offloader covers the forward only (and its loss is its own chunked one): nothing there."""
    if not (r.plan.activation_offloading and r.framework == "trl" and r.loss_implementation == "standard"
            and r.spec.final_logit_softcapping):
        return 0
    return round_block(r.act_bytes * r.tokens * r.spec.vocab_size)


def held_logits_bytes(r: ResolvedPlan) -> int:
    """Logits a training loop holds through the whole step (0 but for LitGPT: litgpt_memory.held_logits_bytes)."""
    return litgpt_memory.held_logits_bytes(r)


def lm_head_cast_bytes(r: ResolvedPlan) -> int:
    """The compute-dtype copy of an fp32 lm_head weight that autocast makes for the head's matmul.

    After prepare_model_for_kbit_training the (unquantized) lm_head weight is fp32; under bf16/fp16
    autocast ``F.linear`` casts it to the compute dtype (not cached: the weight does not require grad)
    and autograd keeps that copy to form the gradient of the head's input: a·V·H from the head's
    forward until its backward (the same lifetime as the loss's tensors). 0 when the head weight is
    already in the compute dtype, when there is no autocast, or when the head trains (full fine-tuning).
    """
    # TRL's fused LM head (the chunked loss) multiplies vocabulary tiles: autocast casts each slice and frees it
    if r.loss_implementation == "chunked":
        return 0
    return head_weight_cast_bytes(r)


def head_weight_cast_bytes(r: ResolvedPlan) -> int:
    """The compute-dtype copy of an fp32 head weight that autocast makes when the head runs as one matmul over the
    whole vocabulary (the standard loss; ORPO's full logits, trainer_memory.py), kept for the input's gradient: a·V·H,
    or 0 when the head is already in the compute dtype, without autocast, or where the sharding engine holds the
    module in the compute dtype."""
    if not r.autocast or r.plan.sharding not in ("none", "ddp"):
        return 0
    head_dtype = r.weight_dtype if r.full else r.frozen_dtype
    if head_dtype == r.compute_dtype:
        return 0
    return round_block(r.act_bytes * r.spec.vocab_size * r.spec.hidden_size)


def loss_backward_bytes(r: ResolvedPlan) -> int:
    """Extra memory while the loss and LM head run backward (on top of :func:`loss_forward_bytes`).

    chunked: one [min(N, TRL_TOKEN_CHUNK), TRL_VOCAB_CHUNK] tile in the compute dtype, the fp32
    gradient of the hidden states (4·N·H) and, when the head trains, an fp32 head gradient (4·V·H)
    with its cast to the weight dtype. standard: nll_loss's fp32 gradient and log_softmax's input
    gradient (2 x 4·T·V), both alive at once; the cast back to the compute dtype comes after the
    first is freed.
    """
    spec = r.spec
    a = r.act_bytes
    if r.loss_implementation == "chunked":
        n = r.scored_tokens
        tile = min(n, int(constant("TRL_TOKEN_CHUNK"))) * min(spec.vocab_size, int(constant("TRL_VOCAB_CHUNK")))
        total = round_block(a * tile) + round_block(4 * n * spec.hidden_size) + round_block(a * n * spec.hidden_size)
        if r.full:
            total += round_block(4 * spec.vocab_size * spec.hidden_size)
            if r.weight_bytes_per_param != 4:  # its cast to an fp32 weight's dtype is the gradient itself (v18 m04)
                total += round_block(r.weight_bytes_per_param * spec.vocab_size * spec.hidden_size)
        total += sum(knob.loss_backward(r) for knob in KNOB_TERMS)  # a modules_to_save head's fp32 gradient, cast
        return total
    if r.loss_implementation == "litgpt":  # one chunk at a time (litgpt_memory.chunk_backward_bytes)
        return litgpt_memory.chunk_backward_bytes(r)
    if r.loss_implementation == "torchtune":  # one chunk at a time, as LitGPT's
        return torchtune_memory.chunk_backward_bytes(r)
    t = r.tokens
    return 2 * round_block(4 * t * spec.vocab_size)


def loss_forward_transient_bytes(r: ResolvedPlan) -> int:
    """Peak extra memory inside the loss forward: for the chunked head one logits tile (compute dtype);
    for the standard loss the fp32 upcast of the logits (4·T·V) while log_softmax writes its output
    (accelerate's fp32 copy of the returned logits is the same size and comes after it is freed); for LitGPT the
    head's chunks in the compute dtype while Fabric converts them to fp32."""
    spec = r.spec
    if r.loss_implementation == "litgpt":  # the head's bf16 chunks while Fabric converts them to fp32
        return litgpt_memory.bf16_logits_bytes(r)
    if r.loss_implementation == "torchtune":  # one chunk's fp32 upcast while its log-softmax is written
        return torchtune_memory.chunk_upcast_bytes(r)
    if r.loss_implementation != "chunked":
        return round_block(4 * r.tokens * spec.vocab_size)
    n = r.scored_tokens
    tile = min(n, int(constant("TRL_TOKEN_CHUNK"))) * min(spec.vocab_size, int(constant("TRL_VOCAB_CHUNK")))
    return round_block(r.act_bytes * tile)


def layer_backward_transient_bytes(r: ResolvedPlan, layer: int) -> int:
    """Gradients in flight inside one block's backward (beyond its saved activations).

    Through a gated MLP, autograd holds the incoming gradient of the product and produces those of act,
    up and gate before the ones it consumed are freed: about three a·T·I tensors, plus the gradient of
    the block input from two or three consumers (2 x a·T·H). By then down_proj's backward has run and
    released what it saved (:func:`down_proj_saved_bytes`), which is subtracted. Through attention the flash backward
    adds dq, dk, dv (a·T·(q_dim+2·kv_dim)) and an fp32 dq accumulator (4·T·q_dim). The larger of the MLP and
    attention figure counts. For a frozen quantized base, the 4-bit weight is dequantized to the compute
    dtype again for the input gradient (the largest quantized linear, :func:`dequantization_bytes`).
    """
    spec = r.spec
    t = r.tokens
    a = r.act_bytes
    h = spec.hidden_size
    if spec.is_moe_layer(layer):
        moe = spec.moe
        assert moe is not None
        width_tokens = t * moe.top_k * moe.expert_intermediate
    else:
        width_tokens = t * spec.intermediate_size
    q = quantized_output_bytes(r)  # the MLP's tensors and their gradients: fp32 on a kbit-prepared base
    e = residual_bytes(r)
    mlp = 3 * round_block(q * width_tokens) + 2 * round_block(e * t * h) - down_proj_saved_bytes(r, layer)
    mlp += sum(knob.mlp_backward(r, layer) for knob in KNOB_TERMS)  # expert adapters' merged-weight gradients
    attn = round_block(a * t * spec.q_dim) + 2 * round_block(a * t * spec.kv_dim) + round_block(4 * t * spec.q_dim)
    attn += 2 * round_block(e * t * h)
    return max(mlp, attn, eager_softmax_backward_bytes(r))


def eager_softmax_backward_bytes(r: ResolvedPlan) -> int:
    """The math (eager) attention's softmax backward, beyond the block's saved tensors (0 for flash/SDPA kernels).

    transformers' ``eager_attention_forward`` runs ``softmax(scores, dtype=float32).to(query.dtype)`` then a matmul
    with V. Back-propagating it: the matmul's backward gives the probabilities' gradient (a·B·heads·S²) and frees the
    saved low-precision probabilities; ``.to()``'s backward upcasts that gradient to fp32 (4·B·heads·S²);
    ``_softmax_backward_data`` then writes the scores' gradient in the input's dtype (a·B·heads·S²) while the saved
    fp32 probabilities (counted with the saved tensors) are still alive. Net over the saved tensors: 4·B·heads·S²,
    with dv (a·T·kv_dim) and the block input's gradients (2·e·T·H) alive beside it (torch 2.13 autograd formulas,
    derivatives.yaml ``_softmax`` / ``_to_copy``; issue 24 item 4: -15% at 2048 x 2 with checkpointing without it)."""
    if r.attention_kernel != "math":
        return 0
    plan, spec, t = r.plan, r.spec, r.tokens
    scores = plan.batch_size * spec.num_heads * r.sequence_length * r.sequence_length
    return (round_block(4 * scores) + round_block(r.act_bytes * t * spec.kv_dim)
            + 2 * round_block(residual_bytes(r) * t * spec.hidden_size))


def adapter_forward_transient_bytes(r: ResolvedPlan) -> int:
    """What a LoRA adapter allocates and frees while its block runs forward (again during checkpoint
    recomputation), for the widest adapted linear.

    PEFT's Linear.forward casts the input to the adapter dtype (``x.to(fp32)``: 4·T·in for fp32
    adapters) and applies dropout to it (native_dropout's fp32 output, another 4·T·in, when
    lora_dropout > 0) before autocast casts it to the compute dtype for lora_A (that copy is saved and
    counted in the activations). On a frozen base the block tensor feeding the linear (a·T·in, e.g. the
    MLP product feeding down_proj) is alive then too, though nothing saves it.
    """
    if r.adapter_dtype is None:
        return 0
    widest = 0
    for i, _ in r.spec.layer_groups:
        for lin in r.adapted_linears(i):
            widest = max(widest, lin.in_features)
    if not widest:
        return 0
    # a knob's own work in the adapted linear comes on top (DoRA's weight norm: peft_memory.DORA_TERMS)
    knobs = sum(knob.adapter_forward(r) for knob in KNOB_TERMS)
    t = r.tokens
    total = round_block(r.act_bytes * t * widest)
    if r.adapter_dtype != r.compute_dtype:
        per = DTYPE_BYTES[r.adapter_dtype]
        total += round_block(per * t * widest)
        if r.plan.lora_dropout > 0:
            total += round_block(per * t * widest)
    return total + knobs


def dequantization_bytes(r: ResolvedPlan) -> int:
    """bitsandbytes dequantizes a 4-bit weight to the compute dtype for each matmul (gemm_4bit with
    more than one token: F.dequantize_4bit then a dense matmul), in forward and again for the input
    gradient in backward (:func:`backward_dequantization_bytes`): one transient copy of the largest quantized linear,
    a·out·in. 8-bit: the largest 8-bit matmul's forward temporaries (:func:`int8_matmul_transient_bytes`)."""
    linears = [lin for lin, _ in quantized_linears(r)]
    if not linears:
        return 0
    if r.quantization == "int8":
        return max(int8_matmul_transient_bytes(r, lin) for lin in linears)
    return round_block(r.act_bytes * max(lin.weight_params for lin in linears))


def backward_dequantization_bytes(r: ResolvedPlan) -> int:
    """What a frozen quantized linear allocates for its input gradient: the weight dequantized to the compute dtype,
    a·out·in for the largest (4-bit: ``dequantize_4bit`` as in forward; 8-bit: ``MatMul8bitLt.backward``'s
    ``CB.to(dtype_A, copy=True)``)."""
    linears = [lin for lin, _ in quantized_linears(r)]
    if not linears:
        return 0
    return round_block(r.act_bytes * max(lin.weight_params for lin in linears))


def int8_matmul_transient_bytes(r: ResolvedPlan, lin: LinearSpec) -> int:
    """What one 8-bit linear's forward (again in checkpoint recomputation) allocates and frees beyond its input and
    output (bitsandbytes 0.50.2, autograd/_functions.py ``MatMul8bitLt.forward`` and the CUDA ops of
    backends/cuda/ops.py): the int8 input and its fp32 row scales (1·T·in + 4·T), then ``int8_scaled_mm``'s int32
    product (``int8_linear_matmul``, 4·T·out) and ``int8_mm_dequant``'s fp16 output (2·T·out), alive together while
    it is cast to the compute dtype. Measured under fake tensors (cohort v14 i04: Phi-3-mini with checkpointing, its
    largest transient the 4·T·out int32 product of gate_up_proj in the recomputation)."""
    t = r.tokens
    return (round_block(t * lin.in_features) + round_block(4 * t) + round_block(4 * t * lin.out_features)
            + round_block(2 * t * lin.out_features))


def workspace_bytes(r: ResolvedPlan) -> int:
    """cuBLAS workspace (CUBLAS_WORKSPACE_BYTES, allocated through the caching allocator on first use)."""
    return int(constant("CUBLAS_WORKSPACE_BYTES"))


# ---------------------------------------------------------------------------
# Beyond torch's allocated bytes


def allocator_overhead_bytes(peak_allocated: int) -> int:
    """Reserved minus allocated: the caching allocator's rounding and fragmentation.
    max(ALLOCATOR_OVERHEAD_FRACTION x peak allocated, ALLOCATOR_OVERHEAD_MIN_BYTES) (an allowance;
    see the calibration file for its source)."""
    return int(max(constant("ALLOCATOR_OVERHEAD_FRACTION") * peak_allocated, constant("ALLOCATOR_OVERHEAD_MIN_BYTES")))


def cuda_context_bytes() -> int:
    """The CUDA context and loaded kernels: in nvidia-smi's figure, in neither torch counter
    (CUDA_CONTEXT_BYTES)."""
    return int(constant("CUDA_CONTEXT_BYTES"))


def safety_margin_bytes(total: int) -> int:
    """Headroom on top of the process total: max(SAFETY_MARGIN_FRACTION x total, SAFETY_MARGIN_MIN_BYTES)."""
    return int(max(constant("SAFETY_MARGIN_FRACTION") * total, constant("SAFETY_MARGIN_MIN_BYTES")))
