"""One Transformer encoder layer: self-attention and feed-forward sublayers."""

import keras

from transformer.multi_head import MultiHeadAttention
from transformer.residual import ResidualLayer, layer_norm


@keras.saving.register_keras_serializable(package="transformer")
class EncoderLayer(ResidualLayer):
    """Self-attention + feed-forward, each wrapped in a residual connection with dropout and LayerNorm.

    Post-LN (default, Vaswani et al., 2017): ``x = LN(x + dropout(sublayer(x)))``. Pre-LN (Xiong et al., 2020):
    ``x = x + dropout(sublayer(LN(x)))``; the stack owner then applies a final LayerNorm. LayerNorms (epsilon 1e-6)
    run in float32 and are cast back to the compute dtype.

    Args: those of `ResidualLayer` (d_model, num_heads, d_ff, dropout, attention_dropout, ffn_dropout, norm,
    residual, share_qkv, scale, mask_fill, soft_cap), and
        attention, chunk_size, window: passed to `MultiHeadAttention` with share_qkv, scale, mask_fill, soft_cap.

    Call arguments:
        x: ``(B, S, d_model)``.
        mask: optional bool broadcastable to ``(B, heads, S, S)`` (usually `padding_mask` ``(B, 1, 1, S)``).
        training: bool.

    Returns:
        ``(B, S, d_model)``.
    """

    CONFIG = (*ResidualLayer.CONFIG, "attention", "chunk_size", "window")

    def __init__(self, *, attention="full", chunk_size=64, window=16, **kwargs):
        super().__init__(**kwargs)
        self.attention = attention
        self.chunk_size = chunk_size
        self.window = window
        self.self_attention = MultiHeadAttention(
            d_model=self.d_model,
            num_heads=self.num_heads,
            dropout=self.attention_dropout,
            share_qkv=self.share_qkv,
            attention=attention,
            chunk_size=chunk_size,
            window=window,
            scale=self.scale,
            mask_fill=self.mask_fill,
            soft_cap=self.soft_cap,
            name="self_attention",
            dtype=self.dtype_policy,
        )
        self.feed_forward = self.feed_forward_sublayer()
        self.self_attention_norm = layer_norm("self_attention_norm")
        self.feed_forward_norm = layer_norm("feed_forward_norm")
        self.residual_dropout = self.residual_dropout_layer()
        self.supports_masking = True  # `mask` is an explicit attention mask, not Keras mask metadata

    def compute_mask(self, inputs, previous_mask=None):
        return None

    def build(self, x_shape):
        self.self_attention.build(x_shape, x_shape, x_shape)
        self.feed_forward.build(x_shape)
        self.self_attention_norm.build(x_shape)
        self.feed_forward_norm.build(x_shape)
        self.built = True

    def call(self, x, mask=None, training=False):
        x, _ = self._sublayer(
            x,
            lambda h: self.self_attention(h, h, h, mask=mask, training=training),
            self.self_attention_norm,
            training,
        )
        x, _ = self._sublayer(
            x, lambda h: (self.feed_forward(h, training=training), None), self.feed_forward_norm, training
        )
        return x
