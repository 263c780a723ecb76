"""Corpus evaluation of a run directory: decode a split (or a pair of files), score with sacreBLEU, measure the loss.

Quality protocol (DESIGN.md): BLEU and chrF from sacreBLEU on detokenized, cased hypotheses against the raw
references, with the signature. `bleu_lc_tok` is a second, clearly labelled BLEU on lowercased, tokenized text
(13a, or the target language's tokenizer: `nmt.scores`), only for comparison with papers that report lowercased
tokenized BLEU; never mix the two. A run trained on lowercased text (`data.lowercase`) writes lowercase, so its
BLEU and chrF are scored case-insensitively (the signature says `case:lc`, the record `lowercase: true`); its BLEU
then equals `bleu_lc_tok`.

The hypotheses file holds exactly the strings that were scored (one per line, `text_io.one_line`), so
`sacrebleu.corpus_bleu(open(hyp).read().splitlines(), [references])` reproduces `bleu`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from nmt.scores import score_corpus
from nmt.text_io import LineWriter, one_line
from nmt.validation import cut_pairs, pairs_loss_dataset, perplexity, validation_loss

log = logging.getLogger(__name__)

__all__ = [
    "EvaluationError",
    "evaluate",
    "evaluate_run_dir",
    "pairs_loss_dataset",
    "perplexity",
    "read_text_file",
    "score_corpus",
    "validation_loss",
    "write_hypotheses",
]


class EvaluationError(ValueError):
    """A problem with what was asked to evaluate (e.g. source and reference files of different lengths)."""


def write_hypotheses(path: str | Path, hypotheses: Sequence[str]) -> None:
    """One hypothesis per line, through a temporary file renamed at the end."""
    with LineWriter(path) as writer:
        for hypothesis in hypotheses:
            writer.write(hypothesis)


def evaluate(
    translator,
    sources: Sequence[str],
    references: Sequence[str],
    *,
    beam_size: int | None = None,
    loss_dataset=None,
    target_language: str = "",
    progress: bool = False,
    loss_model=None,
    lowercase: bool = False,
) -> tuple[list[str], dict]:
    """Translates `sources`, scores them against `references`, and measures the loss on `loss_dataset`.

    `translator` is a `Translator` or a `CTranslate2Translator`; the loss is that of `loss_model` (default:
    `translator.model`; none if neither exists). `lowercase`: score case-insensitively (`score_corpus`).

    Returns:
      (hypotheses exactly as scored, a record with `bleu`, `chrf`, `signature`, `bleu_lc_tok`, `loss`,
      `perplexity`, `loss_tokens`, `num_sentences`, `beam`, `seconds`, `sentences_per_sec`, ...).
    """
    beam_size = translator.eval_config.beam_size if beam_size is None else beam_size
    start = time.perf_counter()
    cut_lines = []  # 1-based lines of sources longer than the model allows, translated cut (as translate.py warns)
    translations = translator.translate(
        list(sources),
        beam_size=beam_size,
        progress=progress,
        on_truncated=lambda i, _: cut_lines.append(i + 1),
    )
    hypotheses = [one_line(h) for h in translations]
    seconds = time.perf_counter() - start
    if cut_lines:
        log.warning(
            "%d source sentence(s) longer than the model allows were translated from their first pieces only "
            "(line(s) %s)", len(cut_lines), ", ".join(map(str, cut_lines[:10])) + (", ..." if len(cut_lines) > 10
            else ""),
        )  # fmt: skip
    record = score_corpus(hypotheses, references, target_language, lowercase)
    record.update(
        beam=beam_size, num_sentences=len(sources), seconds=round(seconds, 3), sources_cut=len(cut_lines)
    )
    record["sentences_per_sec"] = round(len(sources) / seconds, 2) if seconds > 0 else None
    loss_model = loss_model if loss_model is not None else getattr(translator, "model", None)
    if loss_dataset is not None and loss_model is not None:
        loss, tokens = validation_loss(loss_model, loss_dataset)
        if tokens:
            record.update(loss=loss, perplexity=perplexity(loss), loss_tokens=tokens)
        else:  # every pair blank or one-sided: no loss (not NaN in the report)
            record.update(loss=None, perplexity=None, loss_tokens=0, loss_note="no usable pair for the loss")
    return hypotheses, record


def read_text_file(path: str | Path, warn=None) -> list[str]:
    """All lines of a UTF-8 text file, read once ("-": stdin), invalid bytes replaced and NULs removed (each with a
    warning), a byte order mark dropped."""
    from nmt.text_io import open_input, read_lines

    with open_input(path) as handle:
        return list(read_lines(handle, warn))


def _split_name(data_config, split: str) -> str:
    """The dataset's name of `split`: "validation" and "test" are the config's `data.validation_split` and
    `data.test_split`; any other name is itself."""
    return {"validation": data_config.validation_split, "test": data_config.test_split}.get(split, split)


def _check_split(data_config, split: str) -> None:
    """EvaluationError (a bad --split) if the dataset has no split of that name, or (TFDS) its slice is malformed
    or out of the split's range; a folder corpus has no slicing."""
    from data.corpus import FOLDER

    if data_config.dataset == FOLDER:
        from data.folder import listing

        names = list(listing(data_config))
        if split not in names:
            slicing = " (a folder corpus has no slicing)" if "[" in split else ""
            raise EvaluationError(
                f"split {split!r} is not in dataset {data_config.dataset!r} (splits: {', '.join(names)}){slicing}"
            )
        return
    from data.corpus import split_problem, tfds_builder

    problem = split_problem(tfds_builder(data_config), data_config, split)
    if problem:
        raise EvaluationError(problem)


