"""Decoding of one padded batch with per-sentence length limits: pure TensorFlow, used by `nmt.translator` and by
the exported SavedModel (`nmt.export`).

Maximum output length (subwords, EOS excluded) per sentence: `floor(a * source_length + b)`, capped by the output
buffer (`output_limits`). It is enforced per sentence by forcing EOS once a sentence reaches its limit
(`limit_lengths`), so a translation never depends on which other sentences share its batch or on the padded shape.

`decoding_functions(model)`: `decode_batch` as tf.functions, one per search setting, cached per model and traced once
even when several decoding threads ask at the same time.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import weakref
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from transformer.decoding import beam_search, greedy_search
from transformer.sampling import Sampling, picker
from transformer.step_fns import cached_decoding, full_step_fn
from transformer.vocab import BOS_ID, EOS_ID

__all__ = [
    "decode_batch",
    "decoding_functions",
    "limit_lengths",
    "output_limits",
    "source_ids",
    "start_pieces",
]

log = logging.getLogger(__name__)

_FORCED = -1e9  # logit of every non-EOS token once a sentence has reached its length limit
# Without static shapes, finished sentences leave the batch after a step where at least this fraction of those still
# running are done (`transformer.decoding`, `compact`): 0 = as soon as one is. Thresholds 0.1, 0.25 and 0.5 were no
# faster. Measured against the fixed buffers with the whole batch to the end (same ids), 3+3-layer d_model-256 model
# trained briefly, Multi30k test2016, 2-core CPU under load, interleaved, median of 5: beam 4 1.9-2.3x (the growing
# cache alone 1.5-1.7x), greedy 1.9x, one sentence at a time 1.1-1.2x.
COMPACT = 0.0


MAX_CHARS_GROWTH = 64  # `source_ids` tokenizes at most this many times `max_chars` of a line


def source_ids(
    lines: list[str],
    beam_size: int,
    nbest: int,
    encode: Callable[[list[str]], list[list[int]]],
    max_source_length: int,
    on_truncated: Callable[[int, int | None], None] | None = None,
    max_chars: int | None = None,
) -> tuple[list[int], list[list[int]]]:
    """What every engine's `translate` decodes: checks `beam_size`/`nbest`, skips blank lines, truncates.

    Returns (indices of the non-blank lines, their subword ids cut to `max_source_length - 1`, room for EOS);
    `on_truncated(index, num_subwords)` is called for each line that was cut. A line over `max_chars` characters
    (`Tokenizer.source_chars_for(max_source_length)`: more than its kept pieces can cover) is tokenized from its
    first `max_chars` only, and reported with num_subwords None (not counted): tokenizing a 15 MB line whole took
    ~160 bytes of memory per character for 63 pieces kept. Where that start gives no more pieces than are kept
    (a run of characters the tokenizer does not know is one `<unk>` piece, however long, without byte fallback),
    twice as much of the line is tokenized, and so on up to `MAX_CHARS_GROWTH` times `max_chars` (`start_pieces`:
    cut at a space): the kept pieces are the whole line's, as the SavedModel's (beyond that bound, e.g. megabytes of
    blanks before the text, what the line's first `MAX_CHARS_GROWTH * max_chars` characters gave is kept and reported
    cut; the SavedModel tokenizes that start too).
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest must be between 1 and the beam size ({beam_size}), got {nbest}")
    todo = [i for i, line in enumerate(lines) if line.strip()]
    keep = max_source_length - 1
    sources = []
    for index, (ids, chars) in zip(todo, start_pieces([lines[i] for i in todo], encode, keep, max_chars)):
        whole = chars >= len(lines[index])
        if len(ids) > keep or not whole:
            if on_truncated is not None:
                on_truncated(index, len(ids) if whole else None)
            ids = ids[:keep]
        sources.append(ids)
    return todo, sources


def start_pieces(
    lines: Sequence[str], encode: Callable[[list[str]], list[list[int]]], keep: int, max_chars: int | None
) -> list[tuple[list[int], int]]:
    """(pieces, characters considered) of each line (blank ones too), tokenized from a start bounded as in
    `source_ids`.

    A line over `max_chars` characters is tokenized from its first `max_chars` (None: every line whole), up to its
    last space within them: SentencePiece's pieces never cross a space, so the pieces of the words before it are
    the whole line's, where a word the cut split would be segmented otherwise (before 2026-12-07d its pieces were
    counted, and a kept piece could differ from the whole line's and the SavedModel's). While that start gives no
    more than `keep` pieces (a `<unk>` run crossed the cut), or has no space (CJK, a tab-separated line: however
    many pieces it gives, up to 7 calls of `encode`), twice as many characters are considered, up to
    `MAX_CHARS_GROWTH` times `max_chars`, where the line's start is tokenized as it is (the SavedModel's start,
    `nmt.export`). The pieces (untruncated) are the whole line's when the characters
    considered are `len(line)`; otherwise their first `keep` are (up to the growth bound).
    """
    if not lines:
        return []
    bound = None if max_chars is None else MAX_CHARS_GROWTH * max_chars
    starts = [
        _start(line, len(line) if max_chars is None else min(len(line), max_chars), bound) for line in lines
    ]
    result = []
    for line, (text, chars, clean), ids in zip(lines, starts, encode([text for text, _, _ in starts])):
        # A merged run crossed the cut (its pieces may lie beyond it), or no word ended before it: more of the
        # line, up to a bound on memory.
        while not (clean and len(ids) > keep) and chars < len(line) and chars < bound:
            text, chars, clean = _start(line, min(2 * chars, len(line), bound), bound)
            ids = encode([text])[0]
        result.append((ids, chars))
    return result


