"""A vision-language model's memory beyond its language model: the image tokens the language model reads, the vision
tower's weights, what the tower's forward leaves for backward, and the pixel values (issue 26).

Read from transformers 5.24 (models/qwen2_5_vl/modeling_qwen2_5_vl.py, modeling_utils.enable_input_require_grads)
and TRL 1.16 (trainer/sft_trainer.py DataCollatorForVisionLanguageModeling), and measured by TRL's own SFTTrainer on
each family's transformers model class under fake tensors (benchmarks/validation/vlm_fake.py): exploratory runs on
Qwen2.5-VL-3B, then cohort v21.

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

Only what was measured is estimated: Qwen2.5-VL, a frozen vision tower, LoRA or full fine-tuning of the language
model on one GPU with TRL's SFT trainer. Everything else about images is refused by name
(estimator/vision_images.py ``check_images``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .allocator import round_block
from .constants import DTYPE_BYTES
from .tensor_records import Role, TensorRecord

if TYPE_CHECKING:
    from .resolved import ResolvedPlan

# What DataCollatorForVisionLanguageModeling returns (TRL 1.16): the processor's float32 pixel values
PIXEL_VALUES_DTYPE = "fp32"
# The language model's input embeddings with the image features scattered in (masked_scatter makes a new tensor)
SCATTERED_EMBEDDING_COPIES = 1


def vision_weight_records(r: ResolvedPlan) -> list[TensorRecord]:
    """The vision tower's and projector's parameters (estimator/vision_spec.py, tensor by tensor), in the weight dtype,
    frozen (a trained tower is refused); unrounded, as the language model's base weights are. A group's modules are
    identical: one record per parameter of one, ``count`` tensors."""
    vision = r.spec.vision
    if vision is None:
        return []
    dtype = r.weight_dtype
    return [TensorRecord(Role.BASE_WEIGHT, f"{group.path}.{name}", shape[0], math.prod(shape) // shape[0], group.count,
                         dtype, False, math.prod(shape) * DTYPE_BYTES[dtype], None)
            for group in vision.tower.groups + vision.projector.groups
            for name, shape in group.module_parameter_shapes()]


def tower_saved_bytes(r: ResolvedPlan) -> int:
    """What the vision tower keeps for backward, from its forward to the end of backward.

    Without gradient checkpointing: nothing (frozen parameters, pixel values that need no gradient: no graph).
    With it, the tower is in the graph (``enable_input_require_grads`` hooks its patch embedding; measured on
    Qwen2.5-VL-3B at 1280x720, 4,784 patches): each of its ``depth`` blocks keeps its input, N x W in the weight
    dtype (a checkpointed layer); the merger keeps its norm's fp32 input (N x W x 4, Qwen2_5_VLRMSNorm upcasts), its
    GELU's input (N/4 x 4W) and one more N x W tensor; the blocks' rotary cos and sin are kept in fp32 (N x head_dim
    each). N = patches of the micro-batch, W = the tower's width."""
    images, vision = r.images, r.spec.vision
    if images is None or vision is None or not r.plan.gradient_checkpointing:
        return 0
    tower = vision.tower
    patches = images.patches_per_sample * r.plan.batch_size
    width_bytes = patches * tower.hidden_size * DTYPE_BYTES[r.weight_dtype]
    blocks = tower.num_layers * round_block(width_bytes)
    merger = round_block(patches * tower.hidden_size * DTYPE_BYTES["fp32"]) + 2 * round_block(width_bytes)
    rotary = 2 * round_block(patches * tower.head_dim * DTYPE_BYTES["fp32"])
    return blocks + merger + rotary


def pixel_values_bytes(r: ResolvedPlan) -> int:
    """The collator's pixel values, alive through the step: patches x (channels x temporal patch x patch²) fp32."""
    images = r.images
    if images is None:
        return 0
    per_sample = images.pixel_values_per_image * images.images_per_sample
    return round_block(per_sample * r.plan.batch_size * DTYPE_BYTES[PIXEL_VALUES_DTYPE])


def scattered_embedding_bytes(r: ResolvedPlan) -> int:
    """The language model's input embeddings once the image features are scattered in: a copy, B x T x H."""
    if r.images is None:
        return 0
    return SCATTERED_EMBEDDING_COPIES * round_block(r.tokens * r.spec.hidden_size * DTYPE_BYTES[r.compute_dtype])


def vision_saved_bytes(r: ResolvedPlan) -> int:
    """Everything images add to what the step keeps alive beside the language model's activations."""
    return tower_saved_bytes(r) + pixel_values_bytes(r) + scattered_embedding_bytes(r)
