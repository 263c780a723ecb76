"""translate.py (and the shared CLI behaviour of evaluate.py and export.py).

Run as subprocesses where the process is under test (--help, errors before TensorFlow is imported, pipes, signals,
make translate); otherwise `main` runs in this process through `nmt.cli.run`, the CLI's own error handling
(`in_process`): a new process would cost ~4 s of imports per case. One difference: in this process TensorFlow is
already imported, so the decoding kernels are the test process's (oneDNN), not the CLIs' default where that is
Eigen (`nmt.cli.decoding_kernels`); the subprocess cases run that default.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from xml.etree import ElementTree

import pytest

from tests.run_fixture import salads, shared_ct2_export, tiny_corpus

ROOT = Path(__file__).resolve().parent.parent
RUN_DEADLINE = 600  # seconds before a process that should have reacted counts as hung


def cli(script, *args, stdin=b"", timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    return subprocess.run(
        [sys.executable, str(ROOT / script), *map(str, args)],
        input=stdin,
        capture_output=True,
        cwd=ROOT,
        env=env,
        timeout=timeout,
    )


def in_process(script: str, *args, capsys):
    """`<script>.main(args)` in this process through `nmt.cli.run`: (exit code, pytest's captured stdout/stderr).
    Use with the `restore_logging` fixture (the CLI replaces the root logging handlers)."""
    import importlib

    from tests.faults.helpers import run_main

    code = run_main(importlib.import_module(script.removesuffix(".py")), list(map(str, args)))
    return code, capsys.readouterr()


def listing(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize("script", ["translate.py", "evaluate.py", "export.py", "distill.py"])
def test_help(script):
    done = cli(script, "--help")
    assert done.returncode == 0
    assert b"--model-dir" in done.stdout


@pytest.mark.parametrize("script", ["translate.py", "evaluate.py", "export.py", "distill.py"])
def test_missing_model_dir_is_one_clear_error(script, tmp_path):
    done = cli(script, "--model-dir", tmp_path / "nope", "--output", tmp_path / "out")
    assert done.returncode != 0
    assert (
        done.stderr.decode().strip().splitlines()[-1]
        == f"error: model directory does not exist: {tmp_path / 'nope'}"
    )
    assert not (tmp_path / "out").exists()


def test_missing_input_file_writes_nothing(tiny_run_dir, tmp_path):
    before = listing(tiny_run_dir)
    done = cli("translate.py", "--model-dir", tiny_run_dir, "--input", tmp_path / "missing.txt")
    assert done.returncode == 2
    assert b"input file not found" in done.stderr
    assert listing(tiny_run_dir) == before


def test_usage_errors_name_the_option_and_an_input_is_never_overwritten(tiny_run_dir, tmp_path, monkeypatch):
    """Before TensorFlow loads (CliError, exit 2). Before 2026-12-06: --chunk-size 0 named --nbest too, a directory
    given to --plot-attention was called "output", and --output equal to --input overwrote the input with its
    translation."""
    sys.path.insert(0, str(ROOT))
    import translate
    from nmt.cli import CliError
    from nmt.run_dir import RunDirError

    source = tmp_path / "in.txt"
    source.write_text("a cat\n")
    run = ["--model-dir", str(tiny_run_dir)]
    cases = [
        (["--input", str(source), "--chunk-size", "0"], "--chunk-size must be at least 1, got 0"),
        (["--input", str(source), "--plot-attention", str(tmp_path)], f"--plot-attention is a directory, not a file: {tmp_path}"),
        (["--input", str(source), "--output", str(tmp_path)], "--output is a directory"),
        (["--input", str(source), "--output", str(source)], f"--input and --output are the same file ({source})"),
        (["--input", str(source), "--output", str(tmp_path / "o.svg"), "--plot-attention", str(tmp_path / "o.svg")],
         "--output and --plot-attention are the same file"),
        (["--input", str(source), "--score", str(tmp_path / "gone"), "--output", str(tmp_path / "gone")],
         "--score: input file not found"),  # what is wrong: not "the same file"
    ]  # fmt: skip
    for args, message in cases:
        with pytest.raises(CliError) as caught:
            translate.main([*run, *args])
        assert caught.value.exit_code == 2
        assert message in str(caught.value), str(caught.value)
    assert source.read_text() == "a cat\n"
    with pytest.raises(RunDirError, match=f"model directory is a file, not a run directory: {source}"):
        translate.main(["--model-dir", str(source), "--input", str(source)])
    monkeypatch.setattr(sys, "stdout", None)  # what Python has when started with `>&-`
    with pytest.raises(CliError, match="standard output is closed: give --output FILE"):
        translate.main([*run, "--input", str(source)])


def test_a_closed_stdin_is_one_clear_error(tiny_run_dir):
    """`translate.py <&-`: Python starts without sys.stdin (before: AttributeError, a traceback)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "translate.py"), "--model-dir", str(tiny_run_dir)],
        capture_output=True, cwd=ROOT, timeout=300, preexec_fn=lambda: os.close(0),
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == b""
    assert (
        done.stderr.decode().strip().splitlines()[-1] == "error: standard input is closed: give --input FILE"
    )


