"""Greedy and beam search over a step function; nothing here knows about the model.

A step function has the signature ``step_fn(ids, index, cache) -> (logits, new_cache)``:

- ``ids``: int32 ``(N, max_length)``, the tokens decoded so far: ``ids[:, 0] = BOS``, positions ``<= index`` are
  filled, the rest is ``PAD``. ``N`` is ``batch_size`` (greedy) or ``batch_size * beam_size`` (beam), laid out
  batch-major: row ``b * beam_size + k`` is beam ``k`` of batch entry ``b``.
- ``index``: scalar int32 tensor, the position whose next-token distribution is wanted.
- ``cache``: any nested structure of tensors with leading dimension ``N`` (possibly empty): the per-hypothesis
  state. The searches tile it from ``batch_size`` to ``N`` with ``tf.repeat`` and reorder it with ``tf.gather`` by
  beam origin after every step, so it should hold only what differs between the beams of a sentence (for a
  Transformer: the self-attention keys/values).
- Per-sentence state that is constant during the search (for a Transformer: the source mask and the
  cross-attention keys/values) is not part of the cache: the step function holds it at batch size ``B`` (in its
  closure) and lets row ``n`` read sentence ``n // (N // B)``, which the batch-major layout guarantees. The
  searches then never copy it, neither to tile it nor to reorder it.
- ``logits``: float ``(N, V)``, scores for the token at position ``index + 1``.

Both searches run in one ``tf.while_loop`` with fixed shapes, so they can be wrapped in
``tf.function(jit_compile=True)``. ``max_steps`` may be a scalar int32 tensor (e.g. ``a * source_length + b``); it is
clipped to ``max_length``.
"""

import tensorflow as tf

from transformer.vocab import BOS_ID, EOS_ID, PAD_ID

NEG_INF = -1.0e9  # score of an empty / impossible hypothesis: finite so that arithmetic never produces NaN


def length_penalty(length, alpha):
    """GNMT length penalty ``((5 + length) / 6) ** alpha`` (Wu et al., 2016, eq. 14), float32."""
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def greedy_search(step_fn, cache, *, batch_size, max_length, eos_id=EOS_ID, bos_id=BOS_ID, max_steps=None):
    """Pick the most likely token at every step until EOS (or ``max_steps``).

    Args:
        step_fn: ``(ids (B, max_length), index, cache) -> (logits (B, V), new_cache)``, see the module docstring.
        cache: initial cache (leading dimension ``B``), or None.
        batch_size: python int or scalar int32 tensor ``B``.
        max_length: python int, the buffer length (and the maximum number of generated tokens).
        eos_id, bos_id: special ids.
        max_steps: optional scalar int (tensor), number of steps, clipped to ``max_length``.

    Returns:
        ``(ids, scores)``: ids int32 ``(B, max_length)`` without BOS, ``PAD`` after the first EOS (and after the last
        step); scores float32 ``(B,)``, the sum of the chosen tokens' log-probabilities (EOS included).
    """
    limit = _step_limit(max_steps, max_length)
    cache = {} if cache is None else cache

    # Loop state:
    #   t        scalar int32        step number = position read from the buffer
    #   seq      (B, max_length + 1) BOS, then the chosen tokens; PAD elsewhere
    #   finished (B,) bool           EOS already produced
    #   scores   (B,) float32        sum of log-probabilities of the chosen tokens
    #   cache    nested, leading B
    def cond(t, seq, finished, scores, cache):
        return tf.logical_and(t < limit, tf.logical_not(tf.reduce_all(finished)))

    def body(t, seq, finished, scores, cache):
        logits, cache = step_fn(seq[:, :max_length], t, cache)
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)  # (B, V)
        token = tf.argmax(log_probs, axis=-1, output_type=tf.int32)  # (B,)
        token_log_prob = tf.gather(log_probs, token, axis=1, batch_dims=1)  # (B,)
        token = tf.where(finished, PAD_ID, token)
        scores = scores + tf.where(finished, 0.0, token_log_prob)
        seq = _write(seq, t + 1, token)
        finished = tf.logical_or(finished, tf.equal(token, eos_id))
        return t + 1, seq, finished, scores, cache

    state = (
        tf.constant(0, tf.int32),
        _initial_sequences([batch_size], max_length, bos_id),
        tf.zeros([batch_size], tf.bool),
        tf.zeros([batch_size], tf.float32),
        cache,
    )
    _, seq, _, scores, _ = tf.while_loop(cond, body, state)
    return seq[:, 1:], scores


