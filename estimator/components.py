"""The budget's components: one typed table of every line a breakdown can hold.

Each component has a name (what the estimate, the CLI, the MCP answer and the App call it), a lifetime, a colour and
the section of docs/memory_model.md that explains it. The phases (estimator/phases.py, trainer_memory.py) emit
components by these names, the estimate reads their lifetime to label each line, and the faces read their colour
(server/palette.py) and anchor from here, so no second list can drift from this one.

Lifetimes:

* ``static``: alive for the whole step (weights, adapters, optimizer states, a frozen reference copy, ...);
* ``phase``: alive in part of the step; a breakdown shows the peak phase's (activations, gradients, temporaries);
* ``process``: what the process holds beyond torch's allocated bytes (allocator overhead, CUDA context, vLLM);
* ``margin``: the safety margin on top.

Colours: the Okabe-Ito palette (Okabe & Ito 2008, "Color Universal Design") completed with Paul Tol's muted scheme
and two of ColorBrewer's (Brewer, colorbrewer2.org: PRGn, PuOr), chosen to stay distinguishable with the common
colour-vision deficiencies (tests/test_palette.py simulates them).
Components that never appear in one breakdown share a colour: the phases' temporaries (a breakdown holds the peak
phase's alone), the reference copy and the reward model's head (a trainer has one or the other), and GRPO's
generation memory (the KV cache of model.generate, or vLLM's reservation when vLLM generates). The safety margin is
drawn hatched, so its colour is the hatching's.
"""

from __future__ import annotations

from enum import Enum

DOC = "docs/memory_model.md"

STATIC, PHASE, PROCESS, MARGIN = "static", "phase", "process", "margin"
LIFETIMES = (STATIC, PHASE, PROCESS, MARGIN)

_TEMPORARY = "#882255"  # Tol wine: the temporaries of whichever phase peaks
_REFERENCE = "#762A83"  # ColorBrewer PRGn purple: a second model's weights (DPO/KTO reference copy, reward head)
_TRAINERS = "trainers-beyond-sft-dpo-orpo-kto-grpo-reward-models-estimatortrainer_memorypy"  # the section's slug
_GENERATION = "#FDB863"  # ColorBrewer PuOr light orange: GRPO's generation memory (KV cache, or vLLM's)


class ComponentKind(Enum):
    """A breakdown line: ``ComponentKind.WEIGHTS.key == "weights"``; its lifetime, colour and doc anchor."""

    WEIGHTS = ("weights", STATIC, "#0072B2", "static-components-alive-the-whole-step")
    QUANTIZATION_CONSTANTS = ("quantization_constants", STATIC, "#56B4E9", "static-components-alive-the-whole-step")
    UNMODELLED_CHECKPOINT_WEIGHTS = ("unmodelled_checkpoint_weights", STATIC, "#332288",
                                     "where-the-estimate-does-not-apply")
    LORA_ADAPTERS = ("lora_adapters", STATIC, "#009E73", "static-components-alive-the-whole-step")
    REFERENCE_MODEL = ("reference_model", STATIC, _REFERENCE, _TRAINERS)
    REWARD_MODEL_EMBEDDING_AND_SCORE = ("reward_model_embedding_and_score", STATIC, _REFERENCE, _TRAINERS)
    OPTIMIZER_STATES = ("optimizer_states", STATIC, "#CC79A7", "static-components-alive-the-whole-step")
    CUDA_WORKSPACES = ("cuda_workspaces", STATIC, "#999933", "transients")
    SHARDING_GATHER_BUFFERS = ("sharding_gather_buffers", STATIC, "#117733", "several-gpus")
    GRADIENTS = ("gradients", PHASE, "#E69F00", "static-components-alive-the-whole-step")
    ACTIVATIONS = ("activations", PHASE, "#D55E00", "activations")
    LOGITS_AND_LOSS = ("logits_and_loss", PHASE, "#F0E442", "the-loss")
    FORWARD_TEMPORARIES = ("forward_temporaries", PHASE, _TEMPORARY, "transients")
    BACKWARD_TEMPORARIES = ("backward_temporaries", PHASE, _TEMPORARY, "transients")
    OPTIMIZER_TEMPORARIES = ("optimizer_temporaries", PHASE, _TEMPORARY, "transients")
    REFERENCE_FORWARD = ("reference_forward", PHASE, _TEMPORARY, _TRAINERS)
    GENERATION_TEMPORARIES = ("generation_temporaries", PHASE, _TEMPORARY, _TRAINERS)
    KV_CACHE = ("kv_cache", PHASE, _GENERATION, _TRAINERS)
    ALLOCATOR_OVERHEAD = ("allocator_overhead", PROCESS, "#BBBBBB", "beyond-allocated-bytes")
    CUDA_CONTEXT = ("cuda_context", PROCESS, "#6E6E6E", "beyond-allocated-bytes")
    VLLM_RESERVATION = ("vllm_reservation", PROCESS, _GENERATION, _TRAINERS)
    SAFETY_MARGIN = ("safety_margin", MARGIN, "#9AA3B2", "beyond-allocated-bytes")

    def __init__(self, key: str, lifetime: str, color: str, anchor: str) -> None:
        self.key = key
        self.lifetime = lifetime
        self.color = color
        self.anchor = anchor

    @property
    def doc(self) -> str:
        """Where the component is explained: docs/memory_model.md#<anchor>."""
        return f"{DOC}#{self.anchor}"

    @classmethod
    def named(cls, key: str) -> ComponentKind:
        """The component called ``key`` (KeyError for a name the table does not hold)."""
        return _BY_KEY[key]


_BY_KEY = {c.key: c for c in ComponentKind}
STATIC_NAMES: tuple[str, ...] = tuple(c.key for c in ComponentKind if c.lifetime == STATIC)