def _start(line: str, chars: int, bound: int | None) -> tuple[str, int, bool]:
    """(text to tokenize, chars, whether its pieces are the whole line's) for `line`'s first `chars` characters:
    the line whole; at the growth bound the cut as it is; else the cut up to its last space (False without one)."""
    if chars >= len(line) or (bound is not None and chars >= bound):
        return line[:chars], chars, chars >= len(line)
    space = line.rfind(" ", 1, chars + 1)  # a space right after the cut ends a word too
    return (line[:space], chars, True) if space > 0 else (line[:chars], chars, False)


def limit_lengths(step_fn: Callable, eos_id: int = EOS_ID) -> Callable:
    """Wraps a step function so that row `n` emits EOS at output position `state["limit"][n]`.

    The wrapped function takes and returns the state `{"inner": <step_fn cache>, "limit": (N,) int32}`; every
    tensor has the leading batch dimension, so beam search tiles and reorders the limits with the cache. A fourth
    argument (the searches' `memory`) is passed on to `step_fn`.
    """

    def step(ids, index, state, *memory):
        logits, inner = step_fn(ids, index, state["inner"], *memory)  # (N, V)
        logits = tf.cast(logits, tf.float32)
        vocab = tf.shape(logits)[-1]
        eos_only = tf.where(tf.equal(tf.range(vocab), eos_id), 0.0, _FORCED)  # (V,)
        force = tf.greater_equal(index, state["limit"])[:, tf.newaxis]  # (N, 1)
        # Most steps force no row: skip the pass over the (N, V) logits then.
        logits = tf.cond(
            tf.reduce_any(force), lambda: tf.where(force, eos_only[tf.newaxis, :], logits), lambda: logits
        )
        return logits, {"inner": inner, "limit": state["limit"]}

    return step


def decode_batch(
    model,
    source,
    limits,
    *,
    max_length: int,
    beam_size: int = 1,
    alpha: float = 0.6,
    use_cache: bool = True,
    search: str = "auto",
    static_shapes: bool = False,
    sampling: Sampling | None = None,
    row_ids=None,
    seed=None,
):
    """Decodes one padded batch.

    Args:
      model: the Transformer (`encode`, `init_cache`, `decode_step`).
      source: (B, S) int32 source ids ending with EOS, padded with PAD.
      limits: (B,) int32, maximum output subwords (EOS excluded) per sentence; each < `max_length`.
      max_length: size of the output buffer: a python int, or (with `static_shapes=False`) a scalar int32 tensor,
        so that one trace serves every buffer size.
      beam_size, alpha: beam width and GNMT length penalty exponent.
      use_cache: incremental decoding with the key/value cache, or a full decoder pass per step (same results).
      search: "greedy", "beam", or "auto" (greedy for beam_size 1).
      static_shapes: keep every shape static (needed under XLA): fixed-size self-attention buffers, every sentence
        decoded until the whole batch is done; without the cache this re-runs the decoder over the whole output
        buffer each step instead of over the prefix. False (with the cache): the self K/V grow with the prefix
        and finished sentences are dropped from the batch (`COMPACT`); same results.
      sampling: draw each token (`transformer.sampling.Sampling`) instead of greedy or beam search; `row_ids`
        (B,) int key each sentence's random numbers (default: its row), so that they do not depend on its batch;
        `seed`: a scalar int tensor replacing `sampling.seed` (one trace for every seed).

    Returns:
      (ids (B, K, max_length) int32 without BOS, PAD after EOS; scores (B, K) float32), K = 1 for greedy search
      and `beam_size` for beam search, best first.
    """
    batch_size = source.shape[0] if source.shape[0] is not None else tf.shape(source)[0]
    options = {}  # static shapes, the whole batch to the end: the XLA form and the full-recompute reference
    if use_cache and static_shapes:
        # The search reorders only the self K/V buffers; the beams share their sentence's cross K/V.
        step_fn, inner = cached_decoding(model, source, max_length)
    elif use_cache:
        # The self K/V hold the filled prefix only; finished sentences leave the batch with their cross K/V.
        step_fn, inner, memory = cached_decoding(
            model, source, max_length, growing=True, memory_argument=True
        )
        options = {"memory": memory, "compact": COMPACT, "static_shapes": False}
    else:
        inner = {}  # the full-recompute step encodes the source once and keeps no cache
        step_fn = full_step_fn(model, source, prefix_only=not static_shapes)
    state = {"inner": inner, "limit": tf.cast(limits, tf.int32)}
    step_fn = limit_lengths(step_fn)
    common = dict(max_length=max_length, eos_id=EOS_ID, bos_id=BOS_ID, **options)
    if sampling is not None:
        if beam_size != 1 or search == "beam":
            raise ValueError(f"sampling draws one token at a time: beam_size must be 1, got {beam_size}")
        rows = tf.range(batch_size) if row_ids is None else row_ids
        common["pick"] = picker(sampling, rows, seed)
    if search == "greedy" or (search == "auto" and beam_size == 1):
        ids, scores = greedy_search(step_fn, state, batch_size=batch_size, **common)
        return ids[:, tf.newaxis, :], scores[:, tf.newaxis]
    # No hypothesis outlives its sentence's limit (EOS forced there): the early-stopping bound knows it.
    max_lengths = state["limit"] + 1
    return beam_search(
        step_fn,
        state,
        batch_size=batch_size,
        beam_size=beam_size,
        alpha=alpha,
        max_lengths=max_lengths,
        **common,
    )


