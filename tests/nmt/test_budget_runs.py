"""Real trainings on the run's plan (nmt.budget): a time-budget run plans its steps, shapes its schedule and its
averaging window, and resumes bit-identical; dropout set from the plan is kept by a resumed run (two replicas:
tests/nmt/test_budget_replicas.py).

The step rate comes from an injected clock (`StepClock`): every step takes exactly `SECONDS_PER_STEP` of training
clock, so the plan is known in advance (no wall-clock time is measured or asserted). The runs are real in-process
trainings of a 1+1-layer d_model-16 model. The plan's decisions alone are tested in tests/nmt/test_budget.py.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import signal
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from nmt.config import config_from_dict
from nmt.final_weights import load_run_weights
from nmt.run_dir import RunDir, RunDirError
from nmt.trainer import Trainer
from tests.faults.helpers import (
    assert_bit_identical,
    final_weights,
    read_checkpoint,
    training_state,
)
from tests.nmt.test_budget import (
    AVERAGE_FRACTION,
    AVERAGE_LAST,
    BUDGET_MINUTES,
    FLOOR,
    PEAK,
    PLANNED,
    PROBE,
    REPLAN,
    SECONDS_PER_STEP,
    SKIP,
    WARMUP,
    slower_after_mark,
)
from tests.nmt.test_schedule import decay_reference
from tests.nmt.test_trainer import read_events
from tests.run_fixture import tiny_config_tree, write_corpus
from transformer.dropout import Dropout

# ----------------------------------------------------------------------------------------------------------------
# A real training on a time budget: the plan, the schedule it shapes, the averaging window, an exact resume


class StepClock:
    """The trainer's clock: every step (one call when it starts, one when it ends) takes SECONDS_PER_STEP, or
    `seconds(n)` for this process' n-th step.

    With `signal_at`, it sends this process SIGTERM at the end of that step (of this process): the trainer's own
    handler then stops the run after the step with a checkpoint, as for a user's signal.
    """

    def __init__(self, signal_at: int | None = None, seconds=lambda step: SECONDS_PER_STEP):
        self.now, self.calls, self.signal_at, self.seconds = 100.0, 0, signal_at, seconds

    def __call__(self) -> float:
        self.calls += 1
        if self.calls % 2 == 0:
            self.now += self.seconds(self.calls // 2)
            if self.calls // 2 == self.signal_at:
                os.kill(os.getpid(), signal.SIGTERM)
        return self.now


class Messages(logging.Handler):
    """The trainer's log messages while installed (`with Messages() as log: ...; "..." in log.text`)."""

    def __enter__(self):
        self.lines, logger = [], logging.getLogger("nmt.train")
        self.level = logger.level
        logger.setLevel(logging.INFO)
        logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        logger = logging.getLogger("nmt.train")
        logger.removeHandler(self)
        logger.setLevel(self.level)
        self.text = "\n".join(self.lines)

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """One corpus for the module: its tokenizer and prepared data are made once (data.prepare's cache)."""
    return write_corpus(tmp_path_factory.mktemp("budget") / "corpus")


@pytest.fixture(scope="module")
def budget_config(corpus):
    tree = tiny_config_tree(corpus)
    tree["data"].update(bucket_boundaries=[32], batch_tokens=256)  # one bucket: one compiled batch shape
    tree["model"].update(d_model=16, d_ff=32, dropout=0.1)  # dropout: the RNG state matters for exactness
    tree["train"] = {
        "max_minutes": BUDGET_MINUTES,
        "schedule": "linear",
        "learning_rate": PEAK,
        "warmup_steps": WARMUP,
        "min_learning_rate_fraction": FLOOR,
        "budget_probe_skip": SKIP,
        "budget_probe_steps": PROBE,
        "average_last": AVERAGE_LAST,
        "average_fraction": AVERAGE_FRACTION,
        "checkpoint_every": 5,
        "keep_checkpoints": 2,
        "log_every": 1,
        "eval_every": 0,
        "bleu_every": 0,
        "precision": "float32",
        "xla": False,
    }
    return config_from_dict(tree)


