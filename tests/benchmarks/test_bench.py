"""bench.py on a tiny folder corpus: every benchmark emits JSON lines with the documented fields and types.

No timing assertions: the machine may be loaded. The reference model must have our parameter count (exactly, for
the Post-LN default; `parameter_difference` otherwise).
"""

import dataclasses
import io
import json

import pytest

from nmt.config import config_from_dict
from tests.run_fixture import tiny_config_tree, write_corpus

NUMBER = (int, float)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(config, tokenizer directory) on the tiny templated corpus."""
    from data.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("bench")
    config = config_from_dict(tiny_config_tree(write_corpus(root / "corpus")))
    train_tokenizer(config.data, root / "tokenizer", seed=config.train.seed)
    return config, root / "tokenizer"


@pytest.mark.parametrize(
    "changes",
    [{}, {"norm": "pre", "share_qkv": "qk"}, {"share_qkv": "all", "tie_output": False, "num_layers": 2}],
)
def test_reference_model_has_our_parameter_count(changes):
    from benchmarks.flops import count_parameters
    from benchmarks.reference_model import build_reference_model, parameter_difference
    from nmt.config import ModelConfig
    from transformer.model import build_model

    config = dataclasses.replace(
        ModelConfig(d_model=16, num_heads=2, d_ff=32, num_layers=1, max_length=32), **changes
    )
    ours, reference = build_model(config, 48, 48), build_reference_model(config, 48, 48)
    assert count_parameters(ours) - count_parameters(reference) == parameter_difference(config)
    if not changes:
        assert parameter_difference(config) == 0


def test_reference_model_masks_padding_and_future():
    """Logits do not depend on how much source padding follows the sentence, nor on later target tokens.

    Controls: the same extra source positions holding real tokens (unmasked), and the changed target tokens at
    their own positions, do change the logits, so the two equalities are not vacuous.
    """
    import numpy as np
    import tensorflow as tf

    from benchmarks.reference_model import build_reference_model
    from nmt.config import ModelConfig

    config = ModelConfig(d_model=16, num_heads=2, d_ff=32, num_layers=1, dropout=0.0, max_length=32)
    model = build_reference_model(config, 40, 40)
    target = tf.constant([[2, 8, 9, 10, 11, 0]])

    def logits(source, target_in=target):
        return model({"source": tf.constant(source), "target_in": target_in}).numpy()

    base = logits([[5, 6, 7, 3, 0, 0]])
    assert base.dtype == np.float32 and base.shape == (1, 6, 40)
    more_padding = logits([[5, 6, 7, 3, 0, 0, 0, 0, 0, 0, 0]])  # 5 more PAD positions for attention to see
    np.testing.assert_allclose(more_padding, base, atol=1e-5)
    unmasked = logits([[5, 6, 7, 3, 12, 13, 14, 15, 16, 17, 18]])  # the same positions, not padding
    assert np.max(np.abs(unmasked - base)) > 1e-3

    changed_future = logits([[5, 6, 7, 3, 0, 0]], tf.constant([[2, 8, 9, 30, 31, 0]]))
    np.testing.assert_allclose(changed_future[:, :3], base[:, :3], atol=1e-5)
    assert np.max(np.abs(changed_future[:, 3:5] - base[:, 3:5])) > 1e-3


def test_quick_benchmarks_emit_json_lines_with_the_required_fields(tiny):
    from benchmarks.common import JsonLines
    from benchmarks.runner import BenchOptions, run_benchmarks

    config, tokenizer_dir = tiny
    options = BenchOptions.quick(
        tokenizer_dir=str(tokenizer_dir),
        run_dir="does/not/exist",
        train_batches=1,
        train_rounds=1,
        # The XLA settings reuse the models: only the gradient step is traced again.
        xla=(False, True, "fusible"),
        decode_xla=(False,),
        peak_size=128,
        decode_all=6,
        decode_sentences=2,
        beams=(1,),
        attention_lengths=(64, 128),
        memory_budget_mb=0.2,  # 4 heads x 128^2 x 4 bytes = 0.25 MB: full attention is skipped at 128
        chunk_size=32,
        window=8,
        attention_repeats=1,
    )
    stream = io.StringIO()
    records = run_benchmarks(options, emit=JsonLines(stream), config=config)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert lines == records and all("bench" in r for r in lines)
    by_bench = {
        name: [r for r in lines if r["bench"] == name] for name in ("train", "decode", "attention", "input")
    }

    train, train_xla, train_fusible = by_bench["train"]
    assert train["precision"] == "float32" and train["xla"] is False and train_xla["xla"] is True
    assert train_fusible["xla"] == "fusible" and train_fusible["tokens_per_sec"] > 0
    for record in by_bench["train"]:  # one trace per setting: the warm-up left nothing to compile when timed
        assert record["compiled_shapes"] == {"ours": 1, "reference": 1}
    for key in ("tokens_per_sec", "reference_tokens_per_sec", "ratio", "mfu", "peak_gflops"):
        assert isinstance(train[key], NUMBER) and train[key] > 0, key
    assert train["params"] == train["reference_params"] and train["expected_param_difference"] == 0
    assert train["non_embedding_params"] < train["params"] + 48 * 32  # embeddings out, tied projection in
    for record in by_bench["train"]:  # the matmul-only lower bound, timed in the same rounds
        for key in ("step_seconds", "matmul_only_seconds", "overhead_ratio", "matmul_only_gflops"):
            assert isinstance(record[key], NUMBER) and record[key] > 0, key
        assert len(record["seconds_matmul_only"]) == record["rounds"]
    assert train_xla["matmul_gflops_per_pass"] >= train["matmul_gflops_per_pass"]  # XLA projects padding too
    # Fusible projects the real tokens only, as without XLA.
    assert train_fusible["matmul_gflops_per_pass"] == train["matmul_gflops_per_pass"]

    (ema,) = [r for r in lines if r["bench"] == "train_ema"]  # the EMA's cost, same batches, same run
    assert ema["precision"] == "float32" and ema["ema_decay"] == 0.998 and ema["xla"] is False
    assert ema["ema_update_error"] < 1e-5  # the step with EMA updates the copy as NumPy recomputes it
    for key in ("tokens_per_sec", "without_ema_tokens_per_sec", "ratio", "ema_megabytes"):
        assert isinstance(ema[key], NUMBER) and ema[key] > 0, key
    assert ema["ema_megabytes"] == pytest.approx(
        train["params"] * 4 / 2**20, abs=0.01
    )  # a float32 copy of all
    assert len(ema["seconds_ema"]) == len(ema["seconds_without_ema"]) == ema["rounds"]

    decode = by_bench["decode"]
    assert {(r["search"], r["cache"]) for r in decode} == {("greedy", True), ("greedy", False)}
    for r in decode:
        assert isinstance(r["sentences_per_sec"], NUMBER) and isinstance(r["tokens_per_sec"], NUMBER)
        assert r["trained"] is False and r["xla"] is False and r["traces_in_timed_run"] == 0
    assert {r["cache"]: r["sentences"] for r in decode} == {True: 6, False: 2}

    attention = {(r["variant"], r["length"]): r for r in by_bench["attention"]}
    assert set(attention) == {(v, n) for v in ("full", "chunked", "local") for n in (64, 128)}
    assert attention[("full", 128)]["status"] == "skipped: exceeds budget"
    for key in (("full", 64), ("chunked", 128), ("local", 128)):
        record = attention[key]
        assert record["status"] == "ok" and isinstance(record["seconds"], float)
        assert isinstance(record["peak_memory_mb"], NUMBER) and record["memory_method"]

    (pipeline,) = by_bench["input"]
    assert pipeline["tokens_per_sec"] > 0 and pipeline["target_tokens"] > 0
    assert pipeline["train_tokens_per_sec"] == train["tokens_per_sec"]
    assert pipeline["ratio"] == pytest.approx(pipeline["tokens_per_sec"] / train["tokens_per_sec"], rel=0.01)

    (refusal,) = [
        r for r in lines if r["bench"] == "refusal"
    ]  # train.py on a run directory this process locked
    assert refusal["refused"] is True and refusal["exit_code"] == 3 and refusal["repeats"] == 3
    assert 0 < refusal["min_seconds"] <= refusal["seconds"] <= refusal["max_seconds"]

    timing = lines[-1]  # last: each benchmark's wall seconds, in run order, within the total
    assert timing["bench"] == "timing" and timing["complete"] is True and timing["machine"]["cpus"]
    assert list(timing["seconds"]) == ["train", "train_ema", "decode", "attention", "input", "refusal"]
    assert all(seconds > 0 for seconds in timing["seconds"].values())
    assert sum(timing["seconds"].values()) <= timing["total_seconds"] + 0.1 * len(timing["seconds"])


def test_a_stopped_bench_still_says_how_long_each_benchmark_ran(tiny, monkeypatch):
    """Ctrl-C (or a failure) inside a benchmark: the records so far are kept and a closing timing record says the
    run is incomplete, with the interrupted benchmark's seconds; the interruption itself is not swallowed."""
    import benchmarks.input_speed
    from benchmarks.common import JsonLines
    from benchmarks.runner import BenchOptions, run_benchmarks

    def interrupted(context, emit):
        raise KeyboardInterrupt

    monkeypatch.setattr(benchmarks.input_speed, "bench_input", interrupted)
    config, tokenizer_dir = tiny
    options = BenchOptions.quick(
        only=("attention", "input", "refusal"), tokenizer_dir=str(tokenizer_dir), run_dir="does/not/exist",
        attention_lengths=(32,), attention_repeats=1,
    )  # fmt: skip
    stream = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        run_benchmarks(options, emit=JsonLines(stream), config=config)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert {r["bench"] for r in lines[:-1]} == {"attention"}  # refusal never ran
    assert lines[-1]["bench"] == "timing" and lines[-1]["complete"] is False
    assert list(lines[-1]["seconds"]) == ["attention", "input"]


