"""Scaled dot-product attention and mask builders, as pure functions (contract 1).

Conventions shared by every function here:

- Shapes: ``q (..., Lq, d)``, ``k (..., Lk, d)``, ``v (..., Lk, dv)``; ``...`` are batch dimensions (usually
  ``(batch, heads)``).
- Masks are boolean and broadcastable to ``(..., Lq, Lk)``; **True = may attend** (the Keras and PyTorch convention).
- Softmax statistics are always computed in float32 (float64 for float64 inputs), whatever the input dtype.
- A masked key gets a weight of exactly 0; a query row with no allowed key gets all-zero weights and a zero output.
  Nothing is ever NaN or Inf, because masked logits are *replaced* (``tf.where``) in float32 rather than added to
  in the compute dtype, and the weights are zeroed again after the softmax.

Memory-efficient variants (`chunked_attention`, `local_attention`) return only the output: they never build the
``(Lq, Lk)`` weight matrix.

Reference: Vaswani et al., "Attention Is All You Need" (2017), eq. 1; Rabe & Staats, "Self-attention Does Not Need
O(n^2) Memory" (2021) and Milakov & Gimelshein, "Online normalizer calculation for softmax" (2018) for the chunked
form; Beltagy et al., "Longformer" (2020) for banded local attention.
"""

import tensorflow as tf

from transformer.attention_ops import (
    _NEG,
    _band_windows,
    _cap,
    _ceil_div,
    _convert_and_check,
    _dim,
    _dropout,
    _expand_rank,
    _fused_masked_softmax,
    _fused_softmax_ops,
    _is_auto,
    _logits,
    _masked_softmax,
    _pad_axis,
    _scale,
    _scaled_query,
    _split_chunks,
    _stat_dtype,
)
from transformer.vocab import PAD_ID


def causal_mask(n):
    """Causal (look-ahead) mask.

    Args:
        n: python int or scalar int tensor, the sequence length.

    Returns:
        ``(n, n)`` bool tensor, True on and below the diagonal (query ``i`` may attend to keys ``j <= i``).
    """
    i = tf.range(n)[:, None]
    j = tf.range(n)[None, :]
    return i >= j


def padding_mask(ids, pad_id=PAD_ID):
    """Key padding mask.

    Args:
        ids: int tensor ``(B, L)`` of token ids.
        pad_id: the padding id (default ``PAD_ID``).

    Returns:
        ``(B, 1, 1, L)`` bool tensor, True where ``ids != pad_id``; broadcasts against ``(B, heads, Lq, L)``.
    """
    ids = tf.convert_to_tensor(ids)
    return tf.not_equal(ids, tf.cast(pad_id, ids.dtype))[:, None, None, :]


def local_mask(n, window):
    """Banded (local) mask.

    Args:
        n: python int or scalar int tensor, the sequence length.
        window: python int or scalar int tensor, the half width of the band.

    Returns:
        ``(n, n)`` bool tensor, True where ``|i - j| <= window``.
    """
    i = tf.range(n)[:, None]
    j = tf.range(n)[None, :]
    return tf.abs(i - j) <= window


