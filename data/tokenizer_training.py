"""Training the SentencePiece models of a `data.tokenizer.Tokenizer` on a corpus's train split.

    tokenizer = train_tokenizer(cfg, out_dir)   # writes spm.model (joint) or spm.source.model and spm.target.model

A seeded sample of at most `data.tokenizer_max_sentences` sentences (`_sample_sentences`, streamed), the
normalization `data.tokenizer` describes (identity, or `lowercase_rules` with `data.lowercase`), the project's
special ids.
"""

from __future__ import annotations

import functools
import io
import logging
import re
import tempfile
from pathlib import Path

import numpy as np
import sentencepiece as spm

from data.config import DataConfig
from data.errors import DataError
from data.tokenizer import (
    BYTE_FALLBACK_MIN_VOCAB,
    SPECIAL_IDS,
    Tokenizer,
)

log = logging.getLogger("data.tokenizer")


def _sample_sentences(cfg: DataConfig, seed: int) -> tuple[list[str], list[str], bool]:
    """At most cfg.tokenizer_max_sentences sentences from the train split, drawn without replacement, seeded.

    Joint: one pool of 2N sentences (both sides), returned as (pool sample, []). Separate: the same sampled
    pairs for both sides, each side at most the limit. Streams the split, keeping only the drawn lines; pairs
    that `data.cleaning` drops are skipped (so the sample may be a little smaller). The third value: whether the
    limit cut the sample (the split has more sentences).
    """
    from data.cleaning import DropCounts, clean
    from data.stream import count_pairs, stream_pairs  # here: loading a tokenizer needs no TFDS

    size = count_pairs(cfg, cfg.train_split)
    rng = np.random.default_rng(seed)
    pool = 2 * size if cfg.joint_vocab else size
    take = min(cfg.tokenizer_max_sentences, pool)
    chosen = np.ones(pool, dtype=bool)
    if take < pool:
        log.info("sampling %d of %d sentences for SentencePiece (seed %d)", take, pool, seed)
        chosen[:] = False
        chosen[rng.choice(pool, size=take, replace=False)] = True
    first, second = [], []
    index, counts = 0, DropCounts()
    for raw_sources, raw_targets in stream_pairs(cfg, cfg.train_split):
        for raw_source, raw_target in zip(raw_sources, raw_targets):
            picked = chosen[2 * index : 2 * index + 2] if cfg.joint_vocab else chosen[index : index + 1]
            index += 1
            if not picked.any():
                continue
            sources, targets = clean([raw_source], [raw_target], counts)
            if not sources:
                continue
            if cfg.joint_vocab:
                first.extend(text for text, keep in zip((sources[0], targets[0]), picked) if keep)
            else:
                first.append(sources[0])
                second.append(targets[0])
    counts.refuse_another_encoding(f"split {cfg.train_split!r} (the tokenizer's sample)")
    if not first:  # all dropped: say why, not just "empty"
        raise DataError(
            f"no sentences to train the tokenizer on: split {cfg.train_split!r} has no usable pair "
            f"({counts.summary()})"
        )
    return first, second, take < pool


@functools.cache  # 1.1M code points scanned: once per process
def lowercase_table() -> dict[int, int]:
    """{code point: its lowercase} for every character whose `str.lower()` is one other character: what the
    lowercasing tokenizer does to a text, character by character (`text.translate(lowercase_table())`). Not
    `str.lower()` of a whole text: that writes Greek final sigma ("ΜΑΣ" -> "μας", here "μασ") and "İ" as two
    characters (here kept)."""
    table = {}
    for code in range(0x110000):
        lower = chr(code).lower()
        if lower != chr(code) and len(lower) == 1:
            table[code] = ord(lower)
    return table


def lowercase_rules() -> str:
    """SentencePiece normalization rules (TSV of hex code points) that lowercase: `lowercase_table`, the rest
    unchanged. `str.lower`, not case folding: German ß stays ß, as sacreBLEU's lowercased scoring keeps it
    (SentencePiece's `nmt_nfkc_cf` would write "ss")."""
    return "".join(f"{code:X}\t{lower:X}\n" for code, lower in lowercase_table().items())


def _normalization(cfg: DataConfig, scratch: Path) -> dict:
    """The trainer's normalization options: identity, or `lowercase_rules` with data.lowercase."""
    if not cfg.lowercase:
        return {"normalization_rule_name": "identity"}
    rules = scratch / "lowercase.tsv"
    rules.write_text(lowercase_rules(), encoding="utf-8")
    return {"normalization_rule_tsv": str(rules)}


# SentencePiece's max_sentence_length (default): longer sentences are not trained on.
SPM_MAX_SENTENCE_BYTES = 4192
# SentencePiece's pieces of byte fallback, <0x00> to <0xFF>
BYTE_PIECES = 256


def _required_chars(sentences: list[str], cfg: DataConfig) -> str:
    """Every character of `sentences` as the trainer sees them (lowercased with data.lowercase), for SentencePiece's
    `required_chars`: it counts the characters after deleting the special pieces' strings ("<s>", "</s>", "<pad>",
    "<unk>") from the text, so a character seen only inside them would be no piece. Not the space (the trainer's
    "▁"), U+0000 (skipped) nor U+2585 (SentencePiece's mark of an unknown character, which it refuses there)."""
    chars: set[str] = set()
    for sentence in sentences:
        chars.update(sentence)
    if cfg.lowercase:
        chars = {char.translate(lowercase_table()) for char in chars}
    return "".join(sorted(chars - {" ", "\x00", "\u2585"}))


