"""Which fused op library the layers trace with, if any.

`transformer.layer_norm`, `transformer.dropout`, the dense layers' bias and its gradients (`attention_ops.flat_dense`,
`dense_heads`), the attention's masked softmax (and the training loss, `nmt.losses.token_cross_entropy`) compute
through the C++ kernels of an op library (built and loaded by `nmt.kernels`) only while traced inside
`fused(library)`, which the training step enters on CPU without XLA. Everything else (inference, exports, XLA,
GPUs) traces TensorFlow's ops, so a SavedModel never depends on the library. Both paths compute the same function
(dropout bit for bit, the rest to float rounding: float32's, and one rounding of the compute dtype where grappler
fuses a dense layer's bias into its matmul and the kernels add it to the rounded product).
"""

import contextlib
import threading

import tensorflow as tf

# the element types the kernels are registered for (float64 stays on TensorFlow's ops)
DTYPES = (tf.float32, tf.bfloat16, tf.float16)
_libraries = []
_lock = threading.Lock()


@contextlib.contextmanager
def fused(library):
    """Layers traced inside (from any thread: a distribution strategy traces its replicas in threads of its own)
    use ``library``'s kernels; ``None`` changes nothing."""
    if library is None:
        yield
        return
    with _lock:
        _libraries.append(library)
    try:
        yield
    finally:
        with _lock:
            _libraries.remove(library)


def active(dtype):
    """The op library of the innermost `fused()` being traced, if it has kernels for ``dtype``; else None."""
    if dtype not in DTYPES:
        return None
    with _lock:
        return _libraries[-1] if _libraries else None
