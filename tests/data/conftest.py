"""Tiny corpora the data tests write themselves: a fake Multi30k mirror and a TranslateFolder. Never the network."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest

from data.config import DataConfig

SIZES = {"train": 60, "val": 12, "test_2016_flickr": 10}  # file stem -> lines
_WORDS = {
    "en": "A man woman girl boy dog sits runs plays near the red blue street café, with two friends; outside!".split(),
    "de": "Ein Mann Frau Mädchen Junge Hund sitzt läuft spielt über die rote blaue Straße Café, mit zwei Freunden.".split(),
    "fr": "Un homme femme fille garçon chien est assis court joue près du rouge bleu rue café, avec deux amis à l'été.".split(),
}


def sentences(lang: str, count: int, seed: int) -> list[str]:
    """`count` short sentences in `lang` (accents, capitals, punctuation), the same for the same seed."""
    rng = random.Random(f"{lang}-{seed}")
    words = _WORDS[lang]
    lines = []
    for _ in range(count):
        line = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
        lines.append(line[0].upper() + line[1:] + rng.choice([".", "!", "?", " …", ""]))
    return lines


def write_mirror(folder: Path, languages=("en", "de", "fr"), sizes: dict[str, int] | None = None) -> Path:
    """A flat mirror of gzipped corpus files `<stem>.<lang>.gz`, as the upstream repository names them."""
    folder.mkdir(parents=True, exist_ok=True)
    for index, (stem, count) in enumerate((sizes or SIZES).items()):
        for lang in languages:
            text = "\n".join(sentences(lang, count, index)) + "\n"
            (folder / f"{stem}.{lang}.gz").write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))
    return folder


def mirror_lines(folder: Path, stem: str, lang: str) -> list[str]:
    return gzip.decompress((folder / f"{stem}.{lang}.gz").read_bytes()).decode("utf-8").split("\n")[:-1]


@pytest.fixture(scope="session")
def mirror(tmp_path_factory) -> Path:
    """A fake Multi30k mirror shared by the session (read-only by convention)."""
    return write_mirror(tmp_path_factory.mktemp("mirror"))


@pytest.fixture(scope="session")
def prepared_dir(tmp_path_factory) -> Path:
    """A TFDS data_dir shared by the session, where the fake Multi30k is prepared once."""
    return tmp_path_factory.mktemp("tfds")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """A data cache (`data.cache_dir`) shared by the session."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def data_cfg(mirror, prepared_dir, cache_dir) -> DataConfig:
    """Multi30k en->de from the fake mirror, with sizes that fit it (change copies: `dataclasses.replace`)."""
    return DataConfig(
        dataset="multi30k",
        source="en",
        target="de",
        manual_dir=str(mirror),
        data_dir=str(prepared_dir),
        cache_dir=str(cache_dir),
        vocab_size=96,
        max_length=24,
        batch_tokens=256,
        eval_batch_tokens=256,
    )


@pytest.fixture(scope="session")
def tokenizer(mirror, prepared_dir, tmp_path_factory):
    """A joint unigram tokenizer trained once on the fake train split."""
    from data.tokenizer_training import train_tokenizer

    cfg = DataConfig(manual_dir=str(mirror), data_dir=str(prepared_dir), vocab_size=96)
    return train_tokenizer(cfg, tmp_path_factory.mktemp("spm"), seed=7)
