"""Label-smoothed cross-entropy against a NumPy reference, with padding excluded by weight; the per-token loss on
TensorFlow's ops and on the C++ kernels (`transformer.kernels.fused`, the training step on CPU without XLA)."""

import contextlib

import numpy as np
import pytest
import tensorflow as tf

from nmt.losses import smoothed_cross_entropy, token_cross_entropy
from transformer.kernels import fused
from transformer.vocab import PAD_ID

VOCAB = 11


def reference(logits: np.ndarray, labels: np.ndarray, eps: float) -> tuple[float, float, float]:
    """Sum over non-pad tokens of -sum_k q_k log p_k with q = (1 - eps) one_hot + eps / V; and of -log p_label."""
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    one_hot = np.eye(VOCAB)[labels]
    q = (1.0 - eps) * one_hot + eps / VOCAB
    weights = (labels != PAD_ID).astype(np.float64)
    loss = -(q * log_p).sum(axis=-1)
    nll = -(one_hot * log_p).sum(axis=-1)
    return float((loss * weights).sum()), float((nll * weights).sum()), float(weights.sum())


def example(seed: int):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 3.0, size=(3, 6, VOCAB)).astype(np.float32)
    labels = rng.integers(1, VOCAB, size=(3, 6)).astype(np.int32)
    labels[0, 4:] = PAD_ID
    labels[2, 1:] = PAD_ID
    logits[0, 4:] = 1e4  # huge logits at padded positions must not leak into the sums
    return logits, labels


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_matches_numpy_reference(eps):
    logits, labels = example(0)
    got = smoothed_cross_entropy(tf.constant(logits), tf.constant(labels), label_smoothing=eps)
    want = reference(logits, labels, eps)
    np.testing.assert_allclose([float(x) for x in got], want, rtol=1e-5)
    assert float(got[2]) == 3 * 6 - 2 - 5


def test_padding_positions_do_not_count():
    logits, labels = example(1)
    base = [float(x) for x in smoothed_cross_entropy(logits, labels, label_smoothing=0.1)]
    changed = logits.copy()
    changed[labels == PAD_ID] = np.random.default_rng(2).normal(size=changed[labels == PAD_ID].shape)
    again = [float(x) for x in smoothed_cross_entropy(changed, labels, label_smoothing=0.1)]
    assert again == base


def test_smoothing_is_the_uniform_convention():
    """eps = 1 leaves only the uniform part: the mean of -log p over the vocabulary, per token."""
    logits, labels = example(3)
    loss, _, tokens = smoothed_cross_entropy(logits, labels, label_smoothing=1.0)
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    np.testing.assert_allclose(float(loss), -(log_p.mean(-1) * (labels != PAD_ID)).sum(), rtol=1e-5)
    assert float(tokens) == (labels != PAD_ID).sum()


def test_bfloat16_logits_are_computed_in_float32():
    logits, labels = example(4)
    low = tf.cast(tf.constant(logits), tf.bfloat16)
    got = smoothed_cross_entropy(low, tf.constant(labels), label_smoothing=0.1)
    assert all(x.dtype == tf.float32 for x in got)
    want = reference(tf.cast(low, tf.float32).numpy(), labels, 0.1)  # same inputs, float64 reference
    np.testing.assert_allclose([float(x) for x in got], want, rtol=1e-5)


def numpy_gradients(logits: np.ndarray, labels: np.ndarray, eps: float, d_loss, d_nll) -> np.ndarray:
    """d/dlogits of sum(d_loss * loss + d_nll * nll): (softmax - q) d_loss + (softmax - one_hot) d_nll."""
    logits = logits.astype(np.float64)
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    one_hot = np.eye(VOCAB)[labels]
    q = (1.0 - eps) * one_hot + eps / VOCAB
    return (p - q) * d_loss[:, None] + (p - one_hot) * d_nll[:, None]


def _path(request, name):
    """A function of no arguments giving the context the loss is traced in: none (TensorFlow's ops) or `fused`
    with the C++ kernels' library (which a machine without a C++ compiler skips)."""
    if name != "kernels":
        return contextlib.nullcontext
    library = request.getfixturevalue("ops")
    return lambda: fused(library)


