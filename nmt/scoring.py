"""Forced decoding: log P(target | source) of given translations, pair by pair (`translate.py --score FILE`).

What OpenNMT-tf's `score` run type, fairseq's `--score-reference` and Marian's scorer give, to filter a corpus or
rerank candidates: the sum of the natural-log probabilities of the target's pieces and of its EOS, teacher-forced,
the model in inference mode, and the number of those tokens (so the mean per token and the perplexity follow).
The probabilities are the decoder's: PAD and BOS are never generated (their probability is 0, `transformer.step_fns`),
so a hypothesis of our beam search with no length penalty (alpha 0) scores here what the search scored it, and
CTranslate2's `score_batch` on an export gives the same numbers (`tests/nmt/test_scoring.py`).

Sources are cut as `Translator` cuts them (at most `max_source_length - 1` pieces, then EOS; `on_truncated` hears
of each). A target needs its pieces, plus BOS, within the position table: a longer one is not scored by a part of
it: its score is NaN (`on_too_long` hears of it). As in translation (`nmt.batch_decoding.start_pieces`),
`score_lines` tokenizes a line longer than its kept pieces can cover from its start only, the source and the target
alike (tokenizing a 5.5 MB line whole took ~135 bytes of memory per character): such a source is reported cut
with None for its count; such a target is too long (NaN), reported with None for its count, and its `tokens`
are its start's pieces (a lower bound).
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence

import numpy as np
import tensorflow as tf

from nmt.batch_decoding import start_pieces
from transformer.step_fns import FORBIDDEN
from transformer.vocab import BOS_ID, EOS_ID, PAD_ID

_FUNCTIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _row_scores(model):
    """The traced (source, target_in, target_out) -> (B,) summed log-probabilities of `model` (dynamic shapes)."""
    if model not in _FUNCTIONS:
        model_ref = weakref.ref(model)  # a strong reference in the value would keep the key alive forever
        bias = np.zeros([model.target_vocab_size], np.float32)
        bias[list(FORBIDDEN)] = -1.0e9
        spec = [tf.TensorSpec([None, None], tf.int32)] * 3

        @tf.function(input_signature=spec, autograph=False)
        def scores(source, target_in, target_out):
            logits = model_ref()({"source": source, "target_in": target_in}, training=False)  # (B, T, V)
            log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32) + bias, axis=-1)
            picked = tf.gather(log_probs, target_out, axis=-1, batch_dims=2)  # (B, T)
            return tf.reduce_sum(tf.where(target_out != PAD_ID, picked, 0.0), axis=-1)  # (B,)

        _FUNCTIONS[model] = scores
    return _FUNCTIONS[model]


def score_ids(
    model,
    sources: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    *,
    max_source_length: int,
    max_target_length: int,
    batch_tokens: int = 8192,
    on_truncated: Callable[[int, int | None], None] | None = None,
    on_too_long: Callable[[int, int | None], None] | None = None,
    partial_sources: Collection[int] = (),
    partial_targets: Collection[int] = (),
) -> list[tuple[float, int]]:
    """(log-probability, tokens) of each target (pieces, without EOS) given its source (pieces, without EOS).

    `tokens` counts the target's pieces and its EOS. Pairs are sorted by length and batched under `batch_tokens`
    padded tokens (source and target together); the result is in input order. `partial_sources`,
    `partial_targets`: indices of pairs whose pieces are those of the start of a longer line (`start_pieces`): such
    a source is reported cut with None (not counted), such a target too long (NaN).
    """
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    keep = max_source_length - 1
    results: list[tuple[float, int]] = [(math.nan, len(t) + 1) for t in targets]
    todo = []
    for index, (source, target) in enumerate(zip(sources, targets)):
        if (len(source) > keep or index in partial_sources) and on_truncated is not None:
            on_truncated(index, None if index in partial_sources else len(source))
        # BOS + pieces must fit the position table
        if len(target) + 1 > max_target_length or index in partial_targets:
            if on_too_long is not None:
                on_too_long(index, None if index in partial_targets else len(target))
            continue
        todo.append(index)
    todo.sort(key=lambda i: -max(min(len(sources[i]), keep), len(targets[i])))
    function = _row_scores(model)
    start = 0
    while start < len(todo):
        width = max(min(len(sources[todo[start]]), keep), len(targets[todo[start]])) + 1  # the longest first
        rows = max(1, batch_tokens // (2 * width))
        batch = todo[start : start + rows]
        start += len(batch)
        source_width = max(min(len(sources[i]), keep) for i in batch) + 1
        target_width = max(len(targets[i]) for i in batch) + 1
        source = np.full((len(batch), source_width), PAD_ID, np.int32)
        target_in = np.full((len(batch), target_width), PAD_ID, np.int32)
        target_out = np.full((len(batch), target_width), PAD_ID, np.int32)
        for row, index in enumerate(batch):
            pieces, target = list(sources[index][:keep]), list(targets[index])
            source[row, : len(pieces) + 1] = [*pieces, EOS_ID]
            target_in[row, : len(target) + 1] = [BOS_ID, *target]
            target_out[row, : len(target) + 1] = [*target, EOS_ID]
        sums = function(tf.constant(source), tf.constant(target_in), tf.constant(target_out)).numpy()
        for row, index in enumerate(batch):
            results[index] = (float(sums[row]), len(targets[index]) + 1)
    return results


def score_lines(
    translator, sources: Sequence[str], targets: Sequence[str], **kwargs
) -> list[tuple[float, int]]:
    """`score_ids` of raw lines with a `nmt.translator.Translator`'s model, tokenizer and length limits."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    if not sources:
        return []
    sources, targets = list(sources), list(targets)
    tokenizer = translator.tokenizer
    source_chars = tokenizer.source_chars_for(translator.max_source_length)
    source_ids = start_pieces(sources, translator.encode, translator.max_source_length - 1, source_chars)

    def encode_targets(lines: list[str]) -> list[list[int]]:
        return tokenizer.tokenize_target(tf.constant(lines, tf.string)).to_list()

    # Enough characters for one piece more than a target may have: a start giving more is too long.
    target_chars = tokenizer.target_chars_for(translator.max_target_length)
    target_ids = start_pieces(targets, encode_targets, translator.max_target_length - 1, target_chars)
    return score_ids(
        translator.model,
        [ids for ids, _ in source_ids],
        [ids for ids, _ in target_ids],
        max_source_length=translator.max_source_length,
        max_target_length=translator.max_target_length,
        partial_sources={i for i, (_, chars) in enumerate(source_ids) if chars < len(sources[i])},
        partial_targets={i for i, (_, chars) in enumerate(target_ids) if chars < len(targets[i])},
        **kwargs,
    )


