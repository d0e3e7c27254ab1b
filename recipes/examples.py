"""The small example datasets (and GRPO's reward function) a recipe ships when its plan names no dataset.

Each trainer reads rows of its own shape (TRL 1.16's standard, non-conversational formats):

* sft: ``{"text": ...}`` (no example is shipped: the SFT recipe asks for ``--dataset``);
* dpo, orpo, reward: preference pairs ``{"prompt", "chosen", "rejected"}``;
* kto: unpaired ``{"prompt", "completion", "label"}`` (label true: a desirable completion);
* grpo: prompts ``{"prompt"}``; the reward comes from the recipe's ``reward.py``.

The rows are short on purpose: they show the shape and let ``canifinetune train`` run end to end; they are no
training data. Nothing here imports torch.
"""

from __future__ import annotations

import json

EXAMPLE_DATA_FILE = "example_data.jsonl"
REWARD_FILE = "reward.py"

# what each trainer's rows hold: (required keys, optional keys)
ROW_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "dpo": (("prompt", "chosen", "rejected"), ()),
    "orpo": (("prompt", "chosen", "rejected"), ()),
    "reward": (("chosen", "rejected"), ("prompt",)),
    "kto": (("prompt", "completion", "label"), ()),
    "grpo": (("prompt",), ()),
}

_PAIRS = [
    ("The capital of France is", " Paris.", " Berlin."),
    ("2 + 2 =", " 4.", " 5."),
    ("Water freezes at", " 0 degrees Celsius.", " 50 degrees Celsius."),
    ("The opposite of hot is", " cold.", " hot."),
    ("A week has", " seven days.", " ten days."),
    ("The sun rises in the", " east.", " west."),
    ("Bees make", " honey.", " glass."),
    ("The largest ocean is the", " Pacific.", " Arctic puddle."),
]

_PROMPTS = [
    "Greet a new colleague:",
    "Describe the sea in a few words:",
    "Name a fruit:",
    "Say thank you:",
    "Describe a cat:",
    "Give a tip for sleeping well:",
    "Name a colour:",
    "Describe rain:",
]


def example_rows(trainer: str) -> list[dict]:
    """The example rows for ``trainer`` (sft has none)."""
    if trainer in ("dpo", "orpo", "reward"):
        return [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in _PAIRS]
    if trainer == "kto":
        rows = []
        for p, c, r in _PAIRS:
            rows.append({"prompt": p, "completion": c, "label": True})
            rows.append({"prompt": p, "completion": r, "label": False})
        return rows
    if trainer == "grpo":
        return [{"prompt": p} for p in _PROMPTS]
    return []


def example_jsonl(trainer: str) -> str:
    """The example dataset as JSONL text (UTF-8, one object per line)."""
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in example_rows(trainer))


REWARD_PY = '''\
"""The reward for this GRPO recipe: `canifinetune train` calls `reward(prompts, completions, **kwargs)`.

GRPOTrainer (TRL 1.16) samples num_generations completions per prompt, scores each with this function and
learns from how each completion's score compares with the others of its group. Edit it for your task: return one
float per completion (higher is better); `kwargs` holds the dataset's other columns, row by row.

This example is a length-and-format reward, so the recipe runs out of the box:
  * up to 1.0 for a completion close to TARGET_CHARS characters (falling linearly to 0 at twice or zero that);
  * 0.5 more when it ends a sentence (with '.', '!' or '?').
It teaches short, finished answers and nothing else: replace it (a verifier, a unit test, a reward model).
"""

TARGET_CHARS = 40


def _text(completion):
    # a plain prompt gives a string; a conversational one a list of messages (the last is the answer)
    if isinstance(completion, list):
        return str(completion[-1].get("content", "")) if completion else ""
    return str(completion)


def reward(prompts, completions, **kwargs):
    scores = []
    for completion in completions:
        text = _text(completion).strip()
        closeness = max(0.0, 1.0 - abs(len(text) - TARGET_CHARS) / TARGET_CHARS)
        finished = 0.5 if text.endswith((".", "!", "?")) else 0.0
        scores.append(closeness + finished)
    return scores
'''
