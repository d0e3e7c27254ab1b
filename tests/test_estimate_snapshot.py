"""Every estimate of the frozen cohorts and the accuracy table equals its recorded snapshot, byte for byte.

A refactoring must leave them all unchanged. A deliberate change to the memory model rewrites the snapshot with
`python benchmarks/estimate_snapshot.py --write`, and the diff of tests/data/estimate_snapshot.json shows in review
which estimates it moved."""

from __future__ import annotations

import json

from benchmarks import estimate_snapshot


def test_every_recorded_estimate_is_unchanged():
    old = json.loads(estimate_snapshot.SNAPSHOT.read_text(encoding="utf-8"))
    new = estimate_snapshot.snapshot()
    diff = estimate_snapshot.changed(old, new)
    assert not diff, f"{len(diff)} estimates changed (rewrite the snapshot if that was meant): {', '.join(diff[:20])}"
