"""The training plan: the one description of a fine-tuning run that everything reads.

The MCP tools' input schemas, the CLI flags, the estimate and the recipe are all derived from
:class:`TrainingPlan`, so what is estimated is what is trained. Field names follow transformers'
``TrainingArguments``, TRL's ``SFTConfig``/``ModelConfig`` and PEFT's ``LoraConfig`` wherever one exists.

Defaults are what TRL's ``SFTTrainer`` with a PEFT ``LoraConfig`` does when the user sets nothing
(TRL ``ModelConfig``: lora_r=16, lora_alpha=32, lora_dropout=0.05; ``SFTConfig``: max_length=1024,
bf16, gradient checkpointing on; ``TrainingArguments``: per_device_train_batch_size=8,
optim=adamw_torch_fused). ``docs/memory_model.md`` lists them.
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .errors import PlanError
from .stacks import STACKS, Stack
from .trainer_fields import TRAINER_FIELDS, TRAINERS, refused_fields
from .vision_tokens import IDEFICS3_MAX_IMAGE_SIDE  # the processor caps a longer longest_edge to it

Method = Literal["full", "lora", "qlora"]
DType = Literal["bf16", "fp16", "fp32"]
Precision = Literal["pure", "mixed"]
Optim = Literal[
    "adamw_torch_fused",
    "adamw_torch",
    "adamw_bnb_8bit",
    "paged_adamw_8bit",
    "paged_adamw_32bit",
    "adafactor",
    "sgd",
]
AttnImplementation = Literal["sdpa", "flash_attention_2", "eager"]
QuantType = Literal["nf4", "fp4"]
LossImplementation = Literal["chunked", "standard"]
# The loss a plan runs: its own loss_implementation, or its framework's (LitGPT's chunked cross-entropy over fp32 logit
# chunks is a framework's only: a plan cannot ask for it by itself)
EffectiveLoss = Literal["chunked", "standard", "litgpt", "torchtune"]
Framework = Literal["trl", "transformers", "axolotl", "llama_factory", "unsloth", "litgpt", "torchtune"]
# LitGPT 0.5.13's defaults where they differ from the plan's (TrainingPlan._framework_defaults)
LITGPT_DEFAULTS = {"lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "optim": "adamw_torch",
                   "gradient_checkpointing": False, "batch_size": 1, "gradient_accumulation_steps": 16}
# LLaMA-Factory 0.9.5's defaults where they differ from the plan's (hparams/finetuning_args.py LoraArguments:
# lora_rank 8, lora_alpha None -> 2 x rank, lora_dropout 0.0, lora_target "all"; model_args.py double_quantization True)
LLAMA_FACTORY_DEFAULTS = {"lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.0}
# torchtune 0.6.1's shipped single-device LoRA/QLoRA YAMLs (recipes/configs/qwen2_5/*_lora_single_device.yaml,
# llama3_2/*_lora_single_device.yaml): lora_attn_modules [q_proj, v_proj, output_proj], apply_lora_to_mlp True,
# lora_dropout 0.0 (their ranks differ per model: the plan's lora_r and lora_alpha stay as given)
TORCHTUNE_DEFAULTS: dict = {"lora_dropout": 0.0}
TORCHTUNE_LORA_TARGETS = ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# model_type -> the torchtune 0.6.1 builders measured (torchtune.models.qwen2_5, llama3_2)
TORCHTUNE_FAMILIES = {"qwen2": "Qwen2.5 (torchtune.models.qwen2_5)", "llama": "Llama 3.x (torchtune.models.llama3_2)"}
AdapterDType = Literal["fp32", "bf16", "fp16"]
Trainer = Literal["sft", "dpo", "orpo", "kto", "reward", "grpo"]
ReferenceModel = Literal["copy", "adapter_disabled", "none"]
VllmMode = Literal["colocate", "server"]
Sharding = Literal["none", "ddp", "zero1", "zero2", "zero3", "zero3_hpz", "fsdp_full_shard", "fsdp_shard_grad_op",
                   "fsdp_hybrid_shard"]

METHODS: tuple[str, ...] = ("full", "lora", "qlora")
OPTIMIZERS: tuple[str, ...] = Optim.__args__  # type: ignore[attr-defined]
SHARDINGS: tuple[str, ...] = Sharding.__args__  # type: ignore[attr-defined]
FRAMEWORKS: tuple[str, ...] = Framework.__args__  # type: ignore[attr-defined]
# Fields whose choices are lower-case words: their string values are lower-cased before validation.
ENUM_FIELDS: tuple[str, ...] = ("method", "dtype", "precision", "optim", "attn_implementation", "bnb_4bit_quant_type",
                                "loss_implementation", "framework", "adapter_dtype", "sharding", "trainer",
                                "reference_model", "vllm_mode")
# Fields that are lists of module names: a comma-separated string is split.
LIST_FIELDS: tuple[str, ...] = ("target_modules", "modules_to_save")
# The fields whose type is a number (int or float, optionally null), which refuse true/false; tests/test_plan.py
# derives the same list from the annotations, so a new numeric field cannot be left out.
NUMBER_FIELDS: tuple[str, ...] = (
    "lora_r", "lora_alpha", "lora_dropout", "seq_len", "batch_size", "gradient_accumulation_steps", "beta",
    "num_generations", "max_completion_length", "generation_batch_size", "steps_per_generation",
    "vllm_gpu_memory_utilization", "vllm_max_model_length", "num_gpus", "num_nodes", "gpus_per_node", "gpu_vram_gb",
    "host_ram_gb", "headroom_percent", "learning_rate", "max_steps", "num_train_epochs", "images_per_sample",
    "min_pixels", "max_pixels", "longest_edge", "max_image_size")
# Sharded inside a node, replicated (FSDP HYBRID_SHARD) or partitioned a second time (DeepSpeed ZeRO++ hpZ) inside it:
# they need several nodes of several GPUs (estimator/sharding.py)
HYBRID_SHARDINGS: tuple[str, ...] = ("zero3_hpz", "fsdp_hybrid_shard")
# The shardings that can keep parameters on the CPU (offload_params)
PARAM_OFFLOAD_SHARDINGS: tuple[str, ...] = ("zero3", "zero3_hpz", "fsdp_full_shard", "fsdp_hybrid_shard")
# The frameworks whose activation offloading is estimated (TRL 1.16's SFT, torchtune 0.6.1; cohort v27)
ACTIVATION_OFFLOADING_FRAMEWORKS: tuple[str, ...] = ("trl", "torchtune")
# Every sharding a plan of several GPUs can name, in words (the messages that ask for one)
SHARDING_WORDS = ", ".join(s for s in SHARDINGS if s != "none")


def zero_stage(sharding: str) -> int | None:
    """The DeepSpeed ZeRO stage of a sharding (zero1/zero2/zero3, and zero3_hpz: ZeRO-3 with ZeRO++'s hpZ), else
    None."""
    return {"zero1": 1, "zero2": 2, "zero3": 3, "zero3_hpz": 3}.get(sharding)


def normalize_raw(field: str, value):
    """A raw value as people write it, made what the field expects (before validation; the MCP tools' argument
    check calls it too): every choice is lower-case, so 'QLoRA', 'BF16', 'AdamW_Torch_Fused' mean one choice
    each; 'q_proj,v_proj' (as a command line or a chat writes it) is ['q_proj', 'v_proj']; 'all-linear' stays."""
    if not isinstance(value, str):
        return value
    if field in ENUM_FIELDS:
        return value.strip().lower()
    if field in LIST_FIELDS and value.strip():
        if value.strip().lower() == "all-linear":
            return "all-linear"
        return [name for name in re.split(r"[,\s]+", value) if name]
    return value

# Upper bounds that keep every number finite and every search bounded; no real run is near them.
MAX_SEQ_LEN = 1_048_576
MAX_BATCH_SIZE = 4096
MAX_LORA_R = 4096
MAX_NUM_GPUS = 1024
MAX_GPU_VRAM_GB = 4096.0
MAX_HOST_RAM_GB = 65536.0
# Running at the boundary is what the seeds' guide warns against: a budget above 95% of the GPU's usable memory
# is "tight" even when it is under it (issue 21; docs/how-it-works.md, "The verdict").
DEFAULT_HEADROOM_PERCENT = 5.0
MAX_STRING = 512
MAX_IMAGE_SIDE = 65536  # pixels a side of a training image (PIL opens larger ones only with its bomb check off)
MAX_IMAGES_PER_SAMPLE = 256
MAX_PIXELS_KNOB = MAX_IMAGE_SIDE * MAX_IMAGE_SIDE
VisionTower = Literal["frozen", "lora", "full"]
_IMAGE_SIZE = re.compile(r"([0-9]{1,6})x([0-9]{1,6})")
MAX_MODULES = 64  # target_modules / modules_to_save entries; a decoder block has about ten linear names

SafeName = Annotated[str, Field(min_length=1, max_length=MAX_STRING)]
# Characters no model id, GPU name, dataset path or output folder needs, and that could start a new line
# or hide text in a recipe, a log or a terminal: control characters, line/paragraph separators, bidi controls.
_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
# Zero-width characters: invisible, so two different values would look the same in a recipe or a terminal.
_ZERO_WIDTH = frozenset("\u200b\u200c\u200d\u2060\ufeff")


def _unsafe_character(text: str) -> str | None:
    """The first character of ``text`` that is no plain printable text, or None."""
    if text.isascii() and text.isprintable():  # the common case, at C speed: printable ASCII has none of them
        return None
    for char in text:
        if char in _BIDI_CONTROLS or char in _ZERO_WIDTH or unicodedata.category(char) in ("Cc", "Zl", "Zp"):
            return char
    return None


def _whole(value) -> int | None:
    """A count as people give it (an int, or a string of digits), or None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) <= 1e9:
        return int(value)
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 9:
        return int(value.strip())
    return None


