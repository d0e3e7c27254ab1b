"""What a plan means for one model: which tensors train, in which dtypes, with which kernels.

The memory model reads these settings instead of re-deriving them in every component; the training
runtime resolves the same plan into the same settings, and a test compares the two knob by knob.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from . import peft_knobs, vision_images
from .constants import DTYPE_BYTES
from .errors import PlanError
from .moe_adapters import ExpertLoRA, expert_adapter_shapes, resolve_expert_targets
from .plan import TORCHTUNE_FAMILIES, AdapterDType, AttnImplementation, DType, EffectiveLoss, Framework, TrainingPlan
from .spec import PEFT_DEFAULT_TARGETS, LinearSpec, ModelSpec
from .trainers import check_supported
from .vision_images import ImageFacts

# Families whose transformers 5.24 model class sets _supports_sdpa = False (modeling_gemma2.py: "sdpa does
# not support softcapping"): loading them with attn_implementation="sdpa" raises.
SDPA_UNSUPPORTED = frozenset({"gemma2"})

Quantization = Literal["none", "nf4", "fp4", "int8"]  # what bitsandbytes does to the block linears
AttentionKernel = Literal["flash", "efficient", "math"]  # the kernel PyTorch's SDPA dispatcher picks


@dataclass(frozen=True)
class ResolvedPlan:
    """A plan resolved against a model: the facts every memory component needs."""

    plan: TrainingPlan
    spec: ModelSpec
    tokens: int  # micro-batch tokens per GPU: batch_size * seq_len
    weight_dtype: DType  # dtype of the stored (unquantized) weights
    compute_dtype: DType  # dtype of matmul outputs and activations
    autocast: bool  # whether the forward runs under torch.autocast (accelerate's bf16/fp16 mixed precision)
    quantization: Quantization
    adapter_dtype: AdapterDType | None  # dtype of LoRA A/B weights (None without adapters)
    target_modules: tuple[str, ...]  # module names that get LoRA adapters
    attn_implementation: AttnImplementation  # what transformers loads: the plan's, or its default for the model
    attention_kernel: AttentionKernel  # what runs on the GPU
    warnings: tuple[str, ...]
    framework: Framework = "trl"  # the training stack (estimator/stacks.py)
    loss_implementation: EffectiveLoss = "chunked"  # the plan's, or its framework's
    kbit_prepared: bool = False  # peft.prepare_model_for_kbit_training ran on the quantized base
    frozen_dtype: DType = "bf16"  # dtype of the base's unquantized parameters (fp32 after kbit preparation)
    residual_dtype: DType = "bf16"  # dtype of the residual stream between blocks (fp32 after kbit preparation)
    # autocast casts fp32 weights held whole on the GPU to the compute dtype for every matmul (mixed precision with no
    # sharding engine: DeepSpeed casts the module, FSDP2 all-gathers it in the compute dtype; memory.weight_cast_bytes)
    fp32_weight_casts: bool = False
    modules_to_save: tuple[str, ...] = ()  # modules PEFT trains in full beside the adapters
    attention_mask: bool = False  # sdpa gets a 4-D mask (a sliding window no longer than the sequence)
    use_dora: bool = False
    # PEFT 0.21's ParamWrapper adapters on the fused MoE experts and router (estimator/moe_adapters.py); None: none
    expert_lora: ExpertLoRA | None = None
    # positions per row the loss scores, where fewer than S - 1 carry a label: GRPO's completions, which TRL 1.16's
    # fused head scores alone on a CUDA GPU (its Triton path compacts the label-masked positions); None: S - 1
    scored_per_row: int | None = None
    # a vision-language model's images as its processor makes them (estimator/vision_images.py); None for text
    images: ImageFacts | None = None
    # what is derived from these facts, kept once computed (estimator/inventory.py's records, the adapted linears);
    # not an argument: dataclasses.replace builds a new resolved plan with an empty one
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def weight_bytes_per_param(self) -> int:
        return DTYPE_BYTES[self.weight_dtype]

    @property
    def scored_tokens(self) -> int:
        """N = B·(S-1): the positions the causal-LM loss scores (each predicts the next token; at least one); B x the
        completion for GRPO's policy (``scored_per_row``)."""
        per_row = self.scored_per_row if self.scored_per_row is not None else max(self.sequence_length - 1, 1)
        return self.plan.batch_size * per_row

    @property
    def sequence_length(self) -> int:
        """S: tokens per row the language model runs, seq_len plus a VLM's image tokens (TRL 1.16 keeps them in the
        labels too)."""
        return vision_images.sequence_length(self.plan.seq_len, self.images)

    @property
    def act_bytes(self) -> int:
        return DTYPE_BYTES[self.compute_dtype]

    @property
    def full(self) -> bool:
        return self.plan.method == "full"

    def adapted(self, linear: LinearSpec) -> bool:
        return self.adapter_dtype is not None and linear.name in self.target_modules

    def adapted_linears(self, layer: int) -> tuple[LinearSpec, ...]:
        key = ("adapted_linears", layer)
        if key not in self.memo:
            self.memo[key] = tuple(lin for lin in self.spec.layer_linears(layer) if self.adapted(lin))
        return self.memo[key]

    @property
    def expert_adapters(self) -> bool:
        """Whether PEFT puts adapters on the fused MoE experts (or router) of this model."""
        return self.expert_lora is not None and self.expert_lora.any

    def expert_adapter_shapes(self, layer: int) -> list[tuple[int, int]]:
        """(rows, cols) of the ParamWrapper adapter weights of block ``layer`` ([] for a dense block)."""
        if not self.expert_adapters or not self.spec.is_moe_layer(layer):
            return []
        moe = self.spec.moe
        assert moe is not None and self.expert_lora is not None
        return expert_adapter_shapes(self.expert_lora, moe.num_experts, self.spec.hidden_size, moe.expert_intermediate)

    @property
    def trainable_dtype(self) -> str:
        """The dtype of the trainable parameters: the weights' in full fine-tuning, else the adapters'."""
        if self.full:
            return self.weight_dtype
        assert self.adapter_dtype is not None
        return self.adapter_dtype

    @property
    def trainable_bytes_per_param(self) -> int:
        return DTYPE_BYTES[self.trainable_dtype]


