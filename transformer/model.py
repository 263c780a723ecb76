"""The encoder-decoder Transformer and `build_model`, the one place that reads a config."""

import keras
import tensorflow as tf

from transformer.attention import causal_mask, padding_mask
from transformer.decoder_layer import DecoderLayer
from transformer.encoder_layer import EncoderLayer
from transformer.positional import TokenAndPositionEmbedding
from transformer.residual import NORMS, layer_norm, normalize
from transformer.vocab import PAD_ID

# The constructor arguments that describe the architecture, in `get_config` and read from a config by `build_model`
# (the vocabulary sizes and `pad_id` come from elsewhere); `OPTIONAL` ones may be absent from a config.
ARCHITECTURE = (
    "d_model", "num_heads", "d_ff", "num_layers", "dropout", "attention_dropout", "ffn_dropout", "norm", "residual",
    "share_embeddings", "tie_output", "share_qkv", "attention", "chunk_size", "window", "scale", "mask_fill",
    "soft_cap", "max_length",
)  # fmt: skip
OPTIONAL = {"soft_cap": None, "ffn_dropout": None}


@keras.saving.register_keras_serializable(package="transformer")
class Transformer(keras.Model):
    """Encoder-decoder Transformer for translation (Vaswani et al., 2017).

    ``source -> TokenAndPositionEmbedding -> num_layers x EncoderLayer -> memory``;
    ``target_in -> TokenAndPositionEmbedding -> num_layers x DecoderLayer(memory) -> output projection -> logits``.
    All masks are explicit: source padding ``(B, 1, 1, S)`` from ``pad_id``; decoder self-attention is causal and
    target padding ``(B, 1, T, T)``. Logits are always float32 (a tied output projection runs in the compute dtype
    and is cast to float32 after it; an untied one runs in float32), as are the softmaxes and LayerNorms, so the
    model works under ``mixed_float16`` and ``mixed_bfloat16`` policies.

    Args:
        source_vocab_size, target_vocab_size: ints.
        d_model: int, model width (default 256).
        num_heads: int, attention heads (default 4).
        d_ff: int, feed-forward hidden width (default 1024).
        num_layers: int, encoder and decoder layers each (default 3).
        dropout: float, embedding, residual and feed-forward dropout (default 0.1).
        attention_dropout: float, dropout on attention weights (default 0.0).
        ffn_dropout: optional float, dropout on the feed-forward hidden activations; None (default) = ``dropout``,
            and `set_dropout` changes it with the rest.
        norm: ``"post"`` (default) or ``"pre"`` (Pre-LN adds a final LayerNorm on each stack output).
        residual: bool, False removes residual connections (ablation).
        share_embeddings: bool, one embedding matrix for source and target; requires equal vocab sizes.
        tie_output: bool, the output projection is the transposed target embedding (no bias); else a Dense layer.
        share_qkv: ``"none" | "qk" | "all"``, projection sharing in every self-attention.
        attention: ``"full" | "chunked" | "local"`` for the encoder self-attention (decoder: always causal full).
        chunk_size, window: for chunked and local attention.
        scale: optional float overriding ``1 / sqrt(depth)`` in every attention.
        mask_fill: ``"auto"`` or a float (legacy additive fill, ablations only; needs ``attention="full"``).
        soft_cap: optional float, tanh logit cap in every attention.
        max_length: int, size of the position table (longest source, and longest decoder input).
        pad_id: int, padding id (default ``PAD_ID``).

    Call arguments:
        inputs: ``{"source": int32 (B, S), "target_in": int32 (B, T)}``.
        training: bool.

    Returns:
        logits ``(B, T, target_vocab_size)`` float32.

    Decoding API (used by `transformer.step_fns`): `encode`, `init_cache`, `decode_step`; plus `decode` (the full
    decoder pass over a given memory) and `cross_attention` (weights for plotting).
    """

    def __init__(
        self,
        *,
        source_vocab_size,
        target_vocab_size,
        d_model=256,
        num_heads=4,
        d_ff=1024,
        num_layers=3,
        dropout=0.1,
        attention_dropout=0.0,
        ffn_dropout=None,
        norm="post",
        residual=True,
        share_embeddings=True,
        tie_output=True,
        share_qkv="none",
        attention="full",
        chunk_size=64,
        window=16,
        scale=None,
        mask_fill="auto",
        soft_cap=None,
        max_length=512,
        pad_id=PAD_ID,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if share_embeddings and source_vocab_size != target_vocab_size:
            raise ValueError(
                "share_embeddings=True requires equal vocab sizes, got "
                f"source_vocab_size={source_vocab_size}, target_vocab_size={target_vocab_size}"
            )
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
        self.source_vocab_size = source_vocab_size
        self.target_vocab_size = target_vocab_size
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_ff = d_ff
        self.num_layers = num_layers
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.ffn_dropout = ffn_dropout
        self.norm = norm
        self.residual = residual
        self.share_embeddings = share_embeddings
        self.tie_output = tie_output
        self.share_qkv = share_qkv
        self.attention = attention
        self.chunk_size = chunk_size
        self.window = window
        self.scale = scale
        self.mask_fill = mask_fill
        self.soft_cap = soft_cap
        self.max_length = max_length
        self.pad_id = pad_id

        policy = self.dtype_policy
        embedding = dict(d_model=d_model, max_length=max_length, dropout=dropout, dtype=policy)
        self.source_embedding = TokenAndPositionEmbedding(
            vocab_size=source_vocab_size, name="source_embedding", **embedding
        )
        if share_embeddings:
            self.target_embedding = self.source_embedding
        else:
            self.target_embedding = TokenAndPositionEmbedding(
                vocab_size=target_vocab_size, name="target_embedding", **embedding
            )
        layer = dict(
            d_model=d_model,
            num_heads=num_heads,
            d_ff=d_ff,
            dropout=dropout,
            attention_dropout=attention_dropout,
            ffn_dropout=ffn_dropout,
            norm=norm,
            residual=residual,
            share_qkv=share_qkv,
            scale=scale,
            mask_fill=mask_fill,
            soft_cap=soft_cap,
            dtype=policy,
        )
        # One attribute per layer (not a list): tf.train.Checkpoint does not see Keras-tracked lists.
        for i in range(num_layers):
            encoder_layer = EncoderLayer(
                attention=attention, chunk_size=chunk_size, window=window, name=f"encoder_layer_{i}", **layer
            )
            setattr(self, f"encoder_layer_{i}", encoder_layer)
        for i in range(num_layers):
            setattr(self, f"decoder_layer_{i}", DecoderLayer(name=f"decoder_layer_{i}", **layer))
        if norm == "pre":
            self.encoder_norm = layer_norm("encoder_norm")
            self.decoder_norm = layer_norm("decoder_norm")
        if not tie_output:
            self.output_projection = keras.layers.Dense(
                target_vocab_size, name="output_projection", dtype="float32"
            )

    @property
    def encoder_layers(self):
        """The `EncoderLayer`s, bottom first."""
        return [getattr(self, f"encoder_layer_{i}") for i in range(self.num_layers)]

    @property
    def decoder_layers(self):
        """The `DecoderLayer`s, bottom first."""
        return [getattr(self, f"decoder_layer_{i}") for i in range(self.num_layers)]

    def build(self, inputs_shape=None):
        ids_shape = (None, None)
        x_shape = (None, None, self.d_model)
        for embedding in {id(e): e for e in (self.source_embedding, self.target_embedding)}.values():
            if not embedding.built:
                embedding.build(ids_shape)
        for layer in self.encoder_layers:
            layer.build(x_shape)
        for layer in self.decoder_layers:
            layer.build(x_shape, x_shape)
        if self.norm == "pre":
            self.encoder_norm.build(x_shape)
            self.decoder_norm.build(x_shape)
        if not self.tie_output:
            self.output_projection.build(x_shape)
        self.built = True

    def set_dropout(self, rate):
        """Changes `dropout` (embeddings, residuals, feed-forward unless `ffn_dropout` is set; not
        `attention_dropout`) in every layer. A compiled
        function that already traced the model keeps the old rate: trace it again."""
        embeddings = (self.source_embedding, self.target_embedding)  # the same layer twice when shared
        for layer in (*embeddings, *self.encoder_layers, *self.decoder_layers):
            layer.set_dropout(rate)
        self.dropout = rate

    def set_ffn_dropout(self, rate):
        """Fixes the feed-forward hidden dropout of every layer at `rate`, as building with ``ffn_dropout=rate``
        would (`set_dropout` leaves it from then on). A layer built with a rate of 0 has no random state to raise it
        with. A compiled function that already traced the model keeps the old rate: trace it again."""
        for layer in (*self.encoder_layers, *self.decoder_layers):
            layer.set_ffn_dropout(rate)
        self.ffn_dropout = rate

    def call(self, inputs, training=False):
        source, target_in = inputs["source"], inputs["target_in"]
        memory = self.encode(source, training=training)
        return self.decode(target_in, memory, self.source_mask(source), training=training)

    def masked_logits(self, inputs, mask, training=False):
        """Logits of the target positions where ``mask`` is True only, for the training loss on real tokens.

        Args:
            inputs: as for `call`.
            mask: bool ``(B, T)``, e.g. the non-padding positions of ``target_out``.

        Returns:
            logits ``(N, V)``, one row per True position in row-major order (that of
            ``tf.boolean_mask(target_out, mask)``), in the projection's dtype (the compute dtype for a tied
            projection): the loss computes in float32 and casts them itself, or reads them as they are
            (`nmt.losses.token_cross_entropy`'s kernel). The decoder runs over every position as in `call`; only the
            output projection (the largest matmul) skips the others. Not XLA-compilable (``N`` is data-dependent).
        """
        source, target_in = inputs["source"], inputs["target_in"]
        memory = self.encode(source, training=training)
        x, _ = self._decoder_stack(target_in, memory, self.source_mask(source), training)
        return self._logits(tf.boolean_mask(x, mask), float32=False)  # (N, d_model) -> (N, V)

    # -- masks -----------------------------------------------------------------------------------------------------

    def source_mask(self, source):
        """``(B, 1, 1, S)`` bool, True at non-padding source positions."""
        return padding_mask(source, self.pad_id)

    def target_mask(self, target_in):
        """``(B, 1, T, T)`` bool: causal and target padding."""
        length = tf.shape(target_in)[1]
        return tf.logical_and(causal_mask(length)[None, None], padding_mask(target_in, self.pad_id))

    # -- encoder / decoder -----------------------------------------------------------------------------------------

    def encode(self, source, training=False):
        """``source`` int32 ``(B, S)`` -> memory ``(B, S, d_model)`` in the compute dtype."""
        mask = self.source_mask(source)
        x = self.source_embedding(source, training=training)  # (batch, S, d_model)
        for layer in self.encoder_layers:
            x = layer(x, mask=mask, training=training)
        if self.norm == "pre":
            x = normalize(self.encoder_norm, x)
        return x

    def decode(self, target_in, memory, source_mask, training=False):
        """Full decoder pass: ``target_in (B, T)``, ``memory (B, S, d_model)``, ``source_mask (B, 1, 1, S)`` ->
        logits ``(B, T, V)`` float32."""
        x, _ = self._decoder_stack(target_in, memory, source_mask, training)
        return self._logits(x)

    def decode_last(self, target_in, memory, source_mask):
        """Full decoder pass over ``target_in (B, T)``, projecting only the last position -> logits ``(B, V)``."""
        x, _ = self._decoder_stack(target_in, memory, source_mask, False)
        return self._logits(x[:, -1])

    def cross_attention(self, source, target_in):
        """Cross-attention weights for plotting: a list (one per decoder layer) of ``(B, heads, T, S)`` float tensors."""
        memory = self.encode(source)
        _, weights = self._decoder_stack(target_in, memory, self.source_mask(source), False)
        return weights

    def _decoder_stack(self, target_in, memory, source_mask, training):
        self_mask = self.target_mask(target_in)
        x = self.target_embedding(target_in, training=training)  # (batch, T, d_model)
        weights = []
        for layer in self.decoder_layers:
            x, w = layer(x, memory, self_mask=self_mask, memory_mask=source_mask, training=training)
            weights.append(w)
        if self.norm == "pre":
            x = normalize(self.decoder_norm, x)
        return x, weights

    def _logits(self, x, bias=None, float32=True):
        """``(..., d_model)`` -> logits ``(..., V)``, plus ``bias (V,)`` if given (added to the product).

        The projection runs in the compute dtype (it is the largest matmul of the model, so bf16/fp16 pay off
        here most) and the logits are cast to float32 for the softmax and the loss (``float32=False``: left in
        the projection's dtype, for a loss that casts them itself). A 2-D matmul, not an einsum:
        TF's einsum gradient for ``...d,vd->...v`` materialises a ``(..., V, d)`` tensor.
        """
        if self.tie_output:
            embeddings = tf.cast(self.target_embedding.embeddings, x.dtype)  # (V, d_model)
            flat = tf.reshape(x, [-1, tf.shape(x)[-1]])  # (batch * len, d_model)
            logits = tf.matmul(flat, embeddings, transpose_b=True)  # (batch * len, V)
            if bias is not None:  # right after the product, where grappler can fuse it into the matmul
                # within the dtype's range with room for the logit: -1e9 would be -inf in float16 (exp() is 0 either way)
                logits = tf.nn.bias_add(logits, tf.cast(tf.maximum(bias, logits.dtype.min / 2), logits.dtype))
            shape = tf.concat([tf.shape(x)[:-1], tf.shape(embeddings)[:1]], axis=0)
            logits = tf.reshape(logits, shape)
            return tf.cast(logits, tf.float32) if float32 else logits
        logits = tf.cast(self.output_projection(tf.cast(x, tf.float32)), tf.float32)
        return logits if bias is None else logits + tf.cast(bias, tf.float32)

    # -- incremental decoding --------------------------------------------------------------------------------------

    def init_cache(self, source, memory, max_length, growing=False):
        """Decoding cache, in two parts: per-sentence ``"memory"`` (constant) and per-row ``"self"`` (grows).

        Args:
            source: int32 ``(B, S)``.
            memory: ``encode(source)``, ``(B, S, d_model)``.
            max_length: python int, number of decoder positions (``index`` runs over ``0 .. max_length - 1``);
                with ``growing``, only checked, and may be a scalar int32 tensor (one trace for every length).
            growing: False: self K/V buffers of ``max_length`` (static shapes, for XLA). True: empty self K/V
                that ``decode_step(..., growing=True)`` extends by one position per step (not under XLA).

        Returns:
            ``{"memory": {"source_mask": bool (B, 1, 1, S), "cross": [{"k", "v"}, ...]}, "self": [{"k", "v"}, ...]}``,
            one list entry per decoder layer: cross K/V of ``memory`` projected once, ``(B, heads, S, depth)``;
            self K/V zeros ``(B, heads, max_length, depth)``. A search tiles and reorders only ``"self"`` (its
            rows become the ``N = B * beam`` hypotheses) and passes ``"memory"`` unchanged: `decode_step` lets
            row ``n`` attend to sentence ``n // (N // B)`` (see `transformer.step_fns.cached_step_fn`).
        """
        if not tf.is_tensor(max_length) and max_length > self.max_length:
            raise ValueError(
                f"max_length={max_length} exceeds the position table (max_length={self.max_length})"
            )
        layers = [layer.init_cache(memory, 0 if growing else max_length) for layer in self.decoder_layers]
        return {
            "memory": {"source_mask": self.source_mask(source), "cross": [c["cross"] for c in layers]},
            "self": [c["self"] for c in layers],
        }

    def decode_step(self, tokens, cache, index, growing=False, logit_bias=None):
        """One decoding step.

        Args:
            tokens: int32 ``(N,)``, the decoder input at position ``index``; ``N`` is a multiple of the memory's
                ``B``, rows batch-major (row ``n`` belongs to sentence ``n // (N // B)``).
            cache: from `init_cache` or the previous step, ``"self"`` with leading dimension ``N``.
            index: scalar int32 tensor (or python int).
            growing: the cache came from ``init_cache(..., growing=True)`` (self K/V: positions ``< index``).
            logit_bias: optional float ``(V,)`` added to the logits (e.g. a large negative value for tokens that
                must never be produced: `transformer.step_fns`).

        Returns:
            ``(logits (N, V) float32, new_cache)``; the logits equal ``call()``'s at position ``index`` for the same
            prefix.
        """
        index = tf.convert_to_tensor(index, tf.int32)
        memory = cache["memory"]
        x = self.target_embedding(tokens[:, None], start_index=index)  # (N, 1, d_model)
        new_self = []
        for layer, self_cache, cross in zip(self.decoder_layers, cache["self"], memory["cross"]):
            layer_cache = {"self": self_cache, "cross": cross}
            x, layer_cache = layer.decode_step(x, layer_cache, index, memory["source_mask"], growing)
            new_self.append(layer_cache["self"])
        if self.norm == "pre":
            x = normalize(self.decoder_norm, x)
        return self._logits(x[:, 0], logit_bias), {"memory": memory, "self": new_self}

    def get_config(self):
        config = super().get_config()
        config.update(
            source_vocab_size=self.source_vocab_size,
            target_vocab_size=self.target_vocab_size,
            pad_id=self.pad_id,
            **{name: getattr(self, name) for name in ARCHITECTURE},
        )
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def build_model(config, source_vocab_size, target_vocab_size):
    """Build a `Transformer` from a config object and create its variables.

    Args:
        config: any object with the attributes named in `ARCHITECTURE` (those in `OPTIONAL` may be absent: None).
        source_vocab_size, target_vocab_size: ints.

    Returns:
        A built `Transformer` (called once on a dummy batch), ready to checkpoint or restore.
    """
    architecture = {
        name: getattr(config, name, OPTIONAL[name]) if name in OPTIONAL else getattr(config, name)
        for name in ARCHITECTURE
    }
    model = Transformer(
        source_vocab_size=source_vocab_size, target_vocab_size=target_vocab_size, **architecture
    )
    dummy = tf.ones((1, 2), tf.int32)
    model({"source": dummy, "target_in": dummy}, training=False)
    return model
