"""Two local `train.py` workers of one `multi_worker` run (TF_CONFIG on 127.0.0.1), for the tests of
tests/nmt/test_distribute.py and tests/nmt/test_multi_worker_resume.py.

Each worker's stderr goes to a file (tests/faults/helpers.Background); `Workers` kills whatever is still running
when its `with` block ends, so a failed test leaves no process behind. No helper asserts how long anything takes:
the deadlines only turn a hang into a failure.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import time
from pathlib import Path

from tests.faults.helpers import RUN_TIMEOUT, Background, cli_env, latest_step, train_args

WORKERS = 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Workers:
    """`train.py` started once per worker of a fresh local cluster; worker 0 is the chief."""

    def __init__(
        self,
        config: Path,
        run_dir: Path,
        logs: Path,
        *overrides: str,
        worker_overrides=None,
        worker_dirs=None,
        worker_env=None,
    ):
        """`worker_overrides` / `worker_dirs` / `worker_env`: {worker index: extra --set values / its own --model-dir
        / extra environment variables}."""
        self.addresses = addresses = [f"127.0.0.1:{free_port()}" for _ in range(WORKERS)]
        self.run_dir, self.procs = Path(run_dir), []
        logs.mkdir(parents=True, exist_ok=True)
        for index in range(WORKERS):
            tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
            extra = (worker_overrides or {}).get(index, ())
            self.procs.append(
                Background(
                    "train.py",
                    *train_args(config, (worker_dirs or {}).get(index, run_dir), *overrides, *extra),
                    log_path=logs / f"worker{index}.log",
                    env=cli_env(TF_CONFIG=json.dumps(tf_config), **(worker_env or {}).get(index, {})),
                )
            )

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            if proc.running():
                proc.kill()

    def wait(self) -> list[tuple[int, str]]:
        """(exit code, stderr) of every worker, once all have exited."""
        return [(proc.wait(), proc.stderr()) for proc in self.procs]

    def wait_for_checkpoint(self, at_least: int) -> int:
        """Polls until the chief's latest checkpoint is at step >= at_least (every worker still running)."""
        deadline = time.monotonic() + RUN_TIMEOUT
        while time.monotonic() < deadline:
            step = latest_step(self.run_dir)
            if step >= at_least:
                return step
            for proc in self.procs:
                assert proc.running(), (
                    f"a worker exited before checkpoint {at_least}:\n{proc.stderr()[-3000:]}"
                )
            time.sleep(0.005)
        raise AssertionError(f"hang: no checkpoint >= {at_least} in {self.run_dir} after {RUN_TIMEOUT} s")

    def kill(self) -> None:
        """SIGKILL to every worker at once (nothing can be saved), then waits for them and removes the private
        checkpoint directories of the non-chief workers (a killed process cannot)."""
        for proc in self.procs:
            proc.signal(signal.SIGKILL)
        for proc in self.procs:
            proc.wait()
            for path in saved_checkpoints(proc.stderr()):
                if path.parent.parent.name.startswith("nmt-worker-"):
                    shutil.rmtree(path.parent.parent, ignore_errors=True)


def saved_checkpoints(stderr: str) -> list[Path]:
    return [Path(path) for path in re.findall(r"saved checkpoint (\S+)", stderr)]


def stop_message(stderr: str) -> tuple[str, int]:
    """(what stopped the run, its step) from the last line of a finished or stopped train.py."""
    found = re.findall(r"train\.py: (stopped by .+?|finished) at step (\d+)", stderr)
    assert found, f"no final message:\n{stderr[-3000:]}"
    return found[-1][0], int(found[-1][1])


def resumed_step(stderr: str) -> int | None:
    found = re.findall(r"train\.py: resuming \S+ from step (\d+)", stderr)
    return int(found[-1]) if found else None