def _resolve_targets(
    plan: TrainingPlan, spec: ModelSpec
) -> tuple[tuple[str, ...], tuple[str, ...], ExpertLoRA | None]:
    names = spec.linear_names()
    warnings: list[str] = []
    # PEFT 0.21 maps all-linear and the v4 expert names onto the fused expert weights (estimator/moe_adapters.py),
    # keyed by the model's own config.model_type: a VLM wrapper's (qwen3_vl_moe: no mapping, no expert adapters)
    peft_model_type = spec.vision.model_type if spec.vision is not None else spec.model_type
    experts, expert_names, _ = resolve_expert_targets(
        peft_model_type, spec.moe is not None, plan.target_modules, plan.lora_r, plan.lora_dropout, plan.use_dora
    )
    if plan.target_modules is None:
        default = PEFT_DEFAULT_TARGETS.get(spec.model_type)
        if default is None:
            raise PlanError(
                f"target_modules: PEFT has no default target modules for model type '{spec.model_type}'; "
                f"give a list (this model's linear layers are {', '.join(names)}) or 'all-linear'",
                field="target_modules",
            )
        return tuple(n for n in default if n in names), (), None
    if plan.target_modules == "all-linear":
        return names, (), experts
    chosen = tuple(n for n in plan.target_modules if n in names)
    missing = [n for n in plan.target_modules if n not in names and n not in expert_names]
    if not chosen and experts is None:
        raise PlanError(
            f"target_modules: none of {list(plan.target_modules)} is a linear layer of this model; "
            f"choose from {', '.join(names)} or 'all-linear'",
            field="target_modules",
        )
    if missing:
        warnings.append(f"target_modules {missing} match no linear layer of this model and are ignored (PEFT does the "
                        "same)")
    return chosen, tuple(warnings), experts


def sliding_window_mask(attn_implementation: str, spec: ModelSpec, seq_len: int) -> bool:
    """Whether transformers passes sdpa a 4-D mask for an unpadded batch: with a whole-model sliding window
    (``spec.sliding_window``), masking_utils.sdpa_mask can skip the mask (and use is_causal) only while
    kv_length < local_size (``_ignore_causal_mask_sdpa``: ``if local_attention_size is not None and kv_length >=
    local_attention_size: return False``), transformers 5.24. So Phi-3's window of 2047 materialises the mask
    from seq_len 2047 on."""
    return attn_implementation == "sdpa" and spec.sliding_window is not None and seq_len >= spec.sliding_window


def _attention_kernel(attn_implementation: str, spec: ModelSpec, compute_dtype: str,
                      masked: bool = False) -> AttentionKernel:
    """The kernel PyTorch's SDPA dispatcher picks on an Ampere+ GPU for unpadded causal attention. With a
    4-D mask (``masked``) flash is ruled out: the memory-efficient kernel takes it as an additive bias."""
    if attn_implementation == "eager":
        return "math"
    if attn_implementation == "flash_attention_2":
        return "flash"
    if masked:
        return "efficient"
    if compute_dtype in ("bf16", "fp16") and spec.head_dim <= 256 and spec.head_dim % 8 == 0:
        return "flash"
    return "efficient"