def test_flops_count_attention_on_real_lengths():
    import numpy as np

    from benchmarks.flops import attention_flops, target_tokens

    batch = {
        "source": np.array([[5, 6, 3, 0]]),
        "target_in": np.array([[2, 7, 0, 0]]),
        "target_out": np.array([[7, 3, 0, 0]]),
    }
    # S = 3, T = 2: 3 (fwd + bwd) x layers x 4 d (S^2 + T^2 + T S)
    assert attention_flops(batch, d_model=8, num_layers=2) == 3 * 2 * 4 * 8 * (9 + 4 + 6)
    assert target_tokens(batch) == 2


def test_bench_cli_rejects_unknown_benchmark(capsys):
    import bench

    assert bench.main(["--only", "train,nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_repository_paths_of_the_benchmarks():
    """The repository root the benchmarks run train.py and their child processes from, and the Multi30k mirror."""
    from pathlib import Path

    from benchmarks import ablation, input_scale, refusal, synthetic_corpus

    repo = Path(__file__).resolve().parents[2]
    assert (repo / "train.py").is_file() and (repo / "benchmarks" / "runner.py").is_file()
    assert refusal.ROOT == ablation.REPO_ROOT == input_scale.REPO == repo
    assert synthetic_corpus.DEFAULT_MIRROR == repo.parent / "shared" / "data" / "multi30k"


@pytest.fixture(scope="session")
def trained_tiny_run(tmp_path_factory, request):
    from tests.run_fixture import shared_tiny_run_dir

    return shared_tiny_run_dir(tmp_path_factory, getattr(request.config, "cache", None))


def test_paired_bootstrap_reports_sacrebleus_bleu_difference_and_a_verdict():
    """BLEU and its difference against sacreBLEU's corpus_bleu; identical systems are said to be identical (sacreBLEU
    gives them a small p-value on purpose); a system that drops most of the words loses significantly."""
    import random

    import sacrebleu

    from benchmarks.significance import paired_bootstrap

    rng = random.Random(0)
    words = "ein mann eine frau der hund die katze sieht mag hat das haus den ball heute".split()
    references = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 9))) for _ in range(60)]
    close = [ref if i % 3 else " ".join(ref.split()[:-1]) for i, ref in enumerate(references)]
    poor = [" ".join(ref.split()[:2]) for ref in references]

    same = paired_bootstrap(close, close, references, "de", samples=200)
    assert same["bleu_delta"] == 0 and same["same_translations"] == 60 == same["sentences"]
    assert same["verdict"] == "identical translations"

    loss = paired_bootstrap(close, poor, references, "de", samples=200)
    expected = (
        sacrebleu.corpus_bleu(poor, [references]).score - sacrebleu.corpus_bleu(close, [references]).score
    )
    assert loss["bleu_delta"] == pytest.approx(expected, abs=0.006) and expected < -10
    assert loss["baseline_bleu"] == pytest.approx(sacrebleu.corpus_bleu(close, [references]).score, abs=0.006)
    assert 0 < loss["p_value"] < 0.05 and loss["verdict"] == "significant loss" and loss["samples"] == 200