def test_bad_weights_are_reported(tiny_run_dir, tmp_path, capsys, restore_logging):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_run_dir, broken)
    for data in (broken / "final").glob("*.data-*"):
        data.write_bytes(b"not a checkpoint")
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("The cat sees a ball.\n")
    before = listing(broken)
    code, captured = in_process("translate.py", "--model-dir", broken, "--input", source, "--output", output,
                                capsys=capsys)  # fmt: skip
    assert code == 1 and not output.exists()
    # one line, no traceback (an exception in the main thread would also have failed run_main)
    assert "Traceback" not in captured.err
    assert captured.err.strip().splitlines()[-1].startswith("error: cannot restore model weights from ")
    assert listing(broken) == before


def test_messy_file_gives_one_line_per_line(tiny_run_dir, tmp_path, capsys, restore_logging):
    good = [s for s, _ in tiny_corpus()["test"][:4]]
    translations = [t for _, t in tiny_corpus()["test"][:4]]  # the fixture memorised these (any CPU)
    lines = [
        b"\xef\xbb\xbf" + good[0].encode(),  # a byte order mark (Windows editors)
        b"",
        b"The cat \xff\xfe sees a ball.",  # invalid UTF-8
        good[3].replace(" ", "\x00 ", 1).encode(),  # NUL byte
        " ".join(["word"] * 5000).encode(),  # far over the model's 64 positions
        b"   ",
        good[1].encode() + b"\r",  # CRLF line
        good[2].encode(),  # no final newline
    ]
    source = tmp_path / "input.txt"
    source.write_bytes(b"\n".join(lines))
    output, plot = tmp_path / "output.txt", tmp_path / "attention.svg"
    before = listing(tiny_run_dir)
    code, captured = in_process("translate.py", "--model-dir", tiny_run_dir, "--input", source, "--output", output,
                                "--plot-attention", plot, capsys=capsys)  # fmt: skip
    stderr = captured.err
    assert code == 0, stderr[-3000:]
    out = output.read_bytes().decode("utf-8").split("\n")
    assert out[-1] == "" and len(out[:-1]) == len(lines)
    out = out[:-1]
    assert out[1] == "" and out[5] == ""
    # The BOM, the CR, the NUL and the missing final newline are dropped: what is left is a sentence the fixture
    # knows.
    assert [out[0], out[6], out[7], out[3]] == translations
    assert "line 3: invalid UTF-8" in stderr
    assert "line 4: removed 1 NUL byte" in stderr
    assert "line 5: " in stderr and "translated only the first 63" in stderr
    svg = ElementTree.parse(plot).getroot()  # well-formed XML
    cells = svg.findall("{http://www.w3.org/2000/svg}rect")[1:]  # after the background
    assert svg.tag == "{http://www.w3.org/2000/svg}svg" and len(cells) > 0
    assert listing(tiny_run_dir) == before  # translating writes nothing into the run directory

    # --no-cache and --nbest: one line per input line, the first candidates are the same (stdin and stdout:
    # test_input_from_a_pipe_is_read_once).
    nbest = tmp_path / "nbest.txt"
    code, captured = in_process("translate.py", "--model-dir", tiny_run_dir, "--input", source, "--output", nbest,
                                "--beam", 2, "--nbest", 2, "--no-cache", capsys=capsys)  # fmt: skip
    stderr = captured.err
    assert code == 0, stderr[-3000:]
    rows = nbest.read_bytes().decode("utf-8").split("\n")
    assert rows[-1] == "" and len(rows[:-1]) == len(lines)
    # Blank lines never reach the model; every other line does (2 candidates, whatever their text).
    assert rows[1] == "" and rows[5] == ""
    for index in (0, 2, 3, 4, 6, 7):
        fields = rows[index].split("\t")
        assert len(fields) == 4 and fields[0] == out[index] and float(fields[1]) >= float(fields[3])


