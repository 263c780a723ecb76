"""XLA auto-clustering of the fusible ops only (`train.xla: fusible`): matmuls stay on TensorFlow's own kernels.

Full XLA (`jit_compile`) loses on CPU: its matmuls do not reach oneDNN's AMX and AVX-512 kernels (0.61x for the bf16
step on an AMX Xeon, docs/profile-train-step-amx-2026-12-02.md). Auto-clustering restricted to XLA's *fusible* ops
(elementwise ops, reductions, casts, transposes) keeps every MatMul a TensorFlow op and hands XLA the
passes over memory between them (layer norm, dropout, residual adds, bias and ReLU, the loss), which it fuses.

TensorFlow reads the flags this needs (`FLAGS`) from `TF_XLA_FLAGS` once per process, when it first optimizes any
function: `install_flags()` runs at import, so import this module before TensorFlow runs anything (train.py and
bench.py do; so does `nmt.train_step`). The flags alone change nothing: clustering happens only while
`autoclustering()` is active, which `TrainStep` enters around the training step's calls only (decoding, validation
and the input pipeline are never clustered). If the flags came too late, clustering silently does not happen
(TensorFlow does not auto-cluster on CPU without them): slower, same results.
"""

from __future__ import annotations

import contextlib
import os

# Lazy compilation off: a cluster compiles at the first request of each shape, in every process. With it on, a
# shape's first requests run the unfused fallback (other rounding) and clusters that met many shapes stop compiling
# ("megamorphic"), so a resumed process would fuse other steps than the uninterrupted run: not exact.
FLAGS = (
    "--tf_xla_cpu_global_jit",
    "--tf_xla_ops_to_cluster=FUSIBLE",
    "--tf_xla_enable_lazy_compilation=false",
)


def install_flags(environ=os.environ) -> None:
    """Adds `FLAGS` to `TF_XLA_FLAGS`, keeping what is there (an explicit `--tf_xla_ops_to_cluster` wins)."""
    current = environ.get("TF_XLA_FLAGS", "").split()
    names = {flag.split("=")[0] for flag in current}
    added = [flag for flag in FLAGS if flag.split("=")[0] not in names]
    if added:
        environ["TF_XLA_FLAGS"] = " ".join([*current, *added])


@contextlib.contextmanager
def autoclustering(enabled: bool = True):
    """Auto-clusters (per `FLAGS`) the functions called inside the block; the previous setting comes back after.

    Each function is instantiated once per setting and both stay cached, so entering the block every step costs no
    retrace. The setting is TensorFlow's global (per-thread) JIT level.
    """
    if not enabled:
        yield
        return
    import tensorflow as tf

    previous = tf.config.optimizer.get_jit()
    tf.config.optimizer.set_jit("autoclustering")
    try:
        yield
    finally:
        tf.config.optimizer.set_jit(previous or False)


install_flags()
