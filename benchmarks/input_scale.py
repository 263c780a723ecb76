"""Preparation and start-up at scale: a synthetic folder corpus of N pairs, prepared, then read (benchmarks only).

For each N: `benchmarks.synthetic_corpus` writes the corpus (reused when present), then two fresh processes each
build `make_train_dataset` for it and take the first batch: the first with an empty cache (cold: tokenizer training
and preparation included), the second with the cache it left (warm). Each process reports its seconds from start
to the first batch and its peak RSS. The record:

    {"bench": "input_scale", "pairs": N, "corpus_bytes": ..., "prepare_pairs_per_sec": ..., "prepare_seconds": ...,
     "prepared_seconds_cold": ..., "cache_bytes": ..., "first_batch_seconds_cold": ...,
     "first_batch_seconds_warm": ..., "peak_rss_mb_cold": ..., "peak_rss_mb_warm": ...}

`prepare_pairs_per_sec` is the train split's preparation rate (pairs read / seconds, tokenizer excluded) from its
manifest; `prepared_seconds_cold` is the cold process's time to a prepared cache (imports, tokenizer training and
preparation); `cache_bytes` excludes the tokenizer. Not measured here (yet): time to the first training step and training tokens/s on this path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.synthetic_corpus import write_corpus

REPO = Path(__file__).resolve().parents[1]
MARK = "INPUT_SCALE "
FIRST_BATCH = """
import json, resource, sys, time
start = float(sys.argv[1])
from data.config import load_data_config
from data.pipeline import make_train_dataset
from data.prepare import cached_tokenizer, prepare
cfg, tree = load_data_config(sys.argv[2], sys.argv[3:])
tokenizer, splits = prepare(cfg, progress=False)
tokenized = time.time()
next(iter(make_train_dataset(cfg, tokenizer, seed=1234)))
print("INPUT_SCALE " + json.dumps({
    "seconds": time.time() - start,
    "prepared_seconds": tokenized - start,
    "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "train_dir": str(splits[cfg.train_split]),
}), file=sys.stderr)
"""


def _first_batch(config: str, overrides: list[str]) -> dict:
    start = time.time()
    done = subprocess.run(
        [sys.executable, "-c", FIRST_BATCH, str(start), config, *overrides],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.startswith(MARK)]
    if done.returncode or not lines:
        raise RuntimeError(f"input_scale child failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(lines[-1][len(MARK) :])


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def bench_input_scale(
    emit, *, config: str, pairs: tuple[int, ...], workdir: str | Path, overrides: list[str] = ()
) -> list[dict]:
    """Emits one `{"bench": "input_scale", ...}` record per corpus size; returns them."""
    workdir = Path(workdir)
    records = []
    for size in pairs:
        corpus = write_corpus(workdir / f"corpus-{size}", size)
        cache_dir = workdir / f"cache-{size}-{time.time_ns()}"  # a fresh cache: the first child is cold
        settings = [
            *overrides,
            "data.dataset=folder", f"data.folder={corpus}", f"data.cache_dir={cache_dir}",
            "data.source=en", "data.target=de", "data.validation_split=validation", "data.test_split=validation",
        ]  # fmt: skip
        cold = _first_batch(config, settings)
        warm = _first_batch(config, settings)
        manifest = json.loads((Path(cold["train_dir"]) / "manifest.json").read_text())
        tokenizer_dirs = list(cache_dir.glob("tokenizer-*"))
        records.append(
            emit(
                {
                    "bench": "input_scale",
                    "pairs": size,
                    "corpus_bytes": _size(corpus),
                    "prepare_pairs_per_sec": round(
                        manifest["drops"]["total"] / max(manifest["seconds"], 1e-9)
                    ),
                    "prepare_seconds": manifest["seconds"],
                    "prepared_seconds_cold": round(cold["prepared_seconds"], 2),
                    "cache_bytes": _size(cache_dir) - sum(_size(d) for d in tokenizer_dirs),
                    "first_batch_seconds_cold": round(cold["seconds"], 2),
                    "first_batch_seconds_warm": round(warm["seconds"], 2),
                    "peak_rss_mb_cold": round(cold["rss_mb"]),
                    "peak_rss_mb_warm": round(warm["rss_mb"]),
                }
            )
        )
        shutil.rmtree(cache_dir, ignore_errors=True)  # a fresh one per run: keep only the (reusable) corpora
    return records
