"""`train.py` as a child process: seconds from its start to its first training step, and its peak memory.

    result = run_train(config, overrides, run_dir, steps=30)

The child is the real `python train.py --config C --set ... --model-dir RUN_DIR` (a fresh run directory, evaluations
and BLEU off, `steps` optimizer steps, TensorBoard scalars every 10 steps). Measured from outside:

- `first_step_seconds`: from just before the child is started to the `wall_time` of its first TensorBoard train
  event (step 1). The trainer writes it right after step 1 returned its loss (`float(metrics["loss"])` waits for
  the step), so it covers start-up, imports, the data cache, the model, the first batch and the first step with
  its tracing. Also from the child's log (millisecond timestamps): `imports_seconds` (the "run directory" line,
  after TensorFlow is imported) and `train_split_open_seconds` (the "split train: ..." line, the split opened).
- `peak_rss_mb`: the child's peak resident set size as the kernel keeps it (VmHWM in /proc/PID/status, read every
  50 ms until the child exits: exact up to its last 50 ms). Not `ru_maxrss` of `os.wait4`: a child spawned with
  vfork inherits its parent's peak there (a bench process holding TensorFlow would set the figure). It counts the
  pages of memory-mapped files the process touched (shared libraries, page cache: reclaimable), so
  `peak_rss_anon_mb` (RssAnon, sampled likewise) gives the anonymous part alone.
- `tokens_per_sec`: the trainer's own figure for its last 10-step window (TensorBoard `tokens_per_sec`).
"""

from __future__ import annotations

import datetime
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETTINGS = ("train.eval_every=0", "train.bleu_every=0", "train.checkpoint_every=1000000", "train.average_last=0",
            "train.log_every=10")  # fmt: skip
LOG_TIME = "%Y-%m-%d %H:%M:%S,%f"  # logging's asctime (train.py's log format starts with it)
EXIT_GRACE = 120.0  # seconds a child may take to exit after its last line


def _rss_sampler(pid: int, interval: float = 0.05) -> tuple[threading.Thread, dict]:
    """A thread recording the peak VmHWM / VmRSS / RssAnon / RssFile (MB) of `pid` until it exits."""
    peaks = {"VmHWM": 0, "VmRSS": 0, "RssAnon": 0, "RssFile": 0}

    def sample():
        path = Path(f"/proc/{pid}/status")
        while True:
            try:
                text = path.read_text(encoding="ascii", errors="replace")
            except OSError:
                return
            values = {}
            for line in text.splitlines():
                key, _, value = line.partition(":")
                if key in peaks:
                    values[key] = int(value.split()[0]) / 1024
            if not values:  # a zombie: exited, not yet reaped
                return
            for key, value in values.items():
                peaks[key] = max(peaks[key], value)
            time.sleep(interval)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    return thread, peaks


