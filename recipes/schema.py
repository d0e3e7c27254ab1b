"""The recipe file: a strict YAML schema that round-trips to the same :class:`TrainingPlan`.

A recipe is ``{"canifinetune_recipe": 1, "plan": {...}, "estimate": {...}}``, where ``plan`` holds ``model`` and
the fields that differ from TrainingPlan's defaults (every other field is its default when the file is read, so the
file reads back as the same plan). It is written with PyYAML's safe dumper (``dump_yaml``) and read with a safe
loader that also refuses duplicate keys; the plan is validated by ``TrainingPlan`` itself (unknown fields refused),
the estimate section by a model that forbids unknown fields too. Nothing here imports torch.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from canifinetune.estimator.bounded_io import read_regular_file
from canifinetune.estimator.errors import RecipeError as RecipeError  # declared in errors.py (the one error tree)
from canifinetune.estimator.errors import describe_validation_error
from canifinetune.estimator.plan import SHARDING_WORDS, TrainingPlan

RECIPE_VERSION = 1
RECIPE_FILE = "recipe.yaml"
MAX_RECIPE_BYTES = 1024 * 1024  # a recipe is a few KB


class EstimateSummary(BaseModel):
    """The numbers of the estimate a recipe was made from (per GPU)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    peak_allocated_bytes: int = Field(ge=0, description="torch.cuda.max_memory_allocated the estimate expects")
    peak_reserved_bytes: int = Field(ge=0, description="torch.cuda.max_memory_reserved the estimate expects")
    total_bytes: int = Field(ge=0, description="reserved plus CUDA context: the process as nvidia-smi sees it")
    budget_bytes: int = Field(ge=0, description="total plus the safety margin")
    peak_phase: str = Field(max_length=32)
    verdict: str = Field(max_length=32)
    gpu: str | None = Field(None, max_length=512)
    gpu_usable_bytes: int | None = Field(None, ge=0)
    params_total: int = Field(ge=0)
    params_trainable: int = Field(ge=0)
    calibration_version: str = Field(max_length=64)

    @classmethod
    def from_estimate(cls, est) -> EstimateSummary:
        return cls(
            peak_allocated_bytes=est.peak_allocated_bytes,
            peak_reserved_bytes=est.peak_reserved_bytes,
            total_bytes=est.total_bytes,
            budget_bytes=est.budget_bytes,
            peak_phase=est.peak_phase,
            verdict=est.verdict,
            gpu=est.gpu.name if est.gpu else None,
            gpu_usable_bytes=est.gpu_usable_bytes,
            params_total=est.params_total,
            params_trainable=est.params_trainable,
            calibration_version=est.calibration_version,
        )


