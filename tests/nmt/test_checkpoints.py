"""nmt.checkpoints: a checkpoint cut short by a full disk (its data renamed into place, its index cut) is never
taken for one to resume from: the failed save removes its files, and the state file's repair skips an index that
does not open (before 2026-12-07e, found by a review: a run whose first save was cut could never resume, every rerun
failing on "not an sstable")."""

import errno
import shutil

import pytest
import tensorflow as tf

from nmt.checkpoints import TrainingCheckpoints, checkpoint_to_resume, repair_checkpoint_state


def cut_copy(directory, step_from: int, step_to: int, index_bytes: int) -> None:
    """ckpt-`step_to`'s files as a save cut by a full disk leaves them: ckpt-`step_from`'s data, its index cut."""
    for data in directory.glob(f"ckpt-{step_from}.data-*"):
        shutil.copy(data, directory / data.name.replace(f"ckpt-{step_from}.", f"ckpt-{step_to}."))
    index = (directory / f"ckpt-{step_from}.index").read_bytes()
    (directory / f"ckpt-{step_to}.index").write_bytes(index[:index_bytes])


@pytest.mark.parametrize("index_bytes", [0, 40])
def test_a_failed_save_removes_its_files_and_the_previous_checkpoint_resumes(
    tmp_path, monkeypatch, index_bytes
):
    checkpoints = TrainingCheckpoints(
        tf.train.Checkpoint(v=tf.Variable([1.0, 2.0])), tmp_path, keep=3, every=5
    )
    checkpoints.save(5, resumed_from=0)

    def full_disk(manager, checkpoint_number=None, **kwargs):
        cut_copy(tmp_path, 5, checkpoint_number, index_bytes)
        raise tf.errors.ResourceExhaustedError(
            None, None, f"{tmp_path}/ckpt-10.index; No space left on device"
        )

    monkeypatch.setattr(tf.train.CheckpointManager, "save", full_disk)
    with pytest.raises(tf.errors.ResourceExhaustedError):
        checkpoints.save(10, resumed_from=0)
    assert not list(tmp_path.glob("ckpt-10*"))
    assert checkpoint_to_resume(tmp_path) == str(tmp_path / "ckpt-5")
    # and one that is the state file's latest (its record written, then the error) stays
    monkeypatch.undo()
    checkpoints.save(10, resumed_from=0)

    def late_error(manager, checkpoint_number=None, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tf.train.CheckpointManager, "save", late_error)
    with pytest.raises(OSError):
        checkpoints.save(10, resumed_from=10)
    assert (tmp_path / "ckpt-10.index").is_file()


@pytest.mark.parametrize("index_bytes", [0, 40])
def test_the_repair_skips_a_checkpoint_whose_index_does_not_open(tmp_path, index_bytes):
    """Left by a process killed in the save, or by code before the cleanup above: ckpt-10 data present, its index
    cut, the state file missing. The repair names ckpt-5; with the cut checkpoint alone there is none to resume."""
    checkpoints = TrainingCheckpoints(
        tf.train.Checkpoint(v=tf.Variable([1.0, 2.0])), tmp_path, keep=3, every=5
    )
    checkpoints.save(5, resumed_from=0)
    cut_copy(tmp_path, 5, 10, index_bytes)
    (tmp_path / "checkpoint").unlink()
    assert checkpoint_to_resume(tmp_path) == str(tmp_path / "ckpt-5")
    assert "rewritten from the checkpoints present (ckpt-5)" in repair_checkpoint_state(tmp_path)
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-5")

    alone = tmp_path / "alone"
    alone.mkdir()
    for path in tmp_path.glob("ckpt-10.*"):
        shutil.move(path, alone / path.name)
    assert checkpoint_to_resume(alone) is None and repair_checkpoint_state(alone) == ""
