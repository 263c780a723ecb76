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
- Or, with ``memory=`` given to the search, that per-sentence state is the step's fourth argument,
  ``step_fn(ids, index, cache, memory)``, leading dimension ``N // beam_size`` (row ``n`` reads entry
  ``n // beam_size``). Only then can the search drop finished sentences (``compact``): it gathers the rows of the
  sentences still running from the cache and from ``memory`` alike, so the step function must then keep nothing
  row-dependent in its closure.
- ``logits``: float ``(N, V)``, scores for the token at position ``index + 1``.

Both searches run in one ``tf.while_loop``. With ``static_shapes=True`` (the default) its shapes are fixed, so it can
be wrapped in ``tf.function(jit_compile=True)``. With ``static_shapes=False`` every dimension of the loop state may
change between steps: the cache may grow (a KV cache holding only the filled prefix) and, with
``compact``, the batch shrinks. ``max_steps`` may be a scalar int32 tensor (e.g. ``a * source_length + b``); it is
clipped to ``max_length``.

Dropping finished sentences (``compact``, a fraction in ``[0, 1]``): after a step where at least ``compact`` of the
running sentences (and at least one) are done, those sentences leave the loop state; their results are stored at their
original rows. Greedy: a sentence is done once it produced EOS. Beam: once its finished set is full and no alive
hypothesis can beat its worst member (the early-stopping test, per sentence) with ``alpha >= 0``; from then on the
uncompacted search would not change its result either, so the outputs are the same, only less work is done.

