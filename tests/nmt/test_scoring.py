"""Forced decoding (`nmt.scoring`, `translate.py --score`) against three references: a NumPy log-softmax of the
model's logits, our own beam search's scores of its hypotheses (alpha 0: the sum of their log-probabilities), and
CTranslate2's `score_batch` on an export of the same weights. The model is the tiny memorised run
(tests/run_fixture.py); the targets are its references, its own outputs and random pieces of many lengths."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from common.special_ids import BOS_ID, EOS_ID, PAD_ID
from nmt.scoring import LengthMismatch, score_ids, score_lines, score_stream
from nmt.translator import Translator
from tests.run_fixture import MAX_SENTENCE_NLL, salads, tiny_corpus

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def ours(tiny_run_dir):
    # per test: conftest reseeds TensorFlow before each test, which destroys older tokenizers' SentencePiece resources
    return Translator.from_run_dir(tiny_run_dir)


def random_targets(ours, count, seed=0, longest=40):
    rng = np.random.default_rng(seed)
    allowed = [i for i in range(ours.tokenizer.target_vocab_size) if i not in (PAD_ID, BOS_ID, EOS_ID)]
    return [[int(i) for i in rng.choice(allowed, size=rng.integers(0, longest))] for _ in range(count)]


def numpy_scores(model, sources, targets):
    """Each pair alone (no batching), the log-softmax in float64 with PAD and BOS forbidden, as the decoder does."""
    out = []
    for source, target in zip(sources, targets):
        logits = model({"source": np.array([[*source, EOS_ID]], np.int32),
                        "target_in": np.array([[BOS_ID, *target]], np.int32)}).numpy()[0].astype(np.float64)  # fmt: skip
        logits[:, [PAD_ID, BOS_ID]] = -1e9
        top = logits.max(-1, keepdims=True)
        log_probs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
        out.append(float(log_probs[np.arange(len(target) + 1), [*target, EOS_ID]].sum()))
    return out


def test_scores_equal_a_numpy_log_softmax_in_any_batching(ours):
    sources = ours.encode([s for s, _ in tiny_corpus()["test"][:12]] + salads(12))
    targets = random_targets(ours, len(sources))
    expected = numpy_scores(ours.model, sources, targets)
    limits = dict(max_source_length=ours.max_source_length, max_target_length=ours.max_target_length)
    for batch_tokens in (8192, 64, 1):  # one batch; several; one pair per batch
        got = score_ids(ours.model, sources, targets, batch_tokens=batch_tokens, **limits)
        assert [tokens for _, tokens in got] == [len(t) + 1 for t in targets]
        np.testing.assert_allclose([s for s, _ in got], expected, rtol=1e-5, atol=1e-4)


def test_references_are_likely_and_shuffled_ones_are_not(ours):
    pairs = tiny_corpus()["test"][:20]
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    scored = score_lines(ours, sources, references)
    # the fixture's guarantee: every reference's whole NLL (pieces and EOS) is below MAX_SENTENCE_NLL
    assert all(-log_prob < MAX_SENTENCE_NLL for log_prob, _ in scored)
    shuffled = score_lines(ours, sources, references[1:] + references[:1])
    assert all(s < r - 1.0 for (s, _), (r, _) in zip(shuffled, scored))


def test_our_beam_search_scores_its_hypotheses_the_same(ours):
    """Alpha 0: a beam hypothesis's score is the sum of its log-probabilities, accumulated step by step with the
    key/value cache; scoring recomputes it in one teacher-forced pass."""
    ours.eval_config = dataclasses.replace(ours.eval_config, alpha=0.0)
    sources = ours.encode([s for s, _ in tiny_corpus()["test"][:8]] + salads(8, seed=3))
    ids, scores = ours._decode(sources, 3, True, False)  # (N, K, L), (N, K)
    hypotheses, expected = [], []
    for row in range(len(sources)):
        for k in range(3):
            out = [int(i) for i in ids[row, k]]
            if EOS_ID not in out:  # cut at its length limit: scored without an EOS, not comparable
                continue
            hypotheses.append((sources[row], out[: out.index(EOS_ID)]))
            expected.append(float(scores[row, k]))
    assert len(hypotheses) >= 24
    got = score_ids(ours.model, *zip(*hypotheses), max_source_length=64, max_target_length=64)
    np.testing.assert_allclose([s for s, _ in got], expected, rtol=1e-4, atol=1e-4)


def test_ctranslate2_score_batch_agrees(ours, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from nmt.ctranslate2_export import export_ctranslate2

    export = export_ctranslate2(ours.model, ours.tokenizer, tmp_path / "export")
    engine = ctranslate2.Translator(str(export), compute_type="float32", intra_threads=1)
    vocab = json.loads((export / "shared_vocabulary.json").read_text(encoding="utf-8"))
    sources = ours.encode(salads(10, seed=5))
    targets = random_targets(ours, len(sources), seed=5)
    results = engine.score_batch(
        [[vocab[i] for i in s] for s in sources], [[vocab[i] for i in t] for t in targets]
    )
    got = score_ids(ours.model, sources, targets, max_source_length=64, max_target_length=64)
    np.testing.assert_allclose([s for s, _ in got], [sum(r.log_probs) for r in results], rtol=1e-4, atol=1e-3)
    assert [tokens for _, tokens in got] == [len(r.log_probs) for r in results]


def test_too_long_targets_are_nan_and_long_sources_cut(ours):
    heard = {"truncated": [], "too long": []}
    sources = [[5] * 70, [5, 6], [5, 6]]  # the first over the 64-position table (63 pieces + EOS)
    targets = [[7, 8], [7] * 64, [7] * 63]  # BOS + 64 pieces do not fit the 64 positions; 63 do
    got = score_ids(
        ours.model, sources, targets, max_source_length=64, max_target_length=64,
        on_truncated=lambda i, n: heard["truncated"].append((i, n)),
        on_too_long=lambda i, n: heard["too long"].append((i, n)),
    )  # fmt: skip
    assert heard == {"truncated": [(0, 70)], "too long": [(1, 64)]}
    assert math.isnan(got[1][0]) and got[1][1] == 65
    assert math.isfinite(got[0][0]) and math.isfinite(got[2][0])
    cut = score_ids(ours.model, [[5] * 63], [[7, 8]], max_source_length=64, max_target_length=64)
    assert got[0][0] == pytest.approx(cut[0][0], abs=1e-5)  # scored with the first 63 source pieces


def test_streams_of_different_lengths_stop_after_the_complete_pairs(ours):
    pairs = tiny_corpus()["test"][:5]
    sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
    got = []
    with pytest.raises(LengthMismatch, match="the translations end after line 3") as raised:
        for score in score_stream(ours, iter(sources), iter(targets[:3]), chunk_size=2):
            got.append(score)
    assert len(got) == 3 and raised.value.shorter == "translations"
    with pytest.raises(LengthMismatch, match="the sources end after line 4"):
        list(score_stream(ours, iter(sources[:4]), iter(targets), chunk_size=3))
    streamed = list(score_stream(ours, iter(sources), iter(targets), chunk_size=2))
    whole = score_lines(ours, sources, targets)
    # Chunks of 2 are padded to other lengths than the 5 lines at once: the same sums, not the same last bits (one
    # Zen 3 gave -0.1371224 against -0.1371223).
    assert [tokens for _, tokens in streamed] == [tokens for _, tokens in whole]
    np.testing.assert_allclose([s for s, _ in streamed], [s for s, _ in whole], rtol=1e-5, atol=1e-6)


def score_cli(tiny_run_dir, *args, stdin=b""):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    command = [sys.executable, "translate.py", "--model-dir", str(tiny_run_dir), *map(str, args)]
    return subprocess.run(command, input=stdin, capture_output=True, cwd=ROOT, env=env, timeout=300)


def test_translate_py_score(tiny_run_dir, tmp_path, capsys, restore_logging):
    from tests.test_cli_translate import in_process

    pairs = tiny_corpus()["test"][:6]
    source, translations = tmp_path / "in.en", tmp_path / "given.de"
    source.write_text("".join(f"{s}\n" for s, _ in pairs), encoding="utf-8")
    translations.write_text("".join(f"{t}\n" for _, t in pairs), encoding="utf-8")
    code, captured = in_process("translate.py", "--model-dir", tiny_run_dir, "--input", source, "--score",
                                translations, "--output", tmp_path / "out", capsys=capsys)  # fmt: skip
    assert code == 0, captured.err[-2000:]
    lines = (tmp_path / "out").read_text(encoding="utf-8").splitlines()
    expected = score_lines(
        Translator.from_run_dir(tiny_run_dir), [s for s, _ in pairs], [t for _, t in pairs]
    )
    assert [line.split("\t")[1] for line in lines] == [str(tokens) for _, tokens in expected]
    np.testing.assert_allclose(
        [float(line.split("\t")[0]) for line in lines], [s for s, _ in expected], atol=2e-5
    )

    # the translations from stdin (a pipe: a process of its own), one line short: found while streaming, exit 1,
    # no output file
    done = score_cli(tiny_run_dir, "--input", source, "--score", "-", "--output", tmp_path / "short",
                     stdin=translations.read_bytes().rsplit(b"\n", 2)[0] + b"\n")  # fmt: skip
    assert done.returncode == 1
    assert "the translations end after line 5" in done.stderr.decode()
    assert not (tmp_path / "short").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--beam", "2"], "--score scores the given translations: --beam does not apply"),
        (["--nbest", "2", "--no-cache"], "--nbest, --no-cache do not apply"),
        (["--batch-size", "4", "--streams", "1"], "--batch-size, --streams do not apply"),
        (["--input", "translate.py", "--score", "nope.de"], "--score: input file not found: nope.de"),
        (["--engine", "ctranslate2", "--engine-dir", "."], "--score needs --engine tensorflow"),
        (["--input", "-"], "--score - and the input cannot both be stdin"),
    ],
)
def test_translate_py_score_refuses_what_does_not_apply(tiny_run_dir, args, message):
    done = score_cli(tiny_run_dir, "--score", "-", *args)
    assert done.returncode == 2
    assert message in done.stderr.decode()


def test_translate_py_score_files_of_different_lengths_are_refused_up_front(tiny_run_dir, tmp_path):
    (tmp_path / "in").write_text("a\nb\nc\n")
    (tmp_path / "given").write_text("x\ny\n")
    done = score_cli(tiny_run_dir, "--input", tmp_path / "in", "--score", tmp_path / "given")
    assert done.returncode == 2
    assert f"--score {tmp_path / 'given'} has 2 lines, --input {tmp_path / 'in'} 3" in done.stderr.decode()
    assert done.stdout == b""


def test_one_trace_for_every_batch_shape(ours):
    """Dynamic shapes: scoring pairs of other lengths reuses the model's traced function."""
    from nmt.scoring import _row_scores

    function = _row_scores(ours.model)
    score_ids(ours.model, [[5, 6]], [[7]], max_source_length=64, max_target_length=64)
    score_ids(ours.model, [[5, 6, 7, 8]], [[7, 9, 10]], max_source_length=64, max_target_length=64)
    assert function.experimental_get_tracing_count() == 1