def train_in_process(config, run_dir: Path, clock):
    run = RunDir(run_dir)
    run.path.mkdir(parents=True, exist_ok=True)
    with Messages() as log:
        trainer = Trainer(config, run, clock=clock)
        trainer.setup()
        result = trainer.train()
    return trainer, result, log.text


@dataclasses.dataclass
class Finished:
    """What the module's tests read of a finished run kept for the module: the Trainer itself is released."""

    model: object
    config: object
    progress: object


def train_and_release(config, run_dir: Path, clock) -> tuple[Finished, object, str]:
    """`train_in_process` for a run the module keeps: (what its tests read, result, log); the Trainer (and its
    training iterator) released now.

    A training iterator kept alive for the whole module was destroyed in the module's teardown, which then took up
    to a minute on a loaded 2-core machine (the main thread waiting for tf.data's autotuning thread, in
    `RootDataset::Iterator`'s destructor; docs/make-test-2026-12-07-avx2/). Released right after its training, the
    iterator is young and goes at once."""
    import gc
    import weakref

    trainer, result, log = train_in_process(config, run_dir, clock)
    finished, gone = Finished(trainer.model, trainer.config, trainer.progress), weakref.ref(trainer)
    del trainer
    gc.collect()  # the Trainer's reference cycles (its tf.functions) hold the iterator until a collection
    assert gone() is None, "the Trainer is still referenced"
    return finished, result, log


