"""Benchmark settings: `BenchOptions` (what bench.py asks for) and the checks of them.

`BenchOptions.quick()` is the ~1-minute smoke (configs/tiny.yaml, float32 without XLA, a few batches and sentences,
short attention lengths). `check_options` and `check_config` refuse what cannot be measured (bench.py: exit 2).
`BENCHES` lists the benchmarks in the order `benchmarks.runner.run_benchmarks` runs them.
"""

from __future__ import annotations

import dataclasses
import math

BENCHES = ("train", "train_ema", "decode", "attention", "input", "input_scale", "refusal")
DECODE_ENGINES = ("ctranslate2", "tensorflow_int8")  # benchmarks.decode_engines.ENGINES, without its imports


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
