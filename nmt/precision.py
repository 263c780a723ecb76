"""Precision and compilation choices per device.

`auto` picks the fastest policy that is numerically safe on the device in use:
mixed_float16 on NVIDIA GPUs (tensor cores, with dynamic loss scaling), mixed_bfloat16 on TPUs and on CPUs with
native bf16 matmul (AVX512-BF16 or AMX), float32 otherwise (on AVX2-only CPUs bf16/fp16 are emulated and slower).
Softmax, layer norm, logits and the loss stay in float32 in every policy (see transformer/).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from common.cpu import cpu_flags

_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def device_kind(strategy: tf.distribute.Strategy | None = None, *, gpus: list | None = None) -> str:
    """'tpu', 'gpu' or 'cpu': the device the strategy (or the default placement) computes on.

    `gpus`: the logical GPU devices (default: `tf.config.list_logical_devices("GPU")`).
    """
    if strategy is not None and isinstance(strategy, tf.distribute.TPUStrategy):
        return "tpu"
    if gpus is None:
        gpus = tf.config.list_logical_devices("GPU")
    return "gpu" if gpus else "cpu"


def resolve_precision(precision: str, device: str, *, flags: set[str] | None = None) -> str:
    """The Keras policy for `precision` on `device` ('cpu', 'gpu' or 'tpu').

    `flags`: the CPU's feature flags (default: this machine's, `cpu_flags()`).
    """
    if precision != "auto":
        return precision
    if device == "gpu":
        return "mixed_float16"
    if device == "tpu":
        return "mixed_bfloat16"
    if flags is None:
        flags = cpu_flags()
    if any(flag in flags for flag in _BF16_CPU_FLAGS):
        return "mixed_bfloat16"
    return "float32"


def resolve_xla(xla: bool | str, device: str, local_replicas: int = 1) -> bool:
    """Whether the train step is jit-compiled whole: `auto` turns XLA on for GPU/TPU only.

    On CPU whole-step XLA loses: its matmuls do not reach oneDNN's kernels (0.61x for bf16 on AMX; README). And
    over several CPU replicas in one process (logical devices) it cannot run at all: the compiled step of one replica reads the
    variables of another's device (TensorFlow's "tf.Variable on a different device" known issue), so `xla: true`
    is refused there (ConfigError) instead of failing at the first step.
    """
    if xla == "auto":
        return device in ("gpu", "tpu")
    if xla is True and device == "cpu" and local_replicas > 1:
        from nmt.config import ConfigError

        raise ConfigError(
            f"train.xla: true cannot compile a step over {local_replicas} CPU replicas in one process (each "
            "replica's compiled step would read another device's variables): use train.xla: fusible or false"
        )
    return xla is True


def resolve_autocluster(xla: bool | str) -> bool:
    """Whether the train step auto-clusters its fusible ops (`nmt.xla`): `fusible` only, never `auto`.

    Measured on an AMX Xeon on the real epoch's 30 batch shapes (docs/amx-2026-12-02b): 1.13x faster bf16 steps once
    compiled, but XLA compiles each new batch shape for 12-22 s (12 stalls in 400 steps): about even over an hour,
    and the budget probe would time the stalls.
    """
    return xla == "fusible"


def set_policy(policy: str) -> None:
    keras.mixed_precision.set_global_policy(policy)
