"""packing and padding_free reach TRL's SFTConfig as the plan says (issue 21): the runtime used to hard-code both off.

The trainer is built by the runtime (``prepare``) on a tiny random llama on the CPU, as tests/test_runtime.py does,
and one step trains, so TRL 1.16 accepts the arguments as they are passed.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("peft")

from test_runtime import make_tiny_model

from canifinetune.estimator.plan import TrainingPlan
from canifinetune.recipes.runtime import prepare


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize("kw", [{}, {"packing": True}, {"padding_free": True}, {"packing": True, "padding_free": True}],
                         ids=["neither", "packing", "padding_free", "both"])
def test_the_sft_config_carries_packing_and_padding_free(kw, tiny_model, tmp_path):
    plan = TrainingPlan(model=str(tiny_model), dtype="fp32", seq_len=32, batch_size=2, max_steps=1, optim="adamw_torch",
                        **kw)
    samples = [[5 + i % 7] * (8 + 3 * i) for i in range(6)]  # 8..23 tokens: shorter than seq_len, unequal
    prepared = prepare(plan, token_ids=samples, output_dir=tmp_path / "o", max_steps=1)
    args = prepared.trainer.args
    assert args.packing is plan.packing and args.padding_free is plan.padding_free
    # TRL 1.16 packs with "bfd", which turns padding-free on; padding-free alone flattens each batch into one row
    assert prepared.trainer.padding_free is (plan.packing or plan.padding_free)
    assert prepared.trainer.data_collator.padding_free is (plan.packing or plan.padding_free)
    assert args.max_length == (None if plan.padding_free and not plan.packing else plan.seq_len)
    lengths = [len(x) for x in prepared.trainer.train_dataset["input_ids"]]
    assert max(lengths) <= plan.seq_len
    if plan.packing:
        assert len(lengths) < len(samples)  # rows of up to seq_len tokens, several samples each
        assert any("mask" in note for note in prepared.notes)  # sdpa: the mask the estimate does not count
    else:
        assert len(lengths) == len(samples)
    loss = prepared.trainer.train().training_loss
    assert math.isfinite(loss) and loss > 0
