"""transformer.decoding with fake step functions (hand-made probability tables). The searches on a real tiny model:
test_decoding_model.py."""

import math

import numpy as np
import pytest
import tensorflow as tf

from transformer.decoding import beam_search, greedy_search, length_penalty
from transformer.vocab import BOS_ID, EOS_ID, PAD_ID

A, B = 4, 5  # two ordinary tokens
VOCAB = 6
TINY = 1e-12  # probability of every token a rule does not mention


def make_table(rules, rows=1, max_length=6):
    """Log-probabilities ``(rows, max_length, V, V)`` indexed by (row, index, previous token, next token).

    ``rules[(row, index, previous)] = {token: probability}``; rows without a rule end the sentence (EOS certain).
    """
    probs = np.full((rows, max_length, VOCAB, VOCAB), TINY)
    probs[..., EOS_ID] = 1.0
    for (row, index, previous), distribution in rules.items():
        probs[row, index, previous] = TINY
        for token, p in distribution.items():
            probs[row, index, previous, token] = p
    return np.log(probs).astype(np.float32)


def table_step(table, calls=None):
    """A step function reading ``table[row, index, ids[:, index]]``; the cache holds each row's table row."""
    table = tf.constant(table)

    def step_fn(ids, index, cache):
        if calls is not None:
            calls.append(int(index))
        previous = tf.gather(ids, index, axis=1)  # (N,)
        logits = tf.gather_nd(
            table, tf.stack([cache["row"], tf.fill(tf.shape(previous), index), previous], axis=1)
        )
        return logits, cache

    return step_fn


def rows_cache(rows):
    return {"row": tf.range(rows, dtype=tf.int32)}


def test_length_penalty_values():
    assert float(length_penalty(1, 0.0)) == 1.0
    np.testing.assert_allclose(float(length_penalty(7, 0.6)), 2.0**0.6, rtol=1e-6)


def test_greedy_follows_argmax_and_stops_at_eos():
    table = make_table(
        {
            (0, 0, BOS_ID): {A: 0.6, B: 0.4},
            (0, 1, A): {B: 0.7, EOS_ID: 0.3},
            (0, 2, B): {EOS_ID: 0.9, A: 0.1},
            (1, 0, BOS_ID): {EOS_ID: 0.8, A: 0.2},
        },
        rows=2,
    )
    calls = []
    ids, scores = greedy_search(table_step(table, calls), rows_cache(2), batch_size=2, max_length=6)
    np.testing.assert_array_equal(ids.numpy(), [[A, B, EOS_ID, 0, 0, 0], [EOS_ID, 0, 0, 0, 0, 0]])
    np.testing.assert_allclose(scores.numpy(), [math.log(0.6 * 0.7 * 0.9), math.log(0.8)], atol=1e-5)
    assert calls == [0, 1, 2]  # stops as soon as every row has produced EOS


BEAM_BEATS_GREEDY = {
    (0, 0, BOS_ID): {A: 0.55, B: 0.45},
    (0, 1, A): {EOS_ID: 0.4, A: 0.3, B: 0.3},
    (0, 1, B): {EOS_ID: 0.95, A: 0.05},
}


def test_beam_finds_the_sequence_greedy_misses():
    table = make_table(BEAM_BEATS_GREEDY)
    greedy_ids, _ = greedy_search(table_step(table), rows_cache(1), batch_size=1, max_length=6)
    np.testing.assert_array_equal(greedy_ids.numpy()[0, :2], [A, EOS_ID])  # p = 0.22
    ids, scores = beam_search(
        table_step(table), rows_cache(1), batch_size=1, beam_size=2, max_length=6, alpha=0.0
    )
    assert ids.shape == (1, 2, 6) and scores.shape == (1, 2)
    np.testing.assert_array_equal(ids.numpy()[0], [[B, EOS_ID, 0, 0, 0, 0], [A, EOS_ID, 0, 0, 0, 0]])
    np.testing.assert_allclose(scores.numpy()[0], [math.log(0.45 * 0.95), math.log(0.55 * 0.4)], atol=1e-5)


