"""Evaluation: sacreBLEU scores as sacreBLEU computes them, loss datasets like the pipeline's, file evaluation.

The tiny fixture reproduces every sentence of its corpus (tests/run_fixture.py, on any CPU): hypotheses of those
sentences are checked to be their references; the loss is checked against a sentence-by-sentence NumPy reference.
"""

from pathlib import Path

import numpy as np
import pytest
import sacrebleu

from nmt.evaluation import (
    EvaluationError,
    evaluate_run_dir,
    pairs_loss_dataset,
    read_text_file,
    validation_loss,
)
from nmt.evaluation_report import format_report
from tests.run_fixture import MAX_SENTENCE_NLL, tiny_corpus, write_corpus


def test_default_hypotheses_names_keep_partial_and_other_evaluations_apart():
    from nmt.evaluation import default_hypotheses_name

    assert (
        default_hypotheses_name("test")
        == default_hypotheses_name("test", weights="final")
        == "hypotheses.test.txt"
    )
    assert (
        default_hypotheses_name("test", weights="best", max_sentences=100)
        == "hypotheses.test.best.first100.txt"
    )
    name = default_hypotheses_name("validation", weights="average", engine="ctranslate2", ensemble=True)
    assert name == "hypotheses.validation.average.ctranslate2.ensemble.txt"


def copy_with_data(run_dir, copy, **data):
    """A copy of a run directory whose config.yaml has these `data:` settings."""
    import shutil

    import yaml

    shutil.copytree(run_dir, copy)
    tree = yaml.safe_load((copy / "config.yaml").read_text(encoding="utf-8"))
    tree["data"].update(data)
    (copy / "config.yaml").write_text(yaml.safe_dump(tree, sort_keys=False), encoding="utf-8")
    return copy


def test_evaluate_run_dir_scores_a_lowercased_run_case_insensitively(tiny_run_dir, tmp_path, caplog):
    """The run's data.lowercase decides (the tiny run's tokenizer is cased: its hypotheses keep capitals here)."""
    run = copy_with_data(tiny_run_dir, tmp_path / "run", lowercase=True)
    record = evaluate_run_dir(run, split="test", beam_size=1, max_sentences=8)
    assert record["hypotheses"] == str(run / "hypotheses.test.first8.txt")  # not the full evaluation's file
    hypotheses = (run / "hypotheses.test.first8.txt").read_text(encoding="utf-8").splitlines()
    references = [t for _, t in tiny_corpus()["test"][:8]]
    assert record["lowercase"] and "case:lc" in record["signature"]
    assert record["bleu"] == sacrebleu.corpus_bleu(hypotheses, [references], lowercase=True).score
    assert "LOWERCASED" in format_report(record)
    # References in capitals: the hypotheses match them only if case is ignored (the tiny model has learnt the
    # test split, so the cased score above could not tell).
    source, shouted = tmp_path / "source.txt", tmp_path / "shouted.txt"
    source.write_text("".join(s + "\n" for s, _ in tiny_corpus()["test"][:8]), encoding="utf-8")
    shouted.write_text("".join(t.upper() + "\n" for t in references), encoding="utf-8")
    record = evaluate_run_dir(
        run, source_file=str(source), reference_file=str(shouted), beam_size=1, max_sentences=100
    )
    assert "max_sentences 100: source.txt has 8 sentences, all of them evaluated" in caplog.text
    assert record["num_sentences"] == 8
    hypotheses = Path(record["hypotheses"]).read_text(encoding="utf-8").splitlines()
    upper = [t.upper() for t in references]
    assert record["bleu"] == sacrebleu.corpus_bleu(hypotheses, [upper], lowercase=True).score
    assert record["bleu"] > sacrebleu.corpus_bleu(hypotheses, [upper]).score + 20


