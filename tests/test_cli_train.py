"""train.py's argument parsing (`--set` takes one or several overrides, repeatable, in order), and what a second
Ctrl-C leaves of a new run."""

import logging
import subprocess
import sys
from pathlib import Path

import pytest

import train

ROOT = Path(__file__).resolve().parents[1]


def test_set_takes_several_values_and_repeats_in_order():
    args = train.parse_args(
        [
            "--config",
            "tiny.yaml",
            "--set",
            "train.max_steps=5",
            "data.batch_tokens=64",
            "--set",
            "train.seed=3",
        ]
    )
    assert args.overrides == ["train.max_steps=5", "data.batch_tokens=64", "train.seed=3"]
    assert train.parse_args(["--config", "tiny.yaml"]).overrides == []


def test_bad_override_exits_2_and_writes_nothing(tmp_path):
    model_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "train.py", "--config", "tiny.yaml", "--model-dir", str(model_dir),
         "--set", "train.max_steps=5", "model.no_such_key=1"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,  # against a hang only: it exits before TensorFlow
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith(
        "train.py: config error: unknown config key model.no_such_key (known keys"
    )
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not model_dir.exists()


@pytest.fixture(scope="module")
def data_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("data_cache")


@pytest.mark.parametrize("checkpointed", [None, "checkpoints", "best"])
def test_a_second_signal_undoes_a_new_run_only_before_its_first_checkpoint(
    checkpointed, data_cache, tmp_path, monkeypatch, capsys, caplog, restore_logging
):
    """Two Ctrl-C: the second raises KeyboardInterrupt out of `Trainer.train` (as `StopControl` does). A new run
    with no checkpoint yet is undone like a failed start (before, its config.yaml stayed, and the corrected
    command was refused as a run of another model); one with a checkpoint is kept, to be resumed, and one with best
    weights (a validation came before the first checkpoint) too."""
    from nmt.checkpoints import save_model_weights
    from nmt.trainer import Trainer
    from tests.faults.helpers import fault_tree, write_config
    from tests.run_fixture import write_corpus

    def second_signal(self):
        if checkpointed == "checkpoints":
            self.save_checkpoint()
        elif checkpointed == "best":  # a validation before the first checkpoint found best weights
            save_model_weights(self.model, self.run_dir.best_dir, 0)
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "train", second_signal)
    monkeypatch.setenv("NMT_DATA_CACHE", str(data_cache))
    caplog.set_level(logging.INFO)
    config = write_config(tmp_path / "run.yaml", fault_tree(write_corpus(tmp_path / "corpus")))
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")  # a folder of the user's, with a file in it
    for run_dir, before in ((tmp_path / "new" / "run", None), (kept, ["notes.txt"])):
        assert train.main(["--config", str(config), "--model-dir", str(run_dir)]) == 130
        err = capsys.readouterr().err
        if checkpointed:
            kept = {
                "checkpoints": "interrupted twice; stopped without a new checkpoint (the last one is intact)",
                "best": f"the best weights so far are kept in {run_dir / 'best'} (evaluate or export them",
            }
            assert kept[checkpointed] in err
            assert (run_dir / "config.yaml").is_file() and list((run_dir / checkpointed).glob("ckpt-0.index"))
        else:
            assert "interrupted twice before the first checkpoint; nothing kept" in err
            if before is None:
                assert not (tmp_path / "new").exists()  # the folders it made are gone
            else:
                assert sorted(p.name for p in run_dir.iterdir()) == before


