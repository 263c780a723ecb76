"""tf.distribute: MirroredStrategy over two logical CPU devices and MultiWorkerMirroredStrategy as two local
worker processes train to the same weights as a single-device run (within float tolerance), in a multi-worker
run only the chief writes the run directory, and two workers killed mid-run and restarted end with exactly the
weights of the uninterrupted two-worker run. There each worker reads only its replicas' part of every global
batch (the rows of each replica are checked here against the split of the whole batch; tests/data/test_parts.py
checks the reading), and a repeated signal to a worker does not stop it at once.

Each distributed run is a real `train.py` process (logical devices must be configured before TensorFlow starts);
the single-device reference is trained in this process (the same Trainer, without a process start). The restart
after a kill starts from a copy of the uninterrupted run rolled back to a checkpoint (a real kill of a run of its
own: marked slow). The slower multi-worker scenarios (a signal to one worker, a time budget) are in
test_multi_worker_resume.py.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf
import yaml

from data.batching import part_rows
from nmt.distribute import StopControl, replica_rows
from tests.faults.helpers import assert_bit_identical, latest_step, training_state
from tests.nmt.multi_worker import Workers, resumed_step, saved_checkpoints
from tests.run_fixture import tiny_config_tree, write_corpus

ROOT = Path(__file__).resolve().parents[2]
STEPS = 12


def config_file(tmp_path: Path, distribute: str, checkpoint_every: int = 1000) -> Path:
    tree = tiny_config_tree(write_corpus(tmp_path / "corpus"))
    # One bucket; data.batch_tokens is per replica: the 2-replica runs (512 each) and the single device (1024)
    # see the same global batches of 32 pairs.
    tree["data"].update(bucket_boundaries=[32], batch_tokens=1024 if distribute == "none" else 512)
    tree["model"].update(dropout=0.0)  # dropout masks differ per replica; everything else must agree
    tree["train"] = {
        "max_steps": STEPS,
        "warmup_steps": 4,
        "learning_rate": 0.005,
        "reference_batch_tokens": 1024,  # the single device's global batch: the same learning rate everywhere
        "precision": "float32",
        "xla": False,
        "checkpoint_every": checkpoint_every,
        "eval_every": 0,
        "bleu_every": 0,
        "distribute": distribute,
    }
    path = tmp_path / f"{distribute}.yaml"
    path.write_text(yaml.safe_dump(tree), encoding="utf-8")
    return path


def env(**extra):
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", **extra)


def run_train(config: Path, model_dir: Path, **extra_env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), "--config", str(config), "--model-dir", str(model_dir)],
        cwd=ROOT,
        env=env(**extra_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen, timeout=400) -> str:
    try:
        _, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    assert process.returncode == 0, err[-3000:]
    return err


def model_weights(model_dir: Path) -> dict:
    """The trainable weights in the latest training checkpoint (TF names them after the optimizer's list)."""
    reader = tf.train.load_checkpoint(str(model_dir / "checkpoints"))
    pattern = re.compile(r"optimizer/_trainable_variables/\d+/\.ATTRIBUTES/VARIABLE_VALUE")
    return {
        key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map() if pattern.fullmatch(key)
    }


def assert_same_weights(a: dict, b: dict, atol: float):
    assert a.keys() == b.keys() and len(a) > 5
    worst = max(float(np.max(np.abs(a[k] - b[k]))) for k in a)
    assert worst <= atol, f"max abs weight difference {worst}"


def final_validation_loss(stderr: str) -> float:
    return float(re.findall(r"finished at step \d+: validation loss ([0-9.]+)", stderr)[-1])


def assert_same_training(run: Path, stderr: str, reference: tuple[Path, str]):
    """Same validation loss to 1e-3 relative, same weights to a few learning-rate steps.

    Weights can differ by up to ~lr per step where a gradient is ~0: Adam divides by sqrt(v), so float rounding
    noise of order 1e-9 in a vanishing gradient moves a weight by +-lr either way. The loss is the sharp check.
    """
    reference_run, reference_stderr = reference
    assert final_validation_loss(stderr) == pytest.approx(final_validation_loss(reference_stderr), rel=1e-3)
    assert_same_weights(model_weights(run), model_weights(reference_run), atol=0.02)


@pytest.fixture(scope="module")
def single_device_run(tmp_path_factory):
    """The single-device reference, trained in this process (one device needs nothing set before TensorFlow
    starts): (run directory, train.py's closing line)."""
    from nmt.config import load_config
    from nmt.run_dir import RunDir, write_atomic
    from nmt.trainer import Trainer

    tmp = tmp_path_factory.mktemp("single")
    config = load_config(config_file(tmp, "none"))
    run_dir = RunDir(tmp / "run")
    run_dir.path.mkdir()
    write_atomic(run_dir.config_path, config.to_yaml())
    trainer = Trainer(config, run_dir)
    trainer.setup()
    result = trainer.train()
    assert result.status == "done", result.message
    return run_dir.path, f"train.py: {result.message}"


def test_mirrored_on_two_cpu_devices_matches_single_device(single_device_run, tmp_path):
    err = finish(run_train(config_file(tmp_path, "mirrored"), tmp_path / "run"))
    assert "2 replica(s)" in err
    assert "reads only its part" not in err  # one process runs both replicas: it reads whole batches
    assert "global batch: 1024 tokens per step = 2 replica(s) x 512 tokens x 1 accumulation step(s)" in err
    assert_same_training(tmp_path / "run", err, single_device_run)


def test_whole_step_xla_over_the_two_cpu_devices_is_refused_with_a_config_error(
    tmp_path, monkeypatch, capsys, restore_logging
):
    """`xla: true` with `mirrored` on CPU: each replica's compiled step would read the other device's variables
    (before: TensorFlow's InvalidArgumentError at the first step). train.py's `main` in this process (nothing is
    traced: the refusal comes first), with the two logical CPU devices as a stand-in strategy: this process' devices
    are set already, and the mirrored run above checks that `mirrored` makes two replicas. tests/nmt/test_precision.py
    checks `resolve_xla`, the function that decides."""
    import nmt.trainer
    import train as train_cli

    two_cpus = SimpleNamespace(
        extended=SimpleNamespace(
            worker_devices=("/job:localhost/device:CPU:0", "/job:localhost/device:CPU:1")
        ),
        num_replicas_in_sync=2,
    )
    monkeypatch.setattr(
        nmt.trainer, "make_strategy", lambda kind, minutes: two_cpus if kind == "mirrored" else None
    )
    config = config_file(tmp_path, "mirrored")
    tree = yaml.safe_load(config.read_text(encoding="utf-8"))
    tree["train"]["xla"] = True
    config.write_text(yaml.safe_dump(tree), encoding="utf-8")
    code = train_cli.main(["--config", str(config), "--model-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    assert (
        "train.py: config error: train.xla: true cannot compile a step over 2 CPU replicas in one process"
        in err
    )
    assert not (tmp_path / "run").exists()  # the new run's start is undone


@pytest.fixture(scope="module")
def two_worker_run(tmp_path_factory):
    """Two local workers train from scratch, uninterrupted, saving every 4 steps: (config, run dir, stderrs)."""
    tmp = tmp_path_factory.mktemp("two_workers")
    config = config_file(tmp, "multi_worker", checkpoint_every=4)
    with Workers(config, tmp / "run", tmp / "logs") as workers:
        results = workers.wait()
    for code, stderr in results:
        assert code == 0, stderr[-3000:]
    return config, tmp / "run", [stderr for _, stderr in results]


def test_multi_worker_two_local_processes_match_single_device(single_device_run, two_worker_run):
    _, run_dir, (chief, worker) = two_worker_run
    # Both processes trained, in one 2-replica group, to the same validation loss (same weights everywhere).
    assert "2 replica(s)" in chief and "2 replica(s)" in worker
    # Each worker read only its half of every global batch (and still trained like the single device, below).
    part = "reads only its part of every global batch: the rows of replicas {0}-{0} of 2"
    assert part.format(0) in chief and part.format(1) in worker
    assert final_validation_loss(worker) == final_validation_loss(chief)
    # Only the chief (worker 0) writes the run directory; worker 1 checkpoints (at the same steps) into a private
    # temporary directory, removed when it exits.
    chief_saves, worker_saves = saved_checkpoints(chief), saved_checkpoints(worker)  # step 12 saved twice
    chief_saves, worker_saves = list(dict.fromkeys(chief_saves)), list(dict.fromkeys(worker_saves))
    assert chief_saves == [run_dir / "checkpoints" / f"ckpt-{step}" for step in (4, 8, STEPS)]
    assert [path.name for path in worker_saves] == [path.name for path in chief_saves]
    private = worker_saves[0].parent.parent
    assert run_dir not in private.parents and private.name.startswith("nmt-worker-")
    assert not private.exists()
    assert_same_training(run_dir, chief, single_device_run)


def killed_after_checkpoint(reference: Path, run_dir: Path, step: int) -> None:
    """A copy of `reference`, a finished multi-worker run, as SIGKILL to both workers between its checkpoint at
    `step` and the next one leaves it: the later checkpoints, final/ and the final evaluation's record are gone (the
    uninterrupted run saved the same checkpoint at `step` that a killed one would have saved). The checkpoint list
    (`checkpoint`) is lost too: see `assert_restart_matches`."""
    shutil.copytree(reference, run_dir)
    for path in (run_dir / "checkpoints").glob("ckpt-*"):
        if int(path.name.split(".")[0].removeprefix("ckpt-")) > step:
            path.unlink()
    (run_dir / "checkpoints" / "checkpoint").unlink()
    shutil.rmtree(run_dir / "final")
    shutil.rmtree(run_dir / "tensorboard" / "final")
    metrics = run_dir / "metrics.jsonl"
    kept = [
        line
        for line in metrics.read_text(encoding="utf-8").splitlines(keepends=True)
        if json.loads(line).get("step", 0) <= step and json.loads(line).get("tag") != "final"
    ]
    metrics.write_text("".join(kept), encoding="utf-8")


def assert_restart_matches(config: Path, run_dir: Path, reference: Path, killed_at: int, logs: Path) -> None:
    """Both workers restarted on `run_dir`, whose checkpoint list is lost (the chief repairs it, and worker 1,
    reading the chief's directory, must find the same checkpoint, before or after that repair; a race: worker 1
    reading first resumed from step 0 and both refused; here the chief usually repairs first, so the read-only
    `checkpoint_to_resume` has its own test in tests/faults/test_run_dir_repairs.py): every worker resumes from
    the chief's checkpoint at `killed_at` and the run ends bit-identical to the uninterrupted `reference` (before
    the fix, worker 1 restarted from step 0 with fresh weights, optimizer state and data position)."""
    assert not (run_dir / "checkpoints" / "checkpoint").exists()
    with Workers(config, run_dir, logs) as workers:
        results = workers.wait()
    for code, stderr in results:
        assert code == 0, stderr[-3000:]
        assert resumed_step(stderr) == killed_at
    assert final_validation_loss(results[0][1]) == final_validation_loss(results[1][1])
    assert latest_step(run_dir) == STEPS
    # Weights, Adam moments and step, loss scale, dropout RNG: no tolerance (the same float operations in the
    # same order as the uninterrupted run; a two-term all-reduce sum does not depend on the order).
    assert_bit_identical(training_state(run_dir), training_state(reference), "resumed two-worker run")


def test_multi_worker_restart_after_both_were_killed_matches_uninterrupted(two_worker_run, tmp_path):
    """Both workers restarted on the run directory SIGKILL to both after checkpoint 4 leaves, made from the
    uninterrupted run (two processes fewer than killing a run of their own: the slow test below does)."""
    config, reference, _ = two_worker_run
    killed_after_checkpoint(reference, tmp_path / "run", 4)
    assert_restart_matches(config, tmp_path / "run", reference, 4, tmp_path / "restarted")


@pytest.mark.slow
def test_multi_worker_kill_both_and_restart_matches_uninterrupted(two_worker_run, tmp_path):
    """SIGKILL to both workers of a run of their own after a checkpoint, then both restarted."""
    config, reference, _ = two_worker_run
    run_dir = tmp_path / "run"
    with Workers(config, run_dir, tmp_path / "killed") as workers:
        workers.wait_for_checkpoint(4)
        workers.kill()
    killed_at = latest_step(run_dir)
    assert 4 <= killed_at < STEPS, f"the workers finished (step {killed_at}) before they were killed"
    (run_dir / "checkpoints" / "checkpoint").unlink()
    assert_restart_matches(config, run_dir, reference, killed_at, tmp_path / "restarted")


@pytest.mark.parametrize("workers, local", [(1, 2), (2, 1), (2, 2), (3, 2), (2, 3)])
def test_each_replica_of_a_part_gets_its_rows_of_the_global_batch(workers, local):
    """Rows as each worker's replicas take them from its part of a batch == rows as they took them from the whole
    global batch before parts existed (`[n * r // R, n * (r + 1) // R)`), for every batch size up to 40."""
    replicas = workers * local
    for rows in range(41):
        batch = np.arange(rows)
        taken = []
        for worker in range(workers):
            part = (worker * local, local, replicas)
            first, end = part_rows(rows, worker * local, (worker + 1) * local, replicas)
            mine = batch[first:end]  # what this worker reads
            for replica in range(worker * local, (worker + 1) * local):
                start, stop = replica_rows(rows, replica, replicas, part)
                assert 0 <= start <= stop <= len(mine)
                old = batch[rows * replica // replicas : rows * (replica + 1) // replicas]
                np.testing.assert_array_equal(mine[start:stop], old)
                taken.append(mine[start:stop])
                in_graph = replica_rows(tf.constant(rows), replica, replicas, part)  # tensors, as the trainer
                assert tuple(int(bound) for bound in in_graph) == (start, stop)
        np.testing.assert_array_equal(np.concatenate(taken), batch)  # every row once, in order


def test_a_repeated_signal_stops_a_single_process_at_once_but_not_a_worker():
    control = StopControl(tf.distribute.get_strategy())
    previous = control.install()
    try:
        signal.raise_signal(signal.SIGTERM)
        assert control.requested() and control.received == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):  # alone: the second signal stops the process now
            signal.raise_signal(signal.SIGINT)
        # The same handlers as a worker of a MultiWorkerMirroredStrategy (which needs a cluster) has them: a worker
        # that left at once would leave the others waiting, so the second signal is logged and changes nothing.
        control.multi_worker = True
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)
        assert control.received == signal.SIGTERM and control.agreed is None
    finally:
        StopControl.uninstall(previous)


@pytest.mark.parametrize("chief", [False, True])
@pytest.mark.parametrize("devices", [1, 2])
def test_replicas_are_named_by_the_tf_config_task_that_runs_them(monkeypatch, chief, devices):
    """TensorFlow's own numbering of the tasks (multi_worker_util.id_in_cluster: a chief task first) is the
    reference; messages name the task as TF_CONFIG does."""
    from tensorflow.python.distribute import multi_worker_util

    from nmt.distribute import worker_of_replica

    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]} | ({"chief": ["127.0.0.1:3"]} if chief else {})
    tasks = [("chief", 0)] * chief + [("worker", 0), ("worker", 1)]
    strategy = SimpleNamespace(extended=SimpleNamespace(worker_devices=[f"cpu:{i}" for i in range(devices)]))
    for kind, index in tasks:
        tf_config = {"cluster": cluster, "task": {"type": kind, "index": index}}
        monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
        first = multi_worker_util.id_in_cluster(cluster, kind, index) * devices
        for replica in range(first, first + devices):
            assert worker_of_replica(strategy, replica) == f"{kind} {index}"


