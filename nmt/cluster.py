"""The cluster of a multi-worker run: TF_CONFIG read and checked, which process is the chief, bringing the cluster
up without hanging, and what to say when it breaks.

TensorFlow's own start-up of a `MultiWorkerMirroredStrategy` waits for every task inside one C++ call that holds
Python's GIL: a process whose peers never start waits there for an hour, deaf to SIGINT/SIGTERM (only SIGKILL ends
it, and a new run's start is then not undone). So the workers first meet in Python (`wait_for_peers`): each one
listens on its own TF_CONFIG port and waits until it can reach every other task's port, interruptible, with a
bounded wait and a message that names the tasks that never answered. Only then does TensorFlow take the port.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import signal
import socket
import threading
import time

from common.config_tree import ConfigError

log = logging.getLogger("nmt.train")  # the trainer's messages

COORDINATED = ("chief", "worker")  # the task types MultiWorkerMirroredStrategy trains with
LOOPBACK = {
    "localhost": "127.0.0.1",
    "::1": "127.0.0.1",
    "ip6-localhost": "127.0.0.1",
}  # one host, many names
POLL_SECONDS = 0.25  # between two attempts to reach the tasks still missing
REPORT_SECONDS = 60.0  # between two "still waiting" lines


class ClusterError(RuntimeError):
    """The cluster of a multi-worker run could not form, or lost a task: the message says what to do."""


def cluster_task(environ=os.environ) -> tuple[str, int, dict]:
    """(task type, task index, cluster) of TF_CONFIG, for a multi-worker run; ConfigError naming what is wrong.

    Checked before TensorFlow sees it: TensorFlow's own errors for a malformed TF_CONFIG are tracebacks.
    """
    text = environ.get("TF_CONFIG")
    if not text:
        raise ConfigError(
            "train.distribute: multi_worker needs the TF_CONFIG environment variable (the cluster's workers and "
            'this process\'s task, e.g. {"cluster": {"worker": ["host1:port", "host2:port"]}, '
            '"task": {"type": "worker", "index": 0}})'
        )
    try:
        tf_config = json.loads(text)
    except ValueError as err:
        raise ConfigError(f"TF_CONFIG is not valid JSON ({err}): {text[:200]!r}") from None
    cluster = tf_config.get("cluster") if isinstance(tf_config, dict) else None
    task = tf_config.get("task") if isinstance(tf_config, dict) else None
    if not isinstance(cluster, dict) or not cluster:
        raise ConfigError('TF_CONFIG has no "cluster" (a mapping of task types to lists of host:port)')
    if not isinstance(task, dict) or "type" not in task:
        raise ConfigError('TF_CONFIG has no "task" with a "type" (and an "index") for this process')
    task_type, index = task["type"], task.get("index", 0)
    others = [kind for kind in (*cluster, task_type) if kind not in COORDINATED]
    if others:
        raise ConfigError(
            f"TF_CONFIG has a task of type {others[0]!r}: train.distribute: multi_worker trains with chief and worker tasks "
            "only (MultiWorkerMirroredStrategy; no parameter servers or evaluators)"
        )
    for (
        kind,
        addresses,
    ) in cluster.items():  # TensorFlow reads TF_CONFIG too: an empty "chief" list crashed it
        if not isinstance(addresses, list) or not addresses:
            raise ConfigError(
                f"TF_CONFIG's cluster {kind!r} must be a non-empty list of host:port strings, got {addresses!r}"
                + (": remove the entry" if addresses in ([], {}, "", None) else "")
            )
    if task_type not in cluster:
        raise ConfigError(
            f"TF_CONFIG's task type {task_type!r} is not in its cluster (task types: {', '.join(map(str, cluster))})"
        )
    if isinstance(index, bool) or not isinstance(index, int):
        raise ConfigError(f"TF_CONFIG's task index must be an integer, got {index!r}")
    if not 0 <= index < len(cluster[task_type]):
        raise ConfigError(
            f"TF_CONFIG's task index {index!r} is not one of the cluster's {len(cluster[task_type])} "
            f"{task_type!r} task(s) (0 to {len(cluster[task_type]) - 1})"
        )
    if len(cluster.get("chief") or []) > 1:
        raise ConfigError(f"TF_CONFIG's cluster has {len(cluster['chief'])} chief tasks: at most one")
    seen = {}
    for kind in COORDINATED:
        for number, address in enumerate(cluster.get(kind) or []):
            host, port = split_address(address)  # ConfigError unless host:port
            key = (LOOPBACK.get(host.lower(), host.lower()), port)
            if key in seen:
                raise ConfigError(
                    f"TF_CONFIG's {kind} {number} ({address}) has the address of {seen[key]}: every task needs "
                    "its own host:port"
                )
            seen[key] = f"{kind} {number} ({address})"
    return task_type, index, cluster


def split_address(address) -> tuple[str, int]:
    """(host, port) of a TF_CONFIG address `host:port` (`[v6 address]:port` too); ConfigError if it is not one."""
    host, sep, port = str(address).rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    # ASCII digits only: str.isdigit() also accepts "²", which int() refuses
    digits = port.isascii() and port.isdigit()
    if not isinstance(address, str) or not sep or not host or not digits or not 0 < int(port) < 65536:
        raise ConfigError(
            f"TF_CONFIG's cluster address {address!r} is not host:port (a port from 1 to 65535)"
        )
    if ":" in host and not bracketed:
        raise ConfigError(
            f"TF_CONFIG's cluster address {address!r} is an IPv6 address without brackets: write it "
            "[ADDRESS]:PORT (e.g. [fe80::1]:2222)"
        )
    return host, int(port)


def is_chief(distribute: str) -> bool:
    """True on the one process that writes the run directory: every process but a multi-worker run's others.

    For `train.distribute: multi_worker`, read from TF_CONFIG alone (`cluster_task`), so train.py can decide
    before any TensorFlow set-up whether this process takes the run-directory lock: the chief if the cluster has
    one, else worker 0. Any other strategy ignores TF_CONFIG: a TF_CONFIG left in the environment of a
    single-process run must not make it a worker that writes nothing.
    """
    if distribute != "multi_worker":
        return True
    task_type, index, cluster = cluster_task()
    if task_type == "chief":
        return True
    return task_type == "worker" and index == 0 and "chief" not in cluster


def chief_watch(every: float = 5.0, clock=time.monotonic):
    """A check for the others' long waits on the chief (`nmt.collectives.interruptibly`): raises ClusterError once
    the chief's TF_CONFIG port stops answering (its process gone: killed, or stopped by a signal before joining the
    wait), looking at most every `every` seconds. TensorFlow's own watch over the cluster does not see a dead chief
    in a pending collective: the chief hosts the coordination service its heartbeats go to."""
    _, _, cluster = cluster_task()
    kind = "chief" if "chief" in cluster else "worker"
    address = split_address(cluster[kind][0])
    last = [clock()]

    def check() -> None:
        if clock() - last[0] < every:
            return
        last[0] = clock()
        if (why := reach(address)) is not None:
            raise ClusterError(
                f"{task_name(kind, 0, cluster)} stopped answering ({why}) while this worker waited for it: see its "
                "log. Restart every worker with the same command"
            )

    return check


def multi_worker_strategy(minutes: float):
    """TF_CONFIG's `MultiWorkerMirroredStrategy`, once every task of the cluster has started: each wait bounded by
    `minutes` (0: no limit), interruptible until the others have answered (`wait_for_peers`), then in TensorFlow
    (`bound_tensorflow_start`); ClusterError naming the tasks that did not come."""
    import tensorflow as tf

    task_type, index, cluster = cluster_task()  # ConfigError for a missing or malformed TF_CONFIG
    wait_for_peers(cluster, task_type, index, minutes)
    bound_tensorflow_start(cluster, minutes)
    handlers = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        # TensorFlow's coordination service replaces the C-level SIGTERM handler while Python still lists its own:
        # set them again, or SIGTERM would go unheard until training installs its handlers (data preparation,
        # the restore). Only the main thread may (in another, the handlers stay as TensorFlow left them).
        if threading.current_thread() is threading.main_thread():
            for number, handler in handlers.items():
                if handler is not None:
                    signal.signal(number, handler)
        return strategy
    except tf.errors.AlreadyExistsError as err:  # seen with two TF_CONFIGs describing the cluster differently
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ClusterError(
            f"TensorFlow refused this task's registration ({first}): the tasks' TF_CONFIG clusters may differ, or a "
            "task was restarted while the others were still starting. Give every task the same TF_CONFIG cluster "
            "and restart all of them"
        ) from None
    except tf.errors.DeadlineExceededError as err:
        text = str(err)
        listed = text.partition("timed out task names:")[2].strip().split("\n\n", 1)[0]  # one per line
        late = tasks_named(listed, cluster)
        raise ClusterError(
            f"the cluster did not form within {minutes:g} min (train.cluster_wait_minutes): "
            f"{' and '.join(late) or 'a task'} did not register with TensorFlow (stopped while starting?). "
            "Restart every worker with the same command"
        ) from None


def tasks_named(text: str, cluster: dict | None) -> list[str]:
    """The tasks TensorFlow names in `text` (`/job:worker/replica:0/task:1`), as `task_name` gives them."""
    return [task_name(kind, int(index), cluster) for kind, index in dict.fromkeys(_TASK_NAME.findall(text))]


def task_name(kind: str, index: int, cluster: dict | None) -> str:
    """`worker 1 (host:port)`: a task as the messages name it (without the address if TF_CONFIG has none)."""
    addresses = (cluster or {}).get(kind) or []
    return f"{kind} {index}" + (f" ({addresses[index]})" if index < len(addresses) else "")


def wait_for_peers(cluster: dict, task_type: str, index: int, minutes: float, clock=time.monotonic) -> None:
    """Returns once every other chief/worker task of `cluster` has answered on its port; raises ClusterError if
    this task's own port is taken or some task does not answer within `minutes` (0: wait as long as it takes).

    Listens on this task's own port meanwhile (on every interface, like TensorFlow's server), so the others find
    it; closes it before returning, for TensorFlow to take. A task that passed answers on TensorFlow's port. Plain
    Python all along: SIGINT/SIGTERM interrupt the wait (KeyboardInterrupt), the port is closed on the way out.
    """
    peers = {
        task_name(kind, i, cluster): split_address(address)
        for kind in COORDINATED
        for i, address in enumerate(cluster.get(kind) or [])
        if (kind, i) != (task_type, index)
    }
    if not peers:
        return
    own = cluster[task_type][index]
    listener = listen(split_address(own)[1], own)
    try:
        missing = dict(peers)
        errors: dict[str, str] = {}
        start = last_report = clock()
        log.info(
            "%s %d (%s): waiting for %s to start (the same command with its own TF_CONFIG)%s",
            task_type, index, own, ", ".join(missing),
            f"; giving up after {minutes:g} min (train.cluster_wait_minutes)" if minutes else "",
        )  # fmt: skip
        while True:
            for name, address in list(missing.items()):
                error = reach(address)
                if error is None:
                    del missing[name]
                else:
                    errors[name] = error
            drain(listener)
            if not missing:
                log.info("every task of the cluster has started")
                return
            now = clock()
            if minutes and now - start >= minutes * 60:
                names = "; ".join(f"{name}: {errors[name]}" for name in missing)
                raise ClusterError(
                    f"the cluster did not form within {minutes:g} min (train.cluster_wait_minutes): no answer from "
                    f"{names}. Start every task of TF_CONFIG's cluster with the same command (or raise the wait)"
                )
            if now - last_report >= REPORT_SECONDS:
                log.info("still waiting for %s (%.0f s so far)", ", ".join(missing), now - start)
                last_report = now
            time.sleep(POLL_SECONDS)
    finally:
        listener.close()


def bound_tensorflow_start(cluster: dict, minutes: float) -> None:
    """Makes TensorFlow's own wait for the cluster end after `minutes` (0: TensorFlow's default, no limit set)
    with tf.errors.DeadlineExceededError instead of waiting an hour: the configuration
    MultiWorkerMirroredStrategy would make itself, plus a registration barrier with that timeout.

    For the narrow window `wait_for_peers` leaves (a task that stopped between meeting the others and registering
    with TensorFlow). Call before the strategy is built; a TensorFlow without the (private) setting keeps its own.
    """
    if not minutes:
        return
    try:  # private modules: a TensorFlow that moved them keeps its own configuration (and its own wait)
        from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
        from tensorflow.python.distribute import multi_worker_util
        from tensorflow.python.eager import context
    except ImportError:
        log.warning("this TensorFlow's start-up wait for the cluster cannot be bounded: it keeps its own")
        return

    jobs = [
        coordination_config_pb2.CoordinatedJob(name=kind, num_tasks=len(cluster[kind]))
        for kind in COORDINATED
        if cluster.get(kind)
    ]
    ctx = context.context()
    ctx.configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(cluster),
        coordinated_jobs=jobs,
        cluster_register_timeout_in_ms=int(minutes * 60_000),
    )
    config = getattr(ctx, "_coordination_service_config", None)
    if config is not None and hasattr(config, "cluster_register_with_barrier"):
        config.cluster_register_with_barrier = True  # every task's registration waits for all, bounded


def listen(port: int, address: str) -> socket.socket:
    """A non-blocking socket listening on `port` on every interface (IPv6 and IPv4 where the host has both);
    ClusterError if the port is taken."""
    families = [socket.AF_INET6, socket.AF_INET] if socket.has_dualstack_ipv6() else [socket.AF_INET]
    for family in families:
        try:
            listener = socket.create_server(
                ("", port), family=family, dualstack_ipv6=family == socket.AF_INET6
            )
        except OSError as err:
            if err.errno != errno.EADDRINUSE and family != families[-1]:
                continue  # IPv6 present but unusable here: IPv4 only
            reason = os.strerror(err.errno) if err.errno else str(err)
            raise ClusterError(
                f"cannot listen on port {port}, this task's address {address} in TF_CONFIG ({reason}): stop what "
                "uses it (a worker of an earlier run still running?) or give this task another port"
            ) from None
        listener.setblocking(False)
        return listener
    raise AssertionError("unreachable")


def reach(address: tuple[str, int]) -> str | None:
    """None if something listens at `address`, else why not (for the message if it never does)."""
    try:
        with socket.create_connection(address, timeout=2.0):
            return None
    except OSError as err:
        return err.strerror or str(err) or type(err).__name__


def drain(listener: socket.socket) -> None:
    """Accepts and closes the connections other tasks made to find this one."""
    while True:
        try:
            connection, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        connection.close()


# TensorFlow's errors when a task of the cluster stops answering (killed, its host down, the network gone)
_LOST_CONTACT = ("UnavailableError", "AbortedError", "CancelledError", "DeadlineExceededError")
_TASK_NAME = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")


def lost_task_message(err: BaseException, cluster: dict | None = None) -> str | None:
    """What to tell the user when a multi-worker run failed because a task stopped answering; None for any
    other error. Names the task TensorFlow names (with its TF_CONFIG address) and the one remedy: restart every
    worker with the same command, which resumes all of them from the last checkpoint."""
    import tensorflow as tf

    if not isinstance(err, tf.errors.OpError):
        return None
    text = str(getattr(err, "message", "") or err)
    if type(err).__name__ not in _LOST_CONTACT and "Collective ops is aborted" not in text:
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    reason = next(
        (line for line in lines if line.startswith("Collective ops is aborted")), lines[0] if lines else ""
    )
    remote = text.partition("remote target")[2].split("\n", 1)[0]  # the task TensorFlow failed to reach
    who = " and ".join(tasks_named(remote, cluster)) or "another task of the cluster"
    return (
        f"lost contact with {who} ({type(err).__name__}: {reason}). Restart every worker with the same command: "
        "all of them resume from the last checkpoint"
    )
