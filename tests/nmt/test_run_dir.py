"""nmt.run_dir: the records of metrics.jsonl as a resumed run and the CLIs read them, whatever else is in the file."""

import json
from pathlib import Path

from nmt.run_dir import RunDir


def test_metrics_lines_that_are_not_records_are_skipped(tmp_path):
    """A line cut by a crash, JSON that is not an object, a line with invalid UTF-8: skipped by the readers (before:
    a traceback for the last two). A resume's `drop_metrics_after` drops (and counts) the lines that do not parse,
    and keeps JSON that is not an object (no step to compare), with the records around them."""
    run_dir = RunDir(tmp_path)
    records = [
        {"step": 1, "loss": 2.0},
        {"step": 2, "tag": "validation", "loss": 1.5},
        {"step": 3, "loss": 1.0},
    ]
    lines = [json.dumps(records[0]), "[1, 2]", json.dumps(records[1]), '"text"', "7", json.dumps(records[2])]
    run_dir.metrics_path.write_bytes(
        ("\n".join(lines) + "\n").encode() + b'{"step": \xff\xfe\n{"step": 4, "lo'
    )
    assert run_dir.read_metrics() == records
    assert run_dir.drop_metrics_after(2) == 3  # step 3, the undecodable line, the cut line
    assert run_dir.read_metrics() == records[:2]


def test_weights_a_stopped_run_lacks_are_refused_naming_the_ones_it_has(tmp_path):
    """--weights final of a run stopped before its end: the message says why and what to use (before 2026-12-07:
    "no trained weights found (looked for final)" beside a run full of checkpoints)."""
    import pytest

    from nmt.run_dir import RunDirError

    run = RunDir(tmp_path)
    (run.checkpoint_dir).mkdir(parents=True)
    (run.checkpoint_dir / "checkpoint").write_text('model_checkpoint_path: "ckpt-115"\n', encoding="utf-8")
    message = "no final weights (its training has not finished: rerun train.py to end it); it has latest: use --weights latest"
    with pytest.raises(RunDirError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run.weights_prefix("final")
    with pytest.raises(RunDirError, match=r"no best weights; it has latest: use --weights latest"):
        run.weights_prefix("best")


def test_a_run_is_finished_when_its_last_record_is_the_final_evaluation(tmp_path):
    """make train evaluates only such a run (`python -m nmt.run_dir --finished DIR`): final/ alone is not enough, a
    run resumed past an earlier end and stopped again keeps the old final/."""
    import subprocess
    import sys

    run = RunDir(tmp_path)

    def finished_cli() -> int:
        command = [sys.executable, "-m", "nmt.run_dir", "--finished", str(tmp_path)]
        return subprocess.run(command, cwd=Path(__file__).resolve().parents[2], timeout=120).returncode

    assert not run.finished()
    run.final_dir.mkdir()
    (run.final_dir / "checkpoint").write_text('model_checkpoint_path: "ckpt-60"\n', encoding="utf-8")
    run.append_metrics({"step": 60, "tag": "final", "loss": 1.0})
    assert run.finished() and finished_cli() == 0
    run.append_metrics({"step": 80, "tag": "validation", "loss": 0.9})  # trained on past it, then stopped
    assert not run.finished() and finished_cli() == 1


def _save_files(directory: Path, *steps: int) -> None:
    """What a CheckpointManager leaves of checkpoints `steps` in `directory` (the last the latest); empty files."""
    directory.mkdir(parents=True, exist_ok=True)
    for step in steps:
        for suffix in ("index", "data-00000-of-00001"):
            (directory / f"ckpt-{step}.{suffix}").write_bytes(b"")
    names = "".join(f'all_model_checkpoint_paths: "ckpt-{step}"\n' for step in steps)
    (directory / "checkpoint").write_text(
        f'model_checkpoint_path: "ckpt-{steps[-1]}"\n{names}', encoding="utf-8"
    )


def test_a_run_resumed_past_its_end_is_not_finished_until_it_ends_again(tmp_path, caplog):
    """A finished run (final@60) rerun with a larger budget and stopped at step 71 before its next evaluation (no new
    record), or whose new final evaluation (final/ of step 71) was interrupted: not finished, so make train does not
    evaluate the old final/ (before: finished, as the last record was still the old "final"). --weights auto and
    final still read final/, and say it is older than the training; once the run ends again at 71, it is finished."""
    import logging
    import subprocess
    import sys

    run = RunDir(tmp_path)

    def finished_cli() -> int:
        command = [sys.executable, "-m", "nmt.run_dir", "--finished", str(tmp_path)]
        return subprocess.run(command, cwd=Path(__file__).resolve().parents[2], timeout=120).returncode

    _save_files(run.final_dir, 60)
    _save_files(run.checkpoint_dir, 50, 55, 60)
    run.append_metrics({"step": 60, "tag": "validation", "loss": 1.0})
    run.append_metrics({"step": 60, "tag": "final", "loss": 1.0, "bleu": 3.0})
    assert run.finished()
    _save_files(run.checkpoint_dir, 55, 60, 65, 70, 71)  # resumed past the end, stopped by a signal at 71
    assert not run.finished() and finished_cli() == 1
    with caplog.at_level(logging.WARNING, logger="nmt.run_dir"):
        for which in ("auto", "final", "auto"):
            assert run.weights_prefix(which) == str(run.final_dir / "ckpt-60")
    told = [r.getMessage() for r in caplog.records if r.name == "nmt.run_dir"]
    assert told == [
        f"{run.final_dir / 'ckpt-60'} holds the weights of step 60, where the run first ended; it has trained on to "
        "step 71 since and is not finished (rerun train.py to end it, or use --weights latest for the weights of "
        "step 71)"
    ]  # once per process: evaluate.py reads the weights twice
    _save_files(run.final_dir, 71)  # ended again; its final evaluation interrupted (no record of it yet)
    assert not run.finished() and finished_cli() == 1
    assert run.finished_message() == ""
    run.append_metrics({"step": 71, "tag": "final", "loss": 0.9, "bleu": 3.5})
    assert run.finished() and finished_cli() == 0
    # what train.py says when it reruns it before the trainer can (another global batch, checkpoints deleted)
    assert run.finished_message() == (
        f"already finished at step 71: validation loss 0.9000, BLEU 3.50; final weights in {run.final_dir} "
        "(nothing to do)"
    )


def test_the_finished_line_says_when_its_bleu_is_of_the_first_sentences_only(tmp_path):
    """With train.bleu_max_sentences the final record's BLEU is of the first N validation sentences, its loss of all
    M: the rerun's line says "(first N of M sentences)" as the step line does (before: a BLEU read as the whole
    split's; found by a review). All of them scored, or a record from before the counts: the BLEU alone."""
    run = RunDir(tmp_path)
    _save_files(run.final_dir, 60)
    _save_files(run.checkpoint_dir, 60)
    end = f"; final weights in {run.final_dir} (nothing to do)"
    final = {"step": 60, "tag": "final", "loss": 1.0, "bleu": 3.0}
    for counts, shown in [
        ({"bleu_sentences": 3, "validation_sentences": 40}, ", BLEU 3.00 (first 3 of 40 sentences)"),
        ({"bleu_sentences": 40, "validation_sentences": 40}, ", BLEU 3.00"),
        ({}, ", BLEU 3.00"),
    ]:
        run.append_metrics(final | counts)
        assert run.finished_message() == f"already finished at step 60: validation loss 1.0000{shown}{end}"


def test_a_config_yaml_that_is_not_a_file_is_named_and_left_alone(tmp_path, capsys):
    """config.yaml replaced by a directory or a broken link: train.py exits 3 naming it, before writing anything (before
    2026-12-07c: read as a new run, then an IsADirectoryError traceback from the atomic write), and the readers
    (evaluate/translate/export) name it too instead of calling it missing."""
    import pytest
    import yaml

    import train
    from nmt.run_dir import RunDirError
    from tests.run_fixture import tiny_config_tree, write_corpus

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_config_tree(write_corpus(tmp_path / "corpus"))), encoding="utf-8")
    for name, make, what in (
        ("dir", lambda p: p.mkdir(), "a directory"),
        ("link", lambda p: p.symlink_to(tmp_path / "nowhere"), "a broken link"),
    ):
        run = RunDir(tmp_path / name)
        run.path.mkdir()
        make(run.config_path)
        assert train.main(["--config", str(config), "--model-dir", str(run.path)]) == 3
        assert f"{run.config_path} is {what}, not the run's config" in capsys.readouterr().err
        assert [p.name for p in run.path.iterdir()] == ["config.yaml"]
        with pytest.raises(RunDirError, match=f"is {what}, not the run's config"):
            run.require()


