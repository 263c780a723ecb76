"""Batched translation of raw text lines with a trained model: greedy or beam search, cached or full recompute.

`Translator` is cheap to build around a live model (the trainer uses it for validation BLEU without copying
weights); `Translator.from_run_dir` loads everything a run directory holds.

Batches and traces: sentences are sorted by length (longest first) and batched under a token budget: at most
`batch_size` sentences and `batch_tokens` padded source tokens per batch, so batches of long sentences are smaller.
Without XLA every dimension (batch, source length, output buffer) is dynamic, so decoding is traced once per search
setting (each trace of the while loops costs seconds: tracing per length edge was a third of `evaluate.py`'s greedy
time on Multi30k), and a batch is padded to its longest source only. Under XLA, which compiles one program per shape,
source lengths are padded up to fixed edges (16, 32, 64, ... up to the position table) and batch sizes too (1, 4,
16, ... batch_size): at most (length edges x batch edges) programs per search setting. The output buffer follows from
the padded length. The traced functions are cached per model: a new `Translator` around the same model (the trainer
makes one per evaluation) reuses them. `num_traces` counts the traces of this model's decoding functions.

Streams: `streams` batches are decoded at once, each by its own thread calling the same traced function (TensorFlow
runs the calls side by side). Many of a decoding step's ops are too small for TensorFlow to spread over the cores of
a CPU; two independent batches keep both busy. `eval.streams` 0 (auto): 2 on a CPU with 2 or more cores, 1 on a GPU.
Translations do not depend on it (each batch is decoded alone, in the same way).

Maximum output length (subwords, EOS excluded) per sentence: `floor(a * source_length + b)` with `a, b =
eval_config.max_length_a, max_length_b`, capped by the model's position table, enforced per sentence
(`nmt.batch_decoding`): a translation never depends on which other sentences share its batch or on the padded shape.
`decode_batch`, `limit_lengths`, `output_limits` (from `nmt.batch_decoding`) and `validation_loss` (from
`nmt.validation`) are re-exported here. Batch grouping and padded sizes: `nmt.batch_shapes`; the cross-attention
weights of `attention`: `nmt.attention_weights`.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tensorflow as tf

from common.sampling import Sampling
from nmt.attention_weights import line_attention, piece_labels
from nmt.batch_decoding import decode_batch, decoding_functions, limit_lengths, output_limits, source_ids
from nmt.batch_shapes import DEFAULT_BATCH_TOKENS_PER_SENTENCE, padding_edges, plan_batches, round_up
from nmt.validation import validation_loss
from transformer.decoding import NEG_INF
from transformer.vocab import EOS_ID, PAD_ID

log = logging.getLogger(__name__)

__all__ = [
    "Translator",
    "decode_batch",
    "limit_lengths",
    "output_limits",
    "validation_loss",
]

# ----------------------------------------------------------------------------------------------------------------


class _Inline:
    """`ThreadPoolExecutor`'s `map` in the calling thread, for a single stream."""

    @staticmethod
    def map(fn, items):
        return map(fn, items)

    def shutdown(self, wait=True, cancel_futures=False):
        pass


# xla="auto" on a CPU: XLA for greedy search from this many lines, never for beam search. Measured on the shared
# 2-core AMD EPYC (AVX-512), under load, with `runs/base` (3+3 layers, d_model 256, 8k vocab) on Multi30k test2016
# (1,000 lines), two interleaved rounds, after this decoder's single non-XLA trace, growing cache and dropping of
# finished sentences: beam 4 warm 42.4-42.6 s under XLA vs 26.9-27.1 s without (1.6x slower); greedy warm 8.8-10.2 s
# vs 9.6-11.3 s (1.1x faster) but 13-17 s more to compile its (batch, length) shapes, repaid after ~15,000 lines.
# (The former rule, 4,000 lines, predates the non-XLA path's single trace and compaction.)
XLA_AUTO_MIN_LINES = 16000
# streams=0 (auto) on a CPU: one decoding stream per core, at most this many. Measured on the 2 vCPU AMD EPYC Zen 4
# (AVX-512), runs/base, Multi30k test2016, idle, two interleaved rounds, a whole translate() including the trace:
# greedy 6.14 / 6.15 s with one stream against 4.81 / 5.71 s with two, beam 4 17.0 / 18.1 s against 15.9 / 14.0 s;
# identical translations. Not measured with more cores.
MAX_AUTO_STREAMS = 2
# Detokenizing (eager ops) runs one stream at a time: two streams' eager ops at once crashed translate.py (SIGSEGV,
# 9 of 32 starts on a tiny run, 2 vCPU Zen 4, docs/streams-crash-2026-12-06). Decoding (tf.function) stays parallel.
_EAGER_OPS = threading.Lock()


