"""Distil a teacher into a training corpus: its translations of the training sources, as a folder corpus.

    python distill.py --model-dir runs/teacher --output distilled/
    python distill.py --model-dir runs/a --ensemble runs/b --output distilled/ --beam 4 --alpha 1.4
    python train.py --config configs/base.yaml --model-dir runs/student \\
        --set data.dataset=folder data.folder=distilled/       # the command distill.py prints at the end

Sequence-level knowledge distillation (Kim and Rush, 2016): a student trained on a teacher's (or an ensemble's)
beam-search translations of the training sources reaches the teacher's quality with one model (on Multi30k, a
base-size student of a two-run ensemble: docs/distill-2026-12-05-zen4/). The corpus is the one the teacher trained
on (its run directory's `data:` section; `--set data.KEY=VALUE` changes it, e.g. a larger or other training split).
The output folder holds `<source>.train.txt` with `<target>.train.txt` (the translations), and the corpus's real
validation and test pairs as `<lang>.validation.txt` and `<lang>.test.txt` (see nmt/distill.py).

Resumable: run the same command again after a stop (SIGINT, SIGTERM, a crash) and it goes on from the last chunk of
--chunk-size lines, to the same file an uninterrupted run writes; a finished folder is left as it is (and is only
read: it may sit on a read-only mount). The folder cannot be trained on until every line is translated. A folder
made with other settings, or a non-empty folder that is not a distillation's, is refused and left untouched; so is
a folder another distill.py is writing (a lock, taken before the teachers load). Exit codes: 0 ok, 1 run-directory,
corpus or folder problem, 2 usage error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import shlex

from nmt import cli, cli_files

log = logging.getLogger("nmt")


# The data settings that choose which text is translated (the rest, the tokenizer's and batching's, are the
# teacher's own and would have no effect); source and target are checked against the teacher's (`_corpus`).
CORPUS_KEYS = ("dataset", "folder", "data_dir", "manual_dir", "train_split", "validation_split", "test_split",
               "source", "target")  # fmt: skip
CORPUS_SETTINGS = tuple(f"data.{key}" for key in CORPUS_KEYS)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Translate a corpus's training sources with a teacher run (or an ensemble): a folder corpus "
        "for a student (sequence-level knowledge distillation). Resumable.",
        epilog="Then: train.py --config CONFIG --set data.dataset=folder data.folder=OUTPUT (printed at the end).",
    )
    parser.add_argument("--model-dir", required=True, help="the teacher: a run directory written by train.py")
    parser.add_argument(
        "--output", required=True, help="the folder corpus to write (new, empty, or to resume)"
    )
    parser.add_argument(
        "--beam", type=int, default=None, help="beam size (1 = greedy); default: eval.beam_size"
    )
    parser.add_argument(
        "--alpha", type=float, default=None, help="beam length-penalty exponent; default: eval.alpha"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        nargs="+",
        action="extend",
        default=[],
        metavar="data.KEY=VALUE",
        help="choose another corpus than the teacher's (repeatable; keys: "
        + ", ".join(f"data.{key}" for key in CORPUS_KEYS)
        + "), e.g. data.train_split=train[:50%%]",
    )
    parser.add_argument(
        "--batch-size", type=int, default=None, help="sentences per batch; default eval.batch_size"
    )
    parser.add_argument(
        "--chunk-size",
        type=int,
        default=1000,
        help="lines translated between two saves of the progress (a resumed folder keeps its own)",
    )
    cli.add_weights_argument(parser)
    cli.add_xla_argument(parser)
    cli.add_streams_argument(parser, engines=False)  # the teachers decode with TensorFlow
    cli.add_ensemble_argument(parser)
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    parser.set_defaults(engine="tensorflow")  # for the shared --ensemble checks
    return parser.parse_args(argv)


def _check(args: argparse.Namespace) -> None:
    cli.check_search(args.beam, args.alpha)
    if args.batch_size is not None and args.batch_size < 1:
        raise cli.CliError(f"--batch-size must be at least 1, got {args.batch_size}", exit_code=2)
    if args.chunk_size < 1:
        raise cli.CliError(f"--chunk-size must be at least 1, got {args.chunk_size}", exit_code=2)
    others = [text for text in args.overrides if text.split("=", 1)[0].strip() not in CORPUS_SETTINGS]
    if others:
        raise cli.CliError(
            f"--set {' '.join(others)}: only the settings that choose the corpus apply here ("
            + ", ".join(CORPUS_SETTINGS)
            + "); the teacher's model, tokenizer and search settings are its own (--beam and --alpha change the "
            "search)",
            exit_code=2,
        )
    cli.check_streams(args.streams)
    model_dir = cli_files.check_model_dir(args.model_dir)
    # --alpha for a teacher that searches greedily (eval.beam_size 1, no --beam): refused as translate.py refuses it
    # (before 2026-12-07c the corpus was distilled greedily, the length penalty ignored, exit 0)
    if args.alpha is not None and args.beam is None and model_dir.load_config().eval.beam_size == 1:
        raise cli.CliError(cli.GREEDY_RUN_ALPHA, exit_code=2)
    cli.check_ensemble(args)
    from pathlib import Path

    from nmt.distill import DistillError, check_output

    try:
        check_output(Path(args.output))
    except DistillError as err:
        raise cli.CliError(str(err), exit_code=1) from err


def _corpus(args: argparse.Namespace):
    """The teacher's corpus settings with --set applied; its languages may not change (exit 2)."""
    from data.config import load_data_config
    from nmt.run_dir import RunDir

    config = RunDir(args.model_dir).path / "config.yaml"
    teacher, _ = load_data_config(config)
    data, _ = load_data_config(config, args.overrides)
    for key in ("source", "target"):
        if getattr(data, key) != getattr(teacher, key):
            raise cli.CliError(
                f"--set data.{key}={getattr(data, key)}: the teacher translates {teacher.source} into "
                f"{teacher.target}; a corpus of other languages needs another teacher",
                exit_code=2,
            )
    from pathlib import Path

    from data.stream import FOLDER, split_exists
    from nmt.distill import missing_validation

    # A split the command names must exist; the teacher's test split may not (the folder gets none), but there is
    # nothing to translate without a train split, and a student cannot train without a validation split. Checked
    # here, before the folder's lock and TensorFlow, for a folder corpus or a split the command names (a TFDS corpus
    # is opened by TensorFlow; its own train or validation split missing is the library's DistillError, exit 1).
    if (data.dataset == FOLDER or data.train_split != teacher.train_split) and (
        not data.train_split or not split_exists(data, data.train_split)
    ):
        raise cli.CliError(
            f"data.train_split={data.train_split or '(none)'}: the corpus has no such split, so there is nothing to "
            "translate; name one with --set data.train_split=NAME",
            exit_code=2,
        )
    named = data.validation_split != teacher.validation_split
    if (data.dataset == FOLDER or named) and (
        not data.validation_split or not split_exists(data, data.validation_split)
    ):
        raise cli.CliError(missing_validation(data.validation_split), exit_code=2)
    split = data.test_split
    if split and split != teacher.test_split and not split_exists(data, split):
        raise cli.CliError(f"--set data.test_split={split}: the corpus has no such split", exit_code=2)
    if data.dataset == FOLDER:
        corpus, output = Path(data.folder).resolve(), Path(args.output).resolve()
        if (
            output == corpus or corpus in output.parents
        ):  # the corpus would hold a folder that is not one of its files
            raise cli.CliError(
                f"--output {args.output} is inside the corpus it distils (data.folder={data.folder}): give a "
                "folder outside it",
                exit_code=2,
            )
    return data


