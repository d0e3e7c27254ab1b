"""The MCP server: canifinetune's tools, resources, prompt and completions for AI assistants.

A thin adapter over the core. Each tool takes flat the :class:`TrainingPlan` fields that change memory (their
names, types, constraints and defaults copied from ``TrainingPlan.model_fields``; make_recipe adds the run's own)
and every other field in one ``plan`` object (server/mcp_views.py), builds a plan, calls the core and returns
small validated structured content plus a short text. Every failure reaches the client as a ``ToolError``
whose text names the field, the bad value and the valid choices; protocol errors carry JSON-RPC codes.

Run it with ``canifinetune serve`` (stdio) or ``canifinetune serve --http`` (streamable HTTP on
127.0.0.1, DNS-rebinding protection on). Logs go to stderr only.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError, UnexpectedToolError
from mcp.types import CallToolResult, Completion, ResourceLink, TextContent, ToolAnnotations
from pydantic import BaseModel, BeforeValidator, Field, InstanceOf, ValidationError
from pydantic.json_schema import SkipJsonSchema

from canifinetune.estimator.errors import CanIFinetuneError, safe_text
from canifinetune.estimator.estimate import Estimate
from canifinetune.estimator.plan import ENUM_FIELDS, LIST_FIELDS, TrainingPlan, normalize_raw
from canifinetune.server.config_face import load_call_config, mcp_structured, mcp_text
from canifinetune.server.mcp_views import (
    MEMORY_FIELDS,
    MODEL_CONFIG_PARAMETER,
    PLAN_SCHEMA_URI,
    RECIPE_FIELDS,
    RECIPE_URI_PREFIX,
    EstimateView,
    RecipeView,
    SuggestView,
    compact_schema,
    estimate_view,
    explain_validation_error,
    keep_texts_as_sent,
    output_model,
    plan_data,
    suggest_view,
    tool_parameters,
)

if TYPE_CHECKING:
    from canifinetune.estimator.configs import LoadedConfig

logger = logging.getLogger("canifinetune.mcp")

SERVER_NAME = "canifinetune"
DEFAULT_HTTP_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 8765
LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")
# A tool call is a few hundred bytes; anything near this is abuse. The SDK answers 413 above it (default 4 MiB).
MAX_REQUEST_BODY_BYTES = 1024 * 1024

INSTRUCTIONS = """\
canifinetune estimates the peak GPU memory of fine-tuning a Hugging Face causal LM (full, LoRA or
QLoRA) from its config.json alone (never the weights) and says whether it fits a GPU.
Loop: estimate_memory with model and gpu (or gpu_vram_gb); if it does not fit, suggest_cheaper_config
with the same arguments and apply the first suggestion's changes (a list of {field, old, new}); when it
fits, make_recipe. Every argument has a default; fields not listed as arguments go in the plan object
(canifinetune://schema/plan lists them). The estimate is for the trainer named by framework (default trl,
what make_recipe writes): when the user trains with a script or tool of their own, ask which and set
framework; the same plan can need twice the memory under another stack. For preference or RL training set trainer
(dpo, orpo, kto, reward, grpo) and ask for its fields (reference model, GRPO's num_generations,
max_completion_length, use_vllm/vllm_mode): they go in the plan object. A vision-language model (Qwen2-VL,
Qwen2.5-VL, Qwen3-VL and -MoE, LLaVA, Gemma 3, Llama 3.2 Vision, SmolVLM) needs its images: ask the user their
training images' size and how many per sample, and pass image_size ('1280x720'), images_per_sample and any Qwen
processor max_pixels/min_pixels (SmolVLM: longest_edge, do_image_splitting, max_image_size) in the plan object
(seq_len stays the text tokens; the image tokens are added). Say the machine:
num_gpus (the sharding is chosen when not given) and host_ram_gb (judges CPU offload). A model that is neither in the
catalog nor on the Hub: pass its config.json text as model_config. Resources: canifinetune://catalog/gpus,
canifinetune://catalog/models, canifinetune://spec/{model_id}, canifinetune://docs/memory-model."""

def _annotations(offline: bool) -> ToolAnnotations:
    # Open-world only when a tool may read a config from the Hugging Face Hub; offline, the catalog,
    # local folders and the local Hugging Face cache are a closed world.
    return ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                           open_world_hint=not offline)


# --------------------------------------------------------------------------------------------- outputs


Recipe = RecipeView  # make_recipe's structured content (server/mcp_views.py)


# --------------------------------------------------------------------------------------------- inputs


def _number_field(annotation) -> bool:
    kinds = (annotation, *getattr(annotation, "__args__", ()))
    return bool not in kinds and any(k in (int, float) for k in kinds)


def _no_bool_number(value):
    # the SDK validates arguments leniently (true would become 1) before the plan sees them: refuse it here
    if isinstance(value, bool):
        raise ValueError(f"must be a number, not {str(value).lower()}")
    return value


def plan_parameters() -> list[inspect.Parameter]:
    """One keyword parameter per TrainingPlan field: same name, type, constraints, default, description."""
    params = []
    for name, field in TrainingPlan.model_fields.items():
        extra: dict[str, Any] = {}
        if field.examples:
            extra["examples"] = field.examples
        checks: tuple[BeforeValidator, ...] = ()
        if _number_field(field.annotation):
            checks += (BeforeValidator(_no_bool_number),)
        if name in ENUM_FIELDS + LIST_FIELDS:  # 'QLoRA', 'q_proj,v_proj': as the plan itself reads them
            checks += (BeforeValidator(functools.partial(normalize_raw, name)),)
        args = (field.annotation, *field.metadata, Field(description=field.description, **extra), *checks)
        annotation: Any = Annotated[args]  # a value built at run time, for the tool's input schema
        default = inspect.Parameter.empty if field.is_required() else field.default
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default))
    return params


def _plan_from(arguments: dict[str, Any], sent: frozenset[str] | None,
               default_model: str | None = None) -> tuple[TrainingPlan, LoadedConfig | None]:
    """The plan of a call: the plan object, the flat arguments sent over it, the user's training config under them;
    and that config as read (None when the call gave none). ``sent`` names the arguments the client sent (None: a
    direct call, whose ``arguments`` hold only what was given). ``default_model`` names the model when nothing else
    does (a model_config's own name)."""
    from canifinetune.estimator.errors import ConfigError

    data, given = plan_data(arguments, sent)  # the plan object, the flat arguments sent over it
    try:
        loaded = load_call_config(arguments, data, given)  # the user's own config, with the arguments over it
    except ConfigError:
        if default_model is None or data.get("model") is not None:
            raise
        # a training config that names no model, beside a model_config: the model_config's name
        loaded = load_call_config(arguments, {**data, "model": default_model}, given | {"model"})
    if loaded is not None:
        return loaded.plan, loaded
    if data.get("model") is None:  # optional in the schema only because a config (or a model_config) can name it
        data.pop("model", None)
        if default_model is not None:
            data["model"] = default_model
    return TrainingPlan(**data), None


