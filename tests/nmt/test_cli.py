"""The shared CLI plumbing: `--xla [auto|on|off]` parsing and its mapping to Translator's setting."""

import argparse

import pytest

from nmt import cli


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