def _node_layout(data: dict) -> dict:
    """num_gpus = num_nodes x gpus_per_node, from what the raw plan gives (before validation).

    * num_gpus alone (the one-number form, as before nodes existed): one node of num_gpus GPUs;
    * num_nodes and gpus_per_node: num_gpus is their product (and must equal it when given too);
    * num_gpus with one of the other two: the third is num_gpus divided by it (it must divide);
    * gpus_per_node alone: one node of that many GPUs; num_nodes > 1 alone: an error (how many GPUs in each?).

    One node is stored with gpus_per_node null (the node is the num_gpus GPUs), so a one-node plan reads as it did
    before nodes existed. A value that is not a whole number is left to its field's own check; a contradiction is an
    error naming num_gpus, num_nodes and gpus_per_node."""
    raw = {name: data.get(name) for name in ("num_gpus", "num_nodes", "gpus_per_node")}
    given = {name: _whole(v) for name, v in raw.items() if v is not None}
    if any(v is None or v < 1 for v in given.values()):
        return data  # not a positive whole number: the field says so
    gpus, nodes, per_node = given.get("num_gpus"), given.get("num_nodes"), given.get("gpus_per_node")
    if nodes is None and per_node is not None and gpus is not None and gpus != per_node:
        if gpus % per_node:
            raise PlanError.about("num_gpus", f"num_gpus {gpus} is not a whole number of nodes of gpus_per_node "
                                              f"{per_node}; give num_nodes and gpus_per_node (num_gpus is their "
                                              "product)")
        nodes = gpus // per_node
    if nodes is None or nodes == 1:
        if per_node is None:
            return data  # num_gpus alone, or nothing: one node, as before nodes existed
        if gpus is not None and per_node != gpus:
            raise PlanError.about("gpus_per_node", _one_node_mismatch(per_node, gpus))
        return {**data, "num_gpus": per_node, "gpus_per_node": None}
    if per_node is None:
        if gpus is None:
            raise PlanError.about("gpus_per_node", f"num_nodes {nodes} needs the GPUs in each node: give gpus_per_node "
                                                   "(or num_gpus, all of them)")
        if gpus % nodes:
            raise PlanError.about("num_gpus", f"num_gpus {gpus} cannot be split evenly over num_nodes {nodes}; give "
                                              "num_nodes and gpus_per_node (num_gpus is their product)")
        per_node = gpus // nodes
    total = nodes * per_node
    if gpus is not None and gpus != total:
        raise PlanError.about("num_gpus", f"num_gpus {gpus} is not num_nodes {nodes} x gpus_per_node {per_node} "
                                          f"({total}); give num_gpus alone (one node), or num_nodes and gpus_per_node")
    if total > MAX_NUM_GPUS:
        raise PlanError.about("num_gpus", f"num_nodes {nodes} x gpus_per_node {per_node} is {total} GPUs; at most "
                                          f"{MAX_NUM_GPUS}")
    return {**data, "num_gpus": total, "num_nodes": nodes, "gpus_per_node": per_node}


def _one_node_mismatch(per_node: int, gpus: int) -> str:
    return (f"gpus_per_node {per_node} on one node (num_nodes 1) is not num_gpus {gpus}; give num_nodes with "
            "gpus_per_node, or num_gpus alone")


