"""Training stacks: what each framework does by default that changes GPU memory.

The same plan (model, method, rank, seq_len, batch) costs different memory under different trainers:
TRL's ``SFTTrainer`` scores the vocabulary in tiles and casts adapters to bf16 on a quantized base;
transformers' ``Trainer`` with PEFT, as the PEFT and bitsandbytes docs teach it, builds the full logits and
calls ``prepare_model_for_kbit_training``, which upcasts every non-quantized parameter to fp32. A
:class:`Stack` holds those defaults for one framework; the plan's low-level fields (``loss_implementation``,
``prepare_model_for_kbit_training``, ``adapter_dtype``) override them one by one.

Every entry names the version whose source it was read from. ``measured`` says whether the validation
harness runs that stack as it runs (``benchmarks/validation/fake_mode.py``); a stack that is not measured is
estimated with the conservative choice for each setting, and the estimate says so.
"""

from __future__ import annotations

from typing import Literal, NamedTuple


class Stack(NamedTuple):
    """One framework's memory-relevant defaults."""

    name: str
    title: str  # how the text output names it
    version: str  # the version whose source these defaults were read from
    loss_implementation: Literal["chunked", "standard", "litgpt", "torchtune"]  # the plan's EffectiveLoss
    kbit_preparation: bool  # calls peft.prepare_model_for_kbit_training on a quantized base
    # adapter dtype on a 4/8-bit base; None = PEFT's (fp32 on a 16-bit compute dtype)
    adapter_dtype_quantized: Literal["fp32", "bf16", "fp16"] | None  # the plan's AdapterDType
    adapter_dtype_unquantized: Literal["fp32", "bf16", "fp16"] | None  # adapter dtype on a 16-bit base; None: PEFT's
    measured: bool  # the validation harness runs this stack as the framework runs it
    source: str  # where the defaults come from
    full_weight_dtype: str | None = None  # full fine-tuning: dtype the trainable weights are cast to (None: the plan's)
    # A stack whose step a TRL recipe cannot carry (its own model code and loss): what of it, in words, and the commands
    # that train it, (LoRA and QLoRA, full); None for the stacks canifinetune's TRL recipe trains
    own_step: str | None = None
    own_commands: tuple[str, str] | None = None

    def own_command(self, method: str) -> str | None:
        """The command that trains ``method`` with this stack's own tool, or None when a TRL recipe carries it."""
        if self.own_commands is None:
            return None
        return self.own_commands[1] if method == "full" else self.own_commands[0]


