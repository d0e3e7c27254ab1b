"""TRL CLI YAML (`trl sft --config FILE`, trl 1.16): ModelConfig, ScriptArguments and SFTConfig in one file."""

from __future__ import annotations

from . import transformers_args
from .reading import TORCH_DTYPES, Reading, read_attention

DEFAULTS = {  # TRL 1.16 ModelConfig and SFTConfig defaults (the plan's own)
    "method": "full", "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "seq_len": 1024, "batch_size": 8,
    "gradient_accumulation_steps": 1, "gradient_checkpointing": True, "optim": "adamw_torch_fused", "dtype": "bf16",
}


def _peft(r: Reading) -> None:
    use_peft = r.boolean("use_peft", False)
    four, eight = r.boolean("load_in_4bit", False), r.boolean("load_in_8bit", False)
    r.mark("use_peft", "load_in_4bit", "load_in_8bit")
    if not use_peft:
        if four or eight:
            raise r.fail("load_in_4bit" if four else "load_in_8bit", "a quantized base needs use_peft: true")
        if r.has("use_peft"):
            r.use("use_peft", "method", False, "full")
        return
    r.use("load_in_4bit" if four else "use_peft", "method", True, "qlora" if four else "lora")
    if eight:
        r.use("load_in_8bit", "load_in_8bit", True)
    for key, field in (("lora_r", "lora_r"), ("lora_alpha", "lora_alpha"), ("lora_dropout", "lora_dropout")):
        if r.has(key):
            r.use(key, field, r.integer(key, None, 1, 4096) if key == "lora_r" else r.number(key))
    targets = r.names("lora_target_modules")
    if targets:
        r.use("lora_target_modules", "target_modules", r.get("lora_target_modules"),
              "all-linear" if targets == ["all-linear"] else targets)
    saved = r.names("lora_modules_to_save")
    if saved:
        r.use("lora_modules_to_save", "modules_to_save", r.get("lora_modules_to_save"), saved)
    if r.boolean("use_dora", False):
        r.use("use_dora", "use_dora", True)
    if four:
        if r.has("bnb_4bit_quant_type"):
            r.use("bnb_4bit_quant_type", "bnb_4bit_quant_type", r.text("bnb_4bit_quant_type"))
        if r.has("use_bnb_nested_quant"):
            r.use("use_bnb_nested_quant", "bnb_4bit_use_double_quant", r.boolean("use_bnb_nested_quant"))


def _length(r: Reading) -> None:
    for key in ("max_length", "max_seq_length"):
        if r.has(key):
            value = r.get(key)
            if value is None:
                raise r.fail(key, "null means no truncation, so no length bounds the memory; give a number, or "
                             "--seq-len with your longest sample")
            r.use(key, "seq_len", r.integer(key, None, 1, 1_048_576))
            return


def read(r: Reading) -> None:
    if r.text("model_name_or_path"):
        r.use("model_name_or_path", "model", r.text("model_name_or_path"))
    _peft(r)
    _length(r)
    for key in ("packing", "padding_free"):
        if r.has(key):
            r.use(key, key, r.boolean(key, False))
    transformers_args.read_training_args(r)
    for key in ("dtype", "torch_dtype", "model_init_kwargs.dtype", "model_init_kwargs.torch_dtype"):
        name = r.text(key) if isinstance(r.get(key), str) else None
        if name and name != "auto":
            if name not in TORCH_DTYPES:
                raise r.fail(key, f"'{name}' is not a dtype; bfloat16, float16 or float32")
            r.use(key, "dtype", name, TORCH_DTYPES[name])
    for key in ("attn_implementation", "model_init_kwargs.attn_implementation"):
        read_attention(r, key)
    r.mark("model_init_kwargs")


# ------------------------------------------------------------------ edits back into the file

SIMPLE = {"model": "model_name_or_path", "lora_r": "lora_r", "seq_len": "max_length", "use_dora": "use_dora",
          "modules_to_save": "lora_modules_to_save", "packing": "packing", "padding_free": "padding_free",
          "attn_implementation": "attn_implementation", "lora_dropout": "lora_dropout"}


def edits(changes: dict, new: dict, r: Reading) -> list[tuple]:
    simple = {f: v for f, v in changes.items() if f in SIMPLE}
    if "seq_len" in simple and r.has("max_seq_length") and not r.has("max_length"):
        simple.pop("seq_len")
        out: list[tuple] = [("max_seq_length", changes["seq_len"], ["seq_len"])]
    else:
        out = []
    out += [(SIMPLE[f], v, [f]) for f, v in simple.items()]
    out += transformers_args.edits(changes, new, r)
    if "target_modules" in changes:
        targets = changes["target_modules"]
        out.append(("lora_target_modules", targets, ["target_modules"]))
    if "method" in changes or "load_in_8bit" in changes:
        method = new["method"]
        out.append(("use_peft", method != "full", ["method"]))
        if method == "qlora" or r.get("load_in_4bit"):
            out.append(("load_in_4bit", method == "qlora", ["method"]))
        if r.get("load_in_8bit") or new.get("load_in_8bit"):
            out.append(("load_in_8bit", bool(new.get("load_in_8bit")), ["load_in_8bit"]))
        if method != "full" and not r.has("lora_target_modules") and new.get("target_modules"):
            targets = new["target_modules"]
            out.append(("lora_target_modules", targets, ["target_modules"]))
    return out


distribution_edits = transformers_args.distribution_edits