def _vocab_limit(err: RuntimeError, cfg: DataConfig) -> tuple[str, str]:
    """(" to at most N", why) for SentencePiece's "Please set it to a value <= N", else ("", ""). With byte fallback
    its N counts the 256 byte pieces, which a vocabulary below BYTE_FALLBACK_MIN_VOCAB has not: N - 256 then, and
    why (before, N was suggested, which failed again with a limit 256 lower)."""
    found = re.search(r"value <= (\d+)", str(err))
    if not found:
        return "", ""
    limit = int(found.group(1))
    if cfg.vocab_size >= BYTE_FALLBACK_MIN_VOCAB > limit:
        return f" to at most {limit - BYTE_PIECES:,}", (
            f": SentencePiece's {limit:,} counts the {BYTE_PIECES} pieces of byte fallback, which vocabularies of "
            f"fewer than {BYTE_FALLBACK_MIN_VOCAB:,} pieces have not"
        )
    return f" to at most {limit:,}", ""


def _train_model(
    sentences: list[str], cfg: DataConfig, seed: int, side: str, num_threads: int = 1, capped: bool = False
) -> bytes:
    """Trains one SentencePiece model in memory; deterministic for a given seed and thread count (whatever the cores
    that run it; another count trains other pieces). `capped`: the sample was cut at data.tokenizer_max_sentences
    (said in the advice for a vocabulary too large)."""
    if not sentences:
        raise DataError(f"no {side} sentences to train the tokenizer on (split {cfg.train_split!r} is empty)")
    model = io.BytesIO()
    byte_fallback = cfg.vocab_size >= BYTE_FALLBACK_MIN_VOCAB
    # without byte fallback every character must be a piece, even one seen only in a literal "<s>" (see above)
    required = {} if byte_fallback else {"required_chars": _required_chars(sentences, cfg)}
    spm.set_random_generator_seed(seed)
    with tempfile.TemporaryDirectory(prefix="nmt-spm-") as scratch:  # the lowercase rules' file, if any
        normalization = _normalization(cfg, Path(scratch))
        try:
            spm.SentencePieceTrainer.Train(
                sentence_iterator=iter(sentences),
                model_writer=model,
                model_type=cfg.tokenizer,
                vocab_size=cfg.vocab_size,
                character_coverage=1.0,
                byte_fallback=byte_fallback,
                **required,
                remove_extra_whitespaces=False,
                **normalization,
                num_threads=num_threads,
                minloglevel=2,
                **SPECIAL_IDS,
            )
        except RuntimeError as err:
            long = sum(len(sentence.encode("utf-8")) > SPM_MAX_SENTENCE_BYTES for sentence in sentences)
            if "smaller than required" in str(err):
                advice = "Raise data.vocab_size: it must hold every character of the corpus."
            elif 2 * long > len(sentences):
                advice = (
                    f"{long} of them are over the {SPM_MAX_SENTENCE_BYTES:,} bytes a sentence SentencePiece trains on "
                    "may have (it skips longer ones): is the corpus one sentence per line (not CR-only line endings, "
                    "not paragraphs)?"
                )
            elif capped:
                at_most, why = _vocab_limit(err, cfg)
                advice = (
                    f"Lower data.vocab_size{at_most}, or raise data.tokenizer_max_sentences (the sample has "
                    f"{len(sentences):,} sentences of at most {cfg.tokenizer_max_sentences:,}: the split has "
                    f"more){why}."
                )
            else:
                at_most, why = _vocab_limit(err, cfg)
                advice = f"Lower data.vocab_size{at_most} (or use more data){why}."
            raise DataError(
                f"SentencePiece cannot train a {cfg.tokenizer} model of data.vocab_size={cfg.vocab_size} on "
                f"{len(sentences)} {side} sentences of {cfg.dataset!r}: {str(err).strip().rstrip('.')}. {advice}"
            ) from err
    return model.getvalue()


def train_tokenizer(
    cfg: DataConfig, out_dir: str | Path, *, seed: int = 1234, num_threads: int = 1
) -> Tokenizer:
    """Trains SentencePiece on the train split only and writes the model file(s) into `out_dir`.

    Args:
      cfg: data config: dataset and languages, `tokenizer` (unigram|bpe), `vocab_size`, `joint_vocab`,
        `tokenizer_max_sentences` (sentences sampled, seeded by `seed`).
      out_dir: created if needed; receives `spm.model` (joint) or `spm.source.model` and `spm.target.model`.
      seed: seeds the sentence sample and SentencePiece's own random generator.
      num_threads: SentencePiece training threads: the same count trains the same model on any machine, another
        count other pieces (`data.prepare` trains with the fixed `data.cache.TOKENIZER_TRAIN_THREADS`).
    Raises:
      DataError: e.g. a vocabulary too large for the corpus (the message names data.vocab_size and the limit).
    """
    out_dir = Path(out_dir)
    first, second, capped = _sample_sentences(cfg, seed)
    if cfg.joint_vocab:
        log.info(
            "training a joint %s SentencePiece model (%d pieces) on %d sentences",
            cfg.tokenizer,
            cfg.vocab_size,
            len(first),
        )
        tokenizer = Tokenizer(_train_model(first, cfg, seed, "source and target", num_threads, capped))
    else:
        log.info(
            "training source and target %s SentencePiece models (%d pieces each) on %d pairs",
            cfg.tokenizer,
            cfg.vocab_size,
            len(first),
        )
        tokenizer = Tokenizer(
            _train_model(first, cfg, seed, "source", num_threads, capped),
            _train_model(second, cfg, seed, "target", num_threads, capped),
        )
    tokenizer.save(out_dir)
    return Tokenizer.load(out_dir)
