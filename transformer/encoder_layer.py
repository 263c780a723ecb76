"""One Transformer encoder layer: self-attention and feed-forward sublayers."""

import keras

from transformer.dropout import Dropout
from transformer.feed_forward import FeedForward
from transformer.multi_head import MultiHeadAttention
from transformer.residual import NORMS, layer_norm, residual_sublayer


@keras.saving.register_keras_serializable(package="transformer")
class EncoderLayer(keras.layers.Layer):
    """Self-attention + feed-forward, each wrapped in a residual connection with dropout and LayerNorm.

    Post-LN (default, Vaswani et al., 2017): ``x = LN(x + dropout(sublayer(x)))``. Pre-LN (Xiong et al., 2020):
    ``x = x + dropout(sublayer(LN(x)))``; the stack owner then applies a final LayerNorm. LayerNorms (epsilon 1e-6)
    run in float32 and are cast back to the compute dtype.

    Args:
        d_model, num_heads, d_ff: ints, widths.
        dropout: float, residual and feed-forward dropout.
        attention_dropout: float, dropout on the attention weights.
        ffn_dropout: optional float, dropout on the feed-forward hidden activations instead of ``dropout``.
        norm: ``"post"`` or ``"pre"``.
        residual: bool; False removes the residual connections (ablation).
        share_qkv, attention, chunk_size, window, scale, mask_fill, soft_cap: passed to `MultiHeadAttention`.

    Call arguments:
        x: ``(B, S, d_model)``.
        mask: optional bool broadcastable to ``(B, heads, S, S)`` (usually `padding_mask` ``(B, 1, 1, S)``).
        training: bool.

    Returns:
        ``(B, S, d_model)``.
    """

    def __init__(
        self,
        *,
        d_model,
        num_heads,
        d_ff,
        dropout=0.1,
        attention_dropout=0.0,
        ffn_dropout=None,
        norm="post",
        residual=True,
        share_qkv="none",
        attention="full",
        chunk_size=64,
        window=16,
        scale=None,
        mask_fill="auto",
        soft_cap=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_ff = d_ff
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.ffn_dropout = ffn_dropout
        self.norm = norm
        self.residual = residual
        self.share_qkv = share_qkv
        self.attention = attention
        self.chunk_size = chunk_size
        self.window = window
        self.scale = scale
        self.mask_fill = mask_fill
        self.soft_cap = soft_cap
        self.self_attention = MultiHeadAttention(
            d_model=d_model,
            num_heads=num_heads,
            dropout=attention_dropout,
            share_qkv=share_qkv,
            attention=attention,
            chunk_size=chunk_size,
            window=window,
            scale=scale,
            mask_fill=mask_fill,
            soft_cap=soft_cap,
            name="self_attention",
            dtype=self.dtype_policy,
        )
        self.feed_forward = FeedForward(
            d_model=d_model,
            d_ff=d_ff,
            dropout=dropout if ffn_dropout is None else ffn_dropout,
            name="feed_forward",
            dtype=self.dtype_policy,
        )
        self.self_attention_norm = layer_norm("self_attention_norm")
        self.feed_forward_norm = layer_norm("feed_forward_norm")
        self.residual_dropout = Dropout(dropout, dtype=self.dtype_policy)
        self.supports_masking = True  # `mask` is an explicit attention mask, not Keras mask metadata

    def compute_mask(self, inputs, previous_mask=None):
        return None

    def build(self, x_shape):
        self.self_attention.build(x_shape, x_shape, x_shape)
        self.feed_forward.build(x_shape)
        self.self_attention_norm.build(x_shape)
        self.feed_forward_norm.build(x_shape)
        self.built = True

    def set_dropout(self, rate):
        """Changes the residual dropout, and the feed-forward one unless `ffn_dropout` fixes it (not the attention
        dropout; see `Dropout.set_rate`)."""
        self.residual_dropout.set_rate(rate)
        if self.ffn_dropout is None:
            self.feed_forward.set_dropout(rate)
        self.dropout = rate

    def set_ffn_dropout(self, rate):
        """Fixes the feed-forward hidden dropout at `rate` (as the ``ffn_dropout`` argument would): later
        `set_dropout` calls leave it."""
        self.feed_forward.set_dropout(rate)
        self.ffn_dropout = rate

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

    def _sublayer(self, x, fn, norm_layer, training):
        return residual_sublayer(
            x,
            fn,
            norm_layer=norm_layer,
            dropout_layer=self.residual_dropout,
            norm=self.norm,
            residual=self.residual,
            training=training,
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            d_model=self.d_model,
            num_heads=self.num_heads,
            d_ff=self.d_ff,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            ffn_dropout=self.ffn_dropout,
            norm=self.norm,
            residual=self.residual,
            share_qkv=self.share_qkv,
            attention=self.attention,
            chunk_size=self.chunk_size,
            window=self.window,
            scale=self.scale,
            mask_fill=self.mask_fill,
            soft_cap=self.soft_cap,
        )
        return config