def score_stream(
    translator,
    sources: Iterable[str],
    targets: Iterable[str],
    *,
    chunk_size: int = 1000,
    on_truncated: Callable[[int, int | None], None] | None = None,
    on_too_long: Callable[[int, int | None], None] | None = None,
) -> Iterator[tuple[float, int]]:
    """Yields `score_lines` of each (source, target) pair, in order, holding `chunk_size` pairs at a time.

    The callbacks receive indices into the whole stream. Raises LengthMismatch once one stream ends before the
    other (after yielding every complete pair before it).
    """
    from nmt.text_io import chunked

    missing = object()
    start = 0
    for chunk in chunked(itertools.zip_longest(sources, targets, fillvalue=missing), chunk_size):
        pairs = [pair for pair in chunk if missing not in pair]

        def shifted(callback, offset=start):
            return None if callback is None else (lambda index, length: callback(offset + index, length))

        yield from score_lines(
            translator,
            [s for s, _ in pairs],
            [t for _, t in pairs],
            on_truncated=shifted(on_truncated),
            on_too_long=shifted(on_too_long),
        )
        if len(pairs) < len(chunk):
            shorter = "translations" if chunk[len(pairs)][1] is missing else "sources"
            raise LengthMismatch(shorter, start + len(pairs))
        start += len(chunk)


class LengthMismatch(ValueError):
    """The sources and the translations to score have different numbers of lines."""

    def __init__(self, shorter: str, lines: int):
        super().__init__(
            f"the {shorter} end after line {lines}, the other file goes on: they must be line-aligned"
        )
        self.shorter, self.lines = shorter, lines