def test_the_loss_says_how_many_pairs_it_cut(tiny_run_dir, tmp_path, caplog):
    """Pairs longer than data.max_length - 1 pieces are cut for the loss: counted from the tokenizer, on both the
    split path and the file path, and said in the log and the report."""
    import tensorflow as tf

    from data.tokenizer import Tokenizer

    pairs = tiny_corpus()["test"]
    tokenizer = Tokenizer.load(tiny_run_dir / "tokenizer")
    lengths = [
        tokenizer.tokenize_source(tf.constant([s for s, _ in pairs])).row_lengths().numpy(),
        tokenizer.tokenize_target(tf.constant([t for _, t in pairs])).row_lengths().numpy(),
    ]
    keep = int(np.median(np.maximum(*lengths)))  # about half the pairs are longer
    expected = int(((lengths[0] > keep) | (lengths[1] > keep)).sum())
    assert 0 < expected < len(pairs)
    run = copy_with_data(tiny_run_dir, tmp_path / "run", max_length=keep + 1)
    caplog.set_level("WARNING", logger="nmt.evaluation")
    record = evaluate_run_dir(run, split="test", beam_size=1)
    assert record["loss_pairs_cut"] == expected
    assert (
        f"{expected} pair(s) are cut to data.max_length - 1 = {keep} pieces per side for the loss"
        in caplog.text
    )
    assert f"{expected} pairs cut to data.max_length - 1 pieces" in format_report(record)
    source, reference = tmp_path / "s.txt", tmp_path / "r.txt"
    source.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    reference.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    from_files = evaluate_run_dir(run, source_file=str(source), reference_file=str(reference), beam_size=1)
    assert from_files["loss_pairs_cut"] == expected
    assert from_files["loss"] == pytest.approx(record["loss"], rel=1e-4)
    # the uncut tiny run's 0: test_xla_decoding_gives_the_same_translations_and_scores (one evaluation less)


@pytest.fixture(scope="module")
def tiny_model(tiny_run_dir):
    """`load_run(tiny_run_dir)` once: the tests read its model, never change it."""
    return load_run(tiny_run_dir)


def load_run(run_dir):
    """(config, tokenizer, model with the run's final weights)."""
    from data.tokenizer import Tokenizer
    from nmt.checkpoints import restore_model_weights
    from nmt.run_dir import RunDir
    from transformer.model import build_model

    run_dir = RunDir(run_dir)
    config = run_dir.load_config()
    tokenizer = Tokenizer.load(run_dir.tokenizer_dir)
    model = build_model(config.model, tokenizer.source_vocab_size, tokenizer.target_vocab_size)
    restore_model_weights(model, run_dir.weights_prefix())
    return config, tokenizer, model


def reference_loss(model, tokenizer, sources, targets) -> tuple[float, int]:
    """Mean NLL per target token (EOS included): one forward pass over the pairs in their given order, padded to
    the longest, then log-softmax and masking in float64 NumPy (no bucketing, no sorting, no TensorFlow loss)."""
    import tensorflow as tf

    from transformer.vocab import BOS_ID, EOS_ID, PAD_ID

    src = tokenizer.tokenize_source(tf.constant(sources)).to_list()
    tgt = tokenizer.tokenize_target(tf.constant(targets)).to_list()

    def padded(rows):
        out = np.full((len(rows), max(map(len, rows))), PAD_ID, np.int32)
        for i, row in enumerate(rows):
            out[i, : len(row)] = row
        return out

    inputs = {"source": padded([[*s, EOS_ID] for s in src]), "target_in": padded([[BOS_ID, *t] for t in tgt])}
    labels = padded([[*t, EOS_ID] for t in tgt])  # (N, T)
    logits = model({k: tf.constant(v) for k, v in inputs.items()}, training=False).numpy().astype(np.float64)
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]  # (N, T)
    mask = labels != PAD_ID
    return float(nll[mask].sum() / mask.sum()), int(mask.sum())


def test_loss_on_pairs_equals_loss_on_the_pipeline_split(tiny_model):
    from data.corpus import load_text_pairs
    from data.pipeline import make_eval_dataset

    config, tokenizer, model = tiny_model
    sources, targets = load_text_pairs(config.data, "validation")
    ours = validation_loss(model, pairs_loss_dataset(config.data, tokenizer, sources, targets))
    pipeline = validation_loss(model, make_eval_dataset(config.data, tokenizer, "validation"))
    expected = reference_loss(model, tokenizer, sources, targets)
    assert ours[1] == pipeline[1] == expected[1]
    assert ours[0] == pytest.approx(pipeline[0], rel=1e-5)
    assert ours[0] == pytest.approx(expected[0], rel=1e-4, abs=1e-6)
    assert 0 < ours[0] < MAX_SENTENCE_NLL  # memorised pairs: < MAX_SENTENCE_NLL per sentence, so per token


