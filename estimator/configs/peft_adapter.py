"""PEFT adapter_config.json (LoraConfig.save_pretrained): the adapters, and the base model they were trained on.
It does not say whether the base was quantized: method lora unless --method qlora says so."""

from __future__ import annotations

from .reading import Reading

DEFAULTS = {"method": "lora", "lora_r": 8, "lora_alpha": 8, "lora_dropout": 0.0}  # PEFT LoraConfig defaults



def _targets(r: Reading) -> None:
    targets = r.get("target_modules")
    if targets is None:
        return
    if isinstance(targets, str) and targets != "all-linear":
        if not targets.replace("_", "").replace(".", "").isalnum():
            r.warn("target_modules", "a regular expression of module names is not read; estimated with PEFT's "
                                     "default targets for the architecture (give --target-modules)")
            return
        targets = [targets]
    if isinstance(targets, list):
        r.use("target_modules", "target_modules", r.get("target_modules"), r.names("target_modules"))
    else:
        r.use("target_modules", "target_modules", targets, "all-linear")


def read(r: Reading) -> None:
    kind = str(r.get("peft_type", "LORA")).upper()
    if kind != "LORA":
        raise r.fail("peft_type", f"{kind} adapters are not estimated; LORA is")
    r.use("peft_type", "method", r.get("peft_type", "LORA"), "lora")
    r.warn(None, "adapter_config.json does not say whether the base was loaded in 4 bit: estimated as lora "
                 "(give --method qlora for QLoRA)")
    if r.text("base_model_name_or_path"):
        r.use("base_model_name_or_path", "model", r.text("base_model_name_or_path"))
    if r.has("r"):
        r.use("r", "lora_r", r.integer("r", None, 1, 4096))
    for key in ("lora_alpha", "lora_dropout"):
        if r.has(key):
            r.use(key, key, r.number(key))
    _targets(r)
    saved = r.names("modules_to_save")
    if saved:
        r.use("modules_to_save", "modules_to_save", r.get("modules_to_save"), saved)
    if r.boolean("use_dora", False):
        r.use("use_dora", "use_dora", True)
    if r.get("bias") not in (None, "none"):
        r.warn("bias", f"bias '{r.get('bias')}' trains bias vectors too; they are not counted (a few MB)")
    for key in ("layers_to_transform", "rank_pattern", "alpha_pattern"):
        if r.get(key):
            r.warn(key, f"{key} is not modelled; estimated with rank r on every layer" if key != "alpha_pattern"
                   else "alpha_pattern does not change memory")
    r.mark("bias", "layers_pattern")


SIMPLE = {"model": "base_model_name_or_path", "lora_r": "r", "target_modules": "target_modules",
          "modules_to_save": "modules_to_save", "use_dora": "use_dora", "lora_dropout": "lora_dropout"}


def edits(changes: dict, new: dict, r: Reading) -> list[tuple]:
    return [(SIMPLE[f], v, [f]) for f, v in changes.items() if f in SIMPLE]


def distribution_edits(changes: dict, new: dict, r: Reading) -> list[tuple]:
    fields = [f for f in ("sharding", "offload_optimizer", "offload_params") if f in changes]
    return [(None, None, fields, "sharding lives in the launcher: pass an accelerate or DeepSpeed config as another "
                                 "--config")]
