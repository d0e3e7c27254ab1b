"""The MCP tools' arguments and answers, sized for an assistant's context (issue 15.4).

An assistant pays for every byte of ``tools/list`` in every conversation, and for every byte of every answer.
So the tools take flat only the plan fields that change memory and that assistants change (the recipe tool adds
the run's own fields); every other :class:`TrainingPlan` field goes in one ``plan`` object (its fields, types
and defaults: the ``canifinetune://schema/plan`` resource). Names, types, constraints and defaults of the flat
arguments are still copied from the plan; only their descriptions are shorter. The answers carry what a
decision needs: the verdict, need vs have, the budget by component, each suggestion's changes and cost; the
plan comes back only as the fields that differ from the defaults. ``canifinetune estimate --json`` keeps the
whole structure.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import json
import re
import shlex
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, ValidationError

from canifinetune.estimator.costs import PlanValue
from canifinetune.estimator.errors import raised_field, safe_text
from canifinetune.estimator.plan import ENUM_FIELDS, LIST_FIELDS, TrainingPlan, normalize_raw

PLAN_SCHEMA_URI = "canifinetune://schema/plan"
RECIPE_URI_PREFIX = "canifinetune://recipe/"

# Flat arguments of all three tools: what changes memory and what an assistant changes first, in that order.
MEMORY_FIELDS = ("model", "gpu", "gpu_vram_gb", "num_gpus", "host_ram_gb", "method", "seq_len", "batch_size",
                 "gradient_checkpointing", "target_modules", "optim", "dtype", "framework", "trainer")
# make_recipe's own: the run, not its memory.
RECIPE_FIELDS = ("dataset", "truncation", "learning_rate", "max_steps", "num_train_epochs", "output_dir")

# Short descriptions (None: the name and type say it all); the plan's own are in canifinetune://schema/plan.
SHORT: dict[str, str | None] = {
    "model": "HF id, catalog name or folder",
    "gpu": "e.g. 'RTX 4090', '2x A100 80GB'",
    "gpu_vram_gb": "instead of gpu",
    "num_gpus": "GPUs in the machine; sharding chosen if not given",
    "host_ram_gb": "machine RAM in GiB, for offload",
    "method": None,
    "seq_len": None,
    "batch_size": "per GPU",
    "gradient_checkpointing": None,
    "target_modules": None,  # 'all-linear' or names (a comma list too); unset: PEFT's for the architecture
    "optim": None,
    "dtype": None,  # unset: bf16, or fp16 on a GPU without bf16 (the answer says what it chose)
    "framework": "the user's trainer: ask",
    "trainer": "not sft: ask its fields (plan)",
    "dataset": "JSONL file or folder",
    "truncation": None,
    "learning_rate": None,
    "max_steps": "-1: num_train_epochs",
    "num_train_epochs": None,
    "output_dir": None,
}
PLAN_DESCRIPTION = f"other plan fields ({PLAN_SCHEMA_URI})"
CONFIG_DESCRIPTION = "the user's training config text (Axolotl, LLaMA-Factory, TRL, HF, PEFT, DeepSpeed)"
MODEL_CONFIG_DESCRIPTION = "config.json text of a model not in the catalog"
KEEP_DESCRIPTION = "fields not to change, e.g. ['seq_len']; ['gpu', 'num_gpus'] stays on these GPUs"
# model_config: a model's config.json is a few KB; the argument takes at most this many characters.
MAX_MODEL_CONFIG_CHARS = 1024 * 1024


# ------------------------------------------------------------------------------------------------ arguments


def _lower(value):
    return value.strip().lower() if isinstance(value, str) else value


def _no_bool_number(value):
    # the SDK validates arguments leniently (true would become 1) before the plan sees them: refuse it here
    if isinstance(value, bool):
        raise ValueError(f"must be a number, not {str(value).lower()}")
    return value


def _number_field(annotation) -> bool:
    kinds = (annotation, *getattr(annotation, "__args__", ()))
    return bool not in kinds and any(k in (int, float) for k in kinds)


def plan_parameter(name: str) -> inspect.Parameter:
    """The keyword parameter for one plan field: its type, constraints and default, a short description, and the
    plan's own leniency (enum values in any case, a comma-separated module list)."""
    field = TrainingPlan.model_fields[name]
    checks: list = []
    if _number_field(field.annotation):
        checks.append(BeforeValidator(_no_bool_number))
    if name in ENUM_FIELDS + LIST_FIELDS:  # 'QLoRA', 'q_proj,v_proj': as the plan itself reads them
        checks.append(BeforeValidator(functools.partial(normalize_raw, name)))
    annotation: Any = field.annotation
    default = field.default
    if name == "model":  # optional here only because a config can name it
        annotation, default = annotation | None, None
    description = SHORT.get(name, field.description)
    extra = (*field.metadata, *([Field(description=description)] if description else []), *checks)
    args = (annotation, *extra)
    hint = Annotated[args] if extra else annotation
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=hint, default=default)