@pytest.fixture(scope="module")
def uninterrupted(budget_config, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    finished, result, log = train_and_release(budget_config, run_dir, StepClock())
    return run_dir, result, log, finished


def read_records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


def snapshot_steps(run_dir: Path) -> list[int]:
    state = tf.train.get_checkpoint_state(str(run_dir / "checkpoints" / "average"))
    return [int(path.rsplit("-", 1)[1]) for path in state.all_model_checkpoint_paths]


def test_time_budget_run_plans_its_steps_and_decays_to_the_floor_at_the_plan(uninterrupted):
    run_dir, result, log, trainer = uninterrupted
    assert result.status == "done" and result.step == PLANNED, (result, log[-2000:])
    assert trainer.progress.total == PLANNED  # the progress bar's total: the plan, once fixed (no max_steps)
    (plan,) = [r for r in read_records(run_dir) if r["tag"] == "plan"]
    assert (plan["step"], plan["total_steps"], plan["steps_per_second"]) == (SKIP + PROBE, PLANNED, 4.0)
    assert f"plan: {PLANNED} steps for the {BUDGET_MINUTES:g}-minute budget" in log
    assert (  # said at the start: the bar has no total before the plan
        f"time budget {BUDGET_MINUTES:g} minutes of training steps: the steps are planned once the step rate is "
        f"measured (steps {SKIP + 1}-{SKIP + PROBE}; no total or ETA before)" in log
    )
    assert f"the time budget ended the run at step {PLANNED}, as planned" in log
    events, _ = read_events(run_dir / "tensorboard" / "train")
    logged = dict((step, float(value)) for step, value in events["learning_rate"])
    steps = np.arange(1, PLANNED + 1)
    want = decay_reference(steps, PEAK, WARMUP, PLANNED, FLOOR, "linear", decided_at=SKIP + PROBE)
    np.testing.assert_allclose([logged[s] for s in steps], want, rtol=1e-5)
    assert logged[PLANNED] == pytest.approx(FLOOR * PEAK, rel=1e-5)


def test_final_weights_average_the_window_over_the_last_fraction(uninterrupted):
    run_dir, _, log, _ = uninterrupted
    assert snapshot_steps(run_dir) == [20, 22, 24]  # window_steps(24, 0.25, 3): 2 apart, the last at the plan
    prefixes = [str(run_dir / "checkpoints" / "average" / f"ckpt-{step}") for step in (20, 22, 24)]
    snapshots = [read_checkpoint(prefix) for prefix in prefixes]
    final = final_weights(run_dir)
    if "final weights: average of 3 checkpoints" in log:
        mean = {
            key: (sum(s[key].astype(np.float64) for s in snapshots) / 3).astype(final[key].dtype)
            for key in final
        }
        assert_bit_identical(final, mean, "final weights = mean of the window's snapshots")
    else:  # the average had a higher validation loss: the last weights, as the log says
        assert "the average of 3 checkpoints had a higher validation loss" in log
        assert_bit_identical(final, snapshots[-1], "final weights = last weights")
    assert any(not np.array_equal(snapshots[0][k], snapshots[-1][k]) for k in final)  # the snapshots differ


def test_a_replan_moves_the_decay_end_the_window_and_the_progress_bar(budget_config, tmp_path):
    # Re-planned at half the decay (steps 6-24): the rate is timed from step 10 and is halved from step 11, so at
    # step 15 the plan becomes 17 steps (tests/nmt/test_budget.py, the same constants).
    config = dataclasses.replace(
        budget_config, train=dataclasses.replace(budget_config.train, budget_replan_at=0.5)
    )
    run_dir = tmp_path / "run"
    clock = StepClock(seconds=slower_after_mark)
    trainer, result, log = train_in_process(config, run_dir, clock)
    assert result.status == "done" and result.step == REPLAN + 2, (result, log[-2000:])
    assert trainer.progress.total == REPLAN + 2
    assert f"re-plan at step {REPLAN}: {REPLAN + 2} steps (was {PLANNED})" in log
    assert f"the time budget ended the run at step {REPLAN + 2}, as planned" in log
    events, _ = read_events(run_dir / "tensorboard" / "train")
    logged = dict((step, float(value)) for step, value in events["learning_rate"])
    before = np.arange(1, REPLAN + 1)  # the first plan's decay up to the re-plan (its step's update included)
    want = decay_reference(before, PEAK, WARMUP, PLANNED, FLOOR, "linear", decided_at=SKIP + PROBE)
    np.testing.assert_allclose([logged[s] for s in before], want, rtol=1e-5)
    after = np.arange(REPLAN + 1, REPLAN + 3)  # then the decay ends at the new plan
    want = decay_reference(after, PEAK, WARMUP, REPLAN + 2, FLOOR, "linear", decided_at=SKIP + PROBE)
    np.testing.assert_allclose([logged[s] for s in after], want, rtol=1e-5)
    assert logged[REPLAN + 2] == pytest.approx(FLOOR * PEAK, rel=1e-5)
    assert snapshot_steps(run_dir) == [15, 16, 17]  # window_steps(17, 0.25, 3): the window of the new plan


def test_with_ema_the_final_weights_are_the_ema_or_the_window_average_whichever_has_the_lower_loss(
    budget_config, tmp_path
):
    train_config = dataclasses.replace(budget_config.train, ema_decay=0.5, budget_replan_at=0.0)
    config = dataclasses.replace(budget_config, train=train_config)
    run_dir = tmp_path / "run"
    # Steps after 18 take twice as long: the budget ends at step 21, off the window of the plan (20, 22, 24), so the
    # last weights are snapshotted at the end, which must happen before the EMA replaces them.
    clock = StepClock(seconds=lambda step: SECONDS_PER_STEP if step <= 18 else 2 * SECONDS_PER_STEP)
    trainer, result, log = train_in_process(config, run_dir, clock)
    assert result.status == "done" and result.step == 21, (result, log[-2000:])
    assert snapshot_steps(run_dir) == [20, 21]
    snapshots = [read_checkpoint(str(run_dir / "checkpoints" / "average" / f"ckpt-{s}")) for s in (20, 21)]
    # The trained weights: the last training checkpoint (saved before final/), read through the model.
    trainer.checkpoint.restore(tf.train.latest_checkpoint(str(run_dir / "checkpoints"))).expect_partial()
    trained = read_checkpoint(
        tf.train.Checkpoint(model=trainer.model).save(str(tmp_path / "trained" / "ckpt"))
    )
    assert_bit_identical(snapshots[-1], trained, "the last snapshot holds the trained weights, not the EMA")
    trainer.optimizer.finalize_variable_values(trainer.model.trainable_variables)  # the trainer's own EMA
    ema = read_checkpoint(tf.train.Checkpoint(model=trainer.model).save(str(tmp_path / "ema" / "ckpt")))
    mean = {
        k: ((snapshots[0][k].astype(np.float64) + snapshots[1][k]) / 2).astype(v.dtype)
        for k, v in trained.items()
    }
    final = final_weights(run_dir)
    assert "candidate for the final weights: the exponential moving average (decay 0.5)" in log
    if "final weights: average of 2 checkpoints" in log:
        average_loss, ema_loss = (
            float(x) for x in re.search(r"validation loss ([\d.]+) \(EMA ([\d.]+)\)", log).groups()
        )
        assert average_loss <= ema_loss
        assert_bit_identical(final, mean, "final weights = mean of the window's snapshots")
    else:  # the EMA had the lower validation loss: kept, and it is neither the mean nor the last weights
        assert "final weights: EMA; the average of 2 checkpoints had a higher validation loss" in log
        assert_bit_identical(final, ema, "final weights = the EMA")
    assert any(not np.array_equal(ema[k], mean[k]) for k in ema)
    assert any(not np.array_equal(ema[k], trained[k]) for k in ema)
    # evaluate/translate/export --weights average|ema: each candidate made again from the run directory, whichever
    # final/ kept (the trainer's model is reused: every weight is set; tests/test_e2e.py goes through Translator)
    for which, expected in (("average", mean), ("ema", ema)):
        loaded = load_run_weights(trainer.model, RunDir(run_dir), which, config.train)
        saved = tf.train.Checkpoint(model=trainer.model).save(str(tmp_path / f"loaded-{which}" / "ckpt"))
        assert_bit_identical(read_checkpoint(saved), expected, f"--weights {which}")
    assert loaded.startswith("EMA (decay 0.5) in ") and loaded.endswith("ckpt-21")


def test_weights_a_run_did_not_keep_are_refused_by_name(uninterrupted):
    run_dir = uninterrupted[0]  # no EMA
    with pytest.raises(RunDirError, match="no EMA: trained with train.ema_decay 0"):
        load_run_weights(uninterrupted[3].model, RunDir(run_dir), "ema", uninterrupted[3].config.train)
    with pytest.raises(RunDirError, match="unknown checkpoint 'average'"):
        RunDir(run_dir).weights_prefix("average")


# ----------------------------------------------------------------------------------------------------------------
# Dropout from the plan (train.dropout_by_plan, train.ffn_dropout_by_plan): applied when the plan is made, kept by a
# resumed run


DROPOUT_POINTS = [[12, 0.1], [36, 0.5]]  # a plan of 24 steps: 0.3 from step 7 on (the probe runs at 0.1)
FFN_DROPOUT_POINTS = [[12, 0.0], [36, 0.2]]  # the feed-forward blocks: 0.1 from step 7 on


@pytest.fixture(scope="module")
def planned_dropout_run(budget_config, tmp_path_factory):
    config = dataclasses.replace(
        budget_config,
        train=dataclasses.replace(
            budget_config.train, dropout_by_plan=DROPOUT_POINTS, ffn_dropout_by_plan=FFN_DROPOUT_POINTS
        ),
    )
    run_dir = tmp_path_factory.mktemp("planned-dropout") / "run"
    finished, result, log = train_and_release(config, run_dir, StepClock())
    return config, run_dir, result, log, finished


def test_the_plan_sets_the_dropout_and_the_run_trains_with_it(planned_dropout_run, uninterrupted):
    _, run_dir, result, log, trainer = planned_dropout_run
    assert result.status == "done" and result.step == PLANNED, (result, log[-2000:])
    assert f"dropout 0.1 -> 0.3 for a plan of {PLANNED} steps (train.dropout_by_plan)" in log
    assert f"feed-forward dropout 0.3 -> 0.1 for a plan of {PLANNED} steps (train.ffn_dropout_by_plan)" in log
    (plan,) = [r for r in read_records(run_dir) if r["tag"] == "plan"]
    assert plan["dropout"] == pytest.approx(0.3) and plan["ffn_dropout"] == pytest.approx(0.1)
    model = trainer.model
    layers = (*model.encoder_layers, *model.decoder_layers)
    ffn = {id(layer.feed_forward.hidden_dropout) for layer in layers}
    rates = {
        layer.rate for layer in model._flatten_layers() if isinstance(layer, Dropout) and id(layer) not in ffn
    }
    assert model.dropout == 0.3 and rates == {0.3}
    assert model.ffn_dropout == 0.1 and {layer.feed_forward.hidden_dropout.rate for layer in layers} == {0.1}
    assert {layer.self_attention.dropout for layer in model.encoder_layers} == {0.0}  # attention: untouched
    # The same run without dropout_by_plan (0.1 throughout) ends elsewhere.
    reference, ours = final_weights(uninterrupted[0]), final_weights(run_dir)
    assert any(not np.array_equal(ours[k], reference[k]) for k in reference)


def test_a_resumed_run_keeps_the_plan_and_the_planned_dropout_and_ends_bit_identical(
    planned_dropout_run, tmp_path
):
    # One stop and resume for the plan (with the re-plan's mark) and the dropout it set, both kept from the
    # checkpoint: dropout_by_plan changes no decision of the plan (those follow StepClock alone). A resume without
    # planned dropout takes the same path, minus the dropout's retrace before the first step.
    config, reference, _, _, _ = planned_dropout_run
    run_dir = tmp_path / "run"
    # Stopped at step 13: after the plan (step 6, which set the dropout) and the re-plan's mark (step 11,
    # train.budget_replan_at 0.6 of the decay over steps 6-24), before the re-plan (step 17). The mark comes back
    # from the checkpoint (compared below with the replan/ state).
    _, stopped, _ = train_in_process(config, run_dir, StepClock(signal_at=13))
    assert stopped.status == "stopped" and stopped.step == 13, stopped
    # The same step time after the restart: the plan comes from the checkpoint, not from a new probe (a 4x slower
    # clock keeping the plan: tests/nmt/test_budget.py, test_a_resumed_plan_is_kept_and_...).
    trainer, done, log = train_in_process(config, run_dir, StepClock())
    assert trainer.resumed_from == 13 and trainer.progress.total == PLANNED  # the kept plan, from the start
    assert "plan: 24 steps (decided at step 6, 4 steps/s measured), kept from the checkpoint" in log
    # The dropout of the plan, set again before the first step (the stopped process set it at step 6).
    assert "dropout 0.1 -> 0.3 for a plan of 24 steps" in log
    assert "feed-forward dropout 0.3 -> 0.1 for a plan of 24 steps" in log
    assert done.status == "done" and done.step == PLANNED, (done, log[-2000:])
    decisions = [(r["tag"], r["step"], r["total_steps"]) for r in read_records(run_dir) if "total_steps" in r]
    assert decisions == [
        ("plan", 6, PLANNED),
        ("replan", 17, PLANNED),
    ]  # each once; the same rate, the same plan
    assert_bit_identical(training_state(run_dir), training_state(reference), "resumed planned-dropout run")
    assert_bit_identical(final_weights(run_dir), final_weights(reference), "final weights")
