"""Model FLOPs of a training step, and the matmul peak they are compared with (model FLOPs utilisation, MFU).

Training FLOPs per batch (Kaplan et al., 2020; Chowdhery et al., 2022, appendix B):

    6 * N * target_tokens  +  attention FLOPs

- ``N``: non-embedding parameters, including the output projection (``V * d_model`` when tied to the embedding):
  every weight does one multiply-add per token forward and two backward. A projection shared within a
  self-attention (`model.share_qkv` ``qk`` or ``all``: one ``wq`` layer computes Q, K (and V)) counts once per use,
  as it runs one matmul per use (cross-attention shares none). Counted per target token, as the brief
  asks (the encoder runs on source tokens, about as many on Multi30k).
- attention: ``QK^T`` and ``AV`` cost ``4 * Lq * Lk * d_model`` forward per attention layer and sequence, times 3
  with the backward pass, on the non-padding lengths of each pair; encoder self ``(S, S)``, decoder self ``(T, T)``
  (the full square, as computed) and cross ``(T, S)``.

Padding and the softmax / LayerNorm / optimizer arithmetic are not counted: MFU measures useful matmul work.

The peak (`matmul_peak_gflops`): the best rate over a few matmul shapes (`peak_shapes`: one square, three nearer a
training step's), each the best of several calls. One 2048^3 product, best of 5, was what it used to be: the step's
own matmuls ran faster than it (matmul-only fractions 1.06 and 1.10), so MFU was overstated. The train rows also
take a matmul-only bound that ran faster still as their peak (`row_peak`), and say which one defined it.
"""

from __future__ import annotations

import math
import time

import numpy as np
import tensorflow as tf

from transformer.multi_head import MultiHeadAttention
from transformer.vocab import PAD_ID

COMPUTE_DTYPES = {"float32": tf.float32, "mixed_bfloat16": tf.bfloat16, "mixed_float16": tf.float16}


def count_parameters(model) -> int:
    return int(sum(np.prod(v.shape) for v in model.trainable_variables))


def embedding_parameters(model) -> int:
    """Parameters of embedding tables (variables whose path contains "embedding"), each counted once."""
    return int(sum(np.prod(v.shape) for v in model.trainable_variables if "embedding" in v.path))


def reused_projection_parameters(model) -> int:
    """Parameters of the Q/K/V projections an attention layer uses more than once (`share_qkv`), times their extra
    uses: ``wk`` and ``wv`` are the ``wq`` layer itself when shared, so ``wq``'s kernel and bias (``d^2 + d``) run
    2 (``qk``) or 3 (``all``) times per token but are one variable each."""
    reused = 0
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, MultiHeadAttention):
            extra_uses = sum(projection is layer.wq for projection in (layer.wk, layer.wv))
            reused += extra_uses * count_parameters(layer.wq)
    return reused


def non_embedding_parameters(model, *, target_vocab_size: int, d_model: int, tie_output: bool) -> int:
    """Parameters doing per-token matmul work: all but the embedding tables, plus a tied output projection, with a
    shared Q/K/V projection counted once per use (`reused_projection_parameters`)."""
    tied = target_vocab_size * d_model if tie_output else 0
    return count_parameters(model) - embedding_parameters(model) + tied + reused_projection_parameters(model)


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


def peak_shapes(size: int = 2048) -> list[tuple[int, int, int]]:
    """``(m, k, n)`` of the products the peak is measured on: the square ``size^3`` and three shapes nearer a training
    step's (for 2048: 2048x2048x512, 4096x1024x1024, and 2048x256x1024, the feed-forward of base.yaml's d_model 256
    on 2048 rows); ``m x k`` times ``k x n``."""
    half, quarter, eighth = (max(size // part, 1) for part in (2, 4, 8))
    return [(size, size, size), (size, size, quarter), (2 * size, half, half), (size, eighth, half)]


def matmul_peaks(precision: str, *, size: int = 2048, repeats: int = 8) -> dict[str, float]:
    """GFLOP/s of each `peak_shapes(size)` product in the compute dtype of `precision`, keyed "MxKxN".

    Each the best of `repeats` timed calls after one warm-up call, in a `tf.function` (no XLA); the shapes take
    turns, so a drift in the machine's load reaches all of them.
    """
    dtype = COMPUTE_DTYPES[precision]

    @tf.function
    def matmul(x, y):
        return tf.reduce_sum(tf.cast(tf.matmul(x, y)[:1, :1], tf.float32))  # a tiny output: time the matmul

    operands = {}
    for m, k, n in peak_shapes(size):
        a = tf.cast(tf.random.normal((m, k)), dtype)
        b = tf.cast(tf.random.normal((k, n)), dtype)
        matmul(a, b).numpy()  # traces this shape
        operands[(m, k, n)] = (a, b)
    best = dict.fromkeys(operands, float("inf"))
    for _ in range(repeats):
        for shape, (a, b) in operands.items():
            start = time.perf_counter()
            matmul(a, b).numpy()
            best[shape] = min(best[shape], time.perf_counter() - start)
    return {"x".join(map(str, shape)): 2.0 * math.prod(shape) / best[shape] / 1e9 for shape in operands}


def matmul_peak_gflops(precision: str, *, size: int = 2048, repeats: int = 8) -> float:
    """The measured matmul peak: the best GFLOP/s of `matmul_peaks`."""
    return max(matmul_peaks(precision, size=size, repeats=repeats).values())


def row_peak(measured_gflops: float, matmul_only_gflops: float) -> tuple[float, str]:
    """(peak GFLOP/s, what defined it) of a train row: the measured peak (`matmul_peak_gflops`), or the row's
    matmul-only bound's best rate (`benchmarks.matmul_bound`) where that is higher: matmuls that ran faster than
    the "peak" show it was none, and a utilisation against it would be overstated."""
    if matmul_only_gflops > measured_gflops:
        return matmul_only_gflops, "matmul_only"
    return measured_gflops, "measured"