def scaled_dot_product_attention(
    q,
    k,
    v,
    mask=None,
    *,
    scale=None,
    mask_fill="auto",
    soft_cap=None,
    dropout_rate=0.0,
    training=False,
    seed=None,
):
    """``softmax(q k^T * scale) v`` with an explicit boolean mask.

    Args:
        q: ``(..., Lq, d)`` float tensor (float32, float16 or bfloat16).
        k: ``(..., Lk, d)``, cast to ``q.dtype`` if it differs.
        v: ``(..., Lk, dv)``, cast to ``q.dtype`` if it differs.
        mask: optional bool, broadcastable to ``(..., Lq, Lk)``; True = may attend.
        scale: optional python float multiplying the logits; default ``1 / sqrt(d)``. Ablations use ``1.0``
            (unscaled) and ``1 / d`` (over-scaled).
        mask_fill: ``"auto"`` (default, the safe path: masked logits replaced in float32, masked weights exactly 0,
            fully masked rows all zero) or a python float (legacy path, **for ablations only**): the classic
            ``logits + (1 - mask) * mask_fill`` computed in the compute dtype, without exact zeroing. With ``-1e9`` in
            float16 this overflows to ``-inf`` and gives NaN (``0 * -inf``); with a finite fill a fully masked row
            attends uniformly to padding. It exists so an ablation can show that bug.
        soft_cap: optional python float ``c``; logits become ``c * tanh(logits / c)`` (Gemma-2 style logit cap),
            applied before masking.
        dropout_rate: dropout on the attention weights, used only when ``training`` is true.
        seed: optional ``keras.random.SeedGenerator`` for the dropout draws (checkpointable state, so resumed
            training is exact); default: TensorFlow's global generator.
        training: python bool or bool tensor.

    Returns:
        ``(output, weights)``: output ``(..., Lq, dv)`` in ``q.dtype``; weights ``(..., Lq, Lk)`` in ``q.dtype`` (the
        values actually multiplied with ``v``), rows summing to 1 over allowed keys and exactly 0 elsewhere.

    Raises:
        ValueError: if the depths of ``q`` and ``k`` or the lengths of ``k`` and ``v`` differ (statically known
            dimensions), naming both shapes.
    """
    q, k, v = _convert_and_check(q, k, v)
    ops = None if training and dropout_rate > 0.0 else _fused_softmax_ops(q, mask, mask_fill, soft_cap)
    # the training step on CPU: the scores' softmax in one C++ kernel, the weights in q's dtype; the kernel scales
    # the scores (not in float16, whose unscaled scores could overflow), which saves a pass over q both ways
    if ops is not None:
        fold = q.dtype != tf.float16 and not tf.is_tensor(_scale(q, scale))
        scores = tf.matmul(q if fold else _scaled_query(q, scale), k, transpose_b=True)
        weights = _fused_masked_softmax(scores, mask, ops, scale=_scale(q, scale) if fold else 1.0)
        return tf.matmul(weights, v), weights
    logits = _logits(q, k, scale, soft_cap, mask=None if _is_auto(mask_fill) else mask, mask_fill=mask_fill)
    if _is_auto(mask_fill):
        weights = _masked_softmax(logits, mask)
    else:
        weights = tf.nn.softmax(logits, axis=-1)
    if training and dropout_rate > 0.0:
        weights = _dropout(weights, dropout_rate, seed)
    weights = tf.cast(weights, q.dtype)
    output = tf.matmul(weights, v)  # (..., Lq, dv)
    return output, weights