class TrainingPlan(BaseModel):
    """A fine-tuning run: the model, the method, the training configuration and the target GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)

    model: SafeName = Field(
        description=(
            "The model: a Hugging Face id ('Qwen/Qwen2.5-1.5B-Instruct'), a forgiving catalog name "
            "('qwen2.5 1.5b instruct') or a local folder holding config.json."
        ),
        examples=["Qwen/Qwen2.5-1.5B-Instruct", "meta-llama/Llama-3.1-8B"],
    )
    method: Method = Field(
        "lora",
        description="full: every weight trains; lora: frozen base + LoRA adapters; qlora: 4-bit base + LoRA adapters.",
    )
    # --- LoRA (PEFT LoraConfig names) ---
    lora_r: int = Field(16, ge=1, le=MAX_LORA_R, description="LoRA rank r (TRL default 16).")
    lora_alpha: float = Field(32, gt=0, le=1e6, description="LoRA alpha (TRL default 32); does not change memory.")
    lora_dropout: float = Field(
        0.05, ge=0, lt=1, description="LoRA dropout (TRL default 0.05); >0 keeps a dropout mask per adapted input."
    )
    target_modules: Literal["all-linear"] | list[SafeName] | None = Field(
        None,
        description=(
            "Modules that get adapters: 'all-linear', a list of module names (q_proj, k_proj, v_proj, "
            "o_proj, gate_proj, up_proj, down_proj, ...), or null for PEFT's default for the "
            "architecture (q_proj and v_proj for most decoders)."
        ),
    )
    # --- quantization (transformers BitsAndBytesConfig names) ---
    load_in_4bit: bool | None = Field(
        None, description="Load the frozen base in 4 bit (bitsandbytes). null means: on for qlora, off otherwise."
    )
    load_in_8bit: bool = Field(False, description="Load the frozen base in 8 bit (bitsandbytes LLM.int8); LoRA only.")
    bnb_4bit_quant_type: QuantType = Field("nf4", description="4-bit data type: nf4 (QLoRA default) or fp4.")
    bnb_4bit_use_double_quant: bool = Field(
        False, description="Quantize the 4-bit absmax constants again (QLoRA's double quantization, TRL "
                           "use_bnb_nested_quant)."
    )
    # --- precision ---
    dtype: DType = Field(
        "bf16",
        description="Weight and compute dtype: bf16, fp16 or fp32. Left unset, the GPU decides: bf16, or fp16 (with "
                    "fp32 master weights for full fine-tuning) on a GPU without bf16 (T4, V100, P100, RTX 20-series); "
                    "the estimate says which it chose.",
    )
    precision: Precision = Field(
        "pure",
        description=(
            "pure: weights are stored in dtype (TRL's default); mixed: fp32 master weights with autocast "
            "to dtype (transformers' fp16/bf16 AMP on an fp32 model)."
        ),
    )
    # --- optimization (TrainingArguments names) ---
    optim: Optim = Field("adamw_torch_fused", description="Optimizer, with TrainingArguments' names.")
    seq_len: int = Field(
        1024, ge=1, le=MAX_SEQ_LEN,
        description="Tokens per sample (TRL max_length; default 1024). Every sample is assumed this long."
    )
    batch_size: int = Field(
        8, ge=1, le=MAX_BATCH_SIZE, description="Micro-batch per GPU (per_device_train_batch_size; default 8)."
    )
    gradient_accumulation_steps: int = Field(
        1, ge=1, le=65536, description="Micro-batches accumulated per optimizer step; no memory cost."
    )
    # --- images (vision-language models; the processors' own names for their knobs) ---
    image_size: str | None = Field(
        None,
        description="A vision-language model's training images, 'WIDTHxHEIGHT' in pixels (e.g. '1280x720'): required "
                    "for a VLM (ask the user), refused for a text model. The processor turns each image into image "
                    "tokens, added to seq_len (the text tokens of a sample).",
        examples=["1280x720", "448x448"],
    )
    images_per_sample: int = Field(1, ge=1, le=MAX_IMAGES_PER_SAMPLE,
                                   description="Images in each training sample (a VLM; default 1).")
    vision_tower: VisionTower = Field(
        "frozen", description="What trains in a VLM's vision encoder: frozen (the default of VLM recipes), lora "
                              "(adapters on every tower and projector linear) or full (the tower's own weights "
                              "train: method full); a Qwen-VL tower that trains needs gradient checkpointing.")
    min_pixels: int | None = Field(
        None, ge=1, le=MAX_PIXELS_KNOB,
        description="Qwen-VL image processor min_pixels: images with fewer pixels are scaled up (checkpoint default "
                    "3136 = 56x56 on Qwen2.5-VL, 65536 = 256x256 on Qwen3-VL).")
    max_pixels: int | None = Field(
        None, ge=1, le=MAX_PIXELS_KNOB,
        description="Qwen-VL image processor max_pixels: images with more pixels are scaled down (checkpoint default "
                    "12845056 = 3584x3584 on Qwen2.5-VL, 16777216 = 4096x4096 on Qwen3-VL); the knob that bounds a "
                    "large image's tokens.")
    do_image_splitting: bool | None = Field(
        None,
        description="Idefics3/SmolVLM image processor do_image_splitting: each image split into tiles of the tower's "
                    "size plus a global image (the checkpoints' default, on: up to 17 tiles of 64 tokens on "
                    "SmolVLM), or, off, the global image alone (64 tokens).")
    max_image_size: int | None = Field(
        None, ge=1, le=IDEFICS3_MAX_IMAGE_SIDE,
        description="Idefics3/SmolVLM image processor max_image_size={'longest_edge': N}: the side of the tiles an "
                    "image is cut into (checkpoint default: the tower's image_size, 512 on SmolVLM), at most that and "
                    "a multiple of patch_size x scale_factor (64 on SmolVLM); the recipe sets the processor's "
                    "image_seq_len to match ((N / patch_size)² / scale_factor² tokens a tile: 36 at 384).")
    longest_edge: int | None = Field(
        None, ge=1, le=IDEFICS3_MAX_IMAGE_SIDE,
        description="Idefics3/SmolVLM image processor size={'longest_edge': N}: each image resized so its longest "
                    "side is N px before it is split into tiles of the tower's size (checkpoint default: 4 tiles, "
                    "2048 on SmolVLM-256M); 1024 makes a 1280x720 image 4 tiles and the global image instead of 12 "
                    "and the global image.")
    gradient_checkpointing: bool = Field(
        True, description="Recompute each layer in backward instead of keeping its activations (TRL default: on)."
    )
    attn_implementation: AttnImplementation | None = Field(
        None,
        description=(
            "Attention: sdpa (PyTorch's flash/memory-efficient kernels on a GPU), flash_attention_2 or eager; "
            "null means transformers' default: sdpa where the model supports it, else eager (Gemma2)."
        ),
    )
    loss_implementation: LossImplementation | None = Field(
        None,
        description=(
            "chunked: TRL's fused LM head, which scores the vocabulary in tiles and never builds the full "
            "logits (SFTTrainer's default since TRL 1.x); standard: transformers' cross-entropy over the full "
            "batch x seq x vocab logits, upcast to fp32; null: the framework's choice (chunked for trl, "
            "standard for the others)."
        ),
    )
    # --- the training stack (which trainer runs the plan) ---
    framework: Framework = Field(
        "trl",
        description=(
            "The trainer the user runs: trl (TRL 1.16 SFTTrainer, the recipe's), transformers (transformers "
            "Trainer + PEFT as the PEFT/bitsandbytes docs teach: full logits, prepare_model_for_kbit_training "
            "for 4/8-bit bases), axolotl, llama_factory, unsloth, litgpt (LitGPT 0.5.13's finetune lora/full: "
            "bf16-true, its own loss, no checkpointing) or torchtune (torchtune 0.6.1's single-device recipes: "
            "bf16 model, chunked cross-entropy, NF4 QLoRA; Qwen2.5 and Llama 3.x). It sets the defaults of "
            "loss_implementation, prepare_model_for_kbit_training and adapter_dtype. Ask the user when they have "
            "their own script."
        ),
    )
    prepare_model_for_kbit_training: bool | None = Field(
        None,
        description=(
            "Whether peft.prepare_model_for_kbit_training runs on the 4/8-bit base (it upcasts embeddings, norms "
            "and lm_head to fp32, so the residual stream runs in fp32); null: the framework's choice."
        ),
    )
    adapter_dtype: AdapterDType | None = Field(
        None,
        description=(
            "dtype of the LoRA adapters and their optimizer states; null: the framework's choice (PEFT keeps "
            "fp32; TRL casts to bf16 on a quantized base)."
        ),
    )
    modules_to_save: list[SafeName] | None = Field(
        None,
        max_length=MAX_MODULES,
        description=(
            "PEFT modules_to_save: modules trained in full beside the adapters (e.g. ['embed_tokens', "
            "'lm_head']), each a trainable copy with its gradients and optimizer states."
        ),
    )
    use_dora: bool = Field(
        False,
        description="PEFT use_dora: weight-decomposed LoRA (a magnitude vector and the weight norm per adapted linear)."
    )
    optimizer_in_backward: bool = Field(
        False, description="torchtune's optimizer_in_bwd (its full single-device YAMLs' default): one optimizer per "
                           "parameter, stepped as soon as that parameter's gradient is made, so the whole gradient "
                           "set never exists. framework torchtune, method full, no gradient accumulation."
    )
    activation_offloading: bool = Field(
        False, description="TRL's activation_offloading (SFT) or torchtune's enable_activation_offloading: the "
                           "tensors saved for backward are copied to CPU memory in forward and brought back in "
                           "backward. Modelled with gradient_checkpointing (what torchtune requires): each block's "
                           "checkpointed input leaves the GPU; one GPU, text models, framework trl or torchtune."
    )
    torch_compile: bool = Field(
        False, description="torch.compile (TrainingArguments' and Axolotl's and LLaMA-Factory's torch_compile, "
                           "torchtune's compile, accelerate's dynamo backend, DeepSpeed's compile): not modelled, "
                           "so refused by name; false estimates the eager run."
    )
    packing: bool = Field(
        False,
        description=(
            "TRL packing: samples are concatenated into seq_len-token rows; memory as for full rows of seq_len "
            "tokens (the estimate already assumes every row is seq_len long)."
        ),
    )
    padding_free: bool = Field(
        False,
        description="TRL padding_free: one row of batch_size x seq_len tokens without padding; the same tokens, the "
                    "same memory as full rows.",
    )
    use_liger_kernel: bool = Field(
        False, description="Liger kernels (fused RMSNorm, SwiGLU, RoPE, fused linear cross-entropy): not modelled yet: "
                           "refused."
    )
    # --- the trainer (TRL 1.16's names; null: the trainer's default, estimator/trainers.py) ---
    trainer: Trainer = Field(
        "sft",
        description=(
            "TRL trainer: sft (SFTTrainer), dpo, orpo, kto, reward (RewardTrainer, a sequence-classification head) "
            "or grpo. For dpo/orpo/kto/reward, seq_len is max_length (the prompt with each of chosen and rejected); "
            "for grpo it is the longest prompt plus its completion (max_completion_length). Ask for dpo/kto: is the "
            "reference a copy, the adapter-disabled base, or precomputed; for grpo: num_generations, "
            "max_completion_length, beta (a reference only above 0), use_vllm and vllm_mode."
        ),
    )
    precompute_ref_log_probs: bool | None = Field(
        None, description="dpo/kto: compute the reference log-probabilities once before training (no reference model "
                          "in the step)."
    )
    reference_model: ReferenceModel | None = Field(
        None,
        description=(
            "dpo/kto/grpo: the reference model: copy (a second frozen model), adapter_disabled (the PEFT base with "
            "adapters off; TRL's choice with LoRA) or none; null: TRL's choice."
        ),
    )
    loss_type: str | None = Field(
        None, max_length=32, pattern=r"^[a-z0-9_]+$",
        description="dpo (default sigmoid) or grpo (default dapo) loss_type."
    )
    beta: float | None = Field(
        None, ge=0, le=1e3, description="dpo/orpo/kto (default 0.1) or grpo (default 0.0: no reference model) beta."
    )
    num_generations: int | None = Field(None, ge=1, le=4096, description="grpo: completions per prompt (default 8).")
    max_completion_length: int | None = Field(
        None, ge=1, le=MAX_SEQ_LEN, description="grpo: tokens per completion (default 512)."
    )
    generation_batch_size: int | None = Field(
        None, ge=1, le=1_048_576,
        description="grpo: completions generated at once (default batch_size x GPUs x steps_per_generation)."
    )
    steps_per_generation: int | None = Field(
        None, ge=1, le=65536,
        description="grpo: optimizer micro-steps per generation round (default gradient_accumulation_steps)."
    )
    use_vllm: bool | None = Field(
        None, description="grpo: generate with vLLM instead of model.generate (default false)."
    )
    vllm_mode: VllmMode | None = Field(
        None, description="grpo with use_vllm: colocate (vLLM shares the training GPU) or server (its own GPUs)."
    )
    vllm_gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="grpo, vLLM colocate: the fraction of the GPU vLLM reserves (default 0.3)."
    )
    vllm_max_model_length: int | None = Field(
        None, ge=1, le=MAX_SEQ_LEN, description="grpo, vLLM: the context vLLM allocates its KV cache for."
    )
    # --- hardware and distribution ---
    num_gpus: int = Field(
        1, ge=1, le=MAX_NUM_GPUS,
        description="GPUs training together, on all nodes (num_nodes x gpus_per_node); the estimate is per GPU. Given "
                    "alone: one node of num_gpus GPUs.")
    num_nodes: int = Field(
        1, ge=1, le=MAX_NUM_GPUS,
        description="Machines (nodes) training together, each with gpus_per_node GPUs; more than 1 makes a multi-node "
                    "recipe (launch.sh per node, slurm.sbatch).")
    gpus_per_node: int | None = Field(
        None, ge=1, le=MAX_NUM_GPUS,
        description="GPUs in each node when num_nodes > 1 (num_gpus is num_nodes x gpus_per_node); null: all num_gpus "
                    "on one node.")
    sharding: Sharding = Field(
        "none",
        description="none (one GPU), ddp, zero1, zero2, zero3, zero3_hpz (ZeRO-3 with ZeRO++'s hierarchical "
                    "partitioning: a second copy of the weights partitioned inside each node), fsdp_full_shard, "
                    "fsdp_shard_grad_op, fsdp_hybrid_shard (FSDP HYBRID_SHARD: sharded inside a node, replicated "
                    "across nodes). Left unset with num_gpus > 1, the estimate picks the cheapest that fits (ddp, then "
                    "zero2, zero3) and says so.",
    )
    offload_optimizer: bool = Field(False, description="Keep optimizer states on the CPU (ZeRO/FSDP offload).")
    offload_params: bool = Field(
        False, description="Keep parameters on the CPU between uses (ZeRO-3/FSDP full shard offload)."
    )
    gpu: SafeName | None = Field(None, description="Target GPU from the catalog ('RTX 4090', 'A100 80GB', 'H100').")
    gpu_vram_gb: float | None = Field(
        None, gt=0, le=MAX_GPU_VRAM_GB,
        description="Target GPU memory, read as GiB (2^30 bytes, as torch reports total_memory): 16 for a 16 GB "
                    "card. Instead of gpu."
    )
    host_ram_gb: float | None = Field(
        None, gt=0, le=MAX_HOST_RAM_GB,
        description="The machine's host RAM in GiB: CPU offload that needs more is judged not to fit, and suggest "
                    "never proposes it. Unset: offload suggestions state their host-RAM need.",
    )
    headroom_percent: float = Field(
        DEFAULT_HEADROOM_PERCENT, ge=0, le=50,
        description="Share of the GPU's usable memory to keep free beyond the safety margin: a budget above "
                    "(100 - headroom_percent) per cent of the GPU is 'tight', not 'fits' (default 5).",
    )
    # --- the run itself (recipe) ---
    dataset: SafeName | None = Field(
        None, description="Training data for the recipe: a JSONL file or a dataset folder."
    )
    truncation: bool = Field(False, description="Truncate samples longer than seq_len instead of refusing them.")
    learning_rate: float | None = Field(
        None, gt=0, le=1.0,
        description=(
            "Learning rate (no memory cost); null means by method: 2e-4 for lora/qlora (the QLoRA paper, Dettmers et "
            "al. 2023, appendix: 2e-4 for 7B-13B; TRL's documented LoRA examples: 2e-4), 2e-5 for full (SFTConfig's "
            "default; full fine-tuning uses about 1e-5 to 2e-5)."
        ),
    )
    max_steps: int = Field(-1, ge=-1, le=10_000_000, description="Optimizer steps to run; -1 trains num_train_epochs.")
    num_train_epochs: float = Field(1.0, gt=0, le=1000, description="Epochs when max_steps is -1.")
    output_dir: SafeName = Field(
        "outputs", description="Where the recipe writes checkpoints (relative to the recipe folder)."
    )

    @model_validator(mode="before")
    @classmethod
    def _framework_defaults(cls, data):
        """A framework whose defaults differ from TRL's in fields every plan has: LitGPT 0.5.13's finetune scripts
        (litgpt/finetune/lora.py ``setup``: lora_r 8, lora_alpha 16, lora_dropout 0.05; micro_batch_size 1 of a
        global batch of 16; AdamW (torch, foreach on CUDA); no activation checkpointing on one device) and
        LLaMA-Factory 0.9.5's (:data:`LLAMA_FACTORY_DEFAULTS`, every linear adapted, 4-bit with double quantization)
        fill what the plan leaves unset or null (an MCP client sends null for "default"), so an unset field means what
        it means in that framework."""
        if not isinstance(data, dict):
            return data
        framework = str(data.get("framework") or "").strip().lower()
        method = str(data.get("method") or "lora").strip().lower()
        defaults: dict = {}
        if framework == "litgpt":
            defaults = dict(LITGPT_DEFAULTS)
        elif framework == "torchtune":
            defaults = dict(TORCHTUNE_DEFAULTS)
            if method in ("lora", "qlora"):
                defaults["target_modules"] = TORCHTUNE_LORA_TARGETS
        elif framework == "llama_factory":  # its LoRA targets every linear; it loads 4-bit with double quantization
            defaults = dict(LLAMA_FACTORY_DEFAULTS)
            if method in ("lora", "qlora"):
                defaults["target_modules"] = "all-linear"
            if method == "qlora" or data.get("load_in_4bit"):
                defaults["bnb_4bit_use_double_quant"] = True
        if not defaults:
            return data
        return {**defaults, **{k: v for k, v in data.items() if v is not None or k not in defaults}}

    @model_validator(mode="before")
    @classmethod
    def _gpu_count_in_name(cls, data):
        """'2x RTX 4090', '8xH100', 'Kaggle T4 x2': the count goes to num_gpus, the card to gpu. A count that
        contradicts num_gpus is an error naming both. Then the nodes: num_gpus = num_nodes x gpus_per_node
        (:func:`_node_layout`)."""
        if not isinstance(data, dict):
            return data
        if not isinstance(data.get("gpu"), str):
            return _node_layout(data)
        from .gpu_names import split_gpu_count

        count, name = split_gpu_count(data["gpu"])
        if count is None:
            return _node_layout(data)
        given = data.get("num_gpus")
        if given is not None and not isinstance(given, bool) and given != count:
            raise PlanError.about("num_gpus", f"gpu {data['gpu']!r} names {count} GPUs but num_gpus is {given}; "
                                              "give the count once")
        return _node_layout({**data, "gpu": name, "num_gpus": count})

    @field_validator("lora_alpha", "lora_dropout", "gpu_vram_gb", "learning_rate", "num_train_epochs", "beta",
                     "vllm_gpu_memory_utilization", "host_ram_gb", "headroom_percent")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError(f"must be a finite number; got {value}")
        return value

    @field_validator(*ENUM_FIELDS, *LIST_FIELDS, mode="before")
    @classmethod
    def _as_people_write_it(cls, value, info):
        return normalize_raw(info.field_name, value)

    @field_validator("target_modules", "modules_to_save")
    @classmethod
    def _targets(cls, value):
        if isinstance(value, list):
            if not value:
                raise ValueError("must name at least one module, or be 'all-linear' or null")
            if len(value) > MAX_MODULES:
                raise ValueError(f"at most {MAX_MODULES} module names; got {len(value)}")
            for name in value:
                if not all(c.isalnum() or c in "_.-" for c in name):
                    raise ValueError(f"module names are letters, digits, '_', '.', '-'; got {name!r}")
            return sorted(set(value))
        return value

    @field_validator("model", "gpu", "dataset", "output_dir")
    @classmethod
    def _plain_text(cls, value: str | None) -> str | None:
        bad = _unsafe_character(value) if value is not None else None
        if bad is not None:
            raise ValueError(f"must be plain text without control characters (newline, tab, NUL, ...); found {bad!r}")
        return value

    @field_validator("image_size", mode="before")
    @classmethod
    def _image_size_words(cls, value):
        """'1280x720', also written '1280X720', '1280 x 720', '1280*720' or with the multiplication sign; each side 1 to
        MAX_IMAGE_SIDE pixels."""
        if value is None:
            return None
        if not isinstance(value, str):
            raise ValueError(f"must be 'WIDTHxHEIGHT' in pixels, e.g. '1280x720'; got {value!r}")
        text = value.strip().lower().replace("\u00d7", "x").replace("*", "x").replace(" ", "")
        match = _IMAGE_SIZE.fullmatch(text)
        if match is None:
            raise ValueError(f"must be 'WIDTHxHEIGHT' in pixels, e.g. '1280x720'; got {value[:40]!r}")
        width, height = int(match.group(1)), int(match.group(2))
        if not (1 <= width <= MAX_IMAGE_SIDE and 1 <= height <= MAX_IMAGE_SIDE):
            raise ValueError(f"each side must be 1 to {MAX_IMAGE_SIDE} pixels; got {width}x{height}")
        return f"{width}x{height}"

    @field_validator(*NUMBER_FIELDS, mode="before")
    @classmethod
    def _no_bool_as_number(cls, value):
        # true/false is never a number here (pydantic would read true as 1): a recipe's `seq_len: true` is an error
        if isinstance(value, bool):
            raise ValueError(f"must be a number, not {str(value).lower()}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TrainingPlan:
        four_bit = self.quantized_4bit
        self._check_image_fields()
        self._check_stack_fields()
        self._check_trainer_fields()
        if self.method == "full" and (four_bit or self.load_in_8bit):
            raise PlanError.about("method",
                "full fine-tuning cannot train a quantized base; use method 'qlora' (4-bit) or 'lora', "
                "or turn quantization off"
            )
        if self.method == "qlora" and self.load_in_4bit is False:
            raise PlanError.about("load_in_4bit", "qlora means a 4-bit base; use method 'lora' for an unquantized base")
        if self.method == "lora" and self.load_in_4bit:
            raise PlanError.about("load_in_4bit", "a 4-bit base with adapters is method 'qlora'; set method to 'qlora'")
        if four_bit and self.load_in_8bit:
            raise PlanError.about("load_in_8bit", "4-bit and 8-bit quantization cannot both be on; pick one")
        self._check_nodes()
        if self.sharding == "none" and self.num_gpus > 1 and "sharding" in self.model_fields_set:
            raise PlanError.about("sharding",
                f"{self.num_gpus} GPUs need a sharding strategy ({SHARDING_WORDS}); got 'none'"
            )
        if self.offload_params and self.sharding not in PARAM_OFFLOAD_SHARDINGS:
            raise PlanError.about("offload_params",
                f"parameter offload needs sharding {', '.join(repr(s) for s in PARAM_OFFLOAD_SHARDINGS)}; got "
                f"'{self.sharding}'"
            )
        if self.offload_optimizer and self.sharding in ("none", "ddp"):
            raise PlanError.about("offload_optimizer",
                f"optimizer offload needs ZeRO or FSDP sharding; got '{self.sharding}'"
            )
        if self.offload_optimizer and not self.offload_params and self.sharding.startswith("fsdp"):
            # FSDP has one offload (accelerate's fsdp_offload_params, torch's CPUOffloadPolicy): parameters, gradients
            # and the optimizer step move to the CPU together; there is no optimizer-only offload to render
            raise PlanError.about("offload_optimizer",
                "FSDP offloads parameters, gradients and optimizer states together; set "
                "offload_params: true as well (sharding fsdp_full_shard), or use sharding zero2/zero3 to offload only "
                "the optimizer"
            )
        if self.precision == "mixed" and self.dtype == "fp32":
            raise PlanError.about("precision", "'mixed' means fp32 master weights with bf16/fp16 compute; "
                             "with dtype fp32 use 'pure'")
        if self.dtype == "fp16" and self.method == "full" and self.precision == "pure":
            raise PlanError.about("precision",
                "full fine-tuning with pure fp16 weights cannot train (the fp16 gradient scaler refuses fp16 "
                "gradients); set precision: mixed, or dtype: bf16")
        if self.gpu is not None and self.gpu_vram_gb is not None:
            raise PlanError.about("gpu", "give either gpu (a catalog name) or gpu_vram_gb (a size), not both")
        return self

    def _check_nodes(self) -> None:
        """num_gpus = num_nodes x gpus_per_node (what _node_layout derived; a value it could not read is checked
        here), and the hybrid shardings only where there is a node to shard inside and nodes to span."""
        per_node = self.gpus_per_node
        if self.num_nodes > 1 and (per_node is None or self.num_gpus != self.num_nodes * per_node):
            raise PlanError.about("num_gpus", f"num_gpus {self.num_gpus} is not num_nodes {self.num_nodes} x "
                                              f"gpus_per_node {per_node}; give num_gpus alone (one node), or num_nodes "
                                              "and gpus_per_node")
        if self.num_nodes == 1 and per_node not in (None, self.num_gpus):
            raise PlanError.about("gpus_per_node", _one_node_mismatch(per_node, self.num_gpus))
        if self.sharding in HYBRID_SHARDINGS:
            flat = "zero3" if self.sharding == "zero3_hpz" else "fsdp_full_shard"
            what = ("partitions a second copy of the weights inside each node (ZeRO++ hpZ)"
                    if self.sharding == "zero3_hpz" else "shards inside a node and replicates across nodes")
            if self.num_nodes == 1:
                raise PlanError.about("sharding", f"{self.sharding} {what}: it needs num_nodes > 1 (got one node of "
                                                  f"{self.num_gpus} GPUs); on one node use {flat}")
            if self.node_gpus == 1:
                instead = "zero3" if self.sharding == "zero3_hpz" else "ddp or fsdp_full_shard"
                raise PlanError.about("sharding", f"{self.sharding} {what}: with gpus_per_node 1 there is nothing to "
                                                  f"shard inside a node; use {instead}")

    def _check_image_fields(self) -> None:
        """Image settings need images; the processor's bounds must be in order. Whether the model reads images at
        all is the model's to say (estimator/resolved.py)."""
        if self.image_size is None:
            given = [name for name in ("min_pixels", "max_pixels", "do_image_splitting", "longest_edge",
                                       "max_image_size")
                     if getattr(self, name) is not None]
            given += [name for name, default in (("images_per_sample", 1), ("vision_tower", "frozen"))
                      if getattr(self, name) != default]
            if given:
                raise PlanError.about(given[0], "describes the training images; give image_size too "
                                                "('WIDTHxHEIGHT', e.g. '1280x720')")
        if self.min_pixels is not None and self.max_pixels is not None and self.min_pixels > self.max_pixels:
            raise PlanError.about("min_pixels", f"{self.min_pixels} is above max_pixels {self.max_pixels}")

    @property
    def image_width_height(self) -> tuple[int, int] | None:
        """(width, height) of ``image_size``, or None without images."""
        if self.image_size is None:
            return None
        width, height = self.image_size.split("x")
        return int(width), int(height)

    def _check_trainer_fields(self) -> None:
        """Fields of another trainer are refused, naming them and the trainers that have them."""
        values = {name: getattr(self, name) for name in TRAINER_FIELDS}
        for name in refused_fields(self.trainer, values):
            owners = ", ".join(t for t in TRAINERS if t in TRAINER_FIELDS[name])
            raise PlanError.about(name, f"a setting of trainer {owners}; got trainer '{self.trainer}'")

    def _check_stack_fields(self) -> None:
        """The PEFT/TRL knobs: refused where they mean nothing, or where their memory is not modelled."""
        if self.framework == "litgpt":
            self._check_litgpt()
        if self.framework == "torchtune":
            self._check_torchtune()
        if self.optimizer_in_backward and (self.framework != "torchtune" or self.method != "full"):
            raise PlanError.about("optimizer_in_backward", "torchtune's optimizer_in_bwd (framework torchtune, method "
                                  f"'full': its full recipe's setting); got framework '{self.framework}', method "
                                  f"'{self.method}'")
        if self.optimizer_in_backward and self.gradient_accumulation_steps > 1:
            raise PlanError.about("optimizer_in_backward", "torchtune refuses optimizer_in_bwd with gradient "
                                  "accumulation (each parameter steps in every backward); set "
                                  "gradient_accumulation_steps 1")
        if self.activation_offloading:
            self._check_activation_offloading()
        if self.torch_compile:
            raise PlanError.about("torch_compile", TORCH_COMPILE_REFUSAL)
        if self.use_liger_kernel:
            raise PlanError.about("use_liger_kernel",
                "Liger's fused kernels are not modelled yet; estimate without them (for the loss, "
                "loss_implementation 'chunked' is close to Liger's fused linear cross-entropy)"
            )
        if not self.uses_adapters:
            for name in ("modules_to_save", "use_dora", "adapter_dtype", "prepare_model_for_kbit_training"):
                if getattr(self, name) not in (None, False):
                    raise PlanError.about(name, f"a PEFT setting, for method 'lora' or 'qlora'; got method "
                                     f"'{self.method}'")
        if self.prepare_model_for_kbit_training and not (self.quantized_4bit or self.load_in_8bit):
            raise PlanError.about("prepare_model_for_kbit_training",
                "it prepares a 4-bit or 8-bit base; use method 'qlora' or "
                "load_in_8bit, or leave it null"
            )

    def _check_activation_offloading(self) -> None:
        """Activation offloading as measured (TRL 1.16's and torchtune 0.6.1's OffloadActivations, cohort v27): with
        checkpointing, on one GPU, for a text model trained by TRL's SFTTrainer or torchtune's recipes."""
        whose = ("torchtune's enable_activation_offloading" if self.framework == "torchtune"
                 else "TRL's activation_offloading")
        refusals = (
            ("framework", self.framework not in ACTIVATION_OFFLOADING_FRAMEWORKS, "activation offloading is "
             "modelled as TRL's SFTTrainer and torchtune's recipes run it (framework 'trl' or 'torchtune')"),
            ("trainer", self.trainer != "sft", f"{whose} is modelled for supervised fine-tuning (trainer 'sft'); "
             "the preference trainers' offloading is not measured yet"),
            ("gradient_checkpointing", not self.gradient_checkpointing, f"{whose} is modelled with gradient "
             "checkpointing on (torchtune refuses it without; without checkpointing TRL keeps every storage saved "
             "twice on the GPU, which is not modelled yet): set gradient_checkpointing true"),
            ("num_gpus", self.num_gpus > 1 or self.sharding != "none", f"{whose} on several GPUs is not modelled "
             "yet; estimate one GPU"),
            ("load_in_8bit", self.load_in_8bit, "bitsandbytes' 8-bit linears keep their inputs outside autograd's "
             "saved tensors, which offloading does not move; with offloading this is not measured yet"),
            ("image_size", self.image_size is not None, f"{whose} for a "
             "vision-language model is not measured yet; estimate without it (an upper bound for the GPU)"),
        )
        for field, refused, why in refusals:
            if refused:
                raise PlanError.about(field if field != "framework" else "activation_offloading",
                                      f"{why}; got {field} {getattr(self, field)!r}" if field == "framework" else why)

    def _check_litgpt(self) -> None:
        """What LitGPT 0.5.13's single-device fine-tuning (litgpt/finetune/lora.py, full.py) runs, and nothing else."""
        refusals = (
            ("trainer", self.trainer != "sft", "LitGPT's finetune scripts are supervised fine-tuning (trainer 'sft')"),
            ("method", self.method == "qlora" or self.load_in_8bit or bool(self.load_in_4bit),
             "LitGPT's --quantize (bitsandbytes through Lightning's precision plugin) is not modelled yet; use "
             "method 'lora' or 'full' with framework litgpt, or estimate QLoRA with framework 'trl'"),
            ("num_gpus", self.num_gpus > 1, "LitGPT on several GPUs (FSDP through ModelParallelStrategy) is not "
             "modelled yet; estimate one GPU"),
            ("sharding", self.sharding != "none" or self.offload_optimizer or self.offload_params, "LitGPT's "
             "single-device finetune scripts shard and offload nothing (no DeepSpeed, no FSDP on one GPU)"),
            ("gradient_checkpointing", self.gradient_checkpointing, "LitGPT's single-device finetune scripts have no "
             "activation checkpointing; set gradient_checkpointing false"),
            ("loss_implementation", self.loss_implementation is not None, "LitGPT computes its own loss (chunked "
             "cross-entropy over fp32 logit chunks); leave loss_implementation null"),
            ("dtype", self.dtype != "bf16" or self.precision != "pure", "the LitGPT stack is modelled for its "
             "bf16-true precision (dtype bf16, precision pure)"),
            ("attn_implementation", self.attn_implementation not in (None, "sdpa"), "LitGPT runs "
             "scaled_dot_product_attention (attn_implementation sdpa)"),
            ("optim", self.optim not in ("adamw_torch", "adamw_torch_fused", "sgd"), "the LitGPT stack is measured "
             "with torch's AdamW (adamw_torch, LitGPT's default; adamw_torch_fused) and SGD (sgd)"),
        )
        for field, refused, why in refusals:
            if refused:
                raise PlanError.about(field, f"framework litgpt: {why}")
        for name in ("modules_to_save", "use_dora", "packing", "padding_free"):
            if getattr(self, name) not in (None, False):
                raise PlanError.about(name, "framework litgpt: LitGPT has no such setting here; leave it unset")
        targets = self.target_modules
        if isinstance(targets, list):
            mlp = {"gate_proj", "up_proj", "down_proj"}
            unknown = sorted(set(targets) - mlp - {"q_proj", "k_proj", "v_proj", "o_proj"})
            if unknown or (mlp & set(targets) and not mlp <= set(targets)):
                raise PlanError.about("target_modules", "framework litgpt: LitGPT's LoRA flags adapt q_proj, k_proj, "
                                      "v_proj and o_proj each (lora_query, lora_key, lora_value, lora_projection) "
                                      "and gate_proj, up_proj and down_proj together (lora_mlp); got "
                                      + ", ".join(targets))

    def _check_torchtune(self) -> None:
        """What torchtune 0.6.1's single-device recipes (lora_finetune_single_device.py, full_finetune_single_device.py)
        run, as modelled and measured, and nothing else."""
        refusals = (
            ("trainer", self.trainer != "sft", "torchtune's single-device fine-tuning recipes are supervised "
             "fine-tuning (trainer 'sft')"),
            ("num_gpus", self.num_gpus > 1 or self.sharding != "none" or self.offload_optimizer
             or self.offload_params, "torchtune's distributed recipes (FSDP2) are not modelled yet; estimate its "
             "single-device recipes (one GPU, no sharding or offload)"),
            ("load_in_8bit", self.load_in_8bit, "torchtune has no 8-bit base; use method 'qlora' (torchao NF4)"),
            ("bnb_4bit_quant_type", self.quantized_4bit and (self.bnb_4bit_quant_type != "nf4"
                                                           or self.bnb_4bit_use_double_quant),
             "torchtune's QLoRA is torchao's NF4 (its own scaler quantization); leave bnb_4bit_quant_type nf4 and "
             "bnb_4bit_use_double_quant off"),
            ("loss_implementation", self.loss_implementation not in (None, "torchtune"), "torchtune computes its "
             "own loss (CEWithChunkedOutputLoss over 8 logit chunks); leave loss_implementation null"),
            ("dtype", self.dtype != "bf16" or self.precision != "pure", "the torchtune stack is modelled for its "
             "bf16 model (dtype bf16, precision pure: no fp32 master weights)"),
            ("attn_implementation", self.attn_implementation not in (None, "sdpa"), "torchtune runs "
             "scaled_dot_product_attention (attn_implementation sdpa)"),
            ("optim", self.optim not in ("adamw_torch", "adamw_torch_fused"), "the torchtune stack is measured with "
             "torch's AdamW (fused: its LoRA YAMLs' choice; its full YAMLs' bitsandbytes optimizers and "
             "optimizer_in_bwd are not modelled yet: AdamW without them is an upper bound)"),
            ("adapter_dtype", self.adapter_dtype not in (None, "bf16"), "torchtune builds its adapters in bf16"),
        )
        for field, refused, why in refusals:
            if refused:
                raise PlanError.about(field, f"framework torchtune: {why}")
        for name in ("modules_to_save", "use_dora", "packing", "padding_free", "prepare_model_for_kbit_training"):
            if getattr(self, name) not in (None, False):
                raise PlanError.about(name, "framework torchtune: not modelled for torchtune (its packed datasets "
                                            "run flex attention; DoRA and trained copies are other builders); "
                                            "leave it unset")
        targets = self.target_modules
        if isinstance(targets, list) or targets == "all-linear":
            names = set(TORCHTUNE_LORA_TARGETS) | {"k_proj"} if targets == "all-linear" else set(targets)
            mlp = {"gate_proj", "up_proj", "down_proj"}
            unknown = sorted(names - mlp - {"q_proj", "k_proj", "v_proj", "o_proj"})
            if unknown or (mlp & names and not mlp <= names):
                raise PlanError.about("target_modules", "framework torchtune: its LoRA builders adapt q_proj, k_proj, "
                                      "v_proj and o_proj each (lora_attn_modules; o_proj is its output_proj) and "
                                      "gate_proj, up_proj and down_proj together (apply_lora_to_mlp); the output "
                                      "head (apply_lora_to_output) is not modelled; got " + ", ".join(sorted(names)))

    @property
    def quantized_4bit(self) -> bool:
        """Whether the frozen base is stored in 4 bit (explicitly, or because the method is qlora)."""
        return bool(self.load_in_4bit) or (self.load_in_4bit is None and self.method == "qlora")

    @property
    def stack(self) -> Stack:
        """The framework's defaults (estimator/stacks.py)."""
        return STACKS[self.framework]

    @property
    def effective_loss_implementation(self) -> EffectiveLoss:
        """The plan's loss_implementation, or its framework's when left null."""
        return self.loss_implementation or self.stack.loss_implementation

    @property
    def effective_kbit_preparation(self) -> bool:
        """Whether prepare_model_for_kbit_training runs: only on a 4/8-bit base, by the plan or its framework."""
        if not (self.quantized_4bit or self.load_in_8bit):
            return False
        if self.prepare_model_for_kbit_training is not None:
            return self.prepare_model_for_kbit_training
        return self.stack.kbit_preparation

    @property
    def sharding_unset(self) -> bool:
        """Several GPUs and no sharding given: the estimate picks the cheapest that fits (estimator/defaults.py)."""
        return self.num_gpus > 1 and self.sharding == "none"

    @property
    def node_gpus(self) -> int:
        """The GPUs in one node: gpus_per_node, or num_gpus on one node."""
        return self.gpus_per_node or self.num_gpus

    @property
    def shard_gpus(self) -> int:
        """The GPUs that parameters, gradients and optimizer states are sharded over: every GPU, except under FSDP's
        HYBRID_SHARD (the GPUs of one node; the nodes hold replicas)."""
        return self.node_gpus if self.sharding == "fsdp_hybrid_shard" else self.num_gpus

    def gpus_words(self) -> str:
        """'8 GPUs', or '2 nodes of 8 GPUs (16 GPUs)' for several nodes."""
        if self.num_nodes > 1:
            per = f"{self.node_gpus} GPU{'s' if self.node_gpus != 1 else ''}"
            return f"{self.num_nodes} nodes of {per} ({self.num_gpus} GPUs)"
        return f"{self.num_gpus} GPU{'s' if self.num_gpus != 1 else ''}"

    @property
    def dtype_unset(self) -> bool:
        """No dtype given: the GPU decides (bf16, or fp16 where it has none; estimator/defaults.py)."""
        return "dtype" not in self.model_fields_set

    @property
    def uses_adapters(self) -> bool:
        return self.method in ("lora", "qlora")

    @property
    def effective_learning_rate(self) -> float:
        """The plan's learning_rate, or by method when null: 2e-4 for LoRA/QLoRA, 2e-5 for full fine-tuning."""
        if self.learning_rate is not None:
            return self.learning_rate
        return 2e-4 if self.uses_adapters else 2e-5

    def replace(self, **changes) -> TrainingPlan:
        """A new validated plan with some fields changed."""
        # the fields' values as validated: what model_dump gives for this flat model of plain values, without its
        # serializer pass (a search makes a hundred plans this way); validation copies the two list fields
        data = dict(self.__dict__)
        if self.sharding_unset and "sharding" not in changes:
            del data["sharding"]  # still left to the estimate to choose (estimator/estimate.py)
        _relayout(data, self, set(changes) & {"num_gpus", "num_nodes", "gpus_per_node"})
        data.update(changes)
        return TrainingPlan(**data)