MODEL_CONFIG_PARAMETER = "model_config_text"
# The arguments that hold a text the user wrote (a training config, a model's config.json), kept as sent.
TEXT_ARGUMENTS = ("config", "model_config")


@dataclass(frozen=True)
class SentText:
    """A text argument exactly as the client sent it. The SDK parses a string argument that holds JSON into an object
    before validation (its pre-parsing of stringified arguments), which a JSON config must not go through; it leaves
    any other value alone. So the server's call_tool hands each text argument on in one of these
    (:func:`keep_texts_as_sent`), and the argument's validator (:func:`text_as_sent`) takes its text back."""

    text: str


def keep_texts_as_sent(arguments: dict[str, Any]) -> dict[str, Any]:
    """``arguments`` with each string among :data:`TEXT_ARGUMENTS` wrapped in a :class:`SentText`, which the SDK's
    pre-parsing passes by untouched."""
    return {k: SentText(v) if k in TEXT_ARGUMENTS and isinstance(v, str) else v for k, v in arguments.items()}


def text_as_sent(value: Any) -> Any:
    """A text argument (``config``, ``model_config``) as the client sent it (a :class:`SentText` from the server's
    call_tool); an object the SDK made of its JSON without the text (arguments validated without call_tool), or an
    object the client sent, as JSON."""
    if isinstance(value, SentText):
        return value.text
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return value


def tool_parameters(names: tuple[str, ...], *, keep: bool = False) -> list[inspect.Parameter]:
    """The tool's flat plan fields, then ``plan`` (every other field), ``config``/``config_format``,
    ``model_config`` (a model's config.json text) and ``keep``."""
    from canifinetune.estimator.configs import CONFIG_FORMATS, MAX_CONFIG_BYTES

    kw = inspect.Parameter.KEYWORD_ONLY
    params = [plan_parameter(n) for n in names]
    params.append(inspect.Parameter("plan", kw, default=None, annotation=Annotated[
        dict[str, Any] | None, Field(description=PLAN_DESCRIPTION)]))
    params.append(inspect.Parameter("config", kw, default=None, annotation=Annotated[
        str | None, BeforeValidator(text_as_sent),
        Field(max_length=MAX_CONFIG_BYTES, description=CONFIG_DESCRIPTION)]))
    params.append(inspect.Parameter("config_format", kw, default=None, annotation=Annotated[
        Literal[CONFIG_FORMATS] | None, BeforeValidator(_lower)]))
    # 'model_config' is pydantic's own attribute: the parameter has another name and the argument its alias
    params.append(inspect.Parameter(MODEL_CONFIG_PARAMETER, kw, default=None, annotation=Annotated[
        str | None, BeforeValidator(text_as_sent),
        Field(alias="model_config", max_length=MAX_MODEL_CONFIG_CHARS, description=MODEL_CONFIG_DESCRIPTION)]))
    if keep:
        params.append(inspect.Parameter("keep", kw, default=None, annotation=Annotated[
            list[Annotated[str, Field(max_length=64)]] | None, Field(max_length=64, description=KEEP_DESCRIPTION)]))
    return params


_ABUSE_LIMITS = ("maxLength", "minLength", "maximum", "maxItems")