def test_alpha_is_the_length_penalty_of_the_search(tiny_run_dir, tmp_path, capsys, restore_logging):
    """--alpha 3 translates as the Translator API with eval.alpha = 3 (in this process), which differs from the run's
    own eval.alpha on unseen word salads: an --alpha that did not reach the search would fail."""
    import dataclasses

    from nmt.translator import Translator

    lines = salads(40, seed=5)
    source, output = tmp_path / "salads.txt", tmp_path / "output.txt"
    source.write_text("\n".join(lines) + "\n")
    translator = Translator.from_run_dir(tiny_run_dir, xla=False)
    configured = translator.translate(lines, beam_size=4)
    translator.eval_config = dataclasses.replace(translator.eval_config, alpha=3.0)
    expected = translator.translate(lines, beam_size=4)
    assert expected != configured
    code, captured = in_process(
        "translate.py", "--model-dir", tiny_run_dir, "--input", source, "--output", output,
        "--beam", 4, "--alpha", 3.0, "--xla", "off", capsys=capsys,
    )  # fmt: skip
    assert code == 0, captured.err[-2000:]
    assert output.read_text().splitlines() == expected


def test_alpha_is_refused_for_a_run_that_searches_greedily(tiny_run_dir, tmp_path, capsys, restore_logging):
    """A run whose eval.beam_size is 1 given --alpha (no --beam): refused as `--beam 1 --alpha` is, by both CLIs
    (before, silently greedy)."""
    import yaml

    run = shutil.copytree(tiny_run_dir, tmp_path / "greedy", ignore=shutil.ignore_patterns("hypotheses*"))
    tree = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    tree["eval"]["beam_size"] = 1
    (run / "config.yaml").write_text(yaml.safe_dump(tree), encoding="utf-8")
    source = tmp_path / "in.txt"
    source.write_text("a cat\n")
    for script, args in (("translate.py", ["--input", source]), ("evaluate.py", ["--split", "test"])):
        code, captured = in_process(script, "--model-dir", run, *args, "--alpha", 1.0, capsys=capsys)
        assert code == 2, (script, captured.err[-2000:])
        assert "--alpha is the beam search's length penalty: nothing to do with greedy search" in captured.err
        assert "eval.beam_size is 1: give --beam N" in captured.err


