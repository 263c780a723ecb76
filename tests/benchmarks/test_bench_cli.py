"""bench.py's command line: options reach BenchOptions, bad ones exit 2 with the reason on stderr; a stop exits 130."""

import json

import pytest

from tests.run_fixture import tiny_config_tree, write_corpus

UNMODELLED = "the train rows compare our model with a stock-Keras reference that does not model "


def test_bench_cli_rejects_unknown_benchmark(capsys):
    import bench

    assert bench.main(["--only", "train,nope"]) == 2
    assert "nope" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--only", ""], "no benchmark named"),
        (["--memory-budget-mb", "nan"], "--memory-budget-mb must be a positive number, got nan"),
        (["--chunk-size", "0"], "--chunk-size must be at least 1, got 0"),
        (["--window", "-1"], "--window must be at least 1, got -1"),
        (["--beams", "1,0"], "--beams must all be at least 1"),
        (["--train-shapes", "0"], "--train-shapes must be at least 1, got 0"),
        (["--train-rounds", "0"], "--train-rounds must be at least 1, got 0"),
        (["--decode-all", "-3"], "--decode-all must be >= 0 (0 = all), got -3"),
        (["--decode-ensemble", "1"], "--decode-ensemble must be 0 (none) or at least 2, got 1"),
        (["--decode-sentences", "-1"], "--decode-sentences must be at least 1, got -1"),
        (["--attention-lengths", "0"], "--attention-lengths must all be at least 1"),
        (["--run-dir", "/nonexistent/run"], "--run-dir /nonexistent/run: not a run directory"),
        (["--tokenizer-dir", "/nonexistent"], "--tokenizer-dir /nonexistent: no SentencePiece model there"),
        # Empty lists ran nothing of theirs and the run still said "complete": true
        (["--precisions", ","], "--precisions is empty: give at least one value"),
        (["--xla", ","], "--xla is empty: give at least one value"),
        (["--beams", ","], "--beams is empty: give at least one value"),
        (["--attention-lengths", ","], "--attention-lengths is empty: give at least one value"),
        (["--ct2-patience", ","], "--ct2-patience is empty: give at least one value"),
        (["--decode-xla", ","], "--decode-xla is empty: give at least one value"),
        (["--input-scale-pairs", ","], "--input-scale-pairs is empty: give at least one value"),
        # A traceback after the TensorFlow decode rows, before
        (["--ct2-patience", "0,-1"], "--ct2-patience must all be at least 1, got (0.0, -1.0)"),
        (["--ct2-patience", "2,nan"], "--ct2-patience must all be at least 1"),
        # Train rows against a reference that runs full attention without attention dropout, before
        (["--only", "train", "--set", "model.attention=local"], f"{UNMODELLED}model.attention=local (the"),
        (["--set", "model.attention=chunked"], f"{UNMODELLED}model.attention=chunked"),
        (["--set", "model.attention_dropout=0.1"], f"{UNMODELLED}model.attention_dropout=0.1 (the reference"),
    ],
)
def test_bench_cli_refuses_values_it_cannot_measure(capsys, args, message):
    """Before: a traceback (chunk size 0, window -1, beam 0), NaN in the JSON lines, negative counts read as
    "all but the last" (997 sentences decoded for --decode-all -3), a missing --run-dir silently untrained."""
    import bench

    assert bench.main(["--quick", *args]) == 2
    assert f"bench.py: {message}" in capsys.readouterr().err


def test_bench_cli_decode_engine_options():
    import bench

    options = bench.options_from_args(
        bench.parse_args(
            ["--decode-engines", "ctranslate2", "--ct2-patience", "2,3", "--ct2-dir", "elsewhere"]
        )
    )
    assert options.decode_engines == ("ctranslate2",) and options.ct2_patience == (2.0, 3.0)
    assert options.ct2_dir == "elsewhere"
    assert bench.options_from_args(bench.parse_args(["--decode-engines", ""])).decode_engines == ()
    assert bench.options_from_args(bench.parse_args([])).decode_engines == ("ctranslate2", "tensorflow_int8")
    assert bench.options_from_args(bench.parse_args(["--quick"])).decode_engines == ()  # the smoke has none
    assert bench.main(["--decode-engines", "ctranslate2,nope"]) == 2


def test_bench_cli_xla_settings_and_fusible_is_for_the_train_rows_only():
    import bench

    def options(*argv):
        return bench.options_from_args(bench.parse_args(list(argv)))

    assert options().xla == (False, True) and options().decode_xla_settings == (False, True)
    assert options("--xla", "off,fusible").xla == (False, "fusible")
    assert options("--xla", "fusible").decode_xla_settings == (False,)
    assert options("--xla", "fusible", "--decode-xla", "on").decode_xla_settings == (True,)
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(["--xla", "sometimes"])
    assert exit_info.value.code == 2


def test_bench_cli_xla_refusal_names_fusible(capsys):
    """`--xla maybe` was refused with "expected on or off" though fusible is accepted; --decode-xla takes on/off."""
    import bench

    with pytest.raises(SystemExit):
        bench.parse_args(["--xla", "maybe"])
    assert "expected on, off or fusible, got 'maybe'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--decode-xla", "fusible"])
    assert "expected on or off, got 'fusible'" in capsys.readouterr().err


