"""The input_scale benchmark's measuring parts: a child's peak RSS and exit watchdog, the first step read from
train.py's TensorBoard events and log, and (slow) the whole record at a tiny size. No timing assertions."""

import io
import json

import pytest

CHILD = """
import sys, time
block = bytearray(int(sys.argv[1]) * 2**20)  # touched: resident
time.sleep(2)  # RSS is sampled while the child lives (every 50 ms): time for a loaded machine to sample it
print("child: finished", flush=True)
if sys.argv[2] == "hang":
    time.sleep(600)
"""


@pytest.mark.parametrize("ending", ["exit", "hang"])
def test_run_child_reports_peak_rss_and_kills_a_child_stuck_after_its_last_line(tmp_path, ending):
    import sys

    from benchmarks.train_start import run_child

    result = run_child(
        [sys.executable, "-c", CHILD, "300", ending],
        tmp_path / "child.log",
        finished="child: finished",
        grace=1,
    )
    assert result["returncode"] == 0 and "child: finished" in result["log"]
    assert result["killed_after_finishing"] == (ending == "hang")
    assert 300 <= result["peak_rss_mb"] < 300 + 200  # the kernel's peak: the block plus an interpreter
    assert result["peak_rss_anon_mb"] <= result["peak_rss_mb"]


def test_first_step_time_is_read_from_train_py_tensorboard_events_and_log(tmp_path):
    import logging
    import time

    import tensorflow as tf

    from benchmarks.train_start import log_seconds, train_events

    start = time.time()
    writer = tf.summary.create_file_writer(str(tmp_path / "tensorboard" / "train"))
    for step in (1, 10):
        with writer.as_default(step=step):
            tf.summary.scalar("loss", 9.0 / step)
            tf.summary.scalar("tokens_per_sec", 100.0 * step)
    writer.flush()
    events = train_events(tmp_path)
    assert [step for step, _, _ in events["loss"]] == [1, 10]
    assert [value for _, _, value in events["loss"]] == pytest.approx([9.0, 0.9])  # float32 scalars
    assert [value for _, _, value in events["tokens_per_sec"]] == [100.0, 1000.0]
    assert start - 1 <= events["loss"][0][1] <= time.time() + 1  # wall_time: epoch seconds of the write

    record = logging.LogRecord("nmt.train", logging.INFO, "", 0, "run directory X (new run)", None, None)
    record.created = start + 2.5
    record.msecs = (record.created % 1) * 1000
    line = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s").format(record)  # train.py's
    log = "\n".join(["some output", line, "more"])
    assert log_seconds(log, "nmt.train: run directory", start) == pytest.approx(2.5, abs=0.002)
    assert log_seconds(log, "absent", start) is None


def _write_mirror(folder, pairs):
    """A Multi30k-like mirror: train.{en,de}.gz from `pairs`, val.{en,de}.gz of one pair."""
    import gzip

    folder.mkdir()
    for index, lang in enumerate(("en", "de")):
        for split, rows in (("train", pairs), ("val", pairs[:1])):
            text = "".join(row[index] + "\n" for row in rows)
            (folder / f"{split}.{lang}.gz").write_bytes(gzip.compress(text.encode("utf-8")))
    return folder


def test_synthetic_corpus_draws_from_the_mirror_of_nmt_data_mirror(tmp_path, monkeypatch):
    """$NMT_DATA_MIRROR is where the synthetic corpus finds Multi30k (as data.corpus does); a mirror without its
    files is a one-line DataError naming the mirror and the missing files."""
    from benchmarks.synthetic_corpus import write_corpus
    from data.errors import DataError

    pairs = [("a dog.", "ein hund."), ("a cat.", "eine katze.")]
    monkeypatch.setenv("NMT_DATA_MIRROR", str(_write_mirror(tmp_path / "mirror", pairs)))
    out = write_corpus(tmp_path / "corpus", 5)
    english = (out / "en.train.txt").read_text(encoding="utf-8").splitlines()
    german = (out / "de.train.txt").read_text(encoding="utf-8").splitlines()
    joined = {f"{a[0]} {b[0]}": f"{a[1]} {b[1]}" for a in pairs for b in pairs}
    assert len(english) == 5 and all(joined[en] == de for en, de in zip(english, german))
    assert (out / "de.validation.txt").read_text(encoding="utf-8") == "ein hund.\n"

    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("NMT_DATA_MIRROR", str(tmp_path / "empty"))
    with pytest.raises(
        DataError, match=r"^Multi30k mirror .*empty has no train\.en\.gz, .*NMT_DATA_MIRROR"
    ) as err:
        write_corpus(tmp_path / "corpus-2", 5)
    assert "\n" not in str(err.value) and not (tmp_path / "corpus-2").exists()


