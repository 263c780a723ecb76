"""Long lines in `--score` (`nmt.scoring.score_lines`) and `--plot-attention` (`Translator.attention`) are tokenized
from a bounded start (`nmt.batch_decoding.start_pieces`), as translation is: the same numbers as tokenizing the
whole line and cutting it (the reference here), without feeding the tokenizer the whole line (found by a review on
2026-12-07: a 5.5 MB line to score took 1.46 GB, ~135 bytes of memory per character). The tiny shared run
(tests/run_fixture.py), lines of a few thousand characters."""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from data.tokenizer import Tokenizer
from nmt.batch_decoding import start_pieces
from nmt.scoring import score_ids, score_lines
from tests.run_fixture import tiny_corpus


def whole(tokenize, lines):
    """The reference: every line tokenized whole."""
    return tokenize(tf.constant(lines, tf.string)).to_list()


def long_line(text: str, chars: int) -> str:
    """`text` repeated (with spaces) to more than `chars` characters."""
    return " ".join([text] * (chars // (len(text) + 1) + 2))


def test_start_pieces_bounds_the_characters_tokenized_and_keeps_the_whole_lines_first_pieces(translator):
    pairs = tiny_corpus()["test"][:2]
    keep = translator.max_source_length - 1
    limit = translator.tokenizer.source_chars_for(translator.max_source_length)
    lines = ["", "   ", pairs[0][0], long_line(pairs[1][0], 2 * limit)]
    assert len(lines[-1]) > 2 * limit
    reference = whole(translator.tokenizer.tokenize_source, lines)
    got = start_pieces(lines, translator.encode, keep, limit)
    # Blank and short lines whole (scoring scores blank lines); the long one from its first `limit` characters.
    assert [chars for _, chars in got] == [0, 3, len(lines[2]), limit]
    assert [ids for ids, _ in got[:3]] == reference[:3]
    assert got[3][0][:keep] == reference[3][:keep] and len(got[3][0]) > keep
    assert start_pieces(lines, translator.encode, keep, None) == [
        (ids, len(s)) for ids, s in zip(reference, lines)
    ]


def test_a_cut_inside_a_word_keeps_the_whole_lines_pieces(translator):
    """Wherever the character bound falls (inside a word too), the first `keep` pieces are the whole line's: bounds
    and keeps small enough to cut every word of these lines (before 2026-12-07d a word the cut split was segmented
    as its start, e.g. "▁s l e" for "▁sleep s", and the SavedModel, tokenizing whole, got other pieces)."""
    lines = [s for s, _ in tiny_corpus()["test"][:4]] + ["Zwei  Hunde   laufen\tschnell durch den Park."]
    reference = whole(translator.tokenizer.tokenize_source, lines)
    checked = 0
    for max_chars in range(2, max(map(len, lines)) + 2):
        for keep in range(1, 12):
            got = start_pieces(lines, translator.encode, keep, max_chars)
            for line, (ids, chars), expected in zip(lines, got, reference):
                assert ids[:keep] == expected[:keep], (line, max_chars, keep)
                assert chars == len(line) or len(ids) > keep, (line, max_chars, keep)
                checked += chars < len(line)
    assert checked > 1000  # most cases were cut, not tokenized whole


def test_the_target_bound_of_a_joint_or_separate_vocabulary(translator):
    tokenizer = translator.tokenizer
    assert tokenizer.target_chars_for(64) == tokenizer.source_chars_for(64)
    source, _ = tokenizer.models
    # The same model as a separate target model: the bound read from the target model is the same.
    assert Tokenizer(source, source).target_chars_for(64) == tokenizer.source_chars_for(64)


def test_score_lines_equals_scoring_the_whole_lines_tokenized_and_cut(translator):
    pairs = tiny_corpus()["test"][:3]
    source_limit = translator.tokenizer.source_chars_for(translator.max_source_length)
    target_limit = translator.tokenizer.target_chars_for(translator.max_target_length)
    over = long_line(pairs[1][1], 200)  # over the target limit in pieces, under its bound in characters
    huge = long_line(pairs[2][1], 2 * target_limit)  # over both: tokenized from its start only
    sources = [pairs[0][0], "", long_line(pairs[1][0], 2 * source_limit), pairs[1][0], pairs[2][0], "  "]
    targets = [pairs[0][1], "", pairs[1][1], over, huge, "  "]
    assert len(over) < target_limit < len(huge)
    heard = {"cut": [], "long": []}
    got = score_lines(
        translator, sources, targets, on_truncated=lambda i, n: heard["cut"].append((i, n)),
        on_too_long=lambda i, n: heard["long"].append((i, n)),
    )  # fmt: skip
    source_ids = whole(translator.tokenizer.tokenize_source, sources)
    target_ids = whole(translator.tokenizer.tokenize_target, targets)
    expected_heard = {"cut": [], "long": []}
    expected = score_ids(
        translator.model, source_ids, target_ids, max_source_length=translator.max_source_length,
        max_target_length=translator.max_target_length,
        on_truncated=lambda i, n: expected_heard["cut"].append((i, n)),
        on_too_long=lambda i, n: expected_heard["long"].append((i, n)),
    )  # fmt: skip
    limit = translator.max_target_length - 1
    assert len(source_ids[2]) > translator.max_source_length and len(target_ids[3]) > limit
    np.testing.assert_array_equal([s for s, _ in got], [s for s, _ in expected])
    assert all(math.isfinite(s) for s, _ in got[:3]) and math.isnan(got[3][0]) and math.isnan(got[4][0])
    # The huge target's tokens are its start's (a lower bound, over the limit); every other count is the whole line's.
    assert [t for i, (_, t) in enumerate(got) if i != 4] == [t for i, (_, t) in enumerate(expected) if i != 4]
    assert limit + 1 < got[4][1] < expected[4][1]
    # The long source is reported cut without a count (tokenized in part), as translation reports it.
    assert heard["cut"] == [(2, None)] and expected_heard["cut"] == [(2, len(source_ids[2]))]
    # the huge one without a count too: only its start was tokenized
    assert heard["long"] == [(3, len(target_ids[3])), (4, None)]


def test_attention_of_a_long_line_uses_the_whole_lines_first_pieces(translator, monkeypatch):
    pairs = tiny_corpus()["test"][:1]
    keep = translator.max_source_length - 1
    limit = translator.tokenizer.source_chars_for(translator.max_source_length)
    line = long_line(pairs[0][0], 2 * limit)
    encode, seen = translator.encode, []
    # records the lengths the tokenizer is given (the real encode runs)
    monkeypatch.setattr(translator, "encode", lambda lines: seen.extend(map(len, lines)) or encode(lines))
    for text in (pairs[0][0], line):
        pieces = whole(translator.tokenizer.tokenize_source, [text])[0][:keep]
        seen.clear()
        got = translator.attention(text, beam_size=1)
        assert seen == [min(len(text), limit)]
        assert got["source"] == [*translator._pieces(pieces, source=True), "</s>"]
        assert got["weights"][0].shape[-1] == len(pieces) + 1
        assert got["translation"] == translator.translate([text], beam_size=1)[0]
