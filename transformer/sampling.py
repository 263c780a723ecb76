"""Random sampling for decoding: top-k, nucleus (top-p) and temperature, reproducible per sentence.

    sampling = Sampling(topk=10, topp=1.0, temperature=1.0, seed=7)   # common.sampling: checked, TensorFlow-free
    pick = picker(sampling, row_ids)  # row_ids (B,) int: each sentence's number, e.g. its line in the input
    ids, scores = greedy_search(step_fn, cache, batch_size=B, max_length=L, pick=pick)

What back-translation at scale samples with (Edunov et al., 2018: sampling or top-k 10 instead of beam search), as
fairseq's ``--sampling --sampling-topk`` and CTranslate2's ``sampling_topk/topp/temperature``. At each step the
next token is drawn from ``softmax(log_probs / temperature)`` restricted to the ``topk`` most likely tokens (0: the
whole vocabulary), then to the smallest set of those whose probability reaches ``topp`` (1.0: no cut), renormalised.

The draw is the Gumbel-max trick: the candidate with the largest ``log p / temperature + g``, with ``g =
-log(-log u)`` and one uniform number ``u`` per sentence, step and token, made by an integer hash of
``(seed, row id, step, token id)``: a sentence's random numbers do not depend on which sentences share its batch, on
the batch order, on dropping finished sentences, on the cache or on XLA, and the same seed gives the same samples.
The draws are then the same up to the floating-point rounding of the model's probabilities, which those change:
a draw changes only where the two largest perturbed values lie within that rounding of each other, whatever the
number of candidates. (Inverse-CDF sampling, used before, changed a draw wherever its number fell within the rounding
of any boundary of the cumulative distribution, a chance that grows with the number of candidates: over the whole
vocabulary at temperature 1.3, 10 of 120 lines differed between XLA and not. docs/sampling-reproducibility-2026-12-06.)
Scores stay the model's: the sum of the chosen tokens' log-probabilities before temperature and cuts, as `--score`
computes them.
"""

from __future__ import annotations

import tensorflow as tf

from common.sampling import Sampling

__all__ = ["Sampling", "filtered_logits", "filtered_probabilities", "mix", "picker", "sample", "uniform"]

_MASK = 0xFFFFFFFF
# The multiplier of a well-mixing 32-bit integer hash (H. Mueller); under 2^27, so int64 products never overflow
_MULTIPLIER = 0x45D9F3B
_GOLDEN = 0x9E3779B9
# Log-probabilities at or below: tokens the step function forbids or forces out (their logits are -1e9, or
# float16's -32752 under mixed_float16: the bias is cut to float16.min / 2); no real log-probability comes near
_IMPOSSIBLE = -1.0e4
_COLDEST = 1.0e-6  # the lowest temperature used


def picker(sampling: Sampling, row_ids, seed=None):
    """``pick(log_probs (M, V), step, rows (M,)) -> tokens (M,) int32`` for `transformer.decoding.greedy_search`:
    ``rows`` index `row_ids` (B,) int, whose values (taken modulo 2^32) key each sentence's random numbers, with
    `seed` (a scalar int tensor; default `sampling.seed`), so that a new seed needs no new trace."""
    seed = tf.constant(sampling.seed, tf.int64) if seed is None else tf.cast(seed, tf.int64)
    seed_key = mix(tf.bitwise.bitwise_xor(seed & _MASK, _GOLDEN))
    row_keys = mix(tf.bitwise.bitwise_xor(tf.cast(row_ids, tf.int64) & _MASK, seed_key))

    def pick(log_probs, step, rows):
        scaled, token_ids = filtered_logits(log_probs, sampling)
        # numbers for the candidates only: the top-k, or the whole vocabulary (one row of ids, broadcast)
        ids = tf.range(tf.shape(log_probs)[-1])[tf.newaxis] if token_ids is None else token_ids
        return _gumbel_max(scaled, token_ids, uniform(tf.gather(row_keys, rows), step, ids))

    return pick


def mix(x):
    """A 32-bit integer hash of int64 values in [0, 2^32), elementwise; 0 maps to 0, so callers offset their keys."""
    for _ in range(2):
        x = (tf.bitwise.bitwise_xor(tf.bitwise.right_shift(x, 16), x) * _MULTIPLIER) & _MASK
    return tf.bitwise.bitwise_xor(tf.bitwise.right_shift(x, 16), x)


