"""Tensor helpers shared by the attention forms of `transformer.attention`: input checks, scaling, logit capping,
the float32 masked softmax, and the chunk / band reshapes of the memory-efficient variants. Internal to the package."""

import math

import keras
import tensorflow as tf

from transformer import kernels
from transformer.dropout import dropout

# Fill value for masked logits in the float32 softmax: finite, so differences never produce NaN.
_NEG = float(tf.float32.min)


def flat_dense(dense, x):
    """``dense`` over the rows of ``x (..., d)`` as one 2-D matmul: ``(rows, units)``, rows = all leading positions.

    Keras runs a Dense on a rank-3 input through `tf.tensordot`, whose dynamic-shape bookkeeping (shape, gather,
    prod, concat) adds about ten small ops per call: every projection of every decoding step pays them, and they
    lengthen tracing. The product is the same 2-D matmul either way (tensordot reshapes to it), so the values are
    unchanged; callers reshape the result back to the shape they need.

    Inside `transformer.kernels.fused()` (the training step on CPU without XLA) a Dense with a bias and no
    activation or ReLU computes the same ops by hand: the matmul alone, then the bias (and ReLU) in one C++ kernel
    pass, and the gradients of the bias (and ReLU) in one pass over the output gradient (`_fused_dense`).
    """
    x = x if len(x.shape) == 2 else tf.reshape(x, [-1, x.shape[-1]])  # NumPy inputs too
    ops = _fused_dense_ops(dense)
    return dense(x) if ops is None else _fused_dense(dense, x, ops)


