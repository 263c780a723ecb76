"""Beam search internals against independent references: the two-stage candidate selection against a NumPy sort
(ties included), and the per-sentence length bound (`max_lengths`) against the search without it."""

import numpy as np
import pytest
import tensorflow as tf

from nmt.batch_decoding import limit_lengths
from tests.transformer.test_decoding import random_table, rows_cache, table_step
from transformer.decoding import NEG_INF, _best_candidates, beam_search
from transformer.vocab import EOS_ID


def numpy_best(scores, n):
    """Per sentence, the ``n`` best of ``scores (M, k * V)``, ties to the lower flat index: (scores, flat index)."""
    order = np.stack([np.lexsort((np.arange(row.size), -row))[:n] for row in scores])
    return np.take_along_axis(scores, order, axis=1), order


@pytest.mark.parametrize(("k", "vocab"), [(1, 7), (3, 5), (4, 6), (4, 50), (2, 2)])
def test_best_candidates_equal_one_sort_over_the_sentence(k, vocab):
    """Scores drawn from 3 values (ties everywhere, also across beams); vocab < 2k leaves rows with fewer than
    2k tokens. Same scores, beams and tokens, in the same order, as one sort of each sentence's k * V scores."""
    m, n = 5, 2 * k
    rng = np.random.default_rng(k * 100 + vocab)
    scores = rng.choice(np.float32([-1.0, -2.0, -3.5]), size=(m * k, vocab))
    flat = scores.reshape(m, k * vocab)
    expected, index = numpy_best(flat, n)
    for function in (
        lambda x: _best_candidates(x, m, k, n),  # eager: static vocab
        tf.function(  # a graph with an unknown vocab size, as without XLA
            lambda x: _best_candidates(x, tf.shape(x)[0] // k, k, n),
            input_signature=[tf.TensorSpec([None, None], tf.float32)],
            autograph=False,
        ),
        tf.function(lambda x: _best_candidates(x, m, k, n), jit_compile=True, autograph=False),
    ):
        got, beam, token = (t.numpy() for t in function(tf.constant(scores)))
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(beam, index // vocab)
        np.testing.assert_array_equal(token, index % vocab)


LIMITS = [2, 5, 1, 6, 3]  # output tokens before the forced EOS, per sentence
ROWS, MAX_LENGTH, BEAM = len(LIMITS), 20, 3


def limited_search(table, alpha, max_lengths, compact, work):
    """Beam search over ``table`` with EOS forced at each sentence's limit (`limit_lengths`), run eagerly; ``work``
    receives the rows of every step. ``compact``: the table row comes from ``memory`` and done sentences leave."""
    inner = table_step(table)
    options, cache = {}, rows_cache(ROWS)  # the search tiles the cache to the beams
    if compact:
        options, cache = dict(memory={"row": tf.range(ROWS)}, compact=0.0, static_shapes=False), {}

    def step(ids, index, cache, memory=None):
        work.append(int(tf.shape(ids)[0]))
        if memory is None:
            return inner(ids, index, cache)
        rows = tf.repeat(memory["row"], tf.shape(ids)[0] // tf.shape(memory["row"])[0])
        return inner(ids, index, {"row": rows})[0], cache

    ids, scores = beam_search(
        limit_lengths(step),
        {"inner": cache, "limit": tf.constant(LIMITS)},
        batch_size=ROWS,
        beam_size=BEAM,
        max_length=MAX_LENGTH,
        alpha=alpha,
        max_lengths=max_lengths,
        **options,
    )
    return ids.numpy(), scores.numpy()


def test_length_bound_saves_work_with_the_same_results():
    """``max_lengths = limits + 1`` (EOS included): identical ids and scores (best first, every slot) with less
    work (rows x steps), whole batch or compacted, over seeds and length penalties; one too few (``limits``) changes
    some result, so these cases can tell a wrong bound."""
    less, changed = {False: 0, True: 0}, 0
    for compact in (False, True):
        for seed in range(4):
            table = random_table(seed, rows=ROWS, max_length=MAX_LENGTH, eos_at=[], eos_logit=1.0)
            for alpha in (0.6, 1.4):
                plain_work, bound_work = [], []
                plain = limited_search(table, alpha, None, compact, plain_work)
                bound = limited_search(table, alpha, tf.constant(LIMITS) + 1, compact, bound_work)
                np.testing.assert_array_equal(bound[0], plain[0])
                np.testing.assert_array_equal(bound[1], plain[1])
                assert sum(bound_work) <= sum(plain_work)
                less[compact] += sum(bound_work) < sum(plain_work)
                if compact:  # where a sentence's result is taken as soon as it is done
                    tight = limited_search(table, alpha, tf.constant(LIMITS), compact, [])
                    changed += not (np.array_equal(tight[0], plain[0]) and np.array_equal(tight[1], plain[1]))
    assert less[False] > 0 and less[True] > 0 and changed > 0


@pytest.mark.parametrize("static_shapes", [True, False])
@pytest.mark.parametrize("alpha", [1.4, 3.0, 5.0])
def test_a_sentence_with_one_hypothesis_keeps_its_other_slots_empty_at_any_length_penalty(
    alpha, static_shapes
):
    """Sentence 0 may emit nothing (EOS forced at its first step): its only hypothesis is the empty one, the other
    beams are fillers (log-probability about -t * 1e9) that the forced EOS never finishes while sentence 1 keeps
    the loop running. Their score must stay an empty slot's (<= NEG_INF / 2, what the n-best filter drops) at every
    length penalty: before 2026-12-07e the penalty of a long loop (alpha 3, 13 steps) lifted -1.3e10 above -5e8 and
    translate.py --nbest printed PAD/UNK fillers scored -1.8e8. Sentence 1's beams are all real."""
    limits = [0, 12]
    table = random_table(3, rows=2, max_length=MAX_LENGTH, eos_at=[], eos_logit=1.0)
    options = {} if static_shapes else {"compact": 0.0, "static_shapes": False}
    ids, scores = beam_search(
        limit_lengths(table_step(table)),
        {"inner": rows_cache(2), "limit": tf.constant(limits)},
        batch_size=2, beam_size=BEAM, max_length=MAX_LENGTH, alpha=alpha, **options,
    )  # fmt: skip
    scores = scores.numpy()
    assert scores[0, 0] == 0.0 and ids.numpy()[0, 0, 0] == EOS_ID
    assert (scores[0, 1:] <= NEG_INF / 2).all(), scores[0]
    assert (scores[1] > NEG_INF / 2).all(), scores[1]
