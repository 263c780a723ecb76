"""Gradient accumulation through the Trainer (`train.accumulate_steps`): each optimizer step takes that many
micro-batches from the training iterator, and a run resumed from a checkpoint between optimizer steps ends with the
uninterrupted run's weights, bit for bit (the checkpointed iterator position counts micro-batches, the dropout
draws continue). tests/nmt/test_train_step.py checks the accumulated update itself against one big batch; before
2026-12-08 no test ran accumulation through the Trainer."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from nmt.config import config_from_dict
from nmt.run_dir import RunDir, write_atomic
from tests.run_fixture import tiny_config_tree, write_corpus

ACCUMULATE, STEPS, STOP = 2, 6, 3  # the stop's checkpoint (step 3) is off the checkpoint_every grid


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("accumulation") / "corpus")


def config(corpus, max_steps):
    tree = tiny_config_tree(corpus)
    tree["data"].update(bucket_boundaries=[8, 16, 32], batch_tokens=256)
    tree["model"].update(d_model=16, d_ff=32, dropout=0.1)  # dropout: the RNG state matters for exactness
    tree["train"] = {
        "max_steps": max_steps, "accumulate_steps": ACCUMULATE, "checkpoint_every": 2, "log_every": 1,
        "eval_every": 0, "bleu_every": 0, "precision": "float32", "xla": False, "learning_rate": 0.01,
        "average_last": 0,
    }  # fmt: skip
    return config_from_dict(tree)


def train(config, path, monkeypatch):
    """(steps' micro-batch counts, trained weights) of a Trainer on `path` (resumed when it holds a checkpoint)."""
    from nmt.trainer import Trainer

    run = RunDir(path)
    run.path.mkdir(parents=True, exist_ok=True)
    write_atomic(run.config_path, config.to_yaml())
    trainer = Trainer(config, run)
    trainer.setup()
    counts, step = [], trainer.step_fn.step

    def counted(batches):
        counts.append(len(batches))
        return step(batches)

    monkeypatch.setattr(trainer.step_fn, "step", counted)
    assert trainer.train().status == "done"
    weights = [w.numpy().copy() for w in trainer.model.trainable_weights]
    del (
        trainer
    )  # its training iterator goes now, not in the module's teardown (tests/nmt/test_budget_runs.py)
    gc.collect()
    return counts, weights


def test_a_resume_between_accumulated_steps_ends_as_the_uninterrupted_run(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("NMT_DATA_CACHE", str(tmp_path / "cache"))
    counts, uninterrupted = train(config(corpus, STEPS), tmp_path / "uninterrupted", monkeypatch)
    assert counts == [ACCUMULATE] * STEPS
    first, at_stop = train(config(corpus, STOP), tmp_path / "resumed", monkeypatch)
    rest, resumed = train(config(corpus, STEPS), tmp_path / "resumed", monkeypatch)
    assert (first, rest) == ([ACCUMULATE] * STOP, [ACCUMULATE] * (STEPS - STOP))
    for a, b in zip(resumed, uninterrupted, strict=True):
        np.testing.assert_array_equal(a, b)
    # not vacuous: the steps after the stop moved the weights
    assert any(not np.array_equal(a, b) for a, b in zip(at_stop, uninterrupted, strict=True))