def beam_search(
    step_fn,
    cache,
    *,
    batch_size,
    beam_size,
    max_length,
    alpha=0.6,
    eos_id=EOS_ID,
    bos_id=BOS_ID,
    max_steps=None,
):
    """Beam search with the GNMT length penalty, keeping finished hypotheses (Wu et al., 2016; as in tensor2tensor).

    Every step expands the ``beam_size`` alive hypotheses of each batch entry, keeps the ``2 * beam_size`` best
    continuations, moves those ending in EOS to the finished set (score ``log_prob / length_penalty(len, alpha)``,
    ``len`` counting EOS) and continues with the best ``beam_size`` that did not end. The cache is reordered with
    ``tf.gather`` by the origin beam of each survivor. The search stops after ``max_steps`` steps, or early once for
    every batch entry the best alive hypothesis, even with the most favourable length penalty, cannot beat the worst
    of a full finished set (this bound is exact for ``alpha >= 0``; for ``alpha < 0`` the next length is used).

    Args:
        step_fn: ``(ids (B * beam, max_length), index, cache) -> (logits (B * beam, V), new_cache)``.
        cache: initial cache with leading dimension ``B`` (tiled to ``B * beam`` here), or None.
        batch_size: python int ``B``.
        beam_size: python int.
        max_length: python int, buffer length and maximum number of generated tokens.
        alpha: float, length penalty exponent (0 = no penalty).
        eos_id, bos_id: special ids.
        max_steps: optional scalar int (tensor), clipped to ``max_length``.

    Returns:
        ``(ids, scores)``: ids int32 ``(B, beam, max_length)`` without BOS and ``PAD`` after EOS; scores float32
        ``(B, beam)`` length-penalised, best first. If the step limit is reached, the unfinished hypotheses
        compete with the finished ones on ``log_prob / length_penalty(steps, alpha)`` (as if EOS were forced at the
        limit, without its probability). Slots that never held a real hypothesis score about ``NEG_INF``.
    """
    b, k, length = batch_size, beam_size, max_length
    limit = _step_limit(max_steps, max_length)
    cache = {} if cache is None else cache
    cache = tf.nest.map_structure(lambda x: tf.repeat(x, k, axis=0), cache)  # (B * beam, ...)
    batch_offset = tf.range(b)[:, None] * k  # (B, 1)

    def bound_penalty(t):
        return length_penalty(limit, alpha) if alpha >= 0 else length_penalty(t + 1, alpha)

    # Loop state (sequences hold BOS at position 0 and the token generated at step t at position t + 1):
    #   t               scalar int32                 step number = position read from the buffer
    #   alive_seq       (B, beam, max_length + 1)    unfinished hypotheses, best first
    #   alive_log_prob  (B, beam) float32            their summed log-probabilities (NEG_INF = empty slot)
    #   finished_seq    (B, beam, max_length + 1)    hypotheses that ended with EOS, best first
    #   finished_score  (B, beam) float32            their length-penalised scores (NEG_INF = empty slot)
    #   finished_flag   (B, beam) bool               slot holds a real finished hypothesis
    #   cache           nested, leading B * beam     row b * beam + i belongs to alive_seq[b, i]
    def cond(t, alive_seq, alive_log_prob, finished_seq, finished_score, finished_flag, cache):
        best_alive = alive_log_prob[:, 0] / bound_penalty(t)  # (B,)
        worst_finished = tf.where(
            tf.reduce_all(finished_flag, axis=1), tf.reduce_min(finished_score, axis=1), 2.0 * NEG_INF
        )  # (B,)
        alive_real = alive_log_prob[:, 0] > 0.5 * NEG_INF
        can_improve = tf.logical_and(alive_real, best_alive > worst_finished)
        return tf.logical_and(t < limit, tf.reduce_any(can_improve))

    def body(t, alive_seq, alive_log_prob, finished_seq, finished_score, finished_flag, cache):
        logits, cache = step_fn(tf.reshape(alive_seq, [b * k, length + 1])[:, :length], t, cache)
        vocab = tf.shape(logits)[-1]
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
        log_probs = tf.reshape(log_probs, [b, k, vocab])  # (B, beam, V)
        candidates = tf.reshape(alive_log_prob[:, :, None] + log_probs, [b, k * vocab])  # (B, beam * V)
        top_log_prob, top_index = tf.math.top_k(candidates, k=2 * k)  # (B, 2 * beam)
        origin = top_index // vocab  # (B, 2 * beam) beam each candidate extends
        token = top_index % vocab  # (B, 2 * beam)
        top_seq = tf.gather(alive_seq, origin, batch_dims=1)  # (B, 2 * beam, max_length + 1)
        top_seq = _write(top_seq, t + 1, token)
        ends = tf.equal(token, eos_id)

        # Alive: the best `beam` candidates that did not end (at most `beam` of the 2 * beam end).
        _, keep = tf.math.top_k(tf.where(ends, tf.float32.min, top_log_prob), k=k)  # (B, beam)
        alive_seq = tf.gather(top_seq, keep, batch_dims=1)
        alive_log_prob = tf.gather(top_log_prob, keep, batch_dims=1)
        rows = tf.reshape(batch_offset + tf.gather(origin, keep, batch_dims=1), [b * k])  # (B * beam,)
        cache = tf.nest.map_structure(lambda x: tf.gather(x, rows), cache)

        # Finished: merge the old set with the candidates that ended, keep the best `beam`.
        new_flag = tf.logical_and(ends, top_log_prob > 0.5 * NEG_INF)
        new_score = tf.where(new_flag, top_log_prob / length_penalty(t + 1, alpha), NEG_INF)
        pool_score = tf.concat([finished_score, new_score], axis=1)  # (B, 3 * beam)
        finished_score, best = tf.math.top_k(pool_score, k=k)
        finished_seq = tf.gather(tf.concat([finished_seq, top_seq], axis=1), best, batch_dims=1)
        finished_flag = tf.gather(tf.concat([finished_flag, new_flag], axis=1), best, batch_dims=1)
        return t + 1, alive_seq, alive_log_prob, finished_seq, finished_score, finished_flag, cache

    # All beams start identical: only the first is expanded at step 0.
    first_only = tf.concat([tf.zeros([b, 1]), tf.fill([b, k - 1], NEG_INF)], axis=1)
    state = (
        tf.constant(0, tf.int32),
        _initial_sequences([b, k], length, bos_id),
        first_only,
        _initial_sequences([b, k], length, PAD_ID),
        tf.fill([b, k], NEG_INF),
        tf.zeros([b, k], tf.bool),
        cache,
    )
    t, alive_seq, alive_log_prob, finished_seq, finished_score, _, _ = tf.while_loop(cond, body, state)

    # At the step limit unfinished hypotheses compete with the finished ones on their current score (as if EOS
    # were forced there); after an early finish they cannot win by construction.
    alive_score = alive_log_prob / length_penalty(t, alpha)
    scores, best = tf.math.top_k(tf.concat([finished_score, alive_score], axis=1), k=k)  # (B, beam)
    ids = tf.gather(tf.concat([finished_seq, alive_seq], axis=1), best, batch_dims=1)
    return ids[:, :, 1:], scores


def _step_limit(max_steps, max_length):
    if max_steps is None:
        return tf.constant(max_length, tf.int32)
    return tf.minimum(tf.cast(max_steps, tf.int32), max_length)


def _initial_sequences(leading_shape, max_length, first_id):
    """``leading_shape + [max_length + 1]`` int32: ``first_id`` at position 0, ``PAD`` elsewhere."""
    first = tf.fill(leading_shape + [1], tf.constant(first_id, tf.int32))
    rest = tf.fill(leading_shape + [max_length], tf.constant(PAD_ID, tf.int32))
    return tf.concat([first, rest], axis=-1)


def _write(seq, position, token):
    """``seq[..., position] = token`` with a fixed-shape select (XLA friendly)."""
    at = tf.equal(tf.range(tf.shape(seq)[-1]), position)  # (max_length + 1,)
    return tf.where(at, token[..., None], seq)