def evaluate_run_dir(
    model_dir: str | Path,
    *,
    split: str = "validation",
    beam_size: int | None = None,
    source_file: str | None = None,
    reference_file: str | None = None,
    output: str | Path | None = None,
    weights: str = "auto",
    max_sentences: int = 0,
    batch_size: int | None = None,
    progress: bool = False,
    warn=None,
    alpha: float | None = None,
    xla: bool | str = "auto",
    streams: int | None = None,
    engine: str = "tensorflow",
    engine_dir: str | Path | None = None,
    ensemble: Sequence[str | Path] = (),
) -> dict:
    """Evaluates a run directory on a split of its dataset, or on a source file and its reference file.

    Args:
      split: "validation" or "test" (the config's `data.validation_split` / `data.test_split`), or any split name.
      source_file, reference_file: evaluate on these (line-aligned) instead of a split; each is read once (a pipe
        works), "-" is stdin.
      output: hypotheses file; default DIR/hypotheses.<split>.txt (DIR/hypotheses.<source file name>.txt), with
        the weights, engine, ensemble or first N sentences in the name when not the defaults (`default_hypotheses_name`).
      max_sentences: only the first N sentences (0 = all); the loss is then measured on those N pairs too.
      batch_size: sentences per decoding batch (default: the run's eval.batch_size).
      warn: `warn(line_number, kind, message, source=file name)` for undecodable bytes in the files.
      alpha: GNMT length-penalty exponent of the beam search (default: the run's eval.alpha).
      xla: True, False or "auto": decode with XLA (`Translator(xla=...)`): the same translations, faster on large
        inputs once compiled; "auto" decides from the number of sentences and the device (`Translator.uses_xla`).
      streams: decoding batches in flight at once (`Translator(streams=...)`, CTranslate2's `inter_threads`); None:
        the run's eval.streams.
      engine, engine_dir: "tensorflow", or "ctranslate2" with the export `engine_dir` (`CTranslate2Translator`):
        translations from the export, the loss from the run directory's TensorFlow weights (`_loss_model`).
      ensemble: more run directories decoding with `model_dir`'s (`Translator.from_run_dir(ensemble=...)`): the
        translations and the loss are the ensemble's.
    Returns:
      The record of `evaluate`, plus `split`, `model_dir`, `weights` and `hypotheses` (the file written),
      `loss_pairs_cut` with a loss (pairs whose loss saw only data.max_length - 1 pieces of a side), and
      `engine` (with ctranslate2: `engine_dir`, `compute_type`, `int8_saturates`, `loss_weights` or `loss_note`).
    """
    from data.pipeline import eval_batches, open_split
    from nmt.translator import Translator

    if source_file is None:  # a bad --split is refused before a model is loaded
        from nmt.run_dir import RunDir

        data_config = RunDir(model_dir).require().load_config().data
        _check_split(data_config, _split_name(data_config, split))
    loss_model, extra = None, {"engine": engine}
    if ensemble and engine != "tensorflow":
        raise EvaluationError(f"an ensemble decodes with the tensorflow engine, not {engine}")
    if engine == "ctranslate2":
        from nmt.ctranslate2_engine import CTranslate2Translator

        translator = CTranslate2Translator.from_run_dir(
            model_dir, engine_dir, batch_size=batch_size, inter_threads=streams
        )
        loss_model, note = _loss_model(model_dir, translator, weights)
        extra.update(engine_dir=str(engine_dir), compute_type=translator.compute_type, **note)
        extra.update(int8_saturates=translator.int8_saturates)
        extra.update(streams=translator.inter_threads, intra_threads=translator.intra_threads)
    else:
        translator = Translator.from_run_dir(
            model_dir,
            weights=weights,
            xla=xla,
            batch_size=batch_size,
            streams=streams,
            ensemble=tuple(ensemble),
        )
        extra["streams"] = translator.num_streams()
        if ensemble:
            extra["ensemble"] = [str(path) for path in ensemble]
    config = translator.config
    if alpha is not None:
        if (beam_size or translator.eval_config.beam_size) == 1:  # `--beam 1 --alpha`: refused by the CLI
            from nmt.cli import GREEDY_RUN_ALPHA

            raise EvaluationError(GREEDY_RUN_ALPHA)
        translator.eval_config = dataclasses.replace(translator.eval_config, alpha=alpha)
    if source_file is not None:
        sources = read_text_file(source_file, functools.partial(warn, source=source_file) if warn else None)
        references = read_text_file(
            reference_file, functools.partial(warn, source=reference_file) if warn else None
        )
        if len(sources) != len(references):
            raise EvaluationError(
                f"{source_file} has {len(sources)} lines but {reference_file} has {len(references)}: "
                "they must be line-aligned"
            )
        label, split_name = ("stdin" if str(source_file) == "-" else Path(source_file).name), None
    else:
        from data.corpus import load_text_pairs

        split_name = _split_name(config.data, split)
        kept: list[bool] = []  # what the prepared split holds: the loss of its first lines counts those
        sources, references = load_text_pairs(config.data, split_name, every_line=True, kept=kept)
        label = split
    if max_sentences > len(sources) > 0:
        log.warning(
            "max_sentences %d: %s has %d sentences, all of them evaluated", max_sentences, label, len(sources)
        )
    if max_sentences >= len(sources):  # all of it: evaluated and named as the full evaluation
        max_sentences = 0
    if max_sentences:
        sources, references = sources[:max_sentences], references[:max_sentences]
    if not sources:
        raise EvaluationError(f"nothing to evaluate: {label} has no sentences")
    if split_name is not None and not max_sentences:
        prepared = open_split(config.data, translator.tokenizer, split_name)
        loss_dataset = eval_batches(config.data, prepared)
        cut = cut_pairs(prepared.source_lengths, prepared.target_lengths, config.data.max_length)
    else:
        # the pairs preparation keeps, as a whole split's loss has them (a blank pair is in the BLEU, not in the
        # loss): --max-sentences of a split, or files (the same text gives the same loss either way)
        if split_name is None:
            from data.cleaning import usable as usable_pair

            kept = [usable_pair(s.encode("utf-8"), r.encode("utf-8")) for s, r in zip(sources, references)]
        usable = [pair for pair, keep in zip(zip(sources, references), kept) if keep]
        loss_sources, loss_references = [s for s, _ in usable], [r for _, r in usable]
        loss_dataset = pairs_loss_dataset(config.data, translator.tokenizer, loss_sources, loss_references)
        cut = loss_dataset.cut
    if cut and (loss_model if engine == "ctranslate2" else translator.model) is not None:
        log.warning(
            "%d pair(s) are cut to data.max_length - 1 = %d pieces per side for the loss (translations and BLEU "
            "are not cut there)",
            cut,
            config.data.max_length - 1,
        )
    log.info("translating %d sentences of %s", len(sources), label)
    hypotheses, record = evaluate(
        translator,
        sources,
        references,
        beam_size=beam_size,
        loss_dataset=loss_dataset,
        target_language=config.data.target,
        progress=progress,
        loss_model=loss_model,
        lowercase=config.data.lowercase,
    )
    output = (
        Path(output)
        if output
        else Path(model_dir)
        / default_hypotheses_name(
            label,
            weights=weights,
            engine=engine,
            ensemble=bool(ensemble),
            max_sentences=max_sentences,
        )
    )
    try:
        write_hypotheses(output, hypotheses)
    except OSError as err:  # a full disk: the scores of the whole decode are still reported (hypotheses null)
        log.error("cannot write the hypotheses to %s: %s", output, err)
        record["hypotheses_error"] = f"{output}: {err}"
    record.update(
        split=label,
        model_dir=str(model_dir),
        weights=translator.weights,
        hypotheses=None if "hypotheses_error" in record else str(output),
    )
    if "loss" in record:
        record["loss_pairs_cut"] = cut
    else:  # no weights for the loss (a CTranslate2 export alone): null, as documented, not absent
        record.update(loss=None, perplexity=None, loss_tokens=None)
    record["alpha"] = translator.eval_config.alpha
    record["xla"] = translator.uses_xla(len(sources), record["beam"])
    record.update(extra)
    return record