@contextlib.contextmanager
def _held(output: str):
    """The folder's lock, taken before TensorFlow and the teachers load, so that a second process is refused at
    once. Not for a finished folder (it may sit on a read-only mount: `distill` reads it without the lock), nor for
    a folder that cannot be written but holds a manifest (`distill` names the problem). A run that fails before
    writing anything leaves no trace: it removes the lock file it made and, if it made the folder, the folder (and
    the parents it made), while it holds the lock."""
    from pathlib import Path

    from nmt.distill import LOCK, MANIFEST, DistillError, finished_manifest, hold

    folder = Path(output)
    if finished_manifest(folder) is not None:
        yield
        return
    made = []  # the folders a mkdir will make, the folder itself first
    for path in (folder, *folder.parents):
        if path.exists():
            break
        made.append(path)
    lock_made = not (folder / LOCK).exists()
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(hold(folder))
        except DistillError as err:
            raise cli.CliError(str(err), exit_code=1) from err
        except OSError as err:
            if not (folder / MANIFEST).is_file():
                raise cli.CliError(f"cannot write {output}: {err}", exit_code=1) from err
            made, lock_made = [], False  # not locked: nothing to clean up
        try:
            yield
        finally:
            with contextlib.suppress(OSError):  # never in place of the error that ends the run
                # this run holds the lock it made and wrote nothing: no trace (a process waiting for the lock
                # finds its file gone and opens the folder's again: nmt.distill_folder._Lock)
                if lock_made and [p.name for p in folder.iterdir()] == [LOCK]:
                    (folder / LOCK).unlink(missing_ok=True)
                    for path in made:
                        path.rmdir()  # only while empty


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cli.setup_logging(args.verbose)
    _check(args)
    data = _corpus(args)
    with _held(args.output):
        return _distill(args, data)


