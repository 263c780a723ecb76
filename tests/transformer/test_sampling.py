"""Sampling (transformer/sampling.py): the filtered distribution against NumPy, the draws' frequencies against it,
and decoding with it: the same sample whatever the batch, cache, compaction or XLA, scored as the model scores it."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from nmt.batch_decoding import decode_batch
from tests.transformer.model_configs import tiny_config
from transformer.model import build_model
from transformer.sampling import Sampling, filtered_probabilities, mix, picker, sample, uniform, unit_interval
from transformer.vocab import BOS_ID, EOS_ID, PAD_ID


def numpy_distribution(log_probs, topk, topp, temperature):
    """The distribution to draw from, over the whole vocabulary, computed the textbook way."""
    scaled = log_probs / temperature
    out = np.zeros_like(scaled)
    for row, values in enumerate(scaled):
        order = np.argsort(-values, kind="stable")
        keep = order[:topk] if topk else order
        probs = np.exp(values[keep] - values[keep].max())
        probs /= probs.sum()
        if topp < 1.0:
            before = np.cumsum(probs) - probs
            probs = np.where(before < topp, probs, 0.0)
            probs /= probs.sum()
        out[row, keep] = probs
    return out


def vocabulary_probabilities(log_probs, sampling):
    probs, token_ids = filtered_probabilities(tf.constant(log_probs), sampling)
    probs = probs.numpy()
    if token_ids is None:
        return probs
    out = np.zeros_like(log_probs)
    np.put_along_axis(out, token_ids.numpy(), probs, axis=1)
    return out


@pytest.mark.parametrize(
    "topk, topp, temperature", [(0, 1.0, 1.0), (5, 1.0, 1.0), (0, 0.7, 1.0), (8, 0.5, 0.6), (0, 1.0, 2.5)]
)
def test_filtered_distribution_matches_numpy(topk, topp, temperature):
    rng = np.random.default_rng(0)
    logits = rng.normal(scale=2.0, size=(6, 40)).astype(np.float32)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    sampling = Sampling(topk=topk, topp=topp, temperature=temperature)
    got = vocabulary_probabilities(log_probs, sampling)
    expected = numpy_distribution(log_probs.astype(np.float64), topk, topp, temperature)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert ((got > 0).sum(axis=1) <= (topk or 40)).all()


@pytest.mark.parametrize("topk, topp, temperature", [(0, 1.0, 1.0), (4, 1.0, 0.8), (0, 0.8, 1.3)])
def test_draws_follow_the_filtered_distribution(topk, topp, temperature):
    """40,000 draws of one distribution, one per key: frequencies within 0.01 (four standard errors) of NumPy's
    probabilities, and nothing drawn outside the kept tokens."""
    rng = np.random.default_rng(1)
    logits = rng.normal(scale=1.5, size=(1, 12)).astype(np.float32)
    log_probs = logits - np.log(np.exp(logits).sum())
    sampling = Sampling(topk=topk, topp=topp, temperature=temperature)
    draws = 40_000
    u = uniform(mix(tf.range(1, draws + 1, dtype=tf.int64)), tf.constant(3), 12)
    tokens = sample(tf.constant(np.repeat(log_probs, draws, axis=0)), u, sampling).numpy()
    frequencies = np.bincount(tokens, minlength=12) / draws
    expected = numpy_distribution(log_probs.astype(np.float64), topk, topp, temperature)[0]
    np.testing.assert_allclose(frequencies, expected, atol=0.01)
    assert frequencies[expected == 0].sum() == 0


def test_uniform_numbers_are_uniform_and_reproducible():
    keys = mix(tf.range(1, 5_001, dtype=tf.int64))
    u = uniform(keys, tf.constant(0), 10).numpy()  # 50,000 numbers: 5,000 keys x 10 token ids
    assert u.shape == (5_000, 10) and u.min() > 0.0 and u.max() < 1.0
    counts = np.bincount((u * 10).astype(int).ravel(), minlength=10)
    assert np.abs(counts - 5_000).max() < 300  # binomial sd ~67 per bin
    np.testing.assert_array_equal(u, uniform(keys, tf.constant(0), 10).numpy())
    for other in (uniform(keys, tf.constant(1), 10).numpy(), u[:, ::-1]):  # another step; another token id
        assert abs(np.corrcoef(u.ravel(), other.ravel())[0, 1]) < 0.02 and (u != other).mean() > 0.99
    np.testing.assert_array_equal(uniform(keys, tf.constant(0), 4).numpy(), u[:, :4])  # a token's own number
    # the extremes are 2^-24 and 1 - 2^-24 (their Gumbel noise finite), reached by the hashes of some token ids
    extremes = unit_interval(tf.constant([0, 2**32 - 1], tf.int64)).numpy()
    assert extremes.tolist() == [2**-24, 1.0 - 2**-24]
    assert np.isfinite(-np.log(-np.log(extremes))).all()


@pytest.mark.parametrize("impossible", [-1.0e9, -32752.0])
@pytest.mark.parametrize("temperature", [1e-45, 1e-40, 0.5, 1.0, 1e5, 1e8, 3e38])
def test_forced_and_forbidden_tokens_hold_at_any_temperature(temperature, impossible):
    """Once a sentence reaches its length limit, every other token's log-probability is about -1e9: the draw is EOS.
    PAD and BOS (forbidden, about -1e9) are never drawn; a temperature near 0 draws the most likely token. Under
    mixed_float16 the step's bias is float16's -32752, not -1e9: before 2026-12-07c a temperature from a few
    thousand up drew PAD and BOS mid-sentence (found by a review)."""
    # a number per token: the extremes uniform gives (2^-24 and 1 - 2^-24), and random ones
    u = np.random.default_rng(0).uniform(size=(3, 10)).astype(np.float32)
    u[0, ::2], u[1, 1::2] = 2**-24, 1.0 - 2**-24
    forced = np.full((3, 10), impossible, np.float32)
    forced[:, EOS_ID] = 0.0
    free = np.tile(np.log(np.linspace(1, 2, 10) / np.linspace(1, 2, 10).sum()), (3, 1)).astype(np.float32)
    free[:, [PAD_ID, BOS_ID]] = impossible
    for topk, topp in ((0, 1.0), (5, 1.0), (0, 0.3)):
        sampling = Sampling(topk=topk, topp=topp, temperature=temperature)
        assert sample(tf.constant(forced), tf.constant(u), sampling).numpy().tolist() == [EOS_ID] * 3
        drawn = sample(tf.constant(free), tf.constant(u), sampling).numpy()
        assert not set(drawn.tolist()) & {PAD_ID, BOS_ID}
        if temperature < 1e-30:
            assert drawn.tolist() == [9] * 3  # the most likely


def test_draws_over_a_large_vocabulary_are_the_same_with_xla_and_without():
    """2,000 draws from log-probabilities over 8,000 tokens at temperature 1.3, compiled by XLA and by TensorFlow:
    at most one differs. Inverse-CDF sampling (the sampler before) changed 5 here: the two compute the cumulative
    distribution's float32 sum in different orders, and a draw flips where its number falls within that rounding of
    any of the 8,000 boundaries (over a sentence's steps, 10 of 120 sampled lines differed)."""
    rng = np.random.default_rng(2)
    rows, vocab = 2_000, 8_000
    logits = rng.normal(scale=3.0, size=(1, vocab))
    log_probs = tf.constant(np.repeat(logits - np.log(np.exp(logits).sum()), rows, axis=0).astype(np.float32))
    sampling = Sampling(topk=0, temperature=1.3)
    u = uniform(mix(tf.range(1, rows + 1, dtype=tf.int64)), tf.constant(0), vocab)
    drawn = tf.function(lambda lp, u: sample(lp, u, sampling))(log_probs, u).numpy()
    compiled = tf.function(lambda lp, u: sample(lp, u, sampling), jit_compile=True)(log_probs, u).numpy()
    assert (drawn != compiled).sum() <= 1
    assert len(set(drawn.tolist())) > 500  # the whole vocabulary is drawn from


def test_every_seed_has_its_own_numbers():
    """Seeds at the ends of the range, and seeds whose +1 would have collided in the hash, differ."""
    model_log_probs = tf.zeros((64, 50))
    rows = tf.range(64)
    draws = {
        seed: picker(Sampling(seed=seed), rows)(model_log_probs, tf.constant(2), rows).numpy().tobytes()
        for seed in (0, 1, 65536, 2**32 - 1)
    }
    assert len(set(draws.values())) == len(draws)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(topk=1), "topk must be 0"),
        (dict(topk=-2), "topk must be 0"),
        # compared with the int32 vocabulary size: a TypeError after the model loaded before 2026-12-07e
        (
            dict(topk=2**31),
            r"topk must be 0 \(the whole vocabulary\) or from 2 to 2147483647 \(int32\), got 2147483648",
        ),
        (dict(topp=0.0), "topp must be in"),
        (dict(topp=1.5), "topp must be in"),
        (dict(temperature=0.0), "temperature must be a positive"),
        (dict(temperature=float("nan")), "temperature must be a positive"),
        (
            dict(temperature=1e300),
            r"temperature must be a positive number from 1e-45 to 3e\+38 \(float32's range\)",
        ),
        (dict(temperature=1e-50), "temperature must be a positive"),
        (dict(seed=-1), "seed must be in"),
    ],
)
def test_sampling_settings_are_checked(settings, message):
    with pytest.raises(ValueError, match=message):
        Sampling(**settings)


