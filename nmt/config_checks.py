"""Cross-field checks of a whole `Config`, beyond each field's own type, choices and range (`nmt.config`).

- `validate_config`: what every config is refused for (`load_config`, `config_from_dict`), as `ConfigError`;
- `new_run_problem`: what only a new run refuses (train.py, ablate.py), settings a saved run may still hold;
- `ignored_settings`: settings accepted that do nothing in the config, said once at the start.

`nmt.config` re-exports `new_run_problem` and `ignored_settings` (callers import them from there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.config_tree import ConfigError
from data.config import new_data_problem, validate_data_config

if TYPE_CHECKING:
    from nmt.config import Config, TrainConfig


def new_run_problem(config: Config) -> str:
    """What train.py refuses for a new run (exit 2) but loads in a saved run's config.yaml, as a message ("" if
    nothing): settings accepted before 2026-12-07d, whose runs stay translatable, evaluable and resumable."""
    # Beyond every position a chunk or band only pads: memory for nothing, to an out-of-memory error
    model = config.model
    if model.attention == "chunked" and model.chunk_size > model.max_length:
        return (
            f"model.chunk_size: {model.chunk_size} exceeds model.max_length={model.max_length}, the longest "
            "sequence: a chunk longer only pads"
        )
    if model.attention == "local" and model.window >= model.max_length:
        return (
            f"model.window: {model.window} reaches past model.max_length={model.max_length}: every position "
            "sees every other, which is model.attention: full (without the band's padding)"
        )
    return new_data_problem(config.data)


def validate_config(config: Config) -> None:
    """Raises `ConfigError`, naming the setting, for what no config may hold across its fields and sections."""
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


def ignored_settings(train: TrainConfig) -> list[str]:
    """Train settings accepted (a boundary, an experiment switched off in part) that do nothing in this config:
    said once at the start, not discovered in the final weights' log."""
    notes = []
    if train.average_last == 1:
        notes.append("train.average_last 1 averages one checkpoint: nothing (0 is off; 2 or more average)")
    if train.average_fraction and train.average_last < 2:
        notes.append(
            f"train.average_fraction {train.average_fraction:g} spreads train.average_last snapshots, and "
            f"average_last is {train.average_last}: no effect"
        )
    elif train.average_fraction and not (train.max_steps or train.max_minutes):
        notes.append(
            f"train.average_fraction {train.average_fraction:g} spreads the snapshots over the planned steps, and "
            "there is no step plan (train.max_steps and train.max_minutes are 0): the last checkpoints are averaged"
        )
    return notes


def _validate_train(train: TrainConfig) -> None:
    if train.schedule != "inverse_sqrt" and not (train.max_steps or train.max_minutes):
        raise ConfigError(
            f"train.schedule: {train.schedule} decays to its floor at the planned last step: it needs "
            "train.max_steps or train.max_minutes"
        )
    if train.early_stopping and not train.bleu_every:
        raise ConfigError(
            "train.early_stopping counts greedy validation BLEU evaluations, and train.bleu_every is 0 (none): set "
            "train.bleu_every, or train.early_stopping=0"
        )
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
