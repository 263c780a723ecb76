"""One Transformer decoder layer: causal self-attention, cross-attention and feed-forward sublayers."""

import keras
import tensorflow as tf

from transformer.multi_head import MultiHeadAttention
from transformer.residual import ResidualLayer, layer_norm


@keras.saving.register_keras_serializable(package="transformer")
class DecoderLayer(ResidualLayer):
    """Masked self-attention, cross-attention over the encoder memory, feed-forward; each a residual sublayer.

    Same residual / LayerNorm placement as `EncoderLayer` (``norm="post"`` default, ``"pre"``, ``residual=False``).
    Self-attention is always full attention (the caller passes the causal mask); ``share_qkv`` applies to the
    self-attention only (cross-attention projects queries and memory separately).

    Args: those of `ResidualLayer` (d_model, num_heads, d_ff, dropout, attention_dropout, ffn_dropout, norm,
    residual, share_qkv, scale, mask_fill, soft_cap).

    Call arguments:
        x: ``(B, T, d_model)``.
        memory: ``(B, S, d_model)``, the encoder output.
        self_mask: bool broadcastable to ``(B, heads, T, T)``: causal and target padding.
        memory_mask: bool broadcastable to ``(B, heads, T, S)``: source padding ``(B, 1, 1, S)``.
        training: bool.

    Returns:
        ``(x (B, T, d_model), cross_weights (B, heads, T, S))``.

    Incremental decoding: `init_cache` then `decode_step` once per position gives the same outputs as `call`.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        common = dict(
            d_model=self.d_model,
            num_heads=self.num_heads,
            dropout=self.attention_dropout,
            scale=self.scale,
            mask_fill=self.mask_fill,
            soft_cap=self.soft_cap,
            dtype=self.dtype_policy,
        )
        self.self_attention = MultiHeadAttention(share_qkv=self.share_qkv, name="self_attention", **common)
        self.cross_attention = MultiHeadAttention(name="cross_attention", **common)
        self.feed_forward = self.feed_forward_sublayer()
        self.self_attention_norm = layer_norm("self_attention_norm")
        self.cross_attention_norm = layer_norm("cross_attention_norm")
        self.feed_forward_norm = layer_norm("feed_forward_norm")
        self.residual_dropout = self.residual_dropout_layer()

    def build(self, x_shape, memory_shape=None):
        memory_shape = x_shape if memory_shape is None else memory_shape
        self.self_attention.build(x_shape, x_shape, x_shape)
        self.cross_attention.build(x_shape, memory_shape, memory_shape)
        self.feed_forward.build(x_shape)
        for norm_layer in (self.self_attention_norm, self.cross_attention_norm, self.feed_forward_norm):
            norm_layer.build(x_shape)
        self.built = True

    def call(self, x, memory, self_mask=None, memory_mask=None, training=False):
        x, _ = self._sublayer(
            x,
            lambda h: self.self_attention(h, h, h, mask=self_mask, training=training),
            self.self_attention_norm,
            training,
        )
        x, cross_weights = self._sublayer(
            x,
            lambda h: self.cross_attention(h, memory, memory, mask=memory_mask, training=training),
            self.cross_attention_norm,
            training,
        )
        x, _ = self._sublayer(
            x, lambda h: (self.feed_forward(h, training=training), None), self.feed_forward_norm, training
        )
        return x, cross_weights

    def init_cache(self, memory, max_length):
        """Decoding cache for one layer; every tensor has leading batch dimension ``B``.

        Returns:
            ``{"self": {"k", "v"}: (B, heads, max_length, depth) zeros, "cross": {"k", "v"}: (B, heads, S, depth)}``,
            the cross-attention keys/values of ``memory (B, S, d_model)`` projected once. ``max_length=0`` gives
            the empty self cache of ``decode_step(..., growing=True)``.
        """
        return {
            "self": self.self_attention.init_cache(_batch_size(memory), max_length),
            "cross": self.cross_attention.project_key_value(memory),
        }

    def decode_step(self, x, cache, index, memory_mask=None, growing=False):
        """Decode the token(s) at ``index``: ``x (B, 1, d_model)`` -> ``(x (B, 1, d_model), new_cache)``.

        ``index`` is a scalar int32 tensor; ``cache`` comes from `init_cache` (or a previous step). ``growing``: the
        self cache holds exactly positions ``0 .. index - 1`` (``init_cache(memory, 0)``) and grows by the new
        position(s), which attend to that prefix only (see `MultiHeadAttention`; not under XLA). Inference only.
        """

        def self_attend(h):
            output, _, new_cache = self.self_attention(
                h, h, h, cache=cache["self"], cache_index=index, growing=growing
            )
            return output, new_cache

        x, new_self = self._sublayer(x, self_attend, self.self_attention_norm, False)
        x, _ = self._sublayer(
            x,
            lambda h: self.cross_attention.attend_key_value(h, cache["cross"], mask=memory_mask),
            self.cross_attention_norm,
            False,
        )
        x, _ = self._sublayer(x, lambda h: (self.feed_forward(h), None), self.feed_forward_norm, False)
        return x, {"self": new_self, "cross": cache["cross"]}


def _batch_size(x):
    """Leading (batch) dimension of ``x``, static if known."""
    return x.shape[0] if x.shape[0] is not None else tf.shape(x)[0]
