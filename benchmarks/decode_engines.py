"""The same model in other engines, beside our TensorFlow float32 decode rows: CTranslate2 (float32, int8) and
TensorFlow int8, greedy and beam search, with BLEU and sacreBLEU's paired bootstrap.

Runs after `benchmarks.decode_speed.bench_decode` in the same process and compares with its cached rows (kept in
`context.results["decode"]`): the same test sentences, the same model (the run directory's weights, or the same
untrained model), the same eval settings (alpha, length limits, batch size).

- **CTranslate2**: the model exported with `nmt.ctranslate2_export.export_ctranslate2` into `export_dir/float32` and
  `export_dir/int8` (int8 weights, CTranslate2's ``int8_float32``), reused when `BENCH_KEY` there matches the
  checkpoint (a hash of its files), the tokenizer, the CTranslate2 version and the export code; decoded by
  `nmt.ctranslate2_engine.CTranslate2Translator` (its default threads: `thread_split`; rows record both). Beam search with
  alpha != 0 gets one row per `patiences` value (the engine's default is 2; see its module docstring).
- **TensorFlow int8**: a second copy of the model whose `keras.layers.Dense` layers are quantized by Keras 3
  (``model.quantize("int8")``: int8 weights per output channel, int8 activations per token) and whose tied
  `Embedding` is not (a quantized Embedding returns its int8 table: the tied output projection would give wrong
  logits); decoded by our `Translator` with the XLA settings of the float32 rows. The product does not ship it: the
  row is the evidence.

Each row has the fields of the TensorFlow rows (`engine`, `compute_type`, `beam_size`, `alpha`, `patience`,
sentences/s, target tokens/s, latency p50/p95, peak memory, `bleu`) plus:

- `speedup_vs_tf_beam` / `bleu_delta_vs_tf_beam` against `tf_beam_baseline`, the fastest cached TensorFlow
  float32 row of beam 4 (else the largest beam) of this run, and `speedup_vs_tf_same_search` against the fastest
  TensorFlow float32 row of the same beam (`tf_same_search_baseline`);
- `paired_bootstrap` (`benchmarks.significance.paired_bootstrap`): CTranslate2 float32 against the TensorFlow
  float32 row of the same beam (the fastest), CTranslate2 int8 against CTranslate2 float32 (same beam and
  patience), TensorFlow int8 against TensorFlow float32 (same beam and XLA setting);
- `hypotheses_file`: the row's translations, one per line, under `export_dir/hypotheses/`.

A last `{"bench": "decode_targets"}` record checks the targets of issue 14 on these rows.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

from benchmarks.common import BenchContext, rounded, timed
from benchmarks.decode_speed import (
    bleu,
    load_translator,
    measure_tensorflow,
    percentile,
    row_name,
    target_tokens,
    test_set,
)
from benchmarks.memory import measure_peak
from benchmarks.significance import BOOTSTRAP_SAMPLES, paired_bootstrap

log = logging.getLogger("benchmarks")

ENGINES = ("ctranslate2", "tensorflow_int8")
QUANTIZATIONS = ("float32", "int8")
BENCH_KEY = "bench_key.json"  # in an export directory: what it was exported from (reuse check)


# ------------------------------------------------------------------------------------------------------------------
def _sha256(paths) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(Path(path).name.encode() + b"\0")
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def export_key(weights: str | None, tokenizer, quantization: str) -> dict | None:
    """What an export of checkpoint `weights` depends on; None for an untrained model (always exported anew)."""
    if weights is None:
        return None
    import ctranslate2

    import nmt.ctranslate2_export as export_code
    import nmt.ctranslate2_format as export_format

    prefix = Path(weights)
    return {
        "weights": str(prefix),
        "checkpoint_sha256": _sha256(prefix.parent.glob(prefix.name + ".*")),
        "tokenizer": tokenizer.fingerprint,
        "quantization": quantization,
        "ctranslate2": ctranslate2.__version__,
        # the writer and the format it writes (version, compute types, metadata) decide the export's bytes
        "export_code_sha256": _sha256([export_code.__file__, export_format.__file__]),
    }


def ensure_export(model, tokenizer, config, weights, directory, quantization: str) -> tuple[Path, bool]:
    """(export directory, reused): `directory/quantization`, exported unless it already holds this very export."""
    from nmt.ctranslate2_export import ExportError, export_ctranslate2, read_export_metadata

    path = Path(directory) / quantization
    key = export_key(weights, tokenizer, quantization)
    marker = path / BENCH_KEY
    if key is not None and marker.is_file():
        try:
            read_export_metadata(path)
            if json.loads(marker.read_text(encoding="utf-8")) == key:
                log.info("decode engines: reusing the CTranslate2 export %s", path)
                return path, True
        except (ExportError, ValueError):
            pass
    path.parent.mkdir(parents=True, exist_ok=True)
    export_ctranslate2(
        model,
        tokenizer,
        path,
        quantization=quantization,
        eval_config=config.eval,
        data_config=config.data,
        weights=weights,
    )
    if key is not None:
        marker.write_text(json.dumps(key, indent=2) + "\n", encoding="utf-8")
    return path, False


# ------------------------------------------------------------------------------------------------------------------
def measure_ctranslate2(
    translator, lines: list[str], references: list[str], beam: int, *, latency_sentences: int = 50
) -> tuple[dict, list[str]]:
    """(record, hypotheses) of one CTranslate2 setting: a warm-up batch, the timed pass, then one line at a time."""
    warmup, _ = timed(lambda: translator.translate(lines[: translator.batch_size], beam_size=beam))
    start = time.perf_counter()
    peak_mb, method, hypotheses = measure_peak(lambda: translator.translate(lines, beam_size=beam))
    seconds = time.perf_counter() - start
    latencies = []
    if latency_sentences:
        translator.translate(lines[:1], beam_size=beam)
        latencies = [
            timed(lambda line=line: translator.translate([line], beam_size=beam))[0]
            for line in lines[:latency_sentences]
        ]
    tokens = target_tokens(translator.tokenizer, hypotheses)
    alpha = float(translator.eval_config.alpha)
    # the engine waits for beam x patience finished hypotheses only when alpha != 0; else CTranslate2's early exit
    patience = None if beam == 1 else (translator.patience if alpha else 1.0)
    language = translator.config.data.target if translator.config is not None else ""
    lowercase = translator.config is not None and translator.config.data.lowercase
    record = {
        "bench": "decode",
        "row": row_name("ctranslate2", translator.compute_type, beam, patience=patience),
        "engine": "ctranslate2",
        "compute_type": translator.compute_type,
        "search": "greedy" if beam == 1 else "beam",
        "beam_size": beam,
        "alpha": alpha if beam > 1 else None,
        "patience": patience,
        "cache": True,
        "xla": False,
        "sentences": len(lines),
        "sentences_per_sec": rounded(len(lines) / seconds, 2),
        "tokens_per_sec": rounded(tokens / seconds),
        "target_tokens": tokens,
        "seconds": round(seconds, 2),
        "warmup_seconds": round(warmup, 2),
        "latency_ms_p50": rounded(1e3 * percentile(latencies, 50)) if latencies else None,
        "latency_ms_p95": rounded(1e3 * percentile(latencies, 95)) if latencies else None,
        "latency_sentences": len(latencies),
        "peak_memory_mb": rounded(peak_mb),
        "peak_memory_method": method,
        "bleu": bleu(hypotheses, references, language, lowercase),
        "batch_size": translator.batch_size,
        "threads": len(os.sched_getaffinity(0)),  # the CPUs of this process
    }
    return record, hypotheses


def _fastest(rows: list[tuple[dict, list[str]]], **match) -> tuple[dict, list[str]] | None:
    """The row (record, hypotheses) with the highest sentences/s among those whose fields equal `match`."""
    found = [row for row in rows if all(row[0].get(key) == value for key, value in match.items())]
    return max(found, key=lambda row: row[0]["sentences_per_sec"] or 0.0, default=None)


def _ratio(value, baseline) -> float | None:
    return rounded(value / baseline, 2) if value and baseline else None


def bench_decode_engines(
    context: BenchContext,
    emit,
    *,
    run_dir: str | Path | None = "runs/base",
    sentences: int = 0,
    beams=(1, 4),
    engines=ENGINES,
    quantizations=QUANTIZATIONS,
    patiences=(1.0, 2.0, 3.0),
    xla_settings=(False, True),
    latency_sentences: int = 50,
    export_dir: str | Path = "runs/bench-ctranslate2",
    bootstrap_samples: int = BOOTSTRAP_SAMPLES,
    ct2_threads: int | None = None,
) -> list[dict]:
    """Emits one `{"bench": "decode"}` record per engine setting, then a `{"bench": "decode_targets"}` record.

    Args:
      sentences: test sentences (0 = all); the same as the TensorFlow rows' cached settings.
      engines: a subset of `ENGINES`.
      quantizations: CTranslate2 exports to measure (float32 first: int8 is compared with it).
      patiences: CTranslate2 beam-search patiences (beam > 1 with alpha != 0; else one row).
      xla_settings: the TensorFlow int8 rows' XLA settings.
      export_dir: the CTranslate2 exports (`export_dir/float32`, `export_dir/int8`, reused) and the hypotheses.
      ct2_threads: CTranslate2's threads per translation; None = the engine's default (`thread_split`: the CPUs
        shared among its translations in flight). On a loaded machine 1 is much faster than 2 (OpenMP threads spin
        while they wait).
    """
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        raise ValueError(f"unknown decode engine {', '.join(unknown)}; choose from {', '.join(ENGINES)}")
    model, tokenizer, config, weights = load_translator(context, run_dir)
    lines, references = test_set(config, sentences)
    language = config.data.target
    tensorflow = [row for row in context.results.get("decode", []) if row[0]["compute_type"] == "float32"]
    tf_beams = sorted({record["beam_size"] for record, _ in tensorflow})
    tf_beam = _fastest(tensorflow, beam_size=4 if 4 in tf_beams else max(tf_beams, default=None))
    if tf_beam is None:
        log.warning("decode engines: no TensorFlow float32 rows in this run; no speed-ups against them")
    hypotheses_dir = Path(export_dir) / "hypotheses"
    hypotheses_dir.mkdir(parents=True, exist_ok=True)
    described = {
        "trained": weights is not None,
        "model": str(run_dir) if weights is not None else f"untrained d_model={config.model.d_model}",
    }
    measured: list[tuple[dict, list[str]]] = []
    records = []

    def finish(record: dict, hypotheses: list[str], against: tuple[dict, list[str]] | None) -> None:
        same_search = _fastest(tensorflow, beam_size=record["beam_size"])
        path = hypotheses_dir / (record["row"].replace(" ", "_") + ".txt")
        path.write_text("".join(line + "\n" for line in hypotheses), encoding="utf-8")
        record.update(described)
        record.update(
            {
                "tf_beam_baseline": tf_beam[0]["row"] if tf_beam else None,
                "speedup_vs_tf_beam": _ratio(
                    record["sentences_per_sec"], tf_beam[0]["sentences_per_sec"] if tf_beam else None
                ),
                "bleu_delta_vs_tf_beam": round(record["bleu"] - tf_beam[0]["bleu"], 2) if tf_beam else None,
                "tf_same_search_baseline": same_search[0]["row"] if same_search else None,
                "speedup_vs_tf_same_search": _ratio(
                    record["sentences_per_sec"], same_search[0]["sentences_per_sec"] if same_search else None
                ),
                "paired_bootstrap": None,
                "hypotheses_file": str(path),
            }
        )
        if against is not None:
            test = paired_bootstrap(
                against[1], hypotheses, references, language, bootstrap_samples, config.data.lowercase
            )
            record["paired_bootstrap"] = {"against": against[0]["row"], **test}
        measured.append((record, hypotheses))
        records.append(emit(record))

    if "ctranslate2" in engines:
        try:
            from nmt.ctranslate2_engine import CTranslate2Translator
            from nmt.ctranslate2_export import import_ctranslate2

            import_ctranslate2()
        except ImportError as err:
            log.warning("decode engines: no CTranslate2 rows (%s)", err)
        else:
            for quantization in quantizations:
                path, reused = ensure_export(model, tokenizer, config, weights, export_dir, quantization)
                for beam in beams:
                    alpha = float(config.eval.alpha)
                    for patience in sorted(set(patiences)) if beam > 1 and alpha else [2.0]:
                        translator = CTranslate2Translator(
                            path,
                            tokenizer,
                            config.eval,
                            patience=patience,
                            max_source_length=config.model.max_length,
                            intra_threads=ct2_threads,
                        )
                        translator.config = config
                        record, hypotheses = measure_ctranslate2(
                            translator, lines, references, beam, latency_sentences=latency_sentences
                        )
                        record.update(
                            inter_threads=translator.inter_threads, intra_threads=translator.intra_threads
                        )
                        record.update({"quantization": quantization, "export_dir": str(path)})
                        record["export_reused"] = reused
                        if quantization == "float32":
                            against = _fastest(tensorflow, beam_size=beam)
                        else:
                            match = {"beam_size": beam, "patience": record["patience"]}
                            against = _fastest(
                                measured, engine="ctranslate2", quantization="float32", **match
                            )
                        finish(record, hypotheses, against)

    if "tensorflow_int8" in engines:
        import keras

        from nmt.translator import Translator

        copy, copy_tokenizer, _, _ = load_translator(context, run_dir)  # a second copy: quantized in place
        copy.quantize("int8", filters=lambda layer: isinstance(layer, keras.layers.Dense))
        quantized = [layer for layer in copy._flatten_layers() if getattr(layer, "quantization_mode", None)]
        if any(isinstance(layer, keras.layers.Embedding) for layer in quantized):
            raise RuntimeError("an Embedding was quantized: the tied output projection would be wrong")
        for xla in xla_settings:
            translator = Translator(
                copy, copy_tokenizer, config.eval, max_source_length=config.model.max_length, xla=xla
            )
            translator.config = config
            for beam in beams:
                record, hypotheses = measure_tensorflow(
                    translator,
                    lines,
                    references,
                    beam,
                    latency_sentences=latency_sentences,
                    compute_type="int8",
                )
                record["quantized_layers"] = len(quantized)
                finish(record, hypotheses, _fastest(tensorflow, beam_size=beam, xla=record["xla"]))

    records.append(emit(targets(measured, tf_beam)))
    return records


def targets(rows: list[tuple[dict, list[str]]], tf_beam) -> dict:
    """The issue's targets on these rows: CTranslate2 at the baseline's beam (patience 2 where it applies)."""
    beam = tf_beam[0]["beam_size"] if tf_beam else None
    record = {
        "bench": "decode_targets",
        "beam_size": beam,
        "tf_beam_baseline": tf_beam[0]["row"] if tf_beam else None,
    }
    found = {}
    for quantization in QUANTIZATIONS:
        for patience in (
            2.0,
            1.0,
        ):  # 2: the engine's default (alpha != 0); 1: what the engine uses when alpha = 0
            row = _fastest(
                rows, engine="ctranslate2", quantization=quantization, beam_size=beam, patience=patience
            )
            if row is not None:
                found[quantization] = row[0]
                break
    fp32, int8 = found.get("float32"), found.get("int8")
    if fp32 is not None and tf_beam is not None:
        speedup, delta = fp32["speedup_vs_tf_beam"], fp32["bleu_delta_vs_tf_beam"]
        record["ct2_float32_row"] = fp32["row"]
        record["ct2_float32_speedup"] = speedup
        record["ct2_float32_bleu_delta"] = delta
        record["ct2_float32_target_met"] = bool(
            speedup and speedup >= 3.0 and abs(delta) <= 0.2
        )  # 3x, 0.2 BLEU
    if fp32 is not None and int8 is not None:
        record["ct2_int8_row"] = int8["row"]
        record["ct2_int8_bleu_delta_vs_float32"] = round(int8["bleu"] - fp32["bleu"], 2)
        record["ct2_int8_speedup_vs_float32"] = _ratio(int8["sentences_per_sec"], fp32["sentences_per_sec"])
        faster = (int8["sentences_per_sec"] or 0) > (fp32["sentences_per_sec"] or 0)
        record["ct2_int8_target_met"] = bool(
            abs(int8["bleu"] - fp32["bleu"]) <= 0.5 and faster
        )  # 0.5 BLEU, faster
    return record
