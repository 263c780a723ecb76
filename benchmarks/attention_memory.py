"""Time and peak memory of one self-attention layer, full vs chunked vs local, as the sequence grows.

One `transformer.multi_head.MultiHeadAttention` (projections included, no mask), batch 1, float32, forward pass in a
`tf.function`, for each length. Full attention materialises ``(heads, L, L)`` float32 scores (and the softmax of
them), so its memory grows as ``L^2``: lengths whose score tensor alone exceeds the memory budget are reported as
skipped instead of run. Chunked attention (Rabe & Staats, 2021) keeps ``(heads, chunk, chunk)`` blocks and a running
softmax; local attention keeps a band of ``3 * window`` keys per query. Both are linear in ``L`` in memory.

Each (variant, length) runs in a Python process of its own (`python -m benchmarks.attention_memory`): one call on
a short input first (TensorFlow's one-off start-up allocations), then the length's function traced without running
(`get_concrete_function`), then the peak memory of its first run (`benchmarks.memory.measure_peak`: the peak RSS on a
CPU), then the timed calls. Memory a process freed is kept for reuse (by malloc, or by oneDNN's pool), so a later
call, or a point after a larger one in the same process (and after the train and decode benchmarks), shows little
of it: full attention at L=1024 grew RSS by 31 MB on its first run and was recorded as 1 MB on its second.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.common import median, rounded, timed

log = logging.getLogger("benchmarks")

VARIANTS = ("full", "chunked", "local")
LENGTHS = (256, 512, 1024, 2048, 4096, 8192)
ROOT = Path(__file__).resolve().parents[1]
WARMUP_LENGTH = 8  # the start-up call's length: its own trace, kilobytes of tensors
TIMEOUT = 1800  # seconds per point: only against a hang


def score_megabytes(num_heads: int, length: int, batch: int = 1) -> float:
    """Size of the float32 ``(batch, heads, L, L)`` score tensor of full attention."""
    return batch * num_heads * length * length * 4 / 2**20


def measure_point(
    variant: str, length: int, *, d_model: int, num_heads: int, chunk_size: int, window: int, repeats: int
) -> dict:
    """In this process (a fresh one: see the module docstring): {"first_call_seconds" (trace + first run),
    "peak_mb" (of the first run), "memory_method", "seconds" (the timed calls)}."""
    import tensorflow as tf

    from benchmarks.memory import measure_peak
    from transformer.multi_head import MultiHeadAttention

    layer = MultiHeadAttention(
        d_model=d_model, num_heads=num_heads, attention=variant, chunk_size=chunk_size, window=window
    )
    forward = tf.function(lambda x: layer(x, x, x)[0])
    forward(tf.random.normal((1, WARMUP_LENGTH, d_model))).numpy()
    x = tf.random.normal((1, length, d_model))
    trace_seconds, _ = timed(lambda: forward.get_concrete_function(x))

    def call():
        return forward(x).numpy()

    run_seconds, (peak_mb, method, _) = timed(lambda: measure_peak(call))
    seconds = [timed(call)[0] for _ in range(max(repeats - 1, 1))]
    return {
        "first_call_seconds": trace_seconds + run_seconds,
        "peak_mb": peak_mb,
        "memory_method": method,
        "seconds": seconds,
    }


def _measure_in_child(variant: str, length: int, **settings) -> dict:
    """`measure_point` in a new Python process; its result."""
    args = [
        sys.executable,
        "-m",
        "benchmarks.attention_memory",
        "--variant",
        variant,
        "--length",
        str(length),
    ]
    for name, value in settings.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    try:
        done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise PointFailed(f"no result within {TIMEOUT} s") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PointFailed(f"exit {done.returncode}: {last[:300]}")
    return json.loads(lines[-1])


class PointFailed(RuntimeError):
    """The process measuring one point failed (out of memory, killed, timed out): recorded, the others go on."""


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
    records = []
    settings = dict(
        d_model=d_model, num_heads=num_heads, chunk_size=chunk_size, window=window, repeats=repeats
    )
    for variant in variants:
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
            try:
                point = _measure_in_child(variant, length, **settings)
            except PointFailed as err:
                log.warning("attention %s at %d tokens: %s", variant, length, err)
                record.update(status=f"failed: {err}", seconds=None, peak_memory_mb=None)
                records.append(emit(record))
                continue
            seconds = point["seconds"]
            record.update(
                status="ok",
                seconds=round(median(seconds), 4),
                tokens_per_sec=rounded(length / median(seconds)),
                peak_memory_mb=rounded(point["peak_mb"], 1),
                memory_method=point["memory_method"],
                memory_measured="first run, own process",
                first_call_seconds=round(point["first_call_seconds"], 3),
            )
            log.info(
                "attention %s L=%d: %.3f s, %.0f MB", variant, length, record["seconds"], point["peak_mb"]
            )
            records.append(emit(record))
    return records


def main(argv=None) -> int:
    """One point, measured in this process: its `measure_point` result as one JSON line on stdout."""
    parser = argparse.ArgumentParser(description=measure_point.__doc__)
    parser.add_argument("--variant", choices=VARIANTS, required=True)
    for name in ("length", "d-model", "num-heads", "chunk-size", "window", "repeats"):
        parser.add_argument(f"--{name}", type=int, required=True)
    args = parser.parse_args(argv)
    point = measure_point(
        args.variant, args.length, d_model=args.d_model, num_heads=args.num_heads,
        chunk_size=args.chunk_size, window=args.window, repeats=args.repeats,
    )  # fmt: skip
    print(json.dumps(point), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