def dense_heads(dense, x, heads):
    """``dense`` over ``x (B, L, d)`` split into ``heads``: ``(B, heads, L, units / heads)``, an attention's
    projection of queries, keys or values.

    `flat_dense`, then a reshape and a transpose; inside `transformer.kernels.fused()`, for a Dense with a bias and
    no activation, the matmul alone and then one C++ kernel pass that adds the bias and writes the heads, and one
    pass back for the gradients of both (`_fused_dense_heads`)."""
    ops = _fused_dense_ops(dense)
    if ops is not None and dense.activation is keras.activations.linear and len(x.shape) == 3:
        return _fused_dense_heads(dense, x, heads, ops)
    batch, length = tf.shape(x)[0], tf.shape(x)[1]
    y = tf.reshape(flat_dense(dense, x), [batch, length, heads, dense.units // heads])
    return tf.transpose(y, [0, 2, 1, 3])


def _fused_dense_heads(dense, x, heads, ops):
    """`dense_heads` with ``nmt_bias_add_heads`` (the bias added to the product rounded to the compute dtype, as
    in `_fused_dense`, written head by head) and ``nmt_heads_bias_grad`` (the product's gradient, transposed back,
    and the bias' in float32, one pass)."""
    batch, length = tf.shape(x)[0], tf.shape(x)[1]
    product = tf.reshape(_product(dense, tf.reshape(x, [-1, x.shape[-1]])), [batch, length, dense.units])
    return _with_bias(
        product,
        dense.bias,
        lambda product, bias: ops.nmt_bias_add_heads(product, bias, heads=heads),
        lambda dy, y: ops.nmt_heads_bias_grad(dy),
    )


def _product(dense, x):
    """``x (rows, d) @ kernel`` in the compute dtype, the variables read as Keras reads them in a call (autocast to
    the compute dtype inside a layer's call)."""
    dtype = tf.as_dtype(dense.compute_dtype)
    return tf.matmul(tf.cast(x, dtype), tf.cast(dense.kernel, dtype))


def _with_bias(product, bias, forward, backward):
    """``forward(product, bias)`` (the bias in the product's dtype) with the gradient ``backward(dy, y)`` -> (d
    product, d bias in float32), named ``bias_grad`` in the profile."""
    bias = tf.convert_to_tensor(bias)

    @tf.custom_gradient
    def biased(product, bias):
        y = forward(product, tf.cast(bias, product.dtype))

        def grad(dy):
            with tf.name_scope("bias_grad"):
                d_product, d_bias = backward(tf.cast(dy, y.dtype), y)
                return d_product, tf.cast(d_bias, bias.dtype)

        return y, grad

    return biased(product, bias)


def _fused_dense_ops(dense):
    """The op library to compute ``dense`` with (see `flat_dense`), or None for Keras' own call."""
    plain = getattr(dense, "quantization_mode", None) is None and dense.bias is not None and dense.built
    if not plain or dense.activation not in (keras.activations.relu, keras.activations.linear):
        return None
    return kernels.active(tf.as_dtype(dense.compute_dtype))


def _fused_dense(dense, x, ops):
    """Keras' ``Dense.call`` (matmul, bias add, ReLU or none) with the bias and ReLU from ``ops``:
    ``nmt_bias_add(product, bias, relu=...)`` adds them to the product rounded to the compute dtype, as TensorFlow's
    ops do one by one; grappler would fuse them into oneDNN's matmul, which in bfloat16 takes about twice the time
    of the matmul alone on an AMX Xeon (one rounding there, two here). The gradients: ``nmt_relu_bias_grad(dy, y)``
    gives dx and d bias in one pass (TensorFlow: ReluGrad, then BiasAddGrad on its output), ``nmt_bias_grad(dy)`` d
    bias."""
    relu = dense.activation is keras.activations.relu

    def backward(dy, y):
        return ops.nmt_relu_bias_grad(dy, y) if relu else (dy, ops.nmt_bias_grad(dy))

    return _with_bias(
        _product(dense, x),
        dense.bias,
        lambda product, bias: ops.nmt_bias_add(product, bias, relu=relu),
        backward,
    )


def _is_auto(mask_fill):
    return isinstance(mask_fill, str) and mask_fill == "auto"


def _convert_and_check(q, k, v):
    q = tf.convert_to_tensor(q)
    k = tf.convert_to_tensor(k)
    v = tf.convert_to_tensor(v)
    if k.dtype != q.dtype:
        k = tf.cast(k, q.dtype)
    if v.dtype != q.dtype:
        v = tf.cast(v, q.dtype)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.shape.rank is not None and t.shape.rank < 2:
            raise ValueError(
                f"{name} must have rank >= 2 (..., length, depth), got {name} shape {tuple(t.shape)}"
            )
    dq, dk = q.shape[-1], k.shape[-1]
    if dq is not None and dk is not None and dq != dk:
        raise ValueError(
            f"q and k must have the same depth (last dimension): q shape {tuple(q.shape)}, k shape {tuple(k.shape)}"
        )
    lk, lv = k.shape[-2], v.shape[-2]
    if lk is not None and lv is not None and lk != lv:
        raise ValueError(
            f"k and v must have the same length (dimension -2): k shape {tuple(k.shape)}, v shape {tuple(v.shape)}"
        )
    return q, k, v


def _default_scale(q):
    d = q.shape[-1]
    if d is not None:
        return 1.0 / math.sqrt(d)
    return tf.math.rsqrt(tf.cast(tf.shape(q)[-1], tf.float32))


def _scale(q, scale):
    return _default_scale(q) if scale is None else float(scale)


def _cap(logits, soft_cap):
    if soft_cap is None:
        return logits
    return soft_cap * tf.tanh(logits / soft_cap)


def _stat_dtype(x):
    """Softmax statistics dtype: float32, or float64 for float64 inputs."""
    return tf.float64 if x.dtype == tf.float64 else tf.float32


def _scaled_query(q, scale):
    scale = _scale(q, scale)
    return q * (tf.cast(scale, q.dtype) if tf.is_tensor(scale) else tf.constant(scale, q.dtype))


def _logits(q, k, scale, soft_cap, mask, mask_fill):
    """float32 (float64) logits ``(..., Lq, Lk)``; on the legacy path (``mask`` given) the fill is added in the compute dtype."""
    scores = tf.matmul(_scaled_query(q, scale), k, transpose_b=True)  # (..., Lq, Lk) in the compute dtype
    if mask is None:
        return _cap(tf.cast(scores, _stat_dtype(q)), soft_cap)
    # Legacy additive fill, deliberately in the compute dtype (see `mask_fill`): may overflow in float16.
    scores = _cap(scores, soft_cap)
    keep = tf.cast(tf.cast(mask, tf.bool), scores.dtype)
    scores = scores + (1.0 - keep) * tf.cast(mask_fill, scores.dtype)
    return tf.cast(scores, _stat_dtype(q))


def _masked_softmax(logits, mask):
    """Softmax over the last axis in the logits' dtype; masked entries exactly 0, fully masked rows all 0."""
    if mask is None:
        return tf.nn.softmax(logits, axis=-1)
    mask = tf.cast(mask, tf.bool)
    weights = tf.nn.softmax(tf.where(mask, logits, _NEG), axis=-1)
    return tf.where(mask, weights, 0.0)


def _fused_softmax_ops(q, mask, mask_fill, soft_cap):
    """The op library whose masked-softmax kernels compute `scaled_dot_product_attention`'s weights (inside
    `transformer.kernels.fused()`: the training step on CPU without XLA), or None: the safe masking path
    (``mask_fill="auto"``) of heads ``(B, H, Lq, Lk)`` with a ``(B or 1, 1, Lq or 1, Lk)`` mask, no logit cap."""
    ops = kernels.active(q.dtype)
    if ops is None or not _is_auto(mask_fill) or soft_cap is not None or mask is None:
        return None
    mask_shape = tf.TensorShape(mask.shape)  # NumPy masks too
    return ops if q.shape.rank == 4 and mask_shape.rank == 4 and mask_shape[1] == 1 else None


def _fused_masked_softmax(scores, mask, ops, scale=1.0):
    """`_masked_softmax` of ``scores * scale`` (a python float, applied in float32) by the C++ kernels: the weights
    in the scores' dtype (float32 math), and their gradient recomputed from the scores and each row's saved max and
    log-sum."""
    mask = tf.cast(mask, tf.bool)

    @tf.custom_gradient
    def softmax(scores):
        weights, top, log_sum = ops.nmt_masked_softmax(scores, mask, scale=scale)

        def grad(d_weights):
            with tf.name_scope("masked_softmax_grad"):
                d_weights = tf.cast(d_weights, scores.dtype)
                return ops.nmt_masked_softmax_grad(d_weights, scores, mask, top, log_sum, scale=scale)

        return weights, grad

    return softmax(scores)


def _dim(x, axis):
    """Static size of ``axis`` if known, else a scalar tensor."""
    d = x.shape[axis]
    return d if d is not None else tf.shape(x)[axis]


def _ceil_div(a, b):
    if isinstance(a, int):
        return -(-a // b)
    return (a + b - 1) // b


def _expand_rank(x, rank):
    """Prepend size-1 axes so that ``x`` has ``rank`` dimensions."""
    missing = rank - x.shape.rank
    if missing <= 0:
        return x
    return tf.reshape(x, tf.concat([tf.ones([missing], tf.int32), tf.shape(x)], 0))


def _pad_axis(x, axis, amount):
    """Pad ``x`` at the end of ``axis`` (negative) with ``amount`` zeros / False."""
    if isinstance(amount, int) and amount == 0:
        return x
    rank = x.shape.rank
    paddings = [[0, 0]] * rank
    paddings[rank + axis] = [0, amount]
    return tf.pad(x, paddings)


def _split_chunks(x, axis, num, size):
    """Reshape ``axis`` (negative) of length ``num * size`` into ``(num, size)``."""
    shape = tf.shape(x)
    rank = x.shape.rank
    a = rank + axis
    new_shape = tf.concat([shape[:a], [num, size], shape[a + 1 :]], 0)
    out = tf.reshape(x, new_shape)
    static = x.shape.as_list()
    static[a : a + 1] = [num if isinstance(num, int) else None, size if isinstance(size, int) else None]
    out.set_shape(static)
    return out


def _band_windows(x, b, n, length):
    """``(..., L, d)`` -> ``(..., n, 3b, d)``: for block ``i``, positions ``(i - 1) * b`` to ``(i + 2) * b - 1``."""
    rank = x.shape.rank
    paddings = [[0, 0]] * (rank - 2) + [[b, n * b - length + b], [0, 0]]
    blocks = _split_chunks(tf.pad(x, paddings), -2, n + 2, b)  # (..., n + 2, b, d)
    windows = tf.concat([blocks[..., :-2, :, :], blocks[..., 1:-1, :, :], blocks[..., 2:, :, :]], axis=-2)
    return windows  # (..., n, 3b, d)


def _dropout(x, rate, seed):
    """Inverted dropout of ``x``. With ``seed`` (a ``keras.random.SeedGenerator``) the draws come from its state,
    a variable that checkpoints with the model, so a resumed run draws the masks an uninterrupted one would;
    without it, from TensorFlow's process-global generator (stateless functions, tests)."""
    if seed is None:
        return tf.nn.dropout(x, rate=rate)
    return dropout(x, rate, seed)