def random_table(seed, rows, max_length, eos_at, eos_logit=-30.0):
    """Random log-probabilities where EOS has logit ``eos_logit`` (default: nearly impossible) except at index
    ``eos_at[row]``, where it wins."""
    logits = np.random.default_rng(seed).normal(scale=2.0, size=(rows, max_length, VOCAB, VOCAB))
    logits[..., EOS_ID] = eos_logit
    for row, index in enumerate(eos_at):
        logits[row, index, :, EOS_ID] = 30.0
    return (logits - np.log(np.exp(logits).sum(-1, keepdims=True))).astype(np.float32)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_of_one_equals_greedy(seed):
    table = random_table(seed, rows=3, max_length=7, eos_at=[2, 4, 6])
    greedy_ids, greedy_scores = greedy_search(table_step(table), rows_cache(3), batch_size=3, max_length=7)
    ids, scores = beam_search(
        table_step(table), rows_cache(3), batch_size=3, beam_size=1, max_length=7, alpha=0.0
    )
    np.testing.assert_array_equal(ids.numpy()[:, 0], greedy_ids.numpy())
    np.testing.assert_allclose(scores.numpy()[:, 0], greedy_scores.numpy(), atol=1e-5)


LENGTH_PENALTY_TABLE = {
    (0, 0, BOS_ID): {EOS_ID: 0.4, A: 0.6},
    (0, 1, A): {A: 0.9, EOS_ID: 0.1},
    (0, 2, A): {EOS_ID: 0.6, A: 0.4},
}


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_length_penalty_changes_the_ranking(alpha):
    table = make_table(LENGTH_PENALTY_TABLE)
    ids, scores = beam_search(
        table_step(table), rows_cache(1), batch_size=1, beam_size=2, max_length=5, alpha=alpha
    )
    short = ([EOS_ID, 0, 0, 0, 0], math.log(0.4) / ((5 + 1) / 6) ** alpha)
    long = ([A, A, EOS_ID, 0, 0], math.log(0.6 * 0.9 * 0.6) / ((5 + 3) / 6) ** alpha)
    expected = [short, long] if alpha == 0.0 else [long, short]  # -0.916 vs -1.127; -0.845 vs -0.916
    np.testing.assert_array_equal(ids.numpy()[0], [expected[0][0], expected[1][0]])
    np.testing.assert_allclose(scores.numpy()[0], [expected[0][1], expected[1][1]], atol=1e-5)


def test_early_finish():
    table = make_table({})  # EOS is certain everywhere
    calls = []
    greedy_search(table_step(table, calls), rows_cache(1), batch_size=1, max_length=6)
    assert calls == [0]
    calls.clear()
    ids, scores = beam_search(
        table_step(table, calls), rows_cache(1), batch_size=1, beam_size=2, max_length=6
    )
    # step 0 finishes [EOS]; step 1 fills the finished set from the second beam; nothing alive can beat it.
    assert calls == [0, 1]
    np.testing.assert_array_equal(ids.numpy()[0, 0], [EOS_ID, 0, 0, 0, 0, 0])
    assert scores.numpy()[0, 0] == pytest.approx(0.0, abs=1e-5)


@pytest.mark.parametrize("max_steps", [3, tf.constant(3), tf.constant(50)])
def test_max_steps_is_respected(max_steps):
    table = make_table({(0, i, p): {A: 0.7, B: 0.3} for i in range(8) for p in (BOS_ID, A, B)}, max_length=8)
    expected_steps = 8 if int(max_steps) > 8 else 3
    calls = []
    ids, _ = greedy_search(
        table_step(table, calls), rows_cache(1), batch_size=1, max_length=8, max_steps=max_steps
    )
    assert len(calls) == expected_steps
    np.testing.assert_array_equal(ids.numpy()[0], [A] * expected_steps + [PAD_ID] * (8 - expected_steps))
    calls.clear()
    ids, scores = beam_search(
        table_step(table, calls), rows_cache(1), batch_size=1, beam_size=2, max_length=8, max_steps=max_steps
    )
    assert len(calls) == expected_steps
    assert (ids.numpy()[0, :, expected_steps:] == PAD_ID).all()
    np.testing.assert_array_equal(ids.numpy()[0, 0, :expected_steps], [A] * expected_steps)
    expected_score = expected_steps * math.log(0.7) / float(length_penalty(expected_steps, 0.6))
    np.testing.assert_allclose(scores.numpy()[0, 0], expected_score, atol=1e-5)


