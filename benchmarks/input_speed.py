"""The input pipeline alone: one epoch of `make_train_dataset`, against what the training step consumes.

`build_seconds` covers reading the split and tokenizing it into memory (what `make_train_dataset` does before it
returns); `tokens_per_sec` is target tokens (non-padding `target_out`) per second of the epoch itself, which is what
the trainer waits on once training runs. `ratio` = pipeline tokens/s / float32 training tokens/s (our model, XLA
off, from the train benchmark of the same invocation): above 1 the pipeline keeps up.
"""

from __future__ import annotations

import numpy as np

from benchmarks.common import BenchContext, rounded, timed
from transformer.vocab import PAD_ID


def _epoch(dataset) -> tuple[int, int]:
    """(target tokens, batches) of one pass."""
    tokens = batches = 0
    for batch in dataset.as_numpy_iterator():
        tokens += int(np.count_nonzero(batch["target_out"] != PAD_ID))
        batches += 1
    return tokens, batches


def bench_input(context: BenchContext, emit, *, train_tokens_per_sec: float | None = None) -> dict:
    """Emits one `{"bench": "input", ...}` record; returns it."""
    from data.pipeline import make_train_dataset

    cfg = context.config
    tokenizer = context.tokenizer
    build, dataset = timed(lambda: make_train_dataset(cfg.data, tokenizer, seed=cfg.train.seed, repeat=False))
    seconds, (tokens, batches) = timed(lambda: _epoch(dataset))
    rate = tokens / seconds
    train_rate = train_tokens_per_sec or context.results.get("train_tokens_per_sec_float32")
    return emit(
        {
            "bench": "input",
            "tokens_per_sec": rounded(rate),
            "tokens_per_sec_incl_build": rounded(tokens / (seconds + build)),
            "epoch_seconds": round(seconds, 2),
            "build_seconds": round(build, 2),
            "target_tokens": tokens,
            "batches": batches,
            "train_tokens_per_sec": train_rate,
            "ratio": rounded(rate / train_rate, 2) if train_rate else None,
            "train_reference": "float32, XLA off, our model (train bench)" if train_rate else "not measured",
        }
    )