def test_the_largest_topk_draws_from_the_whole_vocabulary():
    """topk 2^31 - 1 (over any vocabulary) filters as topk 0, the whole vocabulary."""
    log_probs = tf.math.log_softmax(tf.constant([[0.5, 1.0, -2.0, 0.0]]))
    largest, _ = filtered_probabilities(log_probs, Sampling(topk=2**31 - 1, topp=0.9))
    whole, _ = filtered_probabilities(log_probs, Sampling(topk=0, topp=0.9))
    np.testing.assert_array_equal(largest.numpy(), whole.numpy())


@pytest.fixture(scope="module")
def model():
    """One tiny untrained model (the weights of seed 1234) for the decoding tests: decoding leaves it as it is."""
    keras.utils.set_random_seed(1234)
    return build_model(tiny_config(d_model=16, num_heads=2, d_ff=32, max_length=16), 32, 32)


SOURCE = [[5, 9, 12, 7, EOS_ID], [6, 8, EOS_ID, 0, 0], [4, EOS_ID, 0, 0, 0], [9, 9, EOS_ID, 0, 0]]
LIMITS = [6, 3, 0, 8]
ROWS = [10, 11, 12, 13]
FILTERED = Sampling(topk=5, topp=0.9, temperature=2.0, seed=3)  # top-k and top-p, tempered


