"""Adapters from a `Transformer` to the step functions of `transformer.decoding`.

Both adapters forbid the ``PAD`` and ``BOS`` tokens: they are never valid outputs, and a generated ``PAD`` would be
masked as padding by the full pass but not by the cached step. The full pass sets their logits to ``-1e9``; the
cached step adds ``-1e9`` (half float16's lowest finite value under mixed_float16) to them right after the output
projection's matmul (`Transformer.decode_step`'s ``logit_bias``, which grappler can fuse into the matmul: one select
over the ``(N, V)`` logits less per step).
Either way their probability is exactly 0 and every other token's logit and log-probability are the same.

Example:
    >>> step_fn, cache = cached_decoding(model, source, max_length)
    >>> ids, scores = beam_search(step_fn, cache, batch_size=B, beam_size=4, max_length=max_length)
    >>> ids, scores = beam_search(full_step_fn(model, source), None, batch_size=B, beam_size=4, max_length=max_length)
    >>> step_fn, cache, memory = cached_decoding(model, source, max_length, growing=True, memory_argument=True)
    >>> ids, scores = beam_search(step_fn, cache, memory=memory, compact=0.0, static_shapes=False, ...)
"""

import numpy as np
import tensorflow as tf

from transformer.vocab import BOS_ID, PAD_ID

FORBIDDEN = (PAD_ID, BOS_ID)


def cached_decoding(model, source, max_length, forbid=FORBIDDEN, *, growing=False, memory_argument=False):
    """``(step_fn, cache)`` (or ``(step_fn, cache, memory)``) for incremental decoding of ``source (B, S)``.

    The source is encoded once; the per-sentence part of the cache (source mask, cross K/V at ``B`` rows, shared
    by the beams of a sentence) stays out of the search's cache, which holds only the self-attention K/V.

    Args:
        growing: the self K/V start empty and grow by one position per step (`Transformer.decode_step`): dynamic
            shapes, so the search needs ``static_shapes=False``; not under XLA.
        memory_argument: False: the step function holds the per-sentence part in its closure. True: returns
            ``(step_fn, cache, memory)`` and the step function takes it as a fourth argument (the searches'
            ``memory``), so that a search can drop finished sentences from it (``compact``).
    """
    cache = model.init_cache(source, model.encode(source), max_length, growing=growing)
    if memory_argument:
        return cached_step_fn(model, None, forbid, growing=growing), cache["self"], cache["memory"]
    return cached_step_fn(model, cache["memory"], forbid, growing=growing), cache["self"]


def cached_step_fn(model, memory=None, forbid=FORBIDDEN, growing=False):
    """Incremental step: feeds ``ids[:, index]`` to ``model.decode_step`` with the KV cache.

    Args:
        model: a `Transformer`.
        memory: ``model.init_cache(...)["memory"]`` (batch ``B``): the step then takes and returns only the
            ``"self"`` part as its cache, and row ``n`` of ``N`` reads sentence ``n // (N // B)`` of ``memory``.
            None: the search's cache is the whole ``init_cache`` dict (its memory part then gets tiled and
            reordered with the rest: same results, more work), unless the search passes the memory as the step's
            fourth argument.
        growing: the cache comes from ``init_cache(..., growing=True)``.

    Returns:
        ``step_fn(ids (N, max_length), index, cache, memory=None) -> (logits (N, V) float32, new_cache)``.
    """

    bias = _forbid_bias(model.target_vocab_size, forbid)

    def step_fn(ids, index, cache, step_memory=None):
        tokens = tf.gather(ids, index, axis=1)  # (N,)
        sentences = memory if step_memory is None else step_memory
        options = dict(growing=growing, logit_bias=bias)
        if sentences is None:
            logits, cache = model.decode_step(tokens, cache, index, **options)
        else:
            logits, full = model.decode_step(tokens, {"memory": sentences, "self": cache}, index, **options)
            cache = full["self"]
        return logits, cache

    return step_fn


def full_step_fn(model, source, forbid=FORBIDDEN, prefix_only=False):
    """No-cache step: re-runs the whole decoder and reads position ``index``.

    ``prefix_only=False`` runs the decoder over the whole static buffer (every shape static, as XLA needs);
    ``prefix_only=True`` runs it over ``ids[:, :index + 1]`` and projects only the last position, the usual
    no-cache loop (the TF tutorial's), whose cost grows with the prefix. Both give the same logits.

    The source is encoded once, here; the step repeats the memory ``N // B`` times along the batch axis, which matches
    the batch-major layout of the searches (row ``b * beam + k``). The search's cache is unused: pass None.

    Args:
        model: a `Transformer`.
        source: int32 ``(B, S)``.

    Returns:
        ``step_fn(ids (N, max_length), index, cache) -> (logits (N, V) float32, cache)``.
    """
    memory = model.encode(source)  # (B, S, d_model), or a nested structure of them (`transformer.ensemble`)
    source_mask = model.source_mask(source)  # (B, 1, 1, S)

    def step_fn(ids, index, cache):
        repeats = tf.shape(ids)[0] // tf.shape(source_mask)[0]
        tiled_memory = tf.nest.map_structure(lambda x: tf.repeat(x, repeats, axis=0), memory)
        tiled_mask = tf.repeat(source_mask, repeats, axis=0)
        if prefix_only:
            logits = model.decode_last(ids[:, : index + 1], tiled_memory, tiled_mask)  # (N, V)
        else:
            logits = tf.gather(model.decode(ids, tiled_memory, tiled_mask), index, axis=1)  # (N, V)
        return _forbid(logits, forbid), cache

    return step_fn


def _forbid_bias(vocab, ids):
    """``(V,)`` float32: ``-1e9`` at ``ids``, 0 elsewhere; None without ids."""
    if not ids:
        return None
    return tf.constant(np.where(np.isin(np.arange(vocab), list(ids)), -1.0e9, 0.0).astype(np.float32))


def _forbid(logits, ids):
    if not ids:
        return logits
    vocab = tf.shape(logits)[-1]
    banned = tf.reduce_any(
        tf.equal(tf.range(vocab)[:, None], tf.constant(list(ids), tf.int32)[None, :]), axis=1
    )
    return tf.where(banned[None, :], tf.constant(-1.0e9, logits.dtype), logits)
