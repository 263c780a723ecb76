"""Shared pieces of the fault-injection tests: a tiny training config, CLI runners, the training scenarios.

Every training run here is tiny: a 200-pair templated `dataset: folder` corpus (tests/run_fixture.write_corpus), a
1+1-layer d_model-16 model with dropout 0.1, one length bucket (one compiled batch shape) and 60 steps, so a
`train.py` process costs little more than importing TensorFlow and tracing the step. Still, a process is ~20 s of
CPU, so the scenarios that need whole training processes start together in the background at the first fault test
and are shared: `reference_run` (the uninterrupted run, which also hosts the concurrent-training attempt),
`interrupted_run` (one directory SIGKILLed, SIGTERMed and SIGINTed, then finished) and `full_disk_run`. The tests
that only read their results run last (`pytest_collection_modifyitems`).

The config, CLI runners and checkpoint readers they use are in tests/faults/helpers.py. No test here asserts how
long anything takes; deadlines only turn a hang into a failure.
"""

from __future__ import annotations

import dataclasses
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.faults.helpers import (
    CHECKPOINT_EVERY,
    MAX_STEPS,
    ROOT,
    RUN_TIMEOUT,
    Background,
    cli_env,
    command,
    fault_tree,
    latest_step,
    snapshot,
    start_train,
    train_args,
    wait_for_checkpoint,
    write_config,
)
from tests.run_fixture import write_corpus


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("fault_corpus"))


@pytest.fixture(scope="session")
def fault_config(corpus, tmp_path_factory) -> Path:
    """The YAML file of the tiny training config (shared, read-only)."""
    return write_config(tmp_path_factory.mktemp("fault_config") / "tiny.yaml", fault_tree(corpus))


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
                try:
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
                        timeout=RUN_TIMEOUT,
                    )
                except subprocess.TimeoutExpired as err:
                    raise AssertionError(
                        f"hang: a second train.py on {self.run_dir} had not exited after {RUN_TIMEOUT} s "
                        "(waiting for the lock instead of refusing?)"
                    ) from err
                after = snapshot(self.run_dir)
            finally:
                self.proc.signal(signal.SIGCONT)
            lines = done.stderr.decode("utf-8", errors="replace").splitlines()
            imported = {line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")}
            messages = "\n".join(line for line in lines if not line.startswith("import time:"))
            self.second = SecondRun(done.returncode, messages, self.proc.pid, before, after, imported)
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
    pid: int  # names the process' TensorBoard event files (events.out.tfevents.<time>.<host>.<pid>...)
    waited_for: int = 0  # the checkpoint step the signal waited for


def interrupt(config: Path, run_dir: Path, signum: int, rng, log_path: Path) -> Stage:
    """Starts train.py and sends `signum` at a random step after this process' first new checkpoint."""
    before = latest_step(run_dir)
    first_new = (before // CHECKPOINT_EVERY + 1) * CHECKPOINT_EVERY
    target = first_new + CHECKPOINT_EVERY * rng.randrange(2)
    assert target <= MAX_STEPS - 3 * CHECKPOINT_EVERY, "MAX_STEPS too small for the chain"
    proc = start_train(config, run_dir, log_path=log_path)
    wait_for_checkpoint(run_dir, target, proc)
    time.sleep(rng.uniform(0.0, 0.15))  # a few more steps: the signal lands at a random step
    name = signal.Signals(signum).name
    assert proc.running(), f"train.py finished before {name}:\n{proc.stderr()[-2000:]}"
    proc.signal(signum)
    code = proc.wait(waiting_for=f"to exit after {name}")
    return Stage(name, code, proc.stderr(), latest_step(run_dir), proc.pid, waited_for=target)


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
    stages["finish"] = Stage("finish", code, proc.stderr(), latest_step(run_dir), proc.pid)
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
    # No per-step TensorBoard events here: only the checkpoint write may reach the file-size limit.
    proc = start_train(
        config, run_dir, "train.log_every=1000", log_path=base / "train.log", preexec_fn=ignore_sigxfsz
    )
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
