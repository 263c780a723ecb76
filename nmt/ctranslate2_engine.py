"""Translation with a CTranslate2 export (`nmt.ctranslate2_export`), with the interface of `nmt.translator.Translator`.

    translator = CTranslate2Translator.from_run_dir("runs/base", "runs/base/ct2")   # config + tokenizer of the run
    translator.translate(["A man is riding a bike."], beam_size=4)

What is the same as the TensorFlow engine: tokenization and detokenization (our `Tokenizer`, so the same pieces in
and the same text out), truncation of the source to `max_source_length - 1` pieces plus EOS (`on_truncated` reports
it), blank lines give "" without reaching the engine, and the per-sentence output limit ``floor(max_length_a * len +
max_length_b)`` subwords (EOS excluded), capped by the position table (`nmt.batch_decoding.output_limits`). CTranslate2
takes one ``max_decoding_length`` per call, so sentences are decoded in groups of one limit (and, for beam search
with ``alpha != 0``, one source length), at most `batch_size` sentences per call: every sentence gets exactly its own limit. Greedy search is then identical
token for token (up to float rounding): CTranslate2 stops a sentence at its limit, where ours forces EOS.

What differs, in beam search only. Both searches keep the ``beam`` best unfinished hypotheses by log-probability
(no length penalty), so they explore the same hypotheses; they differ in which finished ones they keep, when they
stop, and how they rank:

- **Ranking.** Ours divides by GNMT's ``((5 + m) / 6) ** alpha`` (``m``: length with EOS), CTranslate2 by
  ``m ** length_penalty``. Here CTranslate2 returns all its finished hypotheses and they are re-ranked by our exact
  GNMT score (their log-probability is recovered from CTranslate2's normalised score), so scores and ranking are
  ours. Its ``length_penalty`` is set to the one of the same slope at the expected length (`ctranslate2_length_penalty`),
  which only matters for which hypotheses survive its own cut.
- **Stopping.** Ours stops when no unfinished hypothesis can beat the worst of ``beam`` finished ones, even at full
  length (exact for ``alpha >= 0``); it keeps the EOS candidates among the best ``2 * beam`` of each step.
  CTranslate2 keeps those among the best ``beam``; with ``alpha = 0`` it stops once the best candidate of a step
  ends (our ranking then, the same best hypothesis unless an EOS candidate ranked below ``beam`` would have won);
  with ``alpha != 0`` it stops after ``beam * patience`` finished hypotheses, which can be too early. On the test
  fixture's 400 unseen word salads (beam 4, alpha 0.6 / 1.4), CTranslate2 picked our hypothesis for 341 / 324 of
  them with patience 1, 398 / 395 with patience 2 (the default here), 400 / 399 with 3; where they differed, ours
  scored higher. A higher patience costs decoding steps.
- **At the limit** ours forces EOS and ranks the hypotheses with it; CTranslate2 returns its alive hypotheses as
  they are (and they are ranked as if EOS followed, as ours). Sentences that reach their limit may differ.

`use_cache` and XLA have no meaning here; `use_cache` is accepted (and ignored) so callers need not care.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from common.cpu import int8_saturates
from common.special_ids import EOS_ID, PAD_ID
from nmt.batch_decoding import output_limits, source_ids
from nmt.ctranslate2_format import (
    COMPUTE_TYPES,
    METADATA,
    ExportError,
    check_export_weights,
    export_vocabulary,
    import_ctranslate2,
    read_export_metadata,
)
from nmt.progress import bar_settings

log = logging.getLogger(__name__)

__all__ = [
    "COMPUTE_TYPES",
    "CTranslate2Translator",
    "EngineError",
    "ExportError",
    "ctranslate2_length_penalty",
    "gnmt_score",
]


class EngineError(RuntimeError):
    """The CTranslate2 model of an export could not be loaded (a corrupt or truncated ``model.bin``)."""


def ctranslate2_length_penalty(alpha: float, length: int) -> float:
    """CTranslate2's ``length_penalty`` whose ``m ** lp`` has the slope of GNMT's ``((5 + m) / 6) ** alpha`` at ``m =
    length``: ``d log / d log m`` is ``lp`` for the first and ``alpha * m / (5 + m)`` for the second."""
    return float(alpha) * length / (5.0 + length)


def gnmt_score(log_prob: float, length: int, alpha: float) -> float:
    """Our beam score: ``log_prob / ((5 + length) / 6) ** alpha``, ``length`` counting EOS (`transformer.decoding`)."""
    return float(log_prob) / ((5.0 + length) / 6.0) ** float(alpha)


MAX_AUTO_INTER_THREADS = 2  # as the TensorFlow engine's automatic streams (`nmt.translator.MAX_AUTO_STREAMS`)


def thread_split(inter_threads: int | None = None, intra_threads: int | None = None) -> tuple[int, int]:
    """(inter_threads, intra_threads) for CTranslate2 from what was asked (None or 0: automatic)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    for name, value in (("inter_threads", inter_threads), ("intra_threads", intra_threads)):
        if value is not None and value < 0:
            raise ValueError(f"{name} must be >= 0 (0 = automatic), got {value}")
    inter = inter_threads or max(1, min(MAX_AUTO_INTER_THREADS, cpus))
    intra = intra_threads or max(1, cpus // inter)
    return inter, intra


class CTranslate2Translator:
    """Translates lists or streams of raw sentences with a CTranslate2 export of one of our models.

    Args:
      engine_dir: an export directory (`nmt.ctranslate2_export.export_ctranslate2`).
      tokenizer: a `data.tokenizer.Tokenizer`, the one the export was made with (checked by fingerprint).
      eval_config: `nmt.config.EvalConfig` (beam_size, alpha, max_length_a, max_length_b, batch_size).
      compute_type: "auto" (what the export was quantized to), "float32", or "int8" (int8 weights, float32
        activations between the int8 products: CTranslate2's ``int8_float32``; a float32 export is quantized on load).
      batch_size: at most this many sentences per CTranslate2 call; default `eval_config.batch_size`.
      max_source_length: source pieces fed to the encoder, EOS included; default and maximum: the export's.
      patience: beam search with alpha != 0 stops after `beam_size * patience` finished hypotheses (at least 1;
        see the module docstring).
      inter_threads: CTranslate2's translations in flight at once (`translate` submits its calls asynchronously);
        default (None or 0): one per CPU this process may use, at most `MAX_AUTO_INTER_THREADS`.
      intra_threads: threads per translation; default: the CPUs divided among the `inter_threads`.
        On a 2-vCPU AMX Xeon, 2 x 1 decoded test2016 with beam 4 2.8x (float32) and 4.2x (int8) faster than 1 x 2
        (CTranslate2's OpenMP threads over 2 vCPUs), the same output: README, "Deploy with CTranslate2".

    Attributes (as in `Translator`): `eval_config`, `tokenizer`, `config` (the run's `Config`, from `from_run_dir`),
    `weights` (the checkpoint the export came from), `max_source_length`, `max_target_length`, `batch_size`; plus
    `engine_dir`, `metadata` (the export's `nmt_export.json`), `compute_type` (CTranslate2's), `engine` (the
    ``ctranslate2.Translator``) and `int8_saturates` (int8 on an x86 CPU without VNNI, `common.cpu.int8_saturates`:
    logged as a warning when loaded).
    """

    def __init__(
        self,
        engine_dir: str | Path,
        tokenizer,
        eval_config,
        *,
        compute_type: str = "auto",
        batch_size: int | None = None,
        max_source_length: int | None = None,
        patience: float = 2.0,
        inter_threads: int | None = None,
        intra_threads: int | None = None,
    ):
        self.engine_dir = Path(engine_dir)
        self.metadata = read_export_metadata(self.engine_dir)
        if compute_type not in ("auto", *COMPUTE_TYPES):
            raise ValueError(f"compute_type must be auto, float32 or int8, got {compute_type!r}")
        if tokenizer.fingerprint != self.metadata["tokenizer"]["fingerprint"]:
            raise ExportError(
                f"the CTranslate2 export {self.engine_dir} was made with another tokenizer than this one: "
                "export the run directory you translate with"
            )
        ctranslate2 = import_ctranslate2()
        self.tokenizer = tokenizer
        self.eval_config = eval_config
        self.config = None  # the run's Config, when loaded by from_run_dir
        self.weights = self.metadata.get("weights")
        table = int(self.metadata["position_table"])
        self.max_source_length = min(
            max_source_length or table, int(self.metadata["max_source_length"]), table
        )
        if self.max_source_length < 2:
            raise ValueError(f"max_source_length must be at least 2, got {self.max_source_length}")
        self.max_target_length = table
        self.batch_size = max(1, batch_size or eval_config.batch_size)
        if patience < 1:
            raise ValueError(f"patience must be at least 1, got {patience}")
        self.patience = float(patience)
        self.compute_type = (
            self.metadata["compute_type"] if compute_type == "auto" else COMPUTE_TYPES[compute_type]
        )
        self.inter_threads, self.intra_threads = thread_split(inter_threads, intra_threads)
        self.int8_saturates = self.compute_type.startswith("int8") and int8_saturates()
        if self.int8_saturates:
            log.warning(
                "%s on a CPU without VNNI (AVX-VNNI, AVX512-VNNI or AMX): int8 products can saturate here (summed "
                "in pairs in 16-bit lanes), so translations can differ from float32 by more than int8 rounding "
                "(Multi30k's BLEU held on an AVX2 EPYC: README); compare BLEU with compute_type float32",
                self.compute_type,
            )
        try:
            self.engine = ctranslate2.Translator(
                str(self.engine_dir),
                device="cpu",
                compute_type=self.compute_type,
                inter_threads=self.inter_threads,
                intra_threads=self.intra_threads,
            )
        except (RuntimeError, ValueError) as err:  # a truncated or corrupt model.bin, an unknown compute type
            raise EngineError(f"cannot load the CTranslate2 model in {self.engine_dir}: {err}") from err
        self._source_pieces = export_vocabulary(self.engine_dir, "source")
        target_pieces = export_vocabulary(self.engine_dir, "target")
        sizes = {"source": len(self._source_pieces), "target": len(target_pieces)}
        for side, size in (self.metadata.get("vocab") or {}).items():
            if sizes.get(side, size) != size:
                raise EngineError(
                    f"a damaged CTranslate2 export: {self.engine_dir} has {sizes[side]} {side} vocabulary entries, "
                    f"its {METADATA} says {size} (make it again with export.py --format ctranslate2)"
                )
        self._target_ids = {piece: i for i, piece in enumerate(target_pieces)}

    @classmethod
    def from_run_dir(cls, model_dir: str | Path, engine_dir: str | Path, **kwargs) -> CTranslate2Translator:
        """The export at `engine_dir` with the config (eval settings) and tokenizer of the run directory `model_dir`."""
        from data.tokenizer import Tokenizer
        from nmt.run_dir import RunDir

        run_dir = RunDir(model_dir).require()
        config = run_dir.load_config()
        tokenizer = Tokenizer.load(run_dir.tokenizer_dir)
        check_export_weights(run_dir, engine_dir)
        kwargs.setdefault("max_source_length", config.model.max_length)
        if kwargs.get("inter_threads") is None:  # the run's eval.streams, as the TensorFlow engine's streams
            kwargs["inter_threads"] = config.eval.streams or None
        translator = cls(engine_dir, tokenizer, config.eval, **kwargs)
        translator.config = config
        log.info("loaded the CTranslate2 export %s (%s)", engine_dir, translator.compute_type)
        return translator

    @classmethod
    def from_export_dir(cls, engine_dir: str | Path, **kwargs) -> CTranslate2Translator:
        """The export alone: its own SentencePiece model(s) and the eval settings recorded at export time."""
        from data.tokenizer import Tokenizer
        from nmt.config import EvalConfig

        metadata = read_export_metadata(engine_dir)
        eval_config = EvalConfig(**metadata.get("eval", {}))
        return cls(engine_dir, Tokenizer.load(engine_dir), eval_config, **kwargs)

    # ------------------------------------------------------------------------------------------------------------
    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        """Source subword ids of each line, untruncated and without EOS."""
        if not lines:
            return []
        import tensorflow as tf

        return self.tokenizer.tokenize_source(tf.constant(list(lines), dtype=tf.string)).to_list()

    def uses_xla(self, num_lines: int = 0, beam_size: int = 1) -> bool:
        """Always False: CTranslate2 has its own kernels (here for callers that record the TensorFlow setting)."""
        return False

    def translate(
        self,
        lines: Sequence[str],
        *,
        beam_size: int | None = None,
        use_cache: bool = True,
        nbest: int = 1,
        progress: bool = False,
        on_truncated: Callable[[int, int | None], None] | None = None,
    ) -> list:
        """Translates `lines` (in order), like `Translator.translate`: blank lines give "" (nbest > 1: []).

        Args:
          beam_size: beam width; None = eval_config.beam_size; 1 = greedy search.
          use_cache: ignored (CTranslate2 always decodes incrementally).
          nbest: 1 -> a list of strings; N > 1 -> a list of lists of N `(text, score)` pairs, best first (scores:
            our GNMT-normalised log-probabilities).
          progress: a tqdm progress bar over CTranslate2 calls on stderr (in a log, a line every 30 s: `nmt.progress`).
          on_truncated: called as `on_truncated(index, num_subwords)` for each line longer than the model allows
            (num_subwords None for a line too long to be tokenized whole: `batch_decoding.source_ids`).
        """
        beam_size = self.eval_config.beam_size if beam_size is None else beam_size
        lines = list(lines)
        results: list = ["" if nbest == 1 else [] for _ in lines]
        todo, sources = source_ids(
            lines, beam_size, nbest, self.encode, self.max_source_length, on_truncated,
            max_chars=self.tokenizer.source_chars_for(self.max_source_length),
        )  # fmt: skip
        hypotheses = self.decode_ids(sources, beam_size=beam_size, nbest=nbest, progress=progress)
        texts = self._detokenize([ids for best in hypotheses for ids, _ in best])
        position = 0
        for index, best in zip(todo, hypotheses):
            pairs = [(texts[position + j], score) for j, (_, score) in enumerate(best)]
            position += len(best)
            results[index] = pairs[0][0] if nbest == 1 else pairs
        return results

    def translate_stream(
        self, lines: Iterable[str], *, chunk_size: int = 1000, on_truncated=None, **kwargs
    ) -> Iterator:
        """Yields the translation of each line of `lines`, in order, holding at most `chunk_size` lines in memory."""
        from nmt.text_io import chunked

        start = 0
        for chunk in chunked(lines, chunk_size):
            callback = None
            if on_truncated is not None:

                def callback(index, length, _start=start):
                    on_truncated(_start + index, length)

            yield from self.translate(chunk, on_truncated=callback, **kwargs)
            start += len(chunk)

    def output_limit(self, source_length: int) -> int:
        """Maximum output subwords (EOS excluded) for a source of `source_length` pieces (EOS excluded)."""
        cfg = self.eval_config
        return output_limits(source_length, cfg.max_length_a, cfg.max_length_b, self.max_target_length)

    def decode_ids(
        self, sources: Sequence[Sequence[int]], *, beam_size: int, nbest: int = 1, progress: bool = False
    ) -> list[list[tuple[list[int], float]]]:
        """Source piece ids (truncated, without EOS) -> per sentence, `nbest` (output ids without EOS, score) pairs.

        Scores are ours: the sum of the token log-probabilities (EOS included), divided by the GNMT penalty of
        `eval_config.alpha` for beam search (greedy: not divided, like `transformer.decoding.greedy_search`).
        An empty source (no pieces) gives an empty output: CTranslate2 does not decode it (ours would decode the
        lone EOS); `translate` never sends one, a non-blank line has at least one piece.
        """
        alpha = float(self.eval_config.alpha) if beam_size > 1 else 0.0
        results: list = [None] * len(sources)
        groups: dict[tuple[int, int], list[int]] = {}
        for index, ids in enumerate(sources):
            limit = self.output_limit(len(ids))
            if limit == 0:  # ours forces EOS at once
                results[index] = [([], 0.0)] * nbest
            else:
                # the length penalty of a call depends on the source length (alpha != 0 only)
                groups.setdefault((limit, len(ids) if alpha else 0), []).append(index)
        calls = []
        for (limit, length), members in sorted(groups.items(), reverse=True):
            for start in range(0, len(members), self.batch_size):
                calls.append((limit, length, members[start : start + self.batch_size]))
        pending = []  # every call is submitted at once; the engine's inter_threads work through them
        for limit, length, members in calls:
            # alpha = 0 and one hypothesis: CTranslate2's early exit (length_penalty 0) keeps our ranking; alpha != 0,
            # or an n-best list (its early exit stopped at the first n finished, missing better 2nd..nth ones): stop
            # after beam * patience finished hypotheses, all of them returned and re-ranked by our score.
            wide = bool(alpha) or nbest > 1
            lp = ctranslate2_length_penalty(alpha, length + 1) if alpha else 0.0
            count = max(nbest, round(beam_size * self.patience)) if wide else nbest
            outputs = self.engine.translate_batch(
                [[self._source_pieces[i] for i in sources[index]] for index in members],
                beam_size=beam_size,
                patience=self.patience if wide else 1.0,
                num_hypotheses=count,
                length_penalty=lp,
                max_decoding_length=limit,
                min_decoding_length=0,
                max_input_length=0,
                return_end_token=True,
                return_scores=True,
                asynchronous=True,
            )
            pending.append((members, lp, outputs))
        if progress:
            pending = tqdm(pending, desc="translating", unit="batch", leave=False, **bar_settings())
        for members, lp, outputs in pending:
            for index, output in zip(members, outputs):
                results[index] = self._rank(output.result(), lp, alpha, nbest)
        return results

    def _rank(self, output, lp: float, alpha: float, nbest: int) -> list[tuple[list[int], float]]:
        """CTranslate2's hypotheses -> our (ids, GNMT score), best first."""
        ranked = []
        for tokens, score in zip(output.hypotheses, output.scores):
            ids = [self._target_ids[token] for token in tokens]
            length = len(ids)  # CTranslate2's length: EOS included when the hypothesis ended with it
            log_prob = score * length**lp if lp else score
            if ids and ids[-1] == EOS_ID:
                ids = ids[:-1]
            ranked.append((ids, gnmt_score(log_prob, len(ids) + 1, alpha) if alpha else float(log_prob)))
        ranked.sort(key=lambda pair: -pair[1])
        return ranked[:nbest]

    def _detokenize(self, outputs: list[list[int]]) -> list[str]:
        if not outputs:
            return []
        import tensorflow as tf

        ids = np.full((len(outputs), max(1, max(map(len, outputs)))), PAD_ID, np.int32)
        for row, output in enumerate(outputs):
            ids[row, : len(output)] = output
        texts = self.tokenizer.detokenize_target(tf.constant(ids)).numpy()
        return [text.decode("utf-8", errors="replace") for text in texts]
