"""The run's plan: how many optimizer steps its budget allows, and the global batch its checkpoints belong to.

Both are decided once and saved in every training checkpoint (as `plan/...` variables), so a resumed run keeps
its learning-rate schedule and averaging window (and stays exact), and a resume with another global batch is
refused. See README "Training" for the user's view.

Planned steps. With `train.max_steps` alone the plan is max_steps, made at the start; so it is with a time budget
too when max_steps comes no later than the probe's end (no plan would ever be made). With `train.max_minutes`,
each process times `budget_probe_steps` optimizer steps after skipping its first `budget_probe_skip` (tracing and
compilation), and the plan is the step count at the end of that probe plus the rest of the budget at the probed
rate (at most max_steps). Until then every schedule is the same warmup (then its peak), so the decision affects
only the steps after it; if it comes after the warmup, the decay starts where it was made. The clock is the
trainer's training clock (time in steps, not in evaluations or checkpoints); in a multi-worker run `StopControl`
gives every worker the same clock after each step, so every worker takes the same decision. The time budget and
max_steps still decide when training stops: the log says how far from the plan that was.

Re-planning. The probe's rate is that of the warmup's steps; a run's rate drifts after it (the probe of the AVX2
hour of 2026-12-04 said 0.983 steps/s, the hour then ran at 0.95, 4% fewer steps than planned, so the cosine never
reached its floor and the averaging window lost a snapshot). With `train.budget_replan_at` = f, a time budget's
plan is made once more at fraction f of the planned decay (steps decided_at + f x (total - decided_at)), from the
rate timed since fraction f/2, and the total steps become the step then plus the time left at that rate (at most
max_steps). The decay's end moves with it (the learning rate jumps by a few percent of the peak at that step, not
more for a plan a few percent off); the dropout stays the first plan's (no retrace, and a resumed run applies the
same). The mark and the new plan are checkpointed in `replan/...`, so a resumed run stays exact; a checkpoint
without them (written before re-planning existed) resumes with its plan and does not re-plan.

Planned dropout. With `train.dropout_by_plan`, the plan also fixes the model's dropout (`planned_dropout`): a run
planned for many steps over a small corpus sees it many times and needs more regularisation than one planned for
few, and a time budget's plan depends on the machine's speed. The trainer applies it when the plan is made (after
the probe, which runs at `model.dropout`) or, for a plan restored from a checkpoint or made from max_steps, before
the first step. `train.ffn_dropout_by_plan` does the same for the feed-forward hidden dropout alone (after
`dropout_by_plan`, and fixing it from then on, as `model.ffn_dropout` would): a short plan trained better without
it, a long one worse (docs/recipe-2026-12-03-zen5-ffn0).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from nmt.schedule import make_schedule, scaled_learning_rate

log = logging.getLogger("nmt.train")


def planned_dropout(points, total_steps: int) -> float | None:
    """The dropout for a run planned for `total_steps`: piecewise linear between the ``[planned steps, dropout]``
    points of `train.dropout_by_plan` (in increasing steps), flat beyond the first and the last; None without
    points or without a plan."""
    if not points or not total_steps:
        return None
    steps, rates = zip(*points, strict=True)
    return round(float(np.interp(total_steps, steps, rates)), 6)


class BatchChanged(RuntimeError):
    """A checkpoint was trained with another global batch (replicas x batch_tokens x accumulate_steps)."""


def _key(name: str, part: str = "plan") -> str:
    return f"{part}/{name}/.ATTRIBUTES/VARIABLE_VALUE"


def _variable(value, dtype, name: str) -> tf.Variable:
    return tf.Variable(value, dtype=dtype, trainable=False, name=name)


class TrainingPlan:
    """The planned number of steps and the global batch of one run; `state` goes into every checkpoint.

    Create it in the strategy's scope. Args:
      train: the `train:` config section.
      replicas: replicas in sync (all workers).
      batch_tokens: `data.batch_tokens`, the budget per replica and micro-batch.
      record: called with the decision's JSON record (the chief's metrics.jsonl), or None.
    """

    def __init__(
        self, train, replicas: int, batch_tokens: int, *, record: Callable[[dict], None] | None = None
    ):
        self.train = train
        self.record = record
        self.replicas = int(replicas)
        self.global_tokens = self.replicas * int(batch_tokens) * train.accumulate_steps
        self.reference_tokens = train.reference_batch_tokens or int(batch_tokens) * train.accumulate_steps
        self.peak = scaled_learning_rate(
            train.learning_rate, self.global_tokens, self.reference_tokens, train.learning_rate_scaling
        )
        self.state = tf.Module(name="plan")
        self.state.total_steps = _variable(0, tf.int64, "total_steps")  # 0: not decided yet
        self.state.decided_at = _variable(0, tf.int64, "decided_at")  # the step the plan was made at
        self.state.steps_per_second = _variable(0.0, tf.float64, "steps_per_second")  # the probe's (0: none)
        self.state.replicas = _variable(self.replicas, tf.int64, "replicas")
        self.state.global_tokens = _variable(self.global_tokens, tf.int64, "global_tokens")
        # The re-plan (train.budget_replan_at), a separate checkpoint part so that older checkpoints still restore.
        self.replan_state = tf.Module(name="replan")
        # first_total: the first plan's steps (they set the dropout); mark_step/mark_clock: where the re-plan's
        # timing started; replanned_at: the re-plan's step (0: not yet); steps_per_second: the re-plan's rate.
        self.replan_state.first_total = _variable(0, tf.int64, "first_total")
        self.replan_state.mark_step = _variable(0, tf.int64, "mark_step")
        self.replan_state.mark_clock = _variable(0.0, tf.float64, "mark_clock")
        self.replan_state.replanned_at = _variable(0, tf.int64, "replanned_at")
        self.replan_state.steps_per_second = _variable(0.0, tf.float64, "steps_per_second")
        self._probe: tuple[int, float] | None = None  # (step, clock) where this process' probe started
        self._probe_start = 0  # the step after which this process' probe starts
        self._replan_steps: tuple[int, int] | None = None  # (mark, re-plan) while a re-plan is pending
        log.info(
            "global batch: %d tokens per step = %d replica(s) x %d tokens x %d accumulation step(s); peak "
            "learning rate %.4g (train.learning_rate %g for %d tokens, learning_rate_scaling: %s)",
            self.global_tokens, self.replicas, batch_tokens, train.accumulate_steps, self.peak,
            train.learning_rate, self.reference_tokens, train.learning_rate_scaling,
        )  # fmt: skip

    @property
    def total_steps(self) -> int:
        """The planned number of steps (0 while undecided, or for a run with neither max_steps nor max_minutes)."""
        return int(self.state.total_steps.numpy())

    @property
    def _dropout_steps(self) -> int:
        """The first plan's steps: a re-plan leaves the dropout as it was (0 in a checkpoint without them)."""
        return int(self.replan_state.first_total.numpy()) or self.total_steps

    @property
    def dropout(self) -> float | None:
        """The plan's dropout (`planned_dropout`), None without `train.dropout_by_plan` or before the plan."""
        return planned_dropout(self.train.dropout_by_plan, self._dropout_steps)

    @property
    def ffn_dropout(self) -> float | None:
        """The plan's feed-forward dropout, None without `train.ffn_dropout_by_plan` or before the plan."""
        return planned_dropout(self.train.ffn_dropout_by_plan, self._dropout_steps)

    def apply_dropout(self, model, retrace: Callable[[], None]) -> None:
        """Gives `model` (a `transformer.model.Transformer`) the plan's dropout and feed-forward dropout once the
        plan is known, and calls `retrace` (the training step bakes the rates into its trace) if that changed one."""
        changed = False
        rate = self.dropout
        if rate is not None and rate != model.dropout:
            log.info(
                "dropout %g -> %g for a plan of %d steps (train.dropout_by_plan)",
                model.dropout, rate, self._dropout_steps,
            )  # fmt: skip
            model.set_dropout(rate)
            changed = True
        ffn = self.ffn_dropout
        if ffn is not None:
            current = model.dropout if model.ffn_dropout is None else model.ffn_dropout
            if ffn != current:
                log.info(
                    "feed-forward dropout %g -> %g for a plan of %d steps (train.ffn_dropout_by_plan)",
                    current, ffn, self._dropout_steps,
                )  # fmt: skip
                changed = True
            model.set_ffn_dropout(ffn)  # even at the same rate: fixed, set_dropout leaves it from now on
        if changed:
            retrace()

    def schedule(self):
        t = self.train
        return make_schedule(
            t.schedule, self.peak, t.warmup_steps, floor=t.min_learning_rate_fraction,
            total_steps=self.state.total_steps, decided_at=self.state.decided_at,
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------------------------
    # Resuming
    def restorable(self, prefix: str, objects: dict) -> dict:
        """The parts of `objects` (name -> trackable) to restore from checkpoint `prefix`.

        Raises BatchChanged if it was trained with another replica count or global batch, unless
        `train.allow_batch_change`; then the data-iterator position is not restored (it belongs to other batches).
        A checkpoint written before the plan existed restores without it (nothing to compare).
        """
        reader = tf.train.load_checkpoint(prefix)
        if not reader.has_tensor(_key("first_total", "replan")):  # written before re-planning existed
            objects = {name: part for name, part in objects.items() if name != "replan"}
        if not reader.has_tensor(_key("replicas")):
            log.info("%s holds no plan (an older checkpoint): the global batch is not checked", prefix)
            return {name: part for name, part in objects.items() if name != "plan"}
        replicas = int(reader.get_tensor(_key("replicas")))
        tokens = int(reader.get_tensor(_key("global_tokens")))
        if (replicas, tokens) == (self.replicas, self.global_tokens):
            return objects
        change = (
            f"{prefix} was trained with a global batch of {tokens} tokens on {replicas} replica(s); this run has "
            f"{self.global_tokens} tokens on {self.replicas} replica(s)"
        )
        if not self.train.allow_batch_change:
            raise BatchChanged(
                f"{change}. Resuming would change the learning rate and the data order: resume with the original "
                "devices, train.distribute and train.accumulate_steps, or pass --set train.allow_batch_change=true "
                "to go on with the new batch (the data order then restarts from the seed)"
            )
        log.warning("%s: going on with the new batch (train.allow_batch_change); data order restarts", change)
        return {name: part for name, part in objects.items() if name != "iterator"}

    def start(self, step: int, clock: float) -> None:
        """After the restore (at `step`, training clock `clock`): keeps a restored plan, else plans from max_steps
        or sets up the step-rate probe."""
        t = self.train
        self.state.replicas.assign(self.replicas)
        self.state.global_tokens.assign(self.global_tokens)
        total = self.total_steps
        if total:
            replanned = int(self.replan_state.replanned_at.numpy())
            log.info(
                "plan: %d steps (decided at step %d%s%s), kept from the checkpoint", total,
                int(self.state.decided_at.numpy()), self._rate_text(),
                f", re-planned at step {replanned}" if replanned else "",
            )  # fmt: skip
            if t.max_steps and not t.max_minutes and t.max_steps != total and t.schedule != "inverse_sqrt":
                log.warning(
                    "train.max_steps is %d but the run was planned for %d steps: the %s decay keeps its plan "
                    "(the learning rate stays at its floor after step %d)", t.max_steps, total, t.schedule, total,
                )  # fmt: skip
        elif t.max_minutes and t.max_steps and t.max_steps <= (probe_end := self._probe_end(step)):
            # The probe would end at or after max_steps: no plan would ever be made (no decay, no planned dropout).
            log.info(
                "train.max_steps %d ends the run before the step-rate probe could (at step %d): planning from "
                "max_steps", t.max_steps, probe_end,
            )  # fmt: skip
            self._decide(t.max_steps, at=0, rate=0.0)
        elif t.max_minutes:
            self._probe_start = step + t.budget_probe_skip
            self._probe = (step, clock) if t.budget_probe_skip == 0 else None
            log.info(
                "time budget %g minutes of training steps: the steps are planned once the step rate is measured "
                "(steps %d-%d; no total or ETA before)", t.max_minutes, self._probe_start + 1, self._probe_end(step),
            )  # fmt: skip
        elif t.max_steps:
            self._decide(t.max_steps, at=0, rate=0.0)
        self._replan_steps = self._pending_replan()

    def _probe_end(self, step: int) -> int:
        """The step at which a probe that starts in a process resumed at `step` decides."""
        return step + self.train.budget_probe_skip + self.train.budget_probe_steps

    # ------------------------------------------------------------------------------------------------------------
    # The time budget
    def after_step(self, step: int, clock: float) -> bool:
        """Called after every applied step with the training clock (seconds, the same on every worker); returns
        whether the planned steps changed (the first plan, or the re-plan)."""
        if not self.train.max_minutes:
            return False
        if self._replan_steps:
            return self._replan_if_due(step, clock)
        if self.total_steps:
            return False
        if step == self._probe_start:
            self._probe = (step, clock)
        elif self._probe and step == self._probe[0] + self.train.budget_probe_steps:
            rate = (step - self._probe[0]) / max(clock - self._probe[1], 1e-9)
            self._decide(self._total_at(step, clock, rate), at=step, rate=rate, clock=clock)
            self._replan_steps = self._pending_replan()
            return True
        return False

    def _total_at(self, step: int, clock: float, rate: float) -> int:
        """The steps the budget allows: `step` plus the time left at `rate`, at most max_steps."""
        total = step + int(max(self.train.max_minutes * 60 - clock, 0.0) * rate)
        return min(total, self.train.max_steps) if self.train.max_steps else total

    def _pending_replan(self) -> tuple[int, int] | None:
        """(mark, re-plan): the steps at fractions f/2 and f of the first plan's decay; None when there is nothing
        to re-plan (off, done, a plan from max_steps, a checkpoint from before re-planning)."""
        fraction, first = self.train.budget_replan_at, int(self.replan_state.first_total.numpy())
        if not (fraction and first and float(self.state.steps_per_second.numpy())):
            return None
        if int(self.replan_state.replanned_at.numpy()):
            return None
        start = int(self.state.decided_at.numpy())
        span = first - start
        mark, replan = start + round(span * fraction / 2), start + round(span * fraction)
        return (mark, replan) if replan > mark else None

    def _replan_if_due(self, step: int, clock: float) -> bool:
        (mark, replan), state = self._replan_steps, self.replan_state
        marked = int(state.mark_step.numpy())
        if not marked:
            if step >= mark:
                state.mark_step.assign(step)
                state.mark_clock.assign(clock)
            return False
        if step < replan or step == marked:
            return False
        rate = (step - marked) / max(clock - float(state.mark_clock.numpy()), 1e-9)
        total, before = self._total_at(step, clock, rate), self.total_steps
        left = max(self.train.max_minutes * 60 - clock, 0.0)
        self.state.total_steps.assign(max(total, 1))
        state.replanned_at.assign(step)
        state.steps_per_second.assign(rate)
        self._replan_steps = None
        log.info(
            "re-plan at step %d: %d steps (was %d) for the %g-minute budget: %.4g steps/s over steps %d-%d, %.1f s "
            "of training clock left", step, total, before, self.train.max_minutes, rate, marked + 1, step, left,
        )  # fmt: skip
        if self.record is not None:
            self.record({
                "tag": "replan", "step": step, "total_steps": total, "previous_total_steps": before,
                "steps_per_second": rate, "elapsed_seconds": clock, "budget_seconds": self.train.max_minutes * 60,
                "max_steps": self.train.max_steps,
            })  # fmt: skip
        return True

    def _decide(self, total: int, *, at: int, rate: float, clock: float = 0.0) -> None:
        self.state.total_steps.assign(max(total, 1))
        self.replan_state.first_total.assign(max(total, 1))
        self.state.decided_at.assign(at)
        self.state.steps_per_second.assign(rate)
        t = self.train
        if rate:
            log.info(
                "plan: %d steps for the %g-minute budget%s: %.4g steps/s over steps %d-%d, %.1f s of training "
                "clock left at step %d", total, t.max_minutes,
                f" (max_steps {t.max_steps})" if t.max_steps and total == t.max_steps else "",
                rate, self._probe[0] + 1, at, t.max_minutes * 60 - clock, at,
            )  # fmt: skip
        else:
            log.info("plan: %d steps (train.max_steps)", total)
        if total <= t.warmup_steps:  # a smoke run of a few steps, or a budget too small for the warmup
            # a share of the peak the warmup climbs to: train.learning_rate, or another with learning_rate_scaling
            scaled = ""
            if self.peak != t.learning_rate:
                scaled = f" (train.learning_rate {t.learning_rate:g} scaled for the global batch: "
                scaled += f"learning_rate_scaling {t.learning_rate_scaling})"
            log.warning(
                "train.warmup_steps %d >= the %d steps planned: the learning rate stops at %.2g%% of the peak "
                "learning rate %.4g%s, before the peak and any decay", t.warmup_steps, total,
                100 * total / max(t.warmup_steps, 1), self.peak, scaled,
            )  # fmt: skip
        if self.record is not None and rate:
            record = {
                "tag": "plan", "step": at, "total_steps": total, "steps_per_second": rate,
                "elapsed_seconds": clock, "budget_seconds": t.max_minutes * 60, "max_steps": t.max_steps,
                "schedule": t.schedule, "global_batch_tokens": self.global_tokens,
            }  # fmt: skip
            if self.dropout is not None:
                record["dropout"] = self.dropout
            if self.ffn_dropout is not None:
                record["ffn_dropout"] = self.ffn_dropout
            self.record(record)

    def _rate_text(self) -> str:
        rate = float(self.state.steps_per_second.numpy())
        return f", {rate:.4g} steps/s measured" if rate else ""

    def report_end(self, step: int, *, out_of_time: bool) -> None:
        """Logs how far from the plan the time budget stopped the run (time stays the authority)."""
        total = self.total_steps
        if not (out_of_time and total):
            if out_of_time and self.train.max_minutes:
                log.warning("the time budget ran out at step %d, before the step-rate probe ended", step)
            return
        if step == total:
            log.info("the time budget ended the run at step %d, as planned", step)
            return
        rate = float(self.replan_state.steps_per_second.numpy() or self.state.steps_per_second.numpy())
        log.warning(
            "the time budget ended the run at step %d, %d steps %s the planned %d (planned from %.4g steps/s%s)",
            step, abs(total - step), "before" if step < total else "after", total, rate,
            "; the learning rate stayed at its floor after the plan" if step > total and self.train.schedule
            != "inverse_sqrt" else "",
        )  # fmt: skip
