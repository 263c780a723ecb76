"""Random sampling for decoding: top-k, nucleus (top-p) and temperature, reproducible per sentence.

    sampling = Sampling(topk=10, topp=1.0, temperature=1.0, seed=7)   # common.sampling: checked, TensorFlow-free
    pick = picker(sampling, row_ids)  # row_ids (B,) int: each sentence's number, e.g. its line in the input
    ids, scores = greedy_search(step_fn, cache, batch_size=B, max_length=L, pick=pick)

What back-translation at scale samples with (Edunov et al., 2018: sampling or top-k 10 instead of beam search), as
fairseq's ``--sampling --sampling-topk`` and CTranslate2's ``sampling_topk/topp/temperature``. At each step the
next token is drawn from ``softmax(log_probs / temperature)`` restricted to the ``topk`` most likely tokens (0: the
whole vocabulary), then to the smallest set of those whose probability reaches ``topp`` (1.0: no cut), renormalised.

The draw is inverse-CDF sampling with one uniform number per sentence and step, made by an integer hash of
``(seed, row id, step)``: a sentence's random numbers do not depend on which sentences share its batch, on the batch
order, on dropping finished sentences, on the cache or on XLA, and the same seed gives the same samples. The draws
are then the same up to the floating-point rounding of the model's probabilities, which those change: a number that
falls within that rounding of a boundary between two tokens can draw the other one (none of 120 lines at top-k 10;
a few in a hundred over the whole vocabulary at temperature 1.3: docs/sampling-reproducibility-2026-12-06).
Scores stay the model's: the sum of the chosen tokens' log-probabilities before temperature and cuts, as `--score`
computes them.
"""

from __future__ import annotations

import tensorflow as tf

from common.sampling import Sampling

__all__ = ["Sampling", "filtered_probabilities", "mix", "picker", "sample", "uniform"]

_MASK = 0xFFFFFFFF
# The multiplier of a well-mixing 32-bit integer hash (H. Mueller); under 2^27, so int64 products never overflow
_MULTIPLIER = 0x45D9F3B
_GOLDEN = 0x9E3779B9
# Log-probabilities at or below: tokens the step function forbids or forces out (their logits are -1e9)
_IMPOSSIBLE = -1.0e8
_COLDEST = 1.0e-6  # the lowest temperature used


def picker(sampling: Sampling, row_ids, seed=None):
    """``pick(log_probs (M, V), step, rows (M,)) -> tokens (M,) int32`` for `transformer.decoding.greedy_search`:
    ``rows`` index `row_ids` (B,) int, whose values (taken modulo 2^32) key each sentence's random numbers, with
    `seed` (a scalar int tensor; default `sampling.seed`), so that a new seed needs no new trace."""
    seed = tf.constant(sampling.seed, tf.int64) if seed is None else tf.cast(seed, tf.int64)
    seed_key = mix(tf.bitwise.bitwise_xor(seed & _MASK, _GOLDEN))
    row_keys = mix(tf.bitwise.bitwise_xor(tf.cast(row_ids, tf.int64) & _MASK, seed_key))

    def pick(log_probs, step, rows):
        keys = tf.gather(row_keys, rows)
        return sample(log_probs, uniform(keys, step), sampling)

    return pick


def mix(x):
    """A 32-bit integer hash of int64 values in [0, 2^32), elementwise; 0 maps to 0, so callers offset their keys."""
    for _ in range(2):
        x = (tf.bitwise.bitwise_xor(tf.bitwise.right_shift(x, 16), x) * _MULTIPLIER) & _MASK
    return tf.bitwise.bitwise_xor(tf.bitwise.right_shift(x, 16), x)


def uniform(keys, step):
    """One float32 in [0, 1) per key (M,) int64 at `step` (scalar int), 24 random bits each."""
    step_key = mix((tf.cast(step, tf.int64) + 1) * _GOLDEN & _MASK)
    bits = mix(tf.bitwise.bitwise_xor(keys, step_key))
    return tf.cast(tf.bitwise.right_shift(bits, 8), tf.float32) * (1.0 / (1 << 24))


def filtered_probabilities(log_probs, sampling: Sampling):
    """``(probs (M, K), token_ids (M, K) or None)``: the renormalised distribution to draw from over K candidates,
    the top-k ones sorted by probability (``token_ids`` maps them back; None when K is the whole vocabulary, in
    vocabulary order). Tokens cut by top-p have probability 0."""
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
    probs = tf.nn.softmax(scaled, axis=-1)
    if sampling.topp < 1.0:
        before = tf.math.cumsum(probs, axis=-1, exclusive=True)
        probs = tf.where(before < sampling.topp, probs, 0.0)  # the most likely token is always kept
        probs /= tf.reduce_sum(probs, axis=-1, keepdims=True)
    return probs, token_ids


def sample(log_probs, u, sampling: Sampling):
    """Tokens (M,) int32 drawn from `log_probs` (M, V) under `sampling`, by inverse CDF at `u` (M,) in [0, 1)."""
    probs, token_ids = filtered_probabilities(log_probs, sampling)
    cumulative = tf.math.cumsum(probs, axis=-1)
    target = u * cumulative[:, -1]
    # The first candidate whose cumulative probability exceeds the target (it has a probability > 0); rounding can
    # leave none exceeding it when u is within 2^-24 of 1: then the last candidate with a probability > 0.
    index = tf.reduce_sum(tf.cast(cumulative <= target[:, tf.newaxis], tf.int32), axis=-1)
    last = (
        tf.shape(probs)[-1] - 1 - tf.argmax(tf.reverse(probs, axis=[-1]) > 0.0, axis=-1, output_type=tf.int32)
    )
    index = tf.minimum(index, last)
    if token_ids is None:
        return index
    return tf.gather(token_ids, index, axis=1, batch_dims=1)
