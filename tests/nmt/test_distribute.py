"""tf.distribute: MirroredStrategy over two logical CPU devices and MultiWorkerMirroredStrategy as two local
worker processes train to the same weights as a single-device run (within float tolerance), and in a multi-worker
run only the chief writes the run directory.

Each run is a real `train.py` process (logical devices must be configured before TensorFlow starts).
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import yaml

from tests.run_fixture import tiny_config_tree, write_corpus

ROOT = Path(__file__).resolve().parents[2]
STEPS = 12


def config_file(tmp_path: Path, distribute: str) -> Path:
    tree = tiny_config_tree(write_corpus(tmp_path / "corpus"))
    tree["data"].update(bucket_boundaries=[32], batch_tokens=512)  # one bucket: 16 pairs per batch
    tree["model"].update(dropout=0.0)  # dropout masks differ per replica; everything else must agree
    tree["train"] = {
        "max_steps": STEPS,
        "warmup_steps": 4,
        "learning_rate": 0.005,
        "precision": "float32",
        "xla": False,
        "checkpoint_every": 1000,
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
    tmp = tmp_path_factory.mktemp("single")
    stderr = finish(run_train(config_file(tmp, "none"), tmp / "run"))
    return tmp / "run", stderr


def test_mirrored_on_two_cpu_devices_matches_single_device(single_device_run, tmp_path):
    err = finish(run_train(config_file(tmp_path, "mirrored"), tmp_path / "run"))
    assert "2 replica(s)" in err
    assert_same_training(tmp_path / "run", err, single_device_run)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_multi_worker_two_local_processes_match_single_device(single_device_run, tmp_path):
    config = config_file(tmp_path, "multi_worker")
    workers = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    processes = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        processes.append(run_train(config, tmp_path / "run", TF_CONFIG=json.dumps(tf_config)))
    chief, worker = [finish(p) for p in processes]
    run_dir = tmp_path / "run"
    # Both processes trained, in one 2-replica group, to the same validation loss (same weights everywhere).
    assert "2 replica(s)" in chief and "2 replica(s)" in worker
    assert final_validation_loss(worker) == final_validation_loss(chief)
    # Only the chief (worker 0) writes the run directory; worker 1 checkpoints into its private temporary dir.
    chief_saves, worker_saves = saved_checkpoints(chief), saved_checkpoints(worker)
    assert chief_saves == [run_dir / "checkpoints" / f"ckpt-{STEPS}"]
    assert len(worker_saves) == 1 and worker_saves[0].name == f"ckpt-{STEPS}"
    assert run_dir not in worker_saves[0].parents and worker_saves[0].parent.parent.name.startswith(
        "nmt-worker-"
    )
    shutil.rmtree(worker_saves[0].parent.parent, ignore_errors=True)  # train.py leaves it behind
    assert_same_training(run_dir, chief, single_device_run)


def saved_checkpoints(stderr: str) -> list[Path]:
    return [Path(path) for path in re.findall(r"saved checkpoint (\S+)", stderr)]
