"""Translator: order restored, batching-independent, cached == full recompute, beam 1 == greedy, length limits.

The tiny fixture (tests/run_fixture.py) is trained until it reproduces every sentence of its corpus under greedy and
beam search (MAX_SENTENCE_NLL, whatever the CPU): exact translations of those sentences are asserted. Everything
else (lines it never saw, cut translations) is compared between equals: same weights, same per-sentence limits.
How the Translator batches its lines and when it uses XLA: test_translator_batches.py.
"""

import dataclasses
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tensorflow as tf

import nmt.translator
from nmt.batch_decoding import MAX_CHARS_GROWTH
from nmt.translator import Translator, decode_batch, limit_lengths, output_limits, validation_loss
from tests.run_fixture import MAX_SENTENCE_NLL, tiny_corpus
from transformer.vocab import EOS_ID, PAD_ID


def sources(n=12):
    pairs = tiny_corpus()["test"][:n]
    return [s for s, _ in pairs], [t for _, t in pairs]


def test_order_restored_and_independent_of_batching(translator):
    src, refs = sources(12)
    # Mixed lengths (shuffled), blank lines and a repeat, batched 4 at a time. The first line (two sentences in
    # one) is not in the fixture's corpus: its translation is only compared, never checked against a reference.
    lines = [src[0] + " " + src[1], "", src[2], "   ", *src[3:], src[2]]
    translator.batch_size = 4
    before = translator.num_traces
    traced_before = any(key[0] == 2 and not key[-1] for key in translator._decoders.functions)
    together = translator.translate(lines, beam_size=2)
    assert len(together) == len(lines)
    assert together[1] == "" and together[3] == ""
    # Every memorised sentence comes back in its own place (the fixture guarantees beam search reproduces them).
    assert together[2] == together[-1] == refs[2]
    assert together[4:-1] == refs[3:]
    alone = [translator.translate([line], beam_size=2)[0] for line in lines]
    assert together == alone
    traces = translator.num_traces
    # Without XLA one trace serves every batch size, source length and output buffer (sources are padded to their
    # batch's longest only): these batches span several length edges, and the first translate() traced at most once
    # (not at all if an earlier test did).
    edges = {min(e for e in translator.length_edges if e > len(ids)) for ids in translator.encode(src) if ids}
    edges.add(min(e for e in translator.length_edges if e > len(translator.encode([lines[0]])[0])))
    assert len(edges) >= 2 and not translator.uses_xla(len(lines), 2)
    assert traces - before == (0 if traced_before else 1)
    assert translator.translate(list(reversed(lines)), beam_size=2) == list(reversed(together))
    # A new Translator around the same model (what the trainer does at each evaluation) reuses the traces.
    fresh = Translator(translator.model, translator.tokenizer, translator.eval_config, max_source_length=64)
    assert fresh.translate(lines, beam_size=2) == together
    assert translator.num_traces == fresh.num_traces == traces