def compact_schema(schema: dict, *, arguments: bool) -> dict:
    """A tool's JSON schema as sent in tools/list, in place: no titles; for arguments, an optional argument whose
    default is null is simply not required (no null branch, no default), an object's ``additionalProperties:
    true`` (JSON Schema's own default) is not repeated, and the size limits that only stop abuse (max lengths and
    values; the arguments are still checked against them, docs/security.md) are not sent. Never a ``type`` array:
    the Inspector's --strict check (tests/test_mcp_inspector.py) calls it less portable (single-``type`` dialects
    such as Gemini's function declarations)."""
    strip_titles(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            branches = node.get("anyOf")
            if (arguments and isinstance(branches, list) and {"type": "null"} in branches
                    and node.get("default", 0) is None):
                others = [b for b in branches if b != {"type": "null"}]
                node.pop("default")
                if len(others) == 1:
                    node.pop("anyOf")
                    node.update({k: v for k, v in others[0].items() if k not in node})
                else:  # 'all-linear' or a list: the other branches stay
                    node["anyOf"] = others
            if arguments:
                for key in _ABUSE_LIMITS:
                    node.pop(key, None)
                if node.get("additionalProperties") is True:
                    node.pop("additionalProperties")
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(schema)
    if not arguments:
        validation_only(schema)
    return schema


# Keywords that describe a value without constraining it: a client validating structured content needs none of them.
_ANNOTATIONS = ("description", "default", "examples", "title")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames")


def validation_only(schema: Any) -> Any:
    """An output schema as tools/list sends it, in place: what a client needs to validate the structured content
    (types, required fields, enums, references), without prose or annotations (descriptions, defaults, examples,
    titles; docs/mcp.md describes the fields) and without ``additionalProperties: true`` (JSON Schema's default).
    Property names are never touched: a field named ``description`` stays."""
    if not isinstance(schema, dict):
        return schema
    for key in _ANNOTATIONS:
        schema.pop(key, None)
    if schema.get("additionalProperties") is True:
        schema.pop("additionalProperties")
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for sub in schema[key].values():
                validation_only(sub)
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            for sub in schema[key]:
                validation_only(sub)
    for key in _SCHEMA_VALUES:
        validation_only(schema.get(key))
    return schema


def output_model(base: type[BaseModel]) -> type[BaseModel]:
    """``base`` with the optional ``config`` (and for a search ``config_edits``) of a call that gave a config
    (server/config_face.py; docs/configs.md describes their fields), typed loosely to keep the schema small."""
    from pydantic import create_model

    extra: dict[str, Any] = {"config": (dict[str, Any] | None, None)}
    if "suggestions" in base.model_fields:
        extra["config_edits"] = (list[dict[str, Any]] | None, None)
    return create_model(base.__name__, __base__=base, **extra)


def strip_titles(schema: Any) -> Any:
    """Drop pydantic's generated ``title`` keywords (a name repeated in words) from a JSON schema, in place."""
    if isinstance(schema, dict):
        props = schema.get("properties")
        schema.pop("title", None)
        for key, value in schema.items():
            if key == "properties" and isinstance(props, dict):
                for sub in props.values():
                    strip_titles(sub)
            else:
                strip_titles(value)
    elif isinstance(schema, list):
        for item in schema:
            strip_titles(item)
    return schema


def plan_data(arguments: dict[str, Any], sent: frozenset | None) -> tuple[dict[str, Any], frozenset]:
    """The plan's fields from a call: the ``plan`` object, with the flat arguments the client sent over it.

    ``sent`` is the set of argument names the client really sent (the SDK fills in every default); None when the
    tool runs without the server (tests), when ``arguments`` holds only what was given. Returns the fields and
    the names the call set (flat ones sent, plus the plan object's keys)."""
    from canifinetune.estimator.errors import PlanError

    extra = arguments.get("plan") or {}
    fields = TrainingPlan.model_fields
    unknown = [k for k in extra if k not in fields]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise PlanError(f"plan: {safe_text(repr(key), 80)} is not a plan field{hint} (the fields: resource "
                        f"{PLAN_SCHEMA_URI})", field="plan")
    sent = frozenset(arguments) if sent is None else sent
    data = dict(extra)
    for key, value in arguments.items():
        # only what was sent: a default the SDK filled in would count as given (a dtype the GPU should choose)
        if key in fields and key in sent:
            data[key] = value
    return data, frozenset(k for k in sent if k in fields) | frozenset(extra)


def plan_schema_json() -> str:
    """The plan resource: every field's type, default and description (what the ``plan`` argument takes)."""
    return json.dumps(strip_titles(TrainingPlan.model_json_schema()), indent=1)


# ------------------------------------------------------------------------------------------------ errors


def _choices(expected: str) -> list[str]:
    return [c.strip().strip("'\"") for c in re.split(r",| or ", expected) if c.strip()]


def _shown(value: Any) -> str:
    text = repr(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None
    if text is None:
        try:
            text = json.dumps(value)
        except (TypeError, ValueError):
            text = repr(value)
    return safe_text(text, 80)


# pydantic error types -> what the value must be (read from the error's type and ctx, not its message)
_MUST = {"int_parsing": "a whole number", "int_type": "a whole number", "int_from_float": "a whole number",
         "float_parsing": "a number", "float_type": "a number", "bool_parsing": "true or false",
         "bool_type": "true or false", "string_type": "a string", "list_type": "a list", "dict_type": "an object",
         "finite_number": "a finite number"}
_BOUNDS = {"greater_than_equal": ("ge", "greater than or equal to"), "greater_than": ("gt", "greater than"),
           "less_than_equal": ("le", "less than or equal to"), "less_than": ("lt", "less than"),
           "string_too_short": ("min_length", "at least this many characters:"),
           "string_too_long": ("max_length", "at most this many characters:"),
           "too_short": ("min_length", "at least this many items:"),
           "too_long": ("max_length", "at most this many items:")}


def _union_choices(branches: list[str]) -> str:
    words = []
    for b in branches:
        if b.startswith("literal["):
            words += [f"'{c}'" for c in _choices(b[len("literal["):-1])]
        elif b.startswith("list["):
            words.append("a list of names")
        elif b in ("str", "constrained-str"):
            words.append("a string")
        elif b in ("int", "float", "constrained-int", "constrained-float"):
            words.append("a number")
        elif b == "bool":
            words.append("true or false")
        elif b == "none":
            words.append("null")
        else:
            words.append(b)
    seen = list(dict.fromkeys(words))
    return ", ".join(seen[:-1]) + (" or " if len(seen) > 1 else "") + seen[-1] if seen else "another value"


def explain_validation_error(exc: ValidationError, prefix: str = "") -> str:
    """A pydantic ValidationError as sentences a model can act on, read from its structured form (loc, type,
    ctx, input), never from pydantic's text: each names the field, the bad value and the valid choices."""
    by_field: dict[str, list[dict]] = {}
    for detail in exc.errors(include_url=False):
        loc = [str(p) for p in detail.get("loc", ()) if not isinstance(p, int)]
        by_field.setdefault(loc[0] if loc else "", []).append({**detail, "_rest": loc[1:]})
    sentences = []
    for name, errs in by_field.items():
        field = f"{prefix}{name}" if name else (prefix.rstrip(".") or "plan")
        err = errs[0]
        kind, ctx, got = err.get("type", ""), err.get("ctx") or {}, err.get("input")
        raised = ctx.get("error")  # a validator's own exception: its message, without pydantic's "Value error, "
        msg = str(raised) if kind == "value_error" and raised is not None else str(err.get("msg", "invalid value"))
        if len(errs) > 1 and all(e["_rest"] for e in errs):  # a union: one error per branch
            choices = _union_choices([e["_rest"][0] for e in errs])
            if name in LIST_FIELDS:
                choices += " (or a comma list, 'q_proj,v_proj')"
            sentences.append(f"{field}: {_shown(got)} is not valid; give {choices}")
        elif kind == "literal_error":
            allowed = _choices(str(ctx.get("expected", "")))
            close = (difflib.get_close_matches(str(got).lower(), allowed, n=1, cutoff=0.3) if isinstance(got, str)
                     else [])
            sentences.append(f"{field}: {_shown(got)} is not one of " + ", ".join(f"'{c}'" for c in allowed)
                             + (f"; did you mean '{close[0]}'?" if close else ""))
        elif kind == "missing":
            hint = (" (e.g. 'Qwen/Qwen2.5-7B-Instruct'; canifinetune://catalog/models lists the catalog)"
                    if name == "model" else "")
            sentences.append(f"{field} is required{hint}")
        elif kind == "extra_forbidden":
            sentences.append(f"{field}: is not a known field")
        elif not name and (named := raised_field(err)) is not None:
            sentences.append(f"{named[0]}: {named[1]}")  # a cross-field check names its own field (estimator/errors.py)
        elif kind in _MUST:
            sentences.append(f"{field}: {_shown(got)} is not {_MUST[kind]}")
        elif kind in _BOUNDS and _BOUNDS[kind][0] in ctx:
            key, words = _BOUNDS[kind]
            shown = _shown(got) if not isinstance(got, (str, list)) else f"{len(got)} long"
            sentences.append(f"{field}: {shown} is not valid; it must be {words} {ctx[key]}")
        else:
            if isinstance(got, float) and (got != got or got in (float("inf"), float("-inf"))):
                msg = "must be a finite number"
            sentences.append(f"{field}: {msg}" + ("" if isinstance(got, dict) else f"; got {_shown(got)}"))
    return "; ".join(sentences)


# ------------------------------------------------------------------------------------------------ answers


class Part(BaseModel):
    name: str
    bytes: int
    explanation: str | None = None


class GPU(BaseModel):
    name: str
    usable_bytes: int


class Budget(BaseModel):
    """A budget against the GPU: enough to draw it and to decide."""

    verdict: Literal["fits", "tight", "does_not_fit", "unknown"]
    budget_bytes: int = Field(description="peak with CUDA context and safety margin")
    total_bytes: int
    gpu_usable_bytes: int | None = None
    used_fraction: float | None = None
    per_gpu: bool = False
    host_memory_bytes: int = 0
    breakdown: list[Part]


class EstimateView(Budget):
    """estimate_memory's answer. plan: the fields that differ from the defaults (with what the estimate chose,
    said in chosen_defaults); tiers: full / LoRA / QLoRA on this GPU."""

    verdict_reason: str
    chosen_defaults: list[str] = []
    # typed loosely to keep tools/list small: each {method, verdict, budget_bytes, used_fraction} or {method, refused}
    tiers: list[dict[str, Any]] | None = Field(None, description="full, lora, qlora on this GPU: verdict, budget")
    speed: str | None = Field(None, description="approximate tokens/s and time to train, a range")
    model: str
    model_source: str = Field(description="catalog, local, hub-cache, hub or model_config")
    params_source: str = "config"
    method: str
    gpu: GPU | None = None
    peak_allocated_bytes: int
    peak_phase: str
    params_total: int
    params_trainable: int
    image_tokens_per_sample: int | None = Field(None, description="VLM: tokens the images add to seq_len per sample")
    warnings: list[str] = []
    plan: dict[str, Any]


class ChangeView(BaseModel):
    field: str
    old: PlanValue = None
    new: PlanValue = None


class CostView(BaseModel):
    kind: str
    tier: str
    summary: str
    slowdown_fraction: float
    extra_gpus: int = 0
    details: list[str] = []


class SuggestionView(BaseModel):
    rank: int
    changes: list[ChangeView] = Field(description="apply them all to the arguments")
    cost: CostView
    tokens_per_second: float
    estimate: Budget


class SuggestView(BaseModel):
    """suggest_cheaper_config's answer."""

    original: EstimateView
    fits_already: bool
    keep: list[str]
    suggestions: list[SuggestionView]
    nothing_fits: bool
    min_reachable_bytes: int | None = None
    smallest_gpu: str | None = None
    smallest_gpu_usable_bytes: int | None = None
    min_gpus: int | None = None
    min_gpus_sharding: str | None = None
    notes: list[str] = []


class RecipeView(BaseModel):
    """make_recipe's answer: files names the recipe's files (each comes as a resource link, with its URI)."""

    verdict: Literal["fits", "tight", "does_not_fit", "unknown"]
    verdict_reason: str
    budget_bytes: int
    gpu_usable_bytes: int | None = None
    launch_command: str
    cli_command: str = Field(description="writes the same files into a folder")
    next_step: str = Field(description="the first command to run in that folder, and what it checks")
    chosen_defaults: list[str] = []
    files: list[str]
    framework_note: str | None = None


@lru_cache(maxsize=1)
def _defaults() -> dict[str, Any]:
    return {k: json.loads(json.dumps(f.default)) for k, f in TrainingPlan.model_fields.items() if not f.is_required()}


def plan_delta(plan: TrainingPlan) -> dict[str, Any]:
    """The plan's fields that differ from the defaults (the model always)."""
    defaults = _defaults()
    return {k: v for k, v in plan.model_dump(mode="json").items() if k not in defaults or v != defaults[k]}


def _parts(est, explain: bool) -> list[dict]:
    return [{"name": c.name, "bytes": c.bytes, **({"explanation": c.explanation} if explain else {})}
            for c in est.breakdown]


def budget_view(est, explain: bool = False) -> dict:
    return {"verdict": est.verdict, "budget_bytes": est.budget_bytes, "total_bytes": est.total_bytes,
            "gpu_usable_bytes": est.gpu_usable_bytes, "used_fraction": est.used_fraction, "per_gpu": est.per_gpu,
            "host_memory_bytes": est.host_memory_bytes, "breakdown": _parts(est, explain)}


def tiers_view(est) -> list[dict] | None:
    """The tier row, compact: method, verdict, budget and share (or why the method is refused)."""
    if not est.tiers:
        return None
    return [{"method": t.method, "verdict": t.verdict, "budget_bytes": t.budget_bytes, "used_fraction": t.used_fraction}
            if t.refused is None else {"method": t.method, "refused": t.refused} for t in est.tiers]


def estimate_view(est, explain: bool = True) -> dict:
    extra: dict[str, Any] = {}
    if est.chosen_defaults:
        extra["chosen_defaults"] = list(est.chosen_defaults)
    tiers = tiers_view(est)
    if tiers is not None:
        extra["tiers"] = tiers
    if est.speed is not None:
        from canifinetune.estimator.tiers import speed_line

        extra["speed"] = speed_line(est.speed)
    images = {"image_tokens_per_sample": est.image_tokens_per_sample} if est.image_tokens_per_sample else {}
    return {**budget_view(est, explain), "verdict_reason": est.verdict_reason, **extra, "model": est.model,
            "model_source": est.model_source, "params_source": est.params_source, "method": est.method,
            "gpu": {"name": est.gpu.name, "usable_bytes": est.gpu.usable_bytes} if est.gpu else None,
            "peak_allocated_bytes": est.peak_allocated_bytes, "peak_phase": est.peak_phase,
            "params_total": est.params_total, "params_trainable": est.params_trainable, **images,
            "warnings": list(est.warnings), "plan": plan_delta(est.plan)}


def suggest_view(result) -> dict:
    return {
        "original": estimate_view(result.original, explain=False),
        "fits_already": result.fits_already, "keep": list(result.keep),
        "suggestions": [{
            "rank": s.rank, "changes": [c.model_dump(mode="json") for c in s.changes],
            "cost": {"kind": s.cost.kind, "tier": s.cost.tier, "summary": s.cost.summary,
                     "slowdown_fraction": s.cost.slowdown_fraction, "extra_gpus": s.cost.extra_gpus,
                     "details": list(s.cost.details)},
            "tokens_per_second": round(s.throughput.tokens_per_second, 1),
            "estimate": budget_view(s.estimate)} for s in result.suggestions],
        "nothing_fits": result.nothing_fits, "min_reachable_bytes": result.min_reachable_bytes,
        "smallest_gpu": result.smallest_gpu, "smallest_gpu_usable_bytes": result.smallest_gpu_usable_bytes,
        "min_gpus": result.min_gpus, "min_gpus_sharding": result.min_gpus_sharding, "notes": list(result.notes),
    }


# ------------------------------------------------------------------------------------------------ recipe files

MAX_RECIPE_KEY = 4096
# A recipe made from a model_config: the config is kept by the server process that made it (its URI names it by
# digest, so the links stay short), at most this many configs and this many bytes of them.
MAX_KEPT_MODEL_CONFIGS = 64
MAX_KEPT_MODEL_CONFIG_BYTES = 16 * 1024 * 1024
_KEPT_MODEL_CONFIGS: dict[str, tuple[dict, int]] = {}
_KEPT_LOCK = threading.Lock()


def _model_config_digest(config: dict) -> tuple[str, int]:
    import base64
    import hashlib

    raw = json.dumps(config, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(hashlib.sha256(raw).digest()).decode()[:22].replace("-", "_"), len(raw)


def keep_model_config(config: dict) -> str:
    """Keep a model_config for the recipe links that name it; its digest (oldest dropped beyond the bounds)."""
    digest, size = _model_config_digest(config)
    with _KEPT_LOCK:
        _KEPT_MODEL_CONFIGS.pop(digest, None)
        _KEPT_MODEL_CONFIGS[digest] = (config, size)
        while len(_KEPT_MODEL_CONFIGS) > MAX_KEPT_MODEL_CONFIGS or (
                len(_KEPT_MODEL_CONFIGS) > 1
                and sum(n for _, n in _KEPT_MODEL_CONFIGS.values()) > MAX_KEPT_MODEL_CONFIG_BYTES):
            _KEPT_MODEL_CONFIGS.pop(next(iter(_KEPT_MODEL_CONFIGS)))
    return digest


RECIPE_KEY_WINDOW_BITS = 12  # zlib's window of 2**12 bytes (its default, 15, sizes the state for 32 KiB inputs)
RECIPE_KEY_MEM_LEVEL = 2  # zlib's hash-table size for that window (default 8)


def recipe_key(plan: TrainingPlan, model_config: dict | None = None) -> str:
    """The plan's non-default fields, compressed into the URI of its recipe files (the recipe is a function of the
    plan, so the file can be made again when it is read, by this or another server process). With a model_config,
    ``.<digest>`` names it: the server process that made the recipe keeps it."""
    import base64
    import zlib

    raw = json.dumps(plan_delta(plan), separators=(",", ":"), sort_keys=True).encode()
    # a 4 KiB window holds any plan (a few hundred bytes) and spares zlib.compress's 256 KiB of state per call (0.1 ms
    # of a make_recipe); zlib.decompress reads any window size, so keys made either way stay readable
    deflate = zlib.compressobj(9, zlib.DEFLATED, RECIPE_KEY_WINDOW_BITS, RECIPE_KEY_MEM_LEVEL)
    key = base64.urlsafe_b64encode(deflate.compress(raw) + deflate.flush()).decode().rstrip("=")
    return key if model_config is None else f"{key}.{keep_model_config(model_config)}"


def plan_from_key(key: str) -> TrainingPlan:
    """The plan a recipe URI names; a CanIFinetuneError when the key is not one this server made."""
    return recipe_from_key(key)[0]


def recipe_from_key(key: str) -> tuple[TrainingPlan, dict | None]:
    """The plan a recipe URI names and its model_config (None when it names none); a CanIFinetuneError when the key
    is not one this server made."""
    import base64
    import binascii
    import zlib

    from canifinetune.estimator.errors import CanIFinetuneError

    bad = CanIFinetuneError(f"recipe: {safe_text(repr(key), 60)} is not a recipe this server made; call make_recipe",
                            field="uri")
    if not key or len(key) > MAX_RECIPE_KEY or not re.fullmatch(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_]{22})?", key):
        raise bad
    key, _, digest = key.partition(".")
    model_config = None
    if digest:
        with _KEPT_LOCK:
            kept = _KEPT_MODEL_CONFIGS.get(digest)
        if kept is None:
            raise CanIFinetuneError("recipe: this recipe was made from a model_config that this server process no "
                                    "longer holds (it keeps them in memory only); call make_recipe again with the "
                                    "model_config", field="uri")
        model_config = kept[0]
    try:
        packed = base64.urlsafe_b64decode(key + "=" * (-len(key) % 4))
        inflate = zlib.decompressobj()
        raw = inflate.decompress(packed, 64 * 1024)  # bounded: a plan is a few hundred bytes
        if inflate.unconsumed_tail:
            raise bad
        data = json.loads(raw)
    except (binascii.Error, zlib.error, ValueError):
        raise bad from None
    if not isinstance(data, dict):
        raise bad
    try:
        return TrainingPlan(**data), model_config
    except ValidationError as exc:
        raise CanIFinetuneError(f"recipe: {explain_validation_error(exc)}", field="uri") from None


def mime_of(name: str) -> str:
    return {".yaml": "application/yaml", ".json": "application/json", ".sh": "text/x-shellscript",
            ".jsonl": "application/jsonl", ".py": "text/x-python"}.get(
        name[name.rfind("."):], "text/plain")


def cli_command(plan: TrainingPlan, out: str = "my-recipe") -> str:
    """``canifinetune recipe ...`` with the plan's non-default fields as flags: writes the same files."""
    words = ["canifinetune", "recipe"]
    for key, value in plan_delta(plan).items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            words.append(flag if value else "--no-" + key.replace("_", "-"))
        elif value is not None:
            words += [flag, ",".join(value) if isinstance(value, list) else str(value)]
    return shlex.join([*words, "--out", out])
