"""The run's plan (nmt.budget) on its own: the step budget a time limit allows, decided once from a measured step rate
and kept by a resumed run; dropout from the plan; the learning rate that follows the global batch; a resume with
another global batch refused.

The step rate comes from a given clock: every step takes exactly 0.25 s, so the plan is known in advance (no
wall-clock time is measured or asserted). The constants here are shared with the real trainings on a plan in
tests/nmt/test_budget_runs.py.
"""

from __future__ import annotations

import logging
import math

import pytest
import tensorflow as tf

from nmt.budget import BatchChanged, TrainingPlan, planned_dropout
from nmt.config import TrainConfig

SECONDS_PER_STEP = 0.25  # exact in binary: the training clock adds up without rounding
# max_minutes 0.1 = 6 s = 24 steps. The probe skips steps 1-2 and times steps 3-6 (1 s: 4 steps/s); at step 6,
# 4.5 s are left: 18 more steps, a plan of 24.
BUDGET_MINUTES, SKIP, PROBE, PLANNED = 0.1, 2, 4, 24
PEAK, WARMUP, FLOOR = 0.01, 8, 0.1  # the plan (step 6) comes before the end of warmup
AVERAGE_LAST, AVERAGE_FRACTION = 3, 0.25  # window_steps(24, 0.25, 3) == (20, 2)


# ----------------------------------------------------------------------------------------------------------------
# The decision, on the plan alone


def plan_for(**train) -> TrainingPlan:
    defaults = dict(
        max_minutes=BUDGET_MINUTES, budget_probe_skip=SKIP, budget_probe_steps=PROBE, budget_replan_at=0.0
    )  # the first plan alone; re-planning has its own tests
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
    # max_steps at or before the probe's end (step 6): the probe would never decide, so max_steps plans at once
    # (the decay and the planned dropout apply), and the time budget still stops the run if it comes first.
    for max_steps in (PROBE + SKIP, 3):
        short = plan_for(max_steps=max_steps, dropout_by_plan=[[10, 0.1], [30, 0.3]])
        short.start(0, 0.0)
        assert short.total_steps == max_steps and int(short.state.decided_at.numpy()) == 0
        assert short.dropout == pytest.approx(0.1)
    resumed_short = plan_for(max_steps=12)  # resumed at step 7 without a plan (max_steps raised): 7 + 6 >= 12
    resumed_short.start(7, 1.75)
    assert resumed_short.total_steps == 12
    probing = plan_for(max_steps=PROBE + SKIP + 1)  # one step after the probe's end: the probe decides
    probing.start(0, 0.0)
    assert probing.total_steps == 0
    run_steps(probing, range(1, PROBE + SKIP + 1))
    assert probing.total_steps == PROBE + SKIP + 1


def test_a_plan_within_the_warmup_says_the_learning_rate_never_peaks(caplog):
    """max_steps 5 with warmup_steps 400: accepted (a smoke run), with a warning naming both and how far the rate
    gets; a plan past the warmup says nothing."""
    for max_steps, warned in ((5, True), (WARMUP, True), (WARMUP + 1, False)):
        caplog.clear()
        plan = plan_for(max_minutes=0.0, max_steps=max_steps, warmup_steps=WARMUP if max_steps > 5 else 400)
        with caplog.at_level(logging.WARNING, logger="nmt.train"):
            plan.start(0, 0.0)
        text = caplog.text
        assert ("learning rate stops at" in text) is warned, (max_steps, text)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nmt.train"):
        plan_for(max_minutes=0.0, max_steps=5, warmup_steps=400).start(0, 0.0)
    assert "train.warmup_steps 400 >= the 5 steps planned: the learning rate stops at 1.2% of" in caplog.text


def test_the_warmup_warning_names_the_peak_the_global_batch_scaled(caplog):
    """The share is of the peak the warmup climbs to, which learning_rate_scaling makes another learning rate than
    train.learning_rate under mirrored replicas or accumulation with reference_batch_tokens: the warning gives that
    peak and says it is scaled (before: "of train.learning_rate", 0.001 for a peak of 0.002; found by a review)."""
    warmup = dict(max_minutes=0.0, max_steps=5, warmup_steps=400, learning_rate=0.001)
    cases = [
        # (replicas, more train settings): 4x the reference batch, sqrt scaling -> twice the learning rate
        (4, {}, "0.002 (train.learning_rate 0.001 scaled for the global batch: learning_rate_scaling sqrt)"),
        (1, dict(accumulate_steps=4, reference_batch_tokens=512), "0.002 (train.learning_rate 0.001 scaled"),
        (1, dict(accumulate_steps=4, reference_batch_tokens=1024, learning_rate_scaling="linear"), "0.002 ("),
        # nothing scaled: the peak is train.learning_rate, without a parenthesis
        (4, dict(learning_rate_scaling="none"), "0.001, before the peak"),
        (1, dict(accumulate_steps=4), "0.001, before the peak"),
    ]
    for replicas, train, peak in cases:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="nmt.train"):
            TrainingPlan(TrainConfig(**warmup, **train), replicas, 512).start(0, 0.0)
        assert (
            "train.warmup_steps 400 >= the 5 steps planned: the learning rate stops at 1.2% of the peak learning "
            f"rate {peak}" in caplog.text
        ), (replicas, train, caplog.text)


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


