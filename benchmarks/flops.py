"""Model FLOPs of a training step, and the matmul peak they are compared with (model FLOPs utilisation, MFU).

Training FLOPs per batch (Kaplan et al., 2020; Chowdhery et al., 2022, appendix B):

    6 * N * target_tokens  +  attention FLOPs

- ``N``: non-embedding parameters, including the output projection (``V * d_model`` when tied to the embedding):
  every weight does one multiply-add per token forward and two backward. Counted per target token, as the brief
  asks (the encoder runs on source tokens, about as many on Multi30k).
- attention: ``QK^T`` and ``AV`` cost ``4 * Lq * Lk * d_model`` forward per attention layer and sequence, times 3
  with the backward pass, on the non-padding lengths of each pair; encoder self ``(S, S)``, decoder self ``(T, T)``
  (the full square, as computed) and cross ``(T, S)``.

Padding and the softmax / LayerNorm / optimizer arithmetic are not counted: MFU measures useful matmul work.
"""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

from transformer.vocab import PAD_ID

COMPUTE_DTYPES = {"float32": tf.float32, "mixed_bfloat16": tf.bfloat16, "mixed_float16": tf.float16}


def count_parameters(model) -> int:
    return int(sum(np.prod(v.shape) for v in model.trainable_variables))


def embedding_parameters(model) -> int:
    """Parameters of embedding tables (variables whose path contains "embedding"), each counted once."""
    return int(sum(np.prod(v.shape) for v in model.trainable_variables if "embedding" in v.path))


def non_embedding_parameters(model, *, target_vocab_size: int, d_model: int, tie_output: bool) -> int:
    """Parameters doing per-token matmul work: all but the embedding tables, plus a tied output projection."""
    tied = target_vocab_size * d_model if tie_output else 0
    return count_parameters(model) - embedding_parameters(model) + tied


def attention_flops(batch: dict, *, d_model: int, num_layers: int) -> float:
    """Forward + backward FLOPs of ``QK^T`` and ``AV`` over one batch (non-padding lengths)."""
    source = np.count_nonzero(np.asarray(batch["source"]) != PAD_ID, axis=1).astype(np.float64)  # (B,)
    target = np.count_nonzero(np.asarray(batch["target_in"]) != PAD_ID, axis=1).astype(np.float64)
    per_layer = 4.0 * d_model * (source**2 + target**2 + target * source)  # enc self + dec self + cross
    return 3.0 * num_layers * float(per_layer.sum())


def target_tokens(batch: dict) -> int:
    return int(np.count_nonzero(np.asarray(batch["target_out"]) != PAD_ID))


def train_flops(batches: list[dict], *, non_embedding: int, d_model: int, num_layers: int) -> float:
    """Model FLOPs of one training pass over `batches` (see the module docstring)."""
    return sum(
        6.0 * non_embedding * target_tokens(b) + attention_flops(b, d_model=d_model, num_layers=num_layers)
        for b in batches
    )


def matmul_peak_gflops(precision: str, *, size: int = 2048, repeats: int = 5) -> float:
    """Best GFLOP/s of a ``(size, size) @ (size, size)`` matmul in the compute dtype of `precision`.

    The best of `repeats` timed calls after one warm-up call, in a `tf.function` (no XLA).
    """
    dtype = COMPUTE_DTYPES[precision]
    a = tf.cast(tf.random.normal((size, size)), dtype)
    b = tf.cast(tf.random.normal((size, size)), dtype)

    @tf.function
    def matmul(x, y):
        return tf.reduce_sum(tf.cast(tf.matmul(x, y)[:1, :1], tf.float32))  # a tiny output: time the matmul

    matmul(a, b).numpy()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).numpy()
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best / 1e9
