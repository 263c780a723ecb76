"""Fine-tuning (`train.init_from`): a new run starts from another run's weights and tokenizer.

The parent is the tiny memorised run of tests/run_fixture.py. The child's weights are checked against the parent's
as evaluate.py loads them (`Translator.from_run_dir`), through the real Trainer; train.py's run is checked by what
the parent guarantees on any CPU (a validation loss below MAX_SENTENCE_NLL), not by a trajectory.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from common.config_tree import ConfigError
from nmt.config import config_from_dict
from nmt.init_from import parent_run
from nmt.run_dir import RunDir, write_atomic
from tests.run_fixture import MAX_SENTENCE_NLL


def child_tree(parent, **train) -> dict:
    """The parent's own config, fine-tuned from it: a couple of steps at a learning rate that moves nothing."""
    tree = yaml.safe_load((parent / "config.yaml").read_text(encoding="utf-8"))
    tree["train"].update(
        {"init_from": str(parent), "max_steps": 4, "learning_rate": 1e-9, "warmup_steps": 1, "eval_every": 2,
         "bleu_every": 0, "checkpoint_every": 2, "average_last": 0, **train}
    )  # fmt: skip
    return tree


def test_without_init_from_there_is_no_parent(tiny_run_dir):
    tree = child_tree(tiny_run_dir)
    tree["train"]["init_from"] = None
    assert parent_run(config_from_dict(tree)) is None


def test_a_parent_under_the_home_directory_may_be_given_with_a_tilde(tiny_run_dir, monkeypatch):
    monkeypatch.setenv("HOME", str(tiny_run_dir.parent))
    tree = child_tree(tiny_run_dir)
    tree["train"]["init_from"] = f"~/{tiny_run_dir.name}"
    parent, _ = parent_run(config_from_dict(tree))
    assert parent.path == tiny_run_dir


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model": {"d_model": 16}}, "model.d_model: 16 here, 32 in"),
        ({"model": {"num_layers": 2, "norm": "pre"}}, "model.num_layers: 2 here, 1 in"),
        ({"data": {"vocab_size": 80}}, "data.vocab_size: 80 here, 64 in"),
        ({"data": {"source": "de", "target": "en"}}, "data.source: 'de' here, 'en' in"),
        ({"data": {"lowercase": True}}, "data.lowercase: True here, False in"),
    ],
)
def test_another_model_or_tokenizer_is_refused_naming_each_difference(tiny_run_dir, change, message):
    tree = child_tree(tiny_run_dir)
    for section, values in change.items():
        tree[section].update(values)
    with pytest.raises(
        ConfigError, match="train.init_from: this config's model or tokenizer differs"
    ) as raised:
        parent_run(config_from_dict(tree))
    assert message in str(raised.value)
    if "norm" in change.get("model", {}):
        assert "model.norm: 'pre' here, 'post' in" in str(raised.value)


def test_a_parent_that_is_not_a_trained_run_is_refused(tiny_run_dir, tmp_path):
    for path, message in (
        (tmp_path / "missing", "model directory does not exist"),
        (tmp_path, "is not a run directory"),
    ):
        tree = child_tree(tiny_run_dir)
        tree["train"]["init_from"] = str(path)
        with pytest.raises(ConfigError, match=f"train.init_from: .*{message}"):
            parent_run(config_from_dict(tree))
    tree = child_tree(tiny_run_dir)
    checkpoint = tmp_path / "ckpt-30.index"  # a checkpoint file, as fairseq's --finetune-from-model takes
    checkpoint.touch()
    tree["train"]["init_from"] = str(checkpoint)
    with pytest.raises(ConfigError, match="is a file; give the run directory train.py wrote"):
        parent_run(config_from_dict(tree))
    tree["train"]["init_from"] = str(tmp_path / "child")
    with pytest.raises(ConfigError, match="names this run's own directory"):
        parent_run(config_from_dict(tree), RunDir(tmp_path / "child"))
    untrained = tmp_path / "untrained"
    shutil.copytree(tiny_run_dir, untrained, ignore=shutil.ignore_patterns("final", "best", "checkpoints"))
    tree = child_tree(tiny_run_dir)
    tree["train"]["init_from"] = str(untrained)
    with pytest.raises(ConfigError, match="no trained weights found"):
        parent_run(config_from_dict(tree))


