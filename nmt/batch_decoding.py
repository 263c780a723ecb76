"""Decoding of one padded batch with per-sentence length limits: pure TensorFlow, used by `nmt.translator` and by
the exported SavedModel (`nmt.export`).

Maximum output length (subwords, EOS excluded) per sentence: `floor(a * source_length + b)`, capped by the output
buffer (`output_limits`). It is enforced per sentence by forcing EOS once a sentence reaches its limit
(`limit_lengths`), so a translation never depends on which other sentences share its batch or on the padded shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from transformer.decoding import beam_search, greedy_search
from transformer.step_fns import cached_decoding, full_step_fn
from transformer.vocab import BOS_ID, EOS_ID

__all__ = ["decode_batch", "limit_lengths", "output_limits"]

_FORCED = -1e9  # logit of every non-EOS token once a sentence has reached its length limit


def limit_lengths(step_fn: Callable, eos_id: int = EOS_ID) -> Callable:
    """Wraps a step function so that row `n` emits EOS at output position `state["limit"][n]`.

    The wrapped function takes and returns the state `{"inner": <step_fn cache>, "limit": (N,) int32}`; every
    tensor has the leading batch dimension, so beam search tiles and reorders the limits with the cache.
    """

    def step(ids, index, state):
        logits, inner = step_fn(ids, index, state["inner"])  # (N, V)
        logits = tf.cast(logits, tf.float32)
        vocab = tf.shape(logits)[-1]
        eos_only = tf.where(tf.equal(tf.range(vocab), eos_id), 0.0, _FORCED)  # (V,)
        force = tf.greater_equal(index, state["limit"])[:, tf.newaxis]  # (N, 1)
        logits = tf.where(force, eos_only[tf.newaxis, :], logits)
        return logits, {"inner": inner, "limit": state["limit"]}

    return step


def decode_batch(
    model,
    source,
    limits,
    *,
    max_length: int,
    beam_size: int = 1,
    alpha: float = 0.6,
    use_cache: bool = True,
    search: str = "auto",
    static_shapes: bool = False,
):
    """Decodes one padded batch.

    Args:
      model: the Transformer (`encode`, `init_cache`, `decode_step`).
      source: (B, S) int32 source ids ending with EOS, padded with PAD.
      limits: (B,) int32, maximum output subwords (EOS excluded) per sentence; each < `max_length`.
      max_length: static size of the output buffer.
      beam_size, alpha: beam width and GNMT length penalty exponent.
      use_cache: incremental decoding with the key/value cache, or a full decoder pass per step (same results).
      search: "greedy", "beam", or "auto" (greedy for beam_size 1).
      static_shapes: keep every shape static (needed under XLA); without the cache this re-runs the decoder over
        the whole output buffer each step instead of over the prefix.

    Returns:
      (ids (B, K, max_length) int32 without BOS, PAD after EOS; scores (B, K) float32), K = 1 for greedy search
      and `beam_size` for beam search, best first.
    """
    batch_size = source.shape[0] if source.shape[0] is not None else tf.shape(source)[0]
    if (
        use_cache
    ):  # the search reorders only the self-attention K/V; the beams share their sentence's cross K/V
        step_fn, inner = cached_decoding(model, source, max_length)
    else:
        inner = {}  # the full-recompute step encodes the source once and keeps no cache
        step_fn = full_step_fn(model, source, prefix_only=not static_shapes)
    state = {"inner": inner, "limit": tf.cast(limits, tf.int32)}
    step_fn = limit_lengths(step_fn)
    if search == "greedy" or (search == "auto" and beam_size == 1):
        ids, scores = greedy_search(
            step_fn, state, batch_size=batch_size, max_length=max_length, eos_id=EOS_ID, bos_id=BOS_ID
        )
        return ids[:, tf.newaxis, :], scores[:, tf.newaxis]
    return beam_search(
        step_fn,
        state,
        batch_size=batch_size,
        beam_size=beam_size,
        max_length=max_length,
        alpha=alpha,
        eos_id=EOS_ID,
        bos_id=BOS_ID,
    )


def output_limits(source_lengths, a: float, b: int, cap: int):
    """Per-sentence maximum output length floor(a * len + b), at most `cap - 1` (works on ints and tensors)."""
    if isinstance(source_lengths, (int, np.integer)):
        return max(0, min(int(math.floor(a * source_lengths + b)), cap - 1))
    lengths = tf.cast(source_lengths, tf.float64)  # float64, like Python: the same floor as the int branch
    limits = tf.cast(tf.floor(a * lengths + float(b)), tf.int32)
    return tf.clip_by_value(limits, 0, cap - 1)
