"""bench.py's command line: options reach BenchOptions, bad ones exit 2 with the reason on stderr."""

import pytest


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
    assert [record["bench"] for record in records] == ["refusal", "timing"]
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
