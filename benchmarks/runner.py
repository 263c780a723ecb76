"""Runs the selected benchmarks in one process, in a fixed order (`benchmarks.options.BENCHES`: train, train_ema,
decode, ...).

Settings live in `benchmarks.options.BenchOptions`, checked there by `check_options` and `check_config`. The records
open with `{"bench": "run"}` (`run_header`: command line, commit, config, model, the tokenizer's sizes, options,
versions, machine facts with the load average before the first benchmark) and close with `{"bench": "timing"}` (wall
seconds per benchmark, the same machine facts; written also when stopped).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import time
from pathlib import Path

from benchmarks.common import BenchContext, JsonLines
from benchmarks.options import BenchOptions, check_config, check_options

log = logging.getLogger("benchmarks")

ROOT = Path(__file__).resolve().parents[1]  # the repository: its commit goes into the first record

TOKENIZER_FIELDS = ("dataset", "source", "target", "folder", "train_split", "tokenizer", "vocab_size",
                    "joint_vocab", "tokenizer_max_sentences")  # fmt: skip


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
