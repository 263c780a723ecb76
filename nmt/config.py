"""The typed configuration: every default lives here, with a one-line comment.

A YAML file may inherit from another with `base: other.yaml` (resolved next to the file, then in `configs/`);
`--set section.key=value` overrides are parsed as YAML scalars. An unknown key, a wrong type or a value outside
a field's choices raises `ConfigError` naming the dotted path; the CLIs turn it into exit code 2 before anything
is written.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
    """A configuration problem; its message names the dotted path (or file) at fault."""


def _choices(*values: Any) -> dict:
    return {"choices": values}


@dataclass
class DataConfig:
    dataset: str = "multi30k"  # "multi30k", a TFDS catalog name ("ted_hrlr_translate/pt_to_en"), or "folder"
    source: str = "en"  # source language code
    target: str = "de"  # target language code
    data_dir: str | None = (
        None  # TFDS data_dir for prepared datasets; None = $TFDS_DATA_DIR or ~/tensorflow_datasets
    )
    manual_dir: str | None = (
        None  # local mirror of the raw files; None = $NMT_DATA_MIRROR, then ../shared/data/<name>
    )
    folder: str | None = (
        None  # with dataset: folder, a folder of parallel text files (TranslateFolder layout)
    )
    train_split: str = "train"  # split used for training and for the tokenizer
    validation_split: str = "validation"  # split for validation loss / BLEU during training
    test_split: str = "test"  # split for the final test score (Multi30k: test2016 flickr)
    tokenizer: str = field(default="unigram", metadata=_choices("unigram", "bpe"))  # SentencePiece model type
    vocab_size: int = 8000  # SentencePiece vocabulary size (padded up to a multiple of 8 in the model)
    joint_vocab: bool = True  # one vocabulary for source and target (needed for shared embeddings)
    tokenizer_max_sentences: int = 2_000_000  # sentences sampled to train SentencePiece
    max_length: int = 128  # drop training pairs longer than this many subwords (with BOS/EOS) on either side
    batch_tokens: int = 4096  # tokens per training batch (padded source or target, whichever is longer)
    bucket_boundaries: list[int] = field(default_factory=list)  # bucket edges; empty = automatic
    shuffle_buffer: int = 30000  # examples in the shuffle buffer
    eval_batch_tokens: int = 8192  # tokens per validation-loss batch


@dataclass
class ModelConfig:
    d_model: int = 256  # model width
    num_heads: int = 4  # attention heads
    d_ff: int = 1024  # feed-forward inner width
    num_layers: int = 3  # encoder layers and decoder layers (each)
    dropout: float = 0.1  # residual / embedding dropout
    attention_dropout: float = 0.0  # dropout on attention weights
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
    learning_rate: float = 1e-3  # peak learning rate (reached at the end of warmup)
    warmup_steps: int = 4000  # linear warmup, then inverse square-root decay
    beta_1: float = 0.9  # Adam beta_1
    beta_2: float = 0.98  # Adam beta_2
    epsilon: float = 1e-9  # Adam epsilon
    label_smoothing: float = 0.1  # label smoothing of the cross-entropy
    clipnorm: float = 1.0  # global gradient-norm clip on unscaled gradients (0 = off)
    precision: str = field(
        default="auto", metadata=_choices("auto", "float32", "mixed_float16", "mixed_bfloat16")
    )  # auto = fastest safe policy for the device
    xla: bool | str = "auto"  # jit_compile the train step: true, false or auto (on for GPU/TPU)
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
    ema_decay: float = 0.0  # exponential moving average of weights (0 = off)
    max_bad_steps: int = 10  # consecutive non-finite steps tolerated before the run stops


@dataclass
class EvalConfig:
    beam_size: int = 4  # beam width (1 = greedy)
    alpha: float = 0.6  # GNMT length penalty exponent
    max_length_a: float = 1.5  # maximum output length = a * source length + b
    max_length_b: int = 10  # see max_length_a
    batch_size: int = 64  # sentences per decoding batch


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


def resolve_config_path(name: str | Path, relative_to: Path | None = None) -> Path:
    """A path as given, else next to `relative_to`, else in configs/ (with or without `.yaml`)."""
    name = Path(name)
    candidates = [name]
    if relative_to is not None:
        candidates.append(relative_to / name)
    candidates += [CONFIG_DIR / name, CONFIG_DIR / f"{name}.yaml"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ConfigError(f"config file not found: {name} (looked in {', '.join(str(c) for c in candidates)})")


def _read_yaml(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read config file {path}: {err}") from err
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"invalid YAML in {path}: {err}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def _merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _load_tree(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"config inheritance loop: {' -> '.join(str(p) for p in (*seen, path))}")
    tree = _read_yaml(path)
    base = tree.pop("base", None)
    if base is None:
        return tree
    if not isinstance(base, str):
        raise ConfigError(f"{path}: base: expected a file name, got {type(base).__name__}")
    parent = _load_tree(resolve_config_path(base, relative_to=path.parent), (*seen, path))
    return _merge(parent, tree)


def parse_override(text: str) -> tuple[list[str], Any]:
    """`section.key=value` -> (["section", "key"], value parsed as a YAML scalar)."""
    if "=" not in text:
        raise ConfigError(f"--set expects section.key=value, got {text!r}")
    dotted, raw = text.split("=", 1)
    keys = dotted.strip().split(".")
    if not all(keys):
        raise ConfigError(f"--set expects section.key=value, got {text!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise ConfigError(f"--set {dotted}: cannot parse value {raw!r}: {err}") from err
    return keys, value


def _type_ok(value: Any, annotation: Any) -> tuple[bool, Any]:
    """Checks `value` against a field annotation; returns (ok, converted value)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(annotation):
            ok, converted = _type_ok(value, option)
            if ok:
                return True, converted
        return False, value
    if annotation is type(None):
        return value is None, value
    if origin is list:
        (item_type,) = typing.get_args(annotation)
        if not isinstance(value, list):
            return False, value
        items = [_type_ok(v, item_type) for v in value]
        return all(ok for ok, _ in items), [v for _, v in items]
    if annotation is bool:
        return isinstance(value, bool), value
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, float(value)
        return False, value
    if annotation is str:
        return isinstance(value, str), value
    raise TypeError(f"unsupported annotation {annotation!r}")


