"""A vision-language model's memory beyond its language model: the image tokens the language model reads, the vision
tower's weights, what the tower's forward leaves for backward, and the pixel values (issue 26).

Read from transformers 5.24 (models/qwen2_5_vl/modeling_qwen2_5_vl.py, models/llava/modeling_llava.py,
models/clip/modeling_clip.py, models/gemma3/modeling_gemma3.py, models/siglip/modeling_siglip.py,
modeling_utils.enable_input_require_grads)
and TRL 1.16 (trainer/sft_trainer.py DataCollatorForVisionLanguageModeling), and measured by TRL's own SFTTrainer on
each family's transformers model class under fake tensors (benchmarks/validation/vlm_fake.py): exploratory runs on
Qwen2.5-VL-3B, then cohort v21; exploratory runs on llava-1.5-7b, then cohort v22; exploratory runs on gemma-3-4b-it,
then cohort v26.

What the measurements show, for a vision tower that does not train (the default of VLM recipes):

- the language model runs on ``seq_len`` text tokens plus each image's tokens (its placeholders and the two markers
  the chat template writes around them): as a text model of that length, to within 10 MB at 1,454 tokens;
- the tower's weights, in the weight dtype;
- without gradient checkpointing the tower builds no graph (its parameters are frozen and its input, the pixel
  values, needs no gradient): only its forward's temporaries, gone before the language model's peak;
- with gradient checkpointing, transformers' ``enable_input_require_grads`` (which PEFT's and Trainer's checkpointing
  set up) hooks the input embeddings of every sub-model, the tower's patch embedding included: the tower's output
  then requires grad, every tower block is a checkpointed layer and keeps its input until the end of backward, and
  the merger keeps its own (:func:`tower_saved_bytes`);
- the collator's pixel values (fp32) live through the step; the language model's input embeddings are copied once
  when the image features are scattered into them.

Llama 3.2 Vision (Mllama) reads its images differently: one <|image|> token each in the text, and 4 tiles x 1,601
vision states that cross-attention layers inside the language model read (:func:`cross_attention_layer_extra_bytes`);
its tower's layers are not checkpointing layers, so with checkpointing the hooked frozen tower keeps every activation
(:func:`_mllama_tower_saved_bytes`). Exploratory runs on Llama-3.2-90B-Vision (and the same config cut to 10 text
layers), then cohort v28.

Only what was measured is estimated: Qwen2-VL, Qwen2.5-VL, Qwen3-VL (and -MoE), LLaVA-1.5 and -NeXT, Gemma 3,
Llama 3.2 Vision and Idefics3/SmolVLM; the vision tower frozen, adapted by LoRA (with checkpointing) or trained in
full fine-tuning (with checkpointing; Llama 3.2 Vision's since cohort v41, :func:`_mllama_trained_tower_bytes`); LoRA,
QLoRA (every linear but the LM head in 4 bits, the tower's too) or full fine-tuning of the language model (LLaVA's,
Gemma 3's and Mllama's projectors trained with it) on one GPU with TRL's SFT trainer. Everything else about images is
refused by name (estimator/vision_images.py ``check_images``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .allocator import round_block
from .constants import DTYPE_BYTES
from .packed_weights import packed_weight_record, quantization_state_bytes
from .tensor_records import Role, TensorRecord
from .vision_spec import IDEFICS3_TYPES, UNCHECKPOINTED_TOWER_TYPES

if TYPE_CHECKING:
    from .resolved import ResolvedPlan

# What DataCollatorForVisionLanguageModeling returns (TRL 1.16): the processor's float32 pixel values
PIXEL_VALUES_DTYPE = "fp32"
# Qwen3VLVisionModel names no input-embedding layer, so enable_input_require_grads' hook does not reach it
UNHOOKED_TOWER_TYPES = ("qwen3_vl", "qwen3_vl_moe")
# The language model's input embeddings with the image features scattered in (masked_scatter makes a new tensor)
SCATTERED_EMBEDDING_COPIES = 1


def projector_trains(r: ResolvedPlan) -> bool:
    """Whether the projector trains: in full fine-tuning, when it sits outside the vision tower (LLaVA's
    multi_modal_projector trains with the language model; Qwen-VL's merger is part of the frozen tower module), or
    with the tower itself (``vision_tower: full``)."""
    vision = r.spec.vision
    if vision is None or r.plan.method != "full":
        return False
    if r.plan.vision_tower == "full":
        return True
    tower = vision.tower.module_path
    return not any(path == tower or path.startswith(tower + ".") for path in vision.projector.module_paths)


def tower_trains(r: ResolvedPlan) -> bool:
    """Whether the vision tower's own weights train: ``vision_tower: full`` in full fine-tuning (build_vlm leaves
    the whole model trainable then)."""
    return r.spec.vision is not None and r.plan.method == "full" and r.plan.vision_tower == "full"


def vision_weight_records(r: ResolvedPlan) -> list[TensorRecord]:
    """The vision tower's and projector's parameters (estimator/vision_spec.py, tensor by tensor): the tower trained
    where :func:`tower_trains`, else frozen, the projector trained where :func:`projector_trains`; unrounded, as the
    language model's base weights are. A group's modules are identical: one record per parameter of one, ``count``
    tensors.

    On a quantized base (QLoRA) every tower and projector ``nn.Linear`` weight is packed like the language model's,
    with its quantization state: transformers' bitsandbytes quantizer converts every Linear but the LM head, and
    neither TRL 1.16 nor these model classes name vision modules to skip (measured: cohort v24). Norms,
    convolutions, learned positions and biases stay in the frozen dtype. Mllama's language model holds parameters a
    Llama of its size does not (``language_model_extra_params``: the cross-attention layers' q/k norms and gates,
    embed_tokens' 8 extra rows): one record, trained in full fine-tuning like the rest of the language model."""
    vision = r.spec.vision
    if vision is None:
        return []
    from .vision_spec import _join

    quantized = r.quantization != "none"
    dtype = r.frozen_dtype if quantized else r.weight_dtype
    trains = projector_trains(r)
    out: list[TensorRecord] = []
    for group in vision.tower.groups + vision.projector.groups:
        packed: set[str] = set()
        for lin in group.linears if quantized else ():
            name = f"{group.path}.{lin.name}"
            packed.add(_join(lin.name, "weight"))
            out.append(packed_weight_record(lin, name, None, group.count, r.quantization))
            out.append(TensorRecord(Role.QUANTIZATION_STATE, name, lin.out_features, 1, group.count, "mixed", False,
                                    quantization_state_bytes(lin, r.quantization, r.plan.bnb_4bit_use_double_quant,
                                                             False)))
        group_trains = tower_trains(r) or (trains and group in vision.projector.groups)
        out += [TensorRecord(Role.BASE_WEIGHT, f"{group.path}.{name}", shape[0], math.prod(shape) // shape[0],
                             group.count, dtype, group_trains, math.prod(shape) * DTYPE_BYTES[dtype], None)
                for name, shape in group.module_parameter_shapes() if name not in packed]
    if vision.language_model_extra_params:  # Mllama's norms, gates and embedding rows: train with the language model
        extra = vision.language_model_extra_params
        out.append(TensorRecord(Role.BASE_WEIGHT, "language_model.extra", extra, 1, 1, dtype, r.full,
                                extra * DTYPE_BYTES[dtype], None))
    return out


def vision_adapter_records(r: ResolvedPlan) -> list[TensorRecord]:
    """With ``vision_tower: lora``, lora_A (r x in) and lora_B (out x r) on every ``nn.Linear`` of the tower and its
    projector (PEFT's ``all-linear`` reaches them all), in the adapter dtype, trained; none otherwise."""
    vision = r.spec.vision
    if vision is None or r.plan.vision_tower != "lora" or r.adapter_dtype is None:
        return []
    per, rank, dtype = DTYPE_BYTES[r.adapter_dtype], r.plan.lora_r, r.adapter_dtype
    out = []
    for group in vision.tower.groups + vision.projector.groups:
        for lin in group.linears:
            name = f"{group.path}.{lin.name}"
            out.append(TensorRecord(Role.ADAPTER, f"{name}.lora_A", rank, lin.in_features, group.count, dtype, True,
                                    round_block(rank * lin.in_features * per), None))
            out.append(TensorRecord(Role.ADAPTER, f"{name}.lora_B", lin.out_features, rank, group.count, dtype, True,
                                    round_block(rank * lin.out_features * per), None))
    return out


def tower_saved_bytes(r: ResolvedPlan) -> int:
    """What the vision tower and its projector keep for backward, from their forward to the end of backward.

    Without gradient checkpointing the frozen tower builds no graph (frozen parameters, pixel values that need no
    gradient); with it, ``enable_input_require_grads`` hooks the tower's patch embedding, its output requires grad and
    every tower block is a checkpointed layer that keeps its input. Family by family (:func:`_qwen_tower_saved_bytes`,
    :func:`_llava_tower_saved_bytes`)."""
    images, vision = r.images, r.spec.vision
    if images is None or vision is None:
        return 0
    if not r.plan.gradient_checkpointing and r.plan.vision_tower != "frozen" and vision.model_type in UNCHECKPOINTED:
        return _uncheckpointed_tower_saved_bytes(r)
    if vision.model_type in ("llava", "llava_next"):
        return _llava_tower_saved_bytes(r)
    if vision.model_type == "gemma3":
        return _gemma3_tower_saved_bytes(r)
    if vision.model_type == "mllama":
        return _mllama_tower_saved_bytes(r) + cross_attention_kept_bytes(r)
    if vision.model_type in IDEFICS3_TYPES:
        return _idefics3_tower_saved_bytes(r)
    if vision.model_type in UNHOOKED_TOWER_TYPES:
        # Qwen3VLVisionModel names no input-embedding layer (no _input_embed_layer: get_input_embeddings finds none),
        # so enable_input_require_grads hooks nothing in it: the frozen tower and its mergers stay out of the graph
        # with checkpointing too (measured: exploratory plans and cohort v23); its own adapters, or its own trained
        # weights, put it in the graph
        return _qwen3_tower_lora_saved_bytes(r) if r.plan.vision_tower != "frozen" else 0
    return _qwen_tower_saved_bytes(r) if r.plan.gradient_checkpointing else 0


def _micro_batch_positions(r: ResolvedPlan) -> int:
    """N: the vision tower's positions over the micro-batch's images (patches, and a CLS position where it has one)."""
    assert r.images is not None
    return r.images.patches_per_sample * r.plan.batch_size


def _tower_tensor_bytes(r: ResolvedPlan, width: int) -> int:
    """One N x ``width`` tensor of the tower in the weight dtype (a block input, an MLP activation)."""
    return round_block(_micro_batch_positions(r) * width * DTYPE_BYTES[r.weight_dtype])


def _qwen_tower_saved_bytes(r: ResolvedPlan) -> int:
    """Qwen2.5-VL and Qwen2-VL with checkpointing (measured on Qwen2.5-VL-3B at 1280x720, 4,784 patches, and on
    Qwen2-VL-2B): each of its ``depth`` blocks keeps its input, N x W in the weight dtype; the merger keeps its norm's
    input (Qwen2.5-VL's Qwen2_5_VLRMSNorm upcasts it to fp32, N x W x 4; Qwen2-VL's LayerNorm keeps it in the weight
    dtype), its GELU's input (N/4 x 4W) and one more N x W tensor; the blocks' rotary cos and sin are kept in fp32
    (N x head_dim each). N = patches of the micro-batch, W = the tower's width."""
    assert r.images is not None and r.spec.vision is not None
    tower = r.spec.vision.tower
    patches = _micro_batch_positions(r)
    width_bytes = _tower_tensor_bytes(r, tower.hidden_size)
    blocks = tower.num_layers * width_bytes
    norm = DTYPE_BYTES["fp32"] if r.spec.vision.model_type == "qwen2_5_vl" else DTYPE_BYTES[r.weight_dtype]
    merger = round_block(patches * tower.hidden_size * norm) + 2 * width_bytes
    rotary = 2 * round_block(patches * tower.head_dim * DTYPE_BYTES["fp32"])
    return blocks + merger + rotary + _merger_lora_inputs(r, patches, tower.hidden_size)


def _merger_lora_inputs(r: ResolvedPlan, patches: int, width: int) -> int:
    """With ``vision_tower: lora``, what the lora_A of each of a Qwen merger's two linears keeps: the dropout's output
    and its bool mask (a·N·W + N·W) when lora_dropout > 0, else the linear's own input (a·N·W); N x W in total over
    the merged rows (N/4 x 4W). Measured on Qwen2.5-VL-3B (exploratory, 2 x 1920x1080: +166 MB, then cohort v25)."""
    if r.plan.vision_tower != "lora":
        return 0
    unit = round_block(patches * width * DTYPE_BYTES[r.weight_dtype])
    return 2 * (unit + (round_block(patches * width) if r.plan.lora_dropout > 0 else 0))


def _qwen3_tower_lora_saved_bytes(r: ResolvedPlan) -> int:
    """Qwen3-VL with LoRA on its tower, or the tower trained (checkpointing on: either without it is refused), N
    patches of width W:
    each of the ``depth`` blocks keeps its input (N x W); each of the 1 + len(deepstack) mergers keeps its GELU's
    input (N x W in total, 4W wide over N/4 rows) and, per adapted linear (fc1, fc2), the tensor its lora_A reads:
    the dropout's output and its bool mask (a·N·W + N·W) when lora_dropout > 0, else the linear's own input
    (a·N·W); the main merger also keeps its LayerNorm's input, the last block's output (the deepstack mergers read
    block outputs the next block keeps already); the rotary cos and sin in fp32 (N x head_dim each). Measured on
    Qwen3-VL-8B (exploratory 1280x720, then cohort v25)."""
    assert r.images is not None and r.spec.vision is not None
    tower = r.spec.vision.tower
    patches = _micro_batch_positions(r)
    unit = _tower_tensor_bytes(r, tower.hidden_size)
    # a trained merger (vision_tower full) also keeps its linears' inputs for their weights' gradients: the norm's
    # output for linear_fc1 and the GELU's output for linear_fc2, N x W each over the merged rows
    trained = 2 * unit if tower_trains(r) else 0
    per_merger = unit + _merger_lora_inputs(r, patches, tower.hidden_size) + trained
    mergers = 1 + len(tower.deepstack_layers)
    rotary = 2 * round_block(patches * tower.head_dim * DTYPE_BYTES["fp32"])
    return tower.num_layers * unit + mergers * per_merger + unit + rotary


def _llava_tower_saved_bytes(r: ResolvedPlan, block: int | None = None) -> int:
    """LLaVA-1.5 (transformers 5.24 models/llava/modeling_llava.py, models/clip/modeling_clip.py; measured by cohort
    v22), per image of N positions (patches and CLS) of width W and N' image tokens of the text width H:

    * with checkpointing, each of the tower's ``depth`` CLIP layers keeps its input (N x W) and ``pre_layrnorm`` its
      own (N x W); the projector, whose input now requires grad, keeps its GELU's input and output (2 x N' x H; on a
      4-bit base its GELU's input only, N' x H);
    * without it, a frozen projector (LoRA) keeps nothing, a trained one (full fine-tuning) keeps its linear_1 input
      (a view of the feature layer's output, N x W), its GELU's input and output (2 x N' x H);
    * with ``vision_tower: lora``, the projector's adapters also keep what their lora_A reads (:func:`_lora_input_bytes`
      over N' rows of W for linear_1 and of H for linear_2) and lora_A's output (measured on llava-v1.6-vicuna-7b,
      exploratory: the dropped-out copies and masks live through the step).

    The feature layer's output is a checkpointed layer's input already: linear_1's saved view adds nothing then.
    LLaVA-NeXT runs every crop of an image through the tower (N = crops x 577) and the projector maps every crop's
    features (N' = crops x 576, ImageFacts.projected_per_image) before they are unpadded into the image tokens."""
    assert r.images is not None and r.spec.vision is not None
    tower = r.spec.vision.tower
    images = r.images.images_per_sample * r.plan.batch_size
    element = DTYPE_BYTES[r.weight_dtype]
    positions = round_block(r.images.patches_per_image * tower.hidden_size * element)
    # a 16-bit projector keeps its GELU's input and output; on a 4-bit base (QLoRA) its linears are bitsandbytes'
    # MatMul4Bit, which keeps only the packed weight: the GELU's input alone
    kept = 1 if r.quantization != "none" else 2
    rows = r.images.projected_per_image or r.images.image_tokens_per_image
    projector = kept * round_block(rows * r.spec.hidden_size * element)
    if r.plan.vision_tower == "lora":  # what linear_1's and linear_2's lora_A keep of their inputs, and their output
        projector += sum(_adapter_kept_bytes(r, rows, lin.in_features)
                         for group in r.spec.vision.projector.groups for lin in group.linears)
    if block is not None:  # a tower in the graph without checkpointing: each layer keeps ``block``
        return tower.num_layers * block + images * (positions + projector)
    if r.plan.gradient_checkpointing:
        return images * ((tower.num_layers + 1) * positions + projector)
    if projector_trains(r):
        return images * (positions + projector)
    return 0


def _gemma3_tower_saved_bytes(r: ResolvedPlan, block: int | None = None) -> int:
    """Gemma 3 (transformers 5.24 models/gemma3/modeling_gemma3.py, models/siglip/modeling_siglip.py), for the
    micro-batch's images at once, N positions of width W each (4,096 x 1,152 at 896 px) and N' soft tokens (256):

    * with checkpointing, ``enable_input_require_grads`` hooks SiglipVisionModel's patch embedding, so the tower's
      output requires grad: each of its ``depth`` SiglipEncoderLayers (checkpointing layers) keeps its input (N x W),
      ``post_layernorm`` its own (N x W, the last layer's output); Gemma3MultiModalProjector's ``avg_pool`` keeps its
      input, the ``.contiguous()`` copy of the transposed features (N x W), and ``mm_soft_emb_norm`` (Gemma3RMSNorm,
      computed in fp32) its fp32 input (N' x W x 4);
    * without it the frozen tower and its projector build no graph (no gradient reaches them);
    * a projector that trains (full fine-tuning) also keeps, for its own weights' gradients, the norm's fp32
      normalized output (N' x W x 4) and the projection matmul's input (N' x W in the weight dtype)."""
    assert r.images is not None and r.spec.vision is not None
    tower = r.spec.vision.tower
    images = r.images.images_per_sample * r.plan.batch_size
    element = DTYPE_BYTES[r.weight_dtype]
    positions = _tower_tensor_bytes(r, tower.hidden_size)
    soft = images * r.images.image_tokens_per_image * tower.hidden_size
    soft_fp32 = round_block(soft * DTYPE_BYTES["fp32"])
    kept = 0
    if block is not None:  # a tower in the graph without checkpointing: each layer keeps ``block``
        kept = tower.num_layers * block + 2 * positions + soft_fp32
    elif r.plan.gradient_checkpointing:
        kept = (tower.num_layers + 2) * positions + soft_fp32
    if projector_trains(r):
        kept += soft_fp32 + round_block(soft * element)
    return kept


# xformers' memory-efficient kernel (CUDA) keeps its logsumexp in fp32, one per head and query position
LOGSUMEXP_BYTES = 4


def _mllama_tower_saved_bytes(r: ResolvedPlan) -> int:
    """Llama 3.2 Vision (transformers 5.24 models/mllama/modeling_mllama.py), for the micro-batch's images, each a
    sequence of N = tiles x padded positions (4 x 1,608) of width W (1,280), MLP width I, h heads:

    * with checkpointing, ``enable_input_require_grads`` hooks MllamaVisionModel's ``get_input_embeddings``, its
      patch embedding, so the frozen tower's output requires grad; its layers (MllamaVisionEncoderLayer) are plain
      modules, not checkpointing layers, so each of the local and global layers keeps everything its backward reads:
      its two LayerNorms' inputs, the memory-efficient attention's q, k, v and output (6·a·N·W), its fp32 logsumexp
      (4·h·N) and the GELU's input (a·N·I); the frozen linears keep nothing. Once per image: the aspect-ratio
      attention bias (a·N², every layer's attention reads the same one) and ``layernorm_pre``/``layernorm_post``'s
      inputs (2·a·N·W);
    * without it the frozen tower builds no graph;
    * a projector that trains (full fine-tuning) keeps its input for its weight's gradient: the S vision states of
      the final and intermediate layers, a·S·vision_output_dim;
    * with ``vision_tower: lora`` (checkpointing on), every adapted linear of every layer keeps what its lora_A reads
      and lora_A's output (:func:`_adapter_kept_bytes`), and so does the adapted projector over the S states: the
      layers are not checkpointing layers, so nothing is recomputed. Where lora_A reads the layer's own tensors
      (:func:`_adapters_read_block_tensors`: QLoRA's bf16 adapters without dropout), those stay: both LayerNorms'
      outputs and the GELU's (2·a·N·W + a·N·I a layer) and the projector's input (a·S·vision_output_dim); cohort
      v38's l02 (QLoRA, no dropout, 2 images) came out -9.69% without them.

    Measured on Llama-3.2-90B-Vision's tower alone under fake tensors (exploratory): 6,737 MB kept per image, this
    formula 6,722 MB (the gated position and tile embeddings' few small tensors are left out)."""
    assert r.images is not None and r.spec.vision is not None
    vision = r.spec.vision
    states = r.images.cross_attention_tokens_per_sample * r.plan.batch_size
    element = DTYPE_BYTES[r.weight_dtype]
    projector = round_block(element * states * vision.projector.in_features) if projector_trains(r) else 0
    if not r.plan.gradient_checkpointing and r.plan.vision_tower == "frozen":  # no graph through the tower
        return projector
    tower = vision.tower
    images = r.images.images_per_sample * r.plan.batch_size
    positions = r.images.patches_per_image
    width = _tower_tensor_bytes(r, tower.hidden_size)
    per_layer = (6 * width + _tower_tensor_bytes(r, tower.intermediate_size)
                 + round_block(LOGSUMEXP_BYTES * tower.num_heads * positions * images))
    bias = round_block(element * positions * positions * images)
    adapters = 0
    if r.plan.vision_tower == "lora":  # not checkpointing layers: every adapted linear keeps what its lora_A reads
        adapters = sum(group.count * sum(_adapter_kept_bytes(r, positions * images, lin.in_features)
                                         for lin in group.linears) for group in tower.groups)
        adapters += sum(_adapter_kept_bytes(r, states, lin.in_features)
                        for group in vision.projector.groups for lin in group.linears)
        if _adapters_read_block_tensors(r):  # the layers' own tensors then: both LayerNorms' outputs, the GELU's
            adapters += tower.num_layers * (2 * width + _tower_tensor_bytes(r, tower.intermediate_size))
            adapters += round_block(element * states * vision.projector.in_features)  # the projector's input
    return tower.num_layers * per_layer + bias + 2 * width + projector + adapters + _mllama_trained_tower_bytes(r)


def _mllama_trained_tower_bytes(r: ResolvedPlan) -> int:
    """What Llama 3.2 Vision's tower keeps beyond the hooked frozen tower's tensors when its own weights train
    (``vision_tower: full``, checkpointing on; transformers 5.24 MllamaVisionModel), N = tiles x padded positions:

    * every layer's linears keep their inputs for their weights' gradients: q/k/v read the first LayerNorm's output,
      fc1 the second's, fc2 the GELU's output (2·a·N·W + a·N·I; o_proj reads the attention output, already kept);
    * each gated global layer's ``gate_attn.tanh() * h`` and ``gate_ffn.tanh() * h`` keep h, o_proj's and fc2's
      outputs, for the gates' gradients (2·a·N·W);
    * the patch convolution keeps its input, the pixel values cast to the weight dtype (a copy unless that is fp32,
      when it keeps the collator's own tensor), and the gated tile-position embedding keeps the looked-up embedding
      for its gate's gradient (at most a·N·W); the aspect-ratio embeddings' (tiles x W an image) are left out.

    0 for a tower that does not train. Exploratory runs (Llama-3.2-90B-Vision cut to 10 text layers, 1 to 2 images):
    -2.4% to -5.9% without these terms."""
    if not tower_trains(r):
        return 0
    assert r.images is not None and r.spec.vision is not None
    tower = r.spec.vision.tower
    width = _tower_tensor_bytes(r, tower.hidden_size)
    linear_inputs = tower.num_layers * (2 * width + _tower_tensor_bytes(r, tower.intermediate_size))
    gates = tower.global_layers * 2 * width
    return linear_inputs + gates + _trained_patch_input_bytes(r) + width


# The families whose blocks :func:`_uncheckpointed_block_bytes` reads (Llama 3.2 Vision's layers keep everything with
# checkpointing too, :func:`_mllama_tower_saved_bytes`)
UNCHECKPOINTED = tuple(t for t in UNCHECKPOINTED_TOWER_TYPES if t != "mllama")
# QuickGELU (CLIP: x * sigmoid(1.702 x)) keeps its input and the sigmoid's output; tanh GELU its input alone
ACTIVATION_KEPT = {"quick_gelu": 2}


def _uncheckpointed_block_bytes(r: ResolvedPlan) -> int:
    """One tower block that is not checkpointed and is in the graph (its own adapters or weights train), over the
    micro-batch's N positions of width W, MLP width I, h heads: what its backward reads, kept from its forward to its
    backward: both LayerNorms' inputs, q, k, v and the attention output (6·a·N·W), the memory-efficient kernel's fp32
    logsumexp (4·h·N), the activation's input (a·N·I; QuickGELU also its sigmoid, a·N·I); each adapter's kept input
    and lora_A output (:func:`_adapter_kept_bytes`), or where adapters read the block's own tensors both LayerNorms'
    outputs and the activation's (2·a·N·W + a·N·I); a trained block's linears keep those same three for their
    weights' gradients. Idefics3's padded tile mask is copied by each layer's attention (the kernel's aligned bias).
    The Mllama formula (:func:`_mllama_tower_saved_bytes`) for these towers; traced on SmolVLM-256M (exploratory,
    LoRA on both towers, no checkpointing)."""
    assert r.images is not None and r.spec.vision is not None
    vision = r.spec.vision
    tower = vision.tower
    n = _micro_batch_positions(r)
    width = _tower_tensor_bytes(r, tower.hidden_size)
    mlp = _tower_tensor_bytes(r, tower.intermediate_size)
    block = (6 * width + ACTIVATION_KEPT.get(tower.hidden_act, 1) * mlp
             + round_block(LOGSUMEXP_BYTES * tower.num_heads * n))
    if r.plan.vision_tower == "lora":
        layer = max(tower.groups, key=lambda group: group.count)
        block += sum(_adapter_kept_bytes(r, n, lin.in_features) for lin in layer.linears)
    if tower_trains(r) or (r.plan.vision_tower == "lora" and _adapters_read_block_tensors(r)):
        block += 2 * width + mlp
    if vision.model_type in IDEFICS3_TYPES:
        block += _idefics3_tower_bias_bytes(r)
    return block


def _uncheckpointed_tower_saved_bytes(r: ResolvedPlan) -> int:
    """A LoRA or trained tower without gradient checkpointing (:data:`UNCHECKPOINTED` families): every block's
    :func:`_uncheckpointed_block_bytes` where the family's formula counts a checkpointed block's input, and what it
    keeps beside its blocks as with checkpointing: Gemma 3's post_layernorm and avg_pool inputs and its soft-embedding
    norm's fp32 input; LLaVA's pre_layrnorm input and projector; Idefics3's post_layernorm input and connector input;
    a trained tower's patch-convolution input (:func:`_trained_patch_input_bytes`)."""
    assert r.spec.vision is not None
    family = {"gemma3": _gemma3_tower_saved_bytes, "llava": _llava_tower_saved_bytes,
              "llava_next": _llava_tower_saved_bytes}.get(r.spec.vision.model_type, _idefics3_tower_saved_bytes)
    return family(r, _uncheckpointed_block_bytes(r)) + _trained_patch_input_bytes(r)


def _trained_patch_input_bytes(r: ResolvedPlan) -> int:
    """A trained tower's patch convolution keeps its input for its weight's gradient: the pixel values cast to the
    weight dtype, a copy unless that is fp32 (then the collator's own tensor, :func:`pixel_values_bytes`). 0 for a
    tower that does not train."""
    if not tower_trains(r) or r.weight_dtype == PIXEL_VALUES_DTYPE:
        return 0
    assert r.images is not None
    images = r.images.images_per_sample * r.plan.batch_size
    return round_block(DTYPE_BYTES[r.weight_dtype] * r.images.pixel_values_per_image * images)


def image_outputs_bytes(r: ResolvedPlan) -> int:
    """What the model's output holds of the images until TRL 1.16's compute_loss has the loss and its metrics: alive
    through the forward, freed before backward.

    * Mllama: MllamaModel.forward returns the tower's output (``image_outputs``), a·S·vision_output_dim; 0 where a
      trained projector keeps it anyway (counted in :func:`_mllama_tower_saved_bytes`). Measured on the 90B config
      cut to 10 layers (exploratory, LoRA without checkpointing): the forward peak 96 MB above the estimate without it.
    * LLaVA-NeXT, Idefics3 and Qwen2-VL: their models' forward return the tower's output (``image_outputs``): its
      last hidden state over every crop, tile or patch, a·P·N·W, and as its pooler_output the image features
      (LLaVA-NeXT's packed by pack_image_features, Idefics3's the connector's output, Qwen2-VL's the merger's),
      a·P·N'·H, for the P images' N positions and N' tokens each. Measured (exploratory, LoRA without
      checkpointing, 1280x720, without it: LLaVA-NeXT -0.12%, SmolVLM-256M -0.60%, Qwen2-VL-2B -0.09%).
    * Other families (Qwen2.5-VL, Qwen3-VL, LLaVA-1.5, Gemma 3: their cohorts ran without it): 0."""
    if r.images is None or r.spec.vision is None:
        return 0
    element = DTYPE_BYTES[r.weight_dtype]
    if r.spec.vision.model_type in ("llava_next", *IDEFICS3_TYPES, "qwen2_vl"):
        # LlavaNextModel and Idefics3Model return the tower's output (image_outputs): its last hidden state over every
        # crop or tile and, as its pooler_output, the image features (new tensors of the image tokens)
        images = r.images.images_per_sample * r.plan.batch_size
        tower = r.spec.vision.tower.hidden_size * r.images.patches_per_image
        return round_block(element * images * (r.images.image_tokens_per_image * r.spec.hidden_size + tower))
    if r.spec.vision.model_type != "mllama" or projector_trains(r):
        return 0
    states = r.images.cross_attention_tokens_per_sample * r.plan.batch_size
    return round_block(element * states * r.spec.vision.projector.in_features)


def tower_assumption(r: ResolvedPlan) -> str:
    """What the estimate takes the vision tower to do and keep, in words, for the assumptions."""
    vision = r.spec.vision
    mode = {"frozen": "vision tower frozen", "lora": "vision tower adapted (vision_tower lora: LoRA on every linear of "
            "the tower and its projector)", "full": "vision tower trained (vision_tower full: its weights get "
            "gradients and optimizer states)"}[r.plan.vision_tower]
    if vision is not None and vision.model_type == "mllama":
        if not r.plan.gradient_checkpointing:
            return f"{mode}: without gradient checkpointing it builds no graph and keeps nothing"
        kept = _mllama_tower_saved_bytes(r) / 2**30
        images = r.images.images_per_sample * r.plan.batch_size if r.images is not None else 0
        hooked = ("yet with gradient checkpointing transformers' enable_input_require_grads hooks its patch embedding "
                  "and " if r.plan.vision_tower == "frozen" else "")
        return (f"{mode}, {hooked}its {vision.tower.num_layers} layers are not checkpointing layers "
                f"(MllamaVisionEncoderLayer): it keeps every activation its backward reads until then, {kept:.2f} GiB "
                f"for the micro-batch's {images} image{'s' if images != 1 else ''}")
    if r.plan.vision_tower != "frozen":
        return (f"{mode}; with gradient checkpointing (required) the tower's blocks keep their inputs until the end of "
                "backward and each is recomputed for its own backward")
    return (f"{mode}: only the language model trains{' (and the projector)' if projector_trains(r) else ''}; with "
            "gradient checkpointing the tower's blocks keep their inputs until the end of backward (transformers' "
            "enable_input_require_grads hooks the tower's patch embedding)")


def cross_attention_states_bytes(r: ResolvedPlan) -> int:
    """Mllama: the projected vision states every cross-attention layer reads, B x S x H in the weight dtype, S the
    sample's images x tiles x positions (4 x 1,601 an image); 0 for other families."""
    if r.images is None or not r.images.cross_attention_tokens_per_image:
        return 0
    states = r.images.cross_attention_tokens_per_sample * r.plan.batch_size
    return round_block(states * r.spec.hidden_size * DTYPE_BYTES[r.weight_dtype])


def cross_attention_mask_bytes(r: ResolvedPlan) -> int:
    """Mllama: the cross-attention bias ``_prepare_cross_attention_mask`` builds, B x 1 x T x S in the weight dtype,
    kept by the checkpointed layers' recomputation through backward; 0 for other families."""
    if r.images is None or not r.images.cross_attention_tokens_per_image:
        return 0
    states = r.images.cross_attention_tokens_per_sample * r.plan.batch_size
    return round_block(states * r.tokens // r.plan.batch_size * DTYPE_BYTES[r.weight_dtype])


def cross_attention_layer_extra_bytes(r: ResolvedPlan) -> int:
    """Mllama: what one cross-attention decoder layer (MllamaCrossAttentionDecoderLayer) keeps for backward beyond
    the Llama decoder layer the language model's count already holds in its place (memory.layer_activation_bytes:
    the norms, q and o projections, attention output and MLP on the T text tokens are the same), for the
    micro-batch's T tokens and S vision states, width H, k/v width kv, a bytes an element; 0 for other families:

    * keys and values from the S vision states, expanded to every query head for the memory-efficient kernel
      (transformers' SDPA path repeats them itself when a mask is given): 2·a·S·H, where the Llama layer counted
      flash attention's 2·a·T·kv;
    * q_norm and k_norm (MllamaTextRMSNorm, computed in fp32) keep their fp32 inputs: 4·T·H + 4·S·kv;
    * the kernel's bias: the cross-attention mask copied to a multiple of 8 positions (torch's preprocess_mask),
      a·T·S;
    * adapters on k_proj and v_proj read the vision states, not the text: each keeps its dropped-out input and mask
      with dropout, (a+1)·S·H, or without it, in adapters of another dtype than the compute dtype, its input cast
      back by autocast, a·S·H, where the Llama layer counted the same of T tokens (:func:`_lora_input_bytes`);
    * in full fine-tuning its two tanh gates and its q_norm and k_norm weights train, so the gates keep the hidden
      states they scale (2·a·T·H) and the norms their normalized outputs (a·T·H + a·S·kv)."""
    if r.images is None or not r.images.cross_attention_tokens_per_image or r.spec.vision is None:
        return 0
    if not r.spec.vision.cross_attention_layers:
        return 0
    spec, a, t = r.spec, r.act_bytes, r.tokens
    states = r.images.cross_attention_tokens_per_sample * r.plan.batch_size
    per_text_row = -(-states // r.plan.batch_size // 8) * 8 * r.plan.batch_size
    keys_values = 2 * round_block(a * states * spec.q_dim) - 2 * round_block(a * t * spec.kv_dim)
    norms = round_block(4 * t * spec.q_dim) + round_block(4 * states * spec.kv_dim)
    bias = round_block(a * (t // r.plan.batch_size) * per_text_row)
    reading_states = [lin for lin in spec.layer_linears(0) if lin.name in ("k_proj", "v_proj") and r.adapted(lin)]
    adapters = len(reading_states) * (_lora_input_bytes(r, states, spec.hidden_size)
                                      - _lora_input_bytes(r, t, spec.hidden_size))
    trained = 3 * round_block(a * t * spec.hidden_size) + round_block(a * states * spec.kv_dim) if r.full else 0
    return keys_values + norms + bias + adapters + trained


def _lora_input_bytes(r: ResolvedPlan, tokens: int, width: int) -> int:
    """What one adapter's lora_A keeps of an input of ``tokens`` x ``width`` that the block keeps anyway
    (memory._consumer_parts): the dropped-out copy and its bool mask with dropout; without it, the input cast to
    the adapters' dtype and back by autocast when they are not in the compute dtype; else nothing of its own."""
    if r.plan.lora_dropout > 0:
        return round_block(tokens * width) + round_block(r.act_bytes * tokens * width)
    if r.adapter_dtype != r.compute_dtype:
        return round_block(r.act_bytes * tokens * width)
    return 0


def _adapters_read_block_tensors(r: ResolvedPlan) -> bool:
    """Whether PEFT's lora_A reads the block's own tensor rather than a copy: no dropout and adapters in the compute
    dtype (QLoRA's bf16 adapters), as memory._reads_block_tensor says for the language model. A frozen block then
    keeps the tensors its adapted linears read, which it would otherwise free."""
    return r.plan.lora_dropout == 0 and r.adapter_dtype == r.compute_dtype


def _adapter_kept_bytes(r: ResolvedPlan, rows: int, in_features: int) -> int:
    """What one adapted linear over ``rows`` inputs of ``in_features`` keeps for its adapter's backward: what its
    lora_A reads (:func:`_lora_input_bytes`) and lora_A's r-wide output, which lora_B keeps (a·rows·r)."""
    return _lora_input_bytes(r, rows, in_features) + round_block(r.act_bytes * rows * r.plan.lora_r)


def cross_attention_backward_bytes(r: ResolvedPlan) -> int:
    """Mllama: a cross-attention layer's attention backward in flight (memory.layer_backward_transient_bytes' attention
    figure with its keys and values over the S vision states): dq (a·T·H), dk and dv expanded to every head
    (2·a·S·H) before repeat_kv's backward sums them, the fp32 dq accumulator (4·T·H) and two gradients of the block
    input (2·e·T·H, e the residual stream's bytes); 0 for other families."""
    if r.images is None or r.spec.vision is None or not r.spec.vision.cross_attention_layers:
        return 0
    spec, a, t = r.spec, r.act_bytes, r.tokens
    states = r.images.cross_attention_tokens_per_sample * r.plan.batch_size
    return (round_block(a * t * spec.q_dim) + 2 * round_block(a * states * spec.q_dim) + round_block(4 * t * spec.q_dim)
            + 2 * round_block(DTYPE_BYTES[r.residual_dtype] * t * spec.hidden_size))


def cross_attention_kept_bytes(r: ResolvedPlan) -> int:
    """Mllama: what the language model's cross-attention keeps beside its layers: the vision states (which the
    checkpointed layers' recomputation reads through backward) and the cross-attention bias; with checkpointing the
    states require grad (the tower's patch-embedding hook, :func:`_mllama_tower_saved_bytes`) and their gradient, as
    large, accumulates from the top cross-attention layer's backward until the projector's, after the language
    model's embedding: counted through the step (in forward it is not there yet: a·S·H over)."""
    states = cross_attention_states_bytes(r)
    return states * (2 if r.plan.gradient_checkpointing else 1) + cross_attention_mask_bytes(r)


def _idefics3_tower_saved_bytes(r: ResolvedPlan, block: int | None = None) -> int:
    """Idefics3 / SmolVLM (transformers 5.24 models/idefics3/modeling_idefics3.py), the micro-batch's tiles at once,
    N positions of width W over P tiles ((512 / 16)² = 1,024 a tile on SmolVLM-256M):

    * with checkpointing, ``enable_input_require_grads`` hooks Idefics3VisionTransformer's embeddings, so the tower's
      output requires grad: each of its ``depth`` Idefics3EncoderLayers (checkpointing layers) keeps its input
      (a·N·W), ``post_layernorm`` its own (a·N·W), and the bidirectional mask the tower builds from the tiles' patch
      mask (P x 1 x n x n for n positions a tile, in the weight dtype; a non-square image's global tile is padded, so
      a GPU builds it too) is kept by the checkpointed layers' recomputation;
    * without it the frozen tower and its connector build no graph;
    * a connector that trains (full fine-tuning) keeps its projection's input, the pixel-shuffled features (a·N·W);
      an adapted one (``vision_tower: lora``) what its lora_A keeps of them (:func:`_lora_input_bytes`, N x W in all
      over the N / scale_factor² shuffled rows) and lora_A's output."""
    assert r.images is not None and r.spec.vision is not None
    tower = r.spec.vision.tower
    width = _tower_tensor_bytes(r, tower.hidden_size)
    kept = width if projector_trains(r) else 0
    if r.plan.vision_tower == "lora":
        positions = _micro_batch_positions(r)
        for group in r.spec.vision.projector.groups:
            for lin in group.linears:
                rows = positions * tower.hidden_size // lin.in_features
                kept += _adapter_kept_bytes(r, rows, lin.in_features)
                if _adapters_read_block_tensors(r) and not projector_trains(r):  # its input, the shuffled features
                    kept += round_block(r.act_bytes * rows * lin.in_features)
    if block is not None:  # a tower in the graph without checkpointing: each layer keeps ``block``
        return kept + tower.num_layers * block + width
    if not r.plan.gradient_checkpointing:
        return kept
    return kept + (tower.num_layers + 1) * width + _idefics3_tower_bias_bytes(r)


def _idefics3_tower_bias_bytes(r: ResolvedPlan) -> int:
    """The tower's bidirectional mask over the micro-batch's P tiles of n positions: P x n² in the weight dtype."""
    assert r.images is not None and r.spec.vision is not None
    tower = r.spec.vision.tower
    # the plan's tile (max_image_size) where it sets one, else the tower's image_size
    per_tile = ((r.plan.max_image_size // tower.patch_size) ** 2 if r.plan.max_image_size
                else tower.patches_per_image or 0)
    tiles = r.images.patches_per_sample * r.plan.batch_size // max(per_tile, 1)
    return round_block(DTYPE_BYTES[r.weight_dtype] * tiles * per_tile * per_tile)


TOWER_BACKWARD_NOTE = ("the vision tower's backward, after the whole language model's: one tower block recomputed "
                       "(its norms' and attention's inputs and outputs, its MLP activation's input) and its MLP "
                       "backward's gradients")


# The families whose checkpointed tower is in the graph and recomputes its blocks in its own backward, after the
# language model's: Gemma 3's SigLIP and Idefics3's (measured on gemma-3-4b-it and SmolVLM-256M-Instruct)
TOWERS_BACK_PROPAGATED = ("gemma3", *IDEFICS3_TYPES)
# ... and those whose tower's own backward moment is counted once LoRA adapts it (LLaVA-NeXT's CLIP tower: its
# frozen blocks' backward never outgrew the language model's, measured by cohort v29; its adapted ones may)
ADAPTED_TOWERS_BACK_PROPAGATED = (*TOWERS_BACK_PROPAGATED, "llava_next")


def tower_block_backward_bytes(r: ResolvedPlan) -> int:
    """One vision-tower block at its backward, for a tower in the graph that recomputes its blocks (Gemma 3 and
    Idefics3 with checkpointing: the patch-embedding hook puts the frozen tower in the graph,
    :func:`_gemma3_tower_saved_bytes`); 0 otherwise. N positions of width W, MLP width I, a bytes an element, for the
    micro-batch's images:

    * the recomputed block's saved tensors: the two LayerNorms' inputs, flash attention's q, k, v and output
      (6·a·N·W), and the GELU's input (a·N·I); the frozen linears keep no input;
    * its MLP backward's temporaries: the gradients of the GELU's output and input (2·a·N·I) beside the incoming and
      residual gradients (2·a·N·W).

    With ``vision_tower: lora`` the block's adapters add :func:`_tower_block_adapter_bytes`, and the larger of the
    two moments counts. Measured on gemma-3-4b-it (exploratory, LoRA, frozen tower): 8 images of 640x480 at 128 text
    tokens peak in the tower's backward, 2.1% above the language model's moments; with 2 or 3 images the language
    model's moments stay larger."""
    vision = r.spec.vision
    if r.images is None or vision is None or not r.plan.gradient_checkpointing:
        return 0
    adapted = r.plan.vision_tower == "lora" and vision.model_type in ADAPTED_TOWERS_BACK_PROPAGATED
    if vision.model_type not in TOWERS_BACK_PROPAGATED and not adapted:
        return 0
    width = _tower_tensor_bytes(r, vision.tower.hidden_size)
    mlp = _tower_tensor_bytes(r, vision.tower.intermediate_size)
    frozen = 8 * width + 3 * mlp + _int8_recompute_bytes(r)
    if r.plan.vision_tower != "lora":
        return frozen
    saved, recompute = _tower_block_adapter_bytes(r)
    return max(frozen + saved, 7 * width + 2 * mlp + saved + recompute)


# bitsandbytes 0.50.2 on an 8-bit linear (MatMul8bitLt through benchmarks/validation/int8_fake.py, as on CUDA): the
# int32 product of int8_linear_matmul, and the int8 rows its input is quantized to
INT8_PRODUCT_BYTES = 4
INT8_ROW_BYTES = 1


def _int8_recompute_bytes(r: ResolvedPlan) -> int:
    """An 8-bit tower block at fc2's backward, where the gradient of fc2's input (N x I) goes through the 8-bit
    weight: beyond the 16-bit block's moment (:func:`tower_block_backward_bytes`), the int32 product (4·N·I) and the
    incoming gradient's int8 rows (N·W). Its fp16 dequantized result, that result's cast and the gradient's copies
    in the activation dtype stand where the 16-bit block holds its MLP gradients and recomputed attention tensors.
    Traced on SmolVLM-256M (cohort v42's q06, 26 tiles of 1,024 positions): the moment's tensors come to the 16-bit
    block's plus these, to within the 52 MB of a mask-shaped gradient. 0 unless 8-bit."""
    if r.quantization != "int8" or r.spec.vision is None:
        return 0
    tower = r.spec.vision.tower
    n = _micro_batch_positions(r)
    return (round_block(INT8_PRODUCT_BYTES * n * tower.intermediate_size)
            + round_block(INT8_ROW_BYTES * n * tower.hidden_size))


def _tower_block_adapter_bytes(r: ResolvedPlan) -> tuple[int, int]:
    """What a tower block's LoRA adapters add when the block is recomputed for its backward (PEFT 0.21
    ``lora.Linear.forward``; the same terms as the language model's, memory._consumer_parts and
    memory.adapter_forward_transient_bytes), over the micro-batch's N positions:

    * saved, for every adapted linear of the block (in features k): the dropped-out input in the compute dtype and
      its bool mask (a·N·k + N·k) with lora_dropout, else the input cast for fp32 adapters (a·N·k), and lora_A's
      output (a·N·r);
    * the recomputation's moment at the widest adapted linear (fc2, k = I): the block tensor feeding it (a·N·I, the
      GELU's output), its fp32 copy for fp32 adapters and that copy's fp32 dropout (4·N·I each);
    * where lora_A reads the block's own tensors (:func:`_adapters_read_block_tensors`), no copy is made and those
      tensors are saved instead: both LayerNorms' outputs and the GELU's (2·a·N·W + a·N·I).

    The moment in recomputation then holds the block's saved tensors but the MLP's gradients not yet: 7·a·N·W
    (the six of the frozen block and the incoming gradient) and the GELU's input (a·N·I), beside these.
    Measured on SmolVLM-256M-Instruct (exploratory, LoRA on both towers, 5 tiles of 1,024 positions): the step's peak
    is there, fc2's fp32 copy and dropout (4·N·I each) the largest tensors of the moment."""
    assert r.images is not None and r.spec.vision is not None
    tower = r.spec.vision.tower
    positions = _micro_batch_positions(r)
    block = max(tower.groups, key=lambda group: group.count)
    saved = sum(_adapter_kept_bytes(r, positions, lin.in_features) for lin in block.linears)
    widest = max((lin.in_features for lin in block.linears), default=0)
    feeding = round_block(r.act_bytes * positions * widest)  # the GELU's output, fc2's input
    if _adapters_read_block_tensors(r):  # kept for lora_A: both LayerNorms' outputs and the GELU's
        return saved + 2 * _tower_tensor_bytes(r, tower.hidden_size) + feeding, 0
    recompute = feeding
    if r.adapter_dtype is not None and r.adapter_dtype != r.compute_dtype:
        per = DTYPE_BYTES[r.adapter_dtype]
        recompute += round_block(per * positions * widest) * (2 if r.plan.lora_dropout > 0 else 1)
    return saved, recompute


# The batch's int64 rows alive through the step: input ids, labels, the attention mask and Gemma 3's token_type_ids,
# 8 bytes an element
BATCH_INT64_ROWS = 4
INT64_BYTES = 8


def tower_backward_saved_bytes(r: ResolvedPlan) -> int:
    """What the step still holds when the tower's top block is back-propagated (Gemma 3 with checkpointing): the
    language model's activations are freed, and so are the projector's and ``post_layernorm``'s inputs (their
    backward ran); the tower blocks' checkpointed inputs (d x a·P·N·W), the pixel values and the batch's int64 rows
    remain."""
    assert r.images is not None and r.spec.vision is not None
    checkpoint = _tower_tensor_bytes(r, r.spec.vision.tower.hidden_size)
    bias = _idefics3_tower_bias_bytes(r) if r.spec.vision.model_type in IDEFICS3_TYPES else 0
    return (r.spec.vision.tower.num_layers * checkpoint + pixel_values_bytes(r) + bias + tower_int8_kept_bytes(r)
            + BATCH_INT64_ROWS * round_block(INT64_BYTES * r.tokens))


def freed_before_embedding_backward(r: ResolvedPlan) -> int:
    """What the vision tower keeps that is freed before the language model's input embedding is back-propagated, the
    very end of backward: Gemma3Model.forward looks the token embeddings up before it runs the tower, so the tower's
    autograd nodes are newer and run first, and its saved tensors (:func:`_gemma3_tower_saved_bytes`) are gone when the
    embedding's gradient is made. Measured on gemma-3-4b-it, full fine-tuning with 6 images at 128 text tokens
    (exploratory): the tied embedding's end-of-backward moment counted them and came out 4.7% high. Other families: 0
    (not measured)."""
    if r.images is None or r.spec.vision is None or r.spec.vision.model_type != "gemma3":
        return 0
    return tower_saved_bytes(r)


def pixel_values_bytes(r: ResolvedPlan) -> int:
    """The collator's pixel values, alive through the step: patches x (channels x temporal patch x patch²) fp32;
    Idefics3's processor adds a pixel_attention_mask of every tile's pixels in int64 (Idefics3ImageProcessor makes it
    with torch.zeros(..., dtype=torch.int64), its PIL twin with np.int64)."""
    images = r.images
    if images is None:
        return 0
    per_sample = images.pixel_values_per_image * images.images_per_sample
    mask = 0
    if r.spec.vision is not None and r.spec.vision.model_type in IDEFICS3_TYPES:
        mask = round_block(INT64_BYTES * per_sample * r.plan.batch_size // r.spec.vision.tower.in_channels)
    return round_block(per_sample * r.plan.batch_size * DTYPE_BYTES[PIXEL_VALUES_DTYPE]) + mask


def scattered_embedding_bytes(r: ResolvedPlan) -> int:
    """The language model's input embeddings once the image features are scattered in: a copy, B x T x H."""
    if r.images is None:
        return 0
    return SCATTERED_EMBEDDING_COPIES * round_block(r.tokens * r.spec.hidden_size * DTYPE_BYTES[r.compute_dtype])


def tower_in_graph(r: ResolvedPlan) -> bool:
    """Whether the vision tower's forward builds a graph: its own adapters (``vision_tower: lora``), or with
    checkpointing ``enable_input_require_grads``' hook on its patch embedding (every family but Qwen3-VL, whose
    tower names no input-embedding layer: :func:`tower_saved_bytes`)."""
    vision = r.spec.vision
    if r.images is None or vision is None:
        return False
    if r.plan.vision_tower != "frozen":
        return True
    return r.plan.gradient_checkpointing and vision.model_type not in UNHOOKED_TOWER_TYPES


def tower_int8_kept_bytes(r: ResolvedPlan) -> int:
    """On an 8-bit base the tower's and projector's linears are bitsandbytes' Linear8bitLt too, and
    ``MatMul8bitLt`` keeps its input as a ctx attribute whenever that input requires grad, past checkpointing
    (memory.int8_kept_input_bytes for the language model's). In a tower in the graph (:func:`tower_in_graph`) each
    block's linears then keep their distinct inputs: the first norm's output (q/k/v), the attention output (o_proj),
    the second norm's output (fc1, or gate/up) and the MLP activation's output (fc2, or down), 3·a·N·W + a·N·I, in
    the weight dtype; Llama 3.2 Vision's layers, and any block without checkpointing, keep their attention output
    already (:func:`_mllama_tower_saved_bytes`, :func:`_uncheckpointed_block_bytes`): 2·a·N·W + a·N·I. The
    projector's linears keep their inputs likewise (the merged, shuffled or concatenated features, and the GELU's
    output between two linears). Exploratory (8-bit LoRA, 1280x720, checkpointing on):
    Qwen2.5-VL-3B -21.8%, gemma-3-4b-it -19.6%, SmolVLM-256M -64.4%, the 90B Mllama cut to 10 layers -14.0%,
    LLaVA-NeXT -5.8% without these terms."""
    vision = r.spec.vision
    if r.quantization != "int8" or not tower_in_graph(r):
        return 0
    assert vision is not None
    tower = vision.tower
    width = _tower_tensor_bytes(r, tower.hidden_size)
    mlp = _tower_tensor_bytes(r, tower.intermediate_size)
    # a block that is not checkpointed (Mllama's always) keeps the attention output for its own backward already
    kept_already = vision.model_type == "mllama" or not r.plan.gradient_checkpointing
    per_block = (2 if kept_already else 3) * width + mlp
    return tower.num_layers * per_block + _projector_int8_inputs(r)


def _projector_int8_inputs(r: ResolvedPlan) -> int:
    """What the projector's 8-bit linears keep: each linear's input, over the rows it reads."""
    vision = r.spec.vision
    assert vision is not None and r.images is not None
    element = DTYPE_BYTES[r.weight_dtype]
    positions = _micro_batch_positions(r) * vision.tower.hidden_size  # elements of the tower's output
    if vision.model_type == "mllama":
        states = r.images.cross_attention_tokens_per_sample * r.plan.batch_size
        return round_block(element * states * vision.projector.in_features)
    if vision.model_type in ("llava", "llava_next"):
        rows = (r.images.projected_per_image or r.images.image_tokens_per_image) * (
            r.images.images_per_sample * r.plan.batch_size)
        return round_block(element * rows * r.spec.hidden_size)  # linear_2 reads the GELU's output
    if vision.model_type == "gemma3":
        return 0  # its projection is a parameter matmul, not an nn.Linear
    if vision.model_type in IDEFICS3_TYPES:
        return round_block(element * positions)  # the pixel-shuffled features
    return 2 * round_block(element * positions)  # Qwen's merger: its norm's output and its GELU's output


def vision_saved_bytes(r: ResolvedPlan) -> int:
    """Everything images add to what the step keeps alive beside the language model's activations."""
    return tower_saved_bytes(r) + tower_int8_kept_bytes(r) + pixel_values_bytes(r) + scattered_embedding_bytes(r)
