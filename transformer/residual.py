"""Residual sublayer connection with Post-LN / Pre-LN placement, shared by the encoder and decoder layers, and
`ResidualLayer`, what those two layers share: their widths, dropouts and norm placement, the feed-forward sublayer,
the residual wiring, the dropout setters and the config."""

import keras
import tensorflow as tf

from transformer.dropout import Dropout
from transformer.feed_forward import FeedForward
from transformer.layer_norm import LayerNorm

NORMS = ("post", "pre")


def layer_norm(name):
    """LayerNormalization (epsilon 1e-6) computed in float32 whatever the global policy (`LayerNorm`: its output
    has its input's dtype)."""
    return LayerNorm(epsilon=1e-6, dtype="float32", name=name)


def normalize(norm_layer, x):
    """Apply a `layer_norm` (float32 math) and give the result ``x.dtype`` (a no-op cast for `LayerNorm`)."""
    return tf.cast(norm_layer(x), x.dtype)


def residual_sublayer(x, sublayer, *, norm_layer, dropout_layer, norm="post", residual=True, training=False):
    """One sublayer connection.

    - ``norm="post"`` (Vaswani et al., 2017): ``LN(x + dropout(sublayer(x)))``.
    - ``norm="pre"`` (Xiong et al., 2020): ``x + dropout(sublayer(LN(x)))``.
    - ``residual=False`` (ablation) drops the ``x +`` term.

    Args:
        x: ``(B, L, d_model)``.
        sublayer: callable ``h -> (y, extra)`` with ``y`` of ``x``'s shape; ``extra`` (e.g. attention weights or
            a new cache) is passed through.
        norm_layer: a `layer_norm`.
        dropout_layer: a `transformer.dropout.Dropout`.

    Returns:
        ``(y (B, L, d_model), extra)``.
    """
    h = normalize(norm_layer, x) if norm == "pre" else x
    y, extra = sublayer(h)
    if residual:
        y = dropout_layer.add_to(x, y, training=training)  # x + dropout(y), in x's dtype
    else:
        y = dropout_layer(y, training=training)
    if norm == "post":
        y = normalize(norm_layer, y)
    return y, extra


class ResidualLayer(keras.layers.Layer):
    """The base of `EncoderLayer` and `DecoderLayer`: the arguments they share and what is built from them.

    Args:
        d_model, num_heads, d_ff: ints, widths.
        dropout: float, residual and feed-forward dropout.
        attention_dropout: float, dropout on the attention weights.
        ffn_dropout: optional float, dropout on the feed-forward hidden activations instead of ``dropout``.
        norm: ``"post"`` or ``"pre"``.
        residual: bool; False removes the residual connections (ablation).
        share_qkv, scale, mask_fill, soft_cap: passed to the `MultiHeadAttention` layers.

    A subclass makes its attention sublayers, then `feed_forward_sublayer()`, its LayerNorms and
    `residual_dropout_layer()`, and wraps each sublayer in `_sublayer`.
    """

    CONFIG = ("d_model", "num_heads", "d_ff", "dropout", "attention_dropout", "ffn_dropout", "norm", "residual",
              "share_qkv", "scale", "mask_fill", "soft_cap")  # fmt: skip

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
        self.scale = scale
        self.mask_fill = mask_fill
        self.soft_cap = soft_cap

    def feed_forward_sublayer(self):
        """The position-wise feed-forward sublayer (hidden dropout: ``ffn_dropout``, else ``dropout``)."""
        rate = self.dropout if self.ffn_dropout is None else self.ffn_dropout
        return FeedForward(
            d_model=self.d_model, d_ff=self.d_ff, dropout=rate, name="feed_forward", dtype=self.dtype_policy
        )

    def residual_dropout_layer(self):
        return Dropout(self.dropout, dtype=self.dtype_policy)

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
        config.update({name: getattr(self, name) for name in self.CONFIG})
        return config
