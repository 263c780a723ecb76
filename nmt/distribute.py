"""`tf.distribute` strategies from the config: none, mirrored, multi_worker, tpu.

Must run before TensorFlow initialises its devices (the first op), because `mirrored` on a machine without GPUs
splits the CPU into two logical devices so the same code path is exercised (and tested) without accelerators.

The workers of a multi-worker run take every decision together: they restore the same (the chief's) checkpoint
and refuse to start if they disagree on its step, and they stop after the same step (`StopControl`), combining
their signals and clocks through a small collective (`nmt.collectives`). Every worker plans the same global
batches, reads only its replicas' part of each (`worker_part`) and hands each local replica its rows
(`replica_batches`). TF_CONFIG, the chief, and a cluster start-up that cannot hang: `nmt.cluster`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import signal

from common.config_tree import ConfigError
from nmt.cluster import ClusterError, chief_watch, multi_worker_strategy
from nmt.collectives import gather_from_workers, interruptibly

log = logging.getLogger("nmt.train")  # the trainer's messages

CPU_REPLICAS = 2  # logical CPU devices used by `mirrored` when no GPU is present


def make_strategy(kind: str, cluster_wait_minutes: float = 0.0):
    """The `tf.distribute.Strategy` named by `train.distribute`; `multi_worker` waits at most
    `cluster_wait_minutes` for the other tasks of TF_CONFIG's cluster (`nmt.cluster.wait_for_peers`; 0: no limit)."""
    import tensorflow as tf

    if kind == "none":
        return tf.distribute.get_strategy()
    if kind == "mirrored":
        # TensorFlow's MirroredStrategy parses TF_CONFIG itself (a malformed one: a JSONDecodeError) and would only
        # log that it ignores it: a TF_CONFIG left in the environment of another run must change nothing here
        with without_tf_config():
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
        return multi_worker_strategy(cluster_wait_minutes)  # nmt.cluster: bounded, interruptible start-up
    if kind == "tpu":
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        except ValueError as err:  # no TPU here (or none named)
            raise ConfigError(
                f"train.distribute: tpu, but no TPU was found ({str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__})"
            ) from err
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    raise ValueError(f"train.distribute: unknown strategy {kind!r}")