# ------------------------------------------------------------------------------------- model_config (issue 21)

MODEL_CONFIG_SOURCE = "model_config"
DEFAULT_CUSTOM_NAME = "custom model"
_MODEL_CONFIG_HELP = "give the text of the model's config.json (one JSON object, as the model's repo ships it)"


def parse_model_config(text: str) -> dict:
    """The ``model_config`` argument's JSON, read with the core's bounds (size, nesting, no NaN); a
    CanIFinetuneError naming model_config otherwise."""
    from canifinetune.estimator.errors import ModelConfigError
    from canifinetune.estimator.model_sources import parse_config_text

    try:
        return parse_config_text(text, MODEL_CONFIG_SOURCE)
    except ModelConfigError as exc:
        reason = str(exc).removeprefix("model: ").removeprefix(MODEL_CONFIG_SOURCE).lstrip(": ")
        raise CanIFinetuneError(f"model_config: {reason}; {_MODEL_CONFIG_HELP}", field="model_config") from None


def model_config_name(config: dict) -> str:
    """The name a model_config goes by when the call gives no model: its ``_name_or_path``, else 'custom model'."""
    name = config.get("_name_or_path")
    # printable only: no control, format (bidi, zero-width) or line-separator characters, as the plan requires
    if isinstance(name, str) and name.strip() and len(name) <= 200 and name.isprintable():
        return name.strip()
    return DEFAULT_CUSTOM_NAME


def resolved_from_config(name: str, config: dict):
    """A ResolvedModel built from a config.json's dict, as a local folder's is (the core's ModelSpec.from_config),
    named ``name``; a CanIFinetuneError naming model_config when its architecture cannot be read."""
    from dataclasses import replace

    from canifinetune.estimator.errors import ModelConfigError
    from canifinetune.estimator.model_sources import ResolvedModel
    from canifinetune.estimator.spec import ModelSpec

    from .hub import _code_warning  # a config with auto_map: estimated from its standard fields, said so

    try:
        spec = ModelSpec.from_config(config)
    except ModelConfigError as exc:
        reason = str(exc).removeprefix("model: ")
        raise CanIFinetuneError(
            f"model_config: {reason}; {_MODEL_CONFIG_HELP}, for a decoder LM (model_type, hidden_size, "
            "num_hidden_layers, num_attention_heads, intermediate_size, vocab_size), or a catalog model "
            "(canifinetune://catalog/models)", field="model_config") from None
    warning = _code_warning(config)
    if warning is not None and warning not in spec.warnings:
        spec = replace(spec, warnings=(warning, *spec.warnings))
    return ResolvedModel(name, MODEL_CONFIG_SOURCE, config, spec)


@dataclass(frozen=True)
class CallInputs:
    """What one tool call asks about, read from its arguments (:func:`call_inputs`) and handed on explicitly: the
    plan, the model_config's dict (None without one) and the user's training config as read (None without one)."""

    plan: TrainingPlan
    model_config: dict | None = None
    config: LoadedConfig | None = None


def call_inputs(arguments: dict[str, Any], sent: frozenset[str] | None = None) -> CallInputs:
    """The inputs of a call with ``arguments``; ``sent`` names the arguments the client really sent (the SDK fills
    every default in; CanIFinetuneServer.call_tool passes it), None for a direct call whose ``arguments`` hold only
    what was given."""
    text = arguments.get("model_config")
    model_config = parse_model_config(text) if text is not None else None
    plan, loaded = _plan_from(arguments, sent, model_config_name(model_config) if model_config is not None else None)
    return CallInputs(plan, model_config, loaded)


@dataclass
class ToolCall:
    """One tool call's own data, handed on explicitly: CanIFinetuneServer.call_tool makes it and gives it to the tool
    function (the hidden argument TOOL_CALL_ARGUMENT), which hands it to the implementation (``tool_call``); a direct
    call may give its own, or none. ``sent`` names the arguments the client sent (the SDK fills every default in;
    None: a direct call, whose arguments hold only what was given, :func:`call_inputs`). ``models`` is filled in by
    the call: how its model was read (:func:`_model_for`), which the answer cache reads to decide whether the answer
    may be kept, and what would make it stale."""

    sent: frozenset[str] | None = None
    models: list[tuple] = dataclass_field(default_factory=list)


def describe_error(exc: BaseException) -> str:
    """The text a model reads for a failed call: the field, the bad value and the valid choices, read from the
    error's structured form (server/mcp_views.py explain_validation_error)."""
    if isinstance(exc, ValidationError):
        return explain_validation_error(exc)
    return str(exc)


def _guard(tool: str, fn, *args, **kwargs):
    """Run the core; turn every failure into a ToolError with a message a model can act on."""
    try:
        return fn(*args, **kwargs)
    except ToolError as exc:
        raise ToolError(safe_text(exc)) from exc.__cause__
    except ValidationError as exc:
        raise ToolError(safe_text(f"{tool}: {describe_error(exc)}")) from exc
    except CanIFinetuneError as exc:
        raise ToolError(safe_text(f"{tool}: {exc}")) from exc
    except Exception as exc:  # never a bare "Error executing tool"
        logger.exception("%s failed unexpectedly", tool)
        raise ToolError(
            f"{tool}: internal error: {type(exc).__name__}: {safe_text(exc, 300)}. The inputs may still be valid; "
            "please report this (https://github.com/canifinetune/canifinetune/issues)"
        ) from exc


# --------------------------------------------------------------------------------------------- tools


# Every function that may resolve a model takes ``offline`` as a value: build_server passes its server's setting
# down (HF_HUB_OFFLINE is read, never written), so two servers in one process keep their own.


def _resolve(name: str, offline: bool):
    """Catalog -> local folder -> Hugging Face cache -> Hub (unless ``offline`` or HF_HUB_OFFLINE)."""
    from .hub import resolve_any

    return resolve_any(name, offline=offline)


def _model_for(plan: TrainingPlan, offline: bool, model_config: dict | None = None, notes: list | None = None):
    """The plan's model: built from its model_config when the call gave one, else resolved by name; how it was read
    is added to ``notes`` (a ToolCall's ``models``, for the answer cache) when given."""
    if model_config is not None:
        rm = resolved_from_config(plan.model, model_config)
    else:
        rm = _resolve(plan.model, offline)
    if notes is not None:
        notes.append(model_note(plan.model, rm, offline))
    return rm


# ------------------------------------------------------------------------------------------ the answer cache

# The core is pure: a tool's answer is a function of its arguments and of the model's config. So a server keeps
# its recent answers (an LRU keyed on the tool and the canonical JSON of its arguments), only for calls whose model
# was read without the network: the catalog (while no local folder takes its name), a model_config, a local folder
# (while its config.json and safetensors files are unchanged) or, on an offline server, the Hugging Face cache.
ANSWER_CACHE_ENTRIES = 1024
ANSWER_CACHE_BYTES = 16 * 1024 * 1024  # the answers' JSON, all together
ANSWER_CACHE_MAX_ANSWER_BYTES = 256 * 1024  # a larger answer is not kept