def student_overrides(data, output, references) -> list[str]:
    """The `--set` of the printed student command: the folder `output` (splits train and `references`), in the
    teacher's languages, lowercased as the teacher when it was (its translations are lowercase: a cased student
    would learn lowercase targets and be scored cased; before 2026-12-07d the command left that out)."""
    from pathlib import Path

    student = ["data.dataset=folder", f"data.folder={Path(output).resolve()}", f"data.source={data.source}",
               f"data.target={data.target}"]  # fmt: skip
    for name in ("train", *references):  # whatever the student's config names its splits
        student.append(f"data.{name}_split={name}")
    if data.lowercase:
        student.append("data.lowercase=true")
    return student


def _distill(args: argparse.Namespace, data) -> int:
    cli.quiet_tensorflow()
    cli.decoding_kernels()

    import dataclasses
    from pathlib import Path

    from tqdm.contrib.logging import logging_redirect_tqdm

    from nmt.distill import DistillError, distill, settings_of
    from nmt.translator import Translator

    # absolute paths: the weights recorded in the folder's settings do not depend on how a path was spelled
    translator = Translator.from_run_dir(
        Path(args.model_dir).resolve(),
        weights=args.weights,
        xla=cli.xla_setting(args.xla),
        batch_size=args.batch_size,
        streams=args.streams,
        ensemble=tuple(Path(path).resolve() for path in args.ensemble),
    )
    if args.alpha is not None:
        translator.eval_config = dataclasses.replace(translator.eval_config, alpha=args.alpha)
    beam = translator.eval_config.beam_size if args.beam is None else args.beam
    settings = settings_of(
        data, teachers=[args.model_dir, *args.ensemble], weights=translator.weights, beam_size=beam,
        alpha=translator.eval_config.alpha,
    )  # fmt: skip
    warnings = cli.LineWarnings(source=f"{data.source}.train.txt")
    keep = translator.max_source_length - 1

    def truncated(index: int, length: int | None) -> None:
        warnings(index + 1, "truncated", cli.truncation_message(length, keep))

    try:
        with logging_redirect_tqdm():
            summary = distill(
                translator, data, args.output, settings=settings, beam_size=beam, chunk_size=args.chunk_size,
                progress=True, on_truncated=truncated,
            )  # fmt: skip
    except DistillError as err:
        raise cli.CliError(str(err), exit_code=1) from err
    warnings.summary()
    log.info(
        "%s: %d training pairs (%d translated now, %d before), real pairs: %s",
        summary.output, summary.lines, summary.translated, summary.resumed_from,
        ", ".join(f"{split} {count}" for split, count in summary.references.items()) or "none",
    )  # fmt: skip
    student = student_overrides(data, summary.output, summary.references)
    log.info(
        "train a student: python train.py --config CONFIG --model-dir DIR --set %s",
        " ".join(shlex.quote(text) for text in student),
    )
    print(summary.output)
    return 0


if __name__ == "__main__":
    cli.stop_on_sigterm()  # SIGTERM stops like SIGINT: exit 130, the progress kept for a resume
    cli.run_script(main)
