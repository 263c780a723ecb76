"""Corpus evaluation of a run directory: decode a split (or a pair of files), score with sacreBLEU, measure the loss.

Quality protocol (DESIGN.md): BLEU and chrF from sacreBLEU on detokenized, cased hypotheses against the raw
references, with the signature. `bleu_lc_tok` is a second, clearly labelled BLEU on lowercased text with the 13a
tokenizer, only for comparison with papers that report lowercased tokenized BLEU; never mix the two.

The hypotheses file holds exactly the strings that were scored (one per line, `text_io.one_line`), so
`sacrebleu.corpus_bleu(open(hyp).read().splitlines(), [references])` reproduces `bleu`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
import weakref
from collections.abc import Sequence
from pathlib import Path

from nmt.text_io import LineWriter, one_line

log = logging.getLogger(__name__)

_LOSS_KEYS = ("source", "target_in", "target_out")


class EvaluationError(ValueError):
    """A problem with what was asked to evaluate (e.g. source and reference files of different lengths)."""


def score_corpus(hypotheses: Sequence[str], references: Sequence[str], target_language: str = "") -> dict:
    """sacreBLEU BLEU (cased, detokenized, 13a), chrF and the lowercased tokenized BLEU, with signatures."""
    from sacrebleu.metrics import BLEU, CHRF

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    hypotheses, references = list(hypotheses), [list(references)]
    # 13a (sacreBLEU's default) is wrong for Chinese; every other language keeps the default signature.
    tokenize = "zh" if target_language.lower().startswith("zh") else None
    bleu_metric, chrf_metric = BLEU(tokenize=tokenize), CHRF()
    lc_metric = BLEU(lowercase=True, tokenize=tokenize or "13a")
    bleu = bleu_metric.corpus_score(hypotheses, references)
    chrf = chrf_metric.corpus_score(hypotheses, references)
    lc = lc_metric.corpus_score(hypotheses, references)
    return {
        "bleu": bleu.score,
        "chrf": chrf.score,
        "signature": str(bleu_metric.get_signature()),
        "bleu_detail": str(bleu),
        "chrf_signature": str(chrf_metric.get_signature()),
        "bleu_lc_tok": lc.score,
        "bleu_lc_tok_signature": str(lc_metric.get_signature()),
    }


_LOSS_FUNCTIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def validation_loss(model, dataset) -> tuple[float, int]:
    """Mean cross-entropy per target token (no label smoothing, padding excluded) and the number of tokens.

    `dataset` yields (or is a list of) `{"source", "target_in", "target_out"}` int32 batches padded with PAD, as
    `data.pipeline.make_eval_dataset` and `pairs_loss_dataset` make them. The forward pass is traced once per model
    (dynamic shapes) and reused by later calls, so the trainer can call this at every evaluation.
    """
    import tensorflow as tf

    if model not in _LOSS_FUNCTIONS:
        from nmt.losses import smoothed_cross_entropy

        spec = {key: tf.TensorSpec([None, None], tf.int32) for key in _LOSS_KEYS}
        model_ref = weakref.ref(model)  # a strong reference in the value would keep the key alive forever

        @tf.function(input_signature=[spec], autograph=False)
        def batch_nll(batch):
            logits = model_ref()({"source": batch["source"], "target_in": batch["target_in"]}, training=False)
            _, nll, tokens = smoothed_cross_entropy(logits, batch["target_out"], label_smoothing=0.0)
            return nll, tokens

        _LOSS_FUNCTIONS[model] = batch_nll
    batch_nll = _LOSS_FUNCTIONS[model]
    total, count = 0.0, 0.0
    for batch in dataset:
        nll, tokens = batch_nll({key: tf.convert_to_tensor(batch[key], tf.int32) for key in _LOSS_KEYS})
        total += float(nll)
        count += float(tokens)
    return (total / count if count else float("nan")), int(count)


def perplexity(loss: float) -> float:
    return math.exp(min(loss, 50.0))


def pairs_loss_dataset(data_config, tokenizer, sources: Sequence[str], targets: Sequence[str]) -> list[dict]:
    """Validation-loss batches for in-memory pairs, with the conventions of `data.pipeline.make_eval_dataset`.

    source = pieces + [EOS], target_in = [BOS] + pieces, target_out = pieces + [EOS], each side cut to
    `max_length - 1` pieces first; pairs sorted by length, about `eval_batch_tokens` tokens per batch, PAD-padded
    to the longest pair of the batch. Returns a list of `{"source", "target_in", "target_out"}` int32 arrays.
    """
    import numpy as np
    import tensorflow as tf

    from transformer.vocab import BOS_ID, EOS_ID, PAD_ID

    keep = data_config.max_length - 1
    source_pieces = tokenizer.tokenize_source(tf.constant(list(sources), tf.string)).to_list()
    target_pieces = tokenizer.tokenize_target(tf.constant(list(targets), tf.string)).to_list()
    pairs = sorted(
        ((s[:keep], t[:keep]) for s, t in zip(source_pieces, target_pieces)), key=lambda p: max(map(len, p))
    )

    def padded(chunk: list) -> dict:
        width = max(max(map(len, pair)) for pair in chunk) + 1  # + EOS (or BOS)
        batch = {
            key: np.full((len(chunk), width), PAD_ID, np.int32)
            for key in ("source", "target_in", "target_out")
        }
        for row, (source, target) in enumerate(chunk):
            batch["source"][row, : len(source) + 1] = [*source, EOS_ID]
            batch["target_in"][row, : len(target) + 1] = [BOS_ID, *target]
            batch["target_out"][row, : len(target) + 1] = [*target, EOS_ID]
        return batch

    batches, chunk = [], []
    for pair in pairs:  # shortest first: the pair being added is the longest of its batch
        if chunk and (len(chunk) + 1) * (max(map(len, pair)) + 1) > data_config.eval_batch_tokens:
            batches.append(padded(chunk))
            chunk = []
        chunk.append(pair)
    if chunk:
        batches.append(padded(chunk))
    return batches


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
) -> tuple[list[str], dict]:
    """Translates `sources`, scores them against `references`, and measures the loss on `loss_dataset`.

    Returns:
      (hypotheses exactly as scored, a record with `bleu`, `chrf`, `signature`, `bleu_lc_tok`, `loss`,
      `perplexity`, `loss_tokens`, `num_sentences`, `beam`, `seconds`, `sentences_per_sec`, ...).
    """
    beam_size = translator.eval_config.beam_size if beam_size is None else beam_size
    start = time.perf_counter()
    hypotheses = [
        one_line(h) for h in translator.translate(list(sources), beam_size=beam_size, progress=progress)
    ]
    seconds = time.perf_counter() - start
    record = score_corpus(hypotheses, references, target_language)
    record.update(beam=beam_size, num_sentences=len(sources), seconds=round(seconds, 3))
    record["sentences_per_sec"] = round(len(sources) / seconds, 2) if seconds > 0 else None
    if loss_dataset is not None:
        loss, tokens = validation_loss(translator.model, loss_dataset)
        record.update(loss=loss, perplexity=perplexity(loss), loss_tokens=tokens)
    return hypotheses, record


def format_report(record: dict) -> str:
    """The human-readable report of an `evaluate` record."""

    def number(key: str, digits: int = 2) -> str:
        value = record.get(key)
        return "n/a" if value is None else f"{value:.{digits}f}"

    lines = [
        f"model dir      {record.get('model_dir', '')} (weights {record.get('weights', '')})",
        f"data           {record.get('split', '')}: {record['num_sentences']} sentences, beam {record['beam']}"
        + (f", alpha {record['alpha']}" if record.get("alpha") is not None and record["beam"] > 1 else ""),
        f"BLEU           {number('bleu')}   sacreBLEU, detokenized, cased (the number to report)",
        f"  signature    {record['signature']}",
        f"  detail       {record['bleu_detail']}",
        f"chrF           {number('chrf')}   {record['chrf_signature']}",
        f"bleu_lc_tok    {number('bleu_lc_tok')}   lowercased 13a-tokenized BLEU, only to compare with papers",
        f"loss           {number('loss', 4)} per target token, no label smoothing ({record.get('loss_tokens', 0)} tokens)",
        f"perplexity     {number('perplexity')}",
        f"decoding       {number('seconds', 1)} s, {number('sentences_per_sec', 1)} sentences/s",
    ]
    if record.get("hypotheses"):
        lines.append(f"hypotheses     {record['hypotheses']}")
    return "\n".join(lines)


def read_text_file(path: str | Path, warn=None) -> list[str]:
    """All lines of a UTF-8 text file (invalid bytes replaced, NULs removed, each with a warning)."""
    from nmt.text_io import read_lines

    with open(path, "rb") as handle:
        return list(read_lines(handle, warn))


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
    progress: bool = False,
    warn=None,
    alpha: float | None = None,
    xla: bool = False,
) -> dict:
    """Evaluates a run directory on a split of its dataset, or on a source file and its reference file.

    Args:
      split: "validation" or "test" (the config's `data.validation_split` / `data.test_split`), or any split name.
      source_file, reference_file: evaluate on these (line-aligned) instead of a split.
      output: hypotheses file; default DIR/hypotheses.<split>.txt (DIR/hypotheses.<source file name>.txt).
      max_sentences: only the first N sentences (0 = all); the loss is then measured on those N pairs too.
      warn: `warn(line_number, kind, message, source=file name)` for undecodable bytes in the files.
      alpha: GNMT length-penalty exponent of the beam search (default: the run's eval.alpha).
      xla: decode with XLA (`Translator(xla=True)`): the same translations, faster on large inputs once compiled.
    Returns:
      The record of `evaluate`, plus `split`, `model_dir`, `weights` and `hypotheses` (the file written).
    """
    from data.pipeline import make_eval_dataset
    from nmt.translator import Translator

    translator = Translator.from_run_dir(model_dir, weights=weights, xla=xla)
    config = translator.config
    if alpha is not None:
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
        label, split_name = Path(source_file).name, None
    else:
        from data.corpus import load_text_pairs

        split_name = {"validation": config.data.validation_split, "test": config.data.test_split}.get(
            split, split
        )
        sources, references = load_text_pairs(config.data, split_name)
        label = split
    if max_sentences:
        sources, references = sources[:max_sentences], references[:max_sentences]
    if split_name is not None and not max_sentences:
        loss_dataset = make_eval_dataset(config.data, translator.tokenizer, split_name)
    else:
        loss_dataset = pairs_loss_dataset(config.data, translator.tokenizer, sources, references)
    log.info("translating %d sentences of %s", len(sources), label)
    hypotheses, record = evaluate(
        translator,
        sources,
        references,
        beam_size=beam_size,
        loss_dataset=loss_dataset,
        target_language=config.data.target,
        progress=progress,
    )
    output = Path(output) if output else Path(model_dir) / f"hypotheses.{label}.txt"
    write_hypotheses(output, hypotheses)
    record.update(split=label, model_dir=str(model_dir), weights=translator.weights, hypotheses=str(output))
    record["alpha"] = translator.eval_config.alpha
    record["xla"] = xla
    return record