class RecipeFile(BaseModel):
    """What recipe.yaml holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    canifinetune_recipe: Literal[1] = Field(description="recipe format version")
    plan: TrainingPlan
    estimate: EstimateSummary | None = None


TOP_LEVEL_KEYS = tuple(RecipeFile.model_fields)


def output_dir_problem(output_dir: str) -> str | None:
    """Why ``output_dir`` could land outside the recipe's folder (absolute, a drive, '~', '..'), or None."""
    posix, windows = PurePosixPath(output_dir), PureWindowsPath(output_dir)
    if (posix.is_absolute() or windows.anchor or output_dir.startswith("~")
            or ".." in posix.parts or ".." in windows.parts):
        return (f"output_dir: {output_dir!r} must be a folder inside the recipe's folder "
                "(a relative path without '..', '~' or a drive), e.g. 'outputs'")
    return None


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses duplicate mapping keys (PyYAML silently keeps the last one)."""


def _mapping_no_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise RecipeError(f"recipe: line {key_node.start_mark.line + 1}: a key must be a plain name") from None
        if key in out:
            raise RecipeError(
                f"recipe: line {key_node.start_mark.line + 1}: key {key!r} appears twice; keep one of them"
            )
        out[key] = loader.construct_object(value_node, deep=deep)
    return out


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_no_duplicates)


def dump_recipe(recipe: RecipeFile) -> str:
    """The YAML text of a recipe (PyYAML's safe dumper: never string formatting). The plan holds ``model`` and the
    fields that differ from TrainingPlan's defaults; reading the file fills in the same defaults, so it is the same
    plan."""
    data = recipe.model_dump(mode="json")
    data["plan"] = recipe.plan.model_dump(mode="json", exclude_defaults=True)  # model is required: always there
    header = (
        "# canifinetune recipe: `canifinetune train recipe.yaml` trains exactly this plan.\n"
        "# Edit values here, not in generated files; unknown keys are refused.\n"
        "# Plan fields not listed keep their defaults (estimator/plan.py): TRL 1.16 SFTConfig/ModelConfig, "
        "transformers TrainingArguments, PEFT LoraConfig, the trainer's TRL config; learning_rate by method (2e-4 "
        "LoRA/QLoRA, 2e-5 full).\n"
    )
    return header + dump_yaml(data, allow_unicode=True, width=100)


# libyaml's emitter writes the same text as PyYAML's pure-Python one, about 10x faster (a recipe's YAML was half of
# make_recipe's time); the pure-Python one where PyYAML was built without libyaml.
_SAFE_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump_yaml(data, **options) -> str:
    """``data`` as block-style YAML in the order given (what yaml.safe_dump writes, with libyaml where present)."""
    return yaml.dump(data, Dumper=_SAFE_DUMPER, sort_keys=False, default_flow_style=False, **options)


def parse_recipe(text: str, where: str = RECIPE_FILE) -> RecipeFile:
    """Validate recipe YAML text strictly; every problem is a RecipeError that says what to change."""
    if len(text) > MAX_RECIPE_BYTES:
        raise RecipeError(f"recipe: {where} is larger than {MAX_RECIPE_BYTES // 1024} KiB; a recipe is a few KB")
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no Python objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise RecipeError(f"recipe: {where}{line} is not valid YAML: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"recipe: {where} is not valid YAML: {exc}") from None
    except RecursionError:
        raise RecipeError(f"recipe: {where} nests too deeply; a recipe is a flat mapping of plan fields") from None
    except (ValueError, OverflowError, TypeError) as exc:  # e.g. an integer of 5,000 digits
        raise RecipeError(f"recipe: {where} holds a value YAML cannot read: {str(exc)[:120]}") from None
    if not isinstance(data, dict):
        raise RecipeError(
            f"recipe: {where} must be a mapping with keys {', '.join(TOP_LEVEL_KEYS)}; got {type(data).__name__}"
        )
    unknown = [str(k) for k in data if k not in TOP_LEVEL_KEYS]
    if unknown:
        raise RecipeError(
            f"recipe: unknown top-level key(s) {', '.join(repr(k) for k in unknown)} in {where}; "
            f"a recipe has only {', '.join(TOP_LEVEL_KEYS)} (plan fields go under 'plan:')"
        )
    if "canifinetune_recipe" not in data:
        raise RecipeError(f"recipe: {where} has no 'canifinetune_recipe: {RECIPE_VERSION}' line; is it a canifinetune "
                          "recipe?")
    if data["canifinetune_recipe"] != RECIPE_VERSION:
        raise RecipeError(
            f"canifinetune_recipe: this canifinetune reads recipe format {RECIPE_VERSION}; "
            f"got {data['canifinetune_recipe']!r} (make the recipe again with `canifinetune recipe`)"
        )
    if not isinstance(data.get("plan"), dict):
        raise RecipeError(f"plan: {where} needs a 'plan:' mapping with the TrainingPlan fields (at least model)")
    try:
        recipe = RecipeFile.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(describe_validation_error(exc)) from None
    if recipe.plan.sharding_unset:  # the estimate chooses one for a plan; a recipe trains exactly what it says
        raise RecipeError(f"sharding: {recipe.plan.num_gpus} GPUs need a sharding strategy ({SHARDING_WORDS}); set it "
                          "in the plan (`canifinetune recipe` writes the one the estimate chose)")
    return recipe


def load_recipe(path: str | Path) -> RecipeFile:
    """Read recipe.yaml as UTF-8 (whatever the locale) and validate it.

    Only a regular file of at most MAX_RECIPE_BYTES is read: it is opened without blocking and checked with
    fstat first, so a FIFO or a device (even behind a symlink) is refused at once."""
    path = Path(path)
    if path.is_dir():
        raise RecipeError(f"recipe: {path} is a folder; give the recipe file ({path / RECIPE_FILE})")
    raw = read_regular_file(path, MAX_RECIPE_BYTES, lambda reason: RecipeError(f"recipe: {reason}"),
                            lambda size: f"{path} is {size} bytes; a recipe is a few KB")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise RecipeError(f"recipe: {path} is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as "
                          "UTF-8") from None
    return parse_recipe(text, str(path))