def sampler(model, sampling, *, static_shapes=False, use_cache=True, jit_compile=False):
    """A traced decoding function: (source, limits, row ids) -> (ids, scores) of each row's sample. Dynamic shapes
    (as the Translator's decoding functions): one trace for every batch; static shapes: one per batch shape."""

    def function(s, lim, rows):
        return decode_batch(
            model,
            s,
            lim,
            max_length=10,
            use_cache=use_cache,
            static_shapes=static_shapes,
            sampling=sampling,
            row_ids=rows,
        )

    spec = [
        tf.TensorSpec([None, None], tf.int32),
        tf.TensorSpec([None], tf.int32),
        tf.TensorSpec([None], tf.int32),
    ]
    dynamic = dict(input_signature=spec) if not (static_shapes or jit_compile) else {}
    traced = tf.function(function, autograph=False, jit_compile=jit_compile, **dynamic)

    def run(source, limits, row_ids):
        ids, scores = traced(
            tf.constant(source), tf.constant(limits, tf.int32), tf.constant(row_ids, tf.int32)
        )
        return ids.numpy()[:, 0], scores.numpy()[:, 0]

    return run


def sampled(model, source, limits, sampling, row_ids, **options):
    return sampler(model, sampling, **options)(source, limits, row_ids)


@pytest.fixture(scope="module")
def samples(model):
    """sampling -> (its default `sampler`, the ids and scores it draws for SOURCE, LIMITS, ROWS), once per setting:
    the tests below check the same draws from different sides."""
    done = {}

    def get(sampling):
        if sampling not in done:
            default = sampler(model, sampling)
            done[sampling] = (default, *default(SOURCE, LIMITS, ROWS))
        return done[sampling]

    return get


