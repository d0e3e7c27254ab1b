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
# Multimodal wrappers the estimate does not read (transformers 5.24 CONFIG_MAPPING keys): refused by their model_type
# even where a config.json names no encoder section (estimator/spec.py), since their language model alone would be
# too low an estimate
MULTIMODAL_MODEL_TYPES_NOT_READ = (
    "paligemma", "llava_onevision", "llava_next_video", "mistral3", "pixtral", "internvl", "aya_vision", "idefics",
    "idefics2", "chameleon", "emu3", "janus", "kosmos-2", "blip-2", "instructblip", "fuyu", "florence2", "got_ocr2",
    "deepseek_vl", "deepseek_vl_hybrid", "perception_lm", "lfm2_vl", "ovis2", "cohere2_vision", "glm4v", "glm4v_moe",
    "llama4", "gemma3n", "phi4_multimodal", "qwen2_audio", "qwen2_5_omni", "qwen3_omni_moe", "shieldgemma2")


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