def test_the_finished_command_has_a_help_and_a_usage_error():
    """`python -m nmt.run_dir --help` exits 0 with its usage (before 2026-12-07e: exit 1, as for a run that is not
    finished); a wrong command line is a usage error, exit 2, not "not finished"."""
    import subprocess
    import sys

    def run(*args):
        command = [sys.executable, "-m", "nmt.run_dir", *args]
        root = Path(__file__).resolve().parents[2]
        return subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=120)

    done = run("--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m nmt.run_dir --finished DIR")
    for args in ([], ["--finish", "x"], ["--finished"]):
        done = run(*args)
        assert done.returncode == 2 and done.stderr.startswith("usage: "), args


def test_a_failed_atomic_write_names_its_file_and_leaves_nothing(tmp_path):
    """A full disk (RLIMIT_FSIZE: EFBIG, as ENOSPC) while metrics.jsonl or config.yaml is rewritten: the error names
    the file (before 2026-12-07e a bare "[Errno 28] No space left on device"; found by a review), no temporary file
    stays, and the old file is whole."""
    import resource
    import signal
    import subprocess
    import sys

    def full_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, resource.RLIM_INFINITY))

    target = tmp_path / "metrics.jsonl"
    target.write_text("old\n")
    code = (
        "import sys\nfrom pathlib import Path\nfrom nmt.run_dir import write_atomic\n"
        "try:\n    write_atomic(Path(sys.argv[1]), 'x' * 4096)\nexcept OSError as err:\n    print(err)\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code, str(target)], cwd=root, capture_output=True, text=True, timeout=120,
        preexec_fn=full_disk,
    )  # fmt: skip
    assert done.stdout.strip() == f"[Errno 27] File too large: '{target}'", done.stderr
    assert target.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
