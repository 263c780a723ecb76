"""transformer.model: invariances (causality, padding, cached == full), gradients, precision, serialization."""

import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.transformer.model_configs import tiny_config
from tests.transformer.test_layers import sublayers_reference
from transformer.model import Transformer, build_model
from transformer.residual import normalize
from transformer.vocab import BOS_ID, PAD_ID

VOCAB = 40


def batch(seed=0, source_length=7, target_length=20):
    rng = np.random.default_rng(seed)
    source = rng.integers(4, VOCAB, size=(2, source_length)).astype(np.int32)
    source[1, source_length - 3 :] = PAD_ID
    target = rng.integers(4, VOCAB, size=(2, target_length)).astype(np.int32)
    target[:, 0] = BOS_ID
    target[1, target_length - 4 :] = PAD_ID
    return tf.constant(source), tf.constant(target)


@pytest.fixture(scope="module")
def model():
    return build_model(tiny_config(num_layers=2), VOCAB, VOCAB)


@pytest.fixture(scope="module")
def pre_ln_model():
    return build_model(tiny_config(norm="pre"), VOCAB, VOCAB)


def test_build_model_is_built_and_returns_float32_logits(model):
    assert model.built and len(model.trainable_variables) > 0
    source, target = batch()
    logits = model({"source": source, "target_in": target})
    assert logits.shape == (2, 20, VOCAB) and logits.dtype == tf.float32
    assert model.encode(source).shape == (2, 7, 32)


def test_decoder_is_causal(model):
    source, target = batch(1)
    logits = model({"source": source, "target_in": target}).numpy()
    for t in (0, 5, 12):
        changed = target.numpy().copy()
        changed[:, t + 1 :] = np.random.default_rng(t).integers(4, VOCAB, size=changed[:, t + 1 :].shape)
        new_logits = model({"source": source, "target_in": tf.constant(changed)}).numpy()
        np.testing.assert_allclose(new_logits[:, : t + 1], logits[:, : t + 1], atol=1e-5)
        assert not np.allclose(new_logits[:, t + 1 :], logits[:, t + 1 :], atol=1e-3)


def test_extra_source_padding_changes_nothing(model):
    source, target = batch(2)
    logits = model({"source": source, "target_in": target})
    padded = tf.pad(source, [[0, 0], [0, 5]], constant_values=PAD_ID)
    np.testing.assert_allclose(
        model({"source": padded, "target_in": target}).numpy(), logits.numpy(), atol=1e-5
    )


@pytest.mark.parametrize("overrides", [None, {"norm": "pre", "share_qkv": "qk", "tie_output": False}])
def test_cached_decoding_equals_full_forward(model, overrides):
    if overrides is not None:
        model = build_model(tiny_config(**overrides), VOCAB, VOCAB)
    source, target = batch(3)
    target = tf.where(target == PAD_ID, 5, target)  # decoding never feeds padding
    logits = model({"source": source, "target_in": target}).numpy()
    cache = model.init_cache(source, model.encode(source), 20)
    step = tf.function(model.decode_step, autograph=False)
    for i in range(20):
        step_logits, cache = step(target[:, i], cache, tf.constant(i))
        assert step_logits.shape == (2, VOCAB) and step_logits.dtype == tf.float32
        np.testing.assert_allclose(step_logits.numpy(), logits[:, i], atol=1e-5)
    assert step.experimental_get_tracing_count() == 1  # one trace for every index


def test_cache_parts_and_shapes(model):
    source, _ = batch()
    cache = model.init_cache(source, model.encode(source), 12)
    for tensor in tf.nest.flatten(cache):
        assert tensor.shape[0] == 2  # every part starts at the batch size; a search tiles only "self"
    assert [c["k"].shape for c in cache["self"]] == [(2, 4, 12, 8)] * 2
    assert [c["v"].shape for c in cache["memory"]["cross"]] == [(2, 4, 7, 8)] * 2
    assert cache["memory"]["source_mask"].shape == (2, 1, 1, 7)
    with pytest.raises(ValueError):
        model.init_cache(source, model.encode(source), 33)


