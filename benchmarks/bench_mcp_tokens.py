"""What an assistant pays to use the MCP server: the bytes it reads (a benchmark, not a timed test).

Over stdio, raw newline-delimited JSON-RPC (what the model's host receives), it prints:

* ``tools/list``: the whole answer, and each tool's input schema, output schema and description;
* one typical call of each tool: the bytes of its text content, of its structured content, of any
  other content (resource links, embedded resources), and an estimate of the text's tokens
  (characters / 4, the usual rule of thumb for English and JSON).

Goals (issue 15.4): tools/list <= 16 KB, input schemas <= 6 KB in all, a typical text <= 600 tokens
(about 2,400 characters).

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
TOOLS_LIST_GOAL = 16 * 1024
INPUT_SCHEMAS_GOAL = 6 * 1024
TEXT_TOKENS_GOAL = 600


def size(value) -> int:
    """Bytes of ``value`` as compact JSON (what travels on the wire)."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def measure(server: list[str] | None = None, calls: dict | None = None) -> dict:
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
            result = s.request("tools/call", {"name": name, "arguments": arguments})
            texts = [c["text"] for c in result.get("content", []) if c.get("type") == "text"]
            others = [c for c in result.get("content", []) if c.get("type") != "text"]
            text_bytes = sum(len(t.encode()) for t in texts)
            row = out["tools"].setdefault(name, {})
            row.update(
                call=arguments, is_error=bool(result.get("isError")), text_bytes=text_bytes,
                text_tokens=round(sum(len(t) for t in texts) / 4),
                structured_bytes=size(result["structuredContent"]) if result.get("structuredContent") else 0,
                other_content_bytes=size(others), other_content=[c.get("type") for c in others],
                result_bytes=size(result),
            )
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
    lines += ["", "columns: schema bytes (input, output), description bytes; for one typical call: text bytes, "
              f"text tokens (chars/4, goal <= {TEXT_TOKENS_GOAL}), structured content bytes, other content bytes"]
    for name, t in m["tools"].items():
        if "call" in t:
            lines.append(f"  {name} {json.dumps(t['call'])}")
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
