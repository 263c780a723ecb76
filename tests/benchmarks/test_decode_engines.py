"""benchmarks.decode_engines: the decode rows of CTranslate2 and TensorFlow int8 beside our float32 decoder."""

import io
import json

import pytest

NUMBER = (int, float)


@pytest.mark.slow  # ~15 s; the CTranslate2 CLI path stays in make test (tests/test_cli_evaluate_engines.py)
def test_decode_engine_rows_name_their_settings_and_hold_the_engines_translations(tiny_run_dir, tmp_path):
    """The decode rows of `make bench` (cached TensorFlow float32, then CTranslate2 and TensorFlow int8) on the tiny
    trained run: every row names engine, compute type, beam, alpha and patience; the CTranslate2 rows' translations
    are those of the engine (`CTranslate2Translator` on the same export), every BLEU is sacreBLEU's, the ratios and
    bootstrap differences are those of the rows of the same run. No timing is checked."""
    pytest.importorskip("ctranslate2")
    import keras
    import sacrebleu

    from benchmarks.common import BenchContext, JsonLines
    from benchmarks.decode_engines import bench_decode_engines
    from benchmarks.decode_speed import bench_decode
    from data.corpus import load_text_pairs
    from data.tokenizer import Tokenizer
    from nmt.ctranslate2_engine import CTranslate2Translator
    from nmt.run_dir import RunDir
    from transformer.model import build_model

    config = RunDir(tiny_run_dir).load_config()
    context = BenchContext(config)
    stream = io.StringIO()
    emit = JsonLines(stream)
    common = dict(run_dir=tiny_run_dir, sentences=8, beams=(1, 2), xla_settings=(False,), latency_sentences=3)
    records = bench_decode(context, emit, caches=(True,), ensemble=0, sampling=False, **common)
    records += bench_decode_engines(
        context,
        emit,
        patiences=(1.0, 2.0),
        export_dir=tmp_path / "ct2",
        bootstrap_samples=100,
        ct2_threads=1,  # 2 OpenMP threads on a loaded machine: 10x slower (no timing is checked, the time is ours)
        **common,
    )
    assert [json.loads(line) for line in stream.getvalue().splitlines()] == records
    rows = {r["row"]: r for r in records if r["bench"] == "decode"}
    assert len(rows) == len(records) - 1 and set(rows) == {
        "tensorflow float32 greedy", "tensorflow float32 beam 2", "tensorflow int8 greedy", "tensorflow int8 beam 2",
        "ctranslate2 float32 greedy", "ctranslate2 float32 beam 2 patience 1", "ctranslate2 float32 beam 2 patience 2",
        "ctranslate2 int8_float32 greedy", "ctranslate2 int8_float32 beam 2 patience 1",
        "ctranslate2 int8_float32 beam 2 patience 2",
    }  # fmt: skip
    sources, targets = load_text_pairs(config.data, config.data.test_split)
    lines, references = zip(*[(s, t) for s, t in zip(sources, targets) if s.strip()][:8])
    tokenizer = Tokenizer.load(tiny_run_dir / "tokenizer")
    for name, r in rows.items():
        assert r["sentences"] == 8 and r["sentences_per_sec"] > 0 and r["tokens_per_sec"] > 0, name
        assert r["latency_sentences"] == 3 and r["latency_ms_p50"] <= r["latency_ms_p95"], name
        assert isinstance(r["peak_memory_mb"], NUMBER) and isinstance(r["bleu"], NUMBER), name
        assert r["alpha"] == (config.eval.alpha if r["beam_size"] == 2 else None), name
        assert (
            r["patience"] is None if r["engine"] == "tensorflow" or r["beam_size"] == 1 else r["patience"] > 0
        )
        if r["compute_type"] == "float32" and r["engine"] == "tensorflow":
            continue
        baseline = rows[r["tf_beam_baseline"]]
        assert r["tf_beam_baseline"] == "tensorflow float32 beam 2"
        assert r["speedup_vs_tf_beam"] == pytest.approx(
            r["sentences_per_sec"] / baseline["sentences_per_sec"], rel=0.01, abs=0.01
        )
        assert r["bleu_delta_vs_tf_beam"] == pytest.approx(r["bleu"] - baseline["bleu"], abs=0.011)
        test = r["paired_bootstrap"]
        assert test["bleu_delta"] == pytest.approx(r["bleu"] - rows[test["against"]]["bleu"], abs=0.011)
        hypotheses = open(r["hypotheses_file"], encoding="utf-8").read().splitlines()
        assert r["bleu"] == pytest.approx(
            sacrebleu.corpus_bleu(hypotheses, [list(references)]).score, abs=0.006
        )
        if r["engine"] == "tensorflow":  # int8: every Dense of the model, never the tied Embedding
            assert test["against"] == r["tf_same_search_baseline"] == r["row"].replace("int8", "float32")
            model = build_model(config.model, tokenizer.source_vocab_size, tokenizer.target_vocab_size)
            dense = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.Dense)]
            assert r["quantized_layers"] == len(dense) > 0
            continue
        quantization = "float32" if r["compute_type"] == "float32" else "int8"
        assert r["quantization"] == quantization and r["export_dir"] == str(tmp_path / "ct2" / quantization)
        float32_row = r["row"].replace("int8_float32", "float32")
        assert test["against"] == (float32_row if quantization == "int8" else r["tf_same_search_baseline"])
        engine = CTranslate2Translator(
            r["export_dir"],
            tokenizer,
            config.eval,
            patience=r["patience"] or 2.0,
            max_source_length=config.model.max_length,
            intra_threads=1,
        )
        assert hypotheses == engine.translate(list(lines), beam_size=r["beam_size"]), name
    (targets_record,) = [r for r in records if r["bench"] == "decode_targets"]
    assert targets_record["ct2_float32_row"] == "ctranslate2 float32 beam 2 patience 2"
    assert targets_record["ct2_int8_row"] == "ctranslate2 int8_float32 beam 2 patience 2"
    assert isinstance(targets_record["ct2_int8_target_met"], bool)


def test_ctranslate2_export_of_the_bench_is_reused_only_for_the_same_checkpoint(tiny_run_dir, tmp_path):
    """Reused for the same checkpoint bytes; exported again when the checkpoint's bytes change under the same path,
    and always for an untrained model (no checkpoint)."""
    pytest.importorskip("ctranslate2")
    import shutil
    from pathlib import Path

    from benchmarks.decode_engines import ensure_export
    from nmt.ctranslate2_export import read_export_metadata
    from nmt.translator import Translator

    ours = Translator.from_run_dir(tiny_run_dir)
    prefix = tmp_path / "ckpt" / "ckpt-1"
    prefix.parent.mkdir()
    for file in Path(ours.weights).parent.glob(Path(ours.weights).name + ".*"):
        shutil.copy(file, prefix.parent / file.name.replace(Path(ours.weights).name, "ckpt-1"))

    def export(weights):
        return ensure_export(ours.model, ours.tokenizer, ours.config, weights, tmp_path / "ct2", "int8")

    path, reused = export(str(prefix))
    assert not reused and read_export_metadata(path)["quantization"] == "int8"
    assert export(str(prefix)) == (path, True)
    data = next(prefix.parent.glob("ckpt-1.data-*"))
    data.write_bytes(data.read_bytes() + b"\0")  # other weights under the same prefix
    assert export(str(prefix)) == (path, False)
    assert export(str(prefix)) == (path, True)
    assert export(None) == (path, False) and export(None) == (path, False)
