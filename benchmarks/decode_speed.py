"""Decoding throughput: greedy and beam search, with the KV cache or a full decoder pass per step, XLA on and off.

The model is the trained one of a run directory when it exists (`Translator.from_run_dir`), else an untrained model
of the config's size (`"trained": false`: it rarely emits EOS, so every sentence runs to its length limit, the
worst case). Sentences are the config's test split (Multi30k test2016: 1,000), in corpus order; the no-cache
settings, quadratic in the output length, use the first `no_cache_sentences` of them.

Every setting is warmed up first: one batch of each padded shape the timed run will use is translated, so the timed
run compiles nothing (`traces_in_timed_run` reports it, it should be 0). Target tokens are the subwords of the
hypotheses (re-tokenized, EOS not counted).

Per row: throughput (`sentences_per_sec`, `tokens_per_sec`), `compile_seconds` (the warm-up minus a second, compiled
run of the same batches: tracing, graph optimisation and XLA compilation), `peak_memory_mb` of the timed run
(`benchmarks.memory.measure_peak`: the peak RSS on a CPU) and, for streaming use (`translate.py` one line at a time),
`latency_ms_p50` / `latency_ms_p95` over `latency_sentences` sentences translated one by one (after their shapes
were warmed up too); `bleu` (sacreBLEU, `nmt.scores.score_corpus`, against the test references) for the rows
that decode the whole sentence set (the cached ones). Every row names its `engine` ("tensorflow" here),
`compute_type`, `beam_size`, `alpha` (None for greedy) and `patience` (None: our beam search stops exactly). The
cached rows and their hypotheses are kept in `context.results["decode"]` for `benchmarks.decode_engines` (the
CTranslate2 and TensorFlow int8 rows, compared with these).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import keras
import numpy as np

from benchmarks.common import BenchContext, rounded, timed
from benchmarks.memory import measure_peak
from nmt.cli import onednn_enabled

log = logging.getLogger("benchmarks")


def load_translator(context: BenchContext, run_dir: str | Path | None):
    """(model, tokenizer, config, weights): the run directory's when it has weights, else an untrained model.

    `weights` is the checkpoint prefix the model was restored from; None for the untrained model (built with the
    config's seed, so two calls give the same weights).
    """
    from nmt.run_dir import RunDir
    from nmt.translator import Translator
    from transformer.model import build_model

    keras.mixed_precision.set_global_policy("float32")
    if run_dir is not None and RunDir(run_dir).exists():
        try:
            translator = Translator.from_run_dir(run_dir)
            return translator.model, translator.tokenizer, translator.config, translator.weights
        except Exception as err:  # noqa: BLE001 - e.g. a run still without weights: fall back, and say so
            log.warning("decode bench: cannot load %s (%s); using an untrained model", run_dir, err)
    cfg = context.config
    keras.utils.set_random_seed(cfg.train.seed)
    tokenizer = context.tokenizer
    model = build_model(cfg.model, tokenizer.source_vocab_size, tokenizer.target_vocab_size)
    return model, tokenizer, cfg, None


def test_set(config, sentences: int = 0) -> tuple[list[str], list[str]]:
    """(sources, references) of the config's test split in corpus order, blank sources left out; first `sentences`."""
    from data.corpus import load_text_pairs

    sources, targets = load_text_pairs(config.data, config.data.test_split)
    pairs = [(s, t) for s, t in zip(sources, targets) if s.strip()]
    pairs = pairs[:sentences] if sentences else pairs
    return [s for s, _ in pairs], [t for _, t in pairs]


def bleu(
    hypotheses: list[str], references: list[str], target_language: str = "", lowercase: bool = False
) -> float:
    """Corpus BLEU (sacreBLEU, the signature `evaluate.py` reports; case-insensitive for a `data.lowercase` run),
    rounded to 2 digits."""
    from nmt.scores import score_corpus

    return round(score_corpus(hypotheses, references, target_language, lowercase)["bleu"], 2)


def row_name(
    engine: str, compute_type: str, beam: int, *, xla: bool = False, patience=None, cache: bool = True
) -> str:
    """A row's short name, e.g. "tensorflow float32 beam 4 xla", "ctranslate2 int8_float32 beam 4 patience 2",
    "tensorflow float32 beam 2 no cache" (rows are looked up by name: before 2026-12-07d the uncached row had the
    cached one's)."""
    parts = [engine, compute_type, "greedy" if beam == 1 else f"beam {beam}"]
    parts += ["xla"] if xla else []
    parts += [] if cache else ["no cache"]
    parts += [f"patience {patience:g}"] if patience is not None else []
    return " ".join(parts)


def warmup_groups(translator, lines: list[str], beam: int, num_lines: int | None = None) -> list[list[str]]:
    """One group of lines per padded batch shape that `translator.translate(lines)` will decode.

    Uses `Translator.batches` (the batching of `translate`) and pads like `translate`: under XLA
    (`uses_xla(num_lines, beam)`, default `len(lines)`) lengths (+ EOS) rounded up to `length_edges` and batch sizes
    to `batch_edges`. Without XLA every dimension is dynamic (one trace), so a group is the batch's longest line
    alone, one per source length.
    """
    keep = translator.max_source_length - 1
    lengths = [min(len(ids), keep) for ids in translator.encode(lines)]
    xla = translator.uses_xla(len(lines) if num_lines is None else num_lines, beam)
    groups = {}
    for batch in translator.batches(lengths, xla=xla):
        key = translator.padded_length(lengths[batch[0]], xla=xla)
        if xla:
            edges = translator.batch_edges
            key = (key, edges[min(sum(e < len(batch) for e in edges), len(edges) - 1)])
        groups.setdefault(key, [lines[i] for i in (batch if xla else batch[:1])])
    return list(groups.values())


def _latencies(translator, lines: list[str], beam: int) -> list[float]:
    """Seconds to translate each line alone (streaming use), after one line of each padded length was translated."""
    for group in warmup_groups(translator, lines, beam, num_lines=1):
        for line in group[:1]:
            translator.translate([line], beam_size=beam)
    return [timed(lambda line=line: translator.translate([line], beam_size=beam))[0] for line in lines]


def target_tokens(tokenizer, hypotheses: list[str]) -> int:
    """Subwords of the hypotheses, re-tokenized with the target tokenizer (EOS not counted)."""
    return sum(len(ids) for ids in tokenizer.tokenize_target(hypotheses).to_list()) if hypotheses else 0


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _time_setting(translator, lines: list[str], beam: int, use_cache: bool, sampling=None) -> dict:
    """Warm up, then translate `lines` once: seconds, compile seconds, traces, tokens, peak MB, hypotheses."""
    options = {} if sampling is None else {"sampling": sampling}

    def translate(batch):
        return translator.translate(batch, beam_size=beam, use_cache=use_cache, **options)

    groups = warmup_groups(translator, lines, beam)
    warmup, _ = timed(lambda: [translate(group) for group in groups])
    rerun, _ = timed(lambda: [translate(group) for group in groups])
    traces = translator.num_traces
    start = time.perf_counter()
    peak_mb, method, hypotheses = measure_peak(lambda: translate(lines))
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "compile_seconds": max(0.0, warmup - rerun),
        "warmup_seconds": warmup,
        "traces": translator.num_traces - traces,
        "tokens": target_tokens(translator.tokenizer, hypotheses),
        "peak_memory_mb": peak_mb,
        "peak_memory_method": method,
        "hypotheses": hypotheses,
    }