def uniform(keys, step, token_ids):
    """Floats in (0, 1), 23 random bits each, from 2^-24 to 1 - 2^-24 (both exact in float32, so the Gumbel noise is
    finite): for each key (M,) int64 at `step` (scalar int), one per token id of `token_ids` (M, K), or (1, K) for
    the same ids in every row; an int `token_ids` stands for ids 0..token_ids-1. A token's number depends on its id
    alone, not on its place among the candidates."""
    if isinstance(token_ids, int):
        token_ids = tf.range(token_ids)[tf.newaxis]
    step_key = mix((tf.cast(step, tf.int64) + 1) * _GOLDEN & _MASK)
    row_step = mix(tf.bitwise.bitwise_xor(keys, step_key))
    token_keys = mix((tf.cast(token_ids, tf.int64) + 1) * _GOLDEN & _MASK)
    return unit_interval(mix(tf.bitwise.bitwise_xor(row_step[:, tf.newaxis], token_keys)))


def unit_interval(bits):
    """32-bit hashes (int64) -> float32 in (0, 1): their top 23 bits, centred in their interval."""
    return (tf.cast(tf.bitwise.right_shift(bits, 9), tf.float32) + 0.5) * (1.0 / (1 << 23))


def filtered_logits(log_probs, sampling: Sampling):
    """``(scaled (M, K), token_ids (M, K) or None)``: the candidates' log-probabilities over the temperature, up to a
    constant per row, -inf for the tokens cut by top-p or impossible; the top-k candidates sorted by probability
    (``token_ids`` maps them back; None when K is the whole vocabulary, in vocabulary order)."""
    log_probs = tf.cast(log_probs, tf.float32)
    # A temperature under 1e-6 draws as 1e-6 does: the most likely token (greedy search), where dividing by a
    # denormal that the CPU flushes to 0 would give NaN.
    temperature = max(sampling.temperature, _COLDEST)
    scaled = (log_probs - tf.reduce_max(log_probs, axis=-1, keepdims=True)) / temperature
    # Forbidden and forced-out tokens (log-probability about -1e9) stay impossible at any temperature.
    scaled = tf.where(log_probs > _IMPOSSIBLE, scaled, float("-inf"))
    token_ids = None
    if sampling.topk or sampling.topp < 1.0:  # the cuts need the candidates sorted
        k = sampling.topk or tf.shape(scaled)[-1]
        k = tf.minimum(k, tf.shape(scaled)[-1])
        scaled, token_ids = tf.math.top_k(scaled, k=k)
    if sampling.topp < 1.0:
        before = tf.math.cumsum(tf.nn.softmax(scaled, axis=-1), axis=-1, exclusive=True)
        scaled = tf.where(
            before < sampling.topp, scaled, float("-inf")
        )  # the most likely token is always kept
    return scaled, token_ids


def filtered_probabilities(log_probs, sampling: Sampling):
    """``(probs (M, K), token_ids (M, K) or None)``: the renormalised distribution `sample` draws from (see
    `filtered_logits`); tokens cut by top-p have probability 0."""
    scaled, token_ids = filtered_logits(log_probs, sampling)
    return tf.nn.softmax(scaled, axis=-1), token_ids


def sample(log_probs, u, sampling: Sampling):
    """Tokens (M,) int32 drawn from `log_probs` (M, V) under `sampling` by the Gumbel-max trick, with `u` (M, V) in
    (0, 1): one number per token id (`uniform`), so a token's draw does not depend on the candidates' order."""
    scaled, token_ids = filtered_logits(log_probs, sampling)
    u = tf.cast(u, tf.float32)
    if token_ids is not None:
        u = tf.gather(u, token_ids, axis=1, batch_dims=1)
    return _gumbel_max(scaled, token_ids, u)


def _gumbel_max(scaled, token_ids, u):
    """The candidate (a token id) with the largest `scaled` (M, K) plus Gumbel noise from `u` (M, K)."""
    index = tf.argmax(scaled - tf.math.log(-tf.math.log(u)), axis=-1, output_type=tf.int32)
    if token_ids is None:
        return index
    return tf.gather(token_ids, index, axis=1, batch_dims=1)
