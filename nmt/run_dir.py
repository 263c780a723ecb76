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
import logging
import os
import tempfile
from pathlib import Path

import yaml

from common.os_errors import named
from nmt.checkpoint_state import latest_checkpoint, saved_step
from nmt.config import Config, ConfigError, load_config

# The weights evaluate/translate/export load (--weights): stored checkpoints (`RunDir.weights_prefix`), or the two
# candidates for final/ (`Trainer._finalize` compares them) made again from the run directory
# (`nmt.final_weights.load_run_weights`).
CANDIDATES = ("average", "ema")
RUN_SECTIONS = ("data", "model", "train")  # what every config.yaml train.py writes holds (and eval)
WEIGHTS = ("auto", "final", "best", "latest", *CANDIDATES)

log = logging.getLogger(__name__)
# The final/ prefixes already said to be older than the run's training (evaluate.py reads the weights twice)
_TOLD_OLDER: set[str] = set()


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
    def train_data_path(self) -> Path:
        return self.path / "train_data.json"

    @property
    def tensorboard_dir(self) -> Path:
        return self.path / "tensorboard"

    @property
    def lock_path(self) -> Path:
        return self.path / "train.lock"

    # --- reading ---------------------------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.config_path.is_file()

    def run_files(self) -> list[str]:
        """What DIR holds of a trained run's weights (checkpoints/, best/, final/): a new run there would adopt them.
        A tokenizer alone is not a run: DIR seeded with one (ablate.py's variants share theirs) trains with it."""
        return [
            f"{folder.name}/"
            for folder in (self.checkpoint_dir, self.best_dir, self.final_dir)
            if any(folder.glob("ckpt-*.index"))
        ]

    def config_problem(self) -> str:
        """What stands where config.yaml should be when it is not a file (a directory, a socket...), else ""."""
        path = self.config_path
        if path.is_file() or not (path.exists() or path.is_symlink()):
            return ""
        what = (
            "a directory" if path.is_dir() else "a broken link" if not path.exists() else "not a regular file"
        )
        return f"{path} is {what}, not the run's config: move it away, or use another --model-dir"

    def removed_message(self) -> str:
        """What a training says when its DIR was deleted under it (config.yaml, written first, is gone)."""
        return (
            f"{self.path} was removed while training ({self.config_path.name} is gone): nothing more can be "
            "saved there; start again with a new run"
        )

    def require(self) -> RunDir:
        """Raises RunDirError unless DIR holds a config and a tokenizer (what every consumer needs)."""
        if not self.path.is_dir():
            if self.path.exists():
                raise RunDirError(f"model directory is a file, not a run directory: {self.path}")
            raise RunDirError(f"model directory does not exist: {self.path}")
        if problem := self.config_problem():
            raise RunDirError(problem)
        if not self.config_path.is_file():
            raise RunDirError(f"{self.path} is not a run directory: {self.config_path.name} is missing")
        if not self.tokenizer_dir.is_dir() or not any(self.tokenizer_dir.glob("*.model")):
            raise RunDirError(f"{self.path}: no tokenizer model in {self.tokenizer_dir}")
        return self

    def load_config(self) -> Config:
        """The run's config; RunDirError if it cannot be read or lacks a section train.py writes (an empty or cut
        config.yaml would otherwise read as the defaults, not as the settings the run was trained with)."""
        try:  # the sections first: without one, the defaults would be validated (and refused) in its place
            tree = yaml.safe_load(self.config_path.read_text(encoding="utf-8")) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            tree = None  # load_config says what is wrong with the file
        if isinstance(tree, dict) and (missing := [s for s in RUN_SECTIONS if s not in tree]):
            raise RunDirError(
                f"{self.config_path} is incomplete (no {', '.join(missing)} section): train.py writes every "
                "section; was it emptied or cut short?"
            )
        try:
            return load_config(self.config_path)
        except ConfigError as err:
            raise RunDirError(f"{self.config_path}: {err}") from err

    def weights_prefix(self, which: str = "auto") -> str:
        """The checkpoint prefix holding model weights: final, best, latest, or auto (in that order)."""

        dirs = {"final": self.final_dir, "best": self.best_dir, "latest": self.checkpoint_dir}
        if which != "auto" and which not in dirs:
            raise RunDirError(f"unknown checkpoint {which!r}: use final, best, latest or auto")
        order = ["final", "best", "latest"] if which == "auto" else [which]
        for name in order:
            state = dirs[name] / "checkpoint"
            if not state.is_file():  # nothing saved there (or a save killed before TensorFlow's state file)
                continue
            prefix = latest_checkpoint(dirs[name])
            if prefix:
                if name == "final":
                    self._tell_if_final_is_older(prefix)
                return prefix
            # Saved, and now unreadable: damage to report, not a reason to read other weights than `which` says
            raise RunDirError(
                f"{dirs[name]} is damaged: {state} cannot be read or names weights that are not there (deleted, "
                "cut short?); "
                + ("read others with --weights best or latest, " if name == "final" else "")
                + "or train again"
            )
        others = [name for name in dirs if name not in order and (dirs[name] / "checkpoint").is_file()]
        if others:  # e.g. --weights final of a run stopped before its end
            unfinished = (
                " (its training has not finished: rerun train.py to end it)" if "final" in order else ""
            )
            raise RunDirError(
                f"{self.path}: no {' or '.join(order)} weights{unfinished}; it has {' and '.join(others)}: "
                f"use --weights {others[0]}"
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
        for line in self.metrics_path.read_text(encoding="utf-8", errors="replace").splitlines():
            line = line.strip()
            if line:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a crash mid-write: skip it, keep the rest
                if isinstance(record, dict):  # not a record of ours (a line edited in): skipped too
                    records.append(record)
        return records

    def finished(self) -> bool:
        """Whether the run reached its end: final weights, the final evaluation of their step as its last record, and
        no training checkpoint of another step. A finished run resumed past its end (a larger budget) and stopped again
        has final/ from before, and records after it or a newer checkpoint; one whose new final evaluation was
        interrupted has the new final/ and the old final record. Read without TensorFlow (`python -m nmt.run_dir`)."""
        final = saved_step(self.final_dir)
        records = self.read_metrics()
        if (
            final is None
            or not records
            or records[-1].get("tag") != "final"
            or records[-1].get("step") != final
        ):
            return False
        trained = saved_step(self.checkpoint_dir)
        # no training checkpoint: deleted to save space (final/ stands for the run, `nmt.run_start.checkpoints_gone`)
        return trained is None or trained == final

    def finished_message(self) -> str:
        """What the rerun of a finished run says (as `Trainer.already_finished` does), from its final record; ""
        for a run that is not finished."""
        return finished_line(self.read_metrics()[-1], self.final_dir) if self.finished() else ""

    def _tell_if_final_is_older(self, prefix: str) -> None:
        """Warns when final/ (at `prefix`) is older than the run's latest training checkpoint: the run was resumed
        past its end and stopped before its new end (its final/ is then the earlier end's)."""
        final, trained = saved_step(self.final_dir), saved_step(self.checkpoint_dir)
        if final is None or trained is None or trained <= final or prefix in _TOLD_OLDER:
            return
        _TOLD_OLDER.add(prefix)
        log.warning(
            "%s holds the weights of step %d, where the run first ended; it has trained on to step %d since and is "
            "not finished (rerun train.py to end it, or use --weights latest for the weights of step %d)",
            prefix, final, trained, trained,
        )  # fmt: skip

    def drop_metrics_after(self, step: int, *, validation_at: int | None = None) -> int:
        """Removes the records of steps after `step` (and lines cut by a crash); returns how many went.

        A resumed run calls it with its checkpoint's step: the records of a process killed after that
        checkpoint describe training that is lost and runs again, and would otherwise appear twice. With
        `validation_at`, the validation records of that step go too (a checkpointed pending evaluation runs again).
        """
        if not self.metrics_path.is_file():
            return 0
        kept, dropped = [], 0
        for line in self.metrics_path.read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                dropped += 1
                continue
            at = record.get("step") if isinstance(record, dict) else None
            redone = validation_at is not None and at == validation_at and record.get("tag") == "validation"
            if (isinstance(at, int | float) and at > step) or redone:
                dropped += 1
                continue
            kept.append(line + "\n")
        if dropped:
            write_atomic(self.metrics_path, "".join(kept))
        return dropped


def finished_line(record: dict, final_dir: Path) -> str:
    """ "already finished at step N: validation loss L, BLEU B; final weights in DIR (nothing to do)" from a run's
    final record (what the rerun of a finished run says); B of the first N of M sentences says so."""
    message = f"already finished at step {record['step']}"
    if isinstance(record.get("loss"), int | float):
        message += f": validation loss {record['loss']:.4f}"
    if isinstance(record.get("bleu"), int | float):
        message += f", BLEU {record['bleu']:.2f}"
        scored, of = record.get("bleu_sentences"), record.get("validation_sentences")
        if isinstance(scored, int) and isinstance(of, int) and scored < of:
            message += f" (first {scored} of {of} sentences)"
    return f"{message}; final weights in {final_dir} (nothing to do)"


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
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        # a failed write (a full disk) carries no file name: the file it was for
        if (error := named(err, path)) is not err:
            raise error from err
        raise
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


def ensemble_direction_error(member, member_data, main, main_data) -> str:
    """The refusal of an ensemble member that translates another way than the main run ("" if alike): a joint
    tokenizer is the same both ways, so the tokenizer check alone lets an en->de and a de->en model be averaged."""
    there, here = (member_data.source, member_data.target), (main_data.source, main_data.target)
    if there == here:
        return ""
    return (
        f"{member} translates {there[0]} into {there[1]}, {main} {here[0]} into {here[1]}: the runs of an ensemble "
        "translate alike"
    )


# `python -m nmt.run_dir --finished DIR`: exit 0 if the run reached its end (make train evaluates only then)
if __name__ == "__main__":
    import sys

    usage = "usage: python -m nmt.run_dir --finished DIR (exit 0 if the run in DIR reached its end, else 1)"
    if sys.argv[1:] in (["--help"], ["-h"]):
        print(usage)
        sys.exit(0)
    if len(sys.argv) != 3 or sys.argv[1] != "--finished":
        print(usage, file=sys.stderr)
        sys.exit(2)
    sys.exit(0 if RunDir(sys.argv[2]).finished() else 1)
