"""What every format's reader shares: a record of the keys used, warned about and ignored, and value checks."""

from __future__ import annotations

import re
from typing import Any, cast

from ..errors import safe_text
from .parse import Doc
from .types import ConfigError, ConfigFormat, ConfigWarning, KeyUse

MAX_IGNORED_NAMES = 40
MISSING = object()
OFF: tuple[Any, ...] = (None, False, 0, "", [], {})  # a value that turns a setting off


def reasons(*groups: tuple[str, str]) -> dict[str, str]:
    """{key: reason} from (reason, "key key ...") pairs: the keys a format ignores, each with why it does not change
    GPU memory."""
    out: dict[str, str] = {}
    for reason, keys in groups:
        for key in keys.split():
            if key in out:
                raise ValueError(f"{key} is listed twice")
            out[key] = reason
    return out


class Reading:
    """One file being read into plan fields."""

    def __init__(self, doc: Doc, fmt: str):
        self.doc = doc
        self.format = cast(ConfigFormat, fmt)  # detect.detect and detect.check_format give only its names
        self.fields: dict[str, Any] = {}
        # launcher values a training config's own value replaces (DeepSpeed batch, dtype)
        self.soft: dict[str, Any] = {}
        self.used: list[KeyUse] = []
        self.warnings: list[ConfigWarning] = []
        self.seen: set[str] = set()
        self.refs: list[tuple[str, str]] = []  # (key, path) of other files this one names (deepspeed: ds.json)
        self.ignored_keys: list[tuple[str, str]] = []  # (key, why it does not change GPU memory), after finish()
        self.trainer: str | None = None  # the trainer given beside the file (--trainer, `trainer` in MCP)

    # ---- looking keys up
    def get(self, key: str, default: Any = None) -> Any:
        node: Any = self.doc.data
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def has(self, key: str) -> bool:
        return self.get(key, MISSING) is not MISSING

    def where(self, key: str) -> str:
        return self.doc.where(key)

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.where(key)}: {key}: {message}")

    # ---- recording
    def use(self, key: str, field: str | None, value: Any, plan_value: Any = MISSING, soft: bool = False) -> None:
        """``key`` (with ``value`` in the file) sets plan ``field`` to ``plan_value`` (default: the value);
        ``soft``: only where the training config leaves the field out."""
        plan_value = value if plan_value is MISSING else plan_value
        self.seen.add(key.split(".")[0])
        self.used.append(KeyUse(file=self.doc.name, key=key, value=value, field=field,
                                plan_value=plan_value if field else None))
        if field:
            (self.soft if soft else self.fields)[field] = plan_value

    def warn(self, key: str | None, message: str) -> None:
        if key:
            self.seen.add(key.split(".")[0])
        where = f" ({self.where(key)})" if key else ""
        self.warnings.append(ConfigWarning(file=self.doc.name, key=key, message=safe_text(message + where, 600)))

    def ignore(self, key: str, why: str) -> None:
        """A key that does not change GPU memory (decided from its value), with why."""
        self.seen.add(key)
        self.ignored_keys.append((key, why))

    def mark(self, *keys: str) -> None:
        """Keys that were read (to decide something) but set nothing by themselves."""
        for key in keys:
            self.seen.add(key.split(".")[0])

    def ignored(self) -> list[str]:
        return [k for k, _ in self.ignored_keys]

    def finish(self, reads: tuple[str, ...], ignored: dict[str, str], not_modelled: dict[str, str | None],
               schema: str) -> None:
        """Account for every top-level key the reader did not use or warn about: one of ``ignored`` (with its
        reason), a key the reader read (``reads``) to decide something (listed as used, setting nothing), a
        not-modelled key that is off, or a key ``schema`` does not have (one warning naming them all). Nothing is
        left silent."""
        done = ({u.key.split(".")[0] for u in self.used} | {w.key.split(".")[0] for w in self.warnings if w.key}
                | {k for k, _ in self.ignored_keys})
        unknown = []
        for key, value in self.doc.data.items():
            if key in done:
                continue
            if key in ignored:
                self.ignored_keys.append((key, ignored[key]))
            elif key in self.seen or key in reads:
                self.use(key, None, value)  # read to decide (use_peft: false, load_in_8bit: false): sets nothing
            elif key in not_modelled and value in OFF:
                self.ignored_keys.append((key, f"{safe_text(repr(value), 20)}: off"))
            else:
                unknown.append(key)
        if unknown:
            shown = ", ".join(safe_text(k, 60) for k in unknown[:20]) + (", ..." if len(unknown) > 20 else "")
            self.warn(None, f"{len(unknown)} key(s) that {schema} does not have, not read: {shown} (if one changes "
                            "GPU memory, the estimate does not include it)")

    # ---- typed values
    def boolean(self, key: str, default: Any = None) -> Any:
        value = self.get(key, MISSING)
        if value is MISSING or value is None:
            return default
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise self.fail(key, f"expected true or false; got {safe_text(repr(value), 80)}")

    def integer(self, key: str, default: Any = None, low: int = 1, high: int = 10_000_000) -> Any:
        value = self.get(key, MISSING)
        if value is MISSING or value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected a whole number; got {safe_text(repr(value), 80)}")
        if not low <= value <= high:
            raise self.fail(key, f"must be between {low} and {high}; got {value}")
        return value

    def number(self, key: str, default: Any = None) -> Any:
        value = self.get(key, MISSING)
        if value is MISSING or value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, f"expected a number; got {safe_text(repr(value), 80)}")
        return value

    def text(self, key: str, default: Any = None) -> Any:
        value = self.get(key, MISSING)
        if value is MISSING or value is None:
            return default
        if not isinstance(value, str):
            raise self.fail(key, f"expected text; got {safe_text(repr(value), 80)}")
        return value.strip()

    def names(self, key: str) -> Any:
        """A list of module names: a YAML list, or one comma-separated string."""
        value = self.get(key, MISSING)
        if value is MISSING or value is None:
            return None
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, f"expected module names; got {safe_text(repr(value), 80)}")
        return value


