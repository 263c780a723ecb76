"""NaN/Inf losses and gradients: the step is skipped, counted and logged; too many in a row stop the run.

Injected at the library level, in this process: `train.main` runs the real Trainer under mixed_float16 (dynamic
loss scaling) and its real `TrainStep.step` (one micro-batch: `gradients` then `update`, as production runs it).
The Trainer's `setup` is wrapped to make the model poisonable (separate embeddings, untied output projection) and
to feed chosen optimizer-step attempts a poisoned batch: the step's own forward and backward passes produce the
non-finite values. Three kinds:

* nan_input: a source token (UNK) whose embedding row is 3e38 overflows the forward pass: NaN loss and gradients.
* inf_loss: target labels UNK, whose output-projection bias is -3e38: each such label's loss is ~3e38, so the loss
  sum overflows to Inf, while the gradient (softmax - one_hot) stays finite.
* gradient_overflow: a target label BOS, whose output-projection column is 1e9 (bias -1e12): its loss (~1e12) is
  finite, its gradient at the decoder output (1e9 x loss scale / batch_tokens) overflows float16, as a batch
  whose gradients outgrow the loss scale does.

UNK and BOS are never labels of the tiny corpus's batches, nor UNK a source token (checked on every clean attempt):
their logits are ~-1e12 or less there, so their gradients are exactly zero and the huge rows stay unchanged.
No test hook in production code.

Plan (max_bad_steps 3): attempts 3 (nan_input), 7 (inf_loss) and 8 (gradient_overflow: two in a row, tolerated)
are skipped and training goes on; from attempt 20 every step is poisoned (the kinds in turn), so the 4th
consecutive bad step (attempt 23) stops the run. 19 attempts - 3 skipped = step 16 reached; the last good
checkpoint is step 15. Each skipped step halves the loss scale (2^15 at the start, growth after 2000 steps).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging

import numpy as np
import pytest
import tensorflow as tf

import train as train_cli
from nmt.train_step import INITIAL_LOSS_SCALE
from nmt.trainer import Trainer
from tests.faults.helpers import fault_tree, write_config
from transformer.vocab import BOS_ID, PAD_ID, UNK_ID

KINDS = ("nan_input", "inf_loss", "gradient_overflow")
ISOLATED = {3: "nan_input", 7: "inf_loss", 8: "gradient_overflow"}
PERSISTENT_FROM = 20
MAX_BAD_STEPS = 3
LAST_GOOD_CHECKPOINT = 15
HUGE = 3e38
# what each poison makes the real step produce: (loss non-finite, gradient non-finite)
PRODUCES = {"nan_input": (True, True), "inf_loss": (True, False), "gradient_overflow": (False, True)}


def poison_for(attempt: int) -> str | None:
    if attempt >= PERSISTENT_FROM:
        return KINDS[(attempt - PERSISTENT_FROM) % len(KINDS)]
    return ISOLATED.get(attempt)


def set_row(variable, index: int, value: float) -> None:
    """Sets `variable[index]` (a row of a table, or one entry of a vector) to `value`."""
    row = tf.fill([1, *variable.shape[1:]], value)
    variable.assign(tf.tensor_scatter_nd_update(variable, [[index]], row))


def make_poisonable(model) -> None:
    """UNK's source embedding overflows the forward pass, UNK's logit its label's loss, BOS's its label's gradient."""
    set_row(model.source_embedding.token_embedding.embeddings, UNK_ID, HUGE)
    projection = model.output_projection
    set_row(projection.bias, UNK_ID, -HUGE)
    set_row(projection.bias, BOS_ID, -1e12)
    # the kernel is (d_model, vocab): BOS's column, through a transpose
    kernel = tf.transpose(projection.kernel)
    projection.kernel.assign(
        tf.transpose(tf.tensor_scatter_nd_update(kernel, [[BOS_ID]], tf.fill([1, kernel.shape[1]], 1e9)))
    )


def poisoned_batch(batch: dict, poison: str) -> dict:
    if poison == "nan_input":
        source = batch["source"].numpy().copy()
        source[0, 0] = UNK_ID
        return dict(batch, source=tf.constant(source))
    labels = batch["target_out"].numpy().copy()
    if poison == "inf_loss":
        # every real label of the first pair: at least two (a token and EOS), ~3e38 each
        labels[0, labels[0] != PAD_ID] = UNK_ID
    else:
        # one label: its loss stays finite
        labels[0, 0] = BOS_ID
    return dict(batch, target_out=tf.constant(labels))


def nonfinite(value) -> bool:
    return not np.all(np.isfinite(value.numpy()))


