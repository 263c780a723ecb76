"""Decoding throughput: greedy and beam search, with the KV cache or a full decoder pass per step, XLA on and off.

The model is the trained one of a run directory when it exists (`Translator.from_run_dir`), else an untrained model
of the config's size (`"trained": false`: it rarely emits EOS, so every sentence runs to its length limit, the
worst case). Sentences are the config's test split (Multi30k test2016: 1,000), in corpus order; the no-cache
settings, quadratic in the output length, use the first `no_cache_sentences` of them.

Every setting is warmed up first: one batch of each padded shape the timed run will use is translated, so the timed
run compiles nothing (`traces_in_timed_run` reports it, it should be 0). Target tokens are the subwords of the
hypotheses (re-tokenized, EOS not counted).
"""

from __future__ import annotations

import bisect
import logging
from pathlib import Path

import keras

from nmt.bench.common import BenchContext, rounded, timed

log = logging.getLogger("nmt.bench")


def load_translator(context: BenchContext, run_dir: str | Path | None):
    """(model, tokenizer, config, trained): the run directory's when it has weights, else an untrained model."""
    from nmt.run_dir import RunDir
    from nmt.translator import Translator
    from transformer.model import build_model

    keras.mixed_precision.set_global_policy("float32")
    if run_dir is not None and RunDir(run_dir).exists():
        try:
            translator = Translator.from_run_dir(run_dir)
            return translator.model, translator.tokenizer, translator.config, True
        except Exception as err:  # noqa: BLE001 - e.g. a run still without weights: fall back, and say so
            log.warning("decode bench: cannot load %s (%s); using an untrained model", run_dir, err)
    cfg = context.config
    keras.utils.set_random_seed(cfg.train.seed)
    tokenizer = context.tokenizer
    model = build_model(cfg.model, tokenizer.source_vocab_size, tokenizer.target_vocab_size)
    return model, tokenizer, cfg, False


def _round_up(value: int, edges: list[int]) -> int:
    return edges[min(bisect.bisect_left(edges, value), len(edges) - 1)]


def warmup_groups(translator, lines: list[str]) -> list[list[str]]:
    """One group of lines per padded batch shape that `translator.translate(lines)` will decode.

    Mirrors the batching of `Translator.translate`: longest first, `batch_size` lines per batch, lengths (+ EOS)
    rounded up to `length_edges`, and, with XLA, batch sizes rounded up to `batch_edges`. Without XLA the batch
    dimension is dynamic, so a group is the batch's longest line alone: it traces the same function.
    """
    keep = translator.max_source_length - 1
    lengths = [min(len(ids), keep) for ids in translator.encode(lines)]
    order = sorted(range(len(lines)), key=lambda i: -lengths[i])
    size = translator.batch_size
    groups = {}
    for start in range(0, len(order), size):
        batch = order[start : start + size]
        key = _round_up(lengths[batch[0]] + 1, translator.length_edges)
        if translator.xla:
            key = (key, _round_up(len(batch), translator.batch_edges))
        groups.setdefault(key, [lines[i] for i in (batch if translator.xla else batch[:1])])
    return list(groups.values())


def _time_setting(translator, lines: list[str], beam: int, use_cache: bool) -> tuple[float, float, int, int]:
    """Warm up, then translate `lines` once: (seconds, warm-up seconds, traces in the timed run, target tokens)."""

    def translate(batch):
        return translator.translate(batch, beam_size=beam, use_cache=use_cache)

    warmup, _ = timed(lambda: [translate(group) for group in warmup_groups(translator, lines)])
    traces = translator.num_traces
    seconds, hypotheses = timed(lambda: translate(lines))
    pieces = translator.tokenizer.tokenize_target(hypotheses).to_list() if hypotheses else []
    return seconds, warmup, translator.num_traces - traces, sum(len(ids) for ids in pieces)


def bench_decode(
    context: BenchContext,
    emit,
    *,
    run_dir: str | Path | None = "runs/base",
    sentences: int = 0,
    no_cache_sentences: int = 100,
    beams=(1, 4),
    caches=(True, False),
    xla_settings=(False, True),
) -> list[dict]:
    """Emits one `{"bench": "decode", ...}` record per (search, cache, XLA) setting; returns them.

    Args:
      sentences: test sentences for the cached settings (0 = all).
      no_cache_sentences: test sentences for the no-cache settings (0 = as many as the cached ones).
    """
    from data.corpus import load_text_pairs
    from nmt.translator import Translator

    model, tokenizer, config, trained = load_translator(context, run_dir)
    sources, _ = load_text_pairs(config.data, config.data.test_split)
    lines = [s for s in sources if s.strip()]
    lines = lines[:sentences] if sentences else lines
    records = []
    for xla in xla_settings:
        translator = Translator(
            model, tokenizer, config.eval, max_source_length=config.model.max_length, xla=xla
        )
        for beam in beams:
            for use_cache in caches:
                subset = lines if use_cache or not no_cache_sentences else lines[:no_cache_sentences]
                seconds, warmup, traces, tokens = _time_setting(translator, subset, beam, use_cache)
                record = {
                    "bench": "decode",
                    "search": "greedy" if beam == 1 else "beam",
                    "beam_size": beam,
                    "cache": use_cache,
                    "xla": xla,
                    "sentences": len(subset),
                    "sentences_per_sec": rounded(len(subset) / seconds, 2),
                    "tokens_per_sec": rounded(tokens / seconds),
                    "target_tokens": tokens,
                    "seconds": round(seconds, 2),
                    "warmup_seconds": round(warmup, 2),
                    "traces_in_timed_run": traces,
                    "trained": trained,
                    "model": str(run_dir) if trained else f"untrained d_model={config.model.d_model}",
                    "precision": "float32",
                    "batch_size": translator.batch_size,
                }
                records.append(emit(record))
    return records
