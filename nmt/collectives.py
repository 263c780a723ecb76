"""The small collectives a multi-worker run decides with: `gather_from_workers` (every replica's few numbers, on
every worker) and `interruptibly` (a collective waited on in a thread, so that signals are heard during it).

Used by `nmt.distribute.StopControl` and the trainer's evaluation; no strategy is made here (`nmt.distribute`).
"""

from __future__ import annotations

import functools
import threading


def gather_from_workers(strategy, values: list[float], timeout: float = 0.0):
    """Every replica's `values` (float64), as a NumPy array of shape [replicas, len(values)], on every worker.

    A collective: every worker must call it at the same point of the run, or the ones that did wait for the others
    (at most `timeout` seconds if given: then tf.errors.DeadlineExceededError). Rows follow the global replica
    order (worker 0's replicas first).
    """
    import tensorflow as tf

    return _gather_function(strategy, timeout)(tf.constant([values], tf.float64)).numpy()


@functools.cache
def _gather_function(strategy, timeout: float):
    """`gather_from_workers` as one compiled function per strategy (eager collectives are slow and chatty)."""
    import tensorflow as tf

    def rows(value):
        # This replica's values in its own row of a zero matrix: the SUM over replicas stacks them (exactly).
        context = tf.distribute.get_replica_context()
        row = tf.one_hot(context.replica_id_in_sync_group, context.num_replicas_in_sync, dtype=tf.float64)
        return row[:, None] * value

    def gathered(value):
        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout)
        return tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, rows(value), options
        )

    @tf.function(reduce_retracing=True)
    def run(value):
        if timeout:
            return strategy.experimental_local_results(strategy.run(gathered, args=(value,)))[0]
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(rows, args=(value,)), axis=None)

    return run


def interruptibly(function, check=None):
    """`function()` (a collective), run in a thread while this one waits in Python: signal handlers (which run in
    the main thread, between Python instructions) are heard during it. A handler's exception (KeyboardInterrupt), or
    one `check()` raises (called while waiting), ends the wait: this process's collectives are aborted so that the
    thread leaves TensorFlow before the interpreter's exit (a thread still inside it then aborts the process:
    "FATAL: exception not rethrown"). For a wait before `StopControl.install` (its handlers only record a signal)."""
    outcome = {}

    def run():
        try:
            outcome["value"] = function()
        except BaseException as err:  # noqa: BLE001 - raised again in the waiting thread
            outcome["error"] = err

    thread = threading.Thread(target=run, name="nmt-interruptible", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.2)
            if check is not None and thread.is_alive():
                check()
    except BaseException:
        if thread.is_alive():
            from tensorflow.python.eager import context  # no public API aborts pending collectives

            context.context().abort_collective_ops(14, "this worker stopped waiting")  # 14: UNAVAILABLE
            thread.join(30.0)
        raise

    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
