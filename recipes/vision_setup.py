"""A vision-language model as TRL 1.16's VLM recipe builds it, for the training runtime and the fake-tensor measurement
alike (benchmarks/validation/vlm_fake.py), so what is measured is what is trained.

``AutoModelForImageTextToText`` in the plan's dtype; QLoRA through recipes/model_setup.py's quantizer (every
``nn.Linear`` but the LM head, the vision tower's too, as transformers' bitsandbytes quantizer does); LoRA on the
plan's language-model linears only (:func:`lora_target_regex`: PEFT matches a plain name in every sub-model), and on
every vision linear with ``vision_tower: lora``; the projector trained in full fine-tuning; checkpointing as
transformers enables it. torch, transformers and peft are imported inside functions only.
"""

from __future__ import annotations

import re
from typing import Any

from canifinetune.estimator.vision_spec import language_model_path

# where each estimated family's vision tower sits in its <Family>Model (transformers 5.24)
TOWER_PATHS = {"qwen2_vl": "visual", "qwen2_5_vl": "visual", "qwen3_vl": "visual", "qwen3_vl_moe": "visual",
               "llava": "vision_tower",
               "gemma3": "vision_tower", "mllama": "vision_model", "llava_next": "vision_tower",
               "idefics3": "vision_model", "smolvlm": "vision_model"}


def lora_target_regex(plan, config: dict) -> str:
    """PEFT target_modules as one regex: the plan's linear names in the language model's blocks (its spec's linears
    for ``all-linear``, PEFT's default for the language model's family when the plan names none), and with
    ``vision_tower: lora`` every nn.Linear of the vision tower and projector as well (what ``all-linear`` reaches
    there), matched under their module paths."""
    from canifinetune.estimator.spec import PEFT_DEFAULT_TARGETS, ModelSpec

    spec = ModelSpec.from_config(config)
    names: tuple[str, ...] | list[str] | None
    if plan.target_modules == "all-linear":
        names = spec.linear_names()
    else:
        names = plan.target_modules or PEFT_DEFAULT_TARGETS.get(spec.model_type)
    if not names:  # the estimate refuses such a plan first (estimator/resolved.py); say so here too
        raise ValueError(f"target_modules: PEFT has no default target modules for a {spec.model_type} language "
                         "model; name them (e.g. 'all-linear' or ['q_proj', 'v_proj'])")
    # (Mllama's cross-attention layers name their attention cross_attn; PEFT's all-linear reaches their linears too)
    text = language_model_path(config["model_type"])
    language = rf"model\.{text}\.layers\.\d+\.(self_attn|cross_attn|mlp)\.({'|'.join(map(re.escape, names))})"
    if plan.vision_tower != "lora":
        return language
    assert spec.vision is not None
    tower = spec.vision.tower.module_path
    roots = [tower, *(p for p in spec.vision.projector.module_paths if not p.startswith(tower + "."))]
    linears = {lin.name for group in spec.vision.tower.groups + spec.vision.projector.groups for lin in group.linears}
    # the spec names a linear relative to its group's module; the model may nest the tower one level deeper (LLaVA's
    # CLIPVisionModel keeps its layers under vision_model)
    vision = (rf"model\.({'|'.join(map(re.escape, roots))})\.(.*\.)?"
              rf"({'|'.join(map(re.escape, sorted(linears)))})")
    # a projector that is itself one nn.Linear (Mllama's multi_modal_projector) is matched by its own path
    alone = [root for root in roots if root in linears]
    if alone:
        vision = rf"{vision}|model\.({'|'.join(map(re.escape, alone))})"
    return rf"({language})|({vision})"


def build_vlm(plan, config: dict, *, pretrained_path: str | None = None) -> Any:
    """The model SFTTrainer trains for a vision-language ``plan``: random weights from ``config`` (the measurement)
    or the checkpoint at ``pretrained_path`` (the runtime), quantized, adapted and checkpointed as TRL 1.16 sets it
    up; adapters cast to bf16 on a quantized base, as TRL does."""
    from peft import get_peft_model
    from transformers import AutoModelForImageTextToText

    from . import model_setup

    tower = TOWER_PATHS[config["model_type"]]
    qconfig = model_setup.quantization_config(plan)
    dtype = model_setup.weight_dtype(plan) if qconfig is None else model_setup.torch_dtype(plan)
    kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": plan.attn_implementation}
    if pretrained_path is not None:
        if qconfig is not None:
            kwargs["quantization_config"] = qconfig
        model = AutoModelForImageTextToText.from_pretrained(pretrained_path, **kwargs)
    else:
        model = AutoModelForImageTextToText.from_config(model_setup.hf_config(config), **kwargs)
        if qconfig is not None:
            model._canifinetune_unquantized = model_setup._quantize_model(model, plan, qconfig)
    model.config.use_cache = False
    if plan.method == "full":
        model.requires_grad_(True)
        if plan.vision_tower == "frozen":
            getattr(model.model, tower).requires_grad_(False)
    elif plan.uses_adapters:
        model = get_peft_model(model, model_setup.lora_config(plan, lora_target_regex(plan, config)))
        if plan.vision_tower == "full":
            getattr(model.get_base_model().model, tower).requires_grad_(True)
        model_setup.cast_adapters(model, plan, quantized=qconfig is not None)
    model_setup.enable_checkpointing(model, plan)
    model.train()
    return model
