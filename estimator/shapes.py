"""What the text and the vision specs share (estimator/spec.py, estimator/vision_spec.py): an ``nn.Linear``'s
shape, the bounds a real config never reaches, and the vision-language wrappers' model types."""

from __future__ import annotations

from dataclasses import dataclass

# Bounds a real config never reaches; beyond them the numbers stop meaning anything.
MAX_DIM = 1 << 20
MAX_LAYERS = 4096

# Vision-language wrappers (transformers 5.24 model types; estimator/vision_spec.py reads their towers): a language
# model under text_config (or beside it, in older Qwen-VL checkpoints) and a vision tower.
VISION_LANGUAGE_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "gemma3", "mllama", "llava",
                               "llava_next", "idefics3", "smolvlm")


@dataclass(frozen=True)
class LinearSpec:
    """One ``nn.Linear`` of a decoder block: its PEFT-visible name and its shape."""

    name: str
    in_features: int
    out_features: int
    bias: bool = False

    @property
    def weight_params(self) -> int:
        return self.in_features * self.out_features

    @property
    def params(self) -> int:
        return self.weight_params + (self.out_features if self.bias else 0)
