"""Checkpoint files of a run directory: saving and restoring model weights, the steps of checkpoint prefixes, and
TensorFlow's state file (`checkpoint`) kept naming only complete checkpoints (dropped, repaired, or read as the
repair would name it).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from nmt.run_dir import RunDirError, latest_checkpoint, write_atomic


def save_model_weights(model, directory: Path, step: int) -> str:
    """Saves only the model's variables under `directory` (one kept), returning the checkpoint prefix."""
    import tensorflow as tf

    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(directory), max_to_keep=1)
    return manager.save(checkpoint_number=step)


def checkpoint_digest(prefix: str) -> str | None:
    """SHA-256 of a checkpoint's index file (`<prefix>.index`: its tensors' names, shapes and the CRC-32C of each
    tensor's bytes), so other weights give another digest; None when there is no such file (weights computed, not
    stored: an average, the EMA)."""
    import hashlib

    try:
        return hashlib.sha256(Path(f"{prefix}.index").read_bytes()).hexdigest()
    except OSError:
        return None


def checkpoint_step(prefix: str) -> int:
    """The step of a checkpoint prefix named ckpt-STEP (CheckpointManager's `checkpoint_number`)."""
    return int(str(prefix).rsplit("-", 1)[-1])


def drop_checkpoints(directory: Path, keep) -> list[int]:
    """Keeps, of the CheckpointManager checkpoints in `directory`, those whose step `keep(step)` accepts.

    The others' files go, with half-written saves (ckpt-*_temp), and TensorFlow's state file lists those kept (their
    timestamps with them, which a CheckpointManager reopening the directory needs), the newest as the latest.
    Returns the steps removed (nothing is rewritten when none is).
    """
    import tensorflow as tf
    from google.protobuf import text_format

    directory = Path(directory)
    remove_partial_saves(directory)
    state = tf.train.get_checkpoint_state(str(directory)) if directory.is_dir() else None
    if state is None:
        return []
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    times = list(state.all_model_checkpoint_timestamps)
    kept = [i for i, path in enumerate(paths) if keep(checkpoint_step(path))]
    if len(kept) == len(paths):
        return []
    removed = [checkpoint_step(paths[i]) for i in range(len(paths)) if i not in kept]
    names = [os.path.basename(paths[i]) for i in kept]  # relative: the run directory may move
    del state.all_model_checkpoint_paths[:], state.all_model_checkpoint_timestamps[:]
    state.all_model_checkpoint_paths.extend(names)
    if len(times) == len(paths):
        state.all_model_checkpoint_timestamps.extend(times[i] for i in kept)
    if names:
        state.model_checkpoint_path = names[-1]
        write_atomic(directory / "checkpoint", text_format.MessageToString(state))
    else:
        (directory / "checkpoint").unlink()
    for step in removed:  # after the state file: it never names a removed checkpoint
        for path in directory.glob(f"ckpt-{step}.*"):
            path.unlink()
    return removed


def remove_partial_saves(directory: Path, pattern: str = "ckpt-*_temp*") -> None:
    """Removes the half-written saves (`ckpt-N_temp`, a save cut short) of a checkpoint directory."""
    for partial in Path(directory).glob(pattern):
        shutil.rmtree(partial, ignore_errors=True)


def repair_checkpoint_state(directory: Path) -> str:
    """Makes TensorFlow's state file in `directory` name the complete checkpoints there; returns what it changed.

    The state file (`checkpoint`) is what every reader follows: without it, or with it unreadable, a resume would
    start from step 0 and rotate the real checkpoints away; naming a checkpoint that was moved away (the corrupt
    one, as the error advises), it could not resume at all. Then it is written anew from the complete checkpoints
    on disk (`ckpt-N.index` with its data), the newest as the latest. "" when nothing needed changing. Half-written
    saves (`ckpt-N_temp`, a process killed while saving) go first.
    """
    import tensorflow as tf

    directory = Path(directory)
    if not directory.is_dir():
        return ""
    remove_partial_saves(directory)
    problem, complete = _state_problem(directory)
    if not problem or not complete:
        return ""
    names = [f"ckpt-{step}" for step in complete]
    times = [Path(directory, f"{name}.index").stat().st_mtime for name in names]
    # An absolute directory: TensorFlow keeps the bare names (found beside the state file, wherever DIR moves);
    # given a relative one, it would write them relative to the working directory ("../../ckpt-20").
    tf.compat.v1.train.update_checkpoint_state(
        os.path.abspath(directory),
        names[-1],
        all_model_checkpoint_paths=names,
        all_model_checkpoint_timestamps=times,
    )
    return (
        f"{directory / 'checkpoint'} {problem}: rewritten from the checkpoints present "
        f"({', '.join(names)}), the newest as the latest"
    )


def checkpoint_to_resume(directory: Path) -> str | None:
    """The checkpoint prefix a run resumes from in `directory` once `repair_checkpoint_state` has run there, found
    without writing anything: what the other workers of a multi-worker run read from the chief's directory, which
    the chief may not have repaired yet (they would otherwise find no state file and resume from step 0)."""

    directory = Path(directory)
    if not directory.is_dir():
        return None
    problem, complete = _state_problem(directory)
    if problem and complete:
        return str(directory / f"ckpt-{complete[-1]}")
    return latest_checkpoint(directory)


