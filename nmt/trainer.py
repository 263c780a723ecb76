"""The training loop: a config and a run directory in, a trained, evaluated run directory out.

Resumable at the exact batch (step, model, optimizer, loss scale, dropout RNG, data-iterator state and the run's
plan, nmt.budget, are in every checkpoint), stoppable with SIGINT/SIGTERM (a checkpoint is saved and the process
exits 0), and observable (progress bar, TensorBoard, metrics.jsonl). See README "Training" for the user's view. In
a multi-worker run every worker restores the chief's latest checkpoint, and all workers stop after the same step
(nmt.distribute). Restoring and saving checkpoints (`nmt.trainer_checkpoints`) and the evaluations
(`nmt.trainer_evaluation`) are base classes of `Trainer`, split off by concern.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

import keras
import tensorflow as tf
from tqdm import tqdm

from nmt.best_weights import BestWeights
from nmt.budget import TrainingPlan
from nmt.checkpoints import TrainingCheckpoints, checkpoint_step, repair_checkpoint_state
from nmt.cluster import is_chief
from nmt.config import Config
from nmt.distribute import StopControl, WorkersDisagree, make_strategy, replica_batches
from nmt.final_weights import AveragingSnapshots
from nmt.optimizer import adam
from nmt.precision import device_kind, resolve_autocluster, resolve_precision, resolve_xla, set_policy
from nmt.progress import bar_file, bar_interval, train_bar_total
from nmt.run_dir import RunDir, RunDirError
from nmt.summaries import drop_events_after, write_train_summaries
from nmt.train_step import TrainStep
from nmt.trainer_checkpoints import TrainerCheckpoints, TrainingError
from nmt.trainer_data import iterator_kind, training_data
from nmt.trainer_evaluation import TrainerEvaluation
from nmt.worker_scratch import private_directory

log = logging.getLogger("nmt.train")


@dataclasses.dataclass
class TrainResult:
    status: str  # "done", "stopped" (signal) or "early_stopped"
    step: int
    resumed_from: int
    message: str


class Trainer(TrainerCheckpoints, TrainerEvaluation):
    """Trains `config` into `run_dir`: `setup()`, then `train()`.

    `scorer(hypotheses, references) -> {"bleu", "chrf", "signature"}` scores the validation translations
    (default: sacreBLEU, `nmt.scores.score_corpus`, for the target language); the best-weights and
    early-stopping bookkeeping follow its "bleu". `clock()` (seconds) times the steps for the training clock.
    """

    def __init__(
        self, config: Config, run_dir: RunDir, *, scorer: Callable | None = None, clock=time.perf_counter
    ):
        self.config = config
        self.run_dir = run_dir
        self.scorer = scorer
        self.clock = clock
        self._writers = {}  # evaluation tag (validation, final) -> its TensorBoard writer, one per process

    # ------------------------------------------------------------------------------------------------------------
    # Set-up
    def setup(self) -> None:
        from nmt.init_from import load_parent_weights, parent_run
        from transformer.model import build_model

        cfg = self.config
        self.strategy = make_strategy(cfg.train.distribute, cfg.train.cluster_wait_minutes)
        self.chief = is_chief(cfg.train.distribute)
        # train.py writes DIR/config.yaml before training: if it goes, DIR was removed under the running process
        self.watch_config = self.chief and self.run_dir.exists()
        self.stop = StopControl(self.strategy)  # signals and time budget (decided by all workers together)
        device = device_kind(self.strategy)
        self.precision = resolve_precision(cfg.train.precision, device)
        try:  # workers started with other settings (or resolving precision: auto otherwise) are refused first
            self.stop.check_same_config(cfg.fingerprint(), cfg.train.cluster_wait_minutes, self.precision)
        except WorkersDisagree as err:
            raise TrainingError(str(err)) from None
        local = 1 if cfg.train.distribute == "none" else len(self.strategy.extended.worker_devices)
        self.xla = resolve_xla(cfg.train.xla, device, local)
        self.autocluster = resolve_autocluster(cfg.train.xla)
        set_policy(self.precision)
        keras.utils.set_random_seed(cfg.train.seed)
        log.info(
            "device %s, %d replica(s), precision %s, XLA %s",
            device, self.strategy.num_replicas_in_sync, self.precision,
            "on" if self.xla else "fusible ops only (matmuls stay TensorFlow's)" if self.autocluster else "off",
        )  # fmt: skip

        # TensorFlow's multi-worker convention: non-chief workers write nothing into the run directory (they save
        # throw-away checkpoints into a private temporary directory, removed at exit; those of killed workers at the
        # next worker's start, nmt.worker_scratch) but restore the chief's.
        self.private_dir = None if self.chief else private_directory()
        try:
            data = training_data(cfg, self.run_dir, self.strategy, self.stop, self.chief)
        except WorkersDisagree as err:
            raise TrainingError(str(err)) from None
        self.tokenizer, self.part, self.train_record = data.tokenizer, data.part, data.train_record
        self.train_dataset, self.eval_dataset, self.iterator = data.train, data.validation, data.iterator
        replicas = self.strategy.num_replicas_in_sync

        with self.strategy.scope():
            self.model = build_model(
                cfg.model, self.tokenizer.source_vocab_size, self.tokenizer.target_vocab_size
            )
            record = self.run_dir.append_metrics if self.chief else None  # the plan's record in metrics.jsonl
            self.plan = TrainingPlan(cfg.train, replicas, cfg.data.batch_tokens, record=record)
            self.schedule = self.plan.schedule()
            self.optimizer = adam(cfg.train, self.schedule)
            self.optimizer.build(self.model.trainable_variables)
            self.step_fn = TrainStep(
                model=self.model,
                optimizer=self.optimizer,
                strategy=self.strategy,
                label_smoothing=cfg.train.label_smoothing,
                clipnorm=cfg.train.clipnorm,
                loss_scaling=self.precision == "mixed_float16",
                jit_compile=self.xla,
                loss_normaliser=cfg.data.batch_tokens,
                autocluster=self.autocluster,
            )
            log.info("C++ kernels: %s", self.step_fn.kernels_in_use())
            self.elapsed = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="elapsed_seconds")
            self.best_bleu = tf.Variable(-1.0, dtype=tf.float64, trainable=False, name="best_bleu")
            self.evals_since_best = tf.Variable(0, dtype=tf.int64, trainable=False, name="evals_since_best")
            # The step whose evaluation a signal ended (0: none): a resumed run evaluates it before training on.
            self.pending_evaluation = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="pending_evaluation"
            )
        state = dict(
            model=self.model,
            optimizer=self.optimizer,
            iterator=self.iterator,
            elapsed=self.elapsed,
            best_bleu=self.best_bleu,
            evals_since_best=self.evals_since_best,
            pending_evaluation=self.pending_evaluation,
            plan=self.plan.state,
            replan=self.plan.replan_state,
            iterator_kind=iterator_kind(self.part),
            **self.step_fn.checkpoint_state(),
        )
        # Dropout RNG: Keras SeedGenerator states are in `model.variables` but not in the model's checkpoint
        # dependencies; without them a resumed run draws the dropout masks of step 1 again (not exact).
        weight_ids = {id(w) for w in self.model.weights}
        self.rng_state = [v for v in self.model.variables if id(v) not in weight_ids]
        self.checkpoint_parts = dict(state, rng_state=self.rng_state)
        self.checkpoint = tf.train.Checkpoint(**self.checkpoint_parts)
        checkpoint_dir = self.run_dir.checkpoint_dir if self.chief else self.private_dir / "checkpoints"
        if self.chief:  # a state file lost or damaged: rewritten from the complete checkpoints there
            for directory in (
                checkpoint_dir,
                checkpoint_dir / "average",
                self.run_dir.best_dir,
                self.run_dir.final_dir,
            ):
                if repaired := repair_checkpoint_state(directory):
                    log.warning("%s", repaired)
        self.manager = TrainingCheckpoints(  # a stop's off-grid checkpoint kept beside the grid's (nmt.checkpoints)
            self.checkpoint, checkpoint_dir, keep=max(cfg.train.keep_checkpoints, cfg.train.average_last, 1),
            every=cfg.train.checkpoint_every,
        )  # fmt: skip
        self.snapshots = AveragingSnapshots(self.model, checkpoint_dir / "average", cfg.train)
        self.best = BestWeights(self.model, self.run_dir.best_dir)
        self.resumed_from = self._restore()
        if cfg.train.init_from and not self.resumed_from:  # a resumed run has its own weights
            load_parent_weights(self.model, *parent_run(cfg, self.run_dir))
        snapshots = self.snapshots.roll_back(self.resumed_from)
        if self.chief:  # what steps the checkpoint does not hold wrote: those steps and evaluations run again
            # A pending evaluation of the checkpoint's step runs again: what a process killed during or after it
            # (before its next checkpoint) wrote of it goes too.
            pending = int(self.pending_evaluation.numpy())
            redone = pending if pending and pending == self.resumed_from else None
            dropped = self.run_dir.drop_metrics_after(self.resumed_from, validation_at=redone)
            events = drop_events_after(self.run_dir.tensorboard_dir, self.resumed_from)
            if redone:
                events += drop_events_after(self.run_dir.tensorboard_dir / "validation", redone - 1)
            best = self.best.roll_back(self.resumed_from)
            if dropped or events or best or snapshots:
                log.info(
                    "removed what training lost with its process (not checkpointed) wrote after step %d: %d "
                    "record(s) of %s, %d TensorBoard event(s), best/ of step(s) %s, averaging snapshot(s) of "
                    "step(s) %s; those steps run again", self.resumed_from, dropped, self.run_dir.metrics_path.name,
                    events, best or "-", snapshots or "-",
                )  # fmt: skip
        self.plan.start(self.resumed_from, float(self.elapsed.numpy()))
        self.plan.apply_dropout(self.model, self.step_fn.retrace)

    # ------------------------------------------------------------------------------------------------------------
    # The loop
    @property
    def step(self) -> int:
        return int(self.optimizer.iterations.numpy())

    def _budget_left(self) -> bool:
        cfg = self.config.train
        if cfg.max_steps and self.step >= cfg.max_steps:
            return False
        return self.stop.time_left(self._time_up())

    def _time_up(self) -> bool:
        minutes = self.config.train.max_minutes
        return bool(minutes and self.elapsed.numpy() >= minutes * 60)

    def _agree_on_stop(self) -> None:
        """Multi-worker: one stop decision for all workers (a collective, see StopControl.agree)."""
        if self.stop.multi_worker:
            self.elapsed.assign(self.stop.agree(float(self.elapsed.numpy()), self._time_up(), self.step))

    def train(self) -> TrainResult:
        """Trains to the budget, a signal or early stopping; then writes DIR/final and evaluates it.

        SIGINT/SIGTERM stop after the step in progress, or at once during an evaluation (a single process):
        either way a checkpoint is saved and the same command resumes exactly (an interrupted evaluation first).
        """
        if message := self.already_finished():  # a rerun of a finished run: nothing to train or evaluate
            status = "early_stopped" if self._patience_spent() else "done"
            return TrainResult(status, self.step, self.resumed_from, message)
        previous = self.stop.install()
        try:
            status, message = self._train_steps()
            latest = self.manager.latest_checkpoint
            if not latest or checkpoint_step(latest) != self.step:  # the loop's own save at this step stands
                self.save_checkpoint()
            self.plan.report_end(self.step, out_of_time=not self.stop.time_left(self._time_up()))
            if status in ("done", "early_stopped"):
                status, message = self._final_evaluation(status, message)
        finally:
            self.stop.uninstall(previous)
        log.info("training compiled the step %d time(s) (bucketed shapes)", self.step_fn.num_traces)
        return TrainResult(status, self.step, self.resumed_from, message)

    def _train_steps(self) -> tuple[str, str]:
        """The loop; returns its status ("done", "stopped" or "early_stopped") and a message (may be empty)."""
        cfg = self.config.train
        writer = (
            tf.summary.create_file_writer(str(self.run_dir.tensorboard_dir / "train")) if self.chief else None
        )
        planned = self.plan.total_steps  # 0 until a time budget's plan is fixed (then the bar's total)
        self.progress = bar = tqdm(
            total=train_bar_total(cfg, planned, self.step), initial=self.step, unit="step", dynamic_ncols=True,
            desc="train",
            # in a log file, a line every LOG_INTERVAL seconds instead of carriage returns (nmt.progress)
            file=bar_file(), mininterval=bar_interval(terminal=2.0),
            smoothing=0, disable=not self.chief,  # smoothing 0: the speed (so the ETA) of the whole process
        )  # fmt: skip
        status, message = "", ""
        # tokens/s over the training steps since the last logged one: evaluations and checkpoint saves are not in
        # the window. Step 1's (the trace) is left out of TensorBoard; a resumed process's first window is written
        # (with its trace), so an interrupted run's events are at the steps of the uninterrupted run's
        window_tokens, window_seconds, traced_window = 0.0, 0.0, self.step == 0
        # loss and nll summed per target token over the window's applied steps: the logged loss is the window's
        # token-weighted mean (as fairseq and OpenNMT-tf log it), not one batch's
        window_loss, window_nll = 0.0, 0.0
        # the progress bar shows no tokens/s for the first window (a resumed process' trace is in it too)
        first_window = True
        try:
            if self._patience_spent():  # stopped early, then interrupted in its final evaluation
                status, message = "early_stopped", "validation BLEU stopped improving"
            elif (pending := int(self.pending_evaluation.numpy())) and pending == self.step:
                log.info("step %d: its validation was interrupted; running it before training on", pending)
                status, message = self._evaluate_at(pending)
                # done: checkpointed without its pending mark (a rerun of a run it ended must not repeat it)
                if not int(self.pending_evaluation.numpy()):
                    self.save_checkpoint()
            self._agree_on_stop()
            while not status and self._budget_left():
                if self.stop.requested():
                    status, message = "stopped", self._stop_message()
                    break
                self.stop.step_in_progress = self.step + 1
                started, wall = self.clock(), time.perf_counter()
                batches = [
                    replica_batches(self.strategy, next(self.iterator), self.part)
                    for _ in range(cfg.accumulate_steps)
                ]
                metrics = self.step_fn.step(batches)
                applied = bool(metrics["applied"].numpy())
                self.elapsed.assign_add(self.clock() - started)
                window_seconds += time.perf_counter() - wall
                self._agree_on_stop()
                step = self.step
                if not applied:
                    bad = int(self.step_fn.bad_steps.numpy())
                    log.warning(
                        "non-finite loss or gradient: update skipped (%d in a row, %d in all, loss scale %g)",
                        bad,
                        int(self.step_fn.skipped_steps.numpy()),
                        float(metrics["loss_scale"].numpy()),
                    )
                    if bad > cfg.max_bad_steps:
                        raise TrainingError(
                            f"{bad} consecutive non-finite steps (train.max_bad_steps={cfg.max_bad_steps}): "
                            f"stopping; the last good checkpoint ({self.manager.latest_checkpoint}) is intact"
                        )
                    continue
                tokens = float(metrics["tokens"].numpy())
                window_tokens += tokens
                window_loss += float(metrics["loss"].numpy()) * tokens
                window_nll += float(metrics["nll"].numpy()) * tokens
                bar.update(1)
                if step % cfg.log_every == 0 or step == 1:
                    tokens_per_sec = window_tokens / max(window_seconds, 1e-9)
                    logged_rate = None if traced_window else tokens_per_sec
                    shown_rate = None if first_window else tokens_per_sec  # the first has this process' trace
                    counted = max(window_tokens, 1.0)  # as the step's own mean (nmt.train_step)
                    means = {"loss": window_loss / counted, "nll": window_nll / counted}
                    window_tokens, window_seconds, traced_window, first_window = 0.0, 0.0, False, False
                    window_loss, window_nll = 0.0, 0.0
                    lr = float(self.schedule(step - 1))
                    loss = means["loss"]
                    rate = {} if shown_rate is None else {"tok_s": f"{shown_rate:,.0f}"}
                    bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", **rate)
                    if writer is not None:
                        write_train_summaries(
                            writer, step, {**metrics, **means}, lr, logged_rate, self.step_fn.skipped_steps,
                            self.step_fn.layer_grad_norms(metrics),  # grouped only on logged steps
                        )  # fmt: skip
                # After the step's log: its learning rate is the one its update used, before a (re-)plan moves it.
                if self.plan.after_step(step, float(self.elapsed.numpy())):  # the plan, or a re-plan
                    first = not planned
                    planned = self.plan.total_steps
                    bar.total = train_bar_total(cfg, planned, self.step)
                    if first:
                        self.plan.apply_dropout(self.model, self.step_fn.retrace)
                self.snapshots.save_if_due(step, planned)
                # The last step's too (max_steps): its weights compete for best/ and its points end the curves;
                # not when the time budget ran out (no time) or a signal came (the final evaluation is skipped too).
                if self._evaluations_due(step)[0] and self.stop.time_left(self._time_up()):
                    status, message = self._evaluate_at(step)
                # After the step's evaluation: a checkpoint at step N includes N's evaluation (best BLEU, early
                # stopping), and a process killed before it resumes from an earlier one and evaluates N again.
                # A status ends the loop, and train() saves the checkpoint.
                if not status and step % cfg.checkpoint_every == 0:
                    self.save_checkpoint()
        finally:
            bar.close()
            if writer is not None:
                writer.flush()
        return status or "done", message

    def _stop_message(self) -> str:
        return (
            f"stopped by {self.stop.signal_name()} at step {self.step}; checkpoint saved, rerun the same command "
            "to resume"
        )


__all__ = ["Trainer", "TrainResult", "TrainingError", "RunDirError"]