@pytest.mark.parametrize(
    "sampling",
    [
        # ~13 s each: make test keeps the filtered one (top-k and top-p on the same paths); make test-all runs both
        pytest.param(Sampling(topk=0, temperature=1.5, seed=3), marks=pytest.mark.slow),
        FILTERED,
    ],
)
def test_a_sentence_samples_the_same_whatever_the_decoding(sampling, model, samples):
    """The growing cache with finished sentences dropped, fixed buffers, XLA, no cache, and each sentence decoded
    alone (its row id kept) give the same ids; another seed or row id gives another sample."""
    limits, rows = LIMITS, ROWS
    # one function for the calls below with its settings: fewer traces
    default, ids, scores = samples(sampling)
    lengths = (ids != PAD_ID).sum(axis=1)
    assert (lengths <= np.array(limits) + 1).all() and lengths[2] == 1
    for kwargs, atol in (
        (dict(static_shapes=True), 1e-5),
        (dict(static_shapes=True, jit_compile=True), 1e-4),
        (dict(use_cache=False), 1e-5),
    ):
        other_ids, other_scores = sampled(model, SOURCE, limits, sampling, rows, **kwargs)
        np.testing.assert_array_equal(ids, other_ids)
        np.testing.assert_allclose(scores, other_scores, atol=atol)
    for i in range(len(SOURCE)):  # alone in its batch, with its row id
        alone_ids, _ = default(SOURCE[i : i + 1], limits[i : i + 1], rows[i : i + 1])
        np.testing.assert_array_equal(alone_ids[0], ids[i])
    reseeded, _ = sampled(model, SOURCE, limits, dataclasses.replace(sampling, seed=4), rows)
    renumbered, _ = default(SOURCE, limits, [20, 21, 22, 23])
    assert (reseeded != ids).any() and (renumbered != ids).any()


def test_sampled_scores_are_the_models_log_probabilities(model, samples):
    """Scores are the untempered, uncut log-probabilities of the drawn tokens (PAD and BOS forbidden, as the step
    adapters do), from a full forward pass in float64: the draws of FILTERED (tempered, top-k and top-p cut)."""
    limits = LIMITS
    _, ids, scores = samples(FILTERED)
    for row, (tokens, score) in enumerate(zip(ids, scores)):
        length = int((tokens != PAD_ID).sum())
        target_in = np.concatenate([[BOS_ID], tokens[: length - 1]])[np.newaxis].astype(np.int32)
        inputs = {"source": tf.constant([SOURCE[row]]), "target_in": tf.constant(target_in)}
        logits = model(inputs).numpy()[0].astype(np.float64)
        logits[:, [PAD_ID, BOS_ID]] = -np.inf
        top = logits.max(axis=1, keepdims=True)
        log_probs = logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))
        expected = log_probs[np.arange(length), tokens[:length]]
        if (
            length == limits[row] + 1 and tokens[length - 1] == EOS_ID
        ):  # EOS forced at the limit: probability 1
            expected[-1] = 0.0
        assert score == pytest.approx(expected.sum(), abs=1e-4)


def test_sampling_needs_a_beam_of_one(model):
    with pytest.raises(ValueError, match="beam_size must be 1"):
        decode_batch(
            model,
            tf.constant(SOURCE),
            tf.constant([2, 2, 2, 2]),
            max_length=4,
            beam_size=2,
            sampling=Sampling(),
        )