def test_a_new_run_starts_from_the_parents_weights_and_tokenizer(tiny_run_dir, tmp_path, monkeypatch):
    from nmt.trainer import Trainer
    from nmt.translator import Translator

    monkeypatch.setenv("NMT_DATA_CACHE", str(tmp_path / "data_cache"))
    config = config_from_dict(child_tree(tiny_run_dir))
    run_dir = RunDir(tmp_path / "child")
    run_dir.path.mkdir()
    write_atomic(run_dir.config_path, config.to_yaml())
    run_dir.tokenizer_dir.mkdir()  # another tokenizer, left by hand: no checkpoint, so the start takes the parent's
    (run_dir.tokenizer_dir / "spm.model").write_bytes(b"not this one")
    trainer = Trainer(config, run_dir)
    trainer.setup()
    assert trainer.resumed_from == 0
    parent = Translator.from_run_dir(tiny_run_dir)  # the weights evaluate.py would use
    # by path below the model's own name (transformer, transformer_1, ...: Keras numbers the models it builds)
    expected = {w.path.split("/", 1)[1]: w.numpy() for w in parent.model.weights}
    got = {w.path.split("/", 1)[1]: w.numpy() for w in trainer.model.weights}
    assert got.keys() == expected.keys()
    for path, value in expected.items():
        np.testing.assert_array_equal(got[path], value, err_msg=path)
    parent_models = sorted(p.name for p in (tiny_run_dir / "tokenizer").glob("*.model"))
    assert sorted(p.name for p in run_dir.tokenizer_dir.glob("*.model")) == parent_models
    for name in parent_models:
        assert (run_dir.tokenizer_dir / name).read_bytes() == (tiny_run_dir / "tokenizer" / name).read_bytes()
    assert int(trainer.optimizer.iterations.numpy()) == 0  # the optimizer starts afresh


def write_config(config_tree, tmp_path) -> Path:
    config = tmp_path / f"config-{len(list(tmp_path.glob('config-*')))}.yaml"
    config.write_text(yaml.safe_dump(config_tree, sort_keys=False), encoding="utf-8")
    return config


def train_here(config_tree, run_dir, tmp_path, request) -> tuple[int, str]:
    """train.py's `main` in this process (saves a process start): (exit code, its printed lines and log records)."""
    import train as train_cli

    request.getfixturevalue("restore_logging")  # train.main sets the TensorFlow and absl loggers' levels
    request.getfixturevalue("monkeypatch").setenv("NMT_DATA_CACHE", str(tmp_path / "data_cache"))
    capsys, caplog = request.getfixturevalue("capsys"), request.getfixturevalue("caplog")  # before the run
    # under pytest, train.main's logging.basicConfig adds no handler: its records are caplog's (this run's only)
    capsys.readouterr()
    caplog.clear()
    caplog.set_level(logging.INFO)
    code = train_cli.main(["--config", str(write_config(config_tree, tmp_path)), "--model-dir", str(run_dir)])
    return code, capsys.readouterr().err + caplog.text


def test_train_py_fine_tunes_then_resumes_without_the_parent(tiny_run_dir, tmp_path, request):
    """The fine-tuning start, then its resume with the parent directory gone: train.py's `main` twice in this
    process (a subprocess would only add the ~5 s TensorFlow import: the resume builds its own Trainer, and no
    module of the project keeps a run's weights or tokenizer between two `main` calls)."""
    parent = tmp_path / "parent"
    shutil.copytree(tiny_run_dir, parent)
    child = tmp_path / "child"
    code, output = train_here(child_tree(parent), child, tmp_path, request)
    assert code == 0, output[-3000:]
    assert f"initialised the weights from {parent}" in output
    validation = [r for r in map(json.loads, (child / "metrics.jsonl").read_text().splitlines())
                  if r.get("tag") == "validation"]  # fmt: skip
    assert validation and validation[0]["step"] == 2
    # A fresh model of this size starts near log(64) = 4.2 nats per token; the parent's weights are below this
    assert validation[0]["loss"] < MAX_SENTENCE_NLL

    longer = child_tree(parent, max_steps=6)
    longer["train"]["init_from"] = str(tmp_path / "elsewhere")  # another parent: ignored, with a warning
    shutil.rmtree(parent)  # a resumed run restores its own checkpoint: the parent is no longer needed
    code, output = train_here(longer, child, tmp_path, request)
    assert code == 0, output[-3000:]
    assert "resuming" in output and "initialised the weights" not in output
    assert f"train.init_from {tmp_path / 'elsewhere'} is ignored: this run resumes its own" in output
    saved = yaml.safe_load((child / "config.yaml").read_text(encoding="utf-8"))
    assert saved["train"]["init_from"] == str(parent) and saved["train"]["max_steps"] == 6


def test_train_py_refuses_another_model_and_undoes_the_start(tiny_run_dir, tmp_path, request):
    tree = child_tree(tiny_run_dir)
    tree["model"]["d_ff"] = 128
    (tmp_path / "runs").mkdir()
    code, output = train_here(tree, tmp_path / "runs" / "new" / "deeper" / "child", tmp_path, request)
    assert code == 2, output[-3000:]
    assert "train.py: config error: train.init_from:" in output
    assert "model.d_ff: 128 here, 64 in" in output
    # a new run whose start failed leaves nothing behind, nor the parent folders it made
    assert list((tmp_path / "runs").iterdir()) == []