def test_beam_cache_is_reordered_with_the_beams():
    """The fake cache records the tokens each row was fed; after every gather it must match that row's prefix."""
    max_length, beam = 7, 3
    table = random_table(5, rows=2, max_length=max_length, eos_at=[5, 6])
    inner = table_step(table)
    origins = []

    def step_fn(ids, index, cache):
        fed = tf.gather(ids, index, axis=1)
        # The cache rows must follow their beams.
        tf.debugging.assert_equal(cache["history"][:, :index], ids[:, :index])
        positions = tf.range(max_length)[None, :]
        history = tf.where(positions == index, fed[:, None], cache["history"])
        beam_id = tf.where(index == 0, tf.range(tf.shape(ids)[0]), cache["beam_id"])
        origins.append(cache["beam_id"].numpy())
        logits, cache = inner(ids, index, {"row": cache["row"]})
        return logits, {"row": cache["row"], "history": history, "beam_id": beam_id}

    cache = {
        "row": tf.range(2),
        "history": tf.zeros((2, max_length), tf.int32),
        "beam_id": tf.zeros((2,), tf.int32),
    }
    ids, _ = beam_search(step_fn, cache, batch_size=2, beam_size=beam, max_length=max_length)
    assert ids.shape == (2, beam, max_length)
    identity = np.arange(2 * beam)
    assert any(not np.array_equal(o, identity) for o in origins[2:]), "the table should make beams swap"


def test_per_sentence_state_held_by_the_step_function():
    """Constant per-sentence data kept out of the cache (read by row n // beam) == the same data tiled in the cache.

    The contract of the module docstring: rows are batch-major, so a step function can hold (B, ...) tensors in its
    closure and never have the search tile or reorder them.
    """
    table = random_table(7, rows=3, max_length=7, eos_at=[3, 5, 6])
    inner = table_step(table)
    beam = 3

    def shared_step(ids, index, cache):
        per_row = tf.shape(ids)[0] // 3
        sentence = tf.range(tf.shape(ids)[0]) // per_row  # (N,)
        logits, _ = inner(ids, index, {"row": sentence})
        return logits, cache

    expected = beam_search(table_step(table), rows_cache(3), batch_size=3, beam_size=beam, max_length=7)
    got = beam_search(shared_step, None, batch_size=3, beam_size=beam, max_length=7)
    np.testing.assert_array_equal(got[0].numpy(), expected[0].numpy())
    np.testing.assert_allclose(got[1].numpy(), expected[1].numpy(), atol=1e-6)
    greedy = greedy_search(shared_step, None, batch_size=3, max_length=7)
    np.testing.assert_array_equal(
        greedy[0].numpy(),
        greedy_search(table_step(table), rows_cache(3), batch_size=3, max_length=7)[0].numpy(),
    )


def test_searches_compile_with_xla():
    table = random_table(6, rows=2, max_length=6, eos_at=[3, 5])
    eager_greedy = greedy_search(table_step(table), rows_cache(2), batch_size=2, max_length=6)
    eager_beam = beam_search(table_step(table), rows_cache(2), batch_size=2, beam_size=3, max_length=6)

    @tf.function(jit_compile=True)
    def compiled(max_steps):
        greedy = greedy_search(
            table_step(table), rows_cache(2), batch_size=2, max_length=6, max_steps=max_steps
        )
        beam = beam_search(
            table_step(table), rows_cache(2), batch_size=2, beam_size=3, max_length=6, max_steps=max_steps
        )
        return greedy, beam

    greedy, beam = compiled(tf.constant(6))
    for got, expected in zip(tf.nest.flatten((greedy, beam)), tf.nest.flatten((eager_greedy, eager_beam))):
        np.testing.assert_allclose(got.numpy(), expected.numpy(), atol=1e-5)


# -- dropping finished sentences (compact) ----------------------------------------------------------------------------