def test_xla_auto_counts_the_whole_input_file_not_each_chunk(tiny_run_dir, tmp_path, capsys, restore_logging):
    """`--xla auto` decides for the file's line count (here over a lowered threshold) though each --chunk-size chunk
    is under it: the decoder is traced for XLA's static shapes (before, never XLA with chunks under 16,000 lines)."""
    import nmt.translator

    lines = [s for s, _ in tiny_corpus()["test"][:6]]
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("\n".join(lines) + "\n")
    expected = [t for _, t in tiny_corpus()["test"][:6]]
    for threshold, xla in ((len(lines), True), (len(lines) + 1, False)):
        nmt.translator.XLA_AUTO_MIN_LINES, saved = threshold, nmt.translator.XLA_AUTO_MIN_LINES
        try:
            code, captured = in_process(
                "translate.py", "--model-dir", tiny_run_dir, "--input", source, "--output", output, "--beam", 1,
                "--chunk-size", 2, "--verbose", capsys=capsys,
            )  # fmt: skip
        finally:
            nmt.translator.XLA_AUTO_MIN_LINES = saved
        assert code == 0, captured.err[-2000:]
        assert output.read_text().splitlines() == expected
        traced = re.findall(r"tracing the decoder: source \(([^)]*)\)", captured.err)
        assert traced and all(("None" not in shape) is xla for shape in traced), (threshold, traced)


def test_the_bars_write_lines_in_a_log_file(tiny_run_dir, tmp_path, capsys, restore_logging):
    """stderr a file (`2> log`): the translating and scoring bars write whole lines, not redraws joined by carriage
    returns (before: one line of 5 redraws; found by a review), as the training bar (tests/nmt/test_progress.py)."""
    source, out, scored = tmp_path / "in.txt", tmp_path / "out.txt", tmp_path / "scores.txt"
    source.write_text("".join(f"{s}\n" for s, _ in tiny_corpus()["test"][:4]))
    runs = {"translating": ["--beam", 1, "--output", out], "scoring": ["--score", out, "--output", scored]}
    for name, more in runs.items():
        log, args = tmp_path / f"{name}.log", ["--model-dir", tiny_run_dir, "--input", source, *more]
        with open(log, "w", encoding="utf-8") as stderr, pytest.MonkeyPatch.context() as patch:
            patch.setattr(sys, "stderr", stderr)
            code, _ = in_process("translate.py", *args, capsys=capsys)
        # bytes: read_text's universal newlines would turn each carriage return into a line end
        text = log.read_bytes().decode("utf-8")
        assert code == 0, text[-2000:]
        assert "\r" not in text and text.endswith("\n"), text
        bar = [line for line in text.splitlines() if line.startswith(f"{name}:")]
        assert bar and bar[-1].startswith(f"{name}: 100%") and "| 4/4 [" in bar[-1], text


@pytest.mark.parametrize("args", [["--input", "/dev/stdin"], ["--input", "-", "--output", "-"]])
def test_input_from_a_pipe_is_read_once(args, tiny_run_dir):
    """A pipe (/dev/stdin here, as <(...)) is not read twice (once to count its lines); "-" is stdin/stdout."""
    pairs = tiny_corpus()["test"][:3]
    stdin = "".join(f"{s}\n" for s, _ in pairs).encode()
    done = cli("translate.py", "--model-dir", tiny_run_dir, "--beam", 1, *args, stdin=stdin)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode("utf-8").splitlines() == [t for _, t in pairs]


def test_make_translate_writes_only_the_translations(tiny_run_dir, tmp_path):
    """`make translate < in > out`: one line out per line in (make's echo of the command goes to stderr)."""
    from tests.faults.helpers import run_make

    pairs = tiny_corpus()["test"][:3]
    stdin = "".join(f"{s}\n" for s, _ in pairs).encode()
    done = run_make("translate", f"MODEL_DIR={tiny_run_dir}", tmp_path=tmp_path, stdin=stdin)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert len(done.stdout.decode("utf-8").splitlines()) == len(pairs)
    assert f"translate.py --model-dir {tiny_run_dir}" in done.stderr.decode()