def _check_torchtune_model(spec: ModelSpec) -> None:
    """torchtune's own model builders exist per family; those modelled and measured are Qwen2.5 and Llama 3.x."""
    if spec.model_type not in TORCHTUNE_FAMILIES or spec.moe is not None:
        raise PlanError(f"framework torchtune: torchtune's builders for model type '{spec.model_type}' are not "
                        f"modelled; modelled: {', '.join(TORCHTUNE_FAMILIES.values())}; estimate it with framework "
                        "'trl'", field="framework")


def _litgpt_model(spec: ModelSpec) -> ModelSpec:
    """The model as LitGPT 0.5.13 builds it (litgpt/model.py ``GPT``): an ``lm_head`` of its own even where the
    Hugging Face checkpoint ties it to the embedding (its converter copies the weight), and a rotary that ends in
    ``torch.cat``. MoE families run LitGPT's own
    expert code, not modelled: refused."""
    if spec.moe is not None or spec.fused_qkv:
        why = "mixture-of-experts code" if spec.moe is not None else "layout of a fused-qkv family"
        raise PlanError(f"framework litgpt: LitGPT's {why} is not modelled ({spec.model_type}); estimate it with "
                        "framework 'trl'", field="framework")
    # its apply_rope (litgpt/model.py) ends in torch.cat for every family, as Phi-3's does
    return replace(spec, tie_word_embeddings=False, rotary_concatenates=True)


def resolve(plan: TrainingPlan, spec: ModelSpec) -> ResolvedPlan:
    """What the libraries would decide for ``plan`` on ``spec``: dtypes, quantization, adapter targets, attention."""
    warnings: list[str] = []
    # LLaMA-Factory's full fine-tuning casts every trainable weight to fp32 and trains under bf16 autocast: that is
    # 'mixed' precision whatever the plan's precision field says (estimator/stacks.py)
    quantization = _quantization(plan)
    # a quantized base loads in the compute dtype whatever the precision (recipes/model_setup.py: fp32 only for an
    # unquantized 'mixed' model; transformers' bitsandbytes loading in bnb_4bit_compute_dtype; measured: cohort v18 m07)
    mixed = quantization == "none" and (
        plan.precision == "mixed"
        or (plan.method == "full" and plan.stack.full_weight_dtype == "fp32" and plan.dtype != "fp32"))
    weight_dtype = "fp32" if mixed else plan.dtype
    compute_dtype = plan.dtype
    # LitGPT's bf16-true and torchtune's bf16 model run as they are: no torch.autocast
    autocast = plan.dtype in ("bf16", "fp16") and plan.framework not in ("litgpt", "torchtune")
    if plan.framework == "litgpt":
        spec = _litgpt_model(spec)
    if plan.framework == "torchtune":
        _check_torchtune_model(spec)
    if plan.activation_offloading and spec.vision is not None:
        raise PlanError("activation_offloading: offloading a vision-language model's activations is not measured "
                        "yet; estimate without it (an upper bound for the GPU)", field="activation_offloading")
    if plan.trainer != "sft":
        # DPO/ORPO/KTO/GRPO/reward: what estimator/trainer_memory.py does not model is refused before it is needed
        check_supported(plan)
    kbit_prepared = plan.effective_kbit_preparation
    targets, adapter_dtype, expert_lora = _adapters(plan, spec, quantization, warnings)
    # prepare_model_for_kbit_training casts every bf16/fp16 parameter but the packed 4-bit ones to fp32
    # (peft/utils/other.py, 0.21); the embedding output is then fp32, and so is every residual add after it
    frozen_dtype = "fp32" if kbit_prepared else weight_dtype
    # so is the embedding output of an fp32 model under autocast (mixed precision): F.embedding is not autocast
    # (only where the GPU holds the fp32 weights: DeepSpeed casts the module to the compute dtype, FSDP2 all-gathers it
    # in that dtype)
    fp32_weight_casts = autocast and weight_dtype == "fp32" and plan.sharding in ("none", "ddp")
    residual_dtype = "fp32" if (kbit_prepared or fp32_weight_casts) else compute_dtype
    images = vision_images.resolve_images(plan, spec)
    sequence = vision_images.sequence_length(plan.seq_len, images)
    attn = _attn_implementation(plan, spec, compute_dtype)
    image_mask = vision_images.bidirectional_image_mask(attn, spec, images)
    masked = image_mask or sliding_window_mask(attn, spec, sequence)
    # with a window on some layers only (Gemma3), the others still run flash: the kernel named is theirs
    kernel = _attention_kernel(attn, spec, compute_dtype,
                               image_mask or (masked and spec.sliding_window_layers >= spec.num_layers))
    if spec.max_position_embeddings and plan.seq_len > spec.max_position_embeddings:
        warnings.append(
            f"seq_len {plan.seq_len} is beyond the model's max_position_embeddings "
            f"{spec.max_position_embeddings}: the estimate still counts {plan.seq_len} tokens, but the model "
            "was not trained for that context"
        )
    return ResolvedPlan(
        plan=plan,
        spec=spec,
        tokens=plan.batch_size * sequence,
        weight_dtype=weight_dtype,
        compute_dtype=compute_dtype,
        autocast=autocast,
        quantization=quantization,
        adapter_dtype=adapter_dtype,
        target_modules=targets,
        attn_implementation=attn,
        attention_kernel=kernel,
        warnings=tuple(warnings),
        framework=plan.framework,
        loss_implementation=plan.effective_loss_implementation,
        kbit_prepared=kbit_prepared,
        frozen_dtype=frozen_dtype,
        residual_dtype=residual_dtype,
        fp32_weight_casts=fp32_weight_casts,
        modules_to_save=peft_knobs.resolve_modules_to_save(plan, spec) if plan.uses_adapters else (),
        attention_mask=masked,
        use_dora=plan.use_dora,
        expert_lora=expert_lora if expert_lora is not None and expert_lora.any else None,
        images=images,
    )


