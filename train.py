"""Train a Transformer translator from one YAML config.

    python train.py --config base.yaml [--set section.key=value ...] [--model-dir DIR]

Rerunning the same command on the same --model-dir resumes from the last checkpoint (and says so).
Exit codes: 0 done or stopped cleanly by SIGINT/SIGTERM (checkpoint saved), 1 training failed (or a multi-worker
cluster could not form, or a full disk before anything was written), 2 bad config or arguments (nothing written), 3
the run directory is in use or inconsistent, or was removed while training, 130 interrupted before training started
(a new run's start is undone) or by a second signal (the last checkpoint is intact; a new run with none yet, and no
best weights, is undone too).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import shlex
import signal
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import nmt.xla  # noqa: E402, F401  (TF_XLA_FLAGS before TensorFlow reads them: train.xla fusible)
from nmt.cli import add_set_argument, exit_now, stop_on_sigterm  # noqa: E402
from nmt.config import ConfigError, absolute_paths, load_config, new_run_problem  # noqa: E402
from nmt.progress import logs_above_bars  # noqa: E402
from nmt.run_dir import RunDir, RunDirError, RunLock, write_atomic  # noqa: E402
from nmt.run_start import (  # noqa: E402
    check_resume_compatible,
    checkpoints_gone,
    discard,
    existing_entries,
    missing_parents,
    more_training,
    saved_checkpoints,
    why_unusable,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config", required=True, help="YAML config: a path, or a name looked up in configs/"
    )
    add_set_argument(parser)
    parser.add_argument("--model-dir", help="run directory (default: runs/<config name>)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not args.verbose:  # TensorFlow's INFO lines (one per all-reduce traced, ...) drown the run's own
        for noisy in ("tensorflow", "absl"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    log = logging.getLogger("nmt.train")
    try:
        # relative paths made absolute: the run's config.yaml must mean the same from any working directory
        config = absolute_paths(load_config(args.config, args.overrides))
    except ConfigError as err:
        print(f"train.py: config error: {err}", file=sys.stderr)
        return 2
    if args.model_dir is not None and not args.model_dir.strip():
        print("train.py: --model-dir is empty (an unset variable?): give a directory", file=sys.stderr)
        return 2
    run_dir = RunDir(args.model_dir or Path("runs") / Path(args.config).stem)
    try:
        resuming = check_resume_compatible(run_dir, config)
    except RunDirError as err:
        print(f"train.py: {err}", file=sys.stderr)
        return 3
    if not resuming and (problem := new_run_problem(config)):
        # refused for a new run only: an older run's saved config with it is resumed as it was
        print(f"train.py: config error: {problem}", file=sys.stderr)
        return 2
    if resuming and (gone := checkpoints_gone(run_dir)):
        # a rerun of a finished run (make train again) ends as it would with them, unless it asks for more steps
        if finished_rerun(run_dir, run_dir.load_config(), config):
            print(f"train.py: already finished; {gone}", file=sys.stderr)
            return 0
        print(f"train.py: {gone}", file=sys.stderr)
        return 3
    if resuming:  # fine-tuning: the parent of its start, whatever this command says
        from nmt.init_from import keep_parent_of_resumed_run

        saved = absolute_paths(run_dir.load_config())
        config = keep_parent_of_resumed_run(saved, config)
        changed = [
            f"{section}.{key}: {old!r} -> {new!r}"
            for section in ("train", "eval")
            for key, old in getattr(saved, section).__dict__.items()
            if (new := getattr(getattr(config, section), key)) != old
        ]
        if changed:
            log.warning(
                "settings differ from %s: %s. A run that trains on uses them from its next step and rewrites "
                "config.yaml (the checkpoint keeps its plan); a finished run ignores them",
                run_dir.config_path, "; ".join(changed),
            )  # fmt: skip

    from nmt.config import ignored_settings

    for note in ignored_settings(config.train):
        log.warning("%s", note)

    from nmt.cluster import is_chief

    try:  # only the chief of a multi-worker run locks and writes the run directory
        chief = is_chief(config.train.distribute)
    except ConfigError as err:  # a missing or malformed TF_CONFIG
        print(f"train.py: config error: {err}", file=sys.stderr)
        return 2
    fresh = chief and not resuming  # a new run: what its start writes into DIR is undone if the start fails
    before = existing_entries(run_dir) if fresh else None
    made_parents = missing_parents(run_dir) if fresh and before is None else []
    try:  # before the slow imports: a second training on DIR is refused at once
        lock = RunLock(run_dir).acquire() if chief else contextlib.nullcontext()
    except RunDirError as err:
        # two tasks whose TF_CONFIGs both make them the chief: the other one holds the lock
        hint = (
            "; if this is a task of a multi-worker run, another task also takes itself for the chief: check that "
            "every task's TF_CONFIG lists the same cluster in the same order, with its own index"
            if config.train.distribute == "multi_worker"
            else ""
        )
        print(f"train.py: {err}{hint}", file=sys.stderr)
        return 3
    except OSError as err:  # DIR is a file, under a file, on a read-only filesystem, a full disk...
        print(
            f"train.py: cannot use {run_dir.path} as the run directory: {why_unusable(run_dir.path, err)}",
            file=sys.stderr,
        )
        if fresh:
            # what the attempt made (DIR, its lock file on a full disk) goes: nothing written
            discard(run_dir, before, made_parents)
        # a full disk or an I/O error is no usage error
        return 1 if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO) else 2

    written = resuming  # DIR has its config.yaml: if it goes, the directory was removed under this process
    undone = ""  # a new run stopped by a second signal before its first checkpoint: "undone" or "best kept"
    started = False  # setup succeeded: from then on DIR holds a run (a new run's failed start is undone)
    # SIGTERM ends the start like SIGINT (undone if new) until training installs its own handlers
    previous_term = stop_on_sigterm()
    try:
        with lock:
            try:
                from nmt.budget import BatchChanged
                from nmt.trainer import Trainer, TrainingError
                from nmt.trainer_data import keep_train_split_record

                log.info("run directory %s (%s)", run_dir.path, "resuming" if resuming else "new run")
                print(config.to_yaml(), file=sys.stderr)
                # config.yaml describes what DIR holds: a new run writes it first (before the tokenizer goes in); a
                # resume rewrites it only once the checkpoint is accepted (nmt.budget refuses another global batch,
                # a corrupt checkpoint is refused...) and the run has something left to do: a refused start, or the
                # rerun of a finished run, leaves DIR as it was. A new run whose start fails is undone (`discard`).
                if chief and not resuming:
                    write_atomic(run_dir.config_path, config.to_yaml())
                    written = True
                trainer = Trainer(config, run_dir)
                try:
                    trainer.setup()
                except TrainingError as err:
                    # another global batch: refused for training on, not for the rerun of a finished run (it trains
                    # nothing; the checkpoint's batch is compared before the trainer can say "already finished")
                    batch_changed = resuming and isinstance(err.__cause__, BatchChanged)
                    if not (batch_changed and (message := finished_rerun(run_dir, saved, config))):
                        raise
                    print(f"train.py: {message}", file=sys.stderr)
                    return 0
                started = True
            finally:
                if fresh and not started:
                    discard(run_dir, before, made_parents)
                    written = False
            if message := trainer.already_finished():
                print(f"train.py: {message}", file=sys.stderr)
                return 0
            if chief and resuming:
                write_atomic(run_dir.config_path, config.to_yaml())
            if chief:  # what it trains on (a resume on a changed corpus warns)
                keep_train_split_record(run_dir, trainer.train_record, resumed=bool(trainer.resumed_from))
            if trainer.resumed_from:
                print(f"train.py: resuming {run_dir.path} from step {trainer.resumed_from}", file=sys.stderr)
            signal.signal(signal.SIGTERM, previous_term)  # training installs its own (stop after the step)
            try:
                # on a terminal the log records go above the progress bar, not onto it (in a log: unchanged)
                with logs_above_bars():
                    result = trainer.train()
            except KeyboardInterrupt:  # a second signal: no checkpoint of this stop
                if fresh and not saved_checkpoints(run_dir):  # nothing to resume
                    if saved_checkpoints(run_dir, run_dir.best_dir):  # a validation before it saved best/
                        undone = "best kept"
                    else:  # undone as a failed start
                        discard(run_dir, before, made_parents)
                        undone, written = "undone", False
                raise
    except Exception as err:
        removed = chief and written and not run_dir.exists()
        code = report_failure(err, run_dir, removed, multi_worker=config.train.distribute == "multi_worker")
        if code is None:
            raise
        return code
    except KeyboardInterrupt:
        if undone == "undone":
            print(
                "train.py: interrupted twice before the first checkpoint; nothing kept (the run's start is undone)",
                file=sys.stderr,
            )
        elif undone == "best kept":
            print(
                f"train.py: interrupted twice before the first checkpoint; the best weights so far are kept in "
                f"{run_dir.best_dir} (evaluate or export them with --weights best; training this directory again "
                "starts from step 0 and replaces them)",
                file=sys.stderr,
            )
        elif not started:
            what = "the last checkpoint is intact" if resuming else "nothing was trained, nothing kept"
            print(f"train.py: interrupted before training started ({what})", file=sys.stderr)
        else:
            print(
                "train.py: interrupted twice; stopped without a new checkpoint (the last one is intact)",
                file=sys.stderr,
            )
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous_term)
    print(f"train.py: {result.message}", file=sys.stderr)
    if result.status in ("done", "early_stopped") and chief:
        print(_outputs(run_dir, _split_to_evaluate(config)), file=sys.stderr)
    return 0


def finished_rerun(run_dir: RunDir, saved, config) -> str:
    """What the rerun of a finished run with `config` says when it asks for no more steps or time than its `saved`
    config had (it then ends there, whatever else differs); "" otherwise."""
    if more_training(saved.train, config.train):
        return ""
    return run_dir.finished_message()


def _split_to_evaluate(config) -> str:
    """The split the next command evaluates: test, or validation if the corpus has no test split."""
    from data import folder
    from data.corpus import FOLDER
    from data.stream import split_exists

    data = config.data
    try:
        if data.dataset == FOLDER:  # test files that hold something (no line counts: train may be large)
            files = folder.listing(data).get(data.test_split, {})
            present = all(
                name in files and files[name].stat().st_size > 0 for name in (data.source, data.target)
            )
            return "test" if present else "validation"
        return "test" if split_exists(data, data.test_split) else "validation"
    except Exception:  # noqa: BLE001 - only a hint, after the training: never an error there
        return "test"


def _outputs(run_dir: RunDir, split: str = "test") -> str:
    """Where a finished run's results are, and the next command (evaluating `split`)."""
    kept = [f"final weights {run_dir.final_dir}"]
    if run_dir.best_dir.is_dir():
        kept.append(f"best-BLEU weights {run_dir.best_dir}")
    kept += [f"metrics {run_dir.metrics_path}", f"TensorBoard {run_dir.tensorboard_dir}"]
    return (
        f"train.py: {'; '.join(kept)}\n"
        f"train.py: next: python evaluate.py --model-dir {shlex.quote(str(run_dir.path))} --split {split}  "
        "(sacreBLEU, beam search" + (")" if split == "test" else "; the corpus has no test split)")
    )


