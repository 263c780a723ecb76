"""`DataConfig`, the `data:` section of a config file, and its loading for the `data` CLIs.

`nmt.config` embeds it in the whole `Config` (and re-exports it). The `data` CLIs read the same files with
`load_data_config`: inheritance, `--set` overrides and strict validation of the `data:` section; the other
sections belong to other packages and are only carried along.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from common.config_tree import ConfigError, build, choices, load_tree


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
    cache_dir: str | None = (
        None  # prepared (tokenized) data; None = $NMT_DATA_CACHE, else ~/.cache/nmt/prepared
    )
    train_split: str = "train"  # split used for training and for the tokenizer
    validation_split: str = "validation"  # split for validation loss / BLEU during training
    test_split: str = "test"  # split for the final test score (Multi30k: test2016 flickr)
    tokenizer: str = field(default="unigram", metadata=choices("unigram", "bpe"))  # SentencePiece model type
    vocab_size: int = 8000  # SentencePiece vocabulary size (padded up to a multiple of 8 in the model)
    joint_vocab: bool = True  # one vocabulary for source and target (needed for shared embeddings)
    tokenizer_max_sentences: int = 1_000_000  # at most this many sentences sampled to train SentencePiece
    max_length: int = 128  # drop training pairs longer than this many subwords (with BOS/EOS) on either side
    batch_tokens: int = 4096  # tokens per training batch PER REPLICA (padded source or target, the longer)
    bucket_boundaries: list[int] = field(default_factory=list)  # bucket edges; empty = automatic
    eval_batch_tokens: int = 8192  # tokens per validation-loss batch
    subword_dropout: float = (
        0.0  # training only: probability a piece is split into two vocabulary pieces (0 = off)
    )

    # Keys of older versions, accepted (with a warning) and ignored, so saved run configs still load.
    LEGACY_KEYS = {"shuffle_buffer": "batches come from a full permutation per epoch, there is no buffer"}


def validate_data_config(cfg: DataConfig) -> None:
    """Checks what types alone do not; `ConfigError` naming the key."""
    for name in ("vocab_size", "max_length", "batch_tokens", "eval_batch_tokens", "tokenizer_max_sentences"):
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"data.{name}: must be positive")
    if not 0.0 <= cfg.subword_dropout < 1.0:
        raise ConfigError(f"data.subword_dropout: a probability in [0, 1), got {cfg.subword_dropout}")


def load_data_config(
    name: str | Path, overrides: list[str] | tuple[str, ...] = ()
) -> tuple[DataConfig, dict]:
    """(the validated `data:` section, the whole tree) of a config file with `--set` overrides applied."""
    tree = load_tree(name, overrides)
    cfg = build(DataConfig, tree.get("data", {}), "data.")
    validate_data_config(cfg)
    return cfg, tree
