"""Every estimate of the validation cohorts and the test tables, byte for byte, to prove a refactoring changed none.

    python benchmarks/estimate_snapshot.py --write   # record tests/data/estimate_snapshot.json
                                                     # (after a deliberate change)
    python benchmarks/estimate_snapshot.py           # compare: prints the plans whose estimate changed, exit 1 if any

Each plan's record holds, per GPU size, the sha256 of the whole estimate as JSON (every component's bytes, phases,
verdict, explanations, warnings: the byte-for-byte check) beside its figures (peak, verdict and each component's bytes:
what a reviewer reads in the diff), or the error the plan raises. tests/test_estimate_snapshot.py runs the comparison
on every test run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = ROOT / "tests" / "data" / "estimate_snapshot.json"
GPU_SIZES_GIB = (16, 80)  # each plan is also judged on two GPU sizes: the verdict logic is in the snapshot too


# The grid: each model x method, then one change at a time over every method, stack, trainer, sharding, offload,
# quantization and knob the plan has. Written out rather than sampled so that the list never moves.
GRID_MODELS = ("meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-0.5B", "google/gemma-2-9b-it", "google/gemma-3-1b-it",
               "microsoft/Phi-3-mini-4k-instruct", "mistralai/Mixtral-8x7B-v0.1", "Qwen/Qwen3-30B-A3B")
# PEFT 0.21 has no default target modules for these; its ParamWrapper on fused experts refuses lora_dropout
NO_PEFT_DEFAULT_TARGETS = ("microsoft/Phi-3-mini-4k-instruct", "Qwen/Qwen3-30B-A3B")
FUSED_EXPERTS = ("mistralai/Mixtral-8x7B-v0.1", "Qwen/Qwen3-30B-A3B")
GRID_CHANGES: dict[str, dict] = {
    "base": {},
    "no-ckpt": {"gradient_checkpointing": False},
    "standard-loss": {"loss_implementation": "standard", "gradient_checkpointing": False},
    "eager": {"attn_implementation": "eager", "gradient_checkpointing": False, "seq_len": 2048},
    "flash": {"attn_implementation": "flash_attention_2"},
    "long": {"seq_len": 16384},
    "batch4-accum8": {"batch_size": 4, "gradient_accumulation_steps": 8},
    **{f"optim-{o}": {"optim": o} for o in ("adamw_torch", "adamw_bnb_8bit", "paged_adamw_8bit", "paged_adamw_32bit",
                                          "adafactor", "sgd")},
    "fp16": {"dtype": "fp16"},
    "fp32": {"dtype": "fp32"},
    "mixed": {"precision": "mixed"},
    **{f"framework-{f}": {"framework": f} for f in ("transformers", "axolotl", "llama_factory", "unsloth", "litgpt")},
    "dpo": {"trainer": "dpo"},
    "dpo-copy": {"trainer": "dpo", "reference_model": "copy"},
    "dpo-precompute": {"trainer": "dpo", "precompute_ref_log_probs": True},
    "orpo": {"trainer": "orpo"},
    "kto": {"trainer": "kto"},
    "reward": {"trainer": "reward"},
    "grpo": {"trainer": "grpo", "num_generations": 8, "max_completion_length": 512},
    "grpo-vllm": {"trainer": "grpo", "use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3},
    **{f"shard-{s}": {"num_gpus": 4, "sharding": s} for s in ("ddp", "zero1", "zero2", "zero3", "fsdp_full_shard",
                                                           "fsdp_shard_grad_op")},
    "zero3-offload": {"num_gpus": 4, "sharding": "zero3", "offload_optimizer": True, "offload_params": True},
    "zero2-offload": {"num_gpus": 2, "sharding": "zero2", "offload_optimizer": True},
    "hybrid-2x8": {"num_nodes": 2, "gpus_per_node": 8, "num_gpus": 16, "sharding": "fsdp_hybrid_shard"},
    "hpz-2x8": {"num_nodes": 2, "gpus_per_node": 8, "num_gpus": 16, "sharding": "zero3_hpz"},
    "activation-offloading": {"activation_offloading": True},
    "packing": {"packing": True, "padding_free": True},
    "liger": {"use_liger_kernel": True},
    "r64-all-linear": {"lora_r": 64, "target_modules": "all-linear"},
    "qkvo": {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
    "dora": {"use_dora": True},
    "modules-to-save": {"modules_to_save": ["lm_head", "embed_tokens"]},
    "adapter-fp32": {"adapter_dtype": "fp32", "lora_dropout": 0.0},
    "adapter-bf16": {"adapter_dtype": "bf16", "lora_dropout": 0.0},
    "8bit-base": {"load_in_8bit": True},
    "fp4-double": {"bnb_4bit_quant_type": "fp4", "bnb_4bit_use_double_quant": True},
    "kbit-prep": {"prepare_model_for_kbit_training": True},
}


def grid_plans() -> dict[str, dict]:
    """id -> plan: GRID_MODELS x methods x GRID_CHANGES (a change a method refuses is recorded as its error)."""
    plans: dict[str, dict] = {}
    for model in GRID_MODELS:
        for method in ("full", "lora", "qlora"):
            for name, change in GRID_CHANGES.items():
                base = {"model": model, "method": method, "seq_len": 2048}
                if method != "full" and model in NO_PEFT_DEFAULT_TARGETS:
                    base["target_modules"] = "all-linear"
                if method != "full" and model in FUSED_EXPERTS:
                    base["lora_dropout"] = 0.0
                plans[f"grid/{model}/{method}/{name}"] = base | change
    return plans


def plan_tables() -> dict[str, dict]:
    """id -> plan: every frozen cohort's cases, the accuracy table's and the grid's."""
    plans: dict[str, dict] = {}
    for path in sorted((ROOT / "benchmarks" / "validation").glob("cohort-v*.json")):
        cohort = json.loads(path.read_text(encoding="utf-8"))
        for case in cohort["cases"]:
            plans[f"{cohort['cohort']}/{case['id']}"] = case["plan"]
    accuracy = json.loads((ROOT / "tests" / "accuracy_cases.json").read_text(encoding="utf-8"))
    for i, case in enumerate(accuracy if isinstance(accuracy, list) else accuracy.get("cases", [])):
        plans[f"accuracy/{case.get('id', i)}"] = case.get("plan", case)
    return plans | grid_plans()