def report_failure(err: Exception, run_dir: RunDir, removed: bool, multi_worker: bool = False) -> int | None:
    """Prints why training could not go on and returns the exit code; None for an error it does not know.

    `removed`: DIR's config.yaml, written before training started, is gone: the directory was deleted under the
    running process, whatever error that caused (a checkpoint or a metrics line that could not be written).
    `multi_worker`: TensorFlow's errors for a task of the cluster that stopped answering are told as such.
    """
    from data.errors import DataError, raised_in_pipeline
    from nmt.cluster import ClusterError, cluster_task, lost_task_message
    from nmt.trainer import TrainingError

    if multi_worker and (message := lost_task_message(err, cluster_task()[2])):
        print(f"train.py: training failed: {message}", file=sys.stderr)
        return 1

    if removed and not isinstance(err, RunDirError):
        print(f"train.py: {run_dir.removed_message()} ({type(err).__name__}: {err})", file=sys.stderr)
        return 3
    if isinstance(err, RunDirError):
        print(f"train.py: {err}", file=sys.stderr)
        return 3
    if isinstance(err, ConfigError):  # found only once TensorFlow looks (train.distribute: tpu without a TPU)
        print(f"train.py: config error: {err}", file=sys.stderr)
        return 2
    if isinstance(err, DataError):
        print(f"train.py: data error: {err}", file=sys.stderr)
        return 1
    # a DataError inside the input pipeline (a batch read from a damaged file), handed on as TensorFlow's error
    if message := raised_in_pipeline(err):
        print(f"train.py: data error: {message}", file=sys.stderr)
        return 1
    if isinstance(err, ClusterError):
        print(f"train.py: cluster error: {err}", file=sys.stderr)
        return 1
    if isinstance(err, TrainingError):
        print(f"train.py: training failed: {err}", file=sys.stderr)
        return 1
    if problem := file_problem(err, run_dir):
        print(
            f"train.py: training failed: {problem}; once that is fixed, the same command carries on from the "
            "last checkpoint (if there is one)",
            file=sys.stderr,
        )
        return 1
    return None


def file_problem(err: Exception, run_dir: RunDir) -> str:
    """What a file of the run directory that could not be written (or read) says, "" for another error: an OSError
    (a full disk writing config.yaml or metrics.jsonl, an entry of DIR replaced by a directory), or TensorFlow's
    error for a file under DIR (`final/` or `tensorboard/` made a file, a full disk under TensorBoard's writer)."""
    if isinstance(err, OSError):
        return f"{err.strerror or err}: {err.filename}" if err.filename else str(err)
    import tensorflow as tf

    from nmt.checkpoints import first_line

    if isinstance(err, tf.errors.OpError):
        text = first_line(err)
        if any(str(path) in text for path in (run_dir.path, run_dir.path.absolute())):
            return text
    return ""


if __name__ == "__main__":
    try:
        code = main()
    except KeyboardInterrupt:  # before main's own handling (the imports above, argument parsing)
        print("train.py: interrupted before training started (nothing was written)", file=sys.stderr)
        code = 130
    exit_now(code)  # not after the interpreter's teardown: its wait for TensorFlow's threads (nmt.cli)
