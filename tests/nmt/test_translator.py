"""Translator: order restored, batching-independent, cached == full recompute, beam 1 == greedy, length limits."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from data.tokenizer import Tokenizer
from nmt.translator import Translator, decode_batch, limit_lengths, output_limits, validation_loss
from tests.run_fixture import shared_tiny_run_dir, tiny_corpus
from transformer.vocab import EOS_ID


@pytest.fixture(scope="session")
def tiny_run_dir(tmp_path_factory, request):
    return shared_tiny_run_dir(tmp_path_factory, getattr(request.config, "cache", None))


@pytest.fixture(scope="module")
def shared_translator(tiny_run_dir):
    return Translator.from_run_dir(tiny_run_dir)


@pytest.fixture
def translator(shared_translator, tiny_run_dir):
    """The module's translator (traces shared between tests) with a tokenizer loaded for this test.

    conftest reseeds TensorFlow before each test, and tf.random.set_seed clears the eager kernel cache, which holds
    tensorflow_text's SentencePiece resources: a tokenizer created in an earlier test no longer works.
    """
    shared_translator.tokenizer = Tokenizer.load(tiny_run_dir / "tokenizer")
    shared_translator.batch_size = shared_translator.eval_config.batch_size
    return shared_translator


def sources(n=12):
    pairs = tiny_corpus()["test"][:n]
    return [s for s, _ in pairs], [t for _, t in pairs]


def test_order_restored_and_independent_of_batching(translator):
    src, refs = sources(12)
    # Mixed lengths (shuffled), blank lines and a repeat, batched 4 at a time.
    lines = [src[0] + " " + src[1], "", src[2], "   ", *src[3:], src[2]]
    translator.batch_size = 4
    before = translator.num_traces
    together = translator.translate(lines, beam_size=2)
    assert len(together) == len(lines)
    assert together[1] == "" and together[3] == ""
    assert together[2] == together[-1]
    alone = [translator.translate([line], beam_size=2)[0] for line in lines]
    assert together == alone
    # The overfit model gets the held-out test sentences right, so translations are far from trivial.
    assert sum(h == r for h, r in zip(together[4:-1], refs[3:])) >= len(refs[3:]) - 2
    traces = translator.num_traces
    # One trace per source length edge in use (each edge fixes the output buffer), whatever the batch sizes.
    edges = {min(e for e in translator.length_edges if e > len(ids)) for ids in translator.encode(src) if ids}
    edges.add(min(e for e in translator.length_edges if e > len(translator.encode([lines[0]])[0])))
    assert traces - before == len(edges) <= 3
    translator.translate(list(reversed(lines)), beam_size=2)
    # A new Translator around the same model (what the trainer does at each evaluation) reuses the traces.
    fresh = Translator(translator.model, translator.tokenizer, translator.eval_config, max_source_length=64)
    assert fresh.translate(lines, beam_size=2) == together
    assert translator.num_traces == fresh.num_traces == traces


def test_no_cache_equals_cache(translator):
    src, _ = sources(8)
    for beam in (1, 2):
        assert translator.translate(src, beam_size=beam, use_cache=False) == translator.translate(
            src, beam_size=beam
        )


def test_beam_one_equals_greedy(translator):
    src, _ = sources(8)
    pieces = translator.encode(src)
    length = max(len(p) for p in pieces) + 1
    source = np.zeros((len(src), length), np.int32)
    for row, ids in enumerate(pieces):
        source[row, : len(ids) + 1] = [*ids, EOS_ID]
    limits = tf.constant([output_limits(len(p), 1.5, 10, 40) for p in pieces], tf.int32)
    results = {}
    for search in ("greedy", "beam"):
        decode = tf.function(
            lambda s, lim, search=search: decode_batch(
                translator.model, s, lim, max_length=40, beam_size=1, alpha=0.0, search=search
            ),
            autograph=False,
        )
        ids, scores = decode(tf.constant(source), limits)
        results[search] = (ids.numpy(), scores.numpy())
    np.testing.assert_array_equal(results["greedy"][0], results["beam"][0])
    np.testing.assert_allclose(results["greedy"][1], results["beam"][1], rtol=1e-5, atol=1e-5)
    assert translator.translate(src, beam_size=1) == [
        text.numpy().decode() for text in translator.tokenizer.detokenize_target(results["greedy"][0][:, 0])
    ]


def test_nbest_sorted_and_first_is_the_one_best(translator):
    src, _ = sources(4)
    best = translator.translate(src, beam_size=3)
    nbest = translator.translate([src[0], "", *src[1:]], beam_size=3, nbest=3)
    assert nbest[1] == []
    nbest = [nbest[0], *nbest[2:]]
    assert [candidates[0][0] for candidates in nbest] == best
    for candidates in nbest:
        assert len(candidates) == 3
        scores = [score for _, score in candidates]
        assert scores == sorted(scores, reverse=True)
    with pytest.raises(ValueError, match="nbest"):
        translator.translate(src, beam_size=2, nbest=3)


def test_long_lines_truncated_and_reported(translator):
    src, _ = sources(2)
    long_line = " ".join([src[0]] * 200)
    seen = []
    out = translator.translate(
        [src[1], long_line], beam_size=1, on_truncated=lambda i, n: seen.append((i, n))
    )
    assert len(seen) == 1 and seen[0][0] == 1 and seen[0][1] > translator.max_source_length
    assert out[1]  # translated anyway
    assert out[0] == translator.translate([src[1]], beam_size=1)[0]


def test_output_length_limit_is_per_sentence(translator):
    base = translator
    short = dataclasses.replace(base.eval_config, max_length_a=0.0, max_length_b=2)
    translator = Translator(base.model, base.tokenizer, short, max_source_length=base.max_source_length)
    src, _ = sources(6)
    for text in translator.translate(src, beam_size=1):
        assert len(translator.tokenizer.tokenize_target([text])[0]) <= 2
    assert output_limits(10, 1.5, 10, 64) == 25 and output_limits(100, 1.5, 10, 64) == 63
    np.testing.assert_array_equal(output_limits(tf.constant([10, 100]), 1.5, 10, 64).numpy(), [25, 63])


def test_limit_lengths_forces_eos_with_a_fake_step_function():
    def step_fn(ids, index, cache):  # always prefers token 5
        return tf.one_hot(tf.fill([tf.shape(ids)[0]], 5), 8) * 10.0, cache

    step = limit_lengths(step_fn)
    state = {"inner": {}, "limit": tf.constant([0, 2, 7])}
    logits, state = step(tf.zeros([3, 8], tf.int32), tf.constant(2), state)
    assert logits.numpy().argmax(-1).tolist() == [EOS_ID, EOS_ID, 5]


def test_translate_stream_matches_translate(translator):
    src, _ = sources(7)
    lines = [*src, "", src[0]]
    seen = []
    streamed = list(
        translator.translate_stream(
            iter(lines), chunk_size=3, beam_size=1, on_truncated=lambda i, n: seen.append(i)
        )
    )
    assert streamed == translator.translate(lines, beam_size=1)
    assert seen == []


def test_validation_loss_counts_every_target_token(translator):
    from data.pipeline import make_eval_dataset

    config = translator.config
    dataset = make_eval_dataset(config.data, translator.tokenizer, "validation")
    loss, tokens = validation_loss(translator.model, dataset)
    expected = sum(int(tf.reduce_sum(tf.cast(b["target_out"] != 0, tf.int32))) for b in dataset)
    assert tokens == expected
    assert 0.0 < loss < 1.0  # the overfit model is confident on templated sentences