def test_beam_rows_share_their_sentence_memory(model):
    """Rows b * k .. b * k + k - 1 decoded against the untiled memory == the same rows against a tiled memory."""
    source, target = batch(4, target_length=6)
    target = tf.where(target == PAD_ID, 5, target)
    k = 3
    tokens = tf.repeat(target, k, axis=0)  # (B * k, T); make the rows of one sentence differ:
    tokens = tf.tensor_scatter_nd_update(tokens, [[1, 2], [4, 3]], [7, 9])
    cache = model.init_cache(source, model.encode(source), 6)
    shared = {
        "memory": cache["memory"],
        "self": tf.nest.map_structure(lambda x: tf.repeat(x, k, 0), cache["self"]),
    }
    tiled = tf.nest.map_structure(lambda x: tf.repeat(x, k, 0), cache)
    full = model({"source": tf.repeat(source, k, axis=0), "target_in": tokens}).numpy()
    for i in range(6):
        shared_logits, shared = model.decode_step(tokens[:, i], shared, i)
        tiled_logits, tiled = model.decode_step(tokens[:, i], tiled, i)
        assert shared["memory"]["cross"][0]["k"].shape[0] == 2
        np.testing.assert_allclose(shared_logits.numpy(), tiled_logits.numpy(), atol=1e-5)
        np.testing.assert_allclose(shared_logits.numpy(), full[:, i], atol=1e-5)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {
            "norm": "pre",
            "share_embeddings": False,
            "tie_output": False,
            "share_qkv": "all",
            "attention": "chunked",
            "attention_dropout": 0.1,
            "dropout": 0.1,
        },
    ],
)
def test_gradients_reach_every_trainable_variable(overrides):
    model = build_model(tiny_config(**overrides), VOCAB, VOCAB)
    source, target = batch(4)
    labels = tf.concat([target[:, 1:], tf.fill([2, 1], 3)], axis=1)
    with tf.GradientTape() as tape:
        logits = model({"source": source, "target_in": target}, training=True)
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
    variables = model.trainable_variables
    gradients = tape.gradient(loss, variables)
    assert len({id(v) for v in variables}) == len(variables)
    for variable, gradient in zip(variables, gradients):
        assert gradient is not None, variable.path
        assert np.abs(tf.convert_to_tensor(gradient).numpy()).max() > 0, variable.path


@pytest.mark.parametrize("policy, tolerance", [("mixed_float16", 0.02), ("mixed_bfloat16", 0.15)])
def test_mixed_precision_is_finite_with_all_padding_rows(pre_ln_model, policy, tolerance):
    reference = pre_ln_model
    keras.mixed_precision.set_global_policy(policy)
    model = build_model(tiny_config(norm="pre"), VOCAB, VOCAB)
    model.set_weights(reference.get_weights())
    source, target = batch(5)
    source = tf.tensor_scatter_nd_update(source, [[0]], tf.fill([1, 7], PAD_ID))
    target = tf.tensor_scatter_nd_update(target, [[1]], tf.fill([1, 20], PAD_ID))
    logits = model({"source": source, "target_in": target})
    assert logits.dtype == tf.float32
    assert np.isfinite(logits.numpy()).all()
    expected = reference({"source": source, "target_in": target}).numpy()
    np.testing.assert_allclose(logits.numpy(), expected, atol=tolerance)
    step_logits, _ = model.decode_step(target[:, 0], model.init_cache(source, model.encode(source), 4), 0)
    assert step_logits.dtype == tf.float32 and np.isfinite(step_logits.numpy()).all()
    # The decoders' bias forbidding PAD and BOS (-1e9, beyond float16's range): finite, far below the others
    forbid = tf.tensor_scatter_nd_update(tf.zeros([VOCAB]), [[PAD_ID], [BOS_ID]], [-1e9, -1e9])
    cache = model.init_cache(source, model.encode(source), 4)
    biased, _ = model.decode_step(target[:, 0], cache, 0, logit_bias=forbid)
    biased = biased.numpy()
    assert np.isfinite(biased).all() and biased[:, [PAD_ID, BOS_ID]].max() < -3e4
    allowed = np.ones(VOCAB, bool)
    allowed[[PAD_ID, BOS_ID]] = False
    np.testing.assert_array_equal(biased[:, allowed], step_logits.numpy()[:, allowed])


def encoder_layer_reference(layer, x, mask, norm, residual):
    attend = (lambda h: layer.self_attention(h, h, h, mask=mask)[0], layer.self_attention_norm)
    return sublayers_reference(x, [attend, (layer.feed_forward, layer.feed_forward_norm)], norm, residual)


def decoder_layer_reference(layer, x, memory, self_mask, memory_mask, norm, residual):
    sublayers = [
        (lambda h: layer.self_attention(h, h, h, mask=self_mask)[0], layer.self_attention_norm),
        (lambda h: layer.cross_attention(h, memory, memory, mask=memory_mask)[0], layer.cross_attention_norm),
        (layer.feed_forward, layer.feed_forward_norm),
    ]
    return sublayers_reference(x, sublayers, norm, residual)