def test_input_scale_stops_on_a_mirror_without_multi30k_before_it_runs_anything(tmp_path, monkeypatch):
    """From bench.py: one line (SystemExit: no traceback, exit 1), before any corpus or child process."""
    from benchmarks.input_scale import bench_input_scale

    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("NMT_DATA_MIRROR", str(tmp_path / "empty"))
    emitted = []
    with pytest.raises(SystemExit) as stopped:
        bench_input_scale(
            emitted.append,
            config="tiny.yaml",
            pairs=(10,),
            workdir=tmp_path / "work",
            train_steps=1,
            speed_rounds=0,
        )
    message = str(stopped.value.code)
    assert message.startswith("bench.py: input_scale: Multi30k mirror ") and "train.en.gz" in message
    assert "\n" not in message and emitted == [] and not (tmp_path / "work").exists()


def test_input_scale_children_get_paths_of_the_working_directory(tmp_path, monkeypatch):
    """The children run in the repository: a config file and a work directory given relative to bench.py's
    working directory reach them as absolute paths (they used to be read from the repository: no such corpus);
    a bare configs/ name stays as given."""
    import shutil
    from pathlib import Path

    from benchmarks.input_scale import REPO, child_paths
    from benchmarks.train_start import train_command

    shutil.copy(REPO / "configs" / "tiny.yaml", tmp_path / "mytiny.yaml")
    monkeypatch.chdir(tmp_path)
    assert child_paths("mytiny.yaml", "runs/scale") == (
        str(tmp_path / "mytiny.yaml"),
        tmp_path / "runs" / "scale",
    )
    assert child_paths("tiny.yaml", "runs/scale")[0] == "tiny.yaml"
    command = train_command("mytiny.yaml", ["data.source=en"], Path("runs/train-1"), steps=3)
    assert command[command.index("--config") + 1] == str(tmp_path / "mytiny.yaml")
    assert command[command.index("--model-dir") + 1] == str(tmp_path / "runs" / "train-1")
    assert command[command.index("--set") + 1] == "data.source=en" and command[-1] == "train.max_steps=3"


@pytest.mark.slow
def test_input_scale_emits_its_record_at_a_tiny_size(tmp_path, monkeypatch):
    """The whole input_scale measurement on 600 synthetic pairs with a copy of tiny.yaml, run from a directory
    outside the repository with a relative work directory (minutes on a loaded machine)."""
    import shutil

    from benchmarks.common import JsonLines
    from benchmarks.input_scale import REPO, bench_input_scale
    from benchmarks.synthetic_corpus import multi30k_mirror
    from data.errors import DataError

    try:
        multi30k_mirror()
    except DataError as err:
        pytest.skip(str(err))
    shutil.copy(REPO / "configs" / "tiny.yaml", tmp_path / "mytiny.yaml")
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    (record,) = bench_input_scale(
        JsonLines(out), config="mytiny.yaml", pairs=(600,), workdir="work", train_steps=3, speed_rounds=2,
        speed_block=2,
    )  # fmt: skip
    assert json.loads(out.getvalue()) == record
    assert record["bench"] == "input_scale" and record["pairs"] == 600 and record["config"] == "mytiny.yaml"
    train, speed = record["train"], record["prepared_speed"]
    assert train["steps"] == 3 and train["train_split_read"] == "memory"  # a tiny split is loaded
    assert 0 < train["imports_seconds"] <= train["train_split_open_seconds"] <= train["first_step_seconds"]
    assert record["first_step_seconds_warm"] == train["first_step_seconds"]
    marks = record["first_batch_marks_warm"]
    stages = ["started", "tensorflow_imported", "imported", "prepared", "dataset_built", "first_batch"]
    assert list(marks) == stages
    assert 0 < marks["started"] and list(marks.values()) == sorted(marks.values())
    assert marks["first_batch"] == pytest.approx(record["first_batch_seconds_warm"], abs=0.01)
    assert 0 < train["peak_rss_anon_mb"] <= train["peak_rss_mb"] == record["train_peak_rss_mb"]
    assert speed["train_split_pairs"] == 600 and speed["traces_while_timed"] >= 0
    assert speed["prepared_vs_memory"] == record["prepared_vs_memory"] > 0
    assert len(speed["prepared_vs_memory_per_round"]) == 2
    assert set(record["machine"]) >= {"cpu_model", "cpus", "memory_gib", "gpu", "load_average"}
    assert sorted(path.name for path in (tmp_path / "work").iterdir()) == [
        "corpus-600"
    ]  # caches and runs removed


# --- decode rows of other engines (benchmarks.decode_engines, benchmarks.significance) ---------------------------