def output_limits(source_lengths, a: float, b: int, cap: int):
    """Per-sentence maximum output length floor(a * len + b), at most `cap - 1` (works on ints and tensors)."""
    if isinstance(source_lengths, (int, np.integer)):
        return max(0, min(int(math.floor(a * source_lengths + b)), cap - 1))
    lengths = tf.cast(source_lengths, tf.float64)  # float64, like Python: the same floor as the int branch
    # clipped before the int32 cast (before 2026-12-07d after it: a limit over 2^31 wrapped to 0, an empty output)
    return tf.cast(tf.clip_by_value(tf.floor(a * lengths + float(b)), 0.0, float(cap - 1)), tf.int32)


class DecodingFunctions:
    """The decoding tf.functions of one model, one per search setting, shared by every Translator around it.

    Thread-safe: decoding streams (`nmt.translator`) ask for the same function at once and get one object, traced
    once. `num_traces` counts the traces.
    """

    def __init__(self):
        self.functions: dict[tuple, Callable] = {}
        self.num_traces = 0
        self._lock = threading.Lock()

    def get(
        self,
        model,
        beam_size: int,
        use_cache: bool,
        alpha: float,
        max_length: int | None,
        xla: bool,
        sampling: Sampling | None = None,
    ) -> Callable:
        """`decode_batch` of one search setting as a tf.function: `f(source, limits)` for the output buffer
        `max_length` under XLA (one per length edge); without XLA `f(source, limits, max_length)` (`max_length`
        None here) for every buffer size. With `sampling`, two more arguments: `row_ids` (B,) int64 and the seed, a
        scalar int64 (one function for every seed)."""
        if sampling is not None:
            sampling = dataclasses.replace(sampling, seed=0)
        key = (beam_size, use_cache, alpha, max_length, sampling, xla)
        with self._lock:
            if key not in self.functions:
                self.functions[key] = self._build(weakref.ref(model), *key)
            return self.functions[key]

    def _build(self, model_ref, beam_size, use_cache, alpha, max_length, sampling, xla) -> Callable:
        # model_ref: a weak reference, so that the cache does not keep the model (its key) alive

        def decode(source, limits, *rest):
            buffer = max_length if xla else rest[0]
            row_ids, seed = rest[-2:] if sampling is not None else (None, None)
            self.num_traces += 1
            log.debug(
                "tracing the decoder: source %s, beam %d, max_length %s",
                source.shape,
                beam_size,
                "given per call" if max_length is None else max_length,
            )
            return decode_batch(
                model_ref(),
                source,
                limits,
                max_length=buffer,
                beam_size=beam_size,
                alpha=alpha,
                use_cache=use_cache,
                static_shapes=xla,
                sampling=sampling,
                row_ids=row_ids,
                seed=seed,
            )

        # autograph=False: the searches build their own tf.while_loop; converting the model's Python code only
        # makes every trace several times slower.
        if xla:  # one trace per padded (batch, length) shape
            return tf.function(decode, jit_compile=True, autograph=False)
        spec = [
            tf.TensorSpec([None, None], tf.int32),
            tf.TensorSpec([None], tf.int32),
            tf.TensorSpec([], tf.int32),
        ] + ([tf.TensorSpec([None], tf.int64), tf.TensorSpec([], tf.int64)] if sampling is not None else [])
        return tf.function(decode, input_signature=spec, autograph=False)  # dynamic shapes: one trace


_FUNCTIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> DecodingFunctions
_FUNCTIONS_LOCK = threading.Lock()


def decoding_functions(model) -> DecodingFunctions:
    """The `DecodingFunctions` of `model` (created on first use)."""
    with _FUNCTIONS_LOCK:
        return _FUNCTIONS.setdefault(model, DecodingFunctions())
