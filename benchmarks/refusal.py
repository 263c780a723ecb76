"""How long train.py takes to refuse a run directory that another training holds (README, Reliability).

The refusal comes before the slow imports (tests/faults/test_concurrent_runs.py checks that no TensorFlow, Keras,
TFDS or SentencePiece module is loaded by then); this measures what that is worth: the wall time of a whole
`train.py` process, from start to exit 3, on a run directory whose lock this process holds. Fractions of a second,
so it is cheap enough for `make bench`.

One record: {"bench": "refusal", "seconds" (median), "min_seconds", "max_seconds", "repeats", "exit_code",
"refused" (exit 3 with the "already running" message)}.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import median, rounded

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 600  # seconds: only against a hang (a refusal takes ~0.2 s on the README's machine)


def bench_refusal(emit, *, config: str, overrides=(), repeats: int = 3) -> dict:
    """Starts `train.py --config CONFIG` `repeats` times on a locked run directory; emits and returns the record."""
    from nmt.run_dir import RunDir, RunLock

    args = [sys.executable, str(ROOT / "train.py"), "--config", str(config)]
    for override in overrides:
        args += ["--set", override]
    seconds, codes, refused = [], set(), True
    with tempfile.TemporaryDirectory(prefix="bench-refusal-") as tmp:
        run_dir = RunDir(Path(tmp) / "run")
        with RunLock(run_dir):  # "another training" is this process
            for _ in range(repeats):
                start = time.perf_counter()
                done = subprocess.run(
                    [*args, "--model-dir", str(run_dir.path)],
                    capture_output=True,
                    text=True,
                    cwd=ROOT,
                    timeout=TIMEOUT,
                )
                seconds.append(time.perf_counter() - start)
                codes.add(done.returncode)
                refused = refused and done.returncode == 3 and "is already running" in done.stderr
    return emit(
        {
            "bench": "refusal",
            "seconds": rounded(median(seconds), 3),
            "min_seconds": rounded(min(seconds), 3),
            "max_seconds": rounded(max(seconds), 3),
            "repeats": repeats,
            "exit_code": codes.pop() if len(codes) == 1 else sorted(codes),
            "refused": refused,
        }
    )
