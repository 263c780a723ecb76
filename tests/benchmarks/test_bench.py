"""bench.py on a tiny folder corpus: every benchmark emits JSON lines with the documented fields and types.

No timing assertions: the machine may be loaded. The reference model must have our parameter count (exactly, for
the Post-LN default; `parameter_difference` otherwise).
"""

import dataclasses
import io
import json
from pathlib import Path

import pytest

from nmt.config import config_from_dict
from tests.run_fixture import tiny_config_tree, write_corpus

NUMBER = (int, float)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(config, tokenizer directory) on the tiny templated corpus."""
    from data.tokenizer_training import train_tokenizer

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
        # The XLA settings reuse the models: only the gradient step is traced again. XLA on every op: the slow
        # test_quick_train_bench_under_xla_projects_the_padding below (~10 s more on 2 loaded cores).
        xla=(False, "fusible"),
        decode_xla=(False,),
        peak_size=128,
        decode_all=6,
        decode_sentences=2,
        beams=(1,),
        # attention: each point a process of its own (~10 s on 2 loaded cores): tests/benchmarks/test_attention_memory.py
        only=tuple(name for name in BenchOptions.quick().only if name != "attention"),
    )
    stream = io.StringIO()
    records = run_benchmarks(options, emit=JsonLines(stream), config=config, argv=["bench.py", "--quick"])
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert lines == records and all("bench" in r for r in lines)
    _check_header(lines[0], config, options)
    by_bench = {name: [r for r in lines if r["bench"] == name] for name in ("train", "decode", "input")}

    train, train_fusible = by_bench["train"]
    assert train["precision"] == "float32" and train["xla"] is False
    assert train_fusible["xla"] == "fusible" and train_fusible["tokens_per_sec"] > 0
    assert train["warmup_passes"] == 1 and train_fusible["warmup_passes"] == 2  # XLA: a pass after compiling
    for record in by_bench["train"]:  # one trace per setting: the warm-up left nothing to compile when timed
        assert record["compiled_shapes"] == {"ours": 1, "reference": 1}
    for key in ("tokens_per_sec", "reference_tokens_per_sec", "ratio", "mfu", "peak_gflops"):
        assert isinstance(train[key], NUMBER) and train[key] > 0, key
    # The peak: the best of the measured shapes, or the matmul-only rate where that is faster.
    for record in by_bench["train"]:
        measured = record["measured_peak_by_shape"]
        assert list(measured) == ["128x128x128", "128x128x32", "256x64x64", "128x16x64"]
        assert record["measured_peak_gflops"] == max(measured.values())
        assert record["peak_gflops"] >= record["measured_peak_gflops"]
        assert record["peak_source"] in ("measured", "matmul_only")
        if record["peak_source"] == "measured":
            assert record["peak_gflops"] == record["measured_peak_gflops"]
        assert 0 < record["matmul_only_peak_fraction"] <= 1
    assert train["params"] == train["reference_params"] and train["expected_param_difference"] == 0
    assert train["non_embedding_params"] < train["params"] + 48 * 32  # embeddings out, tied projection in
    for record in by_bench["train"]:  # the matmul-only lower bound, timed in the same rounds
        for key in ("step_seconds", "matmul_only_seconds", "overhead_ratio", "matmul_only_gflops"):
            assert isinstance(record[key], NUMBER) and record[key] > 0, key
        assert len(record["seconds_matmul_only"]) == record["rounds"]
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
    # The model twice over as an ensemble, against it alone
    (ensemble,) = [r for r in lines if r["bench"] == "decode_ensemble"]
    (single,) = [r for r in decode if r["cache"]]
    assert ensemble["ensemble"] == 2 and ensemble["sentences"] == 6 and ensemble["search"] == "greedy"
    assert ensemble["row"] == single["row"] + " ensemble of 2" and ensemble["traces_in_timed_run"] == 0
    assert ensemble["tokens_per_sec_ratio"] == pytest.approx(
        ensemble["tokens_per_sec"] / single["tokens_per_sec"], rel=0.01
    )
    assert ensemble["same_hypotheses"] >= 5 / 6  # the mean of equal distributions is the distribution
    (sampled,) = [r for r in lines if r["bench"] == "decode_sampling"]  # top-k 10 against greedy search
    assert (
        sampled["sampling"]["topk"] == 10
        and sampled["sentences"] == 6
        and sampled["traces_in_timed_run"] == 0
    )
    assert sampled["seconds_ratio"] == pytest.approx(
        single["sentences_per_sec"] / sampled["sentences_per_sec"], rel=0.01
    )

    (pipeline,) = by_bench["input"]
    assert pipeline["tokens_per_sec"] > 0 and pipeline["target_tokens"] > 0
    assert pipeline["train_tokens_per_sec"] == train["tokens_per_sec"]
    ratio = pipeline["tokens_per_sec"] / train["tokens_per_sec"]  # the record's is rounded to 2 decimals
    assert pipeline["ratio"] == pytest.approx(ratio, rel=0.01, abs=0.005)

    (refusal,) = [
        r for r in lines if r["bench"] == "refusal"
    ]  # train.py on a run directory this process locked
    assert refusal["refused"] is True and refusal["exit_code"] == 3 and refusal["repeats"] == 3
    assert 0 < refusal["min_seconds"] <= refusal["seconds"] <= refusal["max_seconds"]

    timing = lines[-1]  # last: each benchmark's wall seconds, in run order, within the total
    assert timing["bench"] == "timing" and timing["complete"] is True and timing["machine"]["cpus"]
    assert timing["machine"] == lines[0]["machine"]  # sampled once, before the first benchmark
    assert list(timing["seconds"]) == ["train", "train_ema", "decode", "input", "refusal"]
    assert all(seconds > 0 for seconds in timing["seconds"].values())
    assert sum(timing["seconds"].values()) <= timing["total_seconds"] + 0.1 * len(timing["seconds"])


@pytest.mark.slow
def test_quick_train_bench_under_xla_projects_the_padding(tiny):
    """XLA on every op: one trace per setting, and the projection of every position (padding too), so at least the
    matmul work of the step without XLA."""
    from benchmarks.common import JsonLines
    from benchmarks.runner import BenchOptions, run_benchmarks

    config, tokenizer_dir = tiny
    options = BenchOptions.quick(
        only=("train",), tokenizer_dir=str(tokenizer_dir), run_dir="does/not/exist", train_batches=1,
        train_rounds=1, xla=(False, True), peak_size=128,
    )  # fmt: skip
    stream = io.StringIO()
    run_benchmarks(options, emit=JsonLines(stream), config=config)
    train, train_xla = [r for r in map(json.loads, stream.getvalue().splitlines()) if r["bench"] == "train"]
    assert train["xla"] is False and train_xla["xla"] is True and train_xla["tokens_per_sec"] > 0
    assert train_xla["compiled_shapes"] == {"ours": 1, "reference": 1}
    assert train_xla["matmul_gflops_per_pass"] >= train["matmul_gflops_per_pass"]


def test_a_stopped_bench_still_says_how_long_each_benchmark_ran(tiny, monkeypatch):
    """Ctrl-C (or a failure) inside a benchmark: the records so far are kept and a closing timing record says the
    run is incomplete, with the interrupted benchmark's seconds; the interruption itself is not swallowed."""
    import benchmarks.refusal
    from benchmarks.common import JsonLines
    from benchmarks.runner import BenchOptions, run_benchmarks

    def interrupted(emit, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(benchmarks.refusal, "bench_refusal", interrupted)
    config, tokenizer_dir = tiny
    options = BenchOptions.quick(
        only=("input", "refusal"), tokenizer_dir=str(tokenizer_dir), run_dir="does/not/exist"
    )  # the two cheapest benchmarks: the first runs, the second is stopped
    stream = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        run_benchmarks(options, emit=JsonLines(stream), config=config)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert lines[0]["bench"] == "run"
    assert [r["bench"] for r in lines[1:-1]] == ["input"]  # kept; the stopped refusal wrote nothing
    assert lines[-1]["bench"] == "timing" and lines[-1]["complete"] is False
    assert list(lines[-1]["seconds"]) == ["input", "refusal"]


def test_the_header_records_the_vocabulary_the_benchmarks_run_on(tiny, monkeypatch):
    """A tokenizer directory of another vocabulary than the config's data.vocab_size: the first record gives the
    tokenizer's sizes, which the benchmarks run on (before 2026-12-07e: the config's; found by a review). Without one,
    a tokenizer is trained from the config: its data.vocab_size."""
    import benchmarks.refusal
    from benchmarks.common import JsonLines
    from benchmarks.runner import BenchOptions, run_benchmarks

    # the header is under test: the cheapest benchmark, made instant
    monkeypatch.setattr(
        benchmarks.refusal, "bench_refusal", lambda emit, **kwargs: emit({"bench": "refusal"})
    )
    # a joint tokenizer of 64 pieces (tiny_config_tree)
    config, tokenizer_dir = tiny
    other = dataclasses.replace(config, data=dataclasses.replace(config.data, vocab_size=40))
    options = BenchOptions.quick(
        only=("refusal",), tokenizer_dir=str(tokenizer_dir), run_dir="does/not/exist"
    )
    header = run_benchmarks(options, emit=JsonLines(io.StringIO()), config=other)[0]
    assert header["bench"] == "run" and header["data"]["vocab_size"] == 64
    assert header["tokenizer"] == {
        "dir": str(tokenizer_dir), "joint": True, "source_pieces": 64, "target_pieces": 64, "source_vocab_size": 64,
        "target_vocab_size": 64,
    }  # fmt: skip
    options = BenchOptions.quick(only=("refusal",), run_dir="does/not/exist")
    header = run_benchmarks(options, emit=JsonLines(io.StringIO()), config=other)[0]
    assert header["data"]["vocab_size"] == 40 and header["tokenizer"] == {"dir": None}


def _check_header(header, config, options):
    """The first record describes the run: command line, commit (as git itself says), config, model, machine."""
    import subprocess

    from benchmarks.machine import ISA_FLAGS
    from benchmarks.runner import ROOT

    assert header["bench"] == "run" and header["argv"] == ["bench.py", "--quick"]
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert header["commit"] == (done.stdout.strip() if done.returncode == 0 else None)
    assert header["config"] == options.config and header["overrides"] == list(options.overrides)
    model = config.model
    assert header["model"] == {
        "d_model": model.d_model, "num_heads": model.num_heads, "d_ff": model.d_ff, "num_layers": model.num_layers
    }  # fmt: skip
    assert header["options"]["precisions"] == list(options.precisions)
    machine = header["machine"]
    assert all(isinstance(machine[flag], bool) for flag in ISA_FLAGS)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():  # the first processor's flags, as the kernel lists them
        first = cpuinfo.read_text().split("\n\n")[0]
        fields = dict(line.split(":", 1) for line in first.splitlines() if ":" in line)
        fields = {key.strip(): value.strip() for key, value in fields.items()}
        assert {flag for flag in ISA_FLAGS if machine[flag]} == set(fields["flags"].split()) & set(ISA_FLAGS)
        assert machine["cpu_model"] == fields["model name"]
        assert machine["cpu_family"] == int(fields["cpu family"])
        assert machine["cpu_model_number"] == int(fields["model"])
    assert "load_average" not in machine and isinstance(machine["load_average_at_start"], NUMBER)


def test_the_machine_record_names_the_environment_that_caps_the_kernels(monkeypatch):
    """A row measured with oneDNN capped to AVX2 on an AVX-512 CPU (the AVX2 kind's code) must say so."""
    from benchmarks.machine import KERNEL_ENV, machine_facts

    for name in KERNEL_ENV:
        monkeypatch.delenv(name, raising=False)
    assert machine_facts()["kernel_env"] == {}
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("NMT_KERNELS_ISA", "avx2")
    assert machine_facts()["kernel_env"] == {"ONEDNN_MAX_CPU_ISA": "AVX2", "NMT_KERNELS_ISA": "avx2"}


def test_decode_row_names_tell_every_setting_apart():
    """Rows are looked up by name (baselines, the bootstrap's `against`): the uncached row had the cached one's."""
    from benchmarks.decode_speed import row_name

    names = {
        row_name("tensorflow", "float32", 2),
        row_name("tensorflow", "float32", 2, cache=False),
        row_name("tensorflow", "float32", 2, xla=True),
        row_name("tensorflow", "float32", 1),
        row_name("ctranslate2", "float32", 2, patience=2),
    }
    assert len(names) == 5 and "tensorflow float32 beam 2 no cache" in names


def test_matmul_peak_shapes_and_the_peak_of_a_row():
    from benchmarks.flops import matmul_peaks, peak_shapes, row_peak

    assert peak_shapes(2048) == [(2048, 2048, 2048), (2048, 2048, 512), (4096, 1024, 1024), (2048, 256, 1024)]
    assert min(min(shape) for shape in peak_shapes(2)) >= 1
    peaks = matmul_peaks("float32", size=32, repeats=1)
    assert list(peaks) == ["32x32x32", "32x32x8", "64x16x16", "32x4x16"] and min(peaks.values()) > 0
    assert row_peak(100.0, 80.0) == (100.0, "measured")
    assert row_peak(100.0, 120.0) == (120.0, "matmul_only")  # matmuls ran faster than the "peak": it was none


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


def test_repository_paths_of_the_benchmarks(monkeypatch):
    """The repository root the benchmarks run train.py and their child processes from, and the Multi30k mirror
    (without $NMT_DATA_MIRROR: the repository's sibling shared/data/multi30k, where present)."""
    from pathlib import Path

    from benchmarks import ablation, input_scale, refusal, synthetic_corpus

    repo = Path(__file__).resolve().parents[2]
    assert (repo / "train.py").is_file() and (repo / "benchmarks" / "runner.py").is_file()
    assert refusal.ROOT == ablation.REPO_ROOT == input_scale.REPO == repo
    default = repo.parent / "shared" / "data" / "multi30k"
    monkeypatch.delenv("NMT_DATA_MIRROR", raising=False)
    if (default / "train.en.gz").is_file():
        assert synthetic_corpus.multi30k_mirror() == default


def test_refusal_reads_the_config_from_the_working_directory(tmp_path, monkeypatch):
    """bench.py run from another directory with a config file there: train.py, started in the repository, gets
    its absolute path and refuses the locked run directory (it used to look the name up in the repository, exit 2
    on a missing config, timed as if it were the refusal); a bare name of configs/ stays as given."""
    import shutil

    from benchmarks import refusal

    shutil.copy(refusal.ROOT / "configs" / "tiny.yaml", tmp_path / "mytiny.yaml")
    monkeypatch.chdir(tmp_path)
    record = refusal.bench_refusal(lambda record: record, config="mytiny.yaml", repeats=1)
    assert record["refused"] is True and record["exit_code"] == 3
    command = refusal.refusal_command("mytiny.yaml", ["train.seed=1"], run_dir=tmp_path / "run")
    assert command[command.index("--config") + 1] == str(tmp_path / "mytiny.yaml")
    assert command[-4:] == ["--set", "train.seed=1", "--model-dir", str(tmp_path / "run")]
    command = refusal.refusal_command("tiny.yaml", run_dir=tmp_path / "run")
    assert command[command.index("--config") + 1] == "tiny.yaml"


def test_refusal_stops_when_train_py_fails_otherwise(tmp_path, monkeypatch):
    """A train.py that exits with another code than the refusal's 3 (here 2, a config that does not exist) stops
    the benchmark with one line naming the code and the child's last stderr line; nothing is emitted."""
    from benchmarks.refusal import bench_refusal

    monkeypatch.chdir(tmp_path)
    emitted = []
    with pytest.raises(SystemExit) as stopped:
        bench_refusal(emitted.append, config="no-such-config.yaml", repeats=1)
    message = str(stopped.value.code)
    assert emitted == [] and "\n" not in message
    assert message.startswith("bench.py: refusal: train.py exited with 2,") and "no-such-config" in message
