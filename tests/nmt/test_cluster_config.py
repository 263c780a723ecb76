"""TF_CONFIG read for a multi-worker run only, and checked before TensorFlow sees it (exit 2 naming the problem)."""

from __future__ import annotations

import json
import os

import pytest

from nmt.cluster import cluster_task, is_chief
from nmt.config import ConfigError

TWO_WORKERS = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}


def tf_config(task, cluster=TWO_WORKERS) -> str:
    return json.dumps({"cluster": cluster, "task": task})


@pytest.mark.parametrize("distribute", ["none", "mirrored", "tpu"])
def test_tf_config_is_ignored_outside_multi_worker(monkeypatch, distribute):
    """A TF_CONFIG left in the environment (or a malformed one) must not turn a single-process run into a worker
    that trains into a temporary directory and writes nothing."""
    monkeypatch.setenv("TF_CONFIG", tf_config({"type": "worker", "index": 1}))
    assert is_chief(distribute)
    monkeypatch.setenv("TF_CONFIG", "{not json")
    assert is_chief(distribute)


def test_a_stray_tf_config_changes_nothing_for_mirrored():
    """TensorFlow's MirroredStrategy parses TF_CONFIG itself: a malformed one left in the environment crashed
    `train.distribute: mirrored` with a JSONDecodeError. In a subprocess (it splits the CPU into two logical
    devices): the strategy is built with a malformed and a well-formed 2-worker TF_CONFIG, has this machine's two
    replicas each time, and TF_CONFIG is back in the environment afterwards."""
    import subprocess
    import sys

    from tests.faults.helpers import ROOT

    code = (
        "import os, sys\n"
        "from nmt.distribute import make_strategy\n"
        "for value in sys.argv[1:]:\n"
        "    os.environ['TF_CONFIG'] = value\n"
        "    strategy = make_strategy('mirrored')\n"
        "    print(strategy.num_replicas_in_sync, os.environ.get('TF_CONFIG') == value)\n"
    )
    values = ["{not json", tf_config({"type": "worker", "index": 1})]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(
        [sys.executable, "-c", code, *values], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["2 True", "2 True"], done.stdout


def test_the_lock_refusal_of_a_second_chief_hints_at_tf_config(
    monkeypatch, tmp_path, capsys, restore_logging
):
    """Two tasks whose TF_CONFIGs both make them the chief (the workers listed in another order on each host, or
    both index 0) on a shared --model-dir: the second is refused by the first's lock; with multi_worker the message
    says what to check (exit 3 still). The first task's lock held in this process."""
    import train as train_cli
    from nmt.run_dir import RunDir, RunLock

    monkeypatch.setenv("TF_CONFIG", tf_config({"type": "worker", "index": 0}))
    run_dir = tmp_path / "run"
    argv = ["--config", "tiny.yaml", "--model-dir", str(run_dir)]
    hint = (
        "; if this is a task of a multi-worker run, another task also takes itself for the chief: check that every "
        "task's TF_CONFIG lists the same cluster in the same order, with its own index"
    )
    refused = (
        f"train.py: another training (pid {os.getpid()}) is already running on {run_dir}; wait for it to finish or "
        "stop it first"
    )
    with RunLock(RunDir(run_dir)):
        assert train_cli.main([*argv, "--set", "train.distribute=multi_worker"]) == 3
        assert capsys.readouterr().err.strip().splitlines()[-1] == refused + hint
        # a single-process run ignores TF_CONFIG: the plain refusal
        assert train_cli.main(argv) == 3
        assert capsys.readouterr().err.strip().splitlines()[-1] == refused


def test_the_chief_of_a_multi_worker_run(monkeypatch):
    for task, cluster, chief in [
        ({"type": "worker", "index": 0}, TWO_WORKERS, True),
        ({"type": "worker", "index": 1}, TWO_WORKERS, False),
        ({"type": "chief", "index": 0}, {"chief": ["127.0.0.1:3"], **TWO_WORKERS}, True),
        ({"type": "worker", "index": 0}, {"chief": ["127.0.0.1:3"], **TWO_WORKERS}, False),
    ]:
        monkeypatch.setenv("TF_CONFIG", tf_config(task, cluster))
        assert is_chief("multi_worker") is chief, (task, cluster)
        assert cluster_task() == (task["type"], task["index"], cluster)


@pytest.mark.parametrize(
    "value, message",
    [
        (None, r"multi_worker needs the TF_CONFIG environment variable"),
        ("", r"multi_worker needs the TF_CONFIG environment variable"),
        ("{not json", r"TF_CONFIG is not valid JSON"),
        ("[1, 2]", r'TF_CONFIG has no "cluster"'),
        (json.dumps({"cluster": TWO_WORKERS}), r'TF_CONFIG has no "task" with a "type"'),
        (
            tf_config({"type": "ps", "index": 0}),
            r"TF_CONFIG has a task of type 'ps'",
        ),  # not listed: named as such
        (
            tf_config({"type": "chief", "index": 0}),
            r"task type 'chief' is not in its cluster \(task types: worker\)",
        ),
        (  # TensorFlow itself crashed on it (SIGSEGV), with no process the chief
            tf_config({"type": "worker", "index": 0}, {"chief": [], **TWO_WORKERS}),
            r"TF_CONFIG's cluster 'chief' must be a non-empty list of host:port strings, got \[\]: remove the entry",
        ),
        (
            tf_config({"type": "chief", "index": 0}, {"chief": "127.0.0.1:3", **TWO_WORKERS}),
            r"cluster 'chief' must be a non-empty list of host:port strings, got '127.0.0.1:3'$",
        ),
        (
            tf_config({"type": "worker", "index": 0}, {"worker": {"0": "127.0.0.1:1", "1": "127.0.0.1:2"}}),
            r"cluster 'worker' must be a non-empty list of host:port strings, got \{",
        ),
        (tf_config({"type": "worker", "index": 1.0}), r"TF_CONFIG's task index must be an integer, got 1.0"),
        (
            tf_config({"type": "worker", "index": 0}, {**TWO_WORKERS, "ps": ["127.0.0.1:3"]}),
            r"TF_CONFIG has a task of type 'ps': train.distribute: multi_worker trains with chief and worker tasks only",
        ),
        (
            tf_config({"type": "evaluator", "index": 0}, {**TWO_WORKERS, "evaluator": ["127.0.0.1:3"]}),
            r"TF_CONFIG has a task of type 'evaluator'",
        ),
        (
            tf_config(
                {"type": "chief", "index": 0}, {**TWO_WORKERS, "chief": ["127.0.0.1:3", "127.0.0.1:4"]}
            ),
            r"TF_CONFIG's cluster has 2 chief tasks: at most one",
        ),
        (
            tf_config({"type": "worker", "index": 0}, {"worker": ["127.0.0.1:5", "localhost:5"]}),
            r"TF_CONFIG's worker 1 \(localhost:5\) has the address of worker 0 \(127.0.0.1:5\)",
        ),
        (
            tf_config({"type": "worker", "index": 0}, {"chief": ["h:5"], "worker": ["H:5"]}),
            r"TF_CONFIG's worker 0 \(H:5\) has the address of chief 0 \(h:5\)",
        ),
        (
            tf_config({"type": "worker", "index": 2}),
            r"task index 2 is not one of the cluster's 2 'worker' task",
        ),
        (tf_config({"type": "worker", "index": "one"}), r"task index must be an integer, got 'one'"),
        # str.isdigit() accepts "²", int() does not (before: a ValueError traceback)
        (
            tf_config({"type": "worker", "index": 0}, {"worker": ["127.0.0.1:1", "127.0.0.1:²"]}),
            r"TF_CONFIG's cluster address '127.0.0.1:²' is not host:port \(a port from 1 to 65535\)$",
        ),
        (
            tf_config({"type": "worker", "index": 0}, {"worker": ["127.0.0.1:1", "127.0.0.1:65536"]}),
            r"'127.0.0.1:65536' is not host:port \(a port from 1 to 65535\)$",
        ),
        # before: read as host "fe80:", port 1
        (
            tf_config({"type": "worker", "index": 0}, {"worker": ["127.0.0.1:1", "fe80::1"]}),
            r"address 'fe80::1' is an IPv6 address without brackets: write it "
            r"\[ADDRESS\]:PORT \(e.g. \[fe80::1\]:2222\)$",
        ),
    ],
)
def test_a_malformed_tf_config_is_a_config_error(monkeypatch, value, message):
    if value is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", value)
    with pytest.raises(ConfigError, match=message):
        is_chief("multi_worker")


def test_train_py_exits_2_on_a_malformed_tf_config_and_writes_nothing(monkeypatch, tmp_path, capsys):
    import train as train_cli

    monkeypatch.setenv("TF_CONFIG", tf_config({"type": "worker", "index": 5}))
    run_dir = tmp_path / "run"
    argv = ["--config", "tiny.yaml", "--model-dir", str(run_dir), "--set", "train.distribute=multi_worker"]
    assert train_cli.main(argv) == 2
    assert "train.py: config error: TF_CONFIG's task index 5" in capsys.readouterr().err
    assert not run_dir.exists()


def test_the_fingerprint_ignores_where_data_is_stored_only():
    from nmt.config import load_config

    base = load_config("tiny.yaml").fingerprint()
    same = ["data.cache_dir=/elsewhere", "data.data_dir=/x", "train.cluster_wait_minutes=5"]
    assert load_config("tiny.yaml", same).fingerprint() == base
    assert load_config("tiny.yaml", ["train.seed=7"]).fingerprint() != base
    # the time budget makes each worker's plan (schedule, dropout): two budgets would be two schedules
    assert load_config("tiny.yaml", ["train.max_minutes=5"]).fingerprint() != base
    assert load_config("tiny.yaml", ["model.d_model=64"]).fingerprint() != base
    assert 0 <= base < 2**48  # exact as a float64, the collective's type
