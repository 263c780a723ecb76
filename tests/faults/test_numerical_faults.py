"""NaN/Inf losses and gradients: the step is skipped, counted and logged; too many in a row stop the run.

Injected at the library level, in this process: `train.main` runs the real Trainer, whose `setup` is wrapped to
replace `step_fn.step` by the same accumulate-then-apply sequence with poison in between (a NaN written into a
gradient accumulator, or an Inf added to the accumulated loss), on chosen optimizer-step attempts. No test hook in
production code.

Plan (max_bad_steps 3): attempts 3 (NaN gradient), 7 (Inf loss) and 8 (NaN gradient: two in a row, tolerated) are
skipped and training goes on; from attempt 20 every step is poisoned, so the 4th consecutive bad step (attempt 23)
stops the run. 19 attempts - 3 skipped = step 16 reached; the last good checkpoint is step 15.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import math

import numpy as np
import pytest
import tensorflow as tf

import train as train_cli
from nmt.trainer import Trainer
from tests.faults.helpers import fault_tree, write_config

ISOLATED = {3: "nan_gradient", 7: "inf_loss", 8: "nan_gradient"}
PERSISTENT_FROM = 20
MAX_BAD_STEPS = 3
LAST_GOOD_CHECKPOINT = 15


def poison_for(attempt: int) -> str | None:
    return ISOLATED.get(attempt) or ("nan_gradient" if attempt >= PERSISTENT_FROM else None)


@pytest.fixture(scope="module")
def poisoned_run(corpus, tmp_path_factory):
    """Runs train.main with poisoned steps; returns (run dir, exit code, stderr, warnings, per-attempt events)."""
    tmp_path = tmp_path_factory.mktemp("numerical")
    tree = fault_tree(corpus)
    tree["train"].update(max_steps=40, checkpoint_every=5, max_bad_steps=MAX_BAD_STEPS)
    config = write_config(tmp_path / "nan.yaml", tree)
    run_dir = tmp_path / "run"
    events: list[dict] = []
    original_setup = Trainer.setup

    def setup(self):
        original_setup(self)
        step_fn, attempts = self.step_fn, itertools.count(1)
        variables = self.model.trainable_variables

        def poisoned_step(batches):
            attempt = next(attempts)
            for batch in batches:
                step_fn.accumulate(batch)
            poison = poison_for(attempt)
            if poison == "nan_gradient":
                accumulator = step_fn.accumulators[len(step_fn.accumulators) // 2]
                accumulator.assign(tf.fill(accumulator.shape, math.nan))
            elif poison == "inf_loss":
                step_fn.sums.assign_add([math.inf, 0.0, 0.0])
            weights_before = [v.numpy().copy() for v in variables]
            step_before = int(self.optimizer.iterations.numpy())
            metrics = step_fn.apply()
            events.append(
                {
                    "attempt": attempt,
                    "poison": poison,
                    "applied": bool(metrics["applied"].numpy()),
                    "steps_taken": int(self.optimizer.iterations.numpy()) - step_before,
                    "weights_changed": any(
                        not np.array_equal(before, v.numpy()) for before, v in zip(weights_before, variables)
                    ),
                    "skipped_total": int(step_fn.skipped_steps.numpy()),
                    "accumulators_clean": all(
                        not np.any(a.numpy()) for a in step_fn.accumulators
                    ),  # poison never leaks into the next step
                }
            )
            return metrics

        step_fn.step = poisoned_step

    handler, stderr = _ListHandler(), io.StringIO()
    logging.getLogger("nmt.train").addHandler(handler)
    Trainer.setup = setup
    try:
        with contextlib.redirect_stderr(stderr):
            code = train_cli.main(["--config", str(config), "--model-dir", str(run_dir)])
    finally:
        Trainer.setup = original_setup
        logging.getLogger("nmt.train").removeHandler(handler)
    return run_dir, code, stderr.getvalue(), handler.records, events


class _ListHandler(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def test_nonfinite_steps_are_skipped_counted_and_logged(poisoned_run):
    _, _, _, records, events = poisoned_run
    by_attempt = {e["attempt"]: e for e in events}
    for attempt, poison in ISOLATED.items():
        event = by_attempt[attempt]
        assert event["poison"] == poison
        assert not event["applied"] and event["steps_taken"] == 0 and not event["weights_changed"], event
    clean = [e for e in events if e["poison"] is None]
    assert len(clean) == PERSISTENT_FROM - 1 - len(ISOLATED)
    assert all(e["applied"] and e["steps_taken"] == 1 and e["weights_changed"] for e in clean)
    assert all(e["accumulators_clean"] for e in events)
    assert [e["skipped_total"] for e in events if e["poison"]] == list(
        range(1, len(ISOLATED) + MAX_BAD_STEPS + 2)
    )

    skipped = [
        r.getMessage() for r in records if "non-finite loss or gradient: update skipped" in r.getMessage()
    ]
    assert len(skipped) == len(ISOLATED) + MAX_BAD_STEPS + 1
    assert "(1 in a row, 1 in all" in skipped[0]
    assert "(2 in a row, 3 in all" in skipped[2]  # attempts 7 and 8: consecutive
    assert "(4 in a row, 7 in all" in skipped[-1]


def test_too_many_consecutive_bad_steps_stop_the_run_with_last_checkpoint_intact(poisoned_run):
    run_dir, code, stderr, _, events = poisoned_run
    good = run_dir / "checkpoints" / f"ckpt-{LAST_GOOD_CHECKPOINT}"
    assert code == 1  # what train.py exits with
    assert (
        f"train.py: training failed: {MAX_BAD_STEPS + 1} consecutive non-finite steps "
        f"(train.max_bad_steps={MAX_BAD_STEPS}): stopping; the last good checkpoint ({good}) is intact"
    ) in stderr
    assert events[-1]["attempt"] == PERSISTENT_FROM + MAX_BAD_STEPS  # stopped at the 4th bad step in a row
    assert tf.train.latest_checkpoint(str(run_dir / "checkpoints")) == str(good)
    assert not (run_dir / "final").exists()

    reader = tf.train.load_checkpoint(str(good))
    for key, dtype in reader.get_variable_to_dtype_map().items():
        if dtype.is_floating:
            assert np.all(np.isfinite(reader.get_tensor(key))), key
    assert int(reader.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")) == LAST_GOOD_CHECKPOINT
    assert events[-MAX_BAD_STEPS - 2]["attempt"] == PERSISTENT_FROM - 1  # the last good step was step 16
    assert int(reader.get_tensor("skipped_steps/.ATTRIBUTES/VARIABLE_VALUE")) == len(ISOLATED)  # counted
    assert int(reader.get_tensor("bad_steps/.ATTRIBUTES/VARIABLE_VALUE")) == 0
