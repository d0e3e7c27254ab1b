"""Errors the core raises. Each message names the field, the bad value and what to do instead."""

from __future__ import annotations


class CanIFinetuneError(ValueError):
    """Base class: an input canifinetune cannot estimate, with a message a person or a model can act on."""

    field: str | None = None

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        if field is not None:
            self.field = field


class ModelConfigError(CanIFinetuneError):
    """A config.json without the fields a decoder needs, or with impossible values."""

    field = "model"


class UnknownModelError(CanIFinetuneError):
    """A model name that is neither in the catalog, nor a local folder, nor reachable on the Hub."""

    field = "model"


class UnknownGPUError(CanIFinetuneError):
    """A GPU name that is not in the catalog."""

    field = "gpu"


class PlanError(CanIFinetuneError):
    """A plan that is valid field by field but cannot run on this model or GPU."""
