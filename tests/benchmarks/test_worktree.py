"""benchmarks.worktree: an earlier commit checked out beside the tree, and always removed."""

import subprocess

import pytest

from benchmarks import decode_baseline, train_baseline
from benchmarks.worktree import ROOT, baseline_worktree


def _worktrees() -> str:
    return subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout


def test_checks_out_the_commit_and_removes_it():
    first = subprocess.run(
        ["git", "rev-list", "--max-parents=0", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()[0]
    with baseline_worktree(first) as (directory, commit):
        assert commit == first
        expected = subprocess.run(
            ["git", "ls-tree", "-r", "--name-only", first],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert sorted(
            str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() and ".git" != p.name
        ) == sorted(expected)
        assert str(directory) in _worktrees()
    assert not directory.exists()
    assert str(directory) not in _worktrees()


def test_removed_when_the_body_fails():
    with pytest.raises(RuntimeError), baseline_worktree("HEAD") as (directory, _):
        raise RuntimeError("inside")
    assert not directory.exists()
    assert str(directory) not in _worktrees()


def test_unknown_revision_is_a_clear_error():
    from nmt.cli import CliError

    with pytest.raises(CliError, match="unknown git revision 'no-such-commit'") as raised:
        with baseline_worktree("no-such-commit"):
            pass
    assert raised.value.exit_code == 2  # a bad argument (nmt.cli.run: one line, exit 2)


def test_clis_refuse_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        decode_baseline.main(["--baseline", "HEAD", "--run-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "not a run directory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        decode_baseline.main(["--baseline", "HEAD", "--current-batch-size", "0"])
    assert exit_info.value.code == 2
    assert "--current-batch-size must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        train_baseline.main(["--baseline", "HEAD", "--steps", "1"])
    assert exit_info.value.code == 2


def test_baseline_copy_drops_the_keys_its_code_does_not_know(tmp_path):
    import yaml

    from nmt.config import Config

    tree = Config().to_dict()
    tree["train"]["added_later"] = 1  # what a run trained by newer code records
    tree["later_section"] = {"x": 1}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tree), encoding="utf-8")
    dropped = decode_baseline._fit_config(tmp_path, ROOT)  # this tree's code as the "baseline"
    assert sorted(dropped) == ["later_section", "train.added_later"]
    kept = yaml.safe_load((tmp_path / "config.yaml").read_text(encoding="utf-8"))
    assert kept == Config().to_dict()


def test_decode_baseline_refuses_an_unknown_revision_before_any_record(tmp_path, capsys):
    """Before: the `machine` record was printed, then the revision refused: a JSON-lines file with a lone record."""
    from nmt.cli import CliError

    (tmp_path / "config.yaml").write_text("eval: {}\n")  # what the checks read of a run directory

    with pytest.raises(CliError, match="unknown git revision 'no-such-commit'") as raised:
        decode_baseline.main(["--baseline", "no-such-commit", "--run-dir", str(tmp_path)])
    assert raised.value.exit_code == 2
    assert capsys.readouterr().out == ""
    with pytest.raises(SystemExit) as exit_info:
        decode_baseline.main(["--baseline", "HEAD", "--run-dir", str(tmp_path), "--max-sentences", "-1"])
    assert exit_info.value.code == 2
    assert "must be at least 0, got -1" in capsys.readouterr().err