def chunked_attention(
    q,
    k,
    v,
    mask=None,
    *,
    query_chunk=64,
    key_chunk=64,
    scale=None,
    soft_cap=None,
    dropout_rate=0.0,
    training=False,
    seed=None,
):
    """Memory-efficient attention: equal to `scaled_dot_product_attention` but never builds the ``(Lq, Lk)`` scores.

    Queries are processed ``query_chunk`` at a time (outer ``tf.while_loop``); for each query chunk the keys are
    visited ``key_chunk`` at a time (inner ``tf.while_loop``) with an online softmax kept in float32: running row
    maximum ``m``, running normaliser ``total`` and running weighted sum ``acc``, rescaled by ``exp(m_old - m_new)``
    whenever the maximum grows. Peak memory for scores is ``(..., query_chunk, key_chunk)``.

    Lengths that are not multiples of the chunk sizes are padded internally (padded keys are masked out, padded
    queries are dropped). Works eagerly, inside ``tf.function``, with dynamic shapes, and under XLA
    (``jit_compile=True``) for static shapes.

    Args:
        q, k, v: as in `scaled_dot_product_attention`; ``q``, ``k`` and ``v`` must share their batch dimensions
            (the mask may broadcast).
        mask: optional bool broadcastable to ``(..., Lq, Lk)``, True = may attend. Its last two dimensions must be
            either 1 or the full length.
        query_chunk, key_chunk: python ints, chunk sizes.
        scale, soft_cap: as in `scaled_dot_product_attention`.
        dropout_rate, training, seed: dropout on the (normalised) attention weights; applied to the accumulator only, so
            the result has the same distribution as dropping out the full weights.

    Returns:
        output ``(..., Lq, dv)`` in ``q.dtype``. Fully masked rows give zeros. The weights are not returned (they
        are never materialised).
    """
    q, k, v = _convert_and_check(q, k, v)
    if query_chunk < 1 or key_chunk < 1:
        raise ValueError(f"chunk sizes must be >= 1, got query_chunk={query_chunk}, key_chunk={key_chunk}")
    rank = q.shape.rank
    q = _scaled_query(q, scale)  # scaling before the product keeps low-precision scores small
    stat = _stat_dtype(q)
    lq, lk, dv = _dim(q, -2), _dim(k, -2), _dim(v, -1)
    batch = tf.shape(q)[:-2]
    cq = min(query_chunk, lq) if isinstance(lq, int) and lq > 0 else query_chunk
    ck = min(key_chunk, lk) if isinstance(lk, int) and lk > 0 else key_chunk
    nq, nk = _ceil_div(lq, cq), _ceil_div(lk, ck)

    qc = _split_chunks(_pad_axis(q, -2, nq * cq - lq), -2, nq, cq)  # (..., nq, cq, d)
    kc = _split_chunks(_pad_axis(k, -2, nk * ck - lk), -2, nk, ck)  # (..., nk, ck, d)
    vc = _split_chunks(_pad_axis(v, -2, nk * ck - lk), -2, nk, ck)  # (..., nk, ck, dv)

    # Mask as (..., nq|1, cq|1, nk|1, ck|1): a broadcast (size-1) axis stays unchunked.
    q_full = k_full = False
    if mask is not None:
        mask = _expand_rank(tf.cast(mask, tf.bool), rank)
        q_full, k_full = mask.shape[-2] != 1, mask.shape[-1] != 1
        mask = tf.broadcast_to(
            mask, tf.concat([tf.shape(mask)[:-2], [lq if q_full else 1, lk if k_full else 1]], 0)
        )
        if q_full:
            mask = _pad_axis(mask, -2, nq * cq - lq)
        if k_full:
            mask = _pad_axis(mask, -1, nk * ck - lk)
        # (..., Lq|1, Lk|1) -> (..., Lq|1, nk|1, ck|1) -> (..., nq|1, cq|1, nk|1, ck|1)
        mask = _split_chunks(mask, -1, nk if k_full else 1, ck if k_full else 1)
        mask = _split_chunks(mask, -3, nq if q_full else 1, cq if q_full else 1)

    def query_chunk_output(i):
        qi = tf.gather(qc, i, axis=rank - 2)  # (..., cq, d)
        mask_i = None
        if mask is not None:
            mask_i = tf.gather(mask, i if q_full else 0, axis=rank - 2)  # (..., cq|1, nk|1, ck|1)

        def key_step(j, m, total, acc):
            kj = tf.gather(kc, j, axis=rank - 2)  # (..., ck, d)
            vj = tf.gather(vc, j, axis=rank - 2)  # (..., ck, dv)
            s = _cap(tf.cast(tf.matmul(qi, kj, transpose_b=True), stat), soft_cap)  # (..., cq, ck)
            valid = (j * ck + tf.range(ck)) < lk  # (ck,): padded keys are invalid
            if mask_i is not None:
                mask_ij = tf.gather(mask_i, j if k_full else 0, axis=rank - 1)  # (..., cq|1, ck|1)
                valid = tf.logical_and(valid, mask_ij)
            s = tf.where(valid, s, _NEG)
            m_new = tf.maximum(m, tf.reduce_max(s, axis=-1, keepdims=True))  # (..., cq, 1)
            p = tf.where(valid, tf.exp(s - m_new), 0.0)  # (..., cq, ck), exactly 0 where masked
            correction = tf.exp(m - m_new)
            total = total * correction + tf.reduce_sum(p, axis=-1, keepdims=True)
            if training and dropout_rate > 0.0:
                p = _dropout(p, dropout_rate, seed)
            acc = acc * correction + tf.cast(tf.matmul(tf.cast(p, v.dtype), vj), stat)
            return j + 1, m_new, total, acc

        stat_shape = tf.concat([batch, [cq, 1]], 0)
        init = (
            tf.constant(0),
            tf.fill(stat_shape, tf.constant(_NEG, stat)),  # running max m: (..., cq, 1)
            tf.zeros(stat_shape, stat),  # running normaliser total: (..., cq, 1)
            tf.zeros(tf.concat([batch, [cq, dv]], 0), stat),  # running sum acc: (..., cq, dv)
        )
        # maximum_iterations: lets XLA differentiate the loop (fixed-size gradient accumulators).
        _, _, total, acc = tf.while_loop(lambda j, *_: j < nk, key_step, init, maximum_iterations=nk)
        return tf.cast(tf.math.divide_no_nan(acc, total), q.dtype)  # fully masked rows: total == 0 -> 0

    def query_step(i, outputs):
        return i + 1, outputs.write(i, query_chunk_output(i))

    outputs = tf.TensorArray(q.dtype, size=nq, element_shape=q.shape[:-2].concatenate([cq, v.shape[-1]]))
    _, outputs = tf.while_loop(
        lambda i, _: i < nq, query_step, (tf.constant(0), outputs), maximum_iterations=nq
    )
    out = outputs.stack()  # (nq, ..., cq, dv)
    out = tf.transpose(out, [*range(1, rank - 1), 0, rank - 1, rank])  # (..., nq, cq, dv)
    out = tf.reshape(out, tf.concat([batch, [nq * cq, dv]], 0))  # (..., nq * cq, dv)
    return out[..., :lq, :]


