"""Two local `train.py` workers (TF_CONFIG) and the data only the chief prepares (`StopControl.chief_first`): a
chief that cannot prepare it, or a worker that does not see what the chief prepared, stops both workers with a
message naming the problem. Before, the other worker waited 24 hours for files that never came (and the chief
waited with it in its first collective).

Marked slow (pairs of training processes); test_distribute.py's two-worker run and its restart from checkpoint 4
stay in `make test`.
"""

import contextlib
import fcntl

import pytest

from tests.nmt.multi_worker import Workers
from tests.nmt.test_distribute import config_file

pytestmark = pytest.mark.slow


def test_a_chief_that_cannot_prepare_the_data_stops_the_other_worker_too(tmp_path):
    config = config_file(tmp_path, "multi_worker")
    (tmp_path / "a-file").write_text("not a directory\n", encoding="utf-8")
    chief_cache = {0: (f"data.cache_dir={tmp_path / 'a-file'}",)}
    with Workers(config, tmp_path / "run", tmp_path / "logs", worker_overrides=chief_cache) as workers:
        (code, chief), (worker_code, worker) = workers.wait()
    assert code == 1, chief[-3000:]
    assert "train.py: data error: cannot write into the data cache" in chief
    assert worker_code == 1, worker[-3000:]
    assert "train.py: training failed: the chief worker could not prepare the data (see its log)" in worker
    assert "Traceback" not in chief + worker
    assert not (tmp_path / "run").exists()  # the chief's new run was undone


def test_a_worker_that_does_not_see_the_chiefs_data_cache_stops_both(tmp_path):
    config = config_file(tmp_path, "multi_worker")
    elsewhere = tmp_path / "not-shared"
    own_cache = {1: (f"data.cache_dir={elsewhere}",)}  # as on another host without a shared filesystem
    with Workers(config, tmp_path / "run", tmp_path / "logs", worker_overrides=own_cache) as workers:
        (code, chief), (worker_code, worker) = workers.wait()
    assert worker_code == 1, worker[-3000:]
    # the tokenizer is read from the chief's copy in the run directory; the first split is not found
    assert f"train.py: data error: split 'train' is not at {elsewhere}/" in worker
    assert "must be one directory shared by every worker" in worker
    assert code == 1, chief[-3000:]
    assert "train.py: training failed: worker 1 could not prepare the data after the chief did" in chief
    assert "Traceback" not in chief + worker
    assert not (tmp_path / "run").exists()


def tokenizer_lock(config, *overrides):
    """The cache lock the chief takes to train the tokenizer of `config` (held by a test: the chief waits there)."""
    from data import cache
    from data.stream import split_identity
    from nmt.config import load_config

    data = load_config(config, list(overrides)).data
    final = cache.tokenizer_dir(
        data, cache.tokenizer_key_inputs(data, split_identity(data, data.train_split))
    )
    final.parent.mkdir(parents=True, exist_ok=True)
    return final.with_name(final.name + ".lock")


def wait_until_preparing(workers) -> None:
    """Until the chief waits for the cache lock and worker 1 for the chief (a hang guard, not a timing)."""
    import time

    from tests.faults.helpers import RUN_TIMEOUT

    deadline = time.monotonic() + RUN_TIMEOUT
    while not (
        "another process is preparing" in workers.procs[0].stderr()
        and "waiting for the chief worker to prepare the data" in workers.procs[1].stderr()
    ):
        for proc in workers.procs:
            assert time.monotonic() < deadline and proc.running(), proc.stderr()[-3000:]
        time.sleep(0.05)


@contextlib.contextmanager
def chief_held_in_preparation(tmp_path):
    """Two workers with a shared cache, the chief held in its preparation (this process holds the tokenizer's cache
    lock) and worker 1 waiting for it: yields (workers, the lock's open file)."""
    config = config_file(tmp_path, "multi_worker")
    shared = f"data.cache_dir={tmp_path / 'cache'}"
    with open(tokenizer_lock(config, shared), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with Workers(config, tmp_path / "run", tmp_path / "logs", shared) as workers:
            wait_until_preparing(workers)
            yield workers, lock


def test_a_worker_waiting_for_the_chiefs_preparation_stops_on_sigint(tmp_path):
    """The chief held in its preparation (another process holds the tokenizer's cache lock): worker 1, waiting for
    it, stops on SIGINT at once (exit 130) instead of when the chief is done; the chief, once released, names it."""
    import signal

    with chief_held_in_preparation(tmp_path) as (workers, lock):
        workers.procs[1].signal(signal.SIGINT)
        worker_code = workers.procs[1].wait(waiting_for="worker 1 to stop on SIGINT, the chief still held")
        assert workers.procs[0].running()
        fcntl.flock(lock, fcntl.LOCK_UN)
        (code, chief), (_, worker) = workers.wait()
    assert worker_code == 130, worker[-3000:]
    assert "train.py: interrupted before training started" in worker
    assert code == 1, chief[-3000:]
    assert "train.py: training failed: lost contact with " in chief  # worker 1, when TensorFlow names it
    assert not (tmp_path / "run").exists()


def test_a_chief_killed_while_it_prepares_the_data_ends_the_other_workers_wait(tmp_path):
    """SIGKILL to the chief held in its preparation: worker 1 stops, naming it (TensorFlow's own watch does not see
    a dead chief there: it hosts the coordination service), and does not wait for ever."""
    import signal

    from tests.faults.helpers import RUN_TIMEOUT

    with chief_held_in_preparation(tmp_path) as (workers, lock):
        address = workers.addresses[0]
        workers.procs[0].signal(signal.SIGKILL)
        code = workers.procs[1].wait(RUN_TIMEOUT, waiting_for="worker 1 to see the chief gone")
        worker = workers.procs[1].stderr()
    assert code == 1, worker[-3000:]
    # TensorFlow's own error (the chief's connection reset) or the watch's (a host gone without a word)
    assert (
        f"lost contact with worker 0 ({address})" in worker
        or f"worker 0 ({address}) stopped answering" in worker
    )
    assert "Traceback" not in worker
