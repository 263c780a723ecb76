"""SIGTERM during an evaluation ends it at once; the resumed run repeats it and ends like an uninterrupted run.

In-process runs of the tiny config with early stopping, the validation BLEU scripted (the Trainer's `scorer`
hook, as in test_trainer.py). The scorer itself sends the signal, so it lands inside an evaluation whatever the
machine's speed: once in a scheduled validation (the run stops at that step with a checkpoint, without its
record), once in the final evaluation. Each time the same configuration is resumed in a new Trainer, and the chain
must match the uninterrupted reference: the same evaluation records (step, loss, BLEU), the same early stop, best/
from the same step and bit-identical final weights.

A crash (the process ends without saving anything, as after SIGKILL) in the validation of a checkpoint step must
match it too: the checkpoint of that step is written after its evaluation, so the resumed run starts from the one
before, drops the records written since (they would appear twice) and evaluates again. The crashed run directories
are copies taken inside a run at the point of the crash (`KilledHere`: what the process wrote by then, its
TensorBoard writers flushed), so no Trainer is built just to die there. When
the evaluation run again scores lower than the lost one (any resume that is not bit-exact), best/ must not keep the
lost step's weights: it holds the best of the records the run has, bit-identical to the reference's of that step.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from nmt.config import config_from_dict
from nmt.run_dir import RunDir, write_atomic
from nmt.trainer import Trainer
from tests.nmt.test_trainer import read_events
from tests.run_fixture import tiny_config_tree, write_corpus

# BLEU every 2 steps (loss at every step): best at step 4, steps 6 and 8 do not improve, patience 2 ends the run at 8.
SCRIPTED_BLEU = [10.0, 20.0, 15.0, 15.0]
FINAL_BLEU = 1.0
STOP_STEP, BEST_STEP = 8, 4
INTERRUPTED_CALL = 2  # the scorer's 2nd call: the validation at step 4
PENDING_KILLED = "pending_killed"
CRASH_CALL = 3  # the validation at step 6, a checkpoint step (checkpoint_every 3)
CRASHED = "crashed"


class Scorer:
    """Returns `scores` in order; sends SIGTERM to this process from call number `signal_at` (1-based) instead.
    `before_call` runs first on call number `before_at`."""

    def __init__(self, scores, signal_at: int | None = None, before_at: int | None = None, before_call=None):
        self.scores, self.signal_at, self.calls = list(scores), signal_at, 0
        self.before_at, self.before_call = before_at, before_call

    def __call__(self, hypotheses, references):
        self.calls += 1
        if self.calls == self.before_at:
            self.before_call()
        if self.calls == self.signal_at:
            handler = signal.getsignal(signal.SIGTERM)
            assert handler not in (signal.SIG_DFL, signal.SIG_IGN, None), (
                "no SIGTERM handler in the evaluation"
            )
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here and raises: the call never returns
            raise AssertionError("the signal did not end the evaluation")
        return {"bleu": self.scores.pop(0), "chrf": 0.0, "signature": "scripted"}


@dataclasses.dataclass
class Stage:
    status: str
    step: int
    message: str
    model: object
    latest: str  # the run's latest checkpoint once this stage returned


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("interrupted_eval")
    tree = tiny_config_tree(write_corpus(tmp / "corpus"))
    tree["data"].update(bucket_boundaries=[32], batch_tokens=256)
    tree["model"].update(d_model=16, d_ff=32, dropout=0.1)  # dropout: the RNG state must resume exactly
    tree["train"] = {
        "max_steps": 40,  # never reached: early stopping ends every run at STOP_STEP
        "precision": "float32",
        "xla": False,
        "learning_rate": 0.01,
        "warmup_steps": 4,
        "checkpoint_every": 3,  # not at the interrupted step: the stop writes its own checkpoint there
        "keep_checkpoints": 3,
        "eval_every": 1,
        "log_every": 1,  # TensorBoard's train/ scalars at every step
        "bleu_every": 2,
        "bleu_max_sentences": 3,
        "early_stopping": 2,
    }
    return tmp, config_from_dict(tree)


def train(tmp: Path, config, name: str, scorer: Scorer) -> Stage:
    run_dir = RunDir(tmp / name)
    if not run_dir.path.exists():
        run_dir.path.mkdir()
        write_atomic(run_dir.config_path, config.to_yaml())
    trainer = Trainer(config, run_dir, scorer=scorer)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NMT_DATA_CACHE", str(tmp / "data_cache"))
        trainer.setup()
        result = trainer.train()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "train() left its SIGTERM handler installed"
    latest = tf.train.latest_checkpoint(str(run_dir.checkpoint_dir))
    return Stage(result.status, result.step, result.message, trainer.model, latest)


def evaluations(run_dir: Path) -> list[tuple]:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    return [(r["step"], r["tag"], r["loss"], r.get("bleu")) for r in records if "tag" in r]


def weights(model, prefix: str) -> list[np.ndarray]:
    tf.train.Checkpoint(model=model).restore(prefix).expect_partial().assert_existing_objects_matched()
    return [w.numpy().copy() for w in model.weights]


def assert_same_best_and_final(tmp: Path, name: str, model, reference_model) -> None:
    """best/ and final/ of run `name` are from the reference's steps, with bit-identical weights."""
    for which in ("best", "final"):
        prefixes = [tf.train.latest_checkpoint(str(tmp / run / which)) for run in ("reference", name)]
        assert Path(prefixes[0]).name == Path(prefixes[1]).name
        for ours, theirs in zip(weights(model, prefixes[1]), weights(reference_model, prefixes[0])):
            np.testing.assert_array_equal(ours, theirs)