def memory_table_step(table, sizes=None):
    """Like `table_step`, but the table row comes from the per-sentence ``memory`` (the step's fourth argument), and
    the cache records the fed tokens in a growing ``(N, index)`` tensor that must follow its row (checked)."""
    table = tf.constant(table)

    def step_fn(ids, index, cache, memory):
        if sizes is not None:
            sizes.append(int(tf.shape(ids)[0]))  # eager runs only
        tf.debugging.assert_equal(cache["fed"], ids[:, :index])
        sentence = tf.repeat(memory["row"], tf.shape(ids)[0] // tf.shape(memory["row"])[0])  # (N,)
        previous = tf.gather(ids, index, axis=1)
        at = tf.stack([sentence, tf.fill(tf.shape(previous), index), previous], axis=1)
        return tf.gather_nd(table, at), {"fed": tf.concat([cache["fed"], previous[:, None]], axis=1)}

    return step_fn


EOS_AT = [1, 4, 0, 6, 2]  # the step at which each sentence surely ends (0: while only one beam is alive)
GREEDY_CASES = [(1, 0.0, 0.6, -30.0), (1, 0.5, -0.5, 0.0)]  # (beam, compact, alpha, eos_logit)
BEAM_CASES = [(3, 0.0, 0.6, -30.0), (3, 0.5, 1.4, 0.0), (3, 0.0, -0.5, 0.0)]


@pytest.mark.parametrize(("beam", "compact", "alpha", "eos_logit"), GREEDY_CASES + BEAM_CASES)
def test_compaction_drops_done_sentences_and_changes_nothing(beam, compact, alpha, eos_logit):
    """Compacted search == the plain search (ids, scores, empty slots included), eagerly and in a graph, while the
    step really sees fewer rows as sentences end at different steps. With a likely EOS (``eos_logit=0``) a beam's
    finished set fills before its alive hypotheses stop improving: dropping such a sentence would change it."""
    rows, max_length = len(EOS_AT), 8
    table = random_table(11, rows=rows, max_length=max_length, eos_at=EOS_AT, eos_logit=eos_logit)

    def search(step_fn, cache, **options):
        if beam == 1:
            ids, scores = greedy_search(step_fn, cache, batch_size=rows, max_length=max_length, **options)
            return ids[:, None], scores[:, None]
        return beam_search(
            step_fn, cache, batch_size=rows, beam_size=beam, max_length=max_length, alpha=alpha, **options
        )

    expected = search(table_step(table), rows_cache(rows))
    sizes = []
    compacted = dict(memory={"row": tf.range(rows)}, compact=compact, static_shapes=False)
    cache = {"fed": tf.zeros((rows, 0), tf.int32)}
    eager = search(memory_table_step(table, sizes), cache, **compacted)
    graph = tf.function(lambda: search(memory_table_step(table), cache, **compacted), autograph=False)()
    for got in (eager, graph):
        np.testing.assert_array_equal(got[0].numpy(), expected[0].numpy())
        np.testing.assert_allclose(got[1].numpy(), expected[1].numpy(), rtol=1e-6)
    if (
        alpha < 0 and beam > 1
    ):  # nothing dropped: a done sentence's alive hypotheses may still win the final merge
        assert sizes == [rows * beam] * len(sizes)
        return
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == rows * beam and sizes[-1] < rows * beam
    if compact == 0.0 and eos_logit < 0:  # a sentence leaves right after its EOS step (beam: with a full set)
        running = [sum(e >= t or (beam > 1 and e == 0) for e in EOS_AT) for t in range(len(sizes))]
        assert sizes == [beam * n for n in running]


def test_compact_needs_dynamic_shapes():
    step, cache = table_step(random_table(0, rows=2, max_length=4, eos_at=[1, 2])), rows_cache(2)
    with pytest.raises(ValueError, match="static_shapes"):
        greedy_search(step, cache, batch_size=2, max_length=4, compact=0.0)
    with pytest.raises(ValueError, match="fraction"):
        greedy_search(step, cache, batch_size=2, max_length=4, compact=2.0, static_shapes=False)


def test_a_negative_alpha_search_stopped_early_returns_the_finished_hypothesis():
    """alpha < 0 favours short hypotheses: the search stops once no alive one can beat the finished set even one
    step later, so the result must be a finished hypothesis, not the alive one scored as if it ended there.

    Step 0: P(A) = 0.45, P(EOS) = 0.44; then EOS is certain. [EOS] scores log 0.44 / lp(1); any continuation of A
    scores at most log 0.45 / lp(2), lower, so the search stops after step 0 (before the fix: [A, pad, pad],
    never finished, scored log 0.45 / lp(1))."""
    a, vocab, length = 4, 6, 3
    p = np.full((length, vocab, vocab), 1e-6)
    p[..., EOS_ID] = 1.0
    p[0, BOS_ID] = 1e-6
    p[0, BOS_ID, a], p[0, BOS_ID, EOS_ID] = 0.45, 0.44
    table = tf.constant(np.log(p / p.sum(-1, keepdims=True)).astype(np.float32))
    steps = []

    def step(ids, index, cache):
        steps.append(int(index))
        rows = tf.stack([tf.fill([tf.shape(ids)[0]], index), tf.gather(ids, index, axis=1)], axis=1)
        return tf.gather_nd(table, rows), cache

    ids, scores = beam_search(step, None, batch_size=1, beam_size=1, max_length=length, alpha=-1.0)
    assert steps == [0]  # stopped early
    assert ids.numpy()[0, 0].tolist() == [EOS_ID, PAD_ID, PAD_ID]
    expected = math.log(0.44 / p[0, BOS_ID].sum()) / float(length_penalty(1, -1.0))
    assert float(scores[0, 0]) == pytest.approx(expected, rel=1e-5)