@pytest.mark.slow  # ~1.5 min: fresh processes, since the crash came at a process's first eager ops
def test_two_streams_in_fresh_processes_do_not_crash(tiny_run_dir):
    """translate.py with two decoding streams, started 8 times: their eager TensorFlow ops at once crashed the
    process (SIGSEGV) in 9 of 32 starts (nmt.translator._EAGER_OPS). Without the lock this test failed
    (2026-12-06); in-process calls of `Translator.translate` did not show the crash, hence the CLI."""
    import subprocess
    import sys

    from tests.test_cli_translate import ROOT

    lines = [source for source, _ in tiny_corpus()["validation"]]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    command = [sys.executable, "translate.py", "--model-dir", tiny_run_dir, "--beam", "1", "--streams", "2"]
    for _ in range(8):  # a hang guard only: each start takes seconds
        done = subprocess.run(command, input="\n".join(lines) + "\n", text=True, cwd=ROOT, env=env,
                              capture_output=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
        assert len(done.stdout.splitlines()) == len(lines)


def test_streams_decode_batches_at_once_with_the_same_translations(translator, monkeypatch):
    src, refs = sources(12)
    lines = [*src, *(line.upper() for line in src)]  # memorised sentences and unseen variants
    monkeypatch.setattr(translator, "batch_size", 3)  # 8 batches
    monkeypatch.setattr(translator, "streams", 1)
    one = translator.translate(lines, beam_size=2)
    assert one[: len(refs)] == refs
    traces = translator.num_traces
    monkeypatch.setattr(translator, "streams", 3)
    assert translator.num_streams() == 3
    assert translator.translate(lines, beam_size=2) == one and translator.num_traces == traces
    # A search setting never traced before (a new alpha): three streams ask for it at once, it is traced once.
    monkeypatch.setattr(translator, "eval_config", dataclasses.replace(translator.eval_config, alpha=0.77))
    three = translator.translate(lines, beam_size=2)
    assert translator.num_traces == traces + 1
    monkeypatch.setattr(translator, "streams", 1)
    assert translator.translate(lines, beam_size=2) == three and translator.num_traces == traces + 1
    monkeypatch.setattr(translator, "streams", 0)  # auto: one per core on a CPU, at most 2
    assert translator.num_streams() == min(2, len(os.sched_getaffinity(0)))

    calls, shut = [], threading.Event()

    class Pool(ThreadPoolExecutor):
        """Says when the batches not started yet have been cancelled (before waiting for the running ones)."""

        def shutdown(self, wait=True, *, cancel_futures=False):
            super().shutdown(wait=False, cancel_futures=cancel_futures)
            shut.set()
            super().shutdown(wait=wait)

    def broken(*args):
        calls.append(1)
        if len(calls) > 1:  # the batches started with or after the first: still running when it fails
            assert shut.wait(timeout=120), "hang: the pool was never shut down"  # a hang guard, not a timing
        raise RuntimeError("this batch failed")

    monkeypatch.setattr(translator, "streams", 3)
    monkeypatch.setattr(translator, "_translate_batch", broken)
    monkeypatch.setattr(nmt.translator, "ThreadPoolExecutor", Pool)
    with pytest.raises(RuntimeError, match="this batch failed"):  # a failing stream is not swallowed
        translator.translate(lines, beam_size=2)
    # The batches not yet started when the first one failed were dropped, not run: at most the first batch, one
    # more on the stream that ran it and one on each of the two others (before: a 1 s sleep stood for the order).
    assert 1 <= len(calls) <= 4
    with pytest.raises(ValueError, match="streams must be >= 0"):
        Translator(
            translator.model, translator.tokenizer, translator.eval_config, max_source_length=8, streams=-1
        )


def test_no_cache_equals_cache(translator):
    src, refs = sources(8)
    lines = [
        *src,
        src[0] + " " + src[1],
    ]  # the last line is unseen: compared, not checked against a reference
    for beam in (1, 2):
        cached = translator.translate(lines, beam_size=beam)
        assert translator.translate(lines, beam_size=beam, use_cache=False) == cached
        assert cached[:-1] == refs


def with_limits(translator, a, b):
    """A Translator around the same model and tokenizer with output limits floor(a * source_length + b)."""
    config = dataclasses.replace(translator.eval_config, max_length_a=a, max_length_b=b)
    return Translator(
        translator.model, translator.tokenizer, config, max_source_length=translator.max_source_length
    )


def padded_sources(pieces):
    """(N, S) int32: each sentence's pieces, EOS, PAD (what the Translator feeds the model)."""
    source = np.full((len(pieces), max(len(p) for p in pieces) + 1), PAD_ID, np.int32)
    for row, ids in enumerate(pieces):
        source[row, : len(ids) + 1] = [*ids, EOS_ID]
    return tf.constant(source)


@pytest.mark.parametrize("cut", [False, True], ids=["configured-limits", "cut-at-3-subwords"])
def test_beam_one_equals_greedy(translator, cut):
    """decode_batch greedy == beam 1 == translate(beam_size=1), with the per-sentence limits translate() applies.

    The limits follow the documented rule, min(floor(a * source_length + b), model positions - 1), computed here
    from the eval config; the output buffer is just large enough for them (translate() pads it to its length edge:
    a translation must not depend on it). With `cut`, every translation is forced to end after 3 subwords: the
    comparison at the cut is where different limits on the two sides would show.
    """
    translator = with_limits(translator, 0.0, 3) if cut else translator
    cfg = translator.eval_config
    src, refs = sources(8)
    src.append(src[0] + " " + src[1])  # unseen: no reference, compared only
    pieces = translator.encode(src)
    limits = [
        output_limits(len(p), cfg.max_length_a, cfg.max_length_b, translator.max_target_length)
        for p in pieces
    ]
    assert limits == [
        min(int(cfg.max_length_a * len(p) + cfg.max_length_b), translator.max_target_length - 1)
        for p in pieces
    ]
    results = {}
    for search in ("greedy", "beam"):
        decode = tf.function(
            lambda s, lim, search=search: decode_batch(
                translator.model, s, lim, max_length=max(limits) + 1, beam_size=1, alpha=0.0, search=search
            ),
            autograph=False,
        )
        ids, scores = decode(padded_sources(pieces), tf.constant(limits, tf.int32))
        results[search] = (ids.numpy(), scores.numpy())
    np.testing.assert_array_equal(results["greedy"][0], results["beam"][0])
    np.testing.assert_allclose(results["greedy"][1], results["beam"][1], rtol=1e-5, atol=1e-5)
    greedy = [
        text.numpy().decode() for text in translator.tokenizer.detokenize_target(results["greedy"][0][:, 0])
    ]
    assert translator.translate(src, beam_size=1) == greedy
    references = refs
    if cut:  # the first 3 subwords of each reference, then EOS
        references = [
            text.numpy().decode()
            for text in translator.tokenizer.detokenize_target(
                tf.ragged.constant(
                    [p[:3] for p in translator.tokenizer.tokenize_target(tf.constant(refs)).to_list()]
                )
            )
        ]
        lengths = [int((row != PAD_ID).sum()) for row in results["greedy"][0][:, 0]]
        assert lengths[:-1] == [4] * len(refs) and lengths[-1] <= 4  # 3 subwords + EOS at most
    assert greedy[:-1] == references


def test_nbest_sorted_and_first_is_the_one_best(translator):
    src, refs = sources(4)
    best = translator.translate(src, beam_size=3)
    assert best == refs
    nbest = translator.translate([src[0], "", *src[1:]], beam_size=3, nbest=3)
    assert nbest[1] == []
    nbest = [nbest[0], *nbest[2:]]
    assert [candidates[0][0] for candidates in nbest] == best
    for candidates in nbest:
        assert len(candidates) == 3
        scores = [score for _, score in candidates]
        assert scores == sorted(scores, reverse=True)
        # The memorised reference has log-probability > -MAX_SENTENCE_NLL and a length penalty >= 1.
        assert scores[0] > -MAX_SENTENCE_NLL
    with pytest.raises(ValueError, match="nbest"):
        translator.translate(src, beam_size=2, nbest=3)


def test_long_lines_truncated_and_reported(translator):
    src, refs = sources(2)
    long_line = " ".join([src[0]] * 20)  # over the kept pieces, under `source_chars_for` (counted: next test)
    assert len(long_line) < translator.tokenizer.source_chars_for(translator.max_source_length)
    seen = []
    out = translator.translate(
        [src[1], long_line], beam_size=1, on_truncated=lambda i, n: seen.append((i, n))
    )
    assert len(seen) == 1 and seen[0][0] == 1 and seen[0][1] > translator.max_source_length
    assert out[0] == translator.translate([src[1]], beam_size=1)[0] == refs[1]
    # Translated anyway: the search returns candidates for it (a skipped line gives [], whatever the model).
    assert len(translator.translate([long_line], beam_size=2, nbest=2)[0]) == 2


def test_a_line_longer_than_its_kept_pieces_can_cover_is_tokenized_from_its_start_only(
    translator, monkeypatch
):
    """A 1 MB line keeps 63 pieces: the tokenizer sees its first `source_chars_for(max_source_length)` characters
    (before, the whole line: ~160 bytes of memory per character), and the translation is the same."""
    src, _ = sources(2)
    keep = translator.max_source_length - 1
    limit = translator.tokenizer.source_chars_for(translator.max_source_length)
    long_line = (" ".join([src[0]] * 200) + " ") * (limit // (201 * len(src[0])) + 1)
    assert len(long_line) > limit
    whole = translator.tokenizer.tokenize_source(tf.constant([long_line])).to_list()[0]
    cut = translator.tokenizer.tokenize_source(tf.constant([long_line[:limit]])).to_list()[0]
    assert cut[:keep] == whole[:keep] and len(cut) > keep  # the kept pieces lie within the limit
    encoded = []
    encode = translator.encode
    monkeypatch.setattr(
        translator, "encode", lambda lines: encoded.append(list(map(len, lines))) or encode(lines)
    )
    seen = []
    out = translator.translate(
        [long_line, src[1]], beam_size=1, on_truncated=lambda i, n: seen.append((i, n))
    )
    assert encoded == [[limit, len(src[1])]] and seen == [(0, None)]  # not counted: tokenized in part
    monkeypatch.setattr(translator, "encode", encode)
    assert out[0] == translator.translate([long_line[:limit]], beam_size=1)[0]


def test_a_long_run_of_unknown_characters_does_not_cut_the_sentence_after_it(translator):
    """Without byte fallback (the tiny run's 64 pieces) a run of unknown characters is one `<unk>` piece however
    long: a line of 1,600 emoji and a sentence is a few pieces, translated whole as the SavedModel does (before:
    tokenized from its first `source_chars_for` characters only, the sentence dropped, and reported as cut)."""
    src, _ = sources(1)
    limit = translator.tokenizer.source_chars_for(translator.max_source_length)
    long_line, short_line = "\U0001f600" * (limit + 64) + " " + src[0], "\U0001f600" * 10 + " " + src[0]
    ids = translator.tokenizer.tokenize_source(tf.constant([long_line, short_line])).to_list()
    assert ids[0] == ids[1] and len(ids[0]) < translator.max_source_length  # the same few pieces
    seen = []
    out = translator.translate([long_line, short_line], beam_size=1, on_truncated=lambda *a: seen.append(a))
    assert seen == [] and out[0] == out[1]  # the sentence after the run is translated, not reported cut
    # Beyond MAX_CHARS_GROWTH times the limit the line's start is kept (memory bound), and the line reported cut.
    beyond = "\U0001f600" * (MAX_CHARS_GROWTH * limit + 1) + " " + src[0]
    translator.translate([beyond], beam_size=1, on_truncated=lambda *a: seen.append(a))
    assert seen == [(0, None)]


@pytest.mark.parametrize("beam", [1, 2])
def test_output_length_limit_is_per_sentence(translator, beam):
    translator = with_limits(translator, 0.0, 2)
    src, refs = sources(6)
    # The model reproduces its references, so cut after 2 subwords it gives their first 2 subwords exactly.
    pieces = translator.tokenizer.tokenize_target(tf.constant(refs)).to_list()
    firsts = translator.tokenizer.detokenize_target(tf.ragged.constant([p[:2] for p in pieces])).numpy()
    assert translator.translate(src, beam_size=beam) == [text.decode() for text in firsts]
    assert output_limits(10, 1.5, 10, 64) == 25 and output_limits(100, 1.5, 10, 64) == 63
    np.testing.assert_array_equal(output_limits(tf.constant([10, 100]), 1.5, 10, 64).numpy(), [25, 63])
    # limits beyond int32 (a huge eval.max_length_a or _b) are the cap, on tensors as on ints (before 2026-12-07d
    # the tensor branch wrapped them to 0: the SavedModel translated everything to "")
    for a, b in ((1.5, 2**31 - 1), (1e12, 0)):
        assert output_limits(10, a, b, 512) == 511
        np.testing.assert_array_equal(output_limits(tf.constant([10, 20]), a, b, 512).numpy(), [511, 511])


def test_limit_lengths_forces_eos_with_a_fake_step_function():
    def step_fn(ids, index, cache):  # always prefers token 5
        return tf.one_hot(tf.fill([tf.shape(ids)[0]], 5), 8) * 10.0, cache

    step = limit_lengths(step_fn)
    state = {"inner": {}, "limit": tf.constant([0, 2, 7])}
    logits, state = step(tf.zeros([3, 8], tf.int32), tf.constant(2), state)
    assert logits.numpy().argmax(-1).tolist() == [EOS_ID, EOS_ID, 5]


def test_translate_stream_matches_translate(translator):
    src, refs = sources(7)
    lines = [*src, "", src[0]]
    seen = []
    streamed = list(
        translator.translate_stream(
            iter(lines), chunk_size=3, beam_size=1, on_truncated=lambda i, n: seen.append(i)
        )
    )
    assert streamed == translator.translate(lines, beam_size=1) == [*refs, "", refs[0]]
    assert seen == []


def test_validation_loss_counts_every_target_token(translator):
    from data.pipeline import make_eval_dataset

    config = translator.config
    dataset = make_eval_dataset(config.data, translator.tokenizer, "validation")
    loss, tokens = validation_loss(translator.model, dataset)
    references = [t for _, t in tiny_corpus()["validation"]]
    assert tokens == sum(
        len(p) + 1 for p in translator.tokenizer.tokenize_target(tf.constant(references)).to_list()
    )  # + EOS
    # Every validation pair is memorised: its whole reference costs < MAX_SENTENCE_NLL, so each token less.
    assert 0.0 < loss < MAX_SENTENCE_NLL


def test_xla_decoding_equals_the_default(translator):
    """Under XLA (fixed-size buffers, every sentence decoded until its batch ends) == without XLA (a cache growing
    with the prefix, finished sentences dropped from the batch): the same n-best lists, sentences ending at
    different steps (greedy: tests/transformer/test_decoding_model.py)."""
    src, _ = sources(6)
    lines = [*src, src[0] + " " + src[1]]
    xla = Translator(
        translator.model, translator.tokenizer, translator.eval_config, max_source_length=64, xla=True
    )
    assert not translator.uses_xla(len(lines), 2) and xla.uses_xla(len(lines), 2)
    expected, got = (
        translator.translate(lines, beam_size=2, nbest=2),
        xla.translate(lines, beam_size=2, nbest=2),
    )
    assert [[text for text, _ in n] for n in got] == [[text for text, _ in n] for n in expected]
    np.testing.assert_allclose(
        [[s for _, s in n] for n in got], [[s for _, s in n] for n in expected], atol=1e-4
    )


def test_an_nbest_list_of_a_zero_length_limit_repeats_the_empty_hypothesis(translator, monkeypatch):
    """max_length_a/b 0: every output is empty and the beam has no second hypothesis; the n-best list repeats the
    empty one (score 0), as CTranslate2's does, instead of printing the search's -1e9 filler (before 2026-12-07c;
    found by a review)."""
    import dataclasses

    monkeypatch.setattr(
        translator,
        "eval_config",
        dataclasses.replace(translator.eval_config, max_length_a=0.0, max_length_b=0),
    )
    got = translator.translate(["a", "The cat sees the ball."], beam_size=2, nbest=2)
    assert got == [[("", 0.0), ("", 0.0)]] * 2
