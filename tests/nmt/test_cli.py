"""The shared CLI plumbing: `--xla [auto|on|off]` parsing and its mapping to Translator's setting; the decoding
CLIs' kernel choice."""

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nmt import cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "argv, expected", [([], "auto"), (["--xla"], True), (["--xla", "on"], True), (["--xla", "off"], False)]
)
def test_xla_argument(argv, expected):
    parser = argparse.ArgumentParser()
    cli.add_xla_argument(parser)
    assert cli.xla_setting(parser.parse_args(argv).xla) == expected


def test_xla_argument_rejects_other_values(capsys):
    parser = argparse.ArgumentParser()
    cli.add_xla_argument(parser)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--xla", "yes"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'yes'" in capsys.readouterr().err


def test_decoding_kernels_set_nothing_once_tensorflow_is_imported(monkeypatch):
    """A CLI's main() run in-process (TensorFlow already imported) must not leak its kernel choice to the
    processes started after it (a resumed training would then run other kernels than the run it resumes)."""
    import tensorflow  # noqa: F401

    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    cli.decoding_kernels()
    assert "TF_ENABLE_ONEDNN_OPTS" not in os.environ


def test_decoding_kernels_are_onednn_on_amx_only():
    assert cli.decoding_onednn({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}) == "1"
    assert (
        cli.decoding_onednn({"avx2", "avx512f", "avx512_bf16"}) == "0"
    )  # the AMD Zen 4: Eigen measured faster
    assert cli.decoding_onednn(set()) == "0"


def test_decoding_kernels_are_chosen_before_tensorflow_unless_told_otherwise():
    """In a fresh interpreter the decoding CLIs' choice is made before TensorFlow's import; the user's wins."""
    code = (
        "import os, sys; from nmt.cli import decoding_kernels; assert 'tensorflow' not in sys.modules; "
        "decoding_kernels(); print(os.environ['TF_ENABLE_ONEDNN_OPTS'])"
    )
    for preset, expected in ((None, cli.decoding_onednn()), ("1", "1"), ("0", "0")):
        env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
        if preset is not None:
            env["TF_ENABLE_ONEDNN_OPTS"] = preset
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == expected


def test_a_reader_that_goes_away_ends_the_cli_quietly_with_sigpipes_code():
    """`translate.py ... | head -1`: stop without a traceback, exit 141 (128 + SIGPIPE, as `cat` killed by
    SIGPIPE), not 1 (which the CLIs give to a run-directory or model problem)."""
    code = (
        "import sys\nfrom nmt import cli\n"
        "def main():\n    while True:\n        sys.stdout.write('a line of output\\n' * 1000)\n        sys.stdout.flush()\n"
        "cli.run(main)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout.read(100) == b"a line of output\n" * 5 + b"a line of output\n"[: 100 - 85]
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, stderr  # a deadline only: a hang becomes a failure
    assert stderr == ""


def test_a_beam_beyond_the_bound_is_refused_before_any_work():
    """--beam 1000000 (a typo for 4) ran out of memory in a TensorFlow traceback after a minute, 3,000,000,000
    overflowed int32, and CTranslate2 was killed by the OOM killer (found by a translate review, 2026-12-07c)."""
    from nmt.cli import CliError, check_search

    check_search(1024, None)
    for beam in (0, 1025, 1_000_000, 3_000_000_000):
        with pytest.raises(CliError, match=f"^--beam must be between 1 and 1024, got {beam}$") as raised:
            check_search(beam, None)
        assert raised.value.exit_code == 2
