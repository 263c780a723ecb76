"""The disk fills up between two checkpoints: a clear error, exit 1, and the previous checkpoint still restores.

"Disk full" without root or a small mount: once the first checkpoint exists, the test lowers the running process'
RLIMIT_FSIZE (`prlimit`) below the size of a checkpoint's .data file (~100 KB here, mostly the data-iterator
state) but above everything else it writes meanwhile (TensorBoard events of step 1, the ~0.4 KB `checkpoint`
state file), so the next checkpoint write fails with EFBIG. SIGXFSZ, which would kill the process outright, is
ignored in the child (`preexec_fn`). The run itself is `conftest.disk_full_run`, started in the background.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tests.faults.helpers import MAX_STEPS, latest_step


def test_checkpoint_write_failure_is_reported_and_previous_checkpoint_survives(full_disk_run):
    run_dir, log, code = full_disk_run.result()
    good = latest_step(run_dir)
    good_prefix = str(run_dir / "checkpoints" / f"ckpt-{good}")
    assert code == 1, log[-3000:]
    assert "Traceback" not in log
    assert "train.py: training failed: could not write a checkpoint at step" in log
    assert "File too large" in log  # the OS error is passed on
    assert f"the previous one ({good_prefix}) is still usable" in log
    assert 0 < good < MAX_STEPS
    assert tf.train.latest_checkpoint(str(run_dir / "checkpoints")) == good_prefix
    assert not list((run_dir / "checkpoints").glob("*_temp*"))  # no half-written shards left behind
    assert not (run_dir / "final").exists()

    # Every tensor of the previous checkpoint reads back (the CRC of each is checked), weights are finite.
    reader = tf.train.load_checkpoint(good_prefix)
    for key, dtype in reader.get_variable_to_dtype_map().items():
        if dtype != tf.variant:  # the data-iterator state is a variant: restored by the next test
            value = reader.get_tensor(key)
            assert not dtype.is_floating or np.all(np.isfinite(value)), key
    assert int(reader.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")) == good


def test_previous_checkpoint_restores_into_a_trainer(full_disk_run):
    """The whole training state (model, Adam, step, data iterator, dropout RNG) restores: a rerun could resume."""
    from nmt.run_dir import RunDir
    from nmt.trainer import Trainer

    run_dir, _, _ = full_disk_run.result()
    run = RunDir(run_dir)
    trainer = Trainer(run.load_config(), run)
    trainer.setup()  # Trainer._restore: assert_existing_objects_matched, or TrainingError
    assert trainer.resumed_from == trainer.step == latest_step(run_dir)
    assert all(np.all(np.isfinite(w.numpy())) for w in trainer.model.weights)


def test_a_new_run_on_a_full_disk_exits_1_and_leaves_no_directory(tmp_path):
    """The lock file's pid cannot be written (RLIMIT_FSIZE 0: EFBIG, as a full disk's ENOSPC): one line naming the
    directory, exit 1 (a full disk is no usage error), and the directory it made goes (before 2026-12-07e, found by a
    review: exit 2, and DIR left with an empty train.lock)."""
    import resource
    import signal
    import subprocess
    import sys

    from tests.faults.helpers import ROOT

    def full_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))

    run = tmp_path / "parent" / "run"
    command = [sys.executable, "train.py", "--config", "tiny.yaml", "--model-dir", str(run)]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=full_disk
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert f"train.py: cannot use {run} as the run directory: File too large (its lock file)" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "parent").exists()
