"""Label-smoothed cross-entropy with explicit weights (padding excluded)."""

from __future__ import annotations

import tensorflow as tf

from transformer.vocab import PAD_ID


def smoothed_cross_entropy(logits, labels, *, label_smoothing: float = 0.0, pad_id: int = PAD_ID):
    """Sums the per-token loss over non-padding targets.

    Args:
      logits: (batch, length, vocab) float logits (computed in float32).
      labels: (batch, length) int target ids; `pad_id` positions get weight 0.
      label_smoothing: mass spread uniformly over the vocabulary (the `uniform` convention of fairseq/OpenNMT:
        the true class gets 1 - eps + eps / V).

    Returns:
      (loss_sum, nll_sum, num_tokens): the smoothed loss summed over tokens, the plain negative log-likelihood
      summed over tokens (for perplexity), and the number of non-padding tokens, all float32 scalars.
    """
    logits = tf.cast(logits, tf.float32)
    log_probs = tf.nn.log_softmax(logits, axis=-1)  # (batch, length, vocab)
    weights = tf.cast(tf.not_equal(labels, pad_id), tf.float32)  # (batch, length)
    nll = -tf.gather(log_probs, tf.cast(labels, tf.int32), axis=-1, batch_dims=2)  # (batch, length)
    if label_smoothing > 0.0:
        smooth = -tf.reduce_mean(log_probs, axis=-1)  # (batch, length)
        loss = (1.0 - label_smoothing) * nll + label_smoothing * smooth
    else:
        loss = nll
    return tf.reduce_sum(loss * weights), tf.reduce_sum(nll * weights), tf.reduce_sum(weights)
