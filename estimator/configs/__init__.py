"""Bring your own config: read an Axolotl, LLaMA-Factory, TRL, transformers, PEFT, accelerate or DeepSpeed file
into a TrainingPlan (with that framework's defaults), say what was used and what was not, and hand suggestions back
as edits to the same file. Pure Python: pyyaml and json only. docs/configs.md describes every format."""

from .combine import LoadedConfig, load_configs
from .edits import apply_edits, config_edits, edited_copies
from .parse import MAX_CONFIG_BYTES
from .types import (
    CONFIG_FORMATS,
    ConfigEdit,
    ConfigError,
    ConfigOverride,
    ConfigReport,
    ConfigWarning,
    KeyUse,
    SuggestionEdits,
)

__all__ = ["CONFIG_FORMATS", "MAX_CONFIG_BYTES", "ConfigEdit", "ConfigError", "ConfigOverride", "ConfigReport",
           "ConfigWarning", "KeyUse", "LoadedConfig", "SuggestionEdits", "apply_edits", "config_edits", "edited_copies",
           "load_configs", "suggestion_edits"]


def suggestion_edits(loaded: LoadedConfig, result) -> list[SuggestionEdits]:
    """The edits for every suggestion of a SuggestResult, by rank."""
    return [SuggestionEdits(rank=s.rank, edits=config_edits(loaded, s.plan)) for s in result.suggestions]