@pytest.fixture(scope="module")
def poisoned_run(corpus, tmp_path_factory):
    """Runs train.main with poisoned steps; returns (run dir, exit code, stderr, warnings, per-attempt events)."""
    tmp_path = tmp_path_factory.mktemp("numerical")
    tree = fault_tree(corpus)
    # separate source/target embeddings and an output projection with a bias: the huge rows of UNK and BOS are
    # read only by the poisoned batches. No label smoothing: it would spread loss onto UNK's -3e38 logit on every
    # batch.
    tree["model"].update(share_embeddings=False, tie_output=False)
    tree["train"].update(
        max_steps=40,
        checkpoint_every=5,
        max_bad_steps=MAX_BAD_STEPS,
        label_smoothing=0.0,
        precision="mixed_float16",
    )
    config = write_config(tmp_path / "nan.yaml", tree)
    run_dir = tmp_path / "run"
    events: list[dict] = []
    original_setup = Trainer.setup

    def setup(self):
        original_setup(self)
        make_poisonable(self.model)
        step_fn, attempts = self.step_fn, itertools.count(1)
        real_step = step_fn.step
        variables = self.model.trainable_variables

        def poisoned_step(batches):
            attempt = next(attempts)
            # one micro-batch, one replica: the path production takes here
            (batch,) = batches
            poison = poison_for(attempt)
            special_in_clean = poison is None and (
                bool(np.any(batch["source"].numpy() == UNK_ID))
                or bool(np.any(np.isin(batch["target_out"].numpy(), [UNK_ID, BOS_ID])))
            )
            weights_before = [v.numpy().copy() for v in variables]
            step_before = int(self.optimizer.iterations.numpy())
            metrics = real_step([poisoned_batch(batch, poison)] if poison else batches)
            events.append(
                {
                    "attempt": attempt,
                    "poison": poison,
                    "special_in_clean": special_in_clean,
                    "loss_nonfinite": nonfinite(metrics["loss"]),
                    "grad_nonfinite": nonfinite(metrics["grad_norm"]),
                    "applied": bool(metrics["applied"].numpy()),
                    "steps_taken": int(self.optimizer.iterations.numpy()) - step_before,
                    "weights_changed": any(
                        not np.array_equal(before, v.numpy()) for before, v in zip(weights_before, variables)
                    ),
                    "weights_finite": all(np.all(np.isfinite(v.numpy())) for v in variables),
                    "skipped_total": int(step_fn.skipped_steps.numpy()),
                    "loss_scale": float(step_fn.loss_scale.numpy()),
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
    # the huge rows are read by the poisoned batches only
    assert not any(e["special_in_clean"] for e in events)
    by_attempt = {e["attempt"]: e for e in events}
    for attempt, poison in ISOLATED.items():
        event = by_attempt[attempt]
        assert event["poison"] == poison
        assert not event["applied"] and event["steps_taken"] == 0 and not event["weights_changed"], event
    for event in events:
        if event["poison"]:
            assert (event["loss_nonfinite"], event["grad_nonfinite"]) == PRODUCES[event["poison"]], event
    clean = [e for e in events if e["poison"] is None]
    assert len(clean) == PERSISTENT_FROM - 1 - len(ISOLATED)
    assert all(e["applied"] and e["steps_taken"] == 1 and e["weights_changed"] for e in clean)
    # nothing leaks into the next step
    assert not any(e["loss_nonfinite"] or e["grad_nonfinite"] for e in clean)
    assert all(e["weights_finite"] for e in events)
    # every skipped step halved the loss scale, and only those (it grows after 2000 finite steps)
    assert [e["loss_scale"] for e in events] == [INITIAL_LOSS_SCALE / 2 ** e["skipped_total"] for e in events]
    assert [e["skipped_total"] for e in events if e["poison"]] == list(
        range(1, len(ISOLATED) + MAX_BAD_STEPS + 2)
    )

    skipped = [
        r.getMessage() for r in records if "non-finite loss or gradient: update skipped" in r.getMessage()
    ]
    assert len(skipped) == len(ISOLATED) + MAX_BAD_STEPS + 1
    assert "(1 in a row, 1 in all, loss scale 16384)" in skipped[0]
    # attempts 7 and 8: consecutive
    assert "(2 in a row, 3 in all" in skipped[2]
    assert "(4 in a row, 7 in all" in skipped[-1]


def test_too_many_consecutive_bad_steps_stop_the_run_with_last_checkpoint_intact(poisoned_run):
    run_dir, code, stderr, _, events = poisoned_run
    good = run_dir / "checkpoints" / f"ckpt-{LAST_GOOD_CHECKPOINT}"
    # what train.py exits with
    assert code == 1
    assert (
        f"train.py: training failed: {MAX_BAD_STEPS + 1} consecutive non-finite steps "
        f"(train.max_bad_steps={MAX_BAD_STEPS}): stopping; the last good checkpoint ({good}) is intact"
    ) in stderr
    # stopped at the 4th bad step in a row
    assert events[-1]["attempt"] == PERSISTENT_FROM + MAX_BAD_STEPS
    assert tf.train.latest_checkpoint(str(run_dir / "checkpoints")) == str(good)
    assert not (run_dir / "final").exists()

    reader = tf.train.load_checkpoint(str(good))
    for key, dtype in reader.get_variable_to_dtype_map().items():
        if dtype.is_floating:
            assert np.all(np.isfinite(reader.get_tensor(key))), key
    assert int(reader.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")) == LAST_GOOD_CHECKPOINT
    # the last good step was step 16
    assert events[-MAX_BAD_STEPS - 2]["attempt"] == PERSISTENT_FROM - 1
    # counted
    assert int(reader.get_tensor("skipped_steps/.ATTRIBUTES/VARIABLE_VALUE")) == len(ISOLATED)
    assert int(reader.get_tensor("bad_steps/.ATTRIBUTES/VARIABLE_VALUE")) == 0