def _quantization(plan: TrainingPlan) -> Quantization:
    if plan.quantized_4bit:
        return plan.bnb_4bit_quant_type
    if plan.load_in_8bit:
        return "int8"
    return "none"


def _adapters(plan: TrainingPlan, spec: ModelSpec, quantization: str,
              warnings: list[str]) -> tuple[tuple[str, ...], AdapterDType | None, ExpertLoRA | None]:
    """(target modules, adapter dtype, expert adapters) as PEFT resolves them; appends the targets' warnings."""
    if not plan.uses_adapters:
        return (), None, None
    targets, target_warnings, expert_lora = _resolve_targets(plan, spec)
    warnings.extend(target_warnings)
    # PEFT's get_peft_model(autocast_adapter_dtype=True) keeps adapters in fp32 on a bf16/fp16 base;
    # TRL 1.16 SFTTrainer then casts them to bf16 when the base is quantized (sft_trainer.py).
    stack = plan.stack
    default = stack.adapter_dtype_quantized if quantization != "none" else stack.adapter_dtype_unquantized
    return targets, plan.adapter_dtype or default or "fp32", expert_lora


def _attn_implementation(plan: TrainingPlan, spec: ModelSpec, compute_dtype: str) -> AttnImplementation:
    """The attention implementation transformers would use, refused where it cannot run (or is not modelled)."""
    # transformers' default when none is asked for: sdpa if the model class supports it, else eager
    attn = plan.attn_implementation or ("eager" if spec.model_type in SDPA_UNSUPPORTED else "sdpa")
    if plan.framework == "axolotl" and plan.method == "full" and attn != "flash_attention_2":
        # loaders/model.py (0.18.0): for full fine-tuning with sdpa/eager, norms, embed_tokens and lm_head stay in the
        # fp32 they were upcast to (ATTN_IMPLS_WITHOUT_DTYPE_CAST); that mix of dtypes is not modelled
        raise PlanError(
            "framework: Axolotl keeps embeddings, norms and lm_head in fp32 for full fine-tuning unless flash "
            "attention is on, a mix canifinetune does not model; set attn_implementation to 'flash_attention_2' "
            "(Axolotl's flash_attention: true) or estimate with framework 'transformers'",
            field="framework",
        )
    if attn == "flash_attention_2" and compute_dtype == "fp32":
        raise PlanError(
            "attn_implementation: flash_attention_2 runs only in bf16 or fp16; set dtype to bf16/fp16 or use sdpa",
            field="attn_implementation",
        )
    if attn == "sdpa" and spec.model_type in SDPA_UNSUPPORTED:
        raise PlanError(
            f"attn_implementation: transformers runs {spec.model_type} only with 'eager' or 'flash_attention_2' "
            "(its attention logit softcapping is not available through sdpa); set attn_implementation to one of them",
            field="attn_implementation",
        )
    return attn
