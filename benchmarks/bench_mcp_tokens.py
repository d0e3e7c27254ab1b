"""What an assistant pays to use the MCP server: the bytes it reads (a benchmark, not a timed test).

Over stdio, raw newline-delimited JSON-RPC (what the model's host receives), it prints:

* ``tools/list``: the whole answer, and each tool's input schema, output schema and description;
* one typical call of each tool: the bytes of its text content, of its structured content, of any
  other content (resource links, embedded resources), and an estimate of the text's tokens
  (characters / 4, the usual rule of thumb for English and JSON).

Goals (issue 15.4): tools/list <= 16 KB, input schemas <= 6 KB in all, a typical text <= 600 tokens
(about 2,400 characters). Issue 21 adds one call with the user's own config (``config``): an Axolotl 8-bit
LoRA file for Mistral-7B at sequence_len 8192, micro_batch_size 2, on an RTX 4090, whose suggest_cheaper_config
text stays within the same 600 tokens (the config's account is in the structured content, once).

    python benchmarks/bench_mcp_tokens.py [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_mcp import SERVER, Session

TYPICAL = {
    "estimate_memory": {"model": "Qwen/Qwen2.5-7B-Instruct", "gpu": "RTX 4090", "seq_len": 2048},
    "suggest_cheaper_config": {"model": "Qwen/Qwen2.5-7B-Instruct", "gpu": "RTX 4090", "seq_len": 2048},
    "make_recipe": {"model": "Qwen/Qwen2.5-1.5B-Instruct", "method": "qlora", "gpu": "RTX 4090",
                    "dataset": "train.jsonl"},
}
# Axolotl's examples/mistral/lora.yml, in its shape: 8-bit LoRA of Mistral-7B, 8192 tokens, micro-batch 2.
AXOLOTL_MISTRAL_LORA = """\
base_model: mistralai/Mistral-7B-v0.1
model_type: MistralForCausalLM
tokenizer_type: LlamaTokenizer

load_in_8bit: true
load_in_4bit: false
strict: false

datasets:
  - path: mhenrichsen/alpaca_2k_test
    type: alpaca
dataset_prepared_path: last_run_prepared
val_set_size: 0.1
output_dir: ./outputs/lora-out

adapter: lora
lora_model_dir:

sequence_len: 8192
sample_packing: true
pad_to_sequence_len: true

lora_r: 32
lora_alpha: 16
lora_dropout: 0.05
lora_target_linear: true
lora_fan_in_fan_out:

wandb_project:
wandb_entity:
wandb_watch:
wandb_name:
wandb_log_model:

gradient_accumulation_steps: 4
micro_batch_size: 2
num_epochs: 1
optimizer: adamw_bnb_8bit
lr_scheduler: cosine
learning_rate: 0.0002

train_on_inputs: false
group_by_length: false
bf16: auto
fp16:
tf32: false

gradient_checkpointing: true
early_stopping_patience:
resume_from_checkpoint:
local_rank:
logging_steps: 1
xformers_attention:
flash_attention: true

loss_watchdog_threshold: 5.0
loss_watchdog_patience: 3

warmup_steps: 10
evals_per_epoch: 4
eval_table_size:
eval_max_new_tokens: 128
saves_per_epoch: 1
debug:
deepspeed:
weight_decay: 0.0
fsdp:
fsdp_config:
special_tokens:
"""
# label -> (tool, arguments): calls with the user's own config (issue 21)
WITH_CONFIG = {
    "suggest_cheaper_config + config": ("suggest_cheaper_config", {"config": AXOLOTL_MISTRAL_LORA, "gpu": "RTX 4090"}),
}
TOOLS_LIST_GOAL = 16 * 1024
INPUT_SCHEMAS_GOAL = 6 * 1024
TEXT_TOKENS_GOAL = 600


def size(value) -> int:
    """Bytes of ``value`` as compact JSON (what travels on the wire)."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def _call(s: Session, name: str, arguments: dict) -> dict:
    result = s.request("tools/call", {"name": name, "arguments": arguments})
    texts = [c["text"] for c in result.get("content", []) if c.get("type") == "text"]
    others = [c for c in result.get("content", []) if c.get("type") != "text"]
    return dict(
        is_error=bool(result.get("isError")), text_bytes=sum(len(t.encode()) for t in texts),
        text_tokens=round(sum(len(t) for t in texts) / 4),
        structured_bytes=size(result["structuredContent"]) if result.get("structuredContent") else 0,
        other_content_bytes=size(others), other_content=[c.get("type") for c in others], result_bytes=size(result),
    )


