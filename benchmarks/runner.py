"""Runs the selected benchmarks in one process, in a fixed order (`BENCHES`: train, train_ema, decode, ...).

Settings live in `BenchOptions`; `BenchOptions.quick()` is the ~1-minute smoke (configs/tiny.yaml, float32 without
XLA, a few batches and sentences, short attention lengths). `check_options` and `check_config` refuse what cannot be
measured (bench.py: exit 2). The records open with `{"bench": "run"}` (`run_header`: command line, commit, config,
model, the tokenizer's sizes, options, versions, machine facts with the load average before the first benchmark) and
close with `{"bench": "timing"}` (wall seconds per benchmark, the same machine facts; written also when stopped).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import sys
import time
from pathlib import Path

from benchmarks.common import BenchContext, JsonLines

log = logging.getLogger("benchmarks")

ROOT = Path(__file__).resolve().parents[1]  # the repository: its commit goes into the first record

BENCHES = ("train", "train_ema", "decode", "attention", "input", "input_scale", "refusal")
DECODE_ENGINES = ("ctranslate2", "tensorflow_int8")  # benchmarks.decode_engines.ENGINES, without its imports
TOKENIZER_FIELDS = ("dataset", "source", "target", "folder", "train_split", "tokenizer", "vocab_size",
                    "joint_vocab", "tokenizer_max_sentences")  # fmt: skip


@dataclasses.dataclass
class BenchOptions:
    config: str = "base.yaml"  # YAML config (a bare name is looked up in configs/)
    overrides: list[str] = dataclasses.field(default_factory=list)  # --set section.key=value
    only: tuple[str, ...] = BENCHES  # which benchmarks, run in BENCHES order
    run_dir: str = "runs/base"  # trained model for decode, and its tokenizer for everything, when they exist
    tokenizer_dir: str | None = (
        None  # explicit tokenizer directory (default: RUN_DIR/tokenizer if compatible)
    )
    # train
    precisions: tuple[str, ...] = ("float32", "mixed_bfloat16", "mixed_float16")
    # XLA settings: False, True (jit_compile) and, for the train rows only, "fusible" (`train.xla: fusible`: the
    # fusible ops auto-clustered, the matmuls TensorFlow's; nmt.xla), asked for with --xla (not by default: time)
    xla: tuple[bool | str, ...] = (False, True)
    # Sized for the train rows in ~5 minutes on 2 CPU cores (README, "How long it takes"): tracing and XLA
    # compilation, not the timed passes, are most of their time (~20-35 s per model and setting).
    train_batches: int = 3  # batches per timed pass
    train_shapes: int = 1  # distinct batch shapes among them, the most common (XLA compiles one per shape)
    train_rounds: int = 3  # timed passes per model (median; of 2 it was their mean)
    # train_ema: the EMA's cost per step at this decay (that of the first AVX2 EMA hour), the main job's precision
    ema_decay: float = 0.998
    peak_size: int = 2048  # matmul size of the peak measurement
    # batch-shape sweep: the train rows again per data.batch_tokens x bucket step (empty: the config's own value;
    # a bucket step n: edges n, 2n, ... below data.max_length; 0: the automatic edges)
    train_batch_tokens: tuple[int, ...] = ()
    train_bucket_steps: tuple[int, ...] = ()
    # decode
    decode_all: int = 0  # test sentences for the cached settings (0 = all)
    decode_sentences: int = 16  # test sentences for the no-cache settings (quadratic; 100 took 8 of 34 min)
    beams: tuple[int, ...] = (1, 4)
    decode_xla: tuple[bool, ...] | None = None  # XLA settings of decode (None: as `xla`, without fusible)
    decode_ensemble: int = 2  # members of the ensemble rows (the model repeated; 0 = none)
    # decode rows of the same model in other engines (benchmarks.decode_engines; the smoke has none): engines,
    # CTranslate2 beam patiences (alpha != 0; the engine's default is 2), CTranslate2 exports (reused for the same
    # checkpoint) and every row's hypotheses
    decode_engines: tuple[str, ...] = ("ctranslate2", "tensorflow_int8")
    ct2_patience: tuple[float, ...] = (1.0, 2.0, 3.0)
    ct2_dir: str = "runs/bench-ctranslate2"
    # attention
    attention_lengths: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192)
    memory_budget_mb: float = 512.0
    chunk_size: int = 256
    window: int = 64
    attention_repeats: int = 3
    # input_scale: synthetic folder corpora of these sizes, prepared and read (benchmarks.input_scale)
    input_scale_pairs: tuple[int, ...] = (500_000, 5_000_000)
    input_scale_dir: str = "runs/bench-input-scale"  # corpora (reused); each run's cache is removed after it

    @property
    def decode_xla_settings(self) -> tuple[bool, ...]:
        """`decode_xla`, or `xla` without "fusible" (a training-step setting)."""
        if self.decode_xla is not None:
            return self.decode_xla
        return tuple(setting for setting in self.xla if setting != "fusible") or (False,)

    @classmethod
    def quick(cls, **changes) -> BenchOptions:
        """The smoke settings: seconds per benchmark on configs/tiny.yaml."""
        settings = dict(
            config="tiny.yaml",
            precisions=("float32",),
            xla=(False,),
            train_batches=2,
            train_shapes=1,
            train_rounds=2,
            peak_size=512,
            decode_all=32,
            decode_sentences=8,
            beams=(1, 2),
            decode_engines=(),
            attention_lengths=(128, 256, 512),
            memory_budget_mb=1.0,
            chunk_size=64,
            window=16,
            attention_repeats=2,
            input_scale_pairs=(2000,),
            only=tuple(name for name in BENCHES if name != "input_scale"),  # unless asked: subprocesses
        )
        settings.update(changes)
        return cls(**settings)


def compatible_tokenizer_dir(config, run_dir: str | Path) -> Path | None:
    """RUN_DIR/tokenizer if RUN_DIR was trained with the same tokenizer settings as `config`, else None."""
    from nmt.config import ConfigError, absolute_paths
    from nmt.run_dir import RunDir

    run = RunDir(run_dir)
    if not run.exists() or not any(run.tokenizer_dir.glob("*.model")):
        return None
    try:
        saved = absolute_paths(run.load_config()).data
    except ConfigError:
        return None
    data = absolute_paths(config).data  # a run's config.yaml holds absolute paths (train.py)
    if all(getattr(saved, name) == getattr(data, name) for name in TOKENIZER_FIELDS):
        return run.tokenizer_dir
    return None


# Options holding lists of values to run, each at least one value (an empty one, e.g. `--beams ,`, ran nothing)
LISTS = ("precisions", "xla", "beams", "attention_lengths", "ct2_patience", "input_scale_pairs")


def check_options(options: BenchOptions) -> None:
    """ValueError naming the first unknown benchmark or precision, empty list or value out of range."""
    from benchmarks.flops import COMPUTE_DTYPES

    for name in LISTS + (("decode_xla",) if options.decode_xla is not None else ()):
        if not getattr(options, name):
            raise ValueError(f"--{name.replace('_', '-')} is empty: give at least one value")
    for kind, given, known in (
        ("benchmark", options.only, BENCHES),
        ("precision", options.precisions, COMPUTE_DTYPES),
        ("decode engine", options.decode_engines, DECODE_ENGINES),
    ):
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise ValueError(f"unknown {kind} {', '.join(unknown)}; choose from {', '.join(known)}")
    if any(tokens < 1 for tokens in options.train_batch_tokens):
        raise ValueError(f"train batch tokens must be positive, got {options.train_batch_tokens}")
    if any(pairs < 1 for pairs in options.input_scale_pairs):
        raise ValueError(f"input_scale corpus sizes must be positive, got {options.input_scale_pairs}")
    if any(step < 0 for step in options.train_bucket_steps):
        raise ValueError(f"train bucket steps must be >= 0 (0 = automatic), got {options.train_bucket_steps}")
    if not 0.0 < options.ema_decay < 1.0:
        raise ValueError(f"EMA decay must be in (0, 1), got {options.ema_decay}")
    if not options.only:
        raise ValueError(f"no benchmark named; choose from {', '.join(BENCHES)}")
    for name in ("train_batches", "train_shapes", "train_rounds", "peak_size", "decode_sentences", "chunk_size",
                 "window", "attention_repeats"):  # fmt: skip
        if getattr(options, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(options, name)}")
    if options.decode_all < 0:
        raise ValueError(f"--decode-all must be >= 0 (0 = all), got {options.decode_all}")
    if options.decode_ensemble < 0 or options.decode_ensemble == 1:
        raise ValueError(f"--decode-ensemble must be 0 (none) or at least 2, got {options.decode_ensemble}")
    for name in ("beams", "attention_lengths"):
        if any(value < 1 for value in getattr(options, name)):
            raise ValueError(
                f"--{name.replace('_', '-')} must all be at least 1, got {getattr(options, name)}"
            )
    if not (math.isfinite(options.memory_budget_mb) and options.memory_budget_mb > 0):
        raise ValueError(f"--memory-budget-mb must be a positive number, got {options.memory_budget_mb}")
    if not all(math.isfinite(patience) and patience >= 1 for patience in options.ct2_patience):
        raise ValueError(f"--ct2-patience must all be at least 1, got {options.ct2_patience}")


def check_config(options: BenchOptions, config) -> None:
    """ValueError when the train rows would run on model settings the stock-Keras reference does not model."""
    from benchmarks.reference_model import unmodelled_settings

    unmodelled = unmodelled_settings(config.model) if "train" in options.only else []
    if unmodelled:
        raise ValueError(
            f"the train rows compare our model with a stock-Keras reference that does not model "
            f"{'; '.join(unmodelled)}: drop the setting or leave out train (--only)"
        )


def git_commit(root: Path = ROOT) -> tuple[str | None, bool | None]:
    """(HEAD's commit, whether tracked files differ from it) of the repository at `root`; (None, None) without git."""
    import subprocess

    def git(*args):
        done = subprocess.run(["git", "--no-optional-locks", "-C", str(root), *args], capture_output=True,
                              text=True, timeout=30)  # fmt: skip
        return done.stdout.strip() if done.returncode == 0 else None

    try:
        commit = git("rev-parse", "HEAD")
        status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    except (OSError, subprocess.SubprocessError):
        return None, None
    return commit, (None if status is None else bool(status))


def tokenizer_facts(context: BenchContext) -> dict:
    """The vocabulary the benchmarks run on: the sizes of the tokenizer in `context.tokenizer_dir` (loaded now,
    whatever the config's data.vocab_size), or {"dir": None}: one is trained from the config (data.vocab_size)."""
    import sentencepiece as spm

    if context.tokenizer_dir is None or not any(Path(context.tokenizer_dir).glob("*.model")):
        return {"dir": None}
    tokenizer = context.tokenizer
    source, target = tokenizer.models
    pieces = [
        spm.SentencePieceProcessor(model_proto=model).GetPieceSize() for model in (source, target or source)
    ]
    # vocab sizes: the embedding rows of the models built on it (pieces padded to a multiple of 8)
    return {"dir": str(context.tokenizer_dir), "joint": tokenizer.joint, "source_pieces": pieces[0],
            "target_pieces": pieces[1], "source_vocab_size": tokenizer.source_vocab_size,
            "target_vocab_size": tokenizer.target_vocab_size}  # fmt: skip


def run_header(options: BenchOptions, config, argv, machine: dict, tokenizer: dict) -> dict:
    """The first record of a run: what ran, on what code, model, vocabulary and machine (`machine`: sampled at its
    start; `tokenizer`: `tokenizer_facts`, whose pieces are then the record's data.vocab_size)."""
    import platform

    import keras
    import tensorflow as tf

    commit, dirty = git_commit()
    model = config.model
    data = {
        name: getattr(config.data, name) for name in ("dataset", "vocab_size", "max_length", "batch_tokens")
    }
    # the benchmarks run on the tokenizer's vocabulary (--tokenizer-dir's may differ from the config's)
    if tokenizer["dir"] is not None:
        data["vocab_size"] = tokenizer["source_pieces"]
    return {
        "bench": "run",
        "argv": list(argv),
        "commit": commit,
        "commit_dirty": dirty,  # tracked files changed since the commit
        "config": options.config,
        "overrides": list(options.overrides),
        "model": {name: getattr(model, name) for name in ("d_model", "num_heads", "d_ff", "num_layers")},
        "model_config": dataclasses.asdict(model),
        "data": data,
        "tokenizer": tokenizer,
        "options": {
            name: list(v) if isinstance(v, tuple) else v for name, v in dataclasses.asdict(options).items()
        },
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "machine": machine,
    }


def run_benchmarks(options: BenchOptions, emit=None, config=None, argv=None) -> list[dict]:
    """Runs `options.only`; every record goes to `emit` (default: JSON lines on stdout). Returns the records.

    `config`: an already loaded `nmt.config.Config` (else `options.config` with `options.overrides`). `argv`: the
    command line, for the first record (`run_header`; default `sys.argv`).
    """
    from benchmarks.machine import machine_facts
    from nmt.config import load_config

    check_options(options)
    emit = emit or JsonLines(sys.stdout)
    config = config or load_config(options.config, options.overrides)
    check_config(options, config)
    # Sampled once, before any benchmark: the load average then is the machine's, not this run's own.
    machine = machine_facts()
    machine["load_average_at_start"] = machine.pop("load_average")
    records: list[dict] = []
    context = None
    seconds: dict[str, float] = {}  # wall time per benchmark, for the closing "timing" record
    started = time.perf_counter()
    complete = False

    @contextlib.contextmanager
    def timed(name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds[name] = round(seconds.get(name, 0.0) + time.perf_counter() - start, 1)

    # From the first record on, a stop (Ctrl-C, SIGTERM, a failure) still ends the output with the timing record.
    try:
        tokenizer_dir = options.tokenizer_dir or compatible_tokenizer_dir(config, options.run_dir)
        context = BenchContext(config, Path(tokenizer_dir) if tokenizer_dir else None)
        argv = sys.argv if argv is None else argv
        records.append(run_header(options, config, argv, machine, tokenizer_facts(context)))
        # listed before it is written: a stop while it is written (it may be out) still ends with the timing record
        emit(records[0])
        with contextlib.redirect_stdout(sys.stderr):  # TFDS prints progress on stdout: keep it for JSON
            if "train" in options.only:
                with timed("train"):
                    from benchmarks.train_speed import bench_train, train_variants

                    for variant in train_variants(
                        config, options.train_batch_tokens, options.train_bucket_steps
                    ):
                        records += bench_train(
                            context,
                            emit,
                            precisions=options.precisions,
                            xla_settings=options.xla,
                            num_batches=options.train_batches,
                            max_shapes=options.train_shapes,
                            rounds=options.train_rounds,
                            peak_size=options.peak_size,
                            config=variant,
                        )
            if "train_ema" in options.only:
                with timed("train_ema"):
                    from benchmarks.train_ema import bench_train_ema

                    records.append(
                        bench_train_ema(
                            context,
                            emit,
                            ema_decay=options.ema_decay,
                            num_batches=options.train_batches,
                            max_shapes=options.train_shapes,
                            rounds=options.train_rounds,
                        )
                    )
            if "decode" in options.only:
                with timed("decode"):
                    from benchmarks.decode_speed import bench_decode

                    shared = dict(
                        run_dir=options.run_dir,
                        sentences=options.decode_all,
                        beams=options.beams,
                        xla_settings=options.decode_xla_settings,
                    )
                    records += bench_decode(
                        context,
                        emit,
                        no_cache_sentences=options.decode_sentences,
                        ensemble=options.decode_ensemble,
                        **shared,
                    )
                    if options.decode_engines:  # the same model in CTranslate2 and TensorFlow int8
                        from benchmarks.decode_engines import bench_decode_engines

                        records += bench_decode_engines(
                            context,
                            emit,
                            engines=options.decode_engines,
                            patiences=options.ct2_patience,
                            export_dir=options.ct2_dir,
                            **shared,
                        )
            if "attention" in options.only:
                with timed("attention"):
                    from benchmarks.attention_memory import bench_attention

                    records += bench_attention(
                        emit,
                        lengths=options.attention_lengths,
                        d_model=256,
                        num_heads=4,
                        chunk_size=options.chunk_size,
                        window=options.window,
                        memory_budget_mb=options.memory_budget_mb,
                        repeats=options.attention_repeats,
                    )
            if "input" in options.only:
                with timed("input"):
                    from benchmarks.input_speed import bench_input

                    records.append(bench_input(context, emit))
            if "input_scale" in options.only:
                with timed("input_scale"):
                    from benchmarks.input_scale import bench_input_scale

                    records += bench_input_scale(
                        emit,
                        config=options.config,
                        overrides=options.overrides,
                        pairs=options.input_scale_pairs,
                        workdir=options.input_scale_dir,
                    )
            if "refusal" in options.only:  # train.py refusing a run directory in use (README, Reliability)
                with timed("refusal"):
                    from benchmarks.refusal import bench_refusal

                    records.append(bench_refusal(emit, config=options.config, overrides=options.overrides))
        complete = True
    finally:
        if context is not None:
            context.close()
        # each benchmark's wall time on this machine (make bench's, README); also when stopped, once the header is out
        if records:
            timing = {"bench": "timing", "complete": complete, "seconds": seconds}
            timing["total_seconds"] = round(time.perf_counter() - started, 1)
            records.append(emit({**timing, "machine": machine}))
    return records