def test_significance_command_prints_the_bootstrap_of_two_files_and_refuses_misaligned_ones(tmp_path, capsys):
    """`python -m benchmarks.significance`: the JSON line is `paired_bootstrap` of the files' lines (references
    read from .gz too); files of different lengths are an error that names the counts."""
    import gzip
    import json

    from benchmarks.significance import main, paired_bootstrap

    references = [f"der hund {i} sieht das haus" for i in range(30)]
    baseline = [ref if i % 2 else "der hund" for i, ref in enumerate(references)]
    system = [ref if i % 5 else "das haus" for i, ref in enumerate(references)]
    for name, lines in (("baseline.txt", baseline), ("system.txt", system)):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    with gzip.open(tmp_path / "ref.de.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(references) + "\n")
    args = ["--baseline", str(tmp_path / "baseline.txt"), "--system", str(tmp_path / "system.txt")]
    assert main([*args, "--references", str(tmp_path / "ref.de.gz"), "--samples", "100"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {
        "baseline": args[1],
        "system": args[3],
        **paired_bootstrap(baseline, system, references, samples=100),
    }
    assert printed["bleu_delta"] > 0
    (tmp_path / "short.txt").write_text("\n".join(references[:-1]) + "\n", encoding="utf-8")
    assert main([*args, "--references", str(tmp_path / "short.txt")]) == 2
    assert "same number of lines" in capsys.readouterr().err
    assert main([*args, "--references", str(tmp_path / "missing.txt")]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.slow  # ~15 s; the CTranslate2 CLI path stays in make test (tests/test_cli_evaluate.py)
def test_decode_engine_rows_name_their_settings_and_hold_the_engines_translations(trained_tiny_run, tmp_path):
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

    config = RunDir(trained_tiny_run).load_config()
    context = BenchContext(config)
    stream = io.StringIO()
    emit = JsonLines(stream)
    common = dict(
        run_dir=trained_tiny_run, sentences=8, beams=(1, 2), xla_settings=(False,), latency_sentences=3
    )
    records = bench_decode(context, emit, caches=(True,), **common)
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
    tokenizer = Tokenizer.load(trained_tiny_run / "tokenizer")
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


def test_ctranslate2_export_of_the_bench_is_reused_only_for_the_same_checkpoint(trained_tiny_run, tmp_path):
    """Reused for the same checkpoint bytes; exported again when the checkpoint's bytes change under the same path,
    and always for an untrained model (no checkpoint)."""
    pytest.importorskip("ctranslate2")
    import shutil
    from pathlib import Path

    from benchmarks.decode_engines import ensure_export
    from nmt.ctranslate2_export import read_export_metadata
    from nmt.translator import Translator

    ours = Translator.from_run_dir(trained_tiny_run)
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


def test_bench_cli_decode_engine_options():
    import bench

    options = bench.options_from_args(
        bench.parse_args(
            ["--decode-engines", "ctranslate2", "--ct2-patience", "2,3", "--ct2-dir", "elsewhere"]
        )
    )
    assert options.decode_engines == ("ctranslate2",) and options.ct2_patience == (2.0, 3.0)
    assert options.ct2_dir == "elsewhere"
    assert bench.options_from_args(bench.parse_args(["--decode-engines", ""])).decode_engines == ()
    assert bench.options_from_args(bench.parse_args([])).decode_engines == ("ctranslate2", "tensorflow_int8")
    assert bench.options_from_args(bench.parse_args(["--quick"])).decode_engines == ()  # the smoke has none
    assert bench.main(["--decode-engines", "ctranslate2,nope"]) == 2


def test_bench_cli_xla_settings_and_fusible_is_for_the_train_rows_only():
    import bench

    def options(*argv):
        return bench.options_from_args(bench.parse_args(list(argv)))

    assert options().xla == (False, True) and options().decode_xla_settings == (False, True)
    assert options("--xla", "off,fusible").xla == (False, "fusible")
    assert options("--xla", "fusible").decode_xla_settings == (False,)
    assert options("--xla", "fusible", "--decode-xla", "on").decode_xla_settings == (True,)
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(["--xla", "sometimes"])
    assert exit_info.value.code == 2


def test_bench_cli_input_scale_pairs(capsys):
    import bench

    assert bench.options_from_args(bench.parse_args([])).input_scale_pairs == (500_000, 5_000_000)
    options = bench.options_from_args(bench.parse_args(["--input-scale-pairs", "1000,20000"]))
    assert options.input_scale_pairs == (1000, 20000)
    assert bench.main(["--only", "input_scale", "--input-scale-pairs", "0"]) == 2
    assert "input_scale corpus sizes must be positive" in capsys.readouterr().err