def test_evaluate_files_writes_what_it_scores(tiny_run_dir, tiny_model, tmp_path):
    pairs = tiny_corpus()["test"][:10]
    source, reference = tmp_path / "test.en", tmp_path / "test.de"
    source.write_bytes(b"".join(s.encode() + b"\n" for s, _ in pairs))
    reference.write_bytes(
        b"".join(t.encode() + b"\n" for _, t in pairs[:-1]) + b"Der mann\xff hat ein auto.\n"
    )
    warnings = []
    record = evaluate_run_dir(
        tiny_run_dir,
        source_file=str(source),
        reference_file=str(reference),
        output=tmp_path / "hyp.txt",
        beam_size=1,
        warn=lambda line, kind, message, source=None: warnings.append((source, line, kind)),
    )
    assert warnings == [(str(reference), 10, "utf8")]
    hypotheses = (tmp_path / "hyp.txt").read_text(encoding="utf-8").splitlines()
    references = [t for _, t in pairs[:-1]] + ["Der mann\ufffd hat ein auto."]
    assert hypotheses == [t for _, t in pairs]  # greedy search reproduces the memorised references
    assert record["bleu"] == sacrebleu.corpus_bleu(hypotheses, [references]).score
    assert record["num_sentences"] == 10 and record["beam"] == 1 and record["split"] == "test.en"
    _, tokenizer, model = tiny_model
    loss, tokens = reference_loss(model, tokenizer, [s for s, _ in pairs], references)
    assert record["loss_tokens"] == tokens
    assert record["loss"] == pytest.approx(loss, rel=1e-4, abs=1e-6)
    report = format_report(record)
    assert "bleu_lc_tok" in report and record["signature"] in report
    assert not (tiny_run_dir / "hypotheses.test.en.txt").exists()


def test_a_source_longer_than_the_model_allows_is_reported_as_translate_py_does(
    tiny_run_dir, tmp_path, caplog
):
    pairs = tiny_corpus()["test"][:2]
    long_source = " ".join([pairs[1][0]] * 40)  # far past the tiny model's position table
    source, reference = tmp_path / "src.en", tmp_path / "ref.de"
    source.write_text(f"{pairs[0][0]}\n{long_source}\n", encoding="utf-8")
    reference.write_text(f"{pairs[0][1]}\n{pairs[1][1]}\n", encoding="utf-8")
    record = evaluate_run_dir(
        tiny_run_dir,
        source_file=str(source),
        reference_file=str(reference),
        output=tmp_path / "h",
        beam_size=1,
    )
    assert record["sources_cut"] == 1
    assert (
        "1 source sentence(s) longer than the model allows were translated from their first pieces only "
        "(line(s) 2)" in caplog.text
    )


def test_xla_decoding_gives_the_same_translations_and_scores(tiny_run_dir, tmp_path):
    runs = {
        xla: evaluate_run_dir(
            tiny_run_dir,
            split="test",
            max_sentences=12,
            beam_size=2,
            output=tmp_path / f"hyp.{xla}.txt",
            xla=xla,
        )
        for xla in (False, True)
    }
    assert runs[True]["xla"] is True and runs[False]["xla"] is False
    # every pair of the tiny run fits: no pair cut for the loss (moved here from the test of the cut pairs)
    assert runs[True]["loss_pairs_cut"] == runs[False]["loss_pairs_cut"] == 0
    assert (tmp_path / "hyp.True.txt").read_text() == (tmp_path / "hyp.False.txt").read_text()
    # Beam search reproduces the memorised references (with or without XLA): the scores are sacreBLEU's 100.
    references = [t for _, t in tiny_corpus()["test"][:12]]
    assert (tmp_path / "hyp.True.txt").read_text(encoding="utf-8").splitlines() == references
    assert runs[True]["bleu"] == runs[False]["bleu"] == sacrebleu.corpus_bleu(references, [references]).score


def test_read_text_file_drops_a_byte_order_mark(tmp_path):
    path = tmp_path / "bom.en"
    path.write_bytes(b"\xef\xbb\xbfThe cat sees a ball.\r\n\xef\xbb\xbfA dog.\r\n")
    # only at the start of the file: a later U+FEFF is text
    assert read_text_file(path) == ["The cat sees a ball.", "\ufeffA dog."]