def test_workers_whose_machines_resolve_precision_auto_differently_are_refused_by_name():
    """`train.precision: auto` on an AMX host and on an AVX2 host (resolve_precision given each CPU's flags): the
    same config, two policies. The collective's rows (one per replica, two replicas per worker) name each worker's
    policy once; the same policy everywhere passes."""
    from nmt.config import TrainConfig
    from nmt.distribute import PRECISIONS, WorkersDisagree, raise_unless_same_precision
    from nmt.precision import resolve_precision

    choices = TrainConfig.__dataclass_fields__["precision"].metadata["choices"]
    assert set(PRECISIONS) == set(choices) - {"auto"}
    amx = resolve_precision("auto", "cpu", flags={"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
    avx2 = resolve_precision("auto", "cpu", flags={"avx2", "fma"})
    assert (amx, avx2) == ("mixed_bfloat16", "float32")
    workers = ["worker 0", "worker 0", "worker 1", "worker 1"]
    same = [PRECISIONS.index(avx2)] * 4
    raise_unless_same_precision(workers, same)
    mixed = [PRECISIONS.index(amx)] * 2 + same[2:]
    with pytest.raises(WorkersDisagree) as raised:
        raise_unless_same_precision(workers, mixed)
    assert str(raised.value).startswith(
        "the workers would train in different precisions (worker 0: mixed_bfloat16, worker 1: float32): "
    )
    assert "set train.precision to one policy for every worker" in str(raised.value)


def test_check_same_config_gathers_each_workers_precision_and_refuses_two(monkeypatch):
    """The collective's wiring (the helper above is the message): each worker contributes its config's fingerprint
    and the index of the policy it resolved; the other worker is simulated by the gathered rows (one per worker),
    the same fingerprint with another policy."""
    import nmt.distribute as distribute

    control = StopControl(tf.distribute.get_strategy())
    control.multi_worker = True
    other = {}

    def gather(strategy, values, timeout=0.0):
        other["sent"] = list(values)
        return np.array([values, [values[0], other["policy"]]], dtype=np.float64)

    monkeypatch.setattr(distribute, "gather_from_workers", gather)
    monkeypatch.setattr(distribute, "worker_of_replica", lambda strategy, i: f"worker {i}")
    other["policy"] = distribute.PRECISIONS.index("float32")
    control.check_same_config(0xABC, precision="float32")
    assert other["sent"] == [float(0xABC), float(distribute.PRECISIONS.index("float32"))]
    other["policy"] = distribute.PRECISIONS.index("float32")
    with pytest.raises(distribute.WorkersDisagree, match=r"\(worker 0: mixed_bfloat16, worker 1: float32\)"):
        control.check_same_config(0xABC, precision="mixed_bfloat16")
