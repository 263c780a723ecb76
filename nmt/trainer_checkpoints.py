"""The trainer's checkpoints: the latest one restored at set-up (every worker restores the chief's), and saving.

A part of `nmt.trainer.Trainer` (a base class of it), split off by concern like `nmt.trainer_evaluation`: it uses
the trainer's config, run_dir, chief, watch_config, stop, plan, part, step_fn, optimizer, checkpoint_parts,
manager, best, resumed_from and step, which `Trainer.setup` makes. `TrainingError` is defined here; `nmt.trainer`
re-exports it (callers import it from there).
"""

from __future__ import annotations

import logging

import tensorflow as tf

from nmt.budget import BatchChanged
from nmt.checkpoints import checkpoint_step, checkpoint_to_resume, first_line, restore_errors
from nmt.distribute import WorkersDisagree
from nmt.run_dir import RunDirError
from nmt.trainer_data import restorable_iterator

log = logging.getLogger("nmt.train")
# checkpoint parts that older checkpoints lack: restored from those that have them
NEWER_PARTS = {name: f"{name}/.ATTRIBUTES/VARIABLE_VALUE" for name in ("pending_evaluation", "loss_scaling")}


class TrainingError(RuntimeError):
    """Training cannot go on (non-finite steps, a checkpoint that cannot be written or restored...)."""


class TrainerCheckpoints:
    """Checkpoint methods of the Trainer (see the module docstring for the attributes they use)."""

    def _restore(self) -> int:
        step = self._restore_latest()
        try:
            self.stop.check_same_step(step, self.run_dir.checkpoint_dir)
        except WorkersDisagree as err:
            raise TrainingError(str(err)) from None
        return step

    def _restore_latest(self) -> int:
        """Restores the chief's latest checkpoint (every worker restores the same one); returns its step."""
        latest = (
            self.manager.latest_checkpoint
            if self.chief
            else checkpoint_to_resume(self.run_dir.checkpoint_dir)  # the chief's, even before its repair
        )
        if not latest:
            return 0
        try:  # the parts the plan allows: another global batch is refused, an older checkpoint has no plan
            parts = self.plan.restorable(latest, self.checkpoint_parts)
            symbolic = self.part is not None
            parts = restorable_iterator(latest, parts, symbolic, self.config.train.allow_batch_change)
            reader = tf.train.load_checkpoint(latest)
            parts = {
                n: p for n, p in parts.items() if n not in NEWER_PARTS or reader.has_tensor(NEWER_PARTS[n])
            }
            tf.train.Checkpoint(**parts).restore(latest).assert_existing_objects_matched()
            if change := self.step_fn.reconcile_loss_scaling():
                log.warning("%s", change)
        except BatchChanged as err:
            raise TrainingError(str(err)) from err
        except restore_errors() as err:
            raise TrainingError(
                f"cannot resume from checkpoint {latest}: {first_line(err)}. The checkpoint is corrupt or was written by a "
                "different model/config; move it away or use another --model-dir"
            ) from err
        step = int(self.optimizer.iterations.numpy())
        log.info("resuming from checkpoint %s at step %d", latest, step)
        return step

    def save_checkpoint(self) -> None:
        if self.watch_config and not self.run_dir.exists():  # TensorFlow would recreate checkpoints/ anew
            raise RunDirError(self.run_dir.removed_message())
        try:
            path = self.manager.save(self.step, self.resumed_from or 0)
        except (tf.errors.OpError, OSError) as err:
            first = str(err).strip().splitlines()[0]
            previous = self.manager.latest_checkpoint
            kept = (
                f"the previous one ({previous}) is still usable"
                if previous
                else "no earlier checkpoint to resume"
            )
            raise TrainingError(
                f"could not write a checkpoint at step {self.step} ({first}); {kept}"
            ) from err
        log.info("saved checkpoint %s", path)
        if self.chief:  # the bests a resume from a kept checkpoint needs (nmt.best_weights)
            self.best.prune([checkpoint_step(p) for p in self.manager.checkpoints])