def test_the_run_config_holds_absolute_paths_and_old_relative_ones_still_resume(
    data_cache, tmp_path, monkeypatch, capsys, caplog, restore_logging
):
    """Relative paths meant the working directory of the command: config.yaml says which folder, so evaluate.py
    run from elsewhere reads the same corpus (before: `folder: corpus`, then "no such directory" or, for a
    relative cache_dir, a second cache). A run saved with relative paths resumes from where they meant that."""
    from nmt.config import load_config
    from nmt.run_dir import RunDir, write_atomic
    from nmt.trainer import Trainer
    from tests.faults.helpers import fault_tree, write_config
    from tests.run_fixture import write_corpus

    def stopped(self):  # a checkpoint, then a second Ctrl-C: the run directory is kept
        self.save_checkpoint()
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "train", stopped)
    monkeypatch.setenv("NMT_DATA_CACHE", str(data_cache))
    caplog.set_level(logging.INFO)
    monkeypatch.chdir(tmp_path)
    write_corpus(tmp_path / "corpus")
    tree = fault_tree(Path("corpus"))
    tree["data"]["cache_dir"] = "cache"
    config = write_config(tmp_path / "run.yaml", tree)
    assert train.main(["--config", "run.yaml", "--model-dir", "run"]) == 130
    saved = RunDir(tmp_path / "run").load_config()
    assert (saved.data.folder, saved.data.cache_dir) == (str(tmp_path / "corpus"), str(tmp_path / "cache"))
    # config.yaml as a run saved it before: relative. The same command resumes it (not "a different data config").
    write_atomic(tmp_path / "run" / "config.yaml", load_config(config).to_yaml())
    assert RunDir(tmp_path / "run").load_config().data.folder == "corpus"
    capsys.readouterr()
    assert train.main(["--config", "run.yaml", "--model-dir", "run"]) == 130
    assert "resuming" in capsys.readouterr().err + caplog.text


def test_the_next_command_evaluates_test_or_validation_if_there_is_no_test_split(tmp_path):
    from nmt.config import config_from_dict
    from nmt.run_dir import RunDir
    from tests.faults.helpers import fault_tree
    from tests.run_fixture import write_corpus

    corpus = write_corpus(tmp_path / "corpus")
    config = config_from_dict(fault_tree(corpus))
    assert train._split_to_evaluate(config) == "test"
    for path in corpus.glob("*.test.txt"):
        path.write_text("")  # there, but nothing to evaluate
    assert train._split_to_evaluate(config) == "validation"
    for path in corpus.glob("*.test.txt"):
        path.unlink()
    assert train._split_to_evaluate(config) == "validation"
    hint = train._outputs(RunDir(tmp_path / "run"), "validation").splitlines()[-1]
    assert "--split validation  (sacreBLEU, beam search; the corpus has no test split)" in hint


@pytest.mark.parametrize(
    ("override", "refusal"),
    [
        ("model.d_model=48", "was trained with a different model config (model.d_model: 32 -> 48)"),
        ("data.vocab_size=80", "was trained with a different data config (data.vocab_size: 64 -> 80)"),
        (
            "train.ema_decay=0.99",
            "was trained without an EMA of the weights (train.ema_decay 0.0 -> 0.99): it cannot be turned on or off",
        ),
    ],
)
def test_a_resume_that_would_not_fit_its_checkpoints_is_refused_before_any_work(
    tmp_path, capsys, override, refusal
):
    """What a run's checkpoints and tokenizer were made with cannot change on resume: exit 3, naming the setting,
    DIR untouched. train.ema_decay turned on (or off) changes Adam's variables: before 2026-12-07c the resume failed
    later, calling the checkpoint corrupt and advising to move it away (found by a resume review)."""
    import yaml

    from nmt.config import absolute_paths, config_from_dict
    from nmt.run_dir import RunDir, write_atomic
    from tests.run_fixture import tiny_config_tree, write_corpus

    tree = tiny_config_tree(write_corpus(tmp_path / "corpus"))
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tree), encoding="utf-8")
    run = RunDir(tmp_path / "run")
    saved = absolute_paths(config_from_dict(tree)).to_yaml()
    write_atomic(run.config_path, saved)  # all the check reads (it runs before the run's files are opened)
    assert train.main(["--config", str(config), "--model-dir", str(run.path), "--set", override]) == 3
    assert f"train.py: {run.path} {refusal}" in capsys.readouterr().err
    assert [p.name for p in run.path.iterdir()] == ["config.yaml"]
    assert run.config_path.read_text(encoding="utf-8") == saved
