"""`transformer.ensemble.Ensemble`: the mean of its members' probabilities, against NumPy, in every decoding path."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from nmt.batch_decoding import decode_batch
from tests.transformer.model_configs import tiny_config
from transformer.ensemble import Ensemble
from transformer.model import build_model
from transformer.vocab import BOS_ID, EOS_ID, PAD_ID

VOCAB = 32
SOURCE = tf.constant([[5, 9, 12, 7, EOS_ID], [6, 8, EOS_ID, PAD_ID, PAD_ID], [11, 4, 20, EOS_ID, PAD_ID]])


def members(count=2, **overrides):
    models = []
    for seed in range(count):
        # seeds 104 and 105: the greedy search of their mean distribution differs from each member's (of 100 and
        # 101 it was the first member's: decoding with that member alone would have passed)
        keras.utils.set_random_seed(104 + seed)
        config = tiny_config(d_model=16, num_heads=2, d_ff=32, max_length=16, **overrides)
        models.append(build_model(config, VOCAB, VOCAB))
    return models


@pytest.fixture(scope="module")
def alike():
    """Three members of one architecture (`members(3)`), built once: decoding and forward passes leave them as they
    are. `alike[:k]` is `members(k)`."""
    return members(3)


def numpy_log_mean_prob(logits_list) -> np.ndarray:
    logits = np.stack([np.asarray(x, np.float64) for x in logits_list])
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.log(probs.mean(0))


def test_the_forward_pass_is_the_log_of_the_mean_probability(alike):
    models = alike
    inputs = {
        "source": SOURCE,
        "target_in": tf.constant([[BOS_ID, 7, 9], [BOS_ID, 5, PAD_ID], [BOS_ID, 4, 4]]),
    }
    expected = numpy_log_mean_prob([m(inputs).numpy() for m in models])
    np.testing.assert_allclose(Ensemble(models)(inputs).numpy(), expected, atol=2e-5)


def numpy_greedy(models, steps):
    """Greedy search of every SOURCE row by full forward passes over the prefixes (the rows side by side: one pass
    per member and step), each member's probabilities averaged in float64, PAD and BOS never produced (as the step
    adapters forbid them); each row's ids up to its EOS. The decoder is causal: what a row is fed after its EOS
    changes nothing before it."""
    prefixes = np.full((SOURCE.shape[0], 1), BOS_ID, np.int32)
    for _ in range(steps):
        last = [m({"source": SOURCE, "target_in": tf.constant(prefixes)}).numpy()[:, -1] for m in models]
        scores = numpy_log_mean_prob(last)  # (rows, V)
        scores[:, [PAD_ID, BOS_ID]] = -np.inf
        prefixes = np.concatenate([prefixes, scores.argmax(-1)[:, None].astype(np.int32)], axis=1)
        if (prefixes == EOS_ID).any(axis=1).all():
            break
    return [row[: row.index(EOS_ID) + 1] if EOS_ID in row else row for row in prefixes[:, 1:].tolist()]


def assert_greedy_follows_numpy(models, options, expected, steps=6):
    """The ensemble's greedy search (`options` of decode_batch) against `numpy_greedy`'s `expected`; its ids."""
    limits = tf.fill([SOURCE.shape[0]], steps)
    ids, _ = decode_batch(Ensemble(models), SOURCE, limits, max_length=steps + 1, beam_size=1, **options)
    for row, expected_row in enumerate(expected):
        got = [t for t in ids[row, 0].numpy().tolist() if t != PAD_ID]
        assert got[: len(expected_row)] == expected_row, (row, got, expected_row)
    return ids


@pytest.fixture(scope="module")
def alike_greedy(alike):
    """`numpy_greedy` of `alike[:2]` over 6 steps, and each member's own greedy ids: the same for every decoding
    path of their ensemble, computed once."""
    limits = tf.fill([SOURCE.shape[0]], 6)
    single = [decode_batch(m, SOURCE, limits, max_length=7, beam_size=1)[0].numpy() for m in alike[:2]]
    return numpy_greedy(alike[:2], 6), single


@pytest.mark.parametrize(
    "options",
    [dict(use_cache=True), dict(use_cache=True, static_shapes=True), dict(use_cache=False)],
    ids=["growing-cache", "static-cache", "no-cache"],
)
def test_greedy_decoding_follows_the_averaged_distribution(options, alike, alike_greedy):
    expected, single = alike_greedy
    ids = assert_greedy_follows_numpy(alike[:2], options, expected)
    assert not any((ids.numpy() == s).all() for s in single), "the ensemble decodes like one of its members"


def test_an_ensemble_of_one_model_decodes_as_the_model(alike):
    model = alike[0]
    limits = tf.fill([SOURCE.shape[0]], 8)
    alone = decode_batch(model, SOURCE, limits, max_length=10, beam_size=3, alpha=0.6)
    ensemble = decode_batch(Ensemble([model]), SOURCE, limits, max_length=10, beam_size=3, alpha=0.6)
    np.testing.assert_array_equal(ensemble[0].numpy(), alone[0].numpy())
    np.testing.assert_allclose(ensemble[1].numpy(), alone[1].numpy(), atol=1e-5)


def test_beam_search_cached_full_and_xla_paths_agree(alike):
    """Beam search of the growing cache (the default), of the full recompute and of the static-shape form under
    `jit_compile` (as the translator's XLA path runs it): the same hypotheses; greedy under XLA too."""
    ensemble = Ensemble(alike[:2])
    limits = tf.fill([SOURCE.shape[0]], 6)

    def xla(beam):
        return tf.function(
            lambda: decode_batch(
                ensemble, SOURCE, limits, max_length=8, beam_size=beam, alpha=1.0, static_shapes=True
            ),
            jit_compile=True,
            autograph=False,
        )()

    cached = decode_batch(ensemble, SOURCE, limits, max_length=8, beam_size=3, alpha=1.0)
    full = decode_batch(ensemble, SOURCE, limits, max_length=8, beam_size=3, alpha=1.0, use_cache=False)
    greedy = decode_batch(ensemble, SOURCE, limits, max_length=8, beam_size=1)
    for expected, got in ((cached, full), (cached, xla(3)), (greedy, xla(1))):
        np.testing.assert_array_equal(got[0].numpy(), expected[0].numpy())
        np.testing.assert_allclose(got[1].numpy(), expected[1].numpy(), atol=1e-4)


def test_members_must_share_the_vocabularies(alike):
    keras.utils.set_random_seed(1)
    config = tiny_config(d_model=16, num_heads=2, d_ff=32, max_length=16, share_embeddings=False)
    other = build_model(config, VOCAB, VOCAB + 8)
    with pytest.raises(ValueError, match="different vocabulary sizes"):
        Ensemble([alike[0], other])
    with pytest.raises(ValueError, match="at least one model"):
        Ensemble([])
    with pytest.raises(ValueError, match="inference only"):
        Ensemble(alike[:1])({"source": SOURCE, "target_in": SOURCE}, training=True)


def unlike_members():
    """Two models of one vocabulary and nothing else in common: width, heads, depth, Pre-/Post-LN, attention kind,
    untied output projection, position table."""
    shapes = [
        dict(d_model=16, num_heads=2, d_ff=32, num_layers=2, norm="pre", max_length=20),
        dict(d_model=24, num_heads=3, d_ff=40, num_layers=1, norm="post", attention="local", window=2,
             tie_output=False, max_length=8),  # the shorter table second: the ensemble's is the shortest
    ]  # fmt: skip
    models = []
    for seed, shape in enumerate(shapes):
        keras.utils.set_random_seed(200 + seed)
        models.append(build_model(tiny_config(**shape), VOCAB, VOCAB))
    return models


@pytest.mark.parametrize(
    "options",
    [
        dict(use_cache=True),
        # ~10 s each: make test keeps the default (growing) cache; the static and no-cache paths of an ensemble of
        # alike members stay in test_greedy_decoding_follows_the_averaged_distribution
        pytest.param(dict(use_cache=True, static_shapes=True), marks=pytest.mark.slow),
        pytest.param(dict(use_cache=False), marks=pytest.mark.slow),
    ],
    ids=["growing-cache", "static-cache", "no-cache"],
)
def test_members_of_other_architectures_decode_the_averaged_distribution(options):
    models = unlike_members()
    assert Ensemble(models).max_length == 8  # the positions every member has
    steps = 6
    limits = tf.fill([SOURCE.shape[0]], steps)
    ids = assert_greedy_follows_numpy(models, options, numpy_greedy(models, steps), steps)
    single = [decode_batch(m, SOURCE, limits, max_length=steps + 1, beam_size=1)[0].numpy() for m in models]
    assert not any((ids.numpy() == s).all() for s in single), "the ensemble decodes like one of its members"
    beam = decode_batch(
        Ensemble(models), SOURCE, limits, max_length=steps + 1, beam_size=3, alpha=1.0, **options
    )
    full = decode_batch(Ensemble(models), SOURCE, limits, max_length=steps + 1, beam_size=3, alpha=1.0,
                        use_cache=False)  # fmt: skip
    np.testing.assert_array_equal(beam[0].numpy(), full[0].numpy())