def logits_reference(model, source, target, norm, residual):
    """`model`'s logits composed by hand from its layers' sublayers with the norm placement and residual flag given
    (never read from the model or its layers, which would hide a setting that does not reach them)."""
    source_mask, target_mask = model.source_mask(source), model.target_mask(target)
    memory = model.source_embedding(source)
    for layer in model.encoder_layers:
        memory = encoder_layer_reference(layer, memory, source_mask, norm, residual)
    x = model.target_embedding(target)
    if norm == "pre":
        memory = normalize(model.encoder_norm, memory)
    for layer in model.decoder_layers:
        x = decoder_layer_reference(layer, x, memory, target_mask, source_mask, norm, residual)
    if norm == "pre":
        x = normalize(model.decoder_norm, x)
    return model._logits(x).numpy()


@pytest.mark.parametrize(
    "overrides", [{"residual": False}, {"norm": "pre"}, {"norm": "pre", "residual": False}]
)
def test_norm_and_residual_reach_every_layer(overrides):
    """`model.norm` and `model.residual` (the pre_ln and no_residual ablations) are those of every layer, and the
    logits are the model's sublayers composed by hand with that placement, not with the default one."""
    config = tiny_config(**overrides)
    model = build_model(config, VOCAB, VOCAB)
    for layer in (*model.encoder_layers, *model.decoder_layers):
        assert (layer.norm, layer.residual) == (config.norm, config.residual)
    source, target = batch(11, target_length=6)
    logits = model({"source": source, "target_in": target}).numpy()
    expected = logits_reference(model, source, target, config.norm, config.residual)
    np.testing.assert_allclose(logits, expected, atol=1e-4)
    # The setting matters for these inputs: the default placement gives other logits
    assert not np.allclose(logits, logits_reference(model, source, target, "post", True), atol=1e-2)


def test_config_round_trip(model):
    config = model.get_config()
    assert config["d_model"] == 32 and config["max_length"] == 32 and config["mask_fill"] == "auto"
    arguments = set(inspect.signature(Transformer.__init__).parameters) - {"self", "kwargs"}
    assert arguments <= set(config), f"get_config misses {arguments - set(config)}"
    clone = Transformer.from_config(config)
    assert clone.get_config() == config
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(model))
    assert isinstance(restored, Transformer) and restored.get_config() == config
    source, target = batch(6)
    clone({"source": source, "target_in": target})
    clone.set_weights(model.get_weights())
    np.testing.assert_array_equal(
        clone({"source": source, "target_in": target}).numpy(),
        model({"source": source, "target_in": target}).numpy(),
    )


def test_checkpoint_round_trip(model, tmp_path):
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    saved = {name for name, _ in tf.train.list_variables(path) if name.startswith("model/")}
    assert len(saved) == len(model.variables), "every variable must be in the checkpoint"
    fresh = build_model(tiny_config(num_layers=2), VOCAB, VOCAB)
    tf.train.Checkpoint(model=fresh).restore(path).assert_existing_objects_matched()
    source, target = batch(7)
    np.testing.assert_array_equal(
        fresh({"source": source, "target_in": target}).numpy(),
        model({"source": source, "target_in": target}).numpy(),
    )


def test_embedding_sharing_rules():
    with pytest.raises(ValueError, match="vocab"):
        Transformer(source_vocab_size=40, target_vocab_size=48, share_embeddings=True)
    shared = Transformer(
        source_vocab_size=40, target_vocab_size=40, d_model=16, num_heads=2, d_ff=16, num_layers=1
    )
    assert shared.source_embedding is shared.target_embedding
    model = build_model(tiny_config(share_embeddings=False, tie_output=True), 40, 48)
    assert model.source_embedding is not model.target_embedding
    source, target = batch(8)
    assert model({"source": source, "target_in": target}).shape == (2, 20, 48)


def test_cross_attention_weights(model):
    source, target = batch(9)
    weights = model.cross_attention(source, target)
    assert len(weights) == 2
    for w in weights:
        assert w.shape == (2, 4, 20, 7)
        np.testing.assert_allclose(w.numpy().sum(-1), 1.0, atol=1e-5)
        assert (w.numpy()[1, :, :, 4:] == 0).all()  # padded source positions


def test_chunked_encoder_equals_full_encoder(model):
    chunked = build_model(tiny_config(num_layers=2, attention="chunked", chunk_size=3), VOCAB, VOCAB)
    chunked.set_weights(model.get_weights())
    source, target = batch(10)
    np.testing.assert_allclose(
        chunked({"source": source, "target_in": target}).numpy(),
        model({"source": source, "target_in": target}).numpy(),
        atol=1e-5,
    )