# Re-planning (train.budget_replan_at 0.5): the first plan (step 6, 24 steps) decays over steps 6-24, so the
# rate is timed from step 6 + round(18 x 0.25) = 10 and the plan made again at step 6 + 9 = 15.
MARK, REPLAN = 10, 15


def slower_after_mark(step: int) -> float:
    return SECONDS_PER_STEP if step <= MARK else 2 * SECONDS_PER_STEP  # 4 steps/s, then 2


def test_replan_moves_the_end_to_the_rate_timed_since_the_mark_and_keeps_the_dropout():
    plan = plan_for(budget_replan_at=0.5, dropout_by_plan=[[10, 0.1], [30, 0.3]])
    plan.start(0, 0.0)
    run_steps(plan, range(1, REPLAN), seconds=slower_after_mark)
    assert plan.total_steps == PLANNED and [r["tag"] for r in plan.records] == ["plan"]
    assert plan.dropout == pytest.approx(0.24)  # planned_dropout at 24 steps
    clock = run_steps(
        plan, [REPLAN], seconds=slower_after_mark, clock=MARK * 0.25 + (REPLAN - MARK - 1) * 0.5
    )
    # Steps 11-15 took 2.5 s (2 steps/s); at step 15 the clock reads 5 s: 1 s left, 2 more steps.
    assert clock == 5.0 and plan.total_steps == REPLAN + 2
    record = plan.records[-1]
    assert record["tag"] == "replan" and record["step"] == REPLAN and record["steps_per_second"] == 2.0
    assert (record["total_steps"], record["previous_total_steps"]) == (REPLAN + 2, PLANNED)
    assert plan.dropout == pytest.approx(0.24)  # the first plan's: no retrace, and a resume applies the same
    run_steps(
        plan, range(REPLAN + 1, 40), seconds=lambda step: 4.0, clock=clock
    )  # much slower: no third plan
    assert plan.total_steps == REPLAN + 2 and len(plan.records) == 2
    # At the same rate throughout, the re-plan finds the first plan again.
    steady = plan_for(budget_replan_at=0.5)
    steady.start(0, 0.0)
    run_steps(steady, range(1, 30))
    assert steady.total_steps == PLANNED and [r["total_steps"] for r in steady.records] == [PLANNED, PLANNED]
    # Off (0), or a plan from max_steps (nothing timed): never re-planned.
    off = plan_for(budget_replan_at=0.0)
    off.start(0, 0.0)
    run_steps(off, range(1, 30), seconds=slower_after_mark)
    assert off.total_steps == PLANNED and len(off.records) == 1
    steps_only = plan_for(max_minutes=0.0, max_steps=24, budget_replan_at=0.5)
    steps_only.start(0, 0.0)
    run_steps(steps_only, range(1, 30), seconds=slower_after_mark)
    assert steps_only.total_steps == 24


def restore_plan(prefix: str, **train) -> TrainingPlan:
    plan = plan_for(**train)
    parts = plan.restorable(prefix, {"plan": plan.state, "replan": plan.replan_state})
    tf.train.Checkpoint(**parts).restore(prefix).assert_existing_objects_matched()
    return plan


@pytest.mark.parametrize("stop_at", [MARK - 1, MARK + 2, REPLAN + 1])
def test_a_resumed_run_replans_as_the_uninterrupted_one(tmp_path, stop_at):
    uninterrupted = plan_for(budget_replan_at=0.5)
    uninterrupted.start(0, 0.0)
    run_steps(uninterrupted, range(1, 30), seconds=slower_after_mark)
    first = plan_for(budget_replan_at=0.5)
    first.start(0, 0.0)
    clock = run_steps(first, range(1, stop_at + 1), seconds=slower_after_mark)
    prefix = tf.train.Checkpoint(plan=first.state, replan=first.replan_state).save(str(tmp_path / "ckpt"))
    resumed = restore_plan(prefix, budget_replan_at=0.5)
    resumed.start(stop_at, clock)
    run_steps(resumed, range(stop_at + 1, 30), seconds=slower_after_mark, clock=clock)
    assert resumed.total_steps == uninterrupted.total_steps == REPLAN + 2
    assert resumed.dropout == uninterrupted.dropout
    assert (first.records + resumed.records) == uninterrupted.records  # each decision made once


def test_a_checkpoint_from_before_replanning_resumes_with_its_plan(tmp_path):
    old = plan_for()
    old.start(0, 0.0)
    run_steps(old, range(1, 8))
    prefix = tf.train.Checkpoint(plan=old.state).save(str(tmp_path / "ckpt"))  # no replan/ variables
    resumed = restore_plan(prefix, budget_replan_at=0.5, dropout_by_plan=[[10, 0.1], [30, 0.3]])
    resumed.start(7, 1.75)
    run_steps(resumed, range(8, 30), seconds=slower_after_mark, clock=1.75)
    assert resumed.total_steps == PLANNED and resumed.records == []  # kept; its dropout from the plan's steps
    assert resumed.dropout == pytest.approx(0.24)


def test_the_log_says_how_far_from_the_plan_the_time_budget_stopped(caplog):
    plan = plan_for()
    plan.start(0, 0.0)
    run_steps(plan, range(1, 7))
    caplog.clear()  # the plan's own records, captured when an earlier test in this process left INFO on
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
