"""PEFT adapter_config.json (LoraConfig.save_pretrained): the adapters, and the base model they were trained on.
It does not say whether the base was quantized: method lora unless --method qlora says so."""

from __future__ import annotations

from .reading import Reading, reasons

SCHEMA = "peft 0.17+ LoraConfig"
DEFAULTS = {"method": "lora", "lora_r": 8, "lora_alpha": 8, "lora_dropout": 0.0}  # PEFT LoraConfig defaults
READS = ("peft_type", "base_model_name_or_path", "r", "lora_alpha", "lora_dropout", "target_modules",
         "modules_to_save", "use_dora", "bias", "layers_to_transform", "rank_pattern")
# LoraConfig keys that change memory but are not modelled: warned about when set (peft 0.21 tuners/lora/config.py)
NOT_MODELLED: dict[str, str | None] = {
    "bias": None, "layers_to_transform": None, "rank_pattern": None,  # read: see read()
    "exclude_modules": "modules excluded from the targets are not modelled (estimated with them: an upper bound)",
    "target_parameters": "adapters on parameters (MoE experts) are not modelled",
    "trainable_token_indices": "trainable token rows of the embedding are not modelled",
    "layer_replication": "replicated layers are not modelled",
    "lora_bias": "a bias on lora_B is not modelled (a few MB)",
    "use_qalora": "QA-LoRA is not modelled", "qalora_group_size": "QA-LoRA is not modelled",
    "megatron_config": "Megatron's parallel layers are not modelled",
    "megatron_core": "Megatron's parallel layers are not modelled",
    "arrow_config": "Arrow routing between adapters is not modelled",
    "use_bdlora": "BD-LoRA is not modelled", "kasa_config": "KaSA is not modelled",
    "velora_config": "VeLoRA's compressed activations are not modelled",
    "monteclora_config": "MonteCLoRA is not modelled",
}
IGNORED = reasons(
    ("how the adapters start (initialisation): the same tensors", "init_lora_weights loftq_config eva_config "
     "corda_config lora_ga_config"),
    ("the LoRA scaling: no memory", "alpha_pattern use_rslora"),
    ("the task type (a reward model's score head is counted for trainer reward)", "task_type"),
    ("bookkeeping of the saved adapter", "inference_mode auto_mapping revision peft_version runtime_config "
     "ensure_weight_tying"),
    ("the weight layout of Conv1D bases: the same adapters", "fan_in_fan_out"),
    ("only with layers_to_transform (warned about when set)", "layers_pattern"),
    ("activated LoRA's invocation tokens: the same adapters", "alora_invocation_tokens"),
)

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
    for key in ("layers_to_transform", "rank_pattern"):
        if r.get(key):
            r.warn(key, f"{key} is not modelled; estimated with rank r on every layer")
    r.mark("bias", "layers_to_transform", "rank_pattern")
    for key, message in NOT_MODELLED.items():
        if message is not None and r.get(key) not in (None, False, 0, "", [], {}):
            r.warn(key, message)


SIMPLE = {"model": "base_model_name_or_path", "lora_r": "r", "target_modules": "target_modules",
          "modules_to_save": "modules_to_save", "use_dora": "use_dora", "lora_dropout": "lora_dropout",
          "lora_alpha": "lora_alpha"}
# The plan fields the reader can set (method: lora only); each has an edit back (tests/test_configs.py)
FIELDS = ("model", "method", "lora_r", "lora_alpha", "lora_dropout", "target_modules", "modules_to_save", "use_dora")


def edits(changes: dict, new: dict, r: Reading) -> list[tuple]:
    return [(SIMPLE[f], v, [f]) for f, v in changes.items() if f in SIMPLE]


def distribution_edits(changes: dict, new: dict, r: Reading) -> list[tuple]:
    fields = [f for f in ("sharding", "offload_optimizer", "offload_params") if f in changes]
    return [(None, None, fields, "sharding lives in the launcher: pass an accelerate or DeepSpeed config as another "
                                 "--config")]