class KilledHere:
    """Within the block, `copy()` copies run directory `name` to `copy` as a process killed at that point leaves
    it: what it wrote, with its TensorBoard writers flushed (the events it had written; a crash's exception flushes
    them too). The run itself goes on, unchanged."""

    def __init__(self, tmp: Path, name: str, copy: str):
        self.tmp, self.name, self.copy_name, self.writers = tmp, name, copy, []

    def __enter__(self):
        create = tf.summary.create_file_writer
        self.patch = pytest.MonkeyPatch()
        self.patch.setattr(
            tf.summary,
            "create_file_writer",
            lambda *a, **k: self.writers.append(create(*a, **k)) or self.writers[-1],
        )
        return self

    def __exit__(self, *exc):
        self.patch.undo()
        self.writers.clear()

    def copy(self):
        assert not (self.tmp / self.copy_name).exists(), "copied twice"
        for writer in self.writers:
            writer.flush()
        shutil.copytree(self.tmp / self.name, self.tmp / self.copy_name)


@pytest.fixture(scope="module")
def runs(setup):
    tmp, config = setup
    # The start of test_a_crash_...: the reference as a process killed in step 6's validation leaves it.
    with KilledHere(tmp, "reference", CRASHED) as crash:
        scorer = Scorer([*SCRIPTED_BLEU, FINAL_BLEU], before_at=CRASH_CALL, before_call=crash.copy)
        reference = train(tmp, config, "reference", scorer)
    stages = [train(tmp, config, "chain", Scorer(SCRIPTED_BLEU, signal_at=INTERRUPTED_CALL))]
    # The validation at step 4 runs again first; the final evaluation (call 4) is interrupted. The start of
    # test_a_process_killed_after_repeating_a_pending_validation_...: the chain killed at the checkpoint that
    # follows that validation (it clears the pending mark).
    with KilledHere(tmp, "chain", PENDING_KILLED) as kill, pytest.MonkeyPatch.context() as patch:
        save = Trainer.save_checkpoint

        def save_checkpoint(self):
            if not (tmp / PENDING_KILLED).exists():
                kill.copy()
            save(self)

        patch.setattr(Trainer, "save_checkpoint", save_checkpoint)
        stages.append(train(tmp, config, "chain", Scorer(SCRIPTED_BLEU[1:], signal_at=4)))
    stages.append(train(tmp, config, "chain", Scorer([FINAL_BLEU])))
    return tmp, reference, stages


