"""The validation harnesses (benchmarks/validation/*.py) imported by name, as run_cohort.py runs them: they import
their neighbours (fake_mode, sft_trainer_fake) as top-level modules, so each is loaded once under its own name."""

from __future__ import annotations

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HARNESS = os.path.join(ROOT, "benchmarks", "validation")


def load_harness(name: str):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(HARNESS, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# The tiny Llama the harness tests build: two blocks, a 512-token vocabulary (meta-llama's architecture at toy size)
TINY_LLAMA_CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}