def test_set_dropout_trains_as_a_model_built_with_that_rate():
    """`set_dropout` after building == building with the rate (same weights, same seeds): every dropout layer's
    rate and the configs change; the attention dropout stays."""
    source, target = batch()
    inputs = {"source": source, "target_in": target}

    def build(rate):
        keras.utils.set_random_seed(7)  # the same weights and dropout seed generators for every model
        return build_model(tiny_config(num_layers=2, dropout=rate, attention_dropout=0.2), VOCAB, VOCAB)

    changed, reference = build(0.1), build(0.3)
    before = changed(inputs, training=True)
    changed = build(0.1)  # fresh seed generators
    changed.set_dropout(0.3)
    np.testing.assert_array_equal(changed(inputs, training=True), reference(inputs, training=True))
    assert not np.array_equal(before, reference(inputs, training=True))  # 0.1 and 0.3 draw other masks
    assert changed.get_config()["dropout"] == 0.3 and changed.get_config()["attention_dropout"] == 0.2
    assert changed.encoder_layers[0].get_config()["dropout"] == 0.3
    assert changed.decoder_layers[1].feed_forward.get_config()["dropout"] == 0.3
    assert changed.source_embedding.get_config()["dropout"] == 0.3
    assert {layer.self_attention.dropout for layer in changed.decoder_layers} == {0.2}
    with pytest.raises(ValueError, match="dropout rate must be in"):
        changed.set_dropout(1.0)
    assert changed.dropout == 0.3  # refused: nothing changed


def test_ffn_dropout_fixes_the_feed_forward_rate():
    """`ffn_dropout` None follows `dropout` (the same masks as naming the rate), a number fixes the feed-forward
    hidden dropout: `set_dropout` leaves it, and 0 makes the feed-forward block deterministic in training."""
    source, target = batch()
    inputs = {"source": source, "target_in": target}

    def build(**overrides):
        keras.utils.set_random_seed(7)
        return build_model(tiny_config(num_layers=2, dropout=0.3, **overrides), VOCAB, VOCAB)

    following, named, fixed = build(), build(ffn_dropout=0.3), build(ffn_dropout=0.0)
    np.testing.assert_array_equal(following(inputs, training=True), named(inputs, training=True))
    assert not np.array_equal(build()(inputs, training=True), fixed(inputs, training=True))
    fixed.set_dropout(0.1)
    following.set_dropout(0.1)
    x = tf.random.stateless_normal((2, 5, 32), seed=(1, 2))
    for layer in (*fixed.encoder_layers, *fixed.decoder_layers):
        assert layer.feed_forward.dropout == 0.0 and layer.residual_dropout.rate == 0.1
        np.testing.assert_array_equal(
            layer.feed_forward(x, training=True), layer.feed_forward(x, training=False)
        )
    assert {layer.feed_forward.dropout for layer in following.decoder_layers} == {0.1}
    config = fixed.get_config()
    assert (
        config["ffn_dropout"] == 0.0 and Transformer.from_config(config).encoder_layers[0].ffn_dropout == 0.0
    )


def test_set_ffn_dropout_trains_as_a_model_built_with_that_ffn_dropout():
    """`set_ffn_dropout` gives the masks of a model built with ``ffn_dropout`` at that rate, and fixes it: a later
    `set_dropout` moves the residual dropout only. A block built at rate 0 cannot be raised (no random state)."""
    source, target = batch()
    inputs = {"source": source, "target_in": target}

    def build(**overrides):
        keras.utils.set_random_seed(7)
        return build_model(tiny_config(num_layers=2, dropout=0.3, **overrides), VOCAB, VOCAB)

    reference, changed = build(ffn_dropout=0.1), build()
    changed.set_ffn_dropout(0.1)
    np.testing.assert_array_equal(changed(inputs, training=True), reference(inputs, training=True))
    changed.set_dropout(0.2)
    assert changed.ffn_dropout == 0.1 and changed.dropout == 0.2
    for layer in (*changed.encoder_layers, *changed.decoder_layers):
        assert layer.ffn_dropout == 0.1 and layer.feed_forward.hidden_dropout.rate == 0.1
        assert layer.residual_dropout.rate == 0.2
    with pytest.raises(ValueError, match="built with dropout 0"):
        build(ffn_dropout=0.0).set_ffn_dropout(0.1)
