"""The typed configuration: every default lives here (the `data:` section in `data.config`), with a one-line comment.

A YAML file may inherit from another with `base: other.yaml` (resolved next to the file, then in `configs/`);
`--set section.key=value` overrides are parsed as YAML scalars. An unknown key, a wrong type or a value outside
a field's choices raises `ConfigError` naming the dotted path; the CLIs turn it into exit code 2 before anything
is written.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from common.config_tree import (  # noqa: F401 - re-exported: callers import them from here
    CONFIG_DIR,
    ConfigError,
    build,
    load_tree,
    parse_override,
    resolve_config_path,
)
from common.config_tree import choices as _choices
from data.config import DataConfig, validate_data_config

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


@dataclass
class ModelConfig:
    d_model: int = 256  # model width
    num_heads: int = 4  # attention heads
    d_ff: int = 1024  # feed-forward inner width
    num_layers: int = 3  # encoder layers and decoder layers (each)
    dropout: float = 0.1  # residual / embedding dropout
    attention_dropout: float = 0.0  # dropout on attention weights
    # Dropout on the feed-forward hidden activations: null = model.dropout (and the plan's, train.dropout_by_plan);
    # a number fixes it
    ffn_dropout: float | None = None
    norm: str = field(default="post", metadata=_choices("post", "pre"))  # Post-LN (paper) or Pre-LN
    residual: bool = True  # residual connections (off only for the ablation)
    share_embeddings: bool = True  # one embedding table for source and target (needs joint_vocab)
    tie_output: bool = True  # output projection = target embedding transposed
    share_qkv: str = field(default="none", metadata=_choices("none", "qk", "all"))  # projection sharing
    attention: str = field(default="full", metadata=_choices("full", "chunked", "local"))  # encoder self-attn
    chunk_size: int = 64  # chunk length for chunked (memory-efficient) attention
    window: int = 16  # half-width of the band for local attention
    scale: float | None = None  # attention score scale; None = 1/sqrt(depth)
    mask_fill: str | float = "auto"  # "auto" = dtype-aware, exact zeros; a float (e.g. -1e9) for the ablation
    max_length: int = 512  # size of the sinusoidal position table


@dataclass
class TrainConfig:
    seed: int = 1234  # seeds weights, dropout and data order
    max_steps: int = 0  # optimizer steps to run in all (0 = no step limit)
    max_minutes: float = 0.0  # wall-clock training budget across resumes (0 = none)
    learning_rate: float = (
        1e-3  # peak learning rate (end of warmup) for a global batch of reference_batch_tokens
    )
    reference_batch_tokens: int = (
        0  # global batch learning_rate is for; 0 = one replica's (batch x accumulation)
    )
    learning_rate_scaling: str = field(
        default="sqrt", metadata=_choices("sqrt", "linear", "none")
    )  # peak = learning_rate x (global batch / reference_batch_tokens) ^ (1/2 | 1 | 0)
    allow_batch_change: bool = (
        False  # resume a checkpoint of another replica count / global batch (else refused)
    )
    warmup_steps: int = 4000  # linear warmup, then the decay of `schedule`
    schedule: str = field(
        default="inverse_sqrt", metadata=_choices("inverse_sqrt", "linear", "cosine")
    )  # decay after warmup; linear/cosine reach their floor at the planned last step (max_steps or max_minutes)
    min_learning_rate_fraction: float = (
        0.1  # linear/cosine: the floor, as a fraction of the peak learning rate
    )
    budget_probe_skip: int = 20  # max_minutes: first steps of each process left out of the step-rate probe
    budget_probe_steps: int = 100  # max_minutes: steps timed to plan the run's total steps (nmt.budget)
    budget_replan_at: float = 0.6  # max_minutes: plan again at this fraction of the planned decay, from the
    # rate timed since half of it (0 = keep the first plan; nmt.budget)
    beta_1: float = 0.9  # Adam beta_1
    beta_2: float = 0.98  # Adam beta_2
    epsilon: float = 1e-9  # Adam epsilon
    label_smoothing: float = 0.1  # label smoothing of the cross-entropy
    dropout_by_plan: list[list[float]] = field(
        default_factory=list
    )  # [[planned steps, dropout], ...]: once the step plan is fixed, model.dropout becomes the piecewise-linear
    # value at the planned steps (flat beyond the ends; nmt.budget); empty = model.dropout throughout
    ffn_dropout_by_plan: list[list[float]] = field(
        default_factory=list
    )  # [[planned steps, dropout], ...]: the same for the feed-forward hidden dropout alone, applied after
    # dropout_by_plan and fixing it as model.ffn_dropout would; empty = model.ffn_dropout (or the dropout) throughout
    clipnorm: float = 1.0  # global gradient-norm clip on unscaled gradients (0 = off)
    precision: str = field(
        default="auto", metadata=_choices("auto", "float32", "mixed_float16", "mixed_bfloat16")
    )  # auto = fastest safe policy for the device
    # The train step: true (jit_compile), false, fusible (XLA fuses all but the matmuls, nmt.xla; for long runs)
    # or auto (true on GPU/TPU, false on CPU)
    xla: bool | str = "auto"
    accumulate_steps: int = 1  # batches per optimizer step (gradients normalised by true token count)
    distribute: str = field(
        default="none", metadata=_choices("none", "mirrored", "multi_worker", "tpu")
    )  # tf.distribute strategy
    log_every: int = 50  # steps between TensorBoard scalars and progress updates
    checkpoint_every: int = 500  # steps between checkpoints
    keep_checkpoints: int = 5  # checkpoints kept on disk
    eval_every: int = 1000  # steps between validation-loss evaluations
    bleu_every: int = 2000  # steps between validation BLEU (greedy) evaluations (0 = off)
    bleu_max_sentences: int = 0  # validation sentences decoded for BLEU during training (0 = all)
    early_stopping: int = 0  # stop after this many BLEU evaluations without improvement (0 = off)
    average_last: int = 0  # average the last K checkpoints into the final weights (0 = off)
    average_fraction: float = (
        0.0  # >0: the K averaged snapshots spread over this last fraction of the planned steps
    )
    ema_decay: float = 0.0  # exponential moving average of weights (0 = off); with average_last, final/ keeps
    # whichever of the EMA and the average has the lower validation loss
    max_bad_steps: int = 10  # consecutive non-finite steps tolerated before the run stops


@dataclass
class EvalConfig:
    beam_size: int = 4  # beam width (1 = greedy)
    alpha: float = 0.6  # GNMT length penalty exponent
    max_length_a: float = 1.5  # maximum output length = a * source length + b
    max_length_b: int = 10  # see max_length_a
    batch_size: int = (
        256  # sentences per decoding batch (test2016 on the Zen 4: 1.3x greedy, 1.4x beam 4 vs 64)
    )
    streams: int = (
        0  # decoding batches in flight at once (threads); 0 = auto: 2 on a CPU with 2+ cores, 1 on a GPU
    )


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


# ----------------------------------------------------------------------------------------------------------------
# Loading


def _validate(config: Config) -> None:
    if config.train.xla not in (True, False, "auto", "fusible"):
        raise ConfigError(f"train.xla: expected true, false, fusible or auto, got {config.train.xla!r}")
    if isinstance(config.model.mask_fill, str) and config.model.mask_fill != "auto":
        raise ConfigError(f"model.mask_fill: expected 'auto' or a number, got {config.model.mask_fill!r}")
    if config.model.d_model % config.model.num_heads:
        raise ConfigError(
            f"model.d_model: {config.model.d_model} is not divisible by model.num_heads={config.model.num_heads}"
        )
    if config.model.share_embeddings and not config.data.joint_vocab:
        raise ConfigError("model.share_embeddings: true needs data.joint_vocab: true")
    for name in ("num_layers", "num_heads", "d_model", "d_ff"):
        if getattr(config.model, name) <= 0:
            raise ConfigError(f"model.{name}: must be positive")
    for name in ("dropout", "attention_dropout", "ffn_dropout"):
        rate = getattr(config.model, name)
        if rate is not None and not 0.0 <= rate < 1.0:
            raise ConfigError(f"model.{name}: a dropout must be in [0, 1), got {rate:g}")
    validate_data_config(config.data)
    if config.data.max_length > config.model.max_length:
        raise ConfigError(
            f"data.max_length: {config.data.max_length} exceeds model.max_length={config.model.max_length}"
        )
    _validate_train(config.train)
    ffn_planned = any(rate > 0 for _, rate in config.train.ffn_dropout_by_plan)
    if config.model.dropout == 0 and any(rate > 0 for _, rate in config.train.dropout_by_plan):
        also = " train.ffn_dropout_by_plan=[]" if ffn_planned and config.model.ffn_dropout is None else ""
        raise ConfigError(
            "model.dropout: 0 cannot be raised by train.dropout_by_plan once the step plan is fixed (a model built "
            f"without dropout has no dropout state); add train.dropout_by_plan=[]{also} to train without dropout"
        )
    ffn_built = config.model.dropout if config.model.ffn_dropout is None else config.model.ffn_dropout
    if ffn_built == 0 and ffn_planned:
        raise ConfigError(
            "model.ffn_dropout: a feed-forward block built without dropout cannot be raised by "
            "train.ffn_dropout_by_plan once the step plan is fixed (no dropout state); add "
            "train.ffn_dropout_by_plan=[] to train it without dropout"
        )
    if problem := search_setting_problem(config.eval.beam_size, config.eval.alpha):
        raise ConfigError(f"eval.{problem}")
    if config.eval.streams < 0:
        raise ConfigError(f"eval.streams: must be >= 0 (0 = auto), got {config.eval.streams}")


MAX_ALPHA = 5.0  # the GNMT length penalty's exponent: 0 (none) to this


def search_setting_problem(beam_size: int | None, alpha: float | None) -> str:
    """What is wrong with a beam size and length penalty ("" if nothing; None = not given), naming the setting."""
    if beam_size is not None and beam_size < 1:
        return f"beam_size must be at least 1, got {beam_size}"
    if alpha is not None and not 0.0 <= alpha <= MAX_ALPHA:
        return f"alpha must be between 0 and {MAX_ALPHA:g}, got {alpha}"
    return ""


def _validate_train(train: TrainConfig) -> None:
    if train.accumulate_steps < 1:
        raise ConfigError("train.accumulate_steps: must be at least 1")
    if train.schedule != "inverse_sqrt" and not (train.max_steps or train.max_minutes):
        raise ConfigError(
            f"train.schedule: {train.schedule} decays to its floor at the planned last step: it needs "
            "train.max_steps or train.max_minutes"
        )
    for name in ("min_learning_rate_fraction", "average_fraction"):
        if not 0.0 <= getattr(train, name) <= 1.0:
            raise ConfigError(f"train.{name}: must be between 0 and 1, got {getattr(train, name)}")
    for name in ("reference_batch_tokens", "budget_probe_skip"):
        if getattr(train, name) < 0:
            raise ConfigError(f"train.{name}: must not be negative")
    if train.budget_probe_steps < 1:
        raise ConfigError("train.budget_probe_steps: must be at least 1")
    if not 0 <= train.budget_replan_at < 1:
        raise ConfigError(f"train.budget_replan_at: must be in [0, 1), got {train.budget_replan_at}")
    for name in ("dropout_by_plan", "ffn_dropout_by_plan"):
        _validate_dropout_by_plan(f"train.{name}", getattr(train, name))
        if getattr(train, name) and not (train.max_steps or train.max_minutes):
            raise ConfigError(f"train.{name}: needs a step plan, from train.max_steps or train.max_minutes")


def _validate_dropout_by_plan(name: str, points: list[list[float]]) -> None:
    previous = 0
    for point in points:
        if len(point) != 2:
            raise ConfigError(f"{name}: expected [planned steps, dropout] pairs, got {point!r}")
        steps, rate = point
        if steps <= previous:
            raise ConfigError(
                f"{name}: planned steps must be positive and increasing, got {steps:g} after {previous:g}"
            )
        if not 0.0 <= rate < 1.0:
            raise ConfigError(f"{name}: a dropout must be in [0, 1), got {rate:g} at {steps:g} steps")
        previous = steps


def config_from_dict(tree: dict) -> Config:
    config = build(Config, tree, "")
    _validate(config)
    return config


def load_config(name: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Loads a YAML config (with inheritance), applies `--set` overrides, validates everything."""
    return config_from_dict(load_tree(name, overrides))
