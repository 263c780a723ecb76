"""`DataConfig`, the `data:` section of a config file, and its loading for the `data` CLIs.

`nmt.config` embeds it in the whole `Config` (and re-exports it). The `data` CLIs read the same files with
`load_data_config`: inheritance, `--set` overrides and strict validation of the `data:` section; the other
sections belong to other packages and are only carried along.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from common.config_tree import MAX_INT32, ConfigError, build, check_fields, choices, load_tree, value_range
from common.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

log = logging.getLogger(__name__)

# The smallest vocabulary SentencePiece can train: the special pieces (<pad>, <unk>, <s>, </s>), the word-boundary
# piece "▁" and at least one character. A real corpus needs more (every character it holds): SentencePiece says so.
_SPECIAL_PIECES = len({PAD_ID, UNK_ID, BOS_ID, EOS_ID})
MIN_VOCAB_SIZE = _SPECIAL_PIECES + 2
_VOCAB_WHY = f"room for the {_SPECIAL_PIECES} special pieces, the word boundary and one character"
# Sizes and counts: at most what an int32 tensor holds (before 2026-12-07d 2**63 passed, then a traceback).
_AT_LEAST_1 = value_range(min=1, max=MAX_INT32)


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
    vocab_size: int = field(
        default=8000, metadata=value_range(min=MIN_VOCAB_SIZE, max=MAX_INT32, why=_VOCAB_WHY)
    )  # SentencePiece vocabulary size (padded up to a multiple of 8 in the model)
    joint_vocab: bool = True  # one vocabulary for source and target (needed for shared embeddings)
    # The tokenizer lowercases both sides (its SentencePiece normalization), as papers that train on lowercased
    # Multi30k do; the model then writes lowercase, and its BLEU is scored case-insensitively.
    lowercase: bool = False
    tokenizer_max_sentences: int = field(
        default=1_000_000, metadata=_AT_LEAST_1
    )  # at most this many sentences sampled to train SentencePiece
    # At most 65535: the prepared data's length index (data.store) saturates at 65535 pieces, and a longer pair
    # would pass the length filter unseen.
    max_length: int = field(
        default=128, metadata=value_range(min=2, max=65535, why="a subword and its BOS or EOS; at most 65535")
    )  # drop training pairs longer than this many subwords (with BOS/EOS) on either side
    batch_tokens: int = field(
        default=4096, metadata=_AT_LEAST_1
    )  # tokens per training batch PER REPLICA (padded source or target, the longer)
    bucket_boundaries: list[int] = field(
        default_factory=list, metadata=_AT_LEAST_1
    )  # bucket edges, strictly increasing (those >= max_length are dropped); empty = automatic
    eval_batch_tokens: int = field(default=8192, metadata=_AT_LEAST_1)  # tokens per validation-loss batch
    subword_dropout: float = field(
        default=0.0, metadata=value_range(min=0, max=1, max_open=True)
    )  # training only: probability a piece is split into two vocabulary pieces (0 = off)

    # Keys of older versions, accepted (with a warning) and ignored, so saved run configs still load.
    LEGACY_KEYS = {"shuffle_buffer": "batches come from a full permutation per epoch, there is no buffer"}


# data.dataset naming a folder of line-aligned text files (data.folder) rather than a TFDS dataset
FOLDER = "folder"

# Multi30k's languages (task 1): every two of them are a pair (data.multi30k builds one TFDS config per pair).
MULTI30K_LANGUAGES = ("en", "de", "fr")


def validate_data_config(cfg: DataConfig) -> None:
    """Checks what types alone do not (ranges and choices too, for a `DataConfig` built in code); `ConfigError`
    naming the key."""
    check_fields(cfg, "data.")
    if cfg.source == cfg.target:
        raise ConfigError(
            f"data.source and data.target are both {cfg.source!r}: a direction needs two languages"
        )
    if cfg.dataset == "multi30k":
        for key in ("source", "target"):
            if getattr(cfg, key) not in MULTI30K_LANGUAGES:
                raise ConfigError(
                    f"data.{key}: multi30k has no language {getattr(cfg, key)!r} "
                    f"(it has {', '.join(MULTI30K_LANGUAGES)})"
                )
    if cfg.dataset == FOLDER and not cfg.folder:
        raise ConfigError(
            "data.dataset: folder needs data.folder, the directory of line-aligned <lang>.<split>.txt files "
            "(e.g. en.train.txt de.train.txt en.validation.txt ...)"
        )
    if cfg.folder and cfg.dataset != FOLDER:  # else the folder would be ignored without a word
        raise ConfigError(
            f"data.folder is set ({cfg.folder}) but data.dataset is {cfg.dataset!r}: set data.dataset: folder "
            "to use the folder, or remove data.folder"
        )
    edges = cfg.bucket_boundaries
    for index in range(1, len(edges)):
        if edges[index] <= edges[index - 1]:
            raise ConfigError(
                f"data.bucket_boundaries: must be strictly increasing, got {edges} "
                f"({edges[index]} after {edges[index - 1]})"
            )


def load_data_config(
    name: str | Path, overrides: list[str] | tuple[str, ...] = ()
) -> tuple[DataConfig, dict]:
    """(the validated `data:` section, the whole tree) of a config file with `--set` overrides applied.

    Overrides of other sections are applied to the tree but not checked here (their schemas belong to other
    packages): a warning says so, since a typo there would pass silently until train.py reads them."""
    tree = load_tree(name, overrides)
    others = sorted({text.split("=", 1)[0] for text in overrides if not text.strip().startswith("data.")})
    if others:
        log.warning(
            "--set %s: not checked here, the data tools read only the data: section (train.py checks them)",
            ", ".join(others),
        )
    cfg = build(DataConfig, tree.get("data", {}), "data.")
    validate_data_config(cfg)
    return cfg, tree


def new_data_problem(cfg: DataConfig) -> str:
    """What a new run refuses (train.py, ablate.py: `nmt.config.new_run_problem`) that an older run's saved config
    may hold (it stays loadable: translated, evaluated, resumed, distilled, prepared), as a message; "" if nothing.
    Before 2026-12-07d these were accepted."""
    if cfg.batch_tokens < cfg.max_length:
        # batches of the longest bucket are one pair of max_length tokens: over the budget, unsaid
        return (
            f"data.batch_tokens: {cfg.batch_tokens} is less than data.max_length={cfg.max_length}: a batch of the "
            f"longest pairs could not keep to it (raise data.batch_tokens or lower data.max_length)"
        )
    return ""


def refuse_fine_tuning_without_tokenizer(tree: dict, tokenizer_dir: str | None, flag: str) -> None:
    """`ConfigError` for a config that fine-tunes another run (`train.init_from`) unless `tokenizer_dir` holds a
    tokenizer: its run tokenizes with that run's tokenizer, so one trained by the data tools would not be used."""
    train = tree.get("train")
    parent = train.get("init_from") if isinstance(train, dict) else None
    if not parent:
        return
    if tokenizer_dir and Path(tokenizer_dir).is_dir() and any(Path(tokenizer_dir).glob("*.model")):
        return
    given = f"{flag} {tokenizer_dir} holds no SentencePiece model; " if tokenizer_dir else ""
    raise ConfigError(
        f"this config fine-tunes train.init_from={parent}: {given}its run tokenizes with that run's tokenizer, so "
        f"give it: {flag} {Path(str(parent)) / 'tokenizer'} (a tokenizer trained here would not be used)"
    )