@pytest.fixture(params=["tensorflow", "kernels"])
def loss_path(request):
    return _path(request, request.param)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("outputs", ["loss", "nll", "both"])
@pytest.mark.parametrize("path", ["tensorflow", "xla", "kernels"])  # the kernels are never traced under XLA
def test_token_cross_entropy_values_and_written_out_gradient_match_numpy(eps, outputs, path, request):
    loss_path, jit_compile = _path(request, path), path == "xla"
    logits, labels = example(5)
    logits, labels = logits.reshape(-1, VOCAB), labels.reshape(-1)  # every position counts here
    rng = np.random.default_rng(6)
    d_loss = rng.normal(size=labels.shape) * (outputs != "nll")
    d_nll = rng.normal(size=labels.shape) * (outputs != "loss")

    @tf.function(jit_compile=jit_compile)
    def run(x):
        with tf.GradientTape() as tape, loss_path():
            tape.watch(x)
            loss, nll = token_cross_entropy(x, tf.constant(labels), label_smoothing=eps)
            total = 0.0
            if outputs != "nll":  # an output left out gets a zero upstream gradient from TF
                total += tf.reduce_sum(loss * d_loss.astype(np.float32))
            if outputs != "loss":
                total += tf.reduce_sum(nll * d_nll.astype(np.float32))
        return loss, nll, tape.gradient(total, x)

    loss, nll, grad = run(tf.constant(logits))
    np.testing.assert_allclose(grad.numpy(), numpy_gradients(logits, labels, eps, d_loss, d_nll), atol=1e-5)
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    one_hot = np.eye(VOCAB)[labels]
    np.testing.assert_allclose(nll.numpy(), -(one_hot * log_p).sum(-1), rtol=1e-5)
    q = (1.0 - eps) * one_hot + eps / VOCAB
    # The smoothing term takes the mean of the logits themselves: float32 rounding relative to their magnitude
    # (rows 4 and 5 are all 1e4; the others under 10).
    rounding = 2 * np.finfo(np.float32).eps * np.abs(logits).max(-1)
    want = -(q * log_p).sum(-1)
    assert np.all(np.abs(loss.numpy() - want) <= 1e-5 * np.abs(want) + rounding)


def test_summed_padded_loss_equals_the_loss_of_the_real_tokens_alone():
    """The training step's two paths: all positions with pad weights, and the real tokens gathered first."""
    logits, labels = example(7)
    padded = smoothed_cross_entropy(tf.constant(logits), tf.constant(labels), label_smoothing=0.1)
    real = labels != PAD_ID
    loss, nll = token_cross_entropy(tf.constant(logits[real]), tf.constant(labels[real]), label_smoothing=0.1)
    np.testing.assert_allclose(
        [float(x) for x in padded],
        [float(tf.reduce_sum(loss)), float(tf.reduce_sum(nll)), real.sum()],
        rtol=1e-6,
    )


def test_negative_log_likelihood_stays_exact_where_the_label_probability_underflows(loss_path):
    """A label 200 below the top logit has p = e^-200, 0 in float32: -log p must still be 200 (not inf), and the
    smoothed loss its float64 value, also with every logit shifted by 10,000."""
    logits = np.zeros((2, VOCAB), np.float32)
    logits[:, 3] = 200.0
    labels = np.array([5, 3], np.int32)
    for shift in (0.0, 1e4):
        with loss_path():
            loss, nll = token_cross_entropy(
                tf.constant(logits + shift), tf.constant(labels), label_smoothing=0.1
            )
        log_z = 200.0 + np.log1p((VOCAB - 1) * np.exp(-200.0))
        np.testing.assert_allclose(nll.numpy(), [log_z, log_z - 200.0], atol=1e-6 if shift == 0 else 2e-3)
        uniform = log_z - 200.0 / VOCAB
        np.testing.assert_allclose(loss.numpy(), 0.9 * nll.numpy() + 0.1 * uniform, rtol=1e-5)