def measure_tensorflow(
    translator,
    lines: list[str],
    references: list[str] | None,
    beam: int,
    *,
    use_cache: bool = True,
    latency_sentences: int = 50,
    compute_type: str = "float32",
    sampling=None,
) -> tuple[dict, list[str]]:
    """(record, hypotheses) of one TensorFlow setting; `bleu` when `references` (one per line) are given;
    `sampling` (`common.sampling.Sampling`, beam 1): draws instead of greedy search (no latency rows)."""
    timing = _time_setting(translator, lines, beam, use_cache, sampling)
    seconds, tokens = timing["seconds"], timing["tokens"]
    latencies = _latencies(translator, lines[:latency_sentences], beam) if use_cache else []
    language = translator.config.data.target if translator.config is not None else ""
    lowercase = translator.config is not None and translator.config.data.lowercase
    xla = translator.uses_xla(len(lines), beam)
    record = {
        "bench": "decode",
        "row": row_name("tensorflow", compute_type, beam, xla=xla, cache=use_cache),
        "engine": "tensorflow",
        "compute_type": compute_type,
        "search": "greedy" if beam == 1 else "beam",
        "beam_size": beam,
        "alpha": translator.eval_config.alpha if beam > 1 else None,
        "patience": None,
        "sampling": None if sampling is None else dataclasses.asdict(sampling),
        "cache": use_cache,
        "xla": xla,
        "sentences": len(lines),
        "sentences_per_sec": rounded(len(lines) / seconds, 2),
        "tokens_per_sec": rounded(tokens / seconds),
        "target_tokens": tokens,
        "seconds": round(seconds, 2),
        "compile_seconds": round(timing["compile_seconds"], 2),
        "warmup_seconds": round(timing["warmup_seconds"], 2),
        "traces_in_timed_run": timing["traces"],
        "latency_ms_p50": rounded(1e3 * percentile(latencies, 50)) if latencies else None,
        "latency_ms_p95": rounded(1e3 * percentile(latencies, 95)) if latencies else None,
        "latency_sentences": len(latencies),
        "peak_memory_mb": rounded(timing["peak_memory_mb"]),
        "peak_memory_method": timing["peak_memory_method"],
        "bleu": bleu(timing["hypotheses"], references, language, lowercase)
        if references is not None
        else None,
        "precision": "float32",
        "onednn": onednn_enabled(),  # bench.py without train rows decodes like the CLIs: Eigen kernels
        "batch_size": translator.batch_size,
        "batch_tokens": translator.batch_tokens,
    }
    return record, timing["hypotheses"]


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
    latency_sentences: int = 50,
    ensemble: int = 2,
    sampling: bool = True,
) -> list[dict]:
    """Emits one `{"bench": "decode", ...}` record per (search, cache, XLA) setting, then the ensemble and sampling
    rows; returns them.

    Args:
      sentences: test sentences for the cached settings (0 = all).
      no_cache_sentences: test sentences for the no-cache settings (0 = as many as the cached ones).
      latency_sentences: sentences translated one by one for the latency percentiles (cached settings; 0 = none).
      ensemble: members of the ensemble rows (`ensemble_rows`; 0 = none).
      sampling: the sampling row (`sampling_rows`).
    """

    model, tokenizer, config, weights = load_translator(context, run_dir)
    lines, references = test_set(config, sentences)
    described = {
        "trained": weights is not None,
        "model": str(run_dir) if weights is not None else f"untrained d_model={config.model.d_model}",
    }
    records = []
    kept = context.results.setdefault("decode", [])
    cached = []  # (record, hypotheses) of this call's cached rows
    for xla in xla_settings:
        translator = _translator(model, tokenizer, config, xla)
        for beam in beams:
            for use_cache in caches:
                subset = lines if use_cache or not no_cache_sentences else lines[:no_cache_sentences]
                whole = len(subset) == len(lines)
                record, hypotheses = measure_tensorflow(
                    translator,
                    subset,
                    references if whole else None,
                    beam,
                    use_cache=use_cache,
                    latency_sentences=latency_sentences if use_cache else 0,
                )
                records.append(emit({**record, **described}))
                if use_cache:
                    kept.append((records[-1], hypotheses))
                    cached.append((records[-1], hypotheses))
    if ensemble:
        records += ensemble_rows(
            model, tokenizer, config, lines, references, cached, emit, ensemble, described
        )
    if sampling:
        records += sampling_rows(model, tokenizer, config, lines, references, cached, emit, described)
    return records