STACKS: dict[str, Stack] = {
    "trl": Stack(
        name="trl",
        title="TRL SFTTrainer",
        version="trl 1.16",
        loss_implementation="chunked",
        kbit_preparation=False,
        adapter_dtype_quantized="bf16",
        adapter_dtype_unquantized=None,
        measured=True,
        source=(
            "trl/trainer/sft_trainer.py (1.16): the fused LM head (add_fused_lm_head) scores the vocabulary in "
            "tiles; no prepare_model_for_kbit_training; on a quantized base the trainable parameters are cast to "
            "bf16; PEFT's get_peft_model(autocast_adapter_dtype=True) keeps fp32 adapters on a 16-bit base"
        ),
    ),
    "transformers": Stack(
        name="transformers",
        title="transformers Trainer + PEFT",
        version="transformers 5.24, peft 0.21",
        loss_implementation="standard",
        kbit_preparation=True,
        adapter_dtype_quantized=None,
        adapter_dtype_unquantized=None,
        measured=True,
        source=(
            "the PEFT and bitsandbytes docs' QLoRA recipe: prepare_model_for_kbit_training (peft/utils/other.py, "
            "0.21) casts every non-quantized bf16/fp16 parameter to fp32 and enables gradient checkpointing; "
            "get_peft_model keeps fp32 adapters; Trainer's loss is transformers' ForCausalLMLoss over full logits"
        ),
    ),
    "axolotl": Stack(
        name="axolotl",
        title="Axolotl",
        version="axolotl 0.19.0",
        loss_implementation="standard",
        kbit_preparation=False,
        adapter_dtype_quantized=None,
        adapter_dtype_unquantized=None,
        measured=True,
        source=(
            "src/axolotl/loaders/model.py (0.18.0, 0.19.0): AxolotlTrainer's loss is transformers' over full logits "
            "(cut cross-entropy and Liger only as plugins); for lora/qlora on one GPU prepare_model_for_kbit_training "
            "runs, then _convert_embedding_modules_dtype casts norms, embed_tokens and lm_head back to the compute "
            "dtype (needs_fa2_dtype is forced for adapters), so the residual stream stays 16-bit; get_peft_model keeps "
            "PEFT's fp32 adapters (no autocast_adapter_dtype override); lora_dropout defaults to 0; its LoRA kernels "
            "(axolotl/kernels/lora.py, on by default) replace fully adapted q/k/v, o and MLP groups "
            "(estimator/axolotl_memory.py). Measured with Axolotl 0.19.0's own step: cohorts v15 and v16"
        ),
    ),
    "llama_factory": Stack(
        name="llama_factory",
        title="LLaMA-Factory",
        version="llamafactory 0.9.5",
        loss_implementation="standard",
        kbit_preparation=False,
        adapter_dtype_quantized="fp32",
        adapter_dtype_unquantized="fp32",
        measured=True,
        source=(
            "src/llamafactory/model/adapter.py (0.9.6.dev0, 0.9.5): never calls prepare_model_for_kbit_training "
            "(upcast_layernorm and upcast_lmhead_output default off); cast_trainable_params_to_fp32 (on unless "
            "pure_bf16) makes LoRA adapters fp32 and, for full fine-tuning, every trainable weight fp32 with bf16 "
            "autocast; the loss is transformers' over full logits; gradient checkpointing on by default (reentrant); "
            "LoRA rank 8, alpha 16, dropout 0 on every linear, 4-bit with double quantization (plan "
            "LLAMA_FACTORY_DEFAULTS). Measured with LLaMA-Factory 0.9.5's own step: cohort v17"
        ),
        full_weight_dtype="fp32",
    ),
    "unsloth": Stack(
        name="unsloth",
        title="Unsloth",
        version="unsloth 2026.8.19",
        loss_implementation="standard",
        kbit_preparation=False,
        adapter_dtype_quantized="fp32",
        adapter_dtype_unquantized="fp32",
        measured=False,
        source=(
            "unsloth/models/_utils.py and unsloth_zoo training_utils.py (2026.8.19): only lora_A/lora_B are cast "
            "to fp32, norms and embeddings stay 16-bit. Unsloth's fused chunked cross-entropy, its LoRA kernels and "
            "its CPU-offloaded checkpoint inputs all save memory that cannot be measured here, so the estimate "
            "counts transformers' full-logits loss and PEFT's saved tensors instead: an upper bound"
        ),
    ),
    "litgpt": Stack(
        name="litgpt",
        title="LitGPT",
        version="litgpt 0.5.13",
        loss_implementation="litgpt",
        kbit_preparation=False,
        adapter_dtype_quantized=None,
        adapter_dtype_unquantized="bf16",
        measured=True,
        source=(
            "litgpt/finetune/lora.py and full.py (0.5.13) on one device: Fabric precision bf16-true (every "
            "parameter, LoRA's included, in bf16; the wrapped module's outputs converted to fp32), LitGPT's own model "
            "code (fused qkv, k and v expanded to every head for grouped-query attention, an lm_head of its own even "
            "where the checkpoint ties it), chunked_cross_entropy over 128-token lm_head chunks, torch AdamW, no "
            "activation checkpointing; quantization and several GPUs are refused until modelled"
        ),
        own_step="its model code, its fp32 logit chunks, bf16-true",
        own_commands=("litgpt finetune lora", "litgpt finetune full"),
    ),
    "torchtune": Stack(
        name="torchtune",
        title="torchtune",
        version="torchtune 0.6.1",
        loss_implementation="torchtune",
        kbit_preparation=False,
        adapter_dtype_quantized="bf16",
        adapter_dtype_unquantized="bf16",
        measured=True,
        source=(
            "recipes/lora_finetune_single_device.py and full_finetune_single_device.py (0.6.1): the model built in "
            "bf16 (training.set_default_dtype), LoRA's adapters and AdamW's states included, no autocast, no fp32 "
            "master weights; torchtune's own model code (k and v expanded to every head for grouped-query attention, "
            "RMSNorm in fp32, per-layer fp32 RoPE caches in the Qwen2 LoRA builders); CEWithChunkedOutputLoss over "
            "8 bf16 logit chunks; QLoRA's base in torchao NF4 (estimator/torchtune_memory.py). Measured with "
            "torchtune's own recipes under fake tensors (benchmarks/validation/torchtune_fake.py)"
        ),
        own_step="its model code, its chunked cross-entropy, torchao's NF4 base",
        own_commands=("tune run lora_finetune_single_device", "tune run full_finetune_single_device"),
    ),
}

FRAMEWORKS: tuple[str, ...] = ("trl", "transformers", "axolotl", "llama_factory", "unsloth", "litgpt", "torchtune")


def stack(name: str) -> Stack:
    return STACKS[name]