def test_evaluate_refuses_empty_files(tiny_run_dir, tmp_path):
    source, reference = tmp_path / "empty.en", tmp_path / "empty.de"
    source.write_bytes(b"")
    reference.write_bytes(b"")
    with pytest.raises(EvaluationError, match="nothing to evaluate: empty.en has no sentences"):
        evaluate_run_dir(tiny_run_dir, source_file=str(source), reference_file=str(reference), beam_size=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.de", "empty.en"]


def test_evaluate_refuses_an_unknown_split(tiny_run_dir):
    with pytest.raises(EvaluationError, match=r"split 'bogus' is not in dataset 'folder' \(splits: "):
        evaluate_run_dir(tiny_run_dir, split="bogus", beam_size=1)


def test_an_ensemble_needs_the_tensorflow_engine(tiny_run_dir, tmp_path):
    with pytest.raises(
        EvaluationError, match="an ensemble decodes with the tensorflow engine, not ctranslate2"
    ):
        evaluate_run_dir(tiny_run_dir, engine="ctranslate2", engine_dir=tmp_path, ensemble=[tiny_run_dir])


def test_max_sentences_of_a_split_takes_the_loss_of_its_prepared_pairs(tiny_run_dir, tiny_model, tmp_path):
    """Blank pairs are in a split's BLEU (as sacreBLEU scores the files) but not in its prepared pairs, so not in
    the whole split's loss; with --max-sentences the loss counted them (and from another tokenization of their
    lines), a different loss for the same sentences (before 2026-12-07c; found by a data review). The reference:
    NumPy's loss of the usable pairs among the first lines (`reference_loss`)."""
    corpus = tiny_corpus()
    test = list(corpus["test"])
    for index, pair in (
        (0, ("", "")),
        (1, ("", "")),
        (4, ("", test[4][1])),
        (7, (test[7][0], " ")),
        (12, ("\u3000", "\xa0")),
    ):
        test[index] = pair
    corpus["test"] = test
    folder = write_corpus(tmp_path / "corpus", corpus=corpus)
    run = copy_with_data(
        tiny_run_dir, tmp_path / "run", folder=str(folder), cache_dir=str(tmp_path / "cache")
    )
    whole = evaluate_run_dir(run, split="test", beam_size=1)
    every = evaluate_run_dir(run, split="test", beam_size=1, max_sentences=len(test))
    first = evaluate_run_dir(run, split="test", beam_size=1, max_sentences=10)
    assert whole["num_sentences"] == every["num_sentences"] == len(test) and first["num_sentences"] == 10
    assert every["loss_tokens"] == whole["loss_tokens"]
    assert every["loss"] == pytest.approx(whole["loss"], rel=1e-6)
    # all of the split: the full evaluation's file, not "first40" (before: named as a part)
    assert every["hypotheses"] == whole["hypotheses"] == str(run / "hypotheses.test.txt")
    # the same text as files: the same loss (before 2026-12-07c the file path counted the blank pairs)
    files = evaluate_run_dir(
        run,
        source_file=str(folder / "en.test.txt"),
        reference_file=str(folder / "de.test.txt"),
        beam_size=1,
    )
    assert files["loss_tokens"] == whole["loss_tokens"]
    assert files["loss"] == pytest.approx(whole["loss"], rel=1e-6) and files["bleu"] == whole["bleu"]
    # nothing usable among the first lines: no loss, said so (before: NaN in the report)
    blank = evaluate_run_dir(run, split="test", beam_size=1, max_sentences=2)
    assert blank["loss"] is None and blank["loss_tokens"] == 0
    assert blank["loss_note"] == "no usable pair for the loss" and "nan" not in format_report(blank)
    assert "loss           n/a (no usable pair for the loss)" in format_report(blank)
    usable = [(s, t) for s, t in test[:10] if s.strip() and t.strip()]
    assert len(usable) == 6
    _, tokenizer, model = tiny_model  # the run's own weights and tokenizer
    loss, tokens = reference_loss(model, tokenizer, [s for s, _ in usable], [t for _, t in usable])
    assert first["loss_tokens"] == tokens and first["loss"] == pytest.approx(loss, rel=1e-4, abs=1e-6)