# Why torch.compile is refused (the plan's torch_compile; the config readers map every format's key to it)
TORCH_COMPILE_REFUSAL = (
    "torch.compile's memory is not modelled: inductor fuses and recomputes, so other tensors are saved than in "
    "eager mode, and CUDA graphs (mode reduce-overhead, max-autotune) keep a memory pool of their own; a CPU build of "
    "torch compiles for the CPU, so it is not measured here either. Set torch_compile false (CLI --no-torch-compile) "
    "to estimate the eager run, and measure the compiled one with a short probe (`canifinetune train recipe.yaml "
    "--probe 3`)")


def _relayout(data: dict, plan: TrainingPlan, changed: set[str]) -> None:
    """Make room in ``data`` (the plan's dump) for a change of the GPU layout: what the change does not give is
    derived again. num_gpus alone is one node of num_gpus (the one-number form); num_nodes alone keeps the node's
    GPUs; gpus_per_node alone keeps the number of nodes; num_gpus with one of the two derives the other."""
    if not changed:
        return
    if changed == {"num_gpus"}:
        data.pop("num_nodes")
        data.pop("gpus_per_node")
        return
    if "num_gpus" not in changed:
        data.pop("num_gpus")
        if "gpus_per_node" not in changed:
            data["gpus_per_node"] = plan.node_gpus
        return
    for name in ("num_nodes", "gpus_per_node"):
        if name not in changed:
            data.pop(name)


PLAN_FIELDS: tuple[str, ...] = tuple(TrainingPlan.model_fields)
