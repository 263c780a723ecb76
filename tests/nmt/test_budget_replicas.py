"""A real 2-replica training (logical CPU devices, a `train.py` process: they must be configured before TensorFlow
starts): the learning rate follows the global batch, and a resume on another replica count is refused unless the
user allows it. The plan's rules alone are tested in tests/nmt/test_budget.py; the in-process time-budget runs in
tests/nmt/test_budget_runs.py.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import tensorflow as tf

import train as train_cli
from tests.faults.helpers import snapshot_run, train, write_config
from tests.nmt.test_trainer import read_events
from tests.run_fixture import tiny_config_tree, write_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("replicas") / "corpus")


@pytest.mark.slow  # ~26 s; the refusal rule and the sqrt scaling alone: tests/nmt/test_budget.py
def test_two_replicas_scale_the_learning_rate_and_another_replica_count_is_refused(corpus, tmp_path, capsys):
    tree = tiny_config_tree(corpus)
    tree["data"].update(bucket_boundaries=[32], batch_tokens=512)
    tree["train"] = {
        "max_steps": 4,
        "warmup_steps": 2,
        "learning_rate": 0.005,
        "precision": "float32",
        "xla": False,
        "checkpoint_every": 2,
        "log_every": 1,
        "eval_every": 0,
        "bleu_every": 0,
        "distribute": "mirrored",
    }
    config = write_config(tmp_path / "mirrored.yaml", tree)
    run_dir = tmp_path / "run"
    done = train(config, run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "global batch: 1024 tokens per step = 2 replica(s) x 512 tokens" in done.stderr
    assert "peak learning rate 0.007071 (train.learning_rate 0.005 for 512 tokens" in done.stderr
    events, _ = read_events(run_dir / "tensorboard" / "train")
    logged = dict((step, float(value)) for step, value in events["learning_rate"])
    scaled = 0.005 * math.sqrt(2)  # sqrt(global 1024 / reference 512): Adam's rule
    for step in (1, 2, 3, 4):
        assert logged[step] == pytest.approx(scaled * min(step / 2, math.sqrt(2 / step)), rel=1e-6), step

    # One replica now (half the global batch): refused with both batches named, nothing written.
    before = snapshot_run(run_dir)  # config.yaml included: a refused start rewrites nothing
    args = [
        "--config",
        str(config),
        "--model-dir",
        str(run_dir),
        "--set",
        "train.distribute=none",
        "train.max_steps=6",
    ]
    assert train_cli.main(args) == 1
    err = capsys.readouterr().err
    assert (
        "trained with a global batch of 1024 tokens on 2 replica(s); this run has 512 tokens on 1 replica(s)"
        in err
    )
    assert "train.allow_batch_change=true" in err
    assert snapshot_run(run_dir) == before

    # The explicit override: resumes at step 4 with the learning rate of the new global batch (the reference).
    assert train_cli.main([*args, "train.allow_batch_change=true"]) == 0
    err = capsys.readouterr().err
    assert f"resuming {run_dir} from step 4" in err and "finished at step 6" in err
    events, _ = read_events(run_dir / "tensorboard" / "train")
    logged = dict((step, float(value)) for step, value in events["learning_rate"])
    for step in (5, 6):
        assert logged[step] == pytest.approx(0.005 * math.sqrt(2 / step), rel=1e-6), step
    reader = tf.train.load_checkpoint(str(run_dir / "checkpoints"))
    assert reader.get_tensor("plan/replicas/.ATTRIBUTES/VARIABLE_VALUE") == 1
    assert reader.get_tensor("plan/global_tokens/.ATTRIBUTES/VARIABLE_VALUE") == 512
