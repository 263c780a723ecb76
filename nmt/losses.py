"""Label-smoothed cross-entropy: per token with a hand-written gradient, or summed with explicit padding weights.

`token_cross_entropy(logits (N, V), labels (N,))` is the training step's loss, on the real target tokens only.
`smoothed_cross_entropy(logits (B, T, V), labels (B, T))` sums it over the non-padding positions (validation, and
the XLA step whose shapes must be static).

Smoothing is uniform over the whole vocabulary, as Keras' label smoothing and fairseq's older
criterion: the target distribution is q = (1 - eps) one_hot + eps / V, so the true class gets 1 - eps + eps / V
(current fairseq gives the others eps / (V - 1); OpenNMT-py eps / (V - 2), leaving out PAD and the true class),
and the loss is -sum_k q_k log p_k. The eps / V on PAD, BOS and UNK, never targets, is eps x 3/V of the mass.
"""

from __future__ import annotations

import tensorflow as tf

from transformer import kernels
from transformer.vocab import PAD_ID


def token_cross_entropy(logits, labels, *, label_smoothing: float = 0.0):
    """Per-token smoothed loss and negative log-likelihood, in float32.

    Args:
      logits: (N, V) float logits (computed in float32 whatever their dtype).
      labels: (N,) int target ids.
      label_smoothing: eps, the mass spread uniformly over the vocabulary.

    Returns:
      (loss, nll), each (N,) float32: -sum_k q_k log p_k and -log p_label.

    The gradient is written out, d loss / d logits = softmax - q and d nll / d logits = softmax - one_hot: the
    forward softmax reused, and a few (N, V) passes. Autodiff of a log-softmax forward pass costs about twice that
    (log-softmax gradient, the broadcast of the mean, and a dense scatter for the gradient of the label gather).

    The forward pass is a softmax, which oneDNN runs on CPU (TensorFlow's log-softmax kernel, Eigen's, is about
    3.5x slower on a (1800, 8000) float32 batch on a 2-core AMX Xeon), and the log-sum-exp comes from the largest
    logit: ``log p_top = z_top - logsumexp(z)`` with ``p_top >= 1 / V``, so its log never underflows, and
    ``-log p_y = (z_top - z_y) - log p_top`` stays finite and exact to float32 where ``p_y`` itself underflows.
    The smoothing term's mean is taken over the logits themselves, so it carries float32 rounding relative to
    their magnitude (about 1e-6 for logits of magnitude 10; the gradient does not depend on it).

    Inside `transformer.kernels.fused()` (the training step on CPU without XLA) the loss and its gradient are C++
    kernels, one pass over the logits each, reading them in their own dtype (no float32 copy of bfloat16 logits,
    and the gradient comes back in their dtype) and computing in float32: the same function, to float32 rounding.
    """
    labels = tf.cast(labels, tf.int32)
    eps = float(label_smoothing)
    ops = kernels.active(logits.dtype)
    if ops is not None:
        return _fused_cross_entropy(logits, labels, eps, ops)
    logits = tf.cast(logits, tf.float32)

    @tf.custom_gradient
    def cross_entropy(logits):
        probs = tf.nn.softmax(logits, axis=-1)  # (N, V)
        # the largest logit and its probability (softmax keeps the order); two max-reductions cost less than
        # TensorFlow's argmax and its gathers
        top_logit = tf.reduce_max(logits, axis=-1)  # (N,)
        # log p_top = top_logit - logsumexp(logits), in [-log V, 0]
        log_p_top = tf.math.log(tf.reduce_max(probs, axis=-1))
        nll = (top_logit - tf.gather(logits, labels, axis=-1, batch_dims=1)) - log_p_top  # (N,)
        if eps > 0.0:
            # -mean_k log p_k = logsumexp(logits) - mean_k logits_k
            uniform_nll = (top_logit - tf.reduce_mean(logits, axis=-1)) - log_p_top
            loss = (1.0 - eps) * nll + eps * uniform_nll
        else:
            loss = nll

        def grad(d_loss, d_nll):  # (N,) each; TF passes zeros for an output that is not differentiated
            # softmax * (a + b) - one_hot * ((1 - eps) a + b) - eps / V * a, with a = d_loss, b = d_nll
            d_logits = probs * (d_loss + d_nll)[:, None]  # (N, V)
            if eps > 0.0:
                uniform = eps / tf.cast(tf.shape(logits)[-1], tf.float32)
                d_logits -= (uniform * d_loss)[:, None]
            rows = tf.range(tf.shape(labels)[0], dtype=tf.int32)
            at_label = tf.stack([rows, labels], axis=1)  # (N, 2)
            return tf.tensor_scatter_nd_sub(d_logits, at_label, (1.0 - eps) * d_loss + d_nll)

        return (loss, nll), grad

    return cross_entropy(logits)


def _fused_cross_entropy(logits, labels, eps, ops):
    """`token_cross_entropy` by the C++ kernels: (loss, nll) forward, d logits from the saved log-sum-exp."""

    @tf.custom_gradient
    def cross_entropy(logits):
        # the log-sum-exp in two parts, the top logit and log sum_k exp(z_k - top), as the kernels keep it
        loss, nll, top, log_sum = ops.nmt_cross_entropy(logits, labels, label_smoothing=eps)

        def grad(d_loss, d_nll):
            with tf.name_scope("cross_entropy_grad"):
                d_loss, d_nll = tf.cast(d_loss, tf.float32), tf.cast(d_nll, tf.float32)
                return ops.nmt_cross_entropy_grad(
                    logits, labels, top, log_sum, d_loss, d_nll, label_smoothing=eps
                )

        return (loss, nll), grad

    return cross_entropy(logits)


def smoothed_cross_entropy(logits, labels, *, label_smoothing: float = 0.0, pad_id: int = PAD_ID):
    """Sums the per-token loss over non-padding targets.

    Args:
      logits: (batch, length, vocab) float logits (computed in float32).
      labels: (batch, length) int target ids; `pad_id` positions get weight 0.
      label_smoothing: mass spread uniformly over the vocabulary (see the module docstring).

    Returns:
      (loss_sum, nll_sum, num_tokens): the smoothed loss summed over tokens, the plain negative log-likelihood
      summed over tokens (for perplexity), and the number of non-padding tokens, all float32 scalars.
    """
    shape = tf.shape(labels)
    flat_logits = tf.reshape(logits, [-1, tf.shape(logits)[-1]])  # (batch * length, vocab)
    loss, nll = token_cross_entropy(flat_logits, tf.reshape(labels, [-1]), label_smoothing=label_smoothing)
    weights = tf.cast(tf.not_equal(labels, pad_id), tf.float32)  # (batch, length)
    loss, nll = tf.reshape(loss, shape), tf.reshape(nll, shape)
    return tf.reduce_sum(loss * weights), tf.reduce_sum(nll * weights), tf.reduce_sum(weights)