def train_events(run_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    """{tag: [(step, wall_time, value)]} of the run's TensorBoard train/ scalars."""
    import tensorflow as tf
    from tensorflow.core.util import event_pb2

    events: dict[str, list] = {}
    for path in sorted((Path(run_dir) / "tensorboard" / "train").glob("events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(str(path)):
            event = event_pb2.Event.FromString(record.numpy())
            for value in event.summary.value:
                number = value.simple_value if value.HasField("simple_value") else None
                if number is None and value.HasField("tensor"):
                    number = float(tf.make_ndarray(value.tensor))
                events.setdefault(value.tag, []).append((int(event.step), float(event.wall_time), number))
    return events


def log_seconds(log_text: str, needle: str, start: float) -> float | None:
    """Seconds from `start` (epoch) to the first log line containing `needle` (None if there is none)."""
    for line in log_text.splitlines():
        if needle in line:
            try:
                stamp = datetime.datetime.strptime(line[:23], LOG_TIME).timestamp()
            except ValueError:
                continue
            return stamp - start
    return None


def run_child(
    command: list[str], log_path: Path, *, finished: str, grace: float = EXIT_GRACE, cwd: Path = REPO
) -> dict:
    """Runs `command` in `cwd`, its output into `log_path`, and measures it from outside.

    Returns {"start", "end" (epoch seconds), "returncode", "peak_rss_mb" (the kernel's VmHWM of this child),
    "peak_rss_anon_mb", "peak_rss_file_mb" (sampled), "log" (its output), "killed_after_finishing"}. A child whose
    log shows `finished` but that has not exited `grace` seconds later is killed and reported so: a live
    `tf.data` iterator whose `tf.numpy_function` threads are busy when the interpreter shuts down can hang the
    exit (seen with data.batching's reader in a /tmp script: 2 of 6 exits hung, before and after this change).
    """
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    killed = threading.Event()
    with open(log_path, "w", encoding="utf-8") as log_file:
        start = time.time()
        child = subprocess.Popen(command, cwd=cwd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
        sampler, peaks = _rss_sampler(child.pid)
        watchdog = threading.Thread(
            target=_kill_if_stuck, args=(child.pid, log_path, finished, grace, killed), daemon=True
        )
        watchdog.start()
        _, status = os.waitpid(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, so that Popen does not wait again
        end = time.time()
    sampler.join()
    log_text = log_path.read_text(encoding="utf-8", errors="replace")
    returncode = 0 if killed.is_set() and finished in log_text else child.returncode
    return {
        "start": start,
        "end": end,
        "returncode": returncode,
        "peak_rss_mb": round(max(peaks["VmHWM"], peaks["VmRSS"])),
        "peak_rss_anon_mb": round(peaks["RssAnon"]),
        "peak_rss_file_mb": round(peaks["RssFile"]),
        "log": log_text,
        "killed_after_finishing": killed.is_set(),
    }


def _kill_if_stuck(pid: int, log_path: Path, finished: str, grace: float, killed: threading.Event) -> None:
    seen = None
    while Path(f"/proc/{pid}/status").exists():
        try:
            status = Path(f"/proc/{pid}/status").read_text(encoding="ascii", errors="replace")
        except OSError:
            return
        if "\nState:\tZ" in status:  # exited, being reaped
            return
        if seen is None and finished in log_path.read_text(encoding="utf-8", errors="replace"):
            seen = time.time()
        if seen is not None and time.time() - seen > grace:
            killed.set()
            os.kill(pid, signal.SIGKILL)  # not reaped yet: the pid is still this child's
            return
        time.sleep(1.0)


def child_config(config: str | Path) -> str:
    """`config` as a child process started in another directory (the repository) must be given it: a file that
    exists from this process's working directory becomes its absolute path (it is what `--config` means here);
    anything else stays as given, e.g. a bare name such as tiny.yaml that resolves in configs/."""
    path = Path(config).expanduser()
    return str(path.absolute()) if path.is_file() else str(config)


def train_command(config: str | Path, overrides: list[str], run_dir: Path, *, steps: int) -> list[str]:
    """The `train.py` command line of `run_train` (started in the repository): the config and the run directory
    as this process's working directory means them (`child_config`, an absolute `run_dir`)."""
    return [sys.executable, "train.py", "--config", child_config(config), "--model-dir",
            str(Path(run_dir).absolute()), "--set", *overrides, *SETTINGS, f"train.max_steps={steps}"]  # fmt: skip


def run_train(
    config: str, overrides: list[str], run_dir: Path, *, steps: int = 30, repo: Path = REPO
) -> dict:
    """Runs `repo`/train.py for `steps` steps into the fresh `run_dir`; returns the measurements (module doc).

    `config` and `run_dir` are read from this process's working directory; `overrides` are passed as given, so
    paths in them must be absolute (`benchmarks.input_scale`'s are)."""
    run_dir = Path(run_dir).absolute()
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log_path = run_dir.with_name(run_dir.name + ".log")
    command = train_command(config, overrides, run_dir, steps=steps)
    child = run_child(command, log_path, finished="train.py: finished", cwd=repo)
    log_text, start = child["log"], child["start"]
    if child["returncode"]:
        raise RuntimeError(f"train.py failed ({child['returncode']}); {log_path}:\n{log_text[-3000:]}")
    events = train_events(run_dir)
    first = [wall for step, wall, _ in events.get("loss", []) if step == 1]
    if not first:
        raise RuntimeError(
            f"train.py wrote no TensorBoard train scalar at step 1 under {run_dir}/tensorboard"
        )
    speeds = sorted(events.get("tokens_per_sec", []))
    read = re.search(r"split train: \d+ pairs, read (.+)", log_text)
    return {
        "first_step_seconds": round(first[0] - start, 2),
        "imports_seconds": _rounded(log_seconds(log_text, "nmt.train: run directory", start)),
        "train_split_open_seconds": _rounded(log_seconds(log_text, "split train:", start)),
        "train_split_read": read.group(1).strip() if read else None,
        "steps": steps,
        "total_seconds": round(child["end"] - start, 2),
        "peak_rss_mb": child["peak_rss_mb"],
        "peak_rss_anon_mb": child["peak_rss_anon_mb"],
        "peak_rss_file_mb": child["peak_rss_file_mb"],
        "tokens_per_sec": round(speeds[-1][2], 1) if speeds else None,  # the last window's
        "killed_after_finishing": child["killed_after_finishing"],
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
