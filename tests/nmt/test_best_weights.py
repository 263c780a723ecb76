"""DIR/best/ across a crash: the bests of lost steps go on resume, the earlier best a checkpoint needs stays."""

import numpy as np
import pytest
import tensorflow as tf

from nmt.best_weights import BestWeights
from nmt.run_dir import RunDir, RunDirError


class Weights(tf.Module):
    def __init__(self):
        super().__init__()
        self.kernel = tf.Variable(np.zeros(3, np.float32))


def restored(prefix: str) -> float:
    """The value the checkpoint at `prefix` holds (every weight is set to its step when saved)."""
    model = Weights()
    tf.train.Checkpoint(model=model).restore(prefix).assert_existing_objects_matched()
    return float(model.kernel.numpy()[0])


def files(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.fixture
def best(tmp_path):
    model = Weights()
    store = BestWeights(model, tmp_path / "best")

    def save(step: int) -> None:
        model.kernel.assign(np.full(3, step, np.float32))
        store.save(step)

    return store, save


def test_bests_stay_while_a_training_checkpoint_may_need_them(best, tmp_path):
    store, save = best
    save(2)
    assert store.prune([3]) == []  # the best as of checkpoint 3
    save(4)
    assert store.steps() == [2, 4]
    assert restored(tf.train.latest_checkpoint(str(tmp_path / "best"))) == 4.0  # the best so far, for readers
    assert store.prune([3, 6]) == []  # 2 for a resume from 3, 4 for one from 6
    save(7)
    assert store.prune([6, 9]) == [2]  # no kept checkpoint resumes before step 4 any more
    assert store.steps() == [4, 7]
    assert files(tmp_path / "best") == [
        "checkpoint",
        "ckpt-4.data-00000-of-00001",
        "ckpt-4.index",
        "ckpt-7.data-00000-of-00001",
        "ckpt-7.index",
    ]


def test_resuming_removes_the_bests_of_lost_steps(best, tmp_path):
    store, save = best
    for step in (2, 4, 7):
        save(step)
    store.prune([3, 6])  # the last checkpoint is 6; then the process dies at step 8, saving the best of 8 ...
    save(8)
    (tmp_path / "best" / "ckpt-9_temp").mkdir()  # ... and half of that of step 9
    assert store.roll_back(6) == [7, 8]
    assert store.steps() == [2, 4]
    prefix = RunDir(tmp_path).weights_prefix("best")  # what evaluate.py --weights best loads
    assert prefix == str(tmp_path / "best" / "ckpt-4") and restored(prefix) == 4.0
    assert not [name for name in files(tmp_path / "best") if "-7" in name or "-8" in name or "-9" in name]
    assert store.roll_back(6) == []  # nothing after step 6 any more
    save(8)  # the resumed run's own best of step 8
    assert store.steps() == [2, 4, 8] and restored(str(tmp_path / "best" / "ckpt-8")) == 8.0


def test_a_resume_before_every_best_leaves_no_best(best, tmp_path):
    store, save = best
    save(5)
    assert store.roll_back(3) == [5]
    assert files(tmp_path / "best") == []  # not even TensorFlow's state file: nothing names a removed file
    with pytest.raises(RunDirError, match="no trained weights found"):
        RunDir(tmp_path).weights_prefix("best")


def test_a_best_dir_of_the_earlier_layout_is_read_and_rolled_back(tmp_path):
    """Before, best/ held one checkpoint (a CheckpointManager keeping 1)."""
    model = Weights()
    for step in (3, 5):
        model.kernel.assign(np.full(3, step, np.float32))
        tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(tmp_path / "best"), 1).save(step)
    store = BestWeights(model, tmp_path / "best")
    assert store.steps() == [5]
    assert store.roll_back(5) == [] and restored(RunDir(tmp_path).weights_prefix("best")) == 5.0
    assert store.roll_back(4) == [5] and store.steps() == []
