"""The trainer's evaluations: the scheduled ones (best/, early stopping), the final weights and their evaluation.

A part of `nmt.trainer.Trainer` (a base class of it), split off by concern: it uses the trainer's config,
run_dir, model, tokenizer, eval_dataset, optimizer, step, stop (signals), snapshots, best (best/), manager and the
checkpointed best_bleu, evals_since_best and pending_evaluation. A signal during an evaluation ends it at once
(`StopControl.interruptible`, a single process); the step it belonged to is checkpointed as pending, and the
resumed run evaluates it before training on, so the run's records and early stopping match an uninterrupted run.
"""

from __future__ import annotations

import logging
import math
import sys

import tensorflow as tf
from tqdm import tqdm

from nmt.checkpoints import save_model_weights
from nmt.collectives import gather_from_workers
from nmt.distribute import EvaluationInterrupted
from nmt.final_weights import average_if_better
from nmt.run_dir import finished_line, latest_checkpoint
from nmt.summaries import write_validation_summaries

log = logging.getLogger("nmt.train")


class TrainerEvaluation:
    """Evaluation methods of the Trainer (see the module docstring for the attributes they use)."""

    def _evaluations_due(self, step: int) -> tuple[bool, bool]:
        """(validation loss, greedy BLEU) due after `step`: every train.eval_every / bleu_every steps, and at
        train.max_steps, the last step (its weights compete for best/, its points end the curves)."""
        cfg = self.config.train
        last = bool(cfg.max_steps) and step == cfg.max_steps
        eval_due = bool(cfg.eval_every) and (step % cfg.eval_every == 0 or last)
        bleu_due = bool(cfg.bleu_every) and (step % cfg.bleu_every == 0 or last)
        return eval_due or bleu_due, bleu_due

    def _evaluate_at(self, step: int) -> tuple[str, str]:
        """The evaluation due at `step`; returns ("", "") or the status and message that end the run."""
        try:
            record = self.evaluate(with_bleu=self._evaluations_due(step)[1])
        except EvaluationInterrupted:  # the checkpoint saved next says so; the resumed run evaluates first
            self.pending_evaluation.assign(step)
            return "stopped", (
                f"stopped by {self.stop.signal_name()} at step {step}, during its validation; checkpoint saved, "
                "rerun the same command to resume (the validation runs again first)"
            )
        self.pending_evaluation.assign(0)
        if self._early_stop(record):
            return "early_stopped", "validation BLEU stopped improving"
        return "", ""

    def _final_evaluation(self, status: str, message: str) -> tuple[str, str]:
        """Writes DIR/final and evaluates it; a signal ends the evaluation (the rerun resumes and repeats both)."""
        if self.stop.requested():
            return "stopped", self._stop_message()
        self._finalize()
        try:
            record = self.evaluate(with_bleu=bool(self.config.train.bleu_every), tag="final")
        except EvaluationInterrupted:
            return "stopped", (
                f"stopped by {self.stop.signal_name()} at step {self.step}, during the final evaluation; "
                f"{self.run_dir.final_dir} holds the final weights, rerun the same command to evaluate them"
            )
        scores = f"validation loss {record['loss']:.4f}"
        if "bleu" in record:
            scores += f", BLEU {record['bleu']:.2f}"
            # as the step line says it: the BLEU of train.bleu_max_sentences sentences, the loss of them all
            if record["bleu_sentences"] < record["validation_sentences"]:
                scores += f" (first {record['bleu_sentences']} of {record['validation_sentences']} sentences)"
        if (
            status == "early_stopped"
        ):  # the final weights' scores, not the validation BLEU that stopped the run
            message = (
                f"{message} (best {float(self.best_bleu.numpy()):.2f}, then {self.config.train.early_stopping} "
                f"evaluations without a better one): stopped at step {self.step}; final weights: {scores}"
            )
        else:
            message = message or f"finished at step {self.step}: {scores}"
        # The chief alone makes final/ (EMA, average): another worker scored its own last weights.
        if not self.chief:
            message += (
                f" (this worker's last weights; the final weights and their scores: {self.run_dir.path})"
            )
        return status, message

    def already_finished(self) -> str:
        """The message of a run that wrote and evaluated its final weights at this step, else "".

        Its rerun (the same command again) ends there instead of evaluating the same weights again and appending a
        second "final" record. The workers of a multi-worker run (which read the chief's run directory) decide
        together, in a collective: all of them end there, or none.
        """
        if not self.stop.multi_worker:
            return self._finished_message()
        self._agree_on_stop()  # whether the time budget is spent, on the clocks of all workers (a collective)
        message = self._finished_message()
        return message if gather_from_workers(self.strategy, [float(bool(message))]).all() else ""

    def _finished_message(self) -> str:
        if not self.resumed_from or int(self.pending_evaluation.numpy()):
            return ""
        if self._budget_left() and not self._patience_spent():
            return ""
        latest = latest_checkpoint(self.run_dir.final_dir)
        if not latest or latest.rsplit("-", 1)[-1] != str(self.step):
            return ""
        records = [
            r for r in self.run_dir.read_metrics() if r.get("tag") == "final" and r.get("step") == self.step
        ]
        if not records:  # the final evaluation was interrupted: the rerun evaluates
            return ""
        return finished_line(records[-1], self.run_dir.final_dir)

    def evaluate(self, *, with_bleu: bool, tag: str = "validation") -> dict:
        from nmt.translator import validation_loss

        # A signal ends the computation at once (EvaluationInterrupted): nothing has been written yet.
        with self.stop.interruptible():
            loss, tokens = validation_loss(self.model, self.eval_dataset)
            if with_bleu:
                scores = self._validation_bleu()
        if with_bleu and tag != "final" and self.stop.multi_worker:
            scores = self._chiefs_scores(scores)
        record = {
            "step": self.step,
            "split": self.config.data.validation_split,
            "tag": tag,
            "loss": loss,
            "perplexity": math.exp(min(loss, 50.0)),
            "tokens": tokens,
            "elapsed_seconds": float(self.elapsed.numpy()),
        }
        if with_bleu:
            record.update(bleu=scores["bleu"], chrf=scores["chrf"], bleu_signature=scores["signature"])
            # train.bleu_max_sentences: a BLEU of the first N sentences only, said in the record and the line
            record.update(bleu_sentences=scores["sentences"], validation_sentences=scores["of"])
            if tag != "final" and scores["bleu"] > self.best_bleu.numpy():
                self.best_bleu.assign(scores["bleu"])
                self.evals_since_best.assign(0)
                if self.chief:
                    self.best.save(self.step)
            elif tag != "final":
                self.evals_since_best.assign_add(1)
        if self.chief:
            self.run_dir.append_metrics(record)
            # The final weights (an average, the EMA) in a TensorBoard run of their own: not a point of the
            # training's validation curve, and not a second point at the step of the last scheduled evaluation.
            if tag not in self._writers:
                self._writers[tag] = tf.summary.create_file_writer(str(self.run_dir.tensorboard_dir / tag))
            write_validation_summaries(self._writers[tag], self.step, record, self.model, self.eval_dataset)
        name = "final weights" if tag == "final" else "validation"
        shown = f"step {self.step}: {name} loss {loss:.4f} (ppl {record['perplexity']:.2f})"
        if "bleu" in record:
            shown += f", BLEU {record['bleu']:.2f}"
            if record["bleu_sentences"] < record["validation_sentences"]:
                shown += f" (first {record['bleu_sentences']} of {record['validation_sentences']} sentences)"
        tqdm.write(shown, file=sys.stderr)  # with the log, not on stdout (train.py 2> log kept none of them)
        return record

    def _validation_bleu(self) -> dict:
        """Greedy translations of the validation sentences, scored: {"bleu", "chrf", "signature", "sentences",
        "of"} (sentences scored, of all the split's: train.bleu_max_sentences cuts)."""
        from data.corpus import load_text_pairs
        from nmt.translator import Translator

        sources, references = load_text_pairs(
            self.config.data, self.config.data.validation_split, every_line=True
        )
        total = len(sources)
        limit = self.config.train.bleu_max_sentences
        if limit:
            sources, references = sources[:limit], references[:limit]
        # One stream, in this thread: a distribution strategy's context is per thread, and decoding threads would
        # not see it; a signal's EvaluationInterrupted is raised in the main thread.
        # Sources are cut where evaluate/translate/export cut them (the model's position table, not the training
        # filter data.max_length): the BLEU recorded here is the one evaluate.py gives for the same weights.
        translator = Translator(
            self.model,
            self.tokenizer,
            self.config.eval,
            max_source_length=self.config.model.max_length,
            streams=1,
        )
        scores = self._score(translator.translate(sources, beam_size=1), references)
        return {**scores, "sentences": len(sources), "of": total}

    def _chiefs_scores(self, scores: dict) -> dict:
        """Multi-worker (a collective, at every scheduled BLEU evaluation): the chief's BLEU and chrF for every worker.

        Each worker decodes the validation sentences itself, with the same weights; on machines of another kind
        (other kernels, other roundings) a greedy choice can differ, and so the BLEU. Best/ and early stopping
        follow the chief's score on every worker: workers that decided apart would leave one waiting for the
        others in the next step's all-reduce.
        """
        rows = gather_from_workers(self.strategy, [scores["bleu"], scores["chrf"]])
        bleu, chrf = (float(value) for value in rows[0])  # global replica order: the chief's replicas first
        if (bleu, chrf) != (scores["bleu"], scores["chrf"]):
            log.warning(
                "this worker's validation BLEU %.2f (chrF %.2f) differs from the chief's %.2f (%.2f): its "
                "translations differ (another kind of CPU?); the chief's score decides best/ and early stopping",
                scores["bleu"], scores["chrf"], bleu, chrf,
            )  # fmt: skip
        return {**scores, "bleu": bleu, "chrf": chrf}

    def _score(self, hypotheses: list[str], references: list[str]) -> dict:
        if self.scorer is not None:
            return self.scorer(hypotheses, references)
        from nmt.scores import score_corpus

        return score_corpus(hypotheses, references, self.config.data.target, self.config.data.lowercase)

    def _early_stop(self, record: dict) -> bool:
        return "bleu" in record and self._patience_spent()

    def _patience_spent(self) -> bool:
        patience = self.config.train.early_stopping
        return bool(patience and self.evals_since_best.numpy() >= patience)

    def _finalize(self) -> None:
        """Writes DIR/final: the EMA weights or the last weights, replaced by the average of K checkpoints
        (nmt.final_weights) when that has a lower validation loss (both logged)."""
        cfg = self.config.train
        if not self.chief:
            return
        current = "last weights"
        paths = self.snapshots.final_paths(self.step, self.manager.checkpoints)  # before the EMA: raw weights
        if cfg.ema_decay > 0:
            self.optimizer.finalize_variable_values(self.model.trainable_variables)
            log.info(
                "candidate for the final weights: the exponential moving average (decay %g)", cfg.ema_decay
            )
            current = "EMA"
        if len(paths) < 2:  # else average_if_better says which it kept
            described = "exponential moving average" if current == "EMA" else current
            why = (
                f" (no checkpoint average: {len(paths)} checkpoint(s) in the window of train.average_last "
                f"{cfg.average_last}; a smaller train.checkpoint_every or a step plan gives more)"
                if cfg.average_last > 1
                else ""
            )
            log.info("final weights: the %s%s", described, why)
        if len(paths) > 1:
            from nmt.translator import validation_loss

            average_if_better(
                self.model, paths, lambda: validation_loss(self.model, self.eval_dataset)[0], current
            )
        save_model_weights(self.model, self.run_dir.final_dir, self.step)
