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

from dataclasses import dataclass


@dataclass(frozen=True)
class Stack:
    """One framework's memory-relevant defaults."""

    name: str
    title: str  # how the text output names it
    version: str  # the version whose source these defaults were read from
    loss_implementation: str  # "chunked" or "standard"
    kbit_preparation: bool  # calls peft.prepare_model_for_kbit_training on a quantized base
    adapter_dtype_quantized: str | None  # adapter dtype on a 4/8-bit base; None = PEFT's (fp32 on a 16-bit compute dtype)
    adapter_dtype_unquantized: str | None  # adapter dtype on a 16-bit base; None = PEFT's (fp32)
    measured: bool  # the validation harness runs this stack as the framework runs it
    source: str  # where the defaults come from


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
}

FRAMEWORKS: tuple[str, ...] = ("trl", "transformers", "axolotl", "llama_factory", "unsloth")


def stack(name: str) -> Stack:
    return STACKS[name]
