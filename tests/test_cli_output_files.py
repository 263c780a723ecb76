"""translate.py/evaluate.py output paths: an empty path refused before any work, `--output /dev/stdout` written
through stdout, a report that a file name's undecodable byte cannot stop, and the help text of --xla."""

import io
import os
import sys
from pathlib import Path

import pytest

from nmt.cli import CliError
from nmt.cli_files import check_output_file
from tests.run_fixture import tiny_corpus

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "script, args, option",
    [
        ("translate", ["--output", ""], "--output"),
        ("translate", ["--input", ""], "--input"),
        ("translate", ["--score", ""], "--score"),
        ("translate", ["--plot-attention", ""], "--plot-attention"),
        ("evaluate", ["--output", ""], "--output"),
        ("evaluate", ["--source", "", "--reference", "r.de"], "--source"),
    ],
)
def test_an_empty_path_is_a_usage_error(script, args, option, tmp_path):
    """`--output "$OUT"` with OUT unset. Before 2026-12-07 translate.py decoded everything, then failed to rename
    its temporary file over the current folder (exit 1, the temporary file left in the parent folder);
    --plot-attention "" was ignored; evaluate.py wrote to its default file. Refused before the run directory is
    even looked at (here it does not exist)."""
    sys.path.insert(0, str(ROOT))
    main = __import__(script).main
    with pytest.raises(CliError) as caught:
        main(["--model-dir", str(tmp_path / "no-run"), *args])
    assert caught.value.exit_code == 2 and str(caught.value) == f"{option} is empty: give a file path"


def test_check_output_file_refuses_an_empty_path_and_a_descriptor_not_open():
    with pytest.raises(CliError, match="^--output is empty: give a file path$"):
        check_output_file("", "--output")
    # the highest descriptor number this process may have, never open here
    unopened = f"/dev/fd/{os.sysconf('SC_OPEN_MAX') - 1}"
    with pytest.raises(CliError, match=f"^--output {unopened} names a file descriptor that is not open$"):
        check_output_file(unopened, "--output")
    check_output_file("/dev/stdout", "--output")


def test_evaluate_help_says_xla_auto_counts_the_sentences(capsys):
    """evaluate.py has no --chunk-size: XLA auto is decided on all the sentences it evaluates."""
    sys.path.insert(0, str(ROOT))
    import evaluate
    import translate

    helps = {}
    for module in (evaluate, translate):
        with pytest.raises(SystemExit):
            module.parse_args(["--model-dir", "x", "--help"])
        helps[module.__name__] = " ".join(capsys.readouterr().out.split())
    assert "--chunk-size" not in helps["evaluate"]
    assert "measured to pay: 16,000 sentences in all), on or off" in helps["evaluate"]
    assert "16,000 lines of an input file, or of each --chunk-size chunk of a pipe" in helps["translate"]


def test_evaluate_escapes_an_undecodable_file_name_on_a_strict_utf8_stdout(
    tiny_run_dir, tmp_path, monkeypatch
):
    """`evaluate.py --source <b"\\xff.en">` under a strict UTF-8 stdout (a desktop locale): before 2026-12-07 the
    report's file name (a lone surrogate in Python) ended in a UnicodeEncodeError traceback after the whole decode,
    the scores lost. In process, stdout a strict UTF-8 text stream (`--output /dev/stdout` written through
    stdout: tests/nmt/test_text_io.py)."""
    sys.path.insert(0, str(ROOT))
    import evaluate

    pairs = tiny_corpus()["test"][:3]
    source = os.path.join(os.fsencode(tmp_path), b"\xff.en")
    with open(source, "wb") as handle:
        handle.write("".join(f"{s}\n" for s, _ in pairs).encode("utf-8"))
    reference = tmp_path / "ref.de"
    reference.write_text("".join(f"{t}\n" for _, t in pairs), encoding="utf-8")
    stdout = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    monkeypatch.setattr(sys, "stdout", stdout)
    argv = ["--model-dir", str(tiny_run_dir), "--source", os.fsdecode(source), "--reference", str(reference)]
    assert evaluate.main([*argv, "--beam", "2", "--output", str(tmp_path / "hyp.de")]) == 0
    stdout.flush()
    report = stdout.buffer.getvalue().decode("utf-8")
    assert "data           \\udcff.en: 3 sentences" in report
    # the memorised test split: beam search gives the references back (tests/test_cli_evaluate.py)
    assert (tmp_path / "hyp.de").read_text(encoding="utf-8").splitlines() == [t for _, t in pairs]