def record(plan: dict) -> list:
    from canifinetune.estimator.estimate import estimate
    from canifinetune.estimator.plan import TrainingPlan

    out = []
    for size in (None, *GPU_SIZES_GIB):
        try:
            p = TrainingPlan(**plan)
            if size is not None:
                p = p.replace(gpu=None, gpu_vram_gb=size)
            est = estimate(p)
            text = est.model_dump_json(exclude={"plan"})
            out.append({"sha256": hashlib.sha256(text.encode()).hexdigest()[:32], "peak": est.peak_allocated_bytes,
                        "verdict": est.verdict, "parts": {c.name: c.bytes for c in est.breakdown}})
        except Exception as exc:  # a refusal is part of the behaviour too
            out.append({"error": f"{type(exc).__name__}: {exc}"})
    return out


def snapshot() -> dict[str, list]:
    return {key: record(plan) for key, plan in plan_tables().items()}


def changed(old: dict, new: dict) -> list[str]:
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="record the snapshot instead of comparing")
    args = parser.parse_args(argv)
    new = snapshot()
    if args.write:
        SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
        SNAPSHOT.write_text(json.dumps(new, indent=0, sort_keys=True) + "\n", encoding="utf-8")
        print(f"{len(new)} plans -> {SNAPSHOT.relative_to(ROOT)}")
        return 0
    old = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    diff = changed(old, new)
    print(f"{len(new)} plans, {len(diff)} changed" + (": " + ", ".join(diff) if diff else ""))
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
