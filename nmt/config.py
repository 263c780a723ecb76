"""The typed configuration: every default lives here (the `data:` section in `data.config`), with a one-line comment.

A YAML file may inherit from another with `base: other.yaml` (resolved next to the file, then in `configs/`);
`--set section.key=value` overrides are parsed as YAML scalars. An unknown key, a wrong type, NaN, or a value
outside a field's choices or range (`_range` metadata, next to each field) raises `ConfigError` naming the dotted
path; the CLIs turn it into exit code 2 before anything is written. The checks across fields and sections
(`validate_config`, `new_run_problem`, `ignored_settings`) are in `nmt.config_checks`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from common.config_tree import (  # noqa: F401 - re-exported: callers import them from here
    CONFIG_DIR,
    MAX_INT32,
    ConfigError,
    build,
    load_tree,
    parse_override,
    resolve_config_path,
)
from common.config_tree import choices as _choices
from common.config_tree import value_range as _range
from data.config import DataConfig
from nmt.config_checks import ignored_settings, new_run_problem, validate_config  # noqa: F401 - re-exported

__all__ = [
    "CONFIG_DIR",
    "Config",
    "ConfigError",
    "DataConfig",
    "EvalConfig",
    "ModelConfig",
    "TrainConfig",
    "config_from_dict",
    "load_config",
    "parse_override",
    "resolve_config_path",
]


MAX_ALPHA = 5.0  # the GNMT length penalty's exponent: 0 (none) to this
# beams (and n-best lists) wider than this are typos: a beam of 1,000,000 ran out of memory in a traceback (the
# search studies that widen it go to a few hundred)
MAX_BEAM = 1024

# Upper bounds of the int settings (a larger number passed the config, then failed in a traceback: train.max_steps
# 99999999999999999999 at the step plan's int64 variable, train.warmup_steps at the first step's learning rate).
# Sizes, lengths and counts: MAX_INT32 (common.config_tree), what becomes an int32 tensor or is counted like one.
# Steps and tokens per step: int64 counters (the optimizer's iterations, nmt.budget's plan), with room for their sums
# (a step + train.budget_probe_skip + train.budget_probe_steps).
MAX_INT64 = 2**62
# train.accumulate_steps: the global batch, replicas x data.batch_tokens x accumulate_steps, is an int64 (nmt.budget)
MAX_ACCUMULATE_STEPS = 2**16

# Int ranges; in the _NOT_NEGATIVE ones 0 means off, none, auto or all (see the field's comment)
_INT32_AT_LEAST_1 = _range(min=1, max=MAX_INT32)
_INT32_NOT_NEGATIVE = _range(min=0, max=MAX_INT32)
_INT64_AT_LEAST_1 = _range(min=1, max=MAX_INT64)
_INT64_NOT_NEGATIVE = _range(min=0, max=MAX_INT64)
_NOT_NEGATIVE = _range(min=0)  # floats
_POSITIVE = _range(min=0, min_open=True)
_RATE = _range(min=0, max=1, max_open=True)  # dropouts, smoothing, decays: [0, 1)
_FRACTION = _range(min=0, max=1)


@dataclass
class ModelConfig:
    d_model: int = field(default=256, metadata=_INT32_AT_LEAST_1)  # model width
    num_heads: int = field(default=4, metadata=_INT32_AT_LEAST_1)  # attention heads
    d_ff: int = field(default=1024, metadata=_INT32_AT_LEAST_1)  # feed-forward inner width
    num_layers: int = field(default=3, metadata=_INT32_AT_LEAST_1)  # encoder layers and decoder layers (each)
    dropout: float = field(default=0.1, metadata=_RATE)  # residual / embedding dropout
    attention_dropout: float = field(default=0.0, metadata=_RATE)  # dropout on attention weights
    # Dropout on the feed-forward hidden activations: null = model.dropout (and the plan's, train.dropout_by_plan);
    # a number fixes it
    ffn_dropout: float | None = field(default=None, metadata=_RATE)
    norm: str = field(default="post", metadata=_choices("post", "pre"))  # Post-LN (paper) or Pre-LN
    residual: bool = True  # residual connections (off only for the ablation)
    share_embeddings: bool = True  # one embedding table for source and target (needs joint_vocab)
    tie_output: bool = True  # output projection = target embedding transposed
    share_qkv: str = field(default="none", metadata=_choices("none", "qk", "all"))  # projection sharing
    attention: str = field(default="full", metadata=_choices("full", "chunked", "local"))  # encoder self-attn
    chunk_size: int = field(
        default=64, metadata=_INT32_AT_LEAST_1
    )  # chunk length for chunked (memory-efficient) attention
    window: int = field(
        default=16, metadata=_INT32_NOT_NEGATIVE
    )  # half-width of the band for local attention (0 = self)
    scale: float | None = field(
        default=None, metadata=_POSITIVE
    )  # attention score scale; None = 1/sqrt(depth)
    mask_fill: str | float = "auto"  # "auto" = dtype-aware, exact zeros; a float (e.g. -1e9) for the ablation
    max_length: int = field(default=512, metadata=_INT32_AT_LEAST_1)  # size of the sinusoidal position table


@dataclass
class TrainConfig:
    seed: int = field(
        default=1234, metadata=_range(min=0, max=2**32 - 1)
    )  # seeds weights, dropout and data order (NumPy's range)
    init_from: str | None = None  # fine-tuning: a new run starts from this run's weights and tokenizer
    max_steps: int = field(
        default=0, metadata=_INT64_NOT_NEGATIVE
    )  # optimizer steps to run in all (0 = no step limit)
    max_minutes: float = field(
        default=0.0, metadata=_NOT_NEGATIVE
    )  # budget of training-step time across resumes, evaluations and saves not counted (0 = none)
    learning_rate: float = field(
        default=1e-3, metadata=_POSITIVE
    )  # peak learning rate (end of warmup) for a global batch of reference_batch_tokens
    reference_batch_tokens: int = field(
        default=0, metadata=_INT64_NOT_NEGATIVE
    )  # global batch learning_rate is for; 0 = one replica's (batch x accumulation)
    learning_rate_scaling: str = field(
        default="sqrt", metadata=_choices("sqrt", "linear", "none")
    )  # peak = learning_rate x (global batch / reference_batch_tokens) ^ (1/2 | 1 | 0)
    allow_batch_change: bool = False  # resume a checkpoint of another replica count / accumulate_steps (data.batch_tokens stays fixed)
    warmup_steps: int = field(
        default=4000, metadata=_INT64_NOT_NEGATIVE
    )  # linear warmup, then the decay of `schedule`
    schedule: str = field(
        default="inverse_sqrt", metadata=_choices("inverse_sqrt", "linear", "cosine")
    )  # decay after warmup; linear/cosine reach their floor at the planned last step (max_steps or max_minutes)
    min_learning_rate_fraction: float = field(
        default=0.1, metadata=_FRACTION
    )  # linear/cosine: the floor, as a fraction of the peak learning rate
    budget_probe_skip: int = field(
        default=20, metadata=_INT64_NOT_NEGATIVE
    )  # max_minutes: first steps of each process left out of the step-rate probe
    budget_probe_steps: int = field(
        default=100, metadata=_INT64_AT_LEAST_1
    )  # max_minutes: steps timed to plan the run's total steps (nmt.budget)
    # max_minutes: plan again at this fraction of the planned decay, from the rate timed since half of it
    # (0 = keep the first plan; nmt.budget)
    budget_replan_at: float = field(default=0.6, metadata=_RATE)
    beta_1: float = field(default=0.9, metadata=_RATE)  # Adam beta_1
    beta_2: float = field(default=0.98, metadata=_RATE)  # Adam beta_2
    epsilon: float = field(default=1e-9, metadata=_POSITIVE)  # Adam epsilon
    label_smoothing: float = field(default=0.1, metadata=_RATE)  # label smoothing of the cross-entropy
    dropout_by_plan: list[list[float]] = field(
        default_factory=list
    )  # [[planned steps, dropout], ...]: once the step plan is fixed, model.dropout becomes the piecewise-linear
    # value at the planned steps (flat beyond the ends; nmt.budget); empty = model.dropout throughout
    ffn_dropout_by_plan: list[list[float]] = field(
        default_factory=list
    )  # [[planned steps, dropout], ...]: the same for the feed-forward hidden dropout alone, applied after
    # dropout_by_plan and fixing it as model.ffn_dropout would; empty = model.ffn_dropout (or the dropout) throughout
    clipnorm: float = field(
        default=1.0, metadata=_NOT_NEGATIVE
    )  # global gradient-norm clip, unscaled (0 = off)
    precision: str = field(
        default="auto", metadata=_choices("auto", "float32", "mixed_float16", "mixed_bfloat16")
    )  # auto = fastest safe policy for the device
    # The train step: true (jit_compile), false, fusible (XLA fuses all but the matmuls, nmt.xla; for long runs)
    # or auto (true on GPU/TPU, false on CPU)
    xla: bool | str = "auto"
    accumulate_steps: int = field(
        default=1, metadata=_range(min=1, max=MAX_ACCUMULATE_STEPS)
    )  # batches per optimizer step (gradients normalised by true token count)
    distribute: str = field(
        default="none", metadata=_choices("none", "mirrored", "multi_worker", "tpu")
    )  # tf.distribute strategy
    cluster_wait_minutes: float = field(
        default=10.0, metadata=_NOT_NEGATIVE
    )  # multi_worker: how long a task waits for the others of its cluster to start (0 = no limit)
    log_every: int = field(
        default=50, metadata=_INT64_AT_LEAST_1
    )  # steps between TensorBoard scalars and progress
    checkpoint_every: int = field(default=500, metadata=_INT64_AT_LEAST_1)  # steps between checkpoints
    keep_checkpoints: int = field(
        default=5, metadata=_INT32_AT_LEAST_1
    )  # checkpoints kept on disk (at least average_last; a stop's, off the checkpoint_every grid, beside them)
    eval_every: int = field(
        default=1000, metadata=_INT64_NOT_NEGATIVE
    )  # steps between validation losses (0 = off)
    bleu_every: int = field(
        default=2000, metadata=_INT64_NOT_NEGATIVE
    )  # steps between validation BLEU (greedy) evaluations (0 = off)
    bleu_max_sentences: int = field(
        default=0, metadata=_INT32_NOT_NEGATIVE
    )  # validation sentences decoded for BLEU during training (0 = all)
    early_stopping: int = field(
        default=0, metadata=_INT32_NOT_NEGATIVE
    )  # stop after this many BLEU evaluations without improvement (0 = off)
    average_last: int = field(
        default=0, metadata=_INT32_NOT_NEGATIVE
    )  # average the last K checkpoints into the final weights (0 = off)
    average_fraction: float = field(
        default=0.0, metadata=_FRACTION
    )  # >0: the K averaged snapshots spread over this last fraction of the planned steps
    # Exponential moving average of the weights (0 = off); with average_last, final/ keeps whichever of the EMA and
    # the average has the lower validation loss
    ema_decay: float = field(default=0.0, metadata=_RATE)
    max_bad_steps: int = field(
        default=10, metadata=_INT64_NOT_NEGATIVE
    )  # consecutive non-finite steps tolerated before the run stops


@dataclass
class EvalConfig:
    beam_size: int = field(default=4, metadata=_range(min=1, max=MAX_BEAM))  # beam width (1 = greedy)
    alpha: float = field(default=0.6, metadata=_range(min=0, max=MAX_ALPHA))  # GNMT length penalty exponent
    max_length_a: float = field(
        default=1.5, metadata=_NOT_NEGATIVE
    )  # maximum output length = a * source length + b
    max_length_b: int = field(default=10, metadata=_INT32_NOT_NEGATIVE)  # see max_length_a
    batch_size: int = field(
        default=256, metadata=_INT32_AT_LEAST_1
    )  # sentences per decoding batch (test2016 on the Zen 4: 1.3x greedy, 1.4x beam 4 vs 64)
    streams: int = field(
        default=0, metadata=_range(min=0, max=MAX_INT32, why="0 = auto")
    )  # decoding batches in flight at once (threads); 0 = auto: 2 on a CPU with 2+ cores, 1 on a GPU


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def fingerprint(self) -> int:
        """A 48-bit hash (exact as a float64) of every setting the workers of one multi-worker run must share: all
        but `PER_WORKER_KEYS`."""
        tree = self.to_dict()
        for section, key in PER_WORKER_KEYS:
            tree[section].pop(key, None)
        return int(hashlib.sha256(json.dumps(tree, sort_keys=True).encode()).hexdigest()[:12], 16)


# Where the data is stored, not what it is: may change between runs (e.g. a mirror set after a failed run) and
# differ between the workers of one run. And how the tokenizer would be sampled, which the run directory's own
# tokenizer has settled (the default changed from 2M to 1M sentences: runs saved with the old default still resume).
LOCATION_KEYS = {
    ("data", "data_dir"),
    ("data", "manual_dir"),
    ("data", "cache_dir"),
    ("data", "tokenizer_max_sentences"),
}
# What the workers of one multi-worker run may hold differently: where the data is stored and how long each waits
# for the others to start (`nmt.cluster.wait_for_peers`). Not the time budget: each worker plans its steps from it
# (nmt.budget), and workers with two plans would apply two learning-rate schedules (and dropouts) to the same
# all-reduced gradients.
PER_WORKER_KEYS = LOCATION_KEYS | {("train", "cluster_wait_minutes")}


# ----------------------------------------------------------------------------------------------------------------
# Loading


def search_setting_problem(beam_size: int | None, alpha: float | None) -> str:
    """What is wrong with a beam size and length penalty ("" if nothing; None = not given), naming the setting.

    For the decoding CLIs' --beam/--alpha; the config's eval.beam_size and eval.alpha have the same bounds (`_range`).
    """
    if beam_size is not None and not 1 <= beam_size <= MAX_BEAM:
        return f"beam_size must be between 1 and {MAX_BEAM}, got {beam_size}"
    if alpha is not None and not 0.0 <= alpha <= MAX_ALPHA:
        return f"alpha must be between 0 and {MAX_ALPHA:g}, got {alpha}"
    return ""


def config_from_dict(tree: dict) -> Config:
    config = build(Config, tree, "")
    validate_config(config)
    return config


def load_config(name: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Loads a YAML config (with inheritance), applies `--set` overrides, validates everything."""
    return config_from_dict(load_tree(name, overrides))


PATH_KEYS = (("data", "folder"), ("data", "cache_dir"), ("data", "manual_dir"), ("data", "data_dir"),
             ("train", "init_from"))  # fmt: skip


def absolute_paths(config: Config) -> Config:
    """`config` with its relative paths (`PATH_KEYS`; `~` expanded) made absolute against the working directory,
    where they meant something: what a run directory's config.yaml holds, read later from anywhere."""
    import os

    sections = {}
    for section, key in PATH_KEYS:
        value = getattr(getattr(config, section), key)
        if isinstance(value, str) and value:
            absolute = os.path.abspath(os.path.expanduser(value))
            sections.setdefault(section, {})[key] = absolute
    return dataclasses.replace(
        config,
        **{name: dataclasses.replace(getattr(config, name), **values) for name, values in sections.items()},
    )