def _describe(annotation: Any) -> str:
    return str(annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")


def _build(cls: type, tree: Any, path: str):
    if not isinstance(tree, dict):
        raise ConfigError(f"{path.rstrip('.') or 'config'}: expected a mapping, got {type(tree).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(tree) - set(fields))
    if unknown:
        known = ", ".join(sorted(fields))
        raise ConfigError(
            f"unknown config key {path}{unknown[0]} (known keys of {path[:-1] or 'top level'}: {known})"
        )
    kwargs = {}
    for name, value in tree.items():
        dotted = f"{path}{name}"
        annotation = hints[name]
        if dataclasses.is_dataclass(annotation):
            kwargs[name] = _build(annotation, value, f"{dotted}.")
            continue
        ok, converted = _type_ok(value, annotation)
        if not ok:
            raise ConfigError(
                f"{dotted}: expected {_describe(annotation)}, got {type(value).__name__} {value!r}"
            )
        choices = fields[name].metadata.get("choices")
        if choices and converted not in choices:
            raise ConfigError(f"{dotted}: {converted!r} is not one of {', '.join(map(str, choices))}")
        kwargs[name] = converted
    return cls(**kwargs)


def _validate(config: Config) -> None:
    if config.train.xla not in (True, False, "auto"):
        raise ConfigError(f"train.xla: expected true, false or auto, got {config.train.xla!r}")
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
    for name in ("vocab_size", "max_length", "batch_tokens", "eval_batch_tokens"):
        if getattr(config.data, name) <= 0:
            raise ConfigError(f"data.{name}: must be positive")
    if config.data.max_length > config.model.max_length:
        raise ConfigError(
            f"data.max_length: {config.data.max_length} exceeds model.max_length={config.model.max_length}"
        )
    if config.train.accumulate_steps < 1:
        raise ConfigError("train.accumulate_steps: must be at least 1")
    if config.eval.beam_size < 1:
        raise ConfigError("eval.beam_size: must be at least 1")


def config_from_dict(tree: dict) -> Config:
    config = _build(Config, tree, "")
    _validate(config)
    return config


def load_config(name: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Loads a YAML config (with inheritance), applies `--set` overrides, validates everything."""
    tree = _load_tree(resolve_config_path(name)) if name is not None else {}
    for text in overrides:
        keys, value = parse_override(text)
        node = tree
        for key in keys[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {'.'.join(keys)}: {key} is not a section")
            node = child
        node[keys[-1]] = value
    return config_from_dict(tree)
