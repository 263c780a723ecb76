"""Shared pieces of the fault-injection tests: a tiny training config, CLI runners, the training scenarios.

Every training run here is tiny: a 200-pair templated `dataset: folder` corpus (tests/run_fixture.write_corpus), a
1+1-layer d_model-16 model with dropout 0.1, one length bucket (one compiled batch shape) and 60 steps, so a
`train.py` process costs little more than importing TensorFlow and tracing the step. Still, a process is ~20 s of
CPU, so the scenarios that need whole training processes start together in the background at the first fault test
and are shared: `reference_run` (the uninterrupted run, which also hosts the concurrent-training attempt),
`interrupted_run` (one directory SIGKILLed, SIGTERMed and SIGINTed, then finished) and `full_disk_run`. The tests
that only read their results run last (`pytest_collection_modifyitems`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.run_fixture import shared_tiny_run_dir, tiny_config_tree, write_corpus

ROOT = Path(__file__).resolve().parents[2]
MAX_STEPS = 60  # optimizer steps of every fault run (tens of milliseconds each once compiled)
CHECKPOINT_EVERY = 5
RUN_TIMEOUT = 300  # seconds; generous: the CPU is shared with other jobs


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
        "log_every": 1000,
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


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("fault_corpus"))


@pytest.fixture(scope="session")
def fault_config(corpus, tmp_path_factory) -> Path:
    """The YAML file of the tiny training config (shared, read-only)."""
    return write_config(tmp_path_factory.mktemp("fault_config") / "tiny.yaml", fault_tree(corpus))


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
    done = subprocess.run(
        command(script, *args),
        input=stdin if stdin is not None else b"",
        capture_output=True,
        cwd=ROOT,
        env=env or cli_env(),
        timeout=timeout,
        **kwargs,
    )
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

    def wait(self, timeout: float = RUN_TIMEOUT) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
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
    raise AssertionError(f"no checkpoint >= {at_least} in {run_dir} after {timeout}s")


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


def training_state(run_dir: Path) -> dict[str, np.ndarray]:
    """Model weights, Adam moments and step of the latest training checkpoint (timings and counters excluded)."""
    import tensorflow as tf

    prefix = tf.train.latest_checkpoint(str(Path(run_dir) / "checkpoints"))
    assert prefix, f"no checkpoint in {run_dir}"
    return read_checkpoint(prefix, ("optimizer/",))


def max_abs_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    assert a, "no tensors compared"
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)))) for k in a)


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


# --------------------------------------------------------------------------------------------------------------
# The training scenarios, run in the background from the start of the session
#
# Each costs one or more whole training processes, so they start together (in background threads) as soon as the
# first fault test runs, and the tests that only need their results are ordered last (see
# `pytest_collection_modifyitems`): the CPU-bound processes overlap with each other and with the in-process tests.


class InBackground:
    """Runs `work()` in a thread started at once; `result()` waits and returns its value or raises its error."""

    def __init__(self, work):
        self._value, self._error = None, None
        self._thread = threading.Thread(target=self._run, args=(work,), daemon=True)
        self._thread.start()

    def _run(self, work) -> None:
        try:
            self._value = work()
        except BaseException as err:  # re-raised in every test that asks for the result
            self._error = err

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


@dataclasses.dataclass
class SecondRun:
    """What happened when a second train.py was started on the reference run directory during its training."""

    returncode: int
    stderr: str
    seconds: float
    first_pid: int
    before: dict  # snapshot of the run directory before the attempt...
    after: dict  # ...and after it
    imported: set[str]  # every module the refused process imported


class ReferenceRun:
    """train.py on `fault_config` from scratch to MAX_STEPS, the uninterrupted result the kill/stop tests match.

    While it trains (once its first checkpoint exists), it is SIGSTOPped, a second train.py is run on the same
    directory (test_concurrent_runs.py: a stopped process still holds its lock, so the attempt provably overlaps
    the first training however fast it is), then it is SIGCONTinued. A second process refused before it writes
    anything cannot change the run; hosting the attempt here saves a whole training process (CPU budget).
    """

    def __init__(self, config: Path, base: Path):
        self.config, self.run_dir, self.log_path = config, base / "run", base / "train.log"
        self.proc: Background | None = None
        self.second: SecondRun | None = None
        self._job = InBackground(self._run)

    def _run(self) -> Path:
        self.proc = start_train(self.config, self.run_dir, log_path=self.log_path)
        try:
            wait_for_checkpoint(self.run_dir, 1, self.proc)
            self.proc.signal(signal.SIGSTOP)
            try:
                before = snapshot(self.run_dir)
                started = time.monotonic()
                done = subprocess.run(  # -X importtime: which modules the refused process loaded
                    [
                        sys.executable,
                        "-X",
                        "importtime",
                        *command("train.py", *train_args(self.config, self.run_dir))[1:],
                    ],
                    capture_output=True,
                    cwd=ROOT,
                    env=cli_env(),
                    timeout=120,
                )
                seconds = time.monotonic() - started
                after = snapshot(self.run_dir)
            finally:
                self.proc.signal(signal.SIGCONT)
            lines = done.stderr.decode("utf-8", errors="replace").splitlines()
            imported = {line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")}
            messages = "\n".join(line for line in lines if not line.startswith("import time:"))
            self.second = SecondRun(
                done.returncode, messages, seconds, self.proc.pid, before, after, imported
            )
        finally:
            code = self.proc.wait()
        assert code == 0, self.proc.stderr()[-3000:]
        return self.run_dir

    def result(self) -> Path:
        """Waits for the run; returns its directory (it finished normally)."""
        return self._job.result()

    def stderr(self) -> str:
        return self.proc.stderr()


@pytest.fixture(scope="session")
def reference_run(fault_config, tmp_path_factory) -> ReferenceRun:
    return ReferenceRun(fault_config, tmp_path_factory.mktemp("reference"))


@pytest.fixture
def reference_copy(reference_run, tmp_path) -> Path:
    """A private copy of the finished reference run directory (free to damage)."""
    target = tmp_path / "run"
    shutil.copytree(reference_run.result(), target)
    return target


@dataclasses.dataclass
class Stage:
    """One train.py process of the interrupted chain."""

    name: str  # "SIGKILL", "SIGTERM", "SIGINT" or "finish"
    returncode: int
    stderr: str
    step: int  # latest checkpoint step once the process has exited
    waited_for: int = 0  # the checkpoint step the signal waited for
    stopped_seconds: float = 0.0  # from the signal to the final "stopped ... checkpoint saved" message
    exit_seconds: float = 0.0  # from the signal to the process' exit (+ Python/TensorFlow teardown)


def interrupt(config: Path, run_dir: Path, signum: int, rng, log_path: Path) -> Stage:
    """Starts train.py and sends `signum` at a random step after this process' first new checkpoint."""
    before = latest_step(run_dir)
    first_new = (before // CHECKPOINT_EVERY + 1) * CHECKPOINT_EVERY
    target = first_new + CHECKPOINT_EVERY * rng.randrange(2)
    assert target <= MAX_STEPS - 3 * CHECKPOINT_EVERY, "MAX_STEPS too small for the chain"
    proc = start_train(config, run_dir, log_path=log_path)
    wait_for_checkpoint(run_dir, target, proc)
    time.sleep(rng.uniform(0.0, 0.15))  # a few more steps: the signal lands at a random step
    assert proc.running(), f"train.py finished before {signal.Signals(signum).name}:\n{proc.stderr()[-2000:]}"
    sent, stopped_seconds = time.monotonic(), None
    proc.signal(signum)
    while (
        proc.running() and time.monotonic() - sent < 120
    ):  # when does it say "stopped ... checkpoint saved"?
        if stopped_seconds is None and "train.py: stopped by" in proc.stderr():
            stopped_seconds = time.monotonic() - sent
        time.sleep(0.02)
    code = proc.wait(timeout=10)
    return Stage(
        signal.Signals(signum).name,
        code,
        proc.stderr(),
        latest_step(run_dir),
        waited_for=target,
        stopped_seconds=stopped_seconds if stopped_seconds is not None else time.monotonic() - sent,
        exit_seconds=time.monotonic() - sent,
    )


def interrupted_chain(config: Path, base: Path) -> tuple[Path, dict[str, Stage]]:
    """The same command four times on one run directory: SIGKILLed, resumed and SIGTERMed, resumed and
    SIGINTed (each at a random step, seeded), then resumed to the end. Returns (run dir, {stage name: Stage})."""
    import random

    run_dir, rng, stages = base / "run", random.Random(7), {}
    for signum in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
        stage = interrupt(config, run_dir, signum, rng, base / f"{signal.Signals(signum).name}.log")
        stages[stage.name] = stage
    proc = start_train(
        config, run_dir, log_path=base / "finish.log"
    )  # tracked: killed if the session ends first
    code = proc.wait()
    stages["finish"] = Stage("finish", code, proc.stderr(), latest_step(run_dir))
    return run_dir, stages


@pytest.fixture(scope="session")
def interrupted_run(fault_config, tmp_path_factory) -> InBackground:
    """The kill and graceful-stop chain (`interrupted_chain`), shared by both test modules (CPU budget)."""
    base = tmp_path_factory.mktemp("interrupted")
    return InBackground(lambda: interrupted_chain(fault_config, base))


FILE_LIMIT = 32 * 1024  # bytes per file once the "disk is full" (a checkpoint .data file is ~100 KB here)


def ignore_sigxfsz() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def disk_full_run(config: Path, base: Path) -> tuple[Path, str, int]:
    """train.py whose file-size limit drops below a checkpoint's size after its first checkpoint (test_disk_full)."""
    run_dir = base / "run"
    proc = start_train(config, run_dir, log_path=base / "train.log", preexec_fn=ignore_sigxfsz)
    wait_for_checkpoint(run_dir, 1, proc)
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
    code = proc.wait()
    return run_dir, proc.stderr(), code


@pytest.fixture(scope="session")
def full_disk_run(fault_config, tmp_path_factory) -> InBackground:
    base = tmp_path_factory.mktemp("disk_full")
    return InBackground(lambda: disk_full_run(fault_config, base))


BACKGROUND = ("reference_run", "interrupted_run", "full_disk_run")


def _is_fault_test(item) -> bool:
    return Path(__file__).parent in Path(str(item.fspath)).parents


def _waits_for_background(item) -> bool:
    return any(name in BACKGROUND for name in getattr(item, "fixturenames", ()))


def pytest_collection_modifyitems(session, config, items):
    """Fault tests that only wait for a background scenario go after the others (only fault tests move)."""
    positions = [i for i, item in enumerate(items) if _is_fault_test(item)]
    faults = [items[i] for i in positions]
    ordered = [t for t in faults if not _waits_for_background(t)] + [
        t for t in faults if _waits_for_background(t)
    ]
    for position, item in zip(positions, ordered):
        items[position] = item


@pytest.fixture(scope="session", autouse=True)
def _background_scenarios(request):
    """Starts, at the first fault test, every background scenario a selected fault test needs; at the end of the
    session, kills whatever training process of ours is still running."""
    wanted = set()
    for item in request.session.items:
        if _is_fault_test(item):
            wanted.update(name for name in getattr(item, "fixturenames", ()) if name in BACKGROUND)
    for name in BACKGROUND:
        if name in wanted:
            request.getfixturevalue(name)
    yield
    Background.closed = True
    for proc in list(Background.live):
        proc.signal(signal.SIGCONT)
        proc.kill()


# --------------------------------------------------------------------------------------------------------------
# A tiny trained run directory for translate/evaluate (tests/run_fixture; cached across sessions)


@pytest.fixture(scope="session")
def tiny_run_dir(tmp_path_factory, request) -> Path:
    return shared_tiny_run_dir(tmp_path_factory, request.config.cache)


@pytest.fixture
def restore_logging():
    """The CLIs' `setup_logging` replaces the root handlers: put pytest's back after an in-process CLI call."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def run_main(module, argv: list[str]) -> int:
    """Runs a CLI's `main` in this process through `nmt.cli.run` (same error handling); returns the exit code."""
    from nmt.cli import run

    with pytest.raises(SystemExit) as exit_info:
        run(lambda: module.main(argv))
    return int(exit_info.value.code or 0)
