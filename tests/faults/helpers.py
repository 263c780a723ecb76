"""Helpers of the fault-injection tests (tests/faults): the tiny training config, CLI runners, checkpoint readers.

The fixtures and the shared training scenarios are in tests/faults/conftest.py. No helper here asserts how long
anything takes (the CPU may be shared and slow): waits have generous deadlines (`RUN_TIMEOUT`) only so that a hang
fails instead of blocking the suite, and their messages say so.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.run_fixture import tiny_config_tree

ROOT = Path(__file__).resolve().parents[2]
MAX_STEPS = 60  # optimizer steps of every fault run (tens of milliseconds each once compiled)
CHECKPOINT_EVERY = 5
# Seconds before a process that should have ended counts as hung (a whole fault run takes ~15 s idle).
RUN_TIMEOUT = 600


def fault_tree(corpus: Path) -> dict:
    """The tiny training config as a YAML tree (dropout > 0, so the RNG state matters for exact resumes)."""
    tree = tiny_config_tree(corpus)
    tree["data"].update(bucket_boundaries=[32], batch_tokens=256)  # one bucket: batches of 8 pairs, one trace
    tree["model"].update(d_model=16, d_ff=32, dropout=0.1)
    tree["train"] = {
        "seed": 1234,
        "max_steps": MAX_STEPS,
        "checkpoint_every": CHECKPOINT_EVERY,
        "keep_checkpoints": 3,
        "log_every": 1,  # a TensorBoard loss per step: test_graceful_stop counts the steps after a signal
        "eval_every": 0,
        "bleu_every": 0,
        "warmup_steps": 5,
        "learning_rate": 0.01,
        "precision": "float32",
        "xla": False,
        "max_bad_steps": 3,
    }
    return tree


def write_config(path: Path, tree: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(tree, sort_keys=False), encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------------------------
# Running the CLIs


def cli_env(**extra: str) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    env.pop("NMT_DATA_MIRROR", None)
    env.update(extra)
    return env


def command(script: str, *args) -> list[str]:
    return [sys.executable, str(ROOT / script), *map(str, args)]


def run_cli(script: str, *args, timeout: float = RUN_TIMEOUT, stdin: bytes | None = None, env=None, **kwargs):
    """Runs a CLI to completion; stdout as bytes, stderr decoded."""
    try:
        done = subprocess.run(
            command(script, *args),
            input=stdin if stdin is not None else b"",
            capture_output=True,
            cwd=ROOT,
            env=env or cli_env(),
            timeout=timeout,
            **kwargs,
        )
    except subprocess.TimeoutExpired as err:
        raise AssertionError(
            f"hang: {script} {' '.join(map(str, args))} killed after {timeout:.0f} s"
        ) from err
    done.stderr = done.stderr.decode("utf-8", errors="replace")
    return done


class Background:
    """A CLI started in the background, stderr going to a file (so a chatty child never blocks on a full pipe)."""

    live: set[Background] = set()  # started and not yet waited for: killed at the end of the session
    closed = False  # set at the end of the session: no new process may start

    def __init__(self, script: str, *args, log_path: Path, env=None, **kwargs):
        assert not Background.closed, "the test session is over"
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            command(script, *args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            cwd=ROOT,
            env=env or cli_env(),
            **kwargs,
        )
        Background.live.add(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def stderr(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait(self, timeout: float = RUN_TIMEOUT, waiting_for: str = "to finish") -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"hang: {self.log_path.stem} process {self.pid} was killed after waiting {timeout:.0f} s for it "
                f"{waiting_for}:\n{self.stderr()[-2000:]}"
            ) from None
        finally:
            self._log.close()
            Background.live.discard(self)
        return code

    def kill(self) -> None:
        if self.running():
            self.proc.send_signal(signal.SIGKILL)
        self.wait()


def train_args(config: Path, run_dir: Path, *overrides: str) -> list[str]:
    args = ["--config", config, "--model-dir", run_dir]
    for override in overrides:
        args += ["--set", override]
    return args


def train(config: Path, run_dir: Path, *overrides: str, **kwargs):
    return run_cli("train.py", *train_args(config, run_dir, *overrides), **kwargs)


def start_train(config: Path, run_dir: Path, *overrides: str, log_path: Path, **kwargs) -> Background:
    return Background("train.py", *train_args(config, run_dir, *overrides), log_path=log_path, **kwargs)


# --------------------------------------------------------------------------------------------------------------
# Checkpoints


def latest_step(run_dir: Path) -> int:
    """The step of DIR/checkpoints' latest checkpoint from the `checkpoint` state file (0 if none), without TF."""
    state = Path(run_dir) / "checkpoints" / "checkpoint"
    try:
        text = state.read_text(encoding="utf-8")
    except (FileNotFoundError, UnicodeDecodeError):
        return 0
    match = re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', text, re.MULTILINE)
    return int(match.group(1)) if match else 0