def local_attention(
    q,
    k,
    v,
    window,
    mask=None,
    *,
    scale=None,
    soft_cap=None,
    dropout_rate=0.0,
    training=False,
    block_size=None,
    seed=None,
):
    """Local (banded) self-attention: query ``i`` attends only to keys ``j`` with ``|i - j| <= window``.

    Equal to ``scaled_dot_product_attention(q, k, v, local_mask(L, window) & mask)``. When ``mask`` is None or a key
    mask (its query axis has static size 1, e.g. `padding_mask`), the banded block form is used: the sequence is
    cut into blocks of ``block_size >= window`` positions (default ``max(window, 1)``) and each query block attends
    to its own and the two neighbouring key blocks, so memory is ``O(L * 3 * block_size)`` instead of ``O(L^2)``.
    A mask with a full query axis falls back to the masked full form (correct, but ``O(L^2)``).

    Args:
        q, k, v: as in `scaled_dot_product_attention`, with ``Lq == Lk`` (self-attention).
        window: python int >= 0, half width of the band.
        mask: optional bool broadcastable to ``(..., L, L)``, True = may attend.
        scale, soft_cap, dropout_rate, training, seed: as in `scaled_dot_product_attention`.
        block_size: optional python int >= window.

    Returns:
        output ``(..., L, dv)`` in ``q.dtype`` (the weights are not returned, as in `chunked_attention`).
    """
    q, k, v = _convert_and_check(q, k, v)
    window = int(window)
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    lq, lk = _dim(q, -2), _dim(k, -2)
    if isinstance(lq, int) and isinstance(lk, int) and lq != lk:
        raise ValueError(
            f"local attention needs Lq == Lk, got q shape {tuple(q.shape)} and k shape {tuple(k.shape)}"
        )
    rank = q.shape.rank
    if mask is not None:
        mask = _expand_rank(tf.cast(mask, tf.bool), rank)
        if mask.shape[-2] != 1:
            band = local_mask(lk, window)
            output, _ = scaled_dot_product_attention(
                q,
                k,
                v,
                tf.logical_and(mask, band),
                scale=scale,
                soft_cap=soft_cap,
                dropout_rate=dropout_rate,
                training=training,
                seed=seed,
            )
            return output
    b = max(window, 1) if block_size is None else int(block_size)
    if b < max(window, 1):
        raise ValueError(f"block_size must be >= window, got block_size={b}, window={window}")
    n = _ceil_div(lk, b)
    batch = tf.shape(q)[:-2]

    qb = _scaled_query(q, scale)
    qb = _split_chunks(_pad_axis(qb, -2, n * b - lk), -2, n, b)  # (..., n, b, d)
    kw = _band_windows(k, b, n, lk)  # (..., n, 3b, d)
    vw = _band_windows(v, b, n, lk)  # (..., n, 3b, dv)

    r = tf.range(b)[:, None]
    c = tf.range(3 * b)[None, :]
    valid = tf.abs(b + r - c) <= window  # (b, 3b): |query pos - key pos| <= window
    key_pos = (tf.range(n)[:, None] - 1) * b + tf.range(3 * b)[None, :]  # (n, 3b)
    in_range = tf.logical_and(key_pos >= 0, key_pos < lk)[:, None, :]  # (n, 1, 3b)
    valid = tf.logical_and(valid, in_range)  # (n, b, 3b)
    if mask is not None:
        key_mask = mask[..., 0, :]  # (..., L|1)
        if key_mask.shape[-1] != 1:
            key_mask = _band_windows(key_mask[..., None], b, n, lk)[..., 0]  # (..., n, 3b)
        else:
            key_mask = key_mask[..., None]  # (..., 1, 1)
        valid = tf.logical_and(valid, key_mask[..., None, :])  # (..., n, b, 3b)

    logits = _cap(tf.cast(tf.matmul(qb, kw, transpose_b=True), _stat_dtype(q)), soft_cap)  # (..., n, b, 3b)
    weights = _masked_softmax(logits, valid)  # (..., n, b, 3b)
    if training and dropout_rate > 0.0:
        weights = _dropout(weights, dropout_rate, seed)
    out = tf.matmul(tf.cast(weights, q.dtype), vw)  # (..., n, b, dv)
    out = tf.reshape(out, tf.concat([batch, [n * b, tf.shape(v)[-1]]], 0))  # (..., n * b, dv)
    return out[..., :lk, :]
