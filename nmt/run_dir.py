"""The run directory: everything evaluate/translate/export need, found from `--model-dir` alone.

Layout::

    DIR/config.yaml          the resolved config (written atomically; a resume rewrites it once accepted)
    DIR/tokenizer/           SentencePiece model(s), trained on the train split
    DIR/checkpoints/         step, model, optimizer, loss scale, RNG and data-iterator state (CheckpointManager)
    DIR/best/                model weights with the best validation BLEU so far (the latest; nmt.best_weights)
    DIR/final/               final model weights (checkpoint average / EMA when configured)
    DIR/metrics.jsonl        one JSON object per evaluation and for the time budget's plan (a resumed run
                             removes those of steps after its checkpoint: they run again)
    DIR/tensorboard/         TensorBoard event files (train/, validation/)
    DIR/train.lock           held by the one training process allowed on DIR
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import yaml

from nmt.config import Config, ConfigError, load_config

# The weights evaluate/translate/export load (--weights): stored checkpoints (`RunDir.weights_prefix`), or the two
# candidates for final/ (`Trainer._finalize` compares them) made again from the run directory
# (`nmt.final_weights.load_run_weights`).
CANDIDATES = ("average", "ema")
RUN_SECTIONS = ("data", "model", "train")  # what every config.yaml train.py writes holds (and eval)
WEIGHTS = ("auto", "final", "best", "latest", *CANDIDATES)


class RunDirError(RuntimeError):
    """A run directory that is missing, incomplete, locked or inconsistent."""


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    # --- paths -----------------------------------------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def tokenizer_dir(self) -> Path:
        return self.path / "tokenizer"

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def best_dir(self) -> Path:
        return self.path / "best"

    @property
    def final_dir(self) -> Path:
        return self.path / "final"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def tensorboard_dir(self) -> Path:
        return self.path / "tensorboard"

    @property
    def lock_path(self) -> Path:
        return self.path / "train.lock"

    # --- reading ---------------------------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.config_path.is_file()

    def removed_message(self) -> str:
        """What a training says when its DIR was deleted under it (config.yaml, written first, is gone)."""
        return (
            f"{self.path} was removed while training ({self.config_path.name} is gone): nothing more can be "
            "saved there; start again with a new run"
        )

    def require(self) -> RunDir:
        """Raises RunDirError unless DIR holds a config and a tokenizer (what every consumer needs)."""
        if not self.path.is_dir():
            raise RunDirError(f"model directory does not exist: {self.path}")
        if not self.config_path.is_file():
            raise RunDirError(f"{self.path} is not a run directory: {self.config_path.name} is missing")
        if not self.tokenizer_dir.is_dir() or not any(self.tokenizer_dir.glob("*.model")):
            raise RunDirError(f"{self.path}: no tokenizer model in {self.tokenizer_dir}")
        return self

    def load_config(self) -> Config:
        """The run's config; RunDirError if it cannot be read or lacks a section train.py writes (an empty or cut
        config.yaml would otherwise read as the defaults, not as the settings the run was trained with)."""
        try:
            config = load_config(self.config_path)
        except ConfigError as err:
            raise RunDirError(f"{self.config_path}: {err}") from err
        tree = yaml.safe_load(self.config_path.read_text(encoding="utf-8")) or {}
        if missing := [section for section in RUN_SECTIONS if section not in tree]:
            raise RunDirError(
                f"{self.config_path} is incomplete (no {', '.join(missing)} section): train.py writes every "
                "section; was it emptied or cut short?"
            )
        return config

    def weights_prefix(self, which: str = "auto") -> str:
        """The checkpoint prefix holding model weights: final, best, latest, or auto (in that order)."""
        import tensorflow as tf

        dirs = {"final": self.final_dir, "best": self.best_dir, "latest": self.checkpoint_dir}
        if which != "auto" and which not in dirs:
            raise RunDirError(f"unknown checkpoint {which!r}: use final, best, latest or auto")
        order = ["final", "best", "latest"] if which == "auto" else [which]
        for name in order:
            state = dirs[name] / "checkpoint"
            if not state.is_file():  # nothing saved there (or a save killed before TensorFlow's state file)
                continue
            # TensorFlow reports an unparsable text state as None, but raises on binary bytes
            try:
                prefix = tf.train.latest_checkpoint(str(dirs[name]))
            except UnicodeDecodeError:
                prefix = None
            if prefix:
                return prefix
            # Saved, and now unreadable: damage to report, not a reason to read other weights than `which` says
            raise RunDirError(
                f"{dirs[name]} is damaged: {state} cannot be read or names weights that are not there (deleted, "
                "cut short?); "
                + ("read others with --weights best or latest, " if name == "final" else "")
                + "or train again"
            )
        raise RunDirError(f"{self.path}: no trained weights found (looked for {', '.join(order)})")

    # --- writing ---------------------------------------------------------------------------------------------
    def append_metrics(self, record: dict) -> None:
        with open(self.metrics_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def read_metrics(self) -> list[dict]:
        if not self.metrics_path.is_file():
            return []
        records = []
        for line in self.metrics_path.read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if line:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line cut by a crash mid-write: skip it, keep the rest
        return records

    def drop_metrics_after(self, step: int) -> int:
        """Removes the records of steps after `step` (and lines cut by a crash); returns how many went.

        A resumed run calls it with its checkpoint's step: the records of a process killed after that
        checkpoint describe training that is lost and runs again, and would otherwise appear twice.
        """
        if not self.metrics_path.is_file():
            return 0
        kept, dropped = [], 0
        for line in self.metrics_path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                dropped += 1
                continue
            at = record.get("step") if isinstance(record, dict) else None
            if isinstance(at, int | float) and at > step:
                dropped += 1
                continue
            kept.append(line + "\n")
        if dropped:
            write_atomic(self.metrics_path, "".join(kept))
        return dropped


def write_atomic(path: Path, text: str) -> None:
    """Writes `text` to `path` through a temporary file and a rename: readers see the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would hide the file from the other readers of DIR
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class RunLock:
    """An exclusive, non-blocking lock on a run directory (released when the process ends, even by SIGKILL)."""

    def __init__(self, run_dir: RunDir):
        self.run_dir = run_dir
        self._handle = None

    def acquire(self) -> RunLock:
        self.run_dir.path.mkdir(parents=True, exist_ok=True)
        handle = open(self.run_dir.lock_path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            handle.seek(0)
            owner = handle.read().strip() or "unknown"
            handle.close()
            if err.errno in (errno.EAGAIN, errno.EACCES):
                raise RunDirError(
                    f"another training (pid {owner}) is already running on {self.run_dir.path}; "
                    "wait for it to finish or stop it first"
                ) from err
            raise
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._handle = handle
        return self

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None

    def __enter__(self) -> RunLock:
        return self if self._handle is not None else self.acquire()  # already acquired: just release at exit

    def __exit__(self, *exc) -> None:
        self.release()


def save_model_weights(model, directory: Path, step: int) -> str:
    """Saves only the model's variables under `directory` (one kept), returning the checkpoint prefix."""
    import tensorflow as tf

    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(directory), max_to_keep=1)
    return manager.save(checkpoint_number=step)


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
    tf.compat.v1.train.update_checkpoint_state(
        str(directory), names[-1], all_model_checkpoint_paths=names, all_model_checkpoint_timestamps=times
    )
    return (
        f"{directory / 'checkpoint'} {problem}: rewritten from the checkpoints present "
        f"({', '.join(names)}); resuming from the newest"
    )