def test_settings_the_reference_does_not_model_refuse_the_train_rows_only():
    """The check against the reference's own construction: the model settings `build_reference_model` reads are
    the only ones it follows; the others must leave the computation unchanged, or be refused."""
    import dataclasses

    from benchmarks.reference_model import unmodelled_settings
    from benchmarks.runner import BenchOptions, check_config
    from nmt.config import config_from_dict

    config = config_from_dict({"model": {"attention": "local", "attention_dropout": 0.1}})
    with pytest.raises(ValueError, match="model.attention=local .*; model.attention_dropout=0.1"):
        check_config(BenchOptions(only=("train",)), config)
    check_config(BenchOptions(only=("decode", "attention")), config)  # no train rows: nothing compared
    plain = config_from_dict({})
    assert unmodelled_settings(plain.model) == []
    for change, found in (
        ({"ffn_dropout": 0.0}, "model.ffn_dropout=0.0"),
        ({"ffn_dropout": plain.model.dropout}, None),  # what the reference does anyway
        ({"residual": False}, "model.residual=false"),
        ({"attention": "chunked", "chunk_size": 16}, "model.attention=chunked"),
    ):
        settings = unmodelled_settings(dataclasses.replace(plain.model, **change))
        assert settings == [] if found is None else settings[0].startswith(found), (change, settings)


def test_bench_cli_input_scale_pairs(capsys):
    import bench

    assert bench.options_from_args(bench.parse_args([])).input_scale_pairs == (500_000, 5_000_000)
    options = bench.options_from_args(bench.parse_args(["--input-scale-pairs", "1000,20000"]))
    assert options.input_scale_pairs == (1000, 20000)
    assert bench.main(["--only", "input_scale", "--input-scale-pairs", "0"]) == 2
    assert "input_scale corpus sizes must be positive" in capsys.readouterr().err


def test_make_bench_writes_json_lines_only_on_stdout(tmp_path):
    """`make bench > bench.jsonl` keeps every line JSON: make's own echo and the install step go to stderr."""
    import json

    from tests.faults.helpers import run_make

    done = run_make("bench", "BENCH_ARGS=--quick --only refusal", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    records = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert [record["bench"] for record in records] == ["run", "refusal", "timing"]
    assert records[0]["argv"] == ["bench.py", "--quick", "--only", "refusal"]
    assert "bench.py --quick --only refusal" in done.stderr.decode()  # the command, said on stderr


def test_the_benchmark_modules_refuse_counts_below_one_as_argument_errors():
    """`python -m benchmarks.X --steps 0` (or --rounds 0, --pairs -5, --seeds x, --beams 0): argparse's exit 2
    with the reason, not a ZeroDivisionError or an empty corpus marked complete."""
    import argparse

    from benchmarks import synthetic_corpus
    from benchmarks.common import int_list, positive_int

    assert (
        positive_int("3") == 3 and int_list()("1,-2") == [1, -2] and int_list(positive=True)("4,1") == [4, 1]
    )
    for parse, text in (
        (positive_int, "0"),
        (positive_int, "x"),
        (int_list(positive=True), "4,0"),
        (int_list(), ""),
    ):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)
    with pytest.raises(SystemExit) as exit_info:
        synthetic_corpus.main(["--pairs", "-5", "--out", "/nonexistent/corpus"])
    assert exit_info.value.code == 2


def test_a_runs_tokenizer_is_reused_whether_its_folder_was_given_relative_or_absolute(tmp_path, monkeypatch):
    """train.py saves data.folder absolute; the bench's config may give it relative to the working directory."""
    from benchmarks.runner import compatible_tokenizer_dir
    from nmt.config import config_from_dict
    from nmt.run_dir import RunDir, write_atomic
    from tests.run_fixture import tiny_config_tree, write_corpus

    write_corpus(tmp_path / "corpus")
    monkeypatch.chdir(tmp_path)
    relative = config_from_dict(tiny_config_tree("corpus"))
    run = RunDir(tmp_path / "run")
    run.tokenizer_dir.mkdir(parents=True)
    (run.tokenizer_dir / "spm.model").write_bytes(b"a model")
    write_atomic(run.config_path, config_from_dict(tiny_config_tree(str(tmp_path / "corpus"))).to_yaml())
    assert compatible_tokenizer_dir(relative, run.path) == run.tokenizer_dir
    other = config_from_dict(tiny_config_tree(str(tmp_path / "other")))
    assert compatible_tokenizer_dir(other, run.path) is None


def test_bench_stopped_by_sigterm_exits_130_without_a_traceback(tmp_path):
    """SIGTERM (as Ctrl-C) once the first record is out: one line on stderr, exit 130, and the output ends with the
    incomplete timing record (before 2026-12-07e: a KeyboardInterrupt traceback; found by a review)."""
    import signal
    import subprocess
    import sys
    import threading

    import yaml

    from benchmarks.runner import ROOT

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_config_tree(write_corpus(tmp_path / "corpus"))), encoding="utf-8")
    # attention: each point in a child process that imports TensorFlow, seconds in which the signal arrives
    command = [sys.executable, "bench.py", "--quick", "--only", "attention", "--config", str(config)]
    with open(tmp_path / "stderr", "w") as stderr:
        bench = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True)
    # only against a hang
    guard = threading.Timer(300, bench.kill)
    guard.start()
    try:
        first = json.loads(bench.stdout.readline())
        assert first["bench"] == "run"
        bench.send_signal(signal.SIGTERM)
        rest = bench.stdout.read().splitlines()
        code = bench.wait()
    finally:
        guard.cancel()
        bench.kill()
    errors = (tmp_path / "stderr").read_text()
    assert code == 130, errors[-2000:]
    assert "Traceback" not in errors
    assert "bench.py: interrupted; the timing record says how far it got" in errors
    last = json.loads(rest[-1])
    assert last["bench"] == "timing" and last["complete"] is False