The loop machinery both searches share (the while loop, the sequence buffers, dropping rows) is in
`transformer.search_ops`.
"""

import tensorflow as tf

from transformer.search_ops import (
    caller,
    check_compact,
    drop_rows,
    initial_sequences,
    rows_to_drop,
    state_loop,
    step_limit,
    store_rows,
    write_token,
)
from transformer.vocab import BOS_ID, EOS_ID, PAD_ID

NEG_INF = -1.0e9  # score of an empty / impossible hypothesis: finite so that arithmetic never produces NaN


def length_penalty(length, alpha):
    """GNMT length penalty ``((5 + length) / 6) ** alpha`` (Wu et al., 2016, eq. 14), float32."""
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def greedy_search(
    step_fn,
    cache,
    *,
    batch_size,
    max_length,
    eos_id=EOS_ID,
    bos_id=BOS_ID,
    max_steps=None,
    memory=None,
    compact=None,
    static_shapes=True,
    pick=None,
):
    """Pick the most likely token at every step until EOS (or ``max_steps``), or the token ``pick`` draws.

    Args:
        step_fn: ``(ids (B, max_length), index, cache) -> (logits (B, V), new_cache)``, see the module docstring.
        cache: initial cache (leading dimension ``B``), or None.
        batch_size: python int or scalar int32 tensor ``B``.
        max_length: python int, the buffer length (and the maximum number of generated tokens); with
            ``static_shapes=False`` also a scalar int32 tensor.
        eos_id, bos_id: special ids.
        max_steps: optional scalar int (tensor), number of steps, clipped to ``max_length``.
        memory: optional per-sentence state (leading dimension ``B``), passed to the step function as its fourth
            argument.
        compact: None, or drop finished rows after a step where at least this fraction of the running rows
            finished (needs ``memory`` for per-sentence state and ``static_shapes=False``).
        static_shapes: False lets the cache change shape between steps (and the batch shrink, with ``compact``).
        pick: None (the most likely token), or ``pick(log_probs (M, V), step, rows (M,)) -> tokens (M,) int32``
            with ``rows`` each row's index in the batch of ``B`` (they stay the same when ``compact`` drops rows),
            e.g. `transformer.sampling.picker`.

    Returns:
        ``(ids, scores)``: ids int32 ``(B, max_length)`` without BOS, ``PAD`` after the first EOS (and after the last
        step); scores float32 ``(B,)``, the sum of the chosen tokens' log-probabilities (EOS included).
    """
    limit = step_limit(max_steps, max_length)
    check_compact(compact, static_shapes)
    call = caller(step_fn, memory)

    # Loop state:
    #   t        scalar int32        step number = position read from the buffer
    #   seq      (M, max_length + 1) BOS, then the chosen tokens; PAD elsewhere (M = B without `compact`)
    #   finished (M,) bool           EOS already produced
    #   scores   (M,) float32        sum of log-probabilities of the chosen tokens
    #   cache    nested, leading M;  memory: nested, leading M
    #   with `compact`: original (M,) int32, the row of each in the batch; out {"seq", "scores"}: (B, ...) dropped rows
    def cond(s):
        return tf.logical_and(s["t"] < limit, tf.logical_not(tf.reduce_all(s["finished"])))

    def body(s):
        t, finished = s["t"], s["finished"]
        logits, cache = call(s["seq"][:, :max_length], t, s["cache"], s["memory"])
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)  # (M, V)
        if pick is None:
            token = tf.argmax(log_probs, axis=-1, output_type=tf.int32)  # (M,)
        else:
            rows = s["original"] if compact is not None else tf.range(tf.shape(log_probs)[0])
            token = pick(log_probs, t, rows)
        token_log_prob = tf.gather(log_probs, token, axis=1, batch_dims=1)  # (M,)
        token = tf.where(finished, PAD_ID, token)
        new = dict(s, t=t + 1, cache=cache)
        new["scores"] = s["scores"] + tf.where(finished, 0.0, token_log_prob)
        new["seq"] = write_token(s["seq"], t + 1, token)
        new["finished"] = tf.logical_or(finished, tf.equal(token, eos_id))
        if compact is not None:
            results = lambda s: {"seq": s["seq"], "scores": s["scores"]}  # noqa: E731
            new = drop_rows(new, rows_to_drop(new["finished"], compact), results, _GREEDY_ROWS)
        return (new,)

    state = {
        "t": tf.constant(0, tf.int32),
        "seq": initial_sequences([batch_size], max_length, bos_id),
        "finished": tf.zeros([batch_size], tf.bool),
        "scores": tf.zeros([batch_size], tf.float32),
        "cache": {} if cache is None else cache,
        "memory": {} if memory is None else memory,
    }
    if compact is not None:
        state["original"] = tf.range(batch_size)
        state["out"] = {"seq": state["seq"], "scores": state["scores"]}
    (state,) = state_loop(cond, body, state, static_shapes)
    if compact is None:
        return state["seq"][:, 1:], state["scores"]
    everyone = tf.ones_like(state["finished"])
    out = store_rows(
        state["out"], state["original"], everyone, {"seq": state["seq"], "scores": state["scores"]}
    )
    return out["seq"][:, 1:], out["scores"]


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
    max_lengths=None,
    memory=None,
    compact=None,
    static_shapes=True,
):
    """Beam search with the GNMT length penalty, keeping finished hypotheses (Wu et al., 2016; as in tensor2tensor).

    Every step expands the ``beam_size`` alive hypotheses of each batch entry, keeps the ``2 * beam_size`` best
    continuations, moves those ending in EOS to the finished set (score ``log_prob / length_penalty(len, alpha)``,
    ``len`` counting EOS) and continues with the best ``beam_size`` that did not end. The cache is reordered with
    ``tf.gather`` by the origin beam of each survivor. The search stops after ``max_steps`` steps, or early once for
    every batch entry the best alive hypothesis, even with the most favourable length penalty, cannot beat the worst
    of a full finished set (this bound is exact: ``length_penalty`` of the longest possible hypothesis,
    ``min(max_steps, max_lengths[b])`` tokens, for ``alpha >= 0``; the next length for ``alpha < 0``).

    The ``2 * beam`` best continuations are found in two exact stages: the ``2 * beam`` best of each hypothesis's
    row, then the best of those ``beam * 2 * beam`` per sentence (the same candidates, in the same order, ties to
    the lower beam and token, as one `tf.math.top_k` over the ``beam * V`` scores, at a fraction of its cost).

    Args:
        step_fn: ``(ids (B * beam, max_length), index, cache) -> (logits (B * beam, V), new_cache)``.
        cache: initial cache with leading dimension ``B`` (tiled to ``B * beam`` here), or None.
        batch_size: python int ``B`` (or a scalar int32 tensor).
        beam_size: python int.
        max_length: python int, buffer length and maximum number of generated tokens (with
            ``static_shapes=False`` also a scalar int32 tensor).
        alpha: float, length penalty exponent (0 = no penalty).
        eos_id, bos_id: special ids.
        max_steps: optional scalar int (tensor), clipped to ``max_length``.
        max_lengths: optional int ``(B,)``: no hypothesis of sentence ``b`` gets longer than ``max_lengths[b]``
            tokens, EOS included, because the step function forces EOS there (`nmt.batch_decoding.limit_lengths`).
            Only tightens the early-stopping bound: the search stops sooner with the same results (a value below
            what the step function enforces could change them).
        memory: optional per-sentence state (leading dimension ``B``, not tiled), passed to the step function as its
            fourth argument.
        compact: None, or drop done sentences (see the module docstring) after a step where at least this fraction
            of the running sentences are done (needs ``memory`` for per-sentence state and ``static_shapes=False``).
            Ignored for ``alpha < 0``: there the final merge, at the step where the whole batch stops, may still
            prefer a done sentence's alive hypotheses (a shorter length penalises less), so its result depends on
            that step.
        static_shapes: False lets the cache change shape between steps (and the batch shrink, with ``compact``).

    Returns:
        ``(ids, scores)``: ids int32 ``(B, beam, max_length)`` without BOS and ``PAD`` after EOS; scores float32
        ``(B, beam)`` length-penalised, best first. If the step limit is reached, the unfinished hypotheses
        compete with the finished ones on ``log_prob / length_penalty(steps, alpha)`` (as if EOS were forced at the
        limit, without its probability). Slots that never held a real hypothesis score about ``NEG_INF``.
    """
    b, k, length = batch_size, beam_size, max_length
    limit = step_limit(max_steps, max_length)
    check_compact(compact, static_shapes)
    if alpha < 0:  # a done sentence's result may still depend on the step where the batch stops
        compact = None
    call = caller(step_fn, memory)
    cache = {} if cache is None else cache
    cache = tf.nest.map_structure(lambda x: tf.repeat(x, k, axis=0), cache)  # (B * beam, ...)

    def bound_penalty(t, s):
        """(M,) the most favourable length penalty a hypothesis alive before step ``t`` can still get."""
        if alpha >= 0:  # the longest possible hypothesis
            return length_penalty(tf.minimum(limit, s["max_length"]), alpha)
        return length_penalty(t + 1, alpha)

    def can_improve(t, s):
        """(M,) bool: sentence may still change its result (the early-stopping test before step ``t``)."""
        best_alive = s["alive_log_prob"][:, 0] / bound_penalty(t, s)  # (M,)
        full = tf.reduce_all(s["finished_flag"], axis=1)
        worst_finished = tf.where(full, tf.reduce_min(s["finished_score"], axis=1), 2.0 * NEG_INF)  # (M,)
        alive_real = s["alive_log_prob"][:, 0] > 0.5 * NEG_INF
        return tf.logical_and(alive_real, best_alive > worst_finished)

    def final(t, s):
        """Results at ``t`` steps: the unfinished compete with the finished on their current score (as if EOS were
        forced there); after an early finish they cannot win by construction. With ``alpha < 0`` a shorter length
        scores better, so before the limit the unfinished are scored at ``t + 1`` steps, as `bound_penalty` did
        when it stopped the search (at ``t`` an unfinished hypothesis could beat the finished ones it lost to)."""
        steps = tf.where(t < limit, t + 1, t) if alpha < 0 else t
        # A slot that never held a real hypothesis stays empty: a large penalty (alpha 3 over a long loop) would
        # lift its -t * 1e9 above NEG_INF / 2, where callers tell empty slots apart (as can_improve does).
        alive_real = s["alive_log_prob"] > 0.5 * NEG_INF
        alive_score = tf.where(alive_real, s["alive_log_prob"] / length_penalty(steps, alpha), NEG_INF)
        scores, best = tf.math.top_k(tf.concat([s["finished_score"], alive_score], axis=1), k=k)  # (M, beam)
        ids = tf.gather(tf.concat([s["finished_seq"], s["alive_seq"]], axis=1), best, batch_dims=1)
        return {"seq": ids, "scores": scores}

    # Loop state (sequences hold BOS at position 0 and the token generated at step t at position t + 1); M = B
    # sentences without `compact`:
    #   t               scalar int32                 step number = position read from the buffer
    #   alive_seq       (M, beam, max_length + 1)    unfinished hypotheses, best first
    #   alive_log_prob  (M, beam) float32            their summed log-probabilities (NEG_INF = empty slot)
    #   finished_seq    (M, beam, max_length + 1)    hypotheses that ended with EOS, best first
    #   finished_score  (M, beam) float32            their length-penalised scores (NEG_INF = empty slot)
    #   finished_flag   (M, beam) bool               slot holds a real finished hypothesis
    #   max_length      (M,) int32                   longest possible hypothesis (EOS included)
    #   cache           nested, leading M * beam     row m * beam + i belongs to alive_seq[m, i]
    #   memory          nested, leading M
    #   with `compact`: original (M,) int32, the sentence of each in the batch; out {"seq", "scores"}: (B, beam, ...)
    def cond(s):
        return tf.logical_and(s["t"] < limit, tf.reduce_any(can_improve(s["t"], s)))

    def body(s):
        t, alive_seq = s["t"], s["alive_seq"]
        m = b if static_shapes else tf.shape(alive_seq)[0]  # sentences in the loop state
        logits, cache = call(
            tf.reshape(alive_seq, [m * k, length + 1])[:, :length], t, s["cache"], s["memory"]
        )
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)  # (M * beam, V)
        candidates = tf.reshape(s["alive_log_prob"], [m * k, 1]) + log_probs  # (M * beam, V)
        top_log_prob, origin, token = _best_candidates(candidates, m, k, 2 * k)  # (M, 2 * beam) each
        top_seq = tf.gather(alive_seq, origin, batch_dims=1)  # (M, 2 * beam, max_length + 1)
        top_seq = write_token(top_seq, t + 1, token)
        ends = tf.equal(token, eos_id)
        new = dict(s, t=t + 1)

        # Alive: the best `beam` candidates that did not end (at most `beam` of the 2 * beam end).
        _, keep = tf.math.top_k(tf.where(ends, tf.float32.min, top_log_prob), k=k)  # (M, beam)
        new["alive_seq"] = tf.gather(top_seq, keep, batch_dims=1)
        new["alive_log_prob"] = tf.gather(top_log_prob, keep, batch_dims=1)
        rows = tf.range(m)[:, None] * k + tf.gather(origin, keep, batch_dims=1)  # (M, beam) cache row of each

        # Finished: merge the old set with the candidates that ended, keep the best `beam`.
        new_flag = tf.logical_and(ends, top_log_prob > 0.5 * NEG_INF)
        new_score = tf.where(new_flag, top_log_prob / length_penalty(t + 1, alpha), NEG_INF)
        pool_score = tf.concat([s["finished_score"], new_score], axis=1)  # (M, 3 * beam)
        new["finished_score"], best = tf.math.top_k(pool_score, k=k)
        new["finished_seq"] = tf.gather(tf.concat([s["finished_seq"], top_seq], axis=1), best, batch_dims=1)
        new["finished_flag"] = tf.gather(
            tf.concat([s["finished_flag"], new_flag], axis=1), best, batch_dims=1
        )

        if compact is not None:  # done: a full finished set that nothing alive can beat any more (alpha >= 0)
            done = tf.logical_and(
                tf.logical_not(can_improve(t + 1, new)), tf.reduce_all(new["finished_flag"], axis=1)
            )
            new["rank"] = rows
            new = drop_rows(new, rows_to_drop(done, compact), lambda s: final(t + 1, s), _BEAM_ROWS)
            rows = new.pop("rank")
        new["cache"] = tf.nest.map_structure(lambda x: tf.gather(x, tf.reshape(rows, [-1])), cache)
        return (new,)

    # All beams start identical: only the first is expanded at step 0.
    state = {
        "t": tf.constant(0, tf.int32),
        "alive_seq": initial_sequences([b, k], length, bos_id),
        "alive_log_prob": tf.concat([tf.zeros([b, 1]), tf.fill([b, k - 1], NEG_INF)], axis=1),
        "finished_seq": initial_sequences([b, k], length, PAD_ID),
        "finished_score": tf.fill([b, k], NEG_INF),
        "finished_flag": tf.zeros([b, k], tf.bool),
        "max_length": tf.fill([b], limit) if max_lengths is None else tf.cast(max_lengths, tf.int32),
        "cache": cache,
        "memory": {} if memory is None else memory,
    }
    if compact is not None:
        state["original"] = tf.range(b)
        state["out"] = {"seq": state["finished_seq"], "scores": state["finished_score"]}
    (state,) = state_loop(cond, body, state, static_shapes)
    result = final(state["t"], state)
    if compact is not None:
        everyone = tf.ones_like(state["original"], tf.bool)
        result = store_rows(state["out"], state["original"], everyone, result)
    return result["seq"][:, :, 1:], result["scores"]


# Loop state with one row per running sentence (beam search: ``rank``, the cache rows of its beams).
_GREEDY_ROWS = ("seq", "finished", "scores", "cache", "original", "memory")
_BEAM_ROWS = "alive_seq alive_log_prob finished_seq finished_score finished_flag max_length original rank memory".split()


def _best_candidates(candidates, m, k, n):
    """The ``n`` best of each sentence's ``k * V`` candidate scores ``candidates (M * k, V)`` (row ``i * k + j``:
    beam ``j`` of sentence ``i``): ``(scores, beam, token)``, each ``(M, n)``, best first.

    Exactly ``tf.math.top_k`` over ``(M, k * V)`` (ties to the lower beam, then the lower token), in two stages: the
    ``n`` best of each row, then the ``n`` best of those ``k * n`` per sentence. A sentence's best ``n`` are among its
    rows' best ``n``, and the second stage sees them in beam order, each row's best first. Profiled on a 2-core CPU
    (64 sentences, beam 4, 8k vocabulary) the single ``top_k`` took ~7 ms a step, 13% of the whole decoding time.
    """
    vocab = candidates.shape[-1]  # static under XLA, which needs a constant k
    per_row = tf.minimum(n, tf.shape(candidates)[-1]) if vocab is None else min(n, vocab)
    row_score, row_token = tf.math.top_k(candidates, k=per_row)  # (M * k, R)
    score, pick = tf.math.top_k(tf.reshape(row_score, [m, -1]), k=n)  # (M, n) of (M, k * R)
    token = tf.gather(tf.reshape(row_token, [m, -1]), pick, batch_dims=1)
    return score, pick // per_row, token
