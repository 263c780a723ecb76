"""How long train.py takes to refuse a run directory that another training holds (README, Reliability).

The refusal comes before the slow imports (tests/faults/test_concurrent_runs.py checks that no TensorFlow, Keras,
TFDS or SentencePiece module is loaded by then); this measures what that is worth: the wall time of a whole
`train.py` process, from start to exit 3, on a run directory whose lock this process holds. Fractions of a second,
so it is cheap enough for `make bench`.

One record: {"bench": "refusal", "seconds" (median), "min_seconds", "max_seconds", "repeats", "exit_code",
"refused" (exit 3 with the "already running" message)}. A `train.py` that exits with another code (a config
error, a crash) stops the benchmark with one line naming its exit code and its last line on stderr: its time is
not a refusal's.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import median, rounded
from benchmarks.train_start import child_config

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 600  # seconds: only against a hang (a refusal takes ~0.2 s on the README's machine)
REFUSED = 3  # train.py's exit code for a run directory that another training holds


def refusal_command(config: str, overrides=(), *, run_dir: Path) -> list[str]:
    """The `train.py` command of one try, started in the repository: `config` as this process's working directory
    means it (`benchmarks.train_start.child_config`: an existing file made absolute, a bare name kept)."""
    args = [sys.executable, str(ROOT / "train.py"), "--config", child_config(config)]
    for override in overrides:
        args += ["--set", override]
    return [*args, "--model-dir", str(run_dir)]


def check_refused(done: subprocess.CompletedProcess) -> None:
    """SystemExit (one line: bench.py stops with exit 1) when `train.py` did not exit with the refusal's code: it
    failed for another reason (a config error, a crash), and its time would not be the refusal's."""
    if done.returncode != REFUSED:
        lines = [line.strip() for line in (done.stderr or "").splitlines() if line.strip()]
        said = lines[-1] if lines else "(nothing on stderr)"
        raise SystemExit(
            f"bench.py: refusal: train.py exited with {done.returncode}, not the refusal's {REFUSED}: {said}"
        )


def bench_refusal(emit, *, config: str, overrides=(), repeats: int = 3) -> dict:
    """Starts `train.py --config CONFIG` `repeats` times on a locked run directory; emits and returns the record.

    A try that does not end in the refusal's exit code stops the benchmark (`check_refused`): nothing is emitted."""
    from nmt.run_dir import RunDir, RunLock

    seconds, refused = [], True
    with tempfile.TemporaryDirectory(prefix="bench-refusal-") as tmp:
        run_dir = RunDir(Path(tmp) / "run")
        command = refusal_command(config, overrides, run_dir=run_dir.path)
        with RunLock(run_dir):  # "another training" is this process
            for _ in range(repeats):
                start = time.perf_counter()
                done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=TIMEOUT)
                seconds.append(time.perf_counter() - start)
                check_refused(done)
                refused = refused and "is already running" in done.stderr
    return emit(
        {
            "bench": "refusal",
            "seconds": rounded(median(seconds), 3),
            "min_seconds": rounded(min(seconds), 3),
            "max_seconds": rounded(max(seconds), 3),
            "repeats": repeats,
            "exit_code": REFUSED,
            "refused": refused,
        }
    )
