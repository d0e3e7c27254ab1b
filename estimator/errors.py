"""The one error hierarchy of canifinetune: every error class the three packages raise is declared here.

Each message names the field, the bad value and what to do instead. The packages re-export the classes where
they are raised (``canifinetune.recipes.schema.RecipeError`` is this module's ``RecipeError``), so callers may
import them from either place; imports still point one way (server -> recipes -> estimator).

::

    ValueError
    └── CanIFinetuneError                an input canifinetune cannot estimate, train or parse (.field names it)
        ├── ModelConfigError             config.json lacks what a decoder needs, or holds impossible values
        │   └── SafetensorsHeaderError   a safetensors header that cannot be real (model_sources.py)
        ├── UnknownModelError            neither in the catalog, nor a local folder, nor on the Hub
        │   └── HubError                 the Hub or its cache could not give the model (server/hub.py)
        │       ├── GatedModelError      gated or private, and no token with access
        │       ├── HubUnreachableError  no network, a timeout, a server error
        │       └── OfflineNotCachedError  offline, and not in the local cache
        ├── UnknownGPUError              a GPU name not in the catalog
        ├── PlanError                    valid field by field, but not on this model or GPU
        ├── ConfigError                  a training config file that cannot be read (estimator/configs)
        ├── RecipeError                  a recipe (or a run of one) that cannot go ahead (recipes/)
        │   ├── DatasetError             a dataset the runtime cannot train on as the recipe says
        │   │   └── SampleTooLongError   a sample longer than seq_len, truncation off
        │   └── ProbeError               the probe cannot measure here (no CUDA, too little free memory)
        └── UsageError                   a bad command line: one line on stderr, exit 2 (server/cli.py)

pydantic's ``ValidationError`` stays pydantic's: :func:`describe_validation_error` turns it into one line per
problem from its structured form (``loc``, ``type``, ``ctx``, ``input``), never from its message text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class CanIFinetuneError(ValueError):
    """Base class: an input canifinetune cannot estimate, with a message a person or a model can act on."""

    field: str | None = None
    reason: str | None = None  # the message without the field, when it was built by :meth:`about`

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        if field is not None:
            self.field = field

    @classmethod
    def about(cls, field: str, reason: str):
        """An error about ``field``: its message is 'field: reason', and both parts stay readable apart (a check
        across fields raises it inside a pydantic validator; :func:`raised_field` reads it back)."""
        error = cls(f"{field}: {reason}", field=field)
        error.reason = reason
        return error


class ModelConfigError(CanIFinetuneError):
    """A config.json without the fields a decoder needs, or with impossible values."""

    field = "model"


class SafetensorsHeaderError(ModelConfigError):
    """A safetensors header that cannot be a real checkpoint's (it is read, never trusted)."""


class UnknownModelError(CanIFinetuneError):
    """A model name that is neither in the catalog, nor a local folder, nor reachable on the Hub."""

    field = "model"


class HubError(UnknownModelError):
    """The model could not be read from the Hub or its cache (the message says why and what to do)."""


class GatedModelError(HubError):
    """A gated (or private) repo and no token with access."""


class HubUnreachableError(HubError):
    """The Hub did not answer (no network, a timeout, a server error)."""


class OfflineNotCachedError(HubError):
    """Offline, and the model is neither in the catalog nor in the local cache."""


class UnknownGPUError(CanIFinetuneError):
    """A GPU name that is not in the catalog."""

    field = "gpu"


class PlanError(CanIFinetuneError):
    """A plan that is valid field by field but cannot run on this model or GPU."""


class ConfigError(CanIFinetuneError):
    """A config file that cannot be read or estimated: the message names the file and the line."""

    field = "config"


class RecipeError(CanIFinetuneError):
    """A recipe (or a run of one) that cannot go ahead, with what to change."""


class DatasetError(RecipeError):
    """A dataset the runtime cannot train on as the recipe says."""

    field = "dataset"


class SampleTooLongError(DatasetError):
    """A sample longer than seq_len while the recipe does not allow truncation."""


class ProbeError(RecipeError):
    """The probe cannot measure here (no CUDA, not enough free memory)."""


class UsageError(CanIFinetuneError):
    """A bad command line: printed as one line, exit 2."""


def raised_field(err: Mapping[str, Any]) -> tuple[str, str] | None:
    """(field, reason) of a pydantic error raised as ``CanIFinetuneError.about(field, reason)`` inside a validator
    (a check across fields: pydantic's ``loc`` is then empty), read from the error's ``ctx``; None otherwise."""
    raised = (err.get("ctx") or {}).get("error")
    if isinstance(raised, CanIFinetuneError) and raised.field and raised.reason is not None:
        return raised.field, raised.reason
    return None


def describe_validation_error(exc) -> str:
    """One readable line per problem of a pydantic ValidationError: 'field: what is wrong; got value'.

    Read from each error's structured form: ``loc`` names the field (or, for a check across fields, the error
    raised names it: :func:`raised_field`), ``type`` the kind of problem, ``ctx['error']`` the validator's own
    message and ``input`` the value; pydantic's message text is used only for its built-in checks."""
    lines = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(part) for part in err.get("loc", ()) if not isinstance(part, int)) or "plan"
        kind = err.get("type")
        named = raised_field(err)
        raised = (err.get("ctx") or {}).get("error")
        if named is not None and loc == "plan":
            (loc, msg), kind = named, "cross_field"
        elif kind == "value_error" and raised is not None:
            msg = str(raised)  # the validator's own message, without pydantic's 'Value error, '
        else:
            msg = str(err.get("msg", "invalid value"))
        got = err.get("input")
        if (isinstance(got, float) and got != got) or got in (float("inf"), float("-inf")):
            msg = "must be a finite number"
        if kind == "extra_forbidden":
            msg = "is not a known field"
        text = f"{loc}: {msg}"
        if kind not in ("extra_forbidden", "missing", "cross_field") and loc != "plan" and not isinstance(got, dict):
            shown = repr(got)
            text += f"; got {shown[:80] + '...' if len(shown) > 80 else shown}"
        lines.append(text)
    return "; ".join(lines)


# Every error message a person or a model reads is at most this long, on one line, with control and invisible
# characters escaped: a hostile value (a 3 MB model_type, a terminal escape) cannot flood or repaint a terminal.
MAX_ERROR_CHARS = 1000
_INVISIBLE = frozenset("\u200b\u200c\u200d\u2060\ufeff\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
                       "\u2066\u2067\u2068\u2069\u2028\u2029")


def safe_text(text: object, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` as one printable line of at most ``limit`` characters: control, line-separator and invisible
    characters become escapes (``\\n``, ``\\x1b``, ``\\u200b``), and a longer text is cut with '...'."""
    import unicodedata

    text = str(text)
    if len(text) > 4 * limit:  # never escape megabytes only to cut them
        text = text[: 4 * limit]
    out = []
    size = 0
    for char in text:
        if char in _INVISIBLE or unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Cs"):
            piece = char.encode("unicode_escape").decode("ascii")
        else:
            piece = char
        out.append(piece)
        size += len(piece)
        if size > limit:
            break
    line = "".join(out)
    if len(line) > limit:
        line = line[: limit - 3] + "..."
    return line