def checkpoint_to_resume(directory: Path) -> str | None:
    """The checkpoint prefix a run resumes from in `directory` once `repair_checkpoint_state` has run there, found
    without writing anything: what the other workers of a multi-worker run read from the chief's directory, which
    the chief may not have repaired yet (they would otherwise find no state file and resume from step 0)."""
    import tensorflow as tf

    directory = Path(directory)
    if not directory.is_dir():
        return None
    problem, complete = _state_problem(directory)
    if problem and complete:
        return str(directory / f"ckpt-{complete[-1]}")
    return tf.train.latest_checkpoint(str(directory))


def _state_problem(directory: Path) -> tuple[str, list[int]]:
    """(what is wrong with the state file, "" if nothing; the steps of the complete checkpoints on disk)."""
    import tensorflow as tf

    complete = sorted(
        checkpoint_step(index.with_suffix(""))
        for index in directory.glob("ckpt-*.index")
        if re.fullmatch(r"ckpt-\d+\.index", index.name) and any(directory.glob(f"{index.stem}.data-*"))
    )
    try:
        state = tf.train.get_checkpoint_state(str(directory))
        problem = "is missing" if state is None else ""
    except (ValueError, tf.errors.OpError) as err:
        state, problem = None, f"is unreadable ({first_line(err)})"
    if state is not None:
        named = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
        present = [p for p in named if Path(directory, os.path.basename(p) + ".index").is_file()]
        if state.model_checkpoint_path in present:
            return "", complete
        problem = f"names {os.path.basename(state.model_checkpoint_path)}, which is gone"
    return problem, complete


def restore_errors() -> tuple[type[BaseException], ...]:
    """What restoring a missing, mismatched or corrupt checkpoint raises (IndexError: a truncated file)."""
    import tensorflow as tf

    return (tf.errors.OpError, ValueError, AssertionError, IndexError)


def first_line(err: BaseException) -> str:
    """The first line of an error's message (TensorFlow's run to pages), or its type's name when it has none."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


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
