"""`tf.distribute` strategies from the config: none, mirrored, multi_worker, tpu.

Must run before TensorFlow initialises its devices (the first op), because `mirrored` on a machine without GPUs
splits the CPU into two logical devices so the same code path is exercised (and tested) without accelerators.

The workers of a multi-worker run take every decision together: they restore the same (the chief's) checkpoint
and refuse to start if they disagree on its step, and they stop after the same step (`StopControl`), combining
their signals and clocks through a small collective (`gather_from_workers`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal

log = logging.getLogger("nmt.train")  # the trainer's messages

CPU_REPLICAS = 2  # logical CPU devices used by `mirrored` when no GPU is present


def make_strategy(kind: str):
    """The `tf.distribute.Strategy` named by `train.distribute`."""
    import tensorflow as tf

    if kind == "none":
        return tf.distribute.get_strategy()
    if kind == "mirrored":
        if not tf.config.list_physical_devices("GPU"):
            cpus = tf.config.list_physical_devices("CPU")
            try:
                tf.config.set_logical_device_configuration(
                    cpus[0], [tf.config.LogicalDeviceConfiguration()] * CPU_REPLICAS
                )
            except RuntimeError:
                pass  # devices already initialised (e.g. a second trainer in one process): use what exists
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
            return tf.distribute.MirroredStrategy(devices=devices)
        return tf.distribute.MirroredStrategy()
    if kind == "multi_worker":
        if "TF_CONFIG" not in os.environ:
            raise ValueError("train.distribute: multi_worker needs the TF_CONFIG environment variable")
        return tf.distribute.MultiWorkerMirroredStrategy()
    if kind == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    raise ValueError(f"train.distribute: unknown strategy {kind!r}")


def is_chief() -> bool:
    """True on the one worker that writes the run directory (always true outside multi-worker training).

    Read from TF_CONFIG alone, so train.py can decide before any TensorFlow set-up whether this process takes
    the run-directory lock: the chief if the cluster has one, else worker 0.
    """
    if not os.environ.get("TF_CONFIG"):
        return True
    tf_config = json.loads(os.environ["TF_CONFIG"])
    task = tf_config.get("task", {})
    task_type, task_id = task.get("type"), int(task.get("index", 0))
    if task_type == "chief":
        return True
    return task_type == "worker" and task_id == 0 and "chief" not in tf_config.get("cluster", {})


def is_multi_worker(strategy) -> bool:
    """True for `MultiWorkerMirroredStrategy`: several processes that must take every decision together."""
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def gather_from_workers(strategy, values: list[float]):
    """Every replica's `values` (float64), as a NumPy array of shape [replicas, len(values)], on every worker.

    A collective: every worker must call it at the same point of the run, or the ones that did wait for the others.
    Rows follow the global replica order (worker 0's replicas first).
    """
    import tensorflow as tf

    return _gather_function(strategy)(tf.constant([values], tf.float64)).numpy()


@functools.cache
def _gather_function(strategy):
    """`gather_from_workers` as one compiled function per strategy (eager collectives are slow and chatty)."""
    import tensorflow as tf

    def rows(value):
        # This replica's values in its own row of a zero matrix: the SUM over replicas stacks them (exactly).
        context = tf.distribute.get_replica_context()
        row = tf.one_hot(context.replica_id_in_sync_group, context.num_replicas_in_sync, dtype=tf.float64)
        return row[:, None] * value

    @tf.function(reduce_retracing=True)
    def run(value):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(rows, args=(value,)), axis=None)

    return run


def worker_of_replica(strategy, replica: int) -> int:
    """The index of the worker that runs global replica `replica` (every worker has as many replicas)."""
    workers = max(int(getattr(strategy.extended, "_num_workers", 1)), 1)
    return replica // max(strategy.num_replicas_in_sync // workers, 1)


class WorkersDisagree(RuntimeError):
    """The workers of a multi-worker run would resume from different checkpoints."""


class StopControl:
    """When training stops before its step budget: SIGINT/SIGTERM and the time budget (`train.max_minutes`).

    A single process decides alone: the first signal stops it after the step in progress (a second one raises
    KeyboardInterrupt at once), and its own clock is its budget. The workers of a multi-worker run decide together
    (`agree`, a collective every worker runs before the first step and after each step): a signal that reached
    any worker, or a time budget spent on any worker's clock, stops all of them after the same step, and every
    worker keeps the largest of their training clocks.
    """

    def __init__(self, strategy):
        self.strategy = strategy
        self.multi_worker = is_multi_worker(strategy)
        self.received: int | None = None  # the signal this process received
        self.agreed: int | None = None  # multi-worker: the signal all workers stop for
        self.out_of_time = False  # multi-worker: a worker's time budget is spent

    def install(self) -> dict:
        """SIGINT/SIGTERM handlers; returns the previous ones (for `uninstall`)."""

        def handler(signum, frame):
            if self.received is not None:  # second signal: stop now, the last checkpoint is intact
                raise KeyboardInterrupt
            self.received = signum
            log.warning(
                "received %s: finishing this step and saving a checkpoint", signal.Signals(signum).name
            )

        return {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}

    @staticmethod
    def uninstall(previous: dict) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def requested(self) -> bool:
        """True once the run must stop for a signal (on every worker at the same step)."""
        return (self.agreed if self.multi_worker else self.received) is not None

    def time_left(self, time_up: bool) -> bool:
        """Whether the time budget allows another step, given this process' own `time_up`."""
        return not self.out_of_time if self.multi_worker else not time_up

    def agree(self, elapsed: float, time_up: bool, step: int) -> float:
        """Multi-worker: combines the signals and clocks of all workers; returns the training clock to keep."""
        if not self.multi_worker:
            return elapsed
        rows = gather_from_workers(self.strategy, [self.received or 0, elapsed, time_up])
        self.out_of_time = self.out_of_time or bool(rows[:, 2].max() > 0)
        if self.agreed is None and rows[:, 0].max() > 0:
            signalled = int(rows[:, 0].argmax())
            self.agreed = int(rows[signalled, 0])
            worker = worker_of_replica(self.strategy, signalled)
            name = signal.Signals(self.agreed).name
            log.warning("worker %d received %s: all workers stop after step %d", worker, name, step)
        return float(rows[:, 1].max())

    def signal_name(self) -> str:
        """The signal that stopped the run, as the final message names it."""
        if self.received is not None:
            return signal.Signals(self.received).name
        return f"{signal.Signals(self.agreed).name} (sent to another worker)"

    def check_same_step(self, step: int, where) -> None:
        """Multi-worker (a collective): raises WorkersDisagree unless every worker restored step `step`."""
        if not self.multi_worker:
            return
        steps = [int(row[0]) for row in gather_from_workers(self.strategy, [step])]
        if len(set(steps)) > 1:
            shown = ", ".join(
                f"worker {worker_of_replica(self.strategy, i)}: {s}" for i, s in enumerate(steps)
            )
            raise WorkersDisagree(
                f"the workers would resume from different steps ({shown}); every worker must see the chief's "
                f"checkpoints in {where}: give all of them the same --model-dir on storage they share"
            )