@contextlib.contextmanager
def without_tf_config():
    """TF_CONFIG hidden from the environment inside the block (TensorFlow reads it there), set again after it."""
    saved = os.environ.pop("TF_CONFIG", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["TF_CONFIG"] = saved


def is_multi_worker(strategy) -> bool:
    """True for `MultiWorkerMirroredStrategy`: several processes that must take every decision together."""
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def worker_part(strategy) -> tuple[int, int, int] | None:
    """This worker's share of every global batch, `(first replica, local replicas, replicas in sync)`, for the
    `part` argument of `data.pipeline.make_train_dataset`; None when this process runs every replica (single
    device, mirrored on one machine, a one-worker cluster). Global replica r's rows of a batch of n pairs are
    `[n * r // R, n * (r + 1) // R)`, so a worker's replicas (consecutive ids) read one contiguous range.
    """
    replicas = strategy.num_replicas_in_sync
    # a part's iterator needs tf.data's symbolic checkpoints (data.batching), which macOS does not have
    if replicas == 1 or platform.system() == "Darwin":
        return None
    ids = strategy.experimental_local_results(
        strategy.experimental_distribute_values_from_function(
            lambda context: context.replica_id_in_sync_group
        )
    )
    ids = sorted(int(replica) for replica in ids)
    if len(ids) == replicas:
        return None
    if ids != list(range(ids[0], ids[0] + len(ids))):
        raise ValueError(f"this worker's replicas are not consecutive: {ids}")
    log.info(
        "this worker reads only its part of every global batch: the rows of replicas %d-%d of %d",
        ids[0], ids[-1], replicas,
    )  # fmt: skip
    return ids[0], len(ids), replicas


def replica_rows(rows, replica: int, replicas: int, part: tuple[int, int, int] | None):
    """Rows `[start, end)` of global replica `replica` in a batch that is a global batch of `rows` pairs (`part`
    None) or its `part` (then the positions are within the part): `[n * r // R, n * (r + 1) // R)` of the global
    batch (`data.batching.part_rows`). Python ints or integer tensors."""
    from data.batching import part_rows

    start, end = part_rows(rows, replica, replica + 1, replicas)
    if part is None:
        return start, end
    offset = part_rows(rows, part[0], part[0] + 1, replicas)[0]  # the part starts at its first replica's rows
    return start - offset, end - offset


def replica_batches(strategy, batch: dict, part: tuple[int, int, int] | None):
    """One batch per local replica (`replica_rows`): `batch` is the global batch (`part` None), or this worker's
    `part` of it with a "batch_rows" entry, the global batch's pairs (`data.batching.bucketed_batches`)."""
    import tensorflow as tf

    replicas = strategy.num_replicas_in_sync
    if replicas == 1:
        return batch
    batch = dict(batch)
    whole = batch.pop("batch_rows", None)
    if (whole is None) != (part is None):
        raise ValueError("a part of a batch needs its batch_rows, and only a part has them")

    def replica_slice(context):
        rows = tf.shape(batch["source"])[0] if whole is None else tf.cast(whole, tf.int32)
        start, end = replica_rows(rows, context.replica_id_in_sync_group, replicas, part)
        return {key: value[start:end] for key, value in batch.items()}

    return strategy.experimental_distribute_values_from_function(replica_slice)


def worker_of_replica(strategy, replica: int) -> str:
    """The TF_CONFIG task that runs global replica `replica`, as messages name it: `worker 1`, or `chief 0` when
    the cluster has a chief task (then TensorFlow counts it first and `worker 0` second). Every worker has as many
    replicas: its `worker_devices`, the local devices under MultiWorkerMirroredStrategy."""
    from nmt.cluster import cluster_task

    worker = replica // max(len(strategy.extended.worker_devices), 1)
    if "chief" in cluster_task()[2]:
        return "chief 0" if worker == 0 else f"worker {worker - 1}"
    return f"worker {worker}"


# The policies a worker can train in (`nmt.precision.resolve_precision`), by index in check_same_config's collective.
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")


def raise_unless_same_precision(workers: list[str], indices: list[int]) -> None:
    """Raises WorkersDisagree naming each worker's policy (`PRECISIONS[index]`) unless they are all one."""
    if len(set(indices)) > 1:
        shown = ", ".join(
            dict.fromkeys(f"{w}: {PRECISIONS[i]}" for w, i in zip(workers, indices, strict=True))
        )
        raise WorkersDisagree(
            f"the workers would train in different precisions ({shown}): train.precision auto picks per machine "
            "(bfloat16 where the CPU has AVX512-BF16 or AMX); set train.precision to one policy for every worker"
        )


class WorkersDisagree(RuntimeError):
    """The workers of a multi-worker run cannot go on together: other configs, other checkpoints to resume from, or
    the data the chief prepares failed on one of them (`StopControl.chief_first`)."""


class EvaluationInterrupted(BaseException):
    """SIGINT/SIGTERM during an evaluation (`StopControl.interruptible`): the run stops without finishing it.

    A BaseException, like KeyboardInterrupt: no `except Exception` on the way may swallow it.
    """


class StopControl:
    """When training stops before its step budget: SIGINT/SIGTERM and the time budget (`train.max_minutes`).

    A single process decides alone: the first signal stops it after the step in progress (a second one raises
    KeyboardInterrupt at once), and its own clock is its budget. The workers of a multi-worker run decide together
    (`agree`, a collective every worker runs before the first step and after each step): a signal that reached
    any worker, or a time budget spent on any worker's clock, stops all of them after the same step, and every
    worker keeps the largest of their training clocks. There a repeated signal changes nothing (a worker that left
    at once would leave the others waiting in the next collective): only SIGKILL stops a worker at once.
    """

    def __init__(self, strategy):
        self.strategy = strategy
        self.multi_worker = is_multi_worker(strategy)
        self.received: int | None = None  # the signal this process received
        self.agreed: int | None = None  # multi-worker: the signal all workers stop for
        self.out_of_time = False  # multi-worker: a worker's time budget is spent
        self._in_evaluation = False  # inside `interruptible()`: a signal ends the evaluation at once
        self.step_in_progress: int | None = None  # set by the training loop: the step a signal interrupts

    def install(self) -> dict:
        """SIGINT/SIGTERM handlers; returns the previous ones (for `uninstall`)."""

        def handler(signum, frame):
            if self.received is not None and self.multi_worker:
                name = signal.Signals(signum).name
                log.warning("received %s again: every worker still stops after the step they agree on", name)
                return
            if self.received is not None:  # second signal: stop now, the last checkpoint is intact
                raise KeyboardInterrupt
            self.received = signum
            if self._in_evaluation:
                log.warning(
                    "received %s: stopping the evaluation in progress and saving a checkpoint",
                    signal.Signals(signum).name,
                )
                raise EvaluationInterrupted
            name, step = signal.Signals(signum).name, self.step_in_progress
            if step is None:
                log.warning("received %s: finishing this step and saving a checkpoint", name)
            else:
                log.warning("received %s during step %d: finishing it and saving a checkpoint", name, step)

        return {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}

    @contextlib.contextmanager
    def interruptible(self):
        """A block (an evaluation: decoding and scoring, no file writes) that a signal ends at once.

        Inside it, SIGINT/SIGTERM raise EvaluationInterrupted in the main thread (also on entry, for a signal
        received before) instead of waiting for the block to end. A single process only: the workers of a
        multi-worker run evaluate together, so there a signal still waits for the evaluation and the next step.
        """
        if self.multi_worker:
            yield
            return
        if self.received is not None:
            raise EvaluationInterrupted
        self._in_evaluation = True
        try:
            yield
        finally:
            self._in_evaluation = False

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
            log.warning("%s received %s: all workers stop after step %d", worker, name, step)
        return float(rows[:, 1].max())

    def signal_name(self) -> str:
        """The signal that stopped the run, as the final message names it."""
        if self.received is not None:
            return signal.Signals(self.received).name
        return f"{signal.Signals(self.agreed).name} (sent to another worker)"

    def check_same_config(
        self, fingerprint: int, wait_minutes: float = 0.0, precision: str = "float32"
    ) -> None:
        """Multi-worker (a collective): raises WorkersDisagree unless every worker's config has `fingerprint` and
        every worker trains in `precision` (the policy `train.precision` resolved to on its machine: `auto` picks
        per CPU, so a cluster of AMX and AVX2 hosts would train bfloat16 on some workers and float32 on others).

        Workers started with different settings (another seed: silently other training; another model: a
        TensorFlow error deep in a collective) are refused at the start instead. The run's first collective: a
        worker that stopped after the cluster formed but before joining it would leave the others waiting for
        ever, so it waits at most `wait_minutes` (0: no limit), then raises ClusterError.
        """
        if not self.multi_worker:
            return
        import tensorflow as tf

        values = [float(fingerprint), float(PRECISIONS.index(precision))]
        try:
            rows = gather_from_workers(self.strategy, values, timeout=wait_minutes * 60)
        except tf.errors.DeadlineExceededError:
            raise ClusterError(
                f"not every worker reached the start of training within {wait_minutes:g} min "
                "(train.cluster_wait_minutes): one stopped while starting (see its log). Restart every worker "
                "with the same command"
            ) from None
        prints = [int(row[0]) for row in rows]
        if len(set(prints)) > 1:
            shown = ", ".join(
                f"{worker_of_replica(self.strategy, i)}: {p:012x}" for i, p in enumerate(prints)
            )
            raise WorkersDisagree(
                f"the workers were started with different configs (fingerprints {shown}); start every worker "
                "with the same --config and --set values (only where the data is stored and train.cluster_wait_minutes "
                "may differ; train.max_minutes must match)"
            )
        raise_unless_same_precision(
            [worker_of_replica(self.strategy, i) for i in range(len(rows))], [int(row[1]) for row in rows]
        )

    def chief_first(self, chief: bool, work, what: str):
        """`work()`'s result: on a single process at once; on a multi-worker run first on the chief, then on the
        other workers once the chief's has succeeded (two collectives). `what` names the work in messages.

        The chief prepares the data while the others wait in a collective without a time limit (a large corpus
        takes as long as it takes), in Python (`interruptibly`: SIGINT/SIGTERM heard), watching the chief's port (a
        chief that dies ends the wait: TensorFlow's error, or `nmt.cluster.chief_watch`'s). A
        chief whose work failed raises its error and the others raise WorkersDisagree; then a worker whose own
        work failed (e.g. it does not see the chief's data) raises its error and the others WorkersDisagree
        naming it, so no worker is left waiting in a collective the others never join.
        """
        if not self.multi_worker:
            return work()

        def attempt():
            try:
                return work(), None
            except Exception as err:  # noqa: BLE001 - told to the other workers, then raised
                return None, err

        result, error = attempt() if chief else (None, None)
        if not chief:
            log.info("waiting for the chief worker to %s", what)
        watch = None if chief else chief_watch()
        gathered = interruptibly(lambda: gather_from_workers(self.strategy, [0.0 if error else 1.0]), watch)
        chief_done = gathered[:, 0]
        if error is not None:
            raise error
        if not chief_done.all():
            raise WorkersDisagree(f"the chief worker could not {what} (see its log)")
        if not chief:
            result, error = attempt()
        done = gather_from_workers(self.strategy, [0.0 if error else 1.0])[:, 0]
        if error is not None:
            raise error
        if not done.all():
            failed = dict.fromkeys(
                worker_of_replica(self.strategy, i) for i in range(len(done)) if not done[i]
            )
            raise WorkersDisagree(
                f"{' and '.join(failed)} could not {what} after the chief did (see its log)"
            )
        return result

    def check_same_step(self, step: int, where) -> None:
        """Multi-worker (a collective): raises WorkersDisagree unless every worker restored step `step`."""
        if not self.multi_worker:
            return
        steps = [int(row[0]) for row in gather_from_workers(self.strategy, [step])]
        if len(set(steps)) > 1:
            shown = ", ".join(f"{worker_of_replica(self.strategy, i)}: {s}" for i, s in enumerate(steps))
            raise WorkersDisagree(
                f"the workers would resume from different steps ({shown}); every worker must see the chief's "
                f"checkpoints in {where}: give all of them the same --model-dir on storage they share"
            )