class Translator:
    """Translates lists or streams of raw sentences with a Transformer and its tokenizer.

    Args:
      model: a built `transformer.model.Transformer` (used as is: weights are shared, not copied).
      tokenizer: a `data.tokenizer.Tokenizer`.
      eval_config: `nmt.config.EvalConfig` (beam_size, alpha, max_length_a, max_length_b, batch_size).
      max_source_length: source subwords fed to the encoder, EOS included; longer lines are truncated (the
        `on_truncated` callback of `translate` reports them).
      max_target_length: cap on the output buffer (positions, BOS included); default and maximum: the model's
        position table (`model.max_length`).
      batch_size: at most this many sentences per decoding batch; default `eval_config.batch_size`.
      batch_tokens: at most this many padded source tokens (sentences x padded length) per batch; default
        `DEFAULT_BATCH_TOKENS_PER_SENTENCE * batch_size`.
      xla: compile the decoding function with XLA, one program per padded (batch, length) shape: True, False or
        "auto" (`uses_xla`: always on a GPU; on a CPU only for greedy search of at least `XLA_AUTO_MIN_LINES`
        lines, where the speed-up repays the compile time).

    Example:
      >>> translator = Translator.from_run_dir("runs/base")
      >>> translator.translate(["A man is riding a bike."], beam_size=4)
      ['Ein Mann fährt Fahrrad.']
    """

    def __init__(
        self,
        model,
        tokenizer,
        eval_config,
        *,
        max_source_length: int,
        max_target_length: int | None = None,
        batch_size: int | None = None,
        batch_tokens: int | None = None,
        xla: bool | str = "auto",
        streams: int | None = None,
    ):
        if xla not in (True, False, "auto"):
            raise ValueError(f"xla must be True, False or 'auto', got {xla!r}")
        if max_source_length < 2:
            raise ValueError(f"max_source_length must be at least 2, got {max_source_length}")
        streams = eval_config.streams if streams is None else streams
        if streams < 0:
            raise ValueError(f"streams must be >= 0 (0 = auto), got {streams}")
        self.model = model
        self.tokenizer = tokenizer
        self.eval_config = eval_config
        table = getattr(model, "max_length", None) or max_source_length  # the model's position table
        self.max_source_length = min(max_source_length, table)
        self.max_target_length = min(max_target_length or table, table)
        self.xla = xla
        self.streams = streams
        self.batch_size = max(1, batch_size or eval_config.batch_size)
        self.batch_tokens = batch_tokens  # None: DEFAULT_BATCH_TOKENS_PER_SENTENCE * batch_size, read at use
        self.length_edges = padding_edges(16, self.max_source_length, 2)  # padded source lengths
        self.batch_edges = padding_edges(1, self.batch_size, 4)  # padded batch sizes
        self.config = None  # the run's Config, when loaded by from_run_dir
        self.weights = None  # the checkpoint prefix, when loaded by from_run_dir
        self._decoders = decoding_functions(model)

    @property
    def num_traces(self) -> int:
        """How many times this model's decoding functions were traced (by any Translator around it)."""
        return self._decoders.num_traces

    @classmethod
    def from_run_dir(
        cls, path: str | Path, weights: str = "auto", *, ensemble: Sequence[str | Path] = (), **kwargs
    ) -> Translator:
        """Loads config.yaml, the tokenizer and the weights of a run directory: final, best, latest or auto, or a
        candidate for final/ made again (average, ema; `nmt.final_weights.load_run_weights`).

        `ensemble`: more run directories, whose models (the same `weights` of each) decode together with this
        one's as a `transformer.ensemble.Ensemble` (`nmt.run_models.load_run_models`). The eval settings and data
        come from `path`'s config; `weights` then lists every run's."""
        from nmt.run_models import load_run_models

        config, tokenizer, model, loaded = load_run_models(path, weights, ensemble)
        translator = cls(model, tokenizer, config.eval, max_source_length=config.model.max_length, **kwargs)
        translator.config = config
        translator.weights = loaded
        return translator

    # ------------------------------------------------------------------------------------------------------------
    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        """Source subword ids of each line, untruncated and without EOS."""
        if not lines:
            return []
        ragged = self.tokenizer.tokenize_source(tf.constant(list(lines), dtype=tf.string))
        return ragged.to_list()

    def translate(
        self,
        lines: Sequence[str],
        *,
        beam_size: int | None = None,
        use_cache: bool = True,
        nbest: int = 1,
        progress: bool = False,
        on_truncated: Callable[[int, int | None], None] | None = None,
        sampling: Sampling | None = None,
        first_line: int = 0,
    ) -> list:
        """Translates `lines` (in order). Blank lines give "" (nbest > 1: []) without reaching the model.

        Args:
          beam_size: beam width; None = eval_config.beam_size; 1 = greedy search.
          use_cache: incremental decoding (True) or a full recompute each step (same results, slower).
          nbest: 1 -> a list of strings; N > 1 -> a list of lists of N `(text, score)` pairs, best first
            (needs N <= beam_size; scores are the length-normalised log-probabilities of the beam search).
          progress: a tqdm progress bar over batches on stderr (in a log, a line every 30 s: `nmt.progress`).
          on_truncated: called as `on_truncated(index, num_subwords)` for each line longer than the model allows
            (num_subwords None for a line too long to be tokenized whole: `batch_decoding.source_ids`).
          sampling: draw each token (`transformer.sampling.Sampling`: top-k, top-p, temperature, seed) instead of
            searching; needs beam_size 1. Line `i` draws its random numbers by `first_line + i` (modulo 2^32), so
            they do not depend on the batching, the streams, XLA or the other lines (the draws, up to the rounding
            of the probabilities: `transformer.sampling`).
        """
        if sampling is not None:
            beam_size = 1 if beam_size is None else beam_size
            if beam_size != 1:
                raise ValueError(f"sampling draws one token at a time: beam_size must be 1, got {beam_size}")
        beam_size = self.eval_config.beam_size if beam_size is None else beam_size
        lines = list(lines)
        results: list = ["" if nbest == 1 else [] for _ in lines]
        todo, ids = source_ids(
            lines, beam_size, nbest, self.encode, self.max_source_length, on_truncated,
            max_chars=self.tokenizer.source_chars_for(self.max_source_length),
        )  # fmt: skip
        sources = dict(zip(todo, ids))
        keys = list(sources)
        xla = self.uses_xla(len(keys), beam_size)
        lengths = [len(sources[i]) for i in keys]
        batches = [[keys[j] for j in batch] for batch in self.batches(lengths, xla=xla)]
        streams = min(self.num_streams(), len(batches))

        def decode(batch):
            rows = [first_line + i for i in batch]
            return self._translate_batch(
                [sources[i] for i in batch], beam_size, use_cache, nbest, xla, sampling, rows
            )

        pool = ThreadPoolExecutor(streams, thread_name_prefix="decode") if streams > 1 else _Inline()
        try:
            done = pool.map(decode, batches)  # in order; longest batches first
            if progress:
                from tqdm import tqdm

                from nmt.progress import bar_file, bar_interval

                done = tqdm(
                    done, total=len(batches), desc="translating", unit="batch", leave=False, file=bar_file(),
                    mininterval=bar_interval(),
                )  # fmt: skip
            for batch, texts in zip(batches, done):
                for index, text in zip(batch, texts):
                    results[index] = text
        finally:  # after an error or Ctrl-C, the batches not started yet are dropped, not decoded
            pool.shutdown(wait=True, cancel_futures=True)
        return results

    def num_streams(self) -> int:
        """How many batches `translate` decodes at once (`streams`, or its automatic value for 0)."""
        if self.streams:
            return self.streams
        if tf.config.list_physical_devices("GPU"):
            return 1
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return max(1, min(MAX_AUTO_STREAMS, cores))

    def batches(self, lengths: Sequence[int], *, xla: bool = True) -> list[list[int]]:
        """How `translate` groups sentences of these source lengths (subwords, EOS excluded): lists of indices.

        Longest first (memory problems show early); a batch takes the next sentence while it holds fewer than
        `batch_size` sentences and the padded batch stays within `batch_tokens` tokens.
        """
        budget = self.batch_tokens or DEFAULT_BATCH_TOKENS_PER_SENTENCE * self.batch_size
        return plan_batches(
            lengths, self.batch_size, budget, lambda length: self.padded_length(length, xla=xla)
        )

    def padded_length(self, length: int, *, xla: bool = True) -> int:
        """The padded source length of a batch whose longest sentence has `length` subwords (EOS excluded):
        rounded up to `length_edges` under XLA (a program per shape), else just that sentence and its EOS."""
        return round_up(length + 1, self.length_edges) if xla else length + 1

    def uses_xla(self, num_lines: int, beam_size: int) -> bool:
        """Whether `translate` of `num_lines` lines with this beam decodes under XLA (see the `xla` argument)."""
        if self.xla != "auto":
            return bool(self.xla)
        if tf.config.list_physical_devices("GPU"):
            return True
        return beam_size == 1 and num_lines >= XLA_AUTO_MIN_LINES

    def translate_stream(
        self, lines: Iterable[str], *, chunk_size: int = 1000, on_truncated=None, **kwargs
    ) -> Iterator:
        """Yields the translation of each line of `lines`, in order, holding at most `chunk_size` lines in memory.

        Keyword arguments are those of `translate`; `on_truncated` receives indices into the whole stream.
        """
        from nmt.text_io import chunked

        start = 0
        for chunk in chunked(lines, chunk_size):
            callback = None
            if on_truncated is not None:

                def callback(index, length, _start=start):
                    on_truncated(_start + index, length)

            yield from self.translate(chunk, on_truncated=callback, first_line=start, **kwargs)
            start += len(chunk)

    # ------------------------------------------------------------------------------------------------------------
    def _translate_batch(
        self,
        sources: list[list[int]],
        beam_size: int,
        use_cache: bool,
        nbest: int,
        xla: bool,
        sampling: Sampling | None = None,
        rows: list[int] | None = None,
    ) -> list:
        count = len(sources)
        # (count, K, max_length), (count, K)
        ids, scores = self._decode(sources, beam_size, use_cache, xla, sampling, rows)
        with _EAGER_OPS:
            texts = self.tokenizer.detokenize_target(tf.reshape(ids[:, :nbest], [count * nbest, -1])).numpy()
        texts = [text.decode("utf-8", errors="replace") for text in texts]
        if nbest == 1:
            return texts
        scores = scores[:, :nbest].tolist()
        lists = [list(zip(texts[i * nbest : (i + 1) * nbest], scores[i])) for i in range(count)]
        # A beam with fewer distinct hypotheses than asked (a limit of 0 pieces: only the empty one) holds NEG_INF
        # fillers: the best repeated instead, as CTranslate2 gives (before, "-1000000000.0000" in the output).
        return [[h if h[1] > NEG_INF / 2 else best[0] for h in best] for best in lists]

    def _decode(
        self,
        sources: list[list[int]],
        beam_size: int,
        use_cache: bool,
        xla: bool,
        sampling: Sampling | None = None,
        rows: list[int] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Source pieces (truncated, without EOS) -> (ids (N, K, max_length), scores (N, K)) as NumPy arrays;
        `rows`: each sentence's number for `sampling`'s random numbers."""
        cfg = self.eval_config
        count = len(sources)
        # XLA compiles one program per shape: pad the batch too. Without XLA the batch dimension is dynamic.
        padded_batch = round_up(count, self.batch_edges) if xla else count
        padded_length = self.padded_length(max(len(ids) for ids in sources), xla=xla)
        max_length = min(
            int(math.floor(cfg.max_length_a * padded_length + cfg.max_length_b)) + 1, self.max_target_length
        )
        source = np.full((padded_batch, padded_length), PAD_ID, dtype=np.int32)  # (B, S)
        source[count:, 0] = EOS_ID  # filler rows: an empty sentence
        limits = np.zeros((padded_batch,), dtype=np.int32)  # (B,)
        for row, ids in enumerate(sources):
            source[row, : len(ids)] = ids
            source[row, len(ids)] = EOS_ID
            limits[row] = output_limits(len(ids), cfg.max_length_a, cfg.max_length_b, max_length)
        function = self._decoders.get(
            self.model, beam_size, use_cache, float(cfg.alpha), max_length if xla else None, xla, sampling
        )
        inputs = (source, limits) if xla else (source, limits, np.int32(max_length))
        if sampling is not None:
            row_ids = np.zeros((padded_batch,), dtype=np.int64)  # filler rows: any number
            row_ids[:count] = range(count) if rows is None else rows
            inputs += (row_ids, np.int64(sampling.seed))
        ids, scores = function(*(tf.constant(x) for x in inputs))
        return ids.numpy()[:count], scores.numpy()[:count]

    # ------------------------------------------------------------------------------------------------------------
    def attention(self, line: str, *, beam_size: int | None = None) -> dict:
        """Translates one line and returns its cross-attention weights, for plotting (`nmt.attention_weights`).

        Returns:
          {"source": source pieces (EOS included), "target": output pieces (EOS included), "translation": str,
          "weights": one float32 array (heads, len(target), len(source)) per decoder layer}.
        """
        return line_attention(self, line, beam_size=beam_size)

    def _pieces(self, ids: list[int], *, source: bool) -> list[str]:
        """A readable label per subword id (its detokenized text)."""
        return piece_labels(self.tokenizer, ids, source=source)
