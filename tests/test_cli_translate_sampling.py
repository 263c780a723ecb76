"""translate.py --sampling-topk/--sampling-topp/--sampling-temperature/--seed, run as subprocesses."""

import dataclasses

import pytest

from tests.run_fixture import salads
from tests.test_cli_translate import cli


def test_sampled_translations_are_the_apis_and_reproducible(tiny_run_dir, tmp_path):
    """The CLI, reading chunks of 3 lines, writes what `Translator.translate` samples for the whole list in this
    process (line i keyed by i in both): the same seed in another process gives the same lines; another seed gives
    others."""
    from common.sampling import Sampling
    from nmt.translator import Translator

    lines = salads(12, seed=3)
    source = tmp_path / "salads.txt"
    source.write_text("\n".join(lines) + "\n")
    sampling = Sampling(topk=5, topp=0.9, temperature=1.5, seed=11)
    translator = Translator.from_run_dir(tiny_run_dir, xla=False)
    expected = translator.translate(lines, sampling=sampling)
    assert translator.translate(lines, sampling=dataclasses.replace(sampling, seed=12)) != expected

    output = tmp_path / "sampled.txt"
    done = cli(
        "translate.py", "--model-dir", tiny_run_dir, "--input", source, "--output", output, "--xla", "off",
        "--chunk-size", 3, "--sampling-topk", 5, "--sampling-topp", 0.9, "--sampling-temperature", 1.5,
        "--seed", 11,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert output.read_text().splitlines() == expected and len(expected) == len(lines)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seed", "3"], "--seed applies to sampling: give --sampling-topk K"),
        (["--sampling-topp", "0.9"], "--sampling-topp applies to sampling"),
        (["--sampling-topk", "4", "--beam", "4"], "not with --beam"),
        (["--sampling-topk", "4", "--nbest", "2"], "not with --nbest"),
        (["--sampling-topk", "4", "--alpha", "1.0"], "not with --alpha"),
        (["--sampling-topk", "0", "--score", "x.txt"], "not with --score"),
        (
            ["--sampling-topk", "-3"],
            "--sampling-topk must be 0 (the whole vocabulary) or from 2 to 2147483647 (int32), got -3",
        ),
        (["--sampling-topk", "0", "--sampling-topp", "0"], "--sampling-topp must be in (0, 1], got 0.0"),
        (
            ["--sampling-topk", "0", "--sampling-temperature", "nan"],
            "--sampling-temperature must be a positive",
        ),
        (["--sampling-topk", "0", "--seed", "-1"], "--seed must be in [0, 2^32), got -1"),
    ],
)
def test_bad_sampling_settings_exit_2(args, message, tiny_run_dir, tmp_path):
    done = cli("translate.py", "--model-dir", tiny_run_dir, "--output", tmp_path / "out", *args)
    assert done.returncode == 2, done.stderr.decode()[-2000:]
    last = done.stderr.decode().strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last
    assert list(tmp_path.iterdir()) == []


def test_sampling_settings_are_refused_before_tensorflow_is_imported(tiny_run_dir):
    import subprocess
    import sys

    from tests.test_cli_translate import ROOT

    code = (
        "import sys, translate\n"
        "from nmt import cli\n"
        f"args = translate.parse_args(['--model-dir', {str(tiny_run_dir)!r}, '--sampling-topk', '-3'])\n"
        "try:\n"
        "    translate._check(args)\n"
        "except cli.CliError as err:\n"
        "    print(err.exit_code, 'tensorflow' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["2", "False"], done.stderr[-2000:]