def _files_fingerprint(where: str) -> tuple | None:
    """What a local model's answer depends on: its folder's entries and the stat of its config.json and safetensors
    files (a file given directly: its own); None when they cannot be read."""
    import os

    from canifinetune.estimator.model_sources import MAX_SAFETENSORS_FILES

    path = Path(where)
    try:
        if path.is_dir():
            files = [path / "config.json", *sorted(path.glob("*.safetensors"))[: MAX_SAFETENSORS_FILES + 1]]
            head: int | None = os.stat(path).st_mtime_ns
        else:
            files, head = [path], None
        stats = [os.stat(f) for f in files]
    except OSError:
        return None
    return head, tuple((str(f), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                       for f, st in zip(files, stats, strict=True))


def model_note(name: str, rm, offline: bool) -> tuple:
    """How a call's model (``rm``, asked for as ``name``) was read, for the answer cache: (kind, what, expected)."""
    if rm.source == "catalog":
        return ("not-local", name, None)
    if rm.source == "model_config" or (rm.source == "hub-cache" and offline):
        return ("pure", None, None)
    if rm.source == "local":
        fingerprint = _files_fingerprint(rm.id)
        return ("files", rm.id, fingerprint) if fingerprint is not None else ("uncacheable", None, None)
    return ("uncacheable", None, None)  # the Hub, or the cache of an online server (which may ask the Hub): never kept


def _still_valid(note: tuple) -> bool:
    from canifinetune.estimator.model_sources import is_local_name

    kind, what, expected = note
    if kind == "not-local":
        return not is_local_name(what)
    if kind == "files":
        return _files_fingerprint(what) == expected
    return kind == "pure"


class AnswerCache:
    """A bounded LRU of tool answers (CallToolResult), each with the checks that it still holds."""

    def __init__(self, entries: int, max_bytes: int):
        import threading
        from collections import OrderedDict

        self.entries, self.max_bytes, self.bytes = entries, max_bytes, 0
        self._items: OrderedDict[str, tuple[CallToolResult, tuple, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    @staticmethod
    def key(tool: str, arguments: dict[str, Any]) -> str | None:
        """The tool's name and the canonical JSON of its arguments, hashed; None for a call that is never kept."""
        import hashlib

        if tool == "make_recipe" and arguments.get("model_config") is not None:
            return None  # its links name the model_config, kept by this call in a bounded store (mcp_views.py)
        try:
            canonical = json.dumps([tool, arguments], sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        except (TypeError, ValueError):
            return None
        return hashlib.sha256(canonical.encode()).hexdigest()

    def get(self, key: str) -> CallToolResult | None:
        with self._lock:
            item = self._items.get(key)
        if item is None:
            return None
        if not all(_still_valid(note) for note in item[1]):
            self._drop(key)
            return None
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
        return item[0]

    def put(self, key: str, result: CallToolResult, notes: list) -> None:
        if not notes or any(kind == "uncacheable" for kind, _, _ in notes):
            return
        size = len(result.model_dump_json(by_alias=True, exclude_none=True))
        if size > ANSWER_CACHE_MAX_ANSWER_BYTES:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= old[2]
            self._items[key] = (result, tuple(notes), size)
            self.bytes += size
            while self._items and (len(self._items) > self.entries or self.bytes > self.max_bytes):
                self.bytes -= self._items.popitem(last=False)[1][2]

    def _drop(self, key: str) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= old[2]


def _estimate(plan: TrainingPlan, offline: bool, model_config: dict | None = None, tiers: bool = False,
              notes: list | None = None) -> Estimate:
    """The estimate of ``plan`` (``tiers``: with its full / LoRA / QLoRA row, estimator/tiers.py); how its model was
    read goes to ``notes`` when given (:func:`_model_for`)."""
    from canifinetune.estimator.estimate import estimate
    from canifinetune.estimator.tiers import estimate_with_tiers

    model = _model_for(plan, offline, model_config, notes)
    return estimate_with_tiers(plan, model) if tiers else estimate(plan, model=model)


def estimate_memory_impl(arguments: dict[str, Any], *, offline: bool = False,
                         tool_call: ToolCall | None = None) -> CallToolResult:
    """estimate_memory's answer; ``tool_call``: the call's own data (:class:`ToolCall`: the argument names the client
    sent; filled in with how the model was read)."""
    from .text import format_estimate_brief

    this = tool_call if tool_call is not None else ToolCall()

    def run() -> tuple[Estimate, LoadedConfig | None]:
        call = call_inputs(arguments, this.sent)
        return _estimate(call.plan, offline, call.model_config, tiers=True, notes=this.models), call.config

    est, loaded = _guard("estimate_memory", run)
    text = format_estimate_brief(est, next_move=_next_move(est))
    return CallToolResult(
        content=[TextContent(type="text", text=mcp_text(text, loaded))],
        structured_content=mcp_structured(estimate_view(est), loaded),
    )


def _next_move(est: Estimate) -> str | None:
    from .text import recipe_move

    if est.verdict == "does_not_fit":
        return "call suggest_cheaper_config with the same arguments; it returns changes that fit, already estimated"
    if est.verdict == "tight":
        return ("it may run, near the limit; suggest_cheaper_config finds a configuration with room to spare, "
                "or " + recipe_move(est.plan, "make_recipe and measure a short probe run"))
    if est.verdict == "unknown":
        return "pass gpu (a catalog name such as 'RTX 4090') or gpu_vram_gb (e.g. 24) for a verdict"
    return recipe_move(est.plan, "call make_recipe with the same arguments for a runnable recipe, then run a short "
                                 "probe")


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return {k: _jsonable(getattr(value, k)) for k in value.__dataclass_fields__}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def _get(obj: Any, *names: str) -> Any:
    for name in names:
        if isinstance(obj, dict) and name in obj:
            return obj[name]
        if not isinstance(obj, dict) and hasattr(obj, name):
            return getattr(obj, name)
    return None


def suggest_impl(arguments: dict[str, Any], *, offline: bool = False,
                 tool_call: ToolCall | None = None) -> CallToolResult:
    """The search's own answer (estimator/search.py ``suggest``), unchanged, with the shared text; ``tool_call``: the
    call's own data (:class:`ToolCall`)."""
    from canifinetune.estimator.search import SuggestResult, suggest

    from .text import format_suggestions_brief

    this = tool_call if tool_call is not None else ToolCall()

    def run() -> tuple[SuggestResult, LoadedConfig | None]:
        call = call_inputs(arguments, this.sent)
        # the search resolves catalog and local models itself; Hub models and model_configs are passed in
        rm = _model_for(call.plan, offline, call.model_config, this.models)
        extra = {"model": rm} if rm.source not in ("catalog", "local") else {}
        return suggest(call.plan, keep=arguments.get("keep") or (), **extra), call.config

    result, loaded = _guard("suggest_cheaper_config", run)
    return CallToolResult(
        content=[TextContent(type="text", text=mcp_text(format_suggestions_brief(result), loaded, result))],
        structured_content=mcp_structured(suggest_view(result), loaded, result),
    )


def recipe_impl(arguments: dict[str, Any], *, offline: bool = False,
                tool_call: ToolCall | None = None) -> CallToolResult:
    """The recipe's files as resource links (canifinetune://recipe/<plan>/<file>): the text says what they are
    and how to run them; a client reads a file only when it needs it. ``tool_call``: the call's own data
    (:class:`ToolCall`)."""
    from .mcp_views import cli_command, mime_of, recipe_key
    from .text import format_recipe_brief

    this = tool_call if tool_call is not None else ToolCall()

    def run() -> tuple[dict, dict[str, str], dict[str, int], str | None, LoadedConfig | None]:
        from canifinetune.recipes.render import make_recipe

        call = call_inputs(arguments, this.sent)
        plan, model_config = call.plan, call.model_config
        est = _estimate(plan, offline, model_config, notes=this.models)
        made = make_recipe(est.plan, est)  # the plan with what the estimate chose for the hardware (dtype, sharding)
        key = recipe_key(plan, model_config)  # the plan asked for: reading a link makes the very same files again
        uris = {name: f"{RECIPE_URI_PREFIX}{key}/{name}" for name in made.files}
        view = RecipeView(verdict=est.verdict, verdict_reason=est.verdict_reason, budget_bytes=est.budget_bytes,
                          gpu_usable_bytes=est.gpu_usable_bytes, launch_command=made.launch_command,
                          cli_command=cli_command(plan), next_step=made.next_step,
                          chosen_defaults=list(est.chosen_defaults), files=list(made.files),
                          framework_note=made.framework_note)
        note = None
        if model_config is not None:
            note = (f"note: model_config gave the architecture; the recipe loads the model by name ({plan.model!r}): "
                    "set model to its Hub id or local folder before running it")
        sizes = {name: len(text.encode()) for name, text in made.files.items()}
        out = view.model_dump(mode="json")
        if not out["chosen_defaults"]:
            del out["chosen_defaults"]
        return out, uris, sizes, note, call.config

    view, uris, sizes, note, loaded = _guard("make_recipe", run)
    # each file's URI once: in its resource link (the structured content names the files)
    links = [ResourceLink(type="resource_link", uri=uri, name=name, mime_type=mime_of(name), size=sizes[name])
             for name, uri in uris.items()]
    verdict, _, rest = format_recipe_brief(view).partition("\n")
    chosen = "".join(f"\nchose: {c}" for c in view.get("chosen_defaults", ()))  # under the verdict, as estimate_memory
    text = verdict + chosen + "\n" + rest + (f"\n{note}" if note else "")
    return CallToolResult(
        content=[TextContent(type="text", text=mcp_text(text, loaded)), *links],
        structured_content=mcp_structured(view, loaded),
    )


def recipe_file(key: str, name: str, *, offline: bool = False) -> str:
    """One file of the recipe a canifinetune://recipe/<key>/<name> link names, made again from its plan."""
    from .mcp_views import recipe_from_key

    plan, model_config = recipe_from_key(key)
    from canifinetune.recipes.render import make_recipe

    est = _estimate(plan, offline, model_config)
    made = make_recipe(est.plan, est)
    if name not in made.files:
        raise ResourceNotFoundError(f"recipe: no file {safe_text(repr(name), 80)}; the recipe's files: "
                                    + ", ".join(made.files))
    return made.files[name]


# The call's own data (a ToolCall: the names of the arguments the client sent, as the SDK fills every default in
# before the tool function runs; and how the model was read, for the answer cache): given by
# CanIFinetuneServer.call_tool to the tool function as this argument, which the published schema leaves out and a
# client cannot send (call_tool refuses names that are not in the schema).
TOOL_CALL_ARGUMENT = "tool_call"


def runs_in_the_event_loop(arguments: dict[str, Any], offline: bool) -> bool:
    """Whether a call is answered in the event loop itself rather than on a worker thread: only when it can neither
    reach the network (the server is offline, the call gives its model's config, or names a catalog model) nor read
    a dataset, so it is a few milliseconds of pure computation. The worker thread's hop and the GIL passed between
    it and the event loop cost more than such a call: on bench_http_vs_bare.py's mix at 20 clients, 8.3 -> 5.0 ms of
    server CPU per call (docs/mcp.md, "Tests and benchmark")."""
    given = arguments.get("plan")
    plan: dict[str, Any] = given if isinstance(given, dict) else {}
    if arguments.get("dataset") or plan.get("dataset"):
        return False
    model = arguments.get("model") or plan.get("model")
    if isinstance(model, str) and _names_a_local_path(model):
        return False  # a folder's config.json and safetensors headers (up to 2,048 files) are read from disk
    if offline or arguments.get(MODEL_CONFIG_PARAMETER) is not None or arguments.get("model_config") is not None:
        return True
    if not isinstance(model, str):
        return False
    from canifinetune.estimator.catalog import find_model

    return find_model(model, forgiving=False) is not None


def _names_a_local_path(model: str) -> bool:
    """Whether ``model`` is a path on this machine (one ``lstat``; a refused name is answered on a thread too)."""
    try:
        return os.path.lexists(os.path.expanduser(model))
    except (OSError, ValueError):
        return True


def _tool_function(name: str, impl, params: list[inspect.Parameter], output: type[BaseModel], doc: str,
                   offline: bool = False):
    """A tool function with the given parameters (server/mcp_views.py tool_parameters) and output model (plus the
    optional config report), and the hidden TOOL_CALL_ARGUMENT that it hands to ``impl`` as ``tool_call``; run in
    the event loop or on a worker thread as :func:`runs_in_the_event_loop` decides."""

    async def fn(**arguments):
        tool_call = arguments.pop(TOOL_CALL_ARGUMENT, None)
        if runs_in_the_event_loop(arguments, offline):
            return impl(arguments, tool_call=tool_call)
        import anyio.to_thread

        return await anyio.to_thread.run_sync(functools.partial(impl, arguments, tool_call=tool_call))

    hidden = inspect.Parameter(TOOL_CALL_ARGUMENT, inspect.Parameter.KEYWORD_ONLY, default=None,
                               annotation=Annotated[InstanceOf[ToolCall] | None, SkipJsonSchema()])
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    fn.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [*params, hidden], return_annotation=Annotated[CallToolResult, output_model(output)]
    )
    return fn


ESTIMATE_DOC = """\
Peak GPU memory of fine-tuning a Hugging Face model against a GPU: verdict, need vs have, the budget by
component. Give model and gpu (or gpu_vram_gb); the rest defaults to TRL SFTTrainer with LoRA. Ask which
trainer the user runs (framework); for DPO/KTO/GRPO (trainer) the reference model, generations,
completion length and vLLM; for a VLM, image_size and images_per_sample (plan fields)."""

SUGGEST_DOC = """\
Configurations that fit, best first (one per kind: same mathematics, lower precision, shorter context,
offload, more or larger GPUs), each with its changes to apply and what it costs; or the GPU on which the
plan fits unchanged. Same arguments as estimate_memory."""

RECIPE_DOC = """\
A runnable TRL recipe for the plan: its files as resource links, the command that writes them, the launch
command and the plan's verdict. Same arguments as estimate_memory plus the run's own. A vision-language plan
trains image rows {images, messages}; without a dataset it ships example rows."""


# --------------------------------------------------------------------------------------------- server


class CanIFinetuneServer(MCPServer):
    """MCPServer whose argument errors name the field, the bad value and the nearest valid choice, and whose
    protocol errors carry JSON-RPC codes (an unknown prompt or a bad prompt argument: -32602 invalid params); with
    an ``answer_cache`` (build_server gives one), repeated identical calls are answered from it."""

    answer_cache: AnswerCache | None = None

    async def get_prompt(self, name, arguments=None, context=None):
        from mcp import MCPError
        from mcp.types import INVALID_PARAMS

        prompt = self._prompt_manager.get_prompt(name)
        if prompt is None:
            known = [p.name for p in self._prompt_manager.list_prompts()]
            close = difflib.get_close_matches(str(name), known, n=1)
            raise MCPError(INVALID_PARAMS, f"prompt: {safe_text(repr(name), 80)} is not a prompt of this server"
                           + (f"; did you mean '{close[0]}'?" if close else "") + f" (prompts: {', '.join(known)})")
        given = arguments or {}
        missing = [a.name for a in prompt.arguments or () if a.required and a.name not in given]
        unknown = [k for k in given if k not in {a.name for a in prompt.arguments or ()}]
        if missing or unknown:
            what = (f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required" if missing
                    else f"{safe_text(repr(unknown[0]), 80)} is not an argument")
            raise MCPError(INVALID_PARAMS, f"{name}: {what} (arguments: "
                           + ", ".join(f"{a.name}{'' if a.required else '?'}" for a in prompt.arguments or ()) + ")")
        return await super().get_prompt(name, arguments, context)

    async def call_tool(self, name, arguments, context=None):
        tool = self._tool_manager.get_tool(name)
        if tool is None:
            close = difflib.get_close_matches(name, [t.name for t in self._tool_manager.list_tools()], n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ToolError(f"unknown tool {safe_text(repr(name), 80)}{hint} Tools: estimate_memory, "
                            "suggest_cheaper_config, make_recipe")
        known = list(tool.parameters.get("properties", {}))
        arguments = dict(arguments or {})
        for key in list(arguments):
            if key in known:
                continue
            if key in TrainingPlan.model_fields and "plan" in known and isinstance(arguments.get("plan") or {}, dict):
                # a plan field the schema leaves to the plan object, given flat: taken as if inside plan
                arguments["plan"] = {**(arguments.get("plan") or {}), key: arguments.pop(key)}
                continue
            close = difflib.get_close_matches(key, known + list(TrainingPlan.model_fields), n=1, cutoff=0.5)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ToolError(f"{name}: {safe_text(repr(key), 80)} is not an argument of {name}{hint} "
                            f"(arguments: {', '.join(known)}; other plan fields: {PLAN_SCHEMA_URI})")
        cache = self.answer_cache
        key = cache.key(name, arguments) if cache is not None else None
        if cache is not None and key is not None and (kept := cache.get(key)) is not None:
            return kept
        # the call's own data, handed to the tool function (_tool_function): the names it sent (the SDK fills every
        # default in), and, once it has run, how its model was read; its texts as sent (mcp_views.SentText)
        tool_call = ToolCall(sent=frozenset(arguments))
        try:
            result = await super().call_tool(name, {**keep_texts_as_sent(arguments), TOOL_CALL_ARGUMENT: tool_call},
                                             context)
        except UnexpectedToolError as exc:
            cause = exc.__cause__ or exc
            logger.error("%s crashed: %r", name, cause)
            raise ToolError(f"{name}: internal error: {type(cause).__name__}: {safe_text(cause, 300)} "
                            "(please report it)") from exc
        except ToolError as exc:
            inner = exc.__cause__
            if isinstance(inner, ValidationError):  # the arguments failed the input schema
                raise ToolError(safe_text(f"{name}: {describe_error(inner)}")) from inner
            if isinstance(inner, ToolError):  # our own message, without the SDK's prefix
                raise ToolError(safe_text(inner)) from inner
            raise
        if cache is not None and key is not None and isinstance(result, CallToolResult) and not result.is_error:
            cache.put(key, result, tool_call.models)
        return result


def _catalog_gpus_json() -> str:
    from canifinetune.estimator.catalog import load_gpus

    rows = [
        {"name": g.name, "aliases": list(g.aliases), "vendor": g.vendor, "category": g.category,
         "memory_gb": g.memory_gb, "usable_bytes": g.total_memory_bytes, "bf16": g.bf16,
         "tflops_bf16_dense": g.tflops_bf16_dense, "tflops_fp16_dense": g.tflops_fp16_dense,
         "memory_bandwidth_gbs": g.memory_bandwidth_gbs, "runtime_devices": g.runtime_devices, "notes": g.notes}
        for g in load_gpus()
    ]
    return json.dumps({"gpus": rows}, indent=1)


def _catalog_models_json() -> str:
    from canifinetune.estimator.catalog import load_models
    from canifinetune.estimator.spec import ModelSpec

    rows = []
    for m in load_models():
        spec = ModelSpec.from_config(m.config_dict())
        rows.append({"id": m.id, "aliases": list(m.aliases), "family": m.model_type, "params": spec.total_params,
                     "params_published": m.params_published, "gated": m.gated, "moe": m.is_moe,
                     "max_position_embeddings": spec.max_position_embeddings, "notes": m.notes})
    return json.dumps({"models": rows}, indent=1)


def _model_spec_json(model_id: str, offline: bool = False) -> str:
    from canifinetune.estimator.catalog import find_model, suggest_models
    from canifinetune.estimator.spec import ModelSpec

    entry = find_model(model_id, forgiving=False)  # a partial name is never taken for a model
    if entry is None:
        try:  # a Hub id or a local folder, through the same resolver as the tools
            rm = _resolve(model_id, offline)
        except CanIFinetuneError as exc:
            close = suggest_models(model_id, limit=5)
            hint = ("; did you mean " + ", ".join(f"'{c}'" for c in close) + "?") if close else ""
            raise ResourceNotFoundError(f"model '{model_id}' is not in the catalog{hint} "
                                        f"(canifinetune://catalog/models lists it): {exc}") from None
        data = {k: _jsonable(getattr(rm.spec, k)) for k in rm.spec.__dataclass_fields__}
        data.update(id=rm.id, params_total=rm.spec.total_params, params_exact=rm.params_exact,
                    embedding_params=rm.spec.embedding_params, lm_head_params=rm.spec.lm_head_params,
                    linear_modules=list(rm.spec.linear_names()), config=rm.config, config_source=rm.source)
        return json.dumps(data, indent=1)
    config = entry.config_dict()
    spec = ModelSpec.from_config(config)
    data = {k: _jsonable(getattr(spec, k)) for k in spec.__dataclass_fields__}
    data.update(
        id=entry.id, params_total=spec.total_params, params_published=entry.params_published,
        embedding_params=spec.embedding_params, lm_head_params=spec.lm_head_params,
        linear_modules=list(spec.linear_names()), gated=entry.gated, config=config,
        config_source=entry.config_source,
    )
    return json.dumps(data, indent=1)


def memory_model_document() -> str:
    """docs/memory_model.md, its only copy: beside server/ in the checkout (an editable install reads it there), and
    in the wheel as canifinetune/docs/memory_model.md beside canifinetune/server/ (pyproject.toml maps docs/ as the
    data package canifinetune.docs at build time)."""
    return (Path(__file__).resolve().parent.parent / "docs" / "memory_model.md").read_text(encoding="utf-8")


FIT_PROMPT = """\
Help me fine-tune {model} on {gpu}.{goal}

Work through it with the canifinetune tools:
1. Call estimate_memory with model='{model}' and gpu='{gpu}' (if that GPU name is not in the catalog,
   the error lists the closest names; or use gpu_vram_gb). Start from the defaults (LoRA, seq_len 1024,
   batch_size 8) unless I said otherwise, and set seq_len to the length my data needs.
2. Read the verdict first. Explain the two or three largest components of the breakdown in one line each.
3. If the verdict is does_not_fit or tight, call suggest_cheaper_config with the same arguments and
   apply the first suggestion's changes; call estimate_memory once more to confirm it fits. If it says
   nothing fits on this GPU, tell me the smallest GPU or number of GPUs it names.
4. When it fits, call make_recipe with the final arguments and show me how to run a short probe first.
Report warnings (for example a seq_len beyond the model's context) instead of hiding them."""


def _complete_values(kind: str, prefix: str) -> Completion:
    from canifinetune.estimator.catalog import load_gpus, load_models, normalize_name, search_gpus, search_models

    prefix = (prefix or "").strip()
    if kind == "model":
        names = [m.id for m in load_models()]
        low = prefix.lower()
        hits = [n for n in names if n.lower().startswith(low) or n.split("/")[-1].lower().startswith(low)]
        hits += [m.id for m in search_models(prefix) if m.id not in hits] if normalize_name(prefix) else []
    else:
        names = [g.name for g in load_gpus()]
        hits = [n for n in names if n.lower().startswith(prefix.lower())]
        hits += [g.name for g in search_gpus(prefix) if g.name not in hits] if normalize_name(prefix) else []
    if not prefix:
        hits = names
    return Completion(values=hits[:100], total=len(hits), has_more=len(hits) > 100)


def build_server(offline: bool | None = None) -> CanIFinetuneServer:
    """The MCP server with its tools, resources, prompt and completions.

    ``offline`` (default: HF_HUB_OFFLINE) keeps the tools off the Hugging Face Hub; only then are
    they annotated closed-world. The setting is this server's own: its tools and resources take it as a value.
    """
    from .hub import env_offline

    hub_offline = bool(offline) or env_offline()
    annotations = _annotations(hub_offline)
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("canifinetune")
    except PackageNotFoundError:  # pragma: no cover
        ver = "0"
    # MCP App: hosts that support Apps draw the budget bar (server/app.py) beside these two tools' results.
    from mcp.server.apps import Apps

    from .app import BUDGET_APP_URI, budget_app_html

    apps = Apps()
    apps.add_html_resource(BUDGET_APP_URI, budget_app_html(), name="budget-picture", title="GPU memory budget",
                           description="The budget as a stacked bar against the GPU, and suggestions side by side.")
    apps.tool(resource_uri=BUDGET_APP_URI, title="Estimate fine-tuning GPU memory", annotations=annotations)(
        _tool_function("estimate_memory", functools.partial(estimate_memory_impl, offline=hub_offline),
                       tool_parameters(MEMORY_FIELDS), EstimateView, ESTIMATE_DOC, hub_offline))
    apps.tool(resource_uri=BUDGET_APP_URI, title="Suggest a configuration that fits", annotations=annotations)(
        _tool_function("suggest_cheaper_config", functools.partial(suggest_impl, offline=hub_offline),
                       tool_parameters(MEMORY_FIELDS, keep=True), SuggestView, SUGGEST_DOC, hub_offline))
    mcp = CanIFinetuneServer(SERVER_NAME, title="canifinetune: will this fine-tune fit my GPU?",
                             instructions=INSTRUCTIONS, version=ver, log_level="WARNING", extensions=[apps])
    mcp.answer_cache = AnswerCache(ANSWER_CACHE_ENTRIES, ANSWER_CACHE_BYTES)

    mcp.add_tool(_tool_function("make_recipe", functools.partial(recipe_impl, offline=hub_offline),
                                tool_parameters(MEMORY_FIELDS + RECIPE_FIELDS), RecipeView, RECIPE_DOC, hub_offline),
                 title="Make a runnable fine-tuning recipe", annotations=annotations)
    for tool in mcp._tool_manager.list_tools():  # what tools/list sends: small (server/mcp_views.py)
        compact_schema(tool.parameters, arguments=True)
        if tool.fn_metadata.output_schema is not None:
            compact_schema(tool.fn_metadata.output_schema, arguments=False)

    _add_resources(mcp, hub_offline)
    _add_prompt_and_completions(mcp)
    return mcp


def _add_resources(mcp: CanIFinetuneServer, hub_offline: bool) -> None:
    """The catalogs, a model's spec, the memory model, the plan's schema and the files of a recipe."""

    @mcp.resource("canifinetune://catalog/gpus", name="gpu-catalog", title="GPU catalog", mime_type="application/json",
                  description="Every catalog GPU: name, aliases, memory as sold and usable bytes, bf16 support, "
                              "throughput.")
    def gpu_catalog() -> str:
        return _catalog_gpus_json()

    @mcp.resource("canifinetune://catalog/models", name="model-catalog", title="Model catalog",
                  mime_type="application/json",
                  description="Every catalog model: Hub id, aliases, family, parameters, gated, context length.")
    def model_catalog() -> str:
        return _catalog_models_json()

    @mcp.resource("canifinetune://spec/{+model_id}", name="model-spec", title="A model's resolved spec",
                  mime_type="application/json",
                  description="The architecture canifinetune resolved from a catalog model's config.json "
                              "(e.g. canifinetune://spec/Qwen/Qwen2.5-7B-Instruct): shapes, parameter counts, linear "
                              "modules.")
    def model_spec(model_id: str) -> str:
        try:
            return _model_spec_json(model_id, hub_offline)
        except ResourceError:
            raise
        except CanIFinetuneError as exc:
            raise ResourceError(str(exc)) from exc

    @mcp.resource("canifinetune://docs/memory-model", name="memory-model", title="The memory model",
                  mime_type="text/markdown",
                  description="How every component of the estimate is computed, with its formula and sources.")
    def memory_model() -> str:
        return memory_model_document()

    @mcp.resource(PLAN_SCHEMA_URI, name="plan-schema", title="The training plan's fields",
                  mime_type="application/schema+json",
                  description="Every plan field (what the tools' plan argument takes): type, default, description.")
    def plan_schema() -> str:
        from .mcp_views import plan_schema_json

        return plan_schema_json()

    @mcp.resource(RECIPE_URI_PREFIX + "{key}/{name}", name="recipe-file", title="A file of a recipe",
                  mime_type="text/plain",
                  description="One file of a recipe make_recipe made (its links name them); made again from the plan.")
    def recipe_resource(key: str, name: str) -> str:
        try:
            return recipe_file(key, name, offline=hub_offline)
        except ResourceError:
            raise
        except CanIFinetuneError as exc:
            raise ResourceNotFoundError(safe_text(exc)) from exc


def _add_prompt_and_completions(mcp: CanIFinetuneServer) -> None:
    @mcp.prompt(name="fit_finetune", title="Fit a fine-tune on a GPU",
                description="Walks the assistant through estimate -> suggest -> recipe for one model and GPU.")
    def fit_finetune(
        model: Annotated[str, Field(description="the model: a Hugging Face id or catalog name, e.g. "
                                                "'Qwen/Qwen2.5-7B-Instruct'")],
        gpu: Annotated[str, Field(description="the GPU as the user names it, e.g. 'RTX 4090' or 'A100 80GB'")],
        goal: Annotated[str, Field(
            description="optional: what the fine-tune is for, the data, the sample length")] = "",
    ) -> str:
        return FIT_PROMPT.format(model=model, gpu=gpu, goal=f" Goal: {goal}" if goal else "")

    @mcp.completion()
    async def complete(ref, argument, context):
        if argument.name in ("model", "model_id"):
            return _complete_values("model", argument.value)
        if argument.name == "gpu":
            return _complete_values("gpu", argument.value)
        return None


# --------------------------------------------------------------------------------------------- transports


def transport_security(host: str, port: int, allowed_hosts: Sequence[str] = (), any_host: bool = False):
    """The Host/Origin check (DNS-rebinding protection): a request whose Host is not allowed gets 421, one whose
    Origin is not gets 403.

    Allowed: this machine's names (``127.0.0.1``, ``localhost``, ``[::1]``) and a specific bind address, with the port;
    each of ``allowed_hosts`` (names an operator gives, ``--allowed-host``) with any port or none, and its
    ``http(s)://`` origins. ``any_host``: a token-guarded network bind, where every request needs the bearer token,
    which a DNS-rebinding page cannot supply: any Host name the client used is accepted, unless ``allowed_hosts``
    restricts them."""
    from mcp.server.transport_security import TransportSecuritySettings

    if any_host and not allowed_hosts:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    hosts = list(LOCAL_HOSTS)
    if host not in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::"):
        hosts.append(f"[{host}]" if ":" in host else host)
    names = [f"{h}:{port}" for h in hosts] + list(hosts)
    origins = [f"http://{h}:{port}" for h in hosts]
    for name in allowed_hosts:
        names += [name, f"{name}:*"]
        origins += [f"{scheme}://{name}{port_part}" for scheme in ("http", "https") for port_part in ("", ":*")]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=names, allowed_origins=origins)


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*\.?")


def allowed_host_name(value: str) -> str:
    """An ``--allowed-host`` value as the Host check compares it: a DNS name or an IPv4 address as given, an IPv6
    address in brackets; a CanIFinetuneError for anything else (a scheme, a path, a port, a wildcard)."""
    import ipaddress

    name = value.strip()
    try:
        return f"[{ipaddress.IPv6Address(name.strip('[]'))}]"
    except ValueError:
        pass
    if not _HOST_NAME.fullmatch(name):
        raise CanIFinetuneError(f"--allowed-host: {safe_text(repr(value), 80)} is not a host name or address; give the "
                                "name clients use to reach the server, without scheme, port or path (e.g. gpu-box.lan, "
                                "192.168.1.20)")
    return name.lower()


def uvicorn_log_config() -> dict:
    """uvicorn's logging, every handler on stderr (its default sends access logs to stdout)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain", "stream": "ext://sys.stderr"}},
        "loggers": {
            "uvicorn": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
            "uvicorn.error": {"level": "INFO"},
            "uvicorn.access": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
        },
    }


# The garbage collector of a long-running server (CPython 3.11's defaults are 700, 10, 10). A call allocates tens of
# thousands of short-lived objects (plans, records, pydantic models), so the default threshold ran a young collection
# every few calls, each walking the term caches' fresh entries: 16.6% of the tools' CPU on bench_http_load.py's mixed
# calls in one process. With the objects that live as long as the process (modules, catalogs) frozen out of every
# collection and a young collection every 50,000 allocations, 5.9% (benchmarks/bench_tool_cpu.py prints both).
GC_YOUNG_THRESHOLD = 50_000
GC_OLDER_THRESHOLDS = (10, 10)  # CPython's own: an older generation every 10 collections of the one below


def tune_gc_for_serving() -> None:
    """Freeze what exists now (it lives as long as the server) and collect the young generation less often; cycles are
    still collected, later."""
    import gc

    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *GC_OLDER_THRESHOLDS)


def run_stdio(offline: bool | None = None) -> None:
    server = build_server(offline)
    tune_gc_for_serving()
    server.run()


# HTTP limits (docs/security.md): a client has this long to send a request's headers, headers are at most this
# big, and at most this many connections are open at once (more are closed at once). Admission matches the
# connection cap: HTTP/1.1 runs one request at a time per connection, so every open connection may have its request
# in flight, and none is refused with 503 (an MCP SDK client holds two connections, a POST one and its GET stream,
# and does not retry a 503). The tools' work runs on anyio's worker threads (40): further calls wait for one.
# 30 s (nginx waits 60 s for a request head, 75 s on an idle keep-alive connection): at 10 s and 5 s a burst of 500
# SDK clients on a busy 2-core machine lost the clients it had slowed down, their connections closed just as they were
# about to send or read (docs/security.md)
HEADER_TIMEOUT_S = 30.0
KEEP_ALIVE_TIMEOUT_S = 30
MAX_HEADER_BYTES = 64 * 1024
MAX_CONNECTIONS = 2048
MAX_CONCURRENT_REQUESTS = MAX_CONNECTIONS
FD_RESERVE = 256  # open files beside the connections: the listening socket, logs, config files, the Hub
AUTH_TOKEN_ENV = "CANIFINETUNE_AUTH_TOKEN"
MIN_AUTH_TOKEN_CHARS = 16


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server on this machine."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bearer_credentials(value: bytes) -> bytes | None:
    """The credentials of an ``Authorization: Bearer <token>`` header value; None for another scheme. The scheme is
    case-insensitive (RFC 7235 section 2.1: ``bearer``, ``BEARER``), one or more spaces after it."""
    scheme, _, rest = value.partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    return rest.lstrip(b" ")


def bearer_auth(app, token: str):
    """ASGI middleware: every HTTP request needs ``Authorization: Bearer <token>``; 401 otherwise."""
    import hmac

    expected = token.encode()

    async def guarded(scope, receive, send):
        if scope.get("type") != "http":
            return await app(scope, receive, send)
        given = None
        for name, value in scope.get("headers") or ():
            if name.lower() == b"authorization":
                given = bearer_credentials(value)
                break
        if given and hmac.compare_digest(given, expected):
            return await app(scope, receive, send)
        body = b'{"error": "unauthorized: send Authorization: Bearer <token> (canifinetune serve --auth-token)"}'
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})

    return guarded


def limited_h11_protocol(header_timeout: float = HEADER_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS):
    """uvicorn's h11 protocol with a header-read timeout and a cap on open connections.

    uvicorn times out idle keep-alive connections but not a request whose headers never finish; this closes a
    connection whose client has not sent a complete request head within ``header_timeout`` seconds (of connecting,
    or of the previous response), and closes at once a connection beyond ``max_connections``."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class LimitedH11Protocol(H11Protocol):
        _header_timer = None

        def connection_made(self, transport):
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.close()
                return
            self._arm_header_timer()

        def _arm_header_timer(self):
            self._cancel_header_timer()
            self._header_timer = self.loop.call_later(header_timeout, self._header_timeout)

        def _cancel_header_timer(self):
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self):
            self._header_timer = None
            idle = self.conn.their_state in (h11.IDLE, h11.MUST_CLOSE, h11.CLOSED) and not self.transport.is_closing()
            if idle and (self.cycle is None or self.cycle.response_complete):
                self.transport.close()

        def on_response_complete(self):
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_header_timer()

        def connection_lost(self, exc):
            self._cancel_header_timer()
            super().connection_lost(exc)

    return LimitedH11Protocol


def http_app(host: str, port: int, offline: bool | None = None, auth_token: str | None = None,
             allowed_hosts: Sequence[str] = ()):
    """The streamable-HTTP ASGI app: the Host/Origin check, body limit and, with a token, bearer auth. Bound beyond
    this machine with a token, any Host name is served (the token is the guard) unless ``allowed_hosts`` names them."""
    mcp = build_server(offline)
    security = transport_security(host, port, allowed_hosts, any_host=bool(auth_token) and not is_loopback(host))
    app = mcp.streamable_http_app(transport_security=security, host=host, max_request_body_size=MAX_REQUEST_BODY_BYTES)
    return bearer_auth(app, auth_token) if auth_token else app


def connection_cap(wanted: int = MAX_CONNECTIONS) -> int:
    """The connection cap this process can hold: the soft open-file limit is raised to fit ``wanted`` connections
    plus FD_RESERVE when the hard limit allows; otherwise the cap that fits, said on stderr."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return wanted
    need = wanted + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= need:
        return wanted
    cap = max(16, soft - FD_RESERVE)
    print(f"canifinetune: warning: the open-file limit ({soft}) allows {cap} HTTP connections, not {wanted} "
          f"(raise it with `ulimit -n {need}`)", file=sys.stderr)
    return cap


def uvicorn_config(app, host: str, port: int):
    """uvicorn's configuration with the HTTP limits above, and no access log (one stderr line per request)."""
    import uvicorn

    connections = connection_cap()
    # log_level is left unset: it would set uvicorn.access back to INFO (uvicorn_log_config keeps the levels);
    # limit_concurrency is left unset: uvicorn counts open connections against it and answers 503, while
    # LimitedH11Protocol already caps the connections, so each may have its request in flight
    return uvicorn.Config(app, host=host, port=port, log_config=uvicorn_log_config(), access_log=False,
                          http=limited_h11_protocol(max_connections=connections),
                          timeout_keep_alive=KEEP_ALIVE_TIMEOUT_S, h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                          limit_concurrency=None, backlog=connections)


def check_http_exposure(host: str, auth_token: str | None) -> str | None:
    """The error for a non-loopback bind without a token (or with a short one); None when serving may go ahead."""
    if auth_token is not None and len(auth_token) < MIN_AUTH_TOKEN_CHARS:
        return (f"--auth-token: use at least {MIN_AUTH_TOKEN_CHARS} characters "
                "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe())'`)")
    if not is_loopback(host) and not auth_token:
        return (f"--host {host}: serving beyond this machine needs a token: pass --auth-token TOKEN or set "
                f"{AUTH_TOKEN_ENV}; clients then send 'Authorization: Bearer TOKEN'")
    return None


def run_http(host: str = DEFAULT_HTTP_HOST, port: int = DEFAULT_HTTP_PORT, offline: bool | None = None,
             auth_token: str | None = None, allowed_hosts: Sequence[str] = ()) -> None:
    import anyio
    import uvicorn

    problem = check_http_exposure(host, auth_token)
    if problem is not None:
        raise CanIFinetuneError(problem)
    allowed_hosts = [allowed_host_name(h) for h in allowed_hosts]
    if not is_loopback(host):
        print(f"canifinetune: warning: --host {host} makes the server reachable from the network; every request "
              "needs the bearer token"
              + (f" and a Host among {', '.join(allowed_hosts)} (or this machine's)" if allowed_hosts
                 else ", whatever Host name it uses (--allowed-host NAME restricts them)")
              + ("" if offline else ", and the tools may read configs from the Hub (add --offline)"),
              file=sys.stderr)
    app = http_app(host, port, offline, auth_token, allowed_hosts)
    config = uvicorn_config(app, host, port)
    tune_gc_for_serving()
    print(f"canifinetune MCP server on http://{host if ':' not in host else f'[{host}]'}:{port}/mcp", file=sys.stderr)
    anyio.run(uvicorn.Server(config).serve)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="canifinetune-mcp", description="canifinetune's MCP server")
    parser.add_argument("--http", action="store_true", help="streamable HTTP instead of stdio")
    parser.add_argument("--host", default=DEFAULT_HTTP_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_HTTP_PORT)
    parser.add_argument("--offline", action="store_true", help="never reach the Hugging Face Hub")
    parser.add_argument("--auth-token", default=None,
                        help=f"require 'Authorization: Bearer TOKEN' (or set {AUTH_TOKEN_ENV})")
    parser.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                        help="accept only these Host names (and this machine's); repeatable")
    args = parser.parse_args(argv)
    if args.http:
        import os

        run_http(args.host, args.port, offline=args.offline,
                 auth_token=args.auth_token or os.environ.get(AUTH_TOKEN_ENV), allowed_hosts=args.allowed_host)
    else:
        run_stdio(offline=args.offline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