def test_a_signal_in_a_validation_stops_there_with_a_checkpoint(runs):
    tmp, _, stages = runs
    first = stages[0]
    assert first.status == "stopped"
    assert first.step == 2 * INTERRUPTED_CALL
    assert first.message == (
        "stopped by SIGTERM at step 4, during its validation; checkpoint saved, rerun the same command to resume "
        "(the validation runs again first)"
    )
    assert Path(first.latest) == tmp / "chain" / "checkpoints" / "ckpt-4"


def test_a_signal_in_the_final_evaluation_stops_it_and_the_rerun_evaluates(runs):
    tmp, _, stages = runs
    second, third = stages[1], stages[2]
    assert second.status == "stopped"
    assert second.message.startswith(f"stopped by SIGTERM at step {STOP_STEP}, during the final evaluation; ")
    assert (third.status, third.step) == ("early_stopped", STOP_STEP)  # not trained on: it had stopped early
    assert third.message.startswith("validation BLEU stopped improving")


def test_the_interrupted_chain_matches_the_uninterrupted_run(runs):
    tmp, reference, stages = runs
    assert (reference.status, reference.step) == ("early_stopped", STOP_STEP)
    expected = evaluations(tmp / "reference")
    assert [(step, tag, bleu) for step, tag, _, bleu in expected][-2:] == [
        (STOP_STEP, "validation", 15.0),
        (STOP_STEP, "final", FINAL_BLEU),
    ]
    assert evaluations(tmp / "chain") == expected  # each evaluation once, with the same loss and BLEU
    assert_same_best_and_final(tmp, "chain", stages[-1].model, reference.model)
    assert Path(tf.train.latest_checkpoint(str(tmp / "chain" / "best"))).name == f"ckpt-{BEST_STEP}"


def files_of(run_dir: Path) -> dict[Path, bytes]:
    """Every file of the run directory but TensorBoard's (a new events file per process) and its contents."""
    return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and "tensorboard" not in p.parts}


def test_a_rerun_of_the_finished_run_ends_at_once_and_writes_nothing(setup, runs):
    tmp, config = setup
    run_dir = tmp / "chain"
    before = files_of(run_dir)
    final = [
        r for r in map(json.loads, before[run_dir / "metrics.jsonl"].splitlines()) if r.get("tag") == "final"
    ]
    again = train(tmp, config, "chain", Scorer([]))  # an evaluation would pop from the empty list and fail
    assert (again.status, again.step) == ("early_stopped", STOP_STEP)
    assert again.message == (
        f"already finished at step {STOP_STEP}: validation loss {final[0]['loss']:.4f}, BLEU {FINAL_BLEU:.2f} "
        f"(first 3 of {final[0]['validation_sentences']} sentences); final weights in {run_dir / 'final'} "
        "(nothing to do)"
    )
    assert (
        files_of(run_dir) == before
    )  # no second "final" record, no new checkpoint, final/ and best/ untouched


def event_steps(run_dir: Path, name: str) -> list[int]:
    events, _ = read_events(run_dir / "tensorboard" / name)
    return sorted({step for values in events.values() for step, _ in values})


@pytest.fixture(scope="module")
def crashed(setup, runs):
    tmp, config = setup
    run_dir = tmp / CRASHED  # the reference killed in step 6's validation (`runs`)
    latest = tf.train.latest_checkpoint(str(run_dir / "checkpoints"))
    steps = [step for step, *_ in evaluations(run_dir)]
    events = {name: event_steps(run_dir, name) for name in ("train", "validation")}
    shutil.copytree(run_dir, tmp / "crashed_lower")  # resumed again below, scoring lower
    resumed = train(tmp, config, CRASHED, Scorer([*SCRIPTED_BLEU[1:], FINAL_BLEU]))
    return tmp, latest, steps, events, resumed


def test_a_crash_in_a_validation_resumes_before_it_and_matches_the_uninterrupted_run(crashed, runs):
    tmp, latest, steps_before, events_before, resumed = crashed
    _, reference, _ = runs
    # The checkpoint of step 6 waits for its validation: the crash left the one of step 3, and records after it.
    assert Path(latest).name == "ckpt-3"
    assert steps_before == [1, 2, 3, 4, 5]  # validation loss at every step (BLEU with it at 2 and 4)
    # and TensorBoard points after it (step 6's training scalars were written before its validation)
    assert events_before == {"train": [1, 2, 3, 4, 5, 6], "validation": [1, 2, 3, 4, 5]}
    assert (resumed.status, resumed.step) == ("early_stopped", STOP_STEP)
    # Steps 4 and 5 once, step 6 evaluated:
    assert evaluations(tmp / "crashed") == evaluations(tmp / "reference")
    assert_same_best_and_final(tmp, "crashed", resumed.model, reference.model)


