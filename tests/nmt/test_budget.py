"""The run's plan (nmt.budget): the step budget a time limit allows, decided once from a measured step rate and kept
by a resumed run; the learning rate that follows the global batch; a resume with another global batch refused.

The step rate comes from an injected clock (`Trainer(clock=...)`): every step takes exactly 0.25 s of training
clock, so the plan is known in advance (no wall-clock time is measured or asserted). The time-budget runs are real
in-process trainings of a 1+1-layer d_model-16 model; the 2-replica run is a `train.py` process (logical devices
must be configured before TensorFlow starts).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import train as train_cli
from nmt.budget import BatchChanged, TrainingPlan, planned_dropout
from nmt.config import TrainConfig, config_from_dict
from nmt.run_dir import RunDir
from nmt.trainer import Trainer
from tests.faults.helpers import (
    assert_bit_identical,
    final_weights,
    read_checkpoint,
    snapshot_run,
    train,
    training_state,
    write_config,
)
from tests.nmt.test_schedule import decay_reference
from tests.nmt.test_trainer import read_events
from tests.run_fixture import tiny_config_tree, write_corpus
from transformer.dropout import Dropout

SECONDS_PER_STEP = 0.25  # exact in binary: the training clock adds up without rounding
# max_minutes 0.1 = 6 s = 24 steps. The probe skips steps 1-2 and times steps 3-6 (1 s: 4 steps/s); at step 6,
# 4.5 s are left: 18 more steps, a plan of 24.
BUDGET_MINUTES, SKIP, PROBE, PLANNED = 0.1, 2, 4, 24
PEAK, WARMUP, FLOOR = 0.01, 8, 0.1  # the plan (step 6) comes before the end of warmup
AVERAGE_LAST, AVERAGE_FRACTION = 3, 0.25  # window_steps(24, 0.25, 3) == (20, 2)


# ----------------------------------------------------------------------------------------------------------------
# The decision, on the plan alone


def plan_for(**train) -> TrainingPlan:
    defaults = dict(max_minutes=BUDGET_MINUTES, budget_probe_skip=SKIP, budget_probe_steps=PROBE)
    records = []
    plan = TrainingPlan(TrainConfig(**(defaults | train)), 1, 512, record=records.append)
    plan.records = records
    return plan


def run_steps(plan: TrainingPlan, steps, seconds=lambda step: SECONDS_PER_STEP, clock=0.0) -> float:
    for step in steps:
        clock += seconds(step)
        plan.after_step(step, clock)
    return clock


def test_time_budget_plan_from_the_probed_rate():
    plan = plan_for()
    plan.start(0, 0.0)
    run_steps(plan, range(1, PROBE + SKIP))
    assert plan.total_steps == 0  # still probing: the schedule is the warmup
    run_steps(plan, [PROBE + SKIP], clock=(PROBE + SKIP - 1) * SECONDS_PER_STEP)
    assert plan.total_steps == PLANNED and int(plan.state.decided_at.numpy()) == PROBE + SKIP
    (record,) = plan.records
    assert record["tag"] == "plan" and record["total_steps"] == PLANNED and record["step"] == PROBE + SKIP
    assert record["steps_per_second"] == 1 / SECONDS_PER_STEP and record["budget_seconds"] == 6.0
    # The probe times its own steps only: slow first steps (compilation) leave the rate at 4 steps/s; they spent
    # 2 s of the 6, so at step 6 (3 s) 3 s are left: 12 more steps.
    slow = plan_for()
    slow.start(0, 0.0)
    run_steps(slow, range(1, 30), seconds=lambda step: 1.0 if step <= SKIP else SECONDS_PER_STEP)
    assert slow.total_steps == PROBE + SKIP + 12 and slow.records[0]["steps_per_second"] == 4.0


def test_max_steps_caps_the_time_plan_and_alone_decides_at_once():
    both = plan_for(max_steps=20)
    both.start(0, 0.0)
    run_steps(both, range(1, 10))
    assert both.total_steps == 20  # the smaller of max_steps and the time plan (24)
    steps_only = plan_for(max_minutes=0.0, max_steps=500)
    steps_only.start(0, 0.0)
    assert steps_only.total_steps == 500 and int(steps_only.state.decided_at.numpy()) == 0
    assert steps_only.records == []  # nothing measured: no record


def test_a_resumed_plan_is_kept_and_an_unfinished_probe_starts_again(tmp_path):
    plan = plan_for()
    plan.start(0, 0.0)
    run_steps(plan, range(1, 11))
    prefix = tf.train.Checkpoint(plan=plan.state).save(str(tmp_path / "ckpt"))
    resumed = plan_for()
    parts = resumed.restorable(prefix, {"plan": resumed.state})
    tf.train.Checkpoint(**parts).restore(prefix).assert_existing_objects_matched()
    resumed.start(10, 2.5)
    run_steps(resumed, range(11, 30), seconds=lambda step: 1.0, clock=2.5)  # 4x slower now: no new plan
    assert resumed.total_steps == PLANNED and resumed.records == []
    # Killed during the probe (nothing decided yet): the next process probes after skipping its own first steps.
    unfinished = plan_for()
    unfinished.start(3, 0.75)
    run_steps(unfinished, range(4, 4 + SKIP + PROBE - 1), clock=0.75)
    assert unfinished.total_steps == 0
    run_steps(unfinished, [3 + SKIP + PROBE], clock=0.75 + (SKIP + PROBE - 1) * SECONDS_PER_STEP)
    # Steps 6-9 timed (4 steps/s); at step 9 the clock reads 2.25 s: 3.75 s left, 15 more steps.
    assert unfinished.total_steps == 9 + 15 and int(unfinished.state.decided_at.numpy()) == 9


def test_the_log_says_how_far_from_the_plan_the_time_budget_stopped(caplog):
    plan = plan_for()
    plan.start(0, 0.0)
    run_steps(plan, range(1, 7))
    with caplog.at_level(logging.INFO, logger="nmt.train"):
        plan.report_end(15, out_of_time=True)
        plan.report_end(30, out_of_time=True)
        plan.report_end(PLANNED, out_of_time=True)
    messages = [r.getMessage() for r in caplog.records]
    assert "the time budget ended the run at step 15, 9 steps before the planned 24" in messages[0]
    assert "the time budget ended the run at step 30, 6 steps after the planned 24" in messages[1]
    assert messages[2] == "the time budget ended the run at step 24, as planned"


def test_planned_dropout_is_piecewise_linear_in_the_planned_steps_and_flat_beyond():
    points = [[100, 0.1], [300, 0.3], [400, 0.3]]
    # Worked by hand: halfway between 100 and 300 steps is halfway between 0.1 and 0.3.
    for steps, want in [(1, 0.1), (100, 0.1), (150, 0.15), (200, 0.2), (300, 0.3), (350, 0.3), (10**6, 0.3)]:
        assert planned_dropout(points, steps) == pytest.approx(want, abs=1e-12), steps
    assert planned_dropout([], 200) is None and planned_dropout(points, 0) is None  # off; no plan yet
    plan = plan_for(dropout_by_plan=[[12, 0.1], [36, 0.5]])
    plan.start(0, 0.0)
    assert plan.dropout is None  # probing
    run_steps(plan, range(1, PROBE + SKIP + 1))
    # 24 steps: halfway from 12 to 36.
    assert plan.total_steps == PLANNED and plan.dropout == pytest.approx(0.3)
    assert plan.records[0]["dropout"] == pytest.approx(0.3)
    plain = plan_for()
    plain.start(0, 0.0)
    run_steps(plain, range(1, PROBE + SKIP + 1))
    assert plain.dropout is None and "dropout" not in plain.records[0]  # without dropout_by_plan: none
    assert plain.ffn_dropout is None and "ffn_dropout" not in plain.records[0]
    ffn = plan_for(ffn_dropout_by_plan=[[12, 0.0], [36, 0.2]])
    ffn.start(0, 0.0)
    assert ffn.ffn_dropout is None
    run_steps(ffn, range(1, PROBE + SKIP + 1))
    assert ffn.ffn_dropout == pytest.approx(0.1) and ffn.records[0]["ffn_dropout"] == pytest.approx(0.1)
    assert ffn.dropout is None and "dropout" not in ffn.records[0]  # the two lists are independent
    steps_only = plan_for(max_minutes=0.0, max_steps=30, dropout_by_plan=[[12, 0.1], [36, 0.5]])
    steps_only.start(0, 0.0)
    assert steps_only.dropout == pytest.approx(0.4)  # decided at once from max_steps


# ----------------------------------------------------------------------------------------------------------------
# The global batch: learning-rate scaling, and a resume with another batch


def test_learning_rate_follows_the_global_batch():
    assert plan_for().peak == TrainConfig().learning_rate  # one replica, the reference: unchanged
    two = TrainingPlan(TrainConfig(learning_rate=0.004), 2, 512)
    assert (two.global_tokens, two.reference_tokens) == (1024, 512)
    assert two.peak == pytest.approx(0.004 * math.sqrt(2), rel=1e-12)
    tuned = TrainingPlan(
        TrainConfig(learning_rate=0.004, reference_batch_tokens=1024, accumulate_steps=2), 2, 512
    )
    assert tuned.global_tokens == 2048 and tuned.peak == pytest.approx(0.004 * math.sqrt(2), rel=1e-12)


def test_resume_with_another_global_batch_is_refused_unless_allowed(tmp_path):
    written = TrainingPlan(TrainConfig(), 2, 512)
    iterator = tf.Variable(7)  # stands for the data iterator's state
    prefix = tf.train.Checkpoint(plan=written.state, iterator=iterator).save(str(tmp_path / "ckpt"))
    parts = {"plan": TrainingPlan(TrainConfig(), 1, 512).state, "iterator": iterator}
    with pytest.raises(BatchChanged) as refused:
        TrainingPlan(TrainConfig(), 1, 512).restorable(prefix, parts)
    assert "trained with a global batch of 1024 tokens on 2 replica(s); this run has 512 tokens on 1" in str(
        refused.value
    )
    assert "--set train.allow_batch_change=true" in str(refused.value)
    assert TrainingPlan(TrainConfig(), 2, 512).restorable(prefix, parts) == parts  # same batch: everything
    allowed = TrainingPlan(TrainConfig(allow_batch_change=True), 1, 512).restorable(prefix, parts)
    assert set(allowed) == {"plan"}  # the data position belongs to the old batches
    older = tf.train.Checkpoint(iterator=iterator).save(str(tmp_path / "older"))  # before the plan existed
    assert set(TrainingPlan(TrainConfig(), 1, 512).restorable(older, parts)) == {"iterator"}


# ----------------------------------------------------------------------------------------------------------------
# A real training on a time budget: the plan, the schedule it shapes, the averaging window, an exact resume


class StepClock:
    """The trainer's clock: every step (one call when it starts, one when it ends) takes SECONDS_PER_STEP.

    With `signal_at`, it sends this process SIGTERM at the end of that step (of this process): the trainer's own
    handler then stops the run after the step with a checkpoint, as for a user's signal.
    """

    def __init__(self, signal_at: int | None = None):
        self.now, self.calls, self.signal_at = 100.0, 0, signal_at

    def __call__(self) -> float:
        self.calls += 1
        if self.calls % 2 == 0:
            self.now += SECONDS_PER_STEP
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


@pytest.fixture(scope="module")
def uninterrupted(budget_config, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    trainer, result, log = train_in_process(budget_config, run_dir, StepClock())
    return run_dir, result, log, trainer


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


def test_resumed_run_keeps_the_plan_and_ends_bit_identical(budget_config, uninterrupted, tmp_path):
    reference, _, _, _ = uninterrupted
    run_dir = tmp_path / "run"
    _, stopped, _ = train_in_process(budget_config, run_dir, StepClock(signal_at=10))
    assert stopped.status == "stopped" and stopped.step == 10, stopped
    # A slower machine after the restart: the plan stays (the time budget would now stop the run early).
    trainer, done, log = train_in_process(budget_config, run_dir, StepClock())
    assert trainer.resumed_from == 10 and trainer.progress.total == PLANNED  # the kept plan, from the start
    assert "plan: 24 steps (decided at step 6, 4 steps/s measured), kept from the checkpoint" in log
    assert done.status == "done" and done.step == PLANNED, (done, log[-2000:])
    assert [r["total_steps"] for r in read_records(run_dir) if r["tag"] == "plan"] == [
        PLANNED
    ]  # decided once
    assert_bit_identical(training_state(run_dir), training_state(reference), "resumed time-budget run")
    assert_bit_identical(final_weights(run_dir), final_weights(reference), "final weights")


# ----------------------------------------------------------------------------------------------------------------
# Two replicas (logical CPU devices): the learning rate follows the global batch; a 1-replica resume is refused


@pytest.mark.slow  # ~26 s; the refusal rule and the sqrt scaling are also tested in-process above
def test_two_replicas_scale_the_learning_rate_and_another_replica_count_is_refused(corpus, tmp_path, capsys):
    tree = tiny_config_tree(corpus)
    tree["data"].update(bucket_boundaries=[32], batch_tokens=512)
    tree["train"] = {
        "max_steps": 4,
        "warmup_steps": 2,
        "learning_rate": 0.005,
        "precision": "float32",
        "xla": False,
        "checkpoint_every": 2,
        "log_every": 1,
        "eval_every": 0,
        "bleu_every": 0,
        "distribute": "mirrored",
    }
    config = write_config(tmp_path / "mirrored.yaml", tree)
    run_dir = tmp_path / "run"
    done = train(config, run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "global batch: 1024 tokens per step = 2 replica(s) x 512 tokens" in done.stderr
    assert "peak learning rate 0.007071 (train.learning_rate 0.005 for 512 tokens" in done.stderr
    events, _ = read_events(run_dir / "tensorboard" / "train")
    logged = dict((step, float(value)) for step, value in events["learning_rate"])
    scaled = 0.005 * math.sqrt(2)  # sqrt(global 1024 / reference 512): Adam's rule
    for step in (1, 2, 3, 4):
        assert logged[step] == pytest.approx(scaled * min(step / 2, math.sqrt(2 / step)), rel=1e-6), step

    # One replica now (half the global batch): refused with both batches named, nothing written.
    before = snapshot_run(run_dir)  # config.yaml included: a refused start rewrites nothing
    args = [
        "--config",
        str(config),
        "--model-dir",
        str(run_dir),
        "--set",
        "train.distribute=none",
        "train.max_steps=6",
    ]
    assert train_cli.main(args) == 1
    err = capsys.readouterr().err
    assert (
        "trained with a global batch of 1024 tokens on 2 replica(s); this run has 512 tokens on 1 replica(s)"
        in err
    )
    assert "train.allow_batch_change=true" in err
    assert snapshot_run(run_dir) == before

    # The explicit override: resumes at step 4 with the learning rate of the new global batch (the reference).
    assert train_cli.main([*args, "train.allow_batch_change=true"]) == 0
    err = capsys.readouterr().err
    assert f"resuming {run_dir} from step 4" in err and "finished at step 6" in err
    events, _ = read_events(run_dir / "tensorboard" / "train")
    logged = dict((step, float(value)) for step, value in events["learning_rate"])
    for step in (5, 6):
        assert logged[step] == pytest.approx(0.005 * math.sqrt(2 / step), rel=1e-6), step
    reader = tf.train.load_checkpoint(str(run_dir / "checkpoints"))
    assert reader.get_tensor("plan/replicas/.ATTRIBUTES/VARIABLE_VALUE") == 1
    assert reader.get_tensor("plan/global_tokens/.ATTRIBUTES/VARIABLE_VALUE") == 512


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
    trainer, result, log = train_in_process(config, run_dir, StepClock())
    return config, run_dir, result, log, trainer


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


def test_a_resumed_run_takes_the_planned_dropout_from_its_checkpoint_and_ends_bit_identical(
    planned_dropout_run, tmp_path
):
    config, reference, _, _, _ = planned_dropout_run
    run_dir = tmp_path / "run"
    _, stopped, _ = train_in_process(config, run_dir, StepClock(signal_at=10))
    assert stopped.status == "stopped" and stopped.step == 10, stopped
    trainer, done, log = train_in_process(config, run_dir, StepClock())
    assert trainer.resumed_from == 10 and "dropout 0.1 -> 0.3 for a plan of 24 steps" in log
    assert "feed-forward dropout 0.3 -> 0.1 for a plan of 24 steps" in log
    assert done.status == "done" and done.step == PLANNED, (done, log[-2000:])
    assert_bit_identical(training_state(run_dir), training_state(reference), "resumed planned-dropout run")
    assert_bit_identical(final_weights(run_dir), final_weights(reference), "final weights")
