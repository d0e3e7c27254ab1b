"""The shared result types of reading a training config: what was used, what was not, and the edits back."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ..errors import ConfigError as ConfigError  # declared in errors.py (the one error tree)

ConfigFormat = Literal["axolotl", "llama_factory", "trl", "transformers", "peft", "accelerate", "deepspeed"]
CONFIG_FORMATS: tuple[str, ...] = ConfigFormat.__args__  # type: ignore[attr-defined]
TRAINING_FORMATS = ("axolotl", "llama_factory", "trl", "transformers", "peft")
LAUNCHER_FORMATS = ("accelerate", "deepspeed")

# The version each format's defaults were read from (docs/configs.md).
FORMAT_VERSIONS = {
    "axolotl": "axolotl 0.18.0 (src/axolotl/utils/schemas)",
    "llama_factory": "llamafactory 0.9.6.dev0 (src/llamafactory/hparams)",
    "trl": "trl 1.16 (ModelConfig, SFTConfig; `trl sft --config`)",
    "transformers": "transformers 5 TrainingArguments",
    "peft": "peft 0.17+ LoraConfig (adapter_config.json)",
    "accelerate": "accelerate 1.x config (accelerate config / default_config.yaml)",
    "deepspeed": "DeepSpeed JSON config (zero_optimization)",
}


class KeyUse(BaseModel):
    """One key of the file that went into the plan."""

    file: str
    key: str = Field(description="the key as the file spells it (dotted for nested keys)")
    value: Any = Field(description="its value in the file")
    field: str | None = Field(description="the plan field it sets (null: read, but it only confirms an assumption)")
    plan_value: Any = Field(None, description="the value the plan field got")


class ConfigWarning(BaseModel):
    """A key that changes memory but is not modelled, or an assumption the reading had to make."""

    file: str
    key: str | None
    message: str


class ConfigOverride(BaseModel):
    """A flag (or tool argument) given beside the config that replaced the file's value."""

    field: str
    file_value: Any
    value: Any


class ConfigFile(BaseModel):
    name: str
    format: ConfigFormat
    defaults_from: str = Field(description="the framework version whose defaults fill what the file leaves out")


class ConfigReport(BaseModel):
    """What reading the user's config(s) gave: every key used, every key not modelled, the ignored count."""

    files: list[ConfigFile]
    framework: str = Field(description="the plan's framework, from the training config's format")
    used: list[KeyUse]
    defaults: dict[str, Any] = Field(description="plan fields the files leave out, with the framework's default")
    not_modelled: list[ConfigWarning]
    ignored: int = Field(description="keys that do not change GPU memory (datasets, logging, saving, ...)")
    ignored_keys: list[str] = Field(default_factory=list, description="the first of them, by name")
    ignored_reasons: dict[str, str] = Field(default_factory=dict, description="why each of ignored_keys does not "
                                                                             "change GPU memory")
    overrides: list[ConfigOverride] = Field(default_factory=list)
    plan_fields: dict[str, Any] = Field(description="the plan fields the files set (before flags)")


class ConfigEdit(BaseModel):
    """One change to the user's file, in that format's own key names."""

    file: str
    format: ConfigFormat
    key: str | None = Field(description="the key to set (dotted for nested keys); null: no key of this file says it")
    old: Any = None
    new: Any = None
    fields: list[str] = Field(description="the plan fields this edit carries")
    note: str | None = None


class SuggestionEdits(BaseModel):
    """The edits that turn the user's file into one suggestion."""

    rank: int
    edits: list[ConfigEdit]
