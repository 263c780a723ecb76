"""`tf.distribute` strategies from the config: none, mirrored, multi_worker, tpu.

Must run before TensorFlow initialises its devices (the first op), because `mirrored` on a machine without GPUs
splits the CPU into two logical devices so the same code path is exercised (and tested) without accelerators.
"""

from __future__ import annotations

import json
import os

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
