"""Time and peak memory of one self-attention layer, full vs chunked vs local, as the sequence grows.

One `transformer.multi_head.MultiHeadAttention` (projections included, no mask), batch 1, float32, forward pass in a
`tf.function`, for each length. Full attention materialises ``(heads, L, L)`` float32 scores (and the softmax of
them), so its memory grows as ``L^2``: lengths whose score tensor alone exceeds the memory budget are reported as
skipped instead of run. Chunked attention (Rabe & Staats, 2021) keeps ``(heads, chunk, chunk)`` blocks and a running
softmax; local attention keeps a band of ``3 * window`` keys per query. Both are linear in ``L`` in memory.
"""

from __future__ import annotations

import logging

import tensorflow as tf

from benchmarks.common import median, rounded, timed
from benchmarks.memory import measure_peak

log = logging.getLogger("benchmarks")

VARIANTS = ("full", "chunked", "local")
LENGTHS = (256, 512, 1024, 2048, 4096, 8192)


def score_megabytes(num_heads: int, length: int, batch: int = 1) -> float:
    """Size of the float32 ``(batch, heads, L, L)`` score tensor of full attention."""
    return batch * num_heads * length * length * 4 / 2**20


def _measure(forward, length: int, d_model: int, repeats: int) -> tuple[float, float, str, list[float]]:
    """(first-call seconds, peak MB, memory method, timed seconds) of `forward` on a random (1, L, d) input."""
    x = tf.random.normal((1, length, d_model))

    def call():
        return forward(x).numpy()

    first, _ = timed(call)  # trace + first run
    peak_mb, method, _ = measure_peak(call)
    seconds = [timed(call)[0] for _ in range(max(repeats - 1, 1))]
    return first, peak_mb, method, seconds


def bench_attention(
    emit,
    *,
    lengths=LENGTHS,
    variants=VARIANTS,
    d_model: int = 256,
    num_heads: int = 4,
    chunk_size: int = 256,
    window: int = 64,
    memory_budget_mb: float = 512.0,
    repeats: int = 3,
) -> list[dict]:
    """Emits one `{"bench": "attention", ...}` record per (variant, length); returns them."""
    from transformer.multi_head import MultiHeadAttention

    records = []
    for variant in variants:
        layer = MultiHeadAttention(
            d_model=d_model, num_heads=num_heads, attention=variant, chunk_size=chunk_size, window=window
        )
        forward = tf.function(lambda x, layer=layer: layer(x, x, x)[0])
        for length in lengths:
            scores_mb = score_megabytes(num_heads, length)
            record = {
                "bench": "attention",
                "variant": variant,
                "length": length,
                "batch": 1,
                "d_model": d_model,
                "num_heads": num_heads,
                "chunk_size": chunk_size if variant == "chunked" else None,
                "window": window if variant == "local" else None,
                "full_scores_mb": rounded(scores_mb, 1),
                "memory_budget_mb": memory_budget_mb,
            }
            if variant == "full" and scores_mb > memory_budget_mb:
                record.update(status="skipped: exceeds budget", seconds=None, peak_memory_mb=None)
                records.append(emit(record))
                continue
            compile_seconds, peak_mb, method, seconds = _measure(forward, length, d_model, repeats)
            record.update(
                status="ok",
                seconds=round(median(seconds), 4),
                tokens_per_sec=rounded(length / median(seconds)),
                peak_memory_mb=rounded(peak_mb, 1),
                memory_method=method,
                first_call_seconds=round(compile_seconds, 3),
            )
            log.info("attention %s L=%d: %.3f s, %.0f MB", variant, length, record["seconds"], peak_mb)
            records.append(emit(record))
    return records