def measure(server: list[str] | None = None, calls: dict | None = None, with_config: dict | None = None) -> dict:
    """What tools/list and one typical call of each tool cost (``tools``), and the calls with a config
    (``with_config``: label -> the same figures, with ``tool``)."""
    s = Session(server or SERVER)
    try:
        s.initialize()
        listed = s.request("tools/list")
        out: dict = {"tools_list_bytes": size(listed), "tools": {}}
        for tool in listed["tools"]:
            out["tools"][tool["name"]] = {
                "input_schema_bytes": size(tool.get("inputSchema", {})),
                "output_schema_bytes": size(tool.get("outputSchema", {})),
                "description_bytes": len(tool.get("description", "").encode()),
            }
        out["input_schemas_bytes"] = sum(t["input_schema_bytes"] for t in out["tools"].values())
        for name, arguments in (calls or TYPICAL).items():
            out["tools"].setdefault(name, {}).update(call=arguments, **_call(s, name, arguments))
        cases = WITH_CONFIG if with_config is None else with_config
        out["with_config"] = {label: {"tool": tool, **_call(s, tool, arguments)}
                              for label, (tool, arguments) in cases.items()}
        return out
    finally:
        s.close()


def report(m: dict) -> str:
    lines = [
        f"tools/list: {m['tools_list_bytes']:,} bytes (goal <= {TOOLS_LIST_GOAL:,}); input schemas "
        f"{m['input_schemas_bytes']:,} bytes in all (goal <= {INPUT_SCHEMAS_GOAL:,})",
        "",
        f"{'tool':<24}{'input':>8}{'output':>8}{'descr':>7}  "
        f"{'text':>6}{'tokens':>8}{'struct':>8}{'other':>7}  other content",
    ]
    for name, t in m["tools"].items():
        lines.append(
            f"{name:<24}{t.get('input_schema_bytes', 0):>8,}{t.get('output_schema_bytes', 0):>8,}"
            f"{t.get('description_bytes', 0):>7,}  {t.get('text_bytes', 0):>6,}{t.get('text_tokens', 0):>8,}"
            f"{t.get('structured_bytes', 0):>8,}{t.get('other_content_bytes', 0):>7,}  "
            + (", ".join(t.get("other_content", [])) or "-") + ("  (ERROR)" if t.get("is_error") else ""))
    for label, t in m.get("with_config", {}).items():
        lines.append(
            f"{label:<47}{t['text_bytes']:>6,}{t['text_tokens']:>8,}{t['structured_bytes']:>8,}"
            f"{t['other_content_bytes']:>7,}  " + (", ".join(t["other_content"]) or "-")
            + ("  (ERROR)" if t["is_error"] else ""))
    lines += ["", "columns: schema bytes (input, output), description bytes; for one typical call: text bytes, "
              f"text tokens (chars/4, goal <= {TEXT_TOKENS_GOAL}), structured content bytes, other content bytes"]
    for name, t in m["tools"].items():
        if "call" in t:
            lines.append(f"  {name} {json.dumps(t['call'])}")
    for label in m.get("with_config", {}):
        lines.append(f"  {label}: an Axolotl 8-bit LoRA file for mistralai/Mistral-7B-v0.1 (sequence_len 8192, "
                     "micro_batch_size 2; AXOLOTL_MISTRAL_LORA) as config, gpu 'RTX 4090'")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the measurements as JSON")
    args = parser.parse_args(argv)
    m = measure()
    print(json.dumps(m, indent=1) if args.json else report(m))
    return 0


if __name__ == "__main__":
    sys.exit(main())