def test_sigterm_stops_like_sigint(tiny_run_dir, tmp_path):
    """SIGTERM while translating to --output FILE: exit 130, no output and no temporary file left behind."""
    output = tmp_path / "out.de"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    command = [
        sys.executable,
        str(ROOT / "translate.py"),
        "--model-dir",
        str(tiny_run_dir),
        "--output",
        str(output),
    ]
    with open(tmp_path / "stderr.txt", "wb") as stderr:
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stderr=stderr, cwd=ROOT, env=env)
    process.stdin.write(b"The cat sees a ball.\n")
    process.stdin.flush()  # stdin stays open: translate.py waits for more lines, its temporary file open
    temporary = tmp_path / f".out.de.{process.pid}.tmp"
    deadline = time.monotonic() + RUN_DEADLINE  # a hang guard, not a timing: fails instead of waiting forever
    while not temporary.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert temporary.exists(), (tmp_path / "stderr.txt").read_text()[-2000:]
    process.send_signal(signal.SIGTERM)
    code = process.wait(timeout=120)
    process.stdin.close()
    assert code == 130, (tmp_path / "stderr.txt").read_text()[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stderr.txt"]


@pytest.mark.parametrize("engine", ["tensorflow", "ctranslate2"])
def test_nbest_keeps_the_field_of_an_empty_translation(
    engine, tiny_run_dir, tmp_path, request, monkeypatch, restore_logging
):
    """An empty best hypothesis is an empty text field: 2 x N tab-separated fields, whichever engine."""
    import translate

    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("The cat sees a ball.\n")

    def fake_stream(self, lines, **kwargs):
        for _ in lines:
            yield [("", -1.25), ("die\tkatze", -2.5)]

    argv = ["--model-dir", str(tiny_run_dir), "--input", str(source), "--output", str(output)]
    argv += ["--beam", "2", "--nbest", "2"]
    if engine == "ctranslate2":
        from nmt.ctranslate2_engine import CTranslate2Translator as Engine

        argv += ["--engine", "ctranslate2", "--engine-dir", str(request.getfixturevalue("ct2_export"))]
    else:
        from nmt.translator import Translator as Engine
    monkeypatch.setattr(Engine, "translate_stream", fake_stream)
    assert translate.main(argv) == 0
    assert output.read_text(encoding="utf-8") == "\t-1.2500\tdie katze\t-2.5000\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--alpha", "-0.5"], "--alpha must be between 0 and 5, got -0.5"),
        (["--beam", "0"], "--beam must be between 1 and 1024, got 0"),
        (["--beam", "1", "--alpha", "1.0"], "--alpha is the beam search's length penalty"),
    ],
)
def test_bad_search_settings_exit_2(args, message, tiny_run_dir, tmp_path):
    done = cli("translate.py", "--model-dir", tiny_run_dir, "--output", tmp_path / "out", *args)
    assert done.returncode == 2
    last = done.stderr.decode().strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last
    assert list(tmp_path.iterdir()) == []


# -- --engine ctranslate2 ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ct2_export(tiny_run_dir, tmp_path_factory):
    pytest.importorskip("ctranslate2")
    return shared_ct2_export(tiny_run_dir, tmp_path_factory)


def test_the_ctranslate2_bar_writes_lines_in_a_log_file(tiny_run_dir, ct2_export, tmp_path):
    """evaluate.py --engine ctranslate2's translating bar with stderr a file: whole lines, no carriage returns and
    no closing line of blanks (its leave=False erase) (before: tqdm's redraws on one line; found by a review)."""
    from nmt.ctranslate2_engine import CTranslate2Translator

    engine = CTranslate2Translator.from_run_dir(tiny_run_dir, ct2_export, batch_size=2)
    pairs, log = tiny_corpus()["test"][:4], tmp_path / "evaluate.log"
    with open(log, "w", encoding="utf-8") as stderr, pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stderr", stderr)
        translations = engine.translate([s for s, _ in pairs], beam_size=1, progress=True)
    assert translations == [t for _, t in pairs]
    # bytes, as in test_the_bars_write_lines_in_a_log_file
    text = log.read_bytes().decode("utf-8")
    assert "\r" not in text and text.endswith("\n") and all(line.strip() for line in text.splitlines()), text
    assert text.startswith("translating:   0%|"), text