def sampling_rows(model, tokenizer, config, lines, references, cached, emit, described) -> list[dict]:
    """`translate.py --sampling-topk 10`'s cost (top-k 10, as Edunov et al. 2018 back-translate), cached, without
    XLA, against greedy search of the same sentences in the same run (`tokens_per_sec_ratio`, `seconds_ratio`);
    its BLEU is a sample's, below greedy search's. No row without a greedy one."""
    from common.sampling import Sampling

    greedy = [r for r, _ in cached if not r["xla"] and r["beam_size"] == 1]
    if not greedy:
        return []
    translator = _translator(model, tokenizer, config)
    sampling = Sampling(topk=10, seed=config.train.seed)
    record, _ = measure_tensorflow(translator, lines, references, 1, latency_sentences=0, sampling=sampling)
    record.update(
        bench="decode_sampling",
        row=f"{record['row']} sampling top-k 10",
        tokens_per_sec_ratio=_ratio(record["tokens_per_sec"], greedy[0]["tokens_per_sec"]),
        seconds_ratio=_ratio(greedy[0]["sentences_per_sec"], record["sentences_per_sec"]),
    )
    return [emit({**record, **described})]


def ensemble_rows(
    model, tokenizer, config, lines, references, cached, emit, members, described
) -> list[dict]:
    """`translate.py --ensemble`'s cost: the model `members` times over as one `transformer.ensemble.Ensemble`, per
    beam, cached, without XLA, on the sentences of the cached rows.

    Members that are the same model do the work of distinct ones of its size (each encodes the source and keeps its
    own cache; the mean is taken at every step), with one set of weights in the CPU caches (distinct models can be
    slower), and the mean of equal distributions is that distribution, so the translations are the single model's
    but for rounding. Each row gives `tokens_per_sec_ratio` and `seconds_ratio` against the single model's row of
    the same search (same run), and `same_hypotheses`, the fraction of translations equal to that row's.
    """
    from transformer.ensemble import Ensemble

    singles = {r["beam_size"]: (r, h) for r, h in cached if not r["xla"]}
    if not singles:
        log.info(
            "decode bench: no ensemble rows (they compare with the cached rows without XLA, and none ran)"
        )
        return []
    translator = _translator(Ensemble([model] * members), tokenizer, config)
    records = []
    for beam, (single, single_hypotheses) in singles.items():
        record, hypotheses = measure_tensorflow(translator, lines, references, beam, latency_sentences=0)
        record.update(
            bench="decode_ensemble",
            row=f"{record['row']} ensemble of {members}",
            ensemble=members,
            tokens_per_sec_ratio=_ratio(record["tokens_per_sec"], single["tokens_per_sec"]),
            seconds_ratio=_ratio(single["sentences_per_sec"], record["sentences_per_sec"]),  # same sentences
            same_hypotheses=round(sum(a == b for a, b in zip(hypotheses, single_hypotheses)) / len(lines), 4),
        )
        records.append(emit({**record, **described}))
    return records


def _translator(model, tokenizer, config, xla: bool = False):
    """A `Translator` around `model` with the config's eval settings, `config` attached (for BLEU's language)."""
    from nmt.translator import Translator

    translator = Translator(model, tokenizer, config.eval, max_source_length=config.model.max_length, xla=xla)
    translator.config = config
    return translator


def _ratio(a: float | None, b: float | None) -> float | None:
    """a / b to 3 digits; None when either is missing or b is 0."""
    return rounded(a / b, 3) if a is not None and b else None
