"""Fused C++ kernels for the training step on CPU (`build` compiles them; `make install` runs it): layer
normalisation forward and backward (`transformer.layer_norm`), dropout with its own Philox draws
(`transformer.dropout`), the label-smoothed cross-entropy over the vocabulary with its gradient
(`nmt.losses.token_cross_entropy`), the dense layers' bias add with its ReLU and their gradients
(`transformer.attention_ops.flat_dense`), the attention projections' bias add with the head split
(`transformer.attention_ops.dense_heads`), the attention's masked softmax
(`transformer.attention.scaled_dot_product_attention`) and the optimizer update of all variables in one op
(`nmt.optimizer.FusedAdam.apply_scaled`).

`ops()` loads the library built for this environment, or returns None when there is none (no compiler, a build
that failed, another CPU kind since, ``NMT_KERNELS=off`` in the environment, or an ``NMT_KERNELS_ISA`` it does not
know): the layers then use TensorFlow's own ops, same math, slower. `unavailable()` says why, for the log. The
training step hands the library to the layers with `transformer.kernels.fused(ops())` while it traces, on CPU
without XLA only, and to the optimizer's update on CPU (never XLA-compiled).

The dropout kernels take AVX-512 paths where the CPU has AVX-512F; ``NMT_KERNELS_ISA=avx2`` makes them take the
AVX2 paths an AVX2-only CPU runs (read at each kernel call: the tests of both paths, measuring an AVX2 CPU's code).
"""

from __future__ import annotations

import functools
import os

SWITCH_ENV = "NMT_KERNELS"
ISA_ENV = "NMT_KERNELS_ISA"
ISAS = ("", "native", "avx2")


@functools.cache
def _load():
    from nmt.kernels.build import BuildError, library_path

    if os.environ.get(SWITCH_ENV, "").lower() in ("off", "0", "false"):
        return None, f"{SWITCH_ENV}={os.environ[SWITCH_ENV]}"
    isa = os.environ.get(ISA_ENV, "")
    if isa not in ISAS:  # a typo: TensorFlow's ops, the log's "C++ kernels:" line says why
        return None, f"{ISA_ENV}={isa!r} is none of avx2 or native (unset: native)"

    try:
        path = library_path()
    except (BuildError, OSError) as error:
        return None, str(error)
    if not path.is_file():
        return None, f"not built for this environment (run make install): {path.name}"
    import tensorflow as tf

    try:
        return tf.load_op_library(str(path)), ""
    # a library TensorFlow refuses (another build of it, a broken file): the ops, not a crash
    except (tf.errors.OpError, OSError) as error:
        return None, f"{path} does not load: {error}"


def ops():
    """The loaded op library (``nmt_layer_norm``, ``nmt_layer_norm_grad``, ``nmt_dropout``, ``nmt_dropout_grad``,
    ``nmt_cross_entropy``, ``nmt_cross_entropy_grad``, ``nmt_bias_add``, ``nmt_bias_grad``, ``nmt_relu_bias_grad``,
    ``nmt_bias_add_heads``, ``nmt_heads_bias_grad``, ``nmt_masked_softmax``, ``nmt_masked_softmax_grad``,
    ``nmt_apply_adam``), or None."""
    return _load()[0]


def unavailable() -> str:
    """Why `ops()` is None ("" when it is not)."""
    return _load()[1]