def wait_for_checkpoint(run_dir: Path, at_least: int, proc: Background, timeout: float = RUN_TIMEOUT) -> int:
    """Polls until the latest checkpoint of DIR is at step >= at_least; returns that step."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        step = latest_step(run_dir)
        if step >= at_least:
            return step
        if not proc.running():
            raise AssertionError(
                f"train.py exited ({proc.proc.returncode}) before checkpoint {at_least}:\n{proc.stderr()[-3000:]}"
            )
        time.sleep(0.005)
    raise AssertionError(
        f"hang: train.py still running but no checkpoint >= {at_least} in {run_dir} after {timeout:.0f} s"
    )


def read_checkpoint(prefix: str, prefixes: tuple[str, ...] = ("model/",)) -> dict[str, np.ndarray]:
    """The tensors of a checkpoint whose keys start with one of `prefixes`."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(prefix)
    return {
        key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map() if key.startswith(prefixes)
    }


def final_weights(run_dir: Path) -> dict[str, np.ndarray]:
    """The model weights in DIR/final (what evaluate/translate/export use)."""
    import tensorflow as tf

    prefix = tf.train.latest_checkpoint(str(Path(run_dir) / "final"))
    assert prefix, f"no final weights in {run_dir}"
    return read_checkpoint(prefix)


# What a resumed run may legitimately record differently: training wall time, the number of saves (a signal stop
# saves once more), the object graph's bookkeeping. The data-iterator state is a variant tensor, which a checkpoint
# reader cannot return: `next_batches` compares it by what it yields.
NOT_TRAINING_STATE = ("elapsed/", "save_counter/", "_CHECKPOINTABLE_OBJECT_GRAPH")


def training_state(run_dir: Path) -> dict[str, np.ndarray]:
    """Every tensor of DIR's latest training checkpoint that later steps depend on.

    That is the model weights and the Adam moments and step (stored under `optimizer/`), the loss scale and its
    counters, the dropout RNG states (`rng_state/`) and the best-BLEU bookkeeping; only `NOT_TRAINING_STATE`
    and the iterator are left out.
    """
    import tensorflow as tf

    prefix = tf.train.latest_checkpoint(str(Path(run_dir) / "checkpoints"))
    assert prefix, f"no checkpoint in {run_dir}"
    reader = tf.train.load_checkpoint(prefix)
    return {
        key: reader.get_tensor(key)
        for key, dtype in reader.get_variable_to_dtype_map().items()
        if dtype != tf.variant and not key.startswith(NOT_TRAINING_STATE)
    }


def next_batches(run_dir: Path, count: int = 2) -> list[dict[str, np.ndarray]]:
    """The next `count` training batches a rerun on DIR would draw: a Trainer restored from its last checkpoint."""
    from nmt.run_dir import RunDir
    from nmt.trainer import Trainer

    run = RunDir(run_dir)
    trainer = Trainer(run.load_config(), run)
    trainer.setup()
    assert trainer.resumed_from == latest_step(run_dir)
    return [{key: value.numpy() for key, value in next(trainer.iterator).items()} for _ in range(count)]


def assert_bit_identical(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray], what: str) -> None:
    """Same keys, dtypes, shapes and values (np.array_equal: no tolerance)."""
    assert actual, f"{what}: no tensors compared"
    assert actual.keys() == expected.keys(), f"{what}: keys differ: {sorted(set(actual) ^ set(expected))}"
    differing = {
        key: float(np.max(np.abs(actual[key].astype(np.float64) - expected[key].astype(np.float64))))
        for key in actual
        if actual[key].dtype != expected[key].dtype or not np.array_equal(actual[key], expected[key])
    }
    assert not differing, (
        f"{what}: {len(differing)} of {len(actual)} tensors differ (largest absolute differences: "
        f"{sorted(differing.items(), key=lambda item: -item[1])[:5]})"
    )


def snapshot(path: Path) -> dict[str, tuple[int, int, str]]:
    """{relative path: (size, mtime_ns, sha256)} of every file under path: "was anything touched or added"."""
    path = Path(path)
    return {
        str(p.relative_to(path)): (
            p.stat().st_size,
            p.stat().st_mtime_ns,
            hashlib.sha256(p.read_bytes()).hexdigest(),
        )
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def snapshot_run(run_dir: Path) -> dict[str, tuple[int, int, str]]:
    """`snapshot` of a run directory but its lock file (a start that gets the lock writes its pid there)."""
    return {name: state for name, state in snapshot(run_dir).items() if name != "train.lock"}


def run_main(module, argv: list[str]) -> int:
    """Runs a CLI's `main` in this process through `nmt.cli.run` (same error handling); returns the exit code."""
    from nmt.cli import run

    with pytest.raises(SystemExit) as exit_info:
        run(lambda: module.main(argv))
    return int(exit_info.value.code or 0)


def run_make(target: str, *variables: str, tmp_path: Path, stdin: bytes | None = None, timeout: float = 300):
    """`make TARGET VAR=value...` in the repository as from a shell (stdout and stderr as bytes): this Python, and
    an install stamp newer than requirements.txt, so nothing is installed. Skips the test without make."""
    import shutil

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    stamp = tmp_path / "installed-stamp"
    stamp.touch()
    # under `make test`, a make inside make prints "Entering directory" on stdout (GNU make's -w in sub-makes)
    shell = {
        name: value for name, value in os.environ.items() if name not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")
    }
    return subprocess.run(
        ["make", target, f"PY={sys.executable}", f"STAMP={stamp}", *variables],
        cwd=ROOT, input=stdin, capture_output=True, timeout=timeout, env=shell,
    )  # fmt: skip