# ------------------------------------------------------------------ shared value maps

OPTIMIZERS = {
    "adamw_torch_fused": "adamw_torch_fused", "adamw_torch": "adamw_torch", "adamw_hf": "adamw_torch",
    "adamw_bnb_8bit": "adamw_bnb_8bit", "adamw_8bit": "adamw_bnb_8bit", "paged_adamw_8bit": "paged_adamw_8bit",
    "paged_adamw_32bit": "paged_adamw_32bit", "adafactor": "adafactor", "sgd": "sgd",
}

TORCH_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "half": "fp16",
                "float32": "fp32", "fp32": "fp32", "float": "fp32"}

ATTENTION = {"flash_attention_2": "flash_attention_2", "sdpa": "sdpa", "eager": "eager"}


def read_optim(r: Reading, key: str) -> None:
    name = r.text(key)
    if name is None:
        return
    mapped = OPTIMIZERS.get(name.lower())
    if mapped is None:
        r.warn(key, f"optimizer '{name}' is not modelled; estimated as adamw_torch_fused (two fp32 states per "
                    "trainable parameter, an upper bound for most optimizers)")
        return
    r.use(key, "optim", name, mapped)


def read_attention(r: Reading, key: str) -> None:
    name = r.text(key)
    if name is None:
        return
    mapped = ATTENTION.get(name)
    if mapped is None:
        r.warn(key, f"attention '{name}' is not modelled; estimated with transformers' default (sdpa)")
        return
    r.use(key, "attn_implementation", name, mapped)


def deepspeed_from_name(path: str) -> dict[str, Any] | None:
    """ZeRO stage and offload read from a DeepSpeed file name the frameworks ship (zero3_bf16_cpuoffload_all.json,
    ds_z3_offload_config.json); None when the name does not say."""
    base = path.replace("\\", "/").rsplit("/", 1)[-1].lower()
    match = re.search(r"(?:zero|_z|^z)[_-]?([0-3])", base)
    if not match:
        return None
    stage = int(match.group(1))
    out: dict[str, Any] = {"sharding": {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}[stage]}
    if "offload" in base:
        params_only = "offload_param" in base or "offloadparam" in base
        optimizer_only = "optimizer" in base
        out["offload_optimizer"] = not params_only
        if stage == 3:
            out["offload_params"] = params_only or "all" in base or (not optimizer_only and "cpuoffload" not in base)
    return out


def fsdp_offload_edits(key: str, value, new: dict, fields: list[str]) -> list[tuple]:
    """The edit of an FSDP key that offloads the parameters and, with them, the optimizer step (FSDP's CPU offload
    does both): it carries offload_optimizer only where the suggestion offloads both or neither; otherwise the
    optimizer is said in a note (the file cannot split them)."""
    if bool(new["offload_optimizer"]) == bool(new["offload_params"]):
        return [(key, value, fields)]
    mine = [f for f in fields if f != "offload_optimizer"] or ["offload_params"]
    where = "the CPU" if new["offload_params"] else "the GPU"
    return [(key, value, mine),
            (None, None, ["offload_optimizer"], f"FSDP offloads the optimizer step with the parameters: with this file "
             f"it runs on {where}, not as suggested (offload_optimizer={bool(new['offload_optimizer'])})")]
