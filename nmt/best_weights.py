"""DIR/best/: the model weights of the best validation BLEU so far, kept in step with the run's checkpoints.

Each new best is saved at its evaluation, after the previous ones; the newest is TensorFlow's latest, the one
`--weights best` loads. A process killed before its next training checkpoint loses the steps since the last one:
the resumed run removes their records from metrics.jsonl and runs them again, and `roll_back` removes the bests
saved in them, so best/ holds the best of the evaluations the run still has (the checkpointed `best_bleu`'s),
never the weights of a lost step (a replay that scores lower would have left them there, unrecorded). For that,
a best stays while a training checkpoint may be resumed from: `prune`, after each checkpoint, keeps the newest
best at or before the step of each training checkpoint kept, and any newer one.
"""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from nmt.checkpoints import checkpoint_step, drop_checkpoints


class BestWeights:
    def __init__(self, model, directory: Path):
        self.checkpoint = tf.train.Checkpoint(model=model)
        self.directory = Path(directory)

    def save(self, step: int) -> str:
        """Saves the model's weights as the best of step `step` (the latest in best/); returns the prefix."""
        manager = tf.train.CheckpointManager(self.checkpoint, str(self.directory), max_to_keep=None)
        return manager.save(checkpoint_number=step)

    def steps(self) -> list[int]:
        """The steps of the bests in best/, oldest first."""
        state = tf.train.get_checkpoint_state(str(self.directory)) if self.directory.is_dir() else None
        if state is None:
            return []
        return [checkpoint_step(p) for p in state.all_model_checkpoint_paths or [state.model_checkpoint_path]]

    def prune(self, checkpoint_steps: list[int]) -> list[int]:
        """After a training checkpoint: keeps the bests a resume from any of `checkpoint_steps` (the training
        checkpoints kept) needs, and those after the newest; returns the steps removed."""
        steps = self.steps()
        needed = {max((s for s in steps if s <= c), default=None) for c in checkpoint_steps}
        newest = max(checkpoint_steps, default=0)
        return drop_checkpoints(self.directory, lambda s: s in needed or s > newest)

    def roll_back(self, step: int) -> list[int]:
        """On resuming from `step`: removes the bests of later steps (lost with their process); returns them."""
        return drop_checkpoints(self.directory, lambda s: s <= step)