def default_hypotheses_name(
    label: str,
    *,
    weights: str = "auto",
    engine: str = "tensorflow",
    ensemble: bool = False,
    max_sentences: int = 0,
) -> str:
    """hypotheses.<split>.txt for the run's own weights on a whole split; another source of translations or a
    part of the split says so in the name (hypotheses.test.average.first100.txt), so that it does not replace the
    full evaluation's file."""
    parts = [label]
    if weights not in ("auto", "final"):
        parts.append(weights)
    if engine != "tensorflow":
        parts.append(engine)
    if ensemble:
        parts.append("ensemble")
    if max_sentences:
        parts.append(f"first{max_sentences}")
    return f"hypotheses.{'.'.join(parts)}.txt"


def _loss_model(model_dir, translator, weights: str) -> tuple:
    """The run directory's TensorFlow model for the loss next to a CTranslate2 engine: (model or None, record fields).

    With `weights` "auto", the checkpoint the export was made from if `model_dir` holds it (found by its digest,
    wherever the run is now and whatever the export recorded as its path; an export without a digest, by its path);
    else the `weights` of the run directory.
    No weights at all: (None, a `loss_note`), and the record's loss is null.
    """
    from nmt.checkpoints import restore_model_weights
    from nmt.ctranslate2_export import stored_checkpoints
    from nmt.final_weights import load_run_weights
    from nmt.run_dir import RunDir, RunDirError
    from transformer.model import build_model

    digest, recorded = translator.metadata.get("weights_digest"), translator.weights
    exported = stored_checkpoints(model_dir).get(digest) if digest and weights == "auto" else None
    # exports made before the digest was recorded (2026-12-06): the path, when it is inside `model_dir` and there
    if weights == "auto" and not digest and recorded and Path(f"{recorded}.index").is_file():
        inside = Path(recorded).resolve().is_relative_to(Path(model_dir).resolve())
        exported = Path(recorded) if inside else None
    try:
        tokenizer = translator.tokenizer
        model = build_model(translator.config.model, tokenizer.source_vocab_size, tokenizer.target_vocab_size)
        if exported:
            prefix = str(exported)
            restore_model_weights(model, prefix)
        else:
            prefix = load_run_weights(model, RunDir(model_dir), weights, translator.config.train)
    except RunDirError as err:
        log.warning("no loss: %s", err)
        return None, {"loss_note": f"no TensorFlow weights for the loss: {err}"}
    return model, {"loss_weights": prefix}