def test_a_crash_leaves_tensorboard_as_the_uninterrupted_run(crashed, runs):
    tmp = crashed[0]
    # The lost points are in the crashed run's events (test_a_crash_in_a_validation_resumes_...).
    for name in ("train", "validation"):
        ours, _ = read_events(tmp / "crashed" / "tensorboard" / name)
        theirs, _ = read_events(tmp / "reference" / "tensorboard" / name)
        # The lost steps 4 and 5 were written by the crashed process, then removed: each step once, in order.
        assert {tag: [step for step, _ in ours[tag]] for tag in ours} == {
            tag: [step for step, _ in theirs[tag]] for tag in theirs
        }, name
    ours, _ = read_events(tmp / "crashed" / "tensorboard" / "validation")
    for tag in ("loss", "bleu"):
        assert [(s, float(v)) for s, v in ours[tag]] == [(s, float(v)) for s, v in theirs[tag]], tag


def test_after_a_crash_best_holds_the_best_the_run_still_records(setup, crashed, runs):
    tmp, config = setup
    _, reference, _ = runs
    run_dir = tmp / "crashed_lower"
    # The crashed process saved the best of step 4 (BLEU 20), then died before the checkpoint of step 6.
    assert Path(tf.train.latest_checkpoint(str(run_dir / "best"))).name == f"ckpt-{BEST_STEP}"
    # Resumed from step 3, the evaluations run again score lower: 5 at steps 4 and 6, patience 2 stops at 6.
    resumed = train(tmp, config, "crashed_lower", Scorer([5.0, 5.0, FINAL_BLEU]))
    assert (resumed.status, resumed.step) == ("early_stopped", 6)
    bleus = {step: bleu for step, tag, _, bleu in evaluations(run_dir) if tag == "validation" and bleu}
    assert bleus == {2: SCRIPTED_BLEU[0], 4: 5.0, 6: 5.0}
    best = tf.train.latest_checkpoint(str(run_dir / "best"))
    assert Path(best).name == "ckpt-2"  # the best recorded, not the lost step 4
    # Its weights: the uninterrupted run's at step 2 (kept in its best/ while its checkpoint of step 3 is).
    for ours, theirs in zip(
        weights(resumed.model, best), weights(reference.model, str(tmp / "reference" / "best" / "ckpt-2"))
    ):
        np.testing.assert_array_equal(ours, theirs)


def test_a_process_killed_after_repeating_a_pending_validation_leaves_no_second_record(setup, runs):
    """Stopped in step 4's validation (pending, checkpoint 4); the next process repeats it (its record written)
    and is killed before the checkpoint that clears the pending mark; the third resumes from checkpoint 4 and
    repeats step 4's validation once more: one record of it, as uninterrupted (before 2026-12-07: two, and two
    TensorBoard points; found by a resume review)."""
    tmp, config = setup
    name = PENDING_KILLED  # the chain's second stage, killed at its first checkpoint save (`runs`)
    assert Path(tf.train.latest_checkpoint(str(tmp / name / "checkpoints"))).name == "ckpt-4"
    assert [step for step, *_ in evaluations(tmp / name)] == [1, 2, 3, 4]  # step 4's written before the kill
    assert event_steps(tmp / name, "validation") == [1, 2, 3, 4]  # and its TensorBoard point
    resumed = train(tmp, config, name, Scorer([*SCRIPTED_BLEU[1:], FINAL_BLEU]))
    assert (resumed.status, resumed.step) == ("early_stopped", STOP_STEP)
    assert evaluations(tmp / name) == evaluations(tmp / "reference")
    events, _ = read_events(tmp / name / "tensorboard" / "validation")
    assert sorted(step for step, _ in events["loss"]) == list(range(1, STOP_STEP + 1))