def _state_problem(directory: Path) -> tuple[str, list[int]]:
    """(what is wrong with the state file, "" if nothing; the steps of the complete checkpoints on disk)."""
    import tensorflow as tf

    complete = sorted(
        checkpoint_step(index.with_suffix(""))
        for index in directory.glob("ckpt-*.index")
        if re.fullmatch(r"ckpt-\d+\.index", index.name)
        and any(directory.glob(f"{index.stem}.data-*"))
        and _readable(index.with_suffix(""))
    )
    try:
        state = tf.train.get_checkpoint_state(str(directory))
        problem = "is missing" if state is None else ""
    except (ValueError, tf.errors.OpError) as err:
        state, problem = None, f"is unreadable ({first_line(err)})"
    if state is not None:
        named = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
        present = [p for p in named if _in_directory(directory, p)]
        if state.model_checkpoint_path in present:
            return "", complete
        problem = f"names {state.model_checkpoint_path}, which is gone"
    return problem, complete


def _readable(prefix: Path) -> bool:
    """Whether a checkpoint's index opens (one cut by a full disk after its data was renamed into place does not)."""
    import tensorflow as tf

    try:
        tf.train.load_checkpoint(str(prefix))
    except (ValueError, tf.errors.OpError):
        return False
    return True


def _in_directory(directory: Path, named: str) -> bool:
    """Whether a checkpoint the state file names (as `tf.train.get_checkpoint_state` gives it: joined to the
    directory, where TensorFlow reads it) is one in `directory`: one elsewhere ("../../ckpt-20", a moved run's old
    absolute paths) is not this run's, even when a checkpoint of that name is here."""
    here = os.path.join(directory, os.path.basename(named))
    return os.path.abspath(named) == os.path.abspath(here) and os.path.isfile(f"{named}.index")


def restore_errors() -> tuple[type[BaseException], ...]:
    """What restoring a missing, mismatched or corrupt checkpoint raises (IndexError: a truncated file)."""
    import tensorflow as tf

    return (tf.errors.OpError, ValueError, AssertionError, IndexError)


def first_line(err: BaseException) -> str:
    """The first line of an error's message (TensorFlow's run to pages), or its type's name when it has none; an
    eager op's wrapping ("{{function_node ...}} ", " [Op:Name] name: ") left out."""
    text = str(err).strip()
    line = re.sub(r"\{\{.*?\}\}\s*|\s*\[Op:\w+\].*", "", text.splitlines()[0]) if text else ""
    return line or (text.splitlines()[0] if text else type(err).__name__)


def restore_model_weights(model, prefix: str) -> None:
    """Restores model variables from any checkpoint holding `model` (weights-only or a full training one).

    Every variable of the (built) model must be found with the right shape: a checkpoint of another model size,
    a truncated file or a missing one raises RunDirError naming the problem, never a silent random init.
    """
    import tensorflow as tf

    try:
        status = tf.train.Checkpoint(model=model).restore(prefix)
        status.assert_existing_objects_matched()
        status.expect_partial()
    except restore_errors() as err:
        raise RunDirError(f"cannot restore model weights from {prefix}: {first_line(err)}") from err


class TrainingCheckpoints:
    """A run's training checkpoints (a CheckpointManager over `directory`): `keep` of them (keep_checkpoints, at
    least average_last: they are averaged), saved every `every` steps (checkpoint_every).

    One off that grid (a signal's stop, an interrupted evaluation, a run's last step) is saved beside the grid's,
    not in place of the oldest, and the one a process resumed from goes once that process's next save is complete:
    the kept and averaged checkpoints are an uninterrupted run's (a stop at step 37 pushed ckpt-30 out of the last 3
    averaged: other final weights), and a failed save leaves the checkpoint to resume from.
    """

    def __init__(self, checkpoint, directory, *, keep: int, every: int):
        import tensorflow as tf

        self.checkpoint, self.directory, self.keep, self.every = checkpoint, Path(directory), keep, every
        state = tf.train.get_checkpoint_state(str(self.directory)) if self.directory.is_dir() else None
        paths = list(state.all_model_checkpoint_paths) if state else []
        self._manager = self._open(extra=any(checkpoint_step(p) % every for p in paths))

    def _open(self, extra: bool):
        import tensorflow as tf

        return tf.train.CheckpointManager(
            self.checkpoint, str(self.directory), max_to_keep=self.keep + int(extra)
        )

    @property
    def checkpoints(self) -> list[str]:
        return list(self._manager.checkpoints)

    @property
    def latest_checkpoint(self) -> str | None:
        return self._manager.latest_checkpoint

    def save(self, step: int, resumed_from: int) -> str:
        """Saves the checkpoint of `step`; TensorFlow's error if it cannot (its half-written shards removed)."""
        import tensorflow as tf

        stale = resumed_from if resumed_from % self.every and resumed_from != step else None
        kept = [checkpoint_step(p) for p in self._manager.checkpoints]
        self._manager = self._open(extra=bool(step % self.every) or stale in kept)
        try:
            path = self._manager.save(checkpoint_number=step)
        except (tf.errors.OpError, OSError):
            # the previous checkpoints are intact; this one's files go (a full disk may cut its index after its data
            # was renamed into place: a repair would name it, and every resume fail on it)
            remove_partial_saves(self.directory, f"ckpt-{step}_temp*")
            if checkpoint_step(self._manager.latest_checkpoint or "ckpt-0") != step:
                for path in self.directory.glob(f"ckpt-{step}.*"):
                    path.unlink(missing_ok=True)
            raise
        if stale is not None and drop_checkpoints(self.directory, lambda s: s != stale):
            self._manager = self._open(extra=bool(step % self.every))
        return path
