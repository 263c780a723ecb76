"""nmt.summaries.peak_memory_mb: this process's own peak, not a parent's."""

import subprocess
import sys

import numpy as np

from nmt.summaries import peak_memory_mb

CHILD = "from nmt.summaries import peak_memory_mb; print(peak_memory_mb())"


def test_peak_grows_with_a_touched_allocation():
    before = peak_memory_mb()
    block = np.ones(256 * 2**20 // 8)  # 256 MiB, every page written
    assert peak_memory_mb() >= before + 200 or before > 256 + 200  # a peak already above it need not move
    del block


def test_a_child_reports_its_own_peak_not_its_parents():
    block = np.ones(1536 * 2**20 // 8)  # the parent's peak now exceeds 1.5 GiB
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    del block
    assert float(child.stdout.split()[-1]) < 1400  # a child importing TensorFlow stays far below 1.5 GiB


def scalar_steps(directory) -> list[tuple[str, int]]:
    """(tag, step) of every scalar in the event files under `directory`, in file order."""
    import tensorflow as tf

    found = []
    for path in sorted(directory.rglob("events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(str(path)):
            event = tf.compat.v1.Event.FromString(record.numpy())
            found += [(value.tag, event.step) for value in event.summary.value]
    return found


def test_events_after_a_step_go_and_a_cut_record_with_them(tmp_path):
    import tensorflow as tf

    from nmt.summaries import drop_events_after

    for name in ("train", "validation"):
        writer = tf.summary.create_file_writer(str(tmp_path / name))
        with writer.as_default():
            for step in range(1, 6):
                tf.summary.scalar("loss", 1.0 / step, step=step)
        writer.close()
    (cut,) = (tmp_path / "validation").glob("events.out.tfevents.*")
    cut.write_bytes(cut.read_bytes()[:-5])  # a crash in the middle of the last record (step 5)
    assert drop_events_after(tmp_path, 3) == 2 + 2  # train: steps 4, 5; validation: step 4 and the cut record
    assert scalar_steps(tmp_path) == [("loss", step) for step in (1, 2, 3)] * 2
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file() and "partial" in p.name) == []
    assert drop_events_after(tmp_path, 3) == 0  # nothing left to drop: the files stay as they are
