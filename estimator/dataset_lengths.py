"""How long the user's samples are, roughly: what a shorter context would cost their data.

The search prices a context cut by the tokens it loses (estimator/costs.py). Without data it assumes every sample
is ``seq_len`` tokens long (what the memory model assumes too), so each halving loses half of every sample. With a
``dataset`` (a JSONL file, as the recipe trains on) it reads each row's text and counts approximate tokens, so a
cut that truncates nothing costs nothing and a cut that truncates a tail costs that tail.

Tokens are counted without a tokenizer (the core loads none): characters / CHARS_PER_TOKEN. That is a rule of thumb
for English text with the BPE vocabularies of current LLMs (OpenAI's tokenizer guide: "one token generally
corresponds to ~4 characters of text for common English text"); code, other scripts and numbers run shorter per
token. It prices a choice; it never enters a memory figure.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

from .bounded_io import read_regular_file

CHARS_PER_TOKEN = 4.0  # OpenAI, "What are tokens and how to count them" (help.openai.com): ~4 characters per token
MAX_DATASET_BYTES = 256 * 2**20  # the first 256 MiB: enough rows for a length distribution, bounded work
MAX_ROWS = 200_000
# Row fields that hold text, as the recipe's trainers read them (TRL's dataset formats): SFT text or messages,
# prompt/completion, preference pairs (the longer of chosen and rejected counts, each trained with the prompt).
TEXT_FIELDS = ("text", "prompt", "completion")
PAIR_FIELDS = ("chosen", "rejected")


def _text_of(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # conversational: [{"role": ..., "content": ...}, ...]
        return "".join(_text_of(m.get("content")) if isinstance(m, dict) else _text_of(m) for m in value)
    return ""


def row_chars(row: dict) -> int:
    """The characters one row trains on (its longest variant for preference pairs)."""
    base = sum(len(_text_of(row.get(f))) for f in (*TEXT_FIELDS, "messages"))
    pairs = [len(_text_of(row.get(f))) for f in PAIR_FIELDS if f in row]
    return base + (max(pairs) if pairs else 0)


@lru_cache(maxsize=8)
def _lengths(path: str, size: int, mtime: float) -> tuple[int, ...] | None:
    def refuse(message: str) -> Exception:
        return ValueError(message)

    try:
        raw = read_regular_file(path, MAX_DATASET_BYTES, refuse, lambda n: f"{n} bytes")
    except (OSError, ValueError):
        return None
    out = []
    for line in raw.decode("utf-8", errors="replace").splitlines()[:MAX_ROWS]:
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            chars = row_chars(row)
            if chars:
                out.append(max(1, math.ceil(chars / CHARS_PER_TOKEN)))
    return tuple(out) or None


def token_lengths(dataset: str | None) -> tuple[int, ...] | None:
    """Approximate token counts of the rows of a local JSONL ``dataset``, or None (no dataset, not a readable JSONL
    file, or no text in it: the cost model then assumes full rows)."""
    if not dataset or not dataset.endswith((".jsonl", ".json")):
        return None
    p = Path(dataset)
    try:
        st = p.stat()
    except OSError:
        return None
    if not p.is_file():
        return None
    return _lengths(str(p), st.st_size, st.st_mtime)


def tokens_kept(lengths: tuple[int, ...], seq_len: int) -> int:
    """The tokens of the data a context of ``seq_len`` keeps (each row truncated to it)."""
    return sum(min(n, seq_len) for n in lengths)
