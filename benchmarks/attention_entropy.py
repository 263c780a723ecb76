"""How peaked a trained model's cross-attention is: the mean entropy of its attention rows on a validation batch.

For every decoder layer, head and non-padding target position, the entropy ``-sum_j w_j log w_j`` (nats) of the
cross-attention weights over the non-padding source positions. A uniform row has entropy ``log S``; `normalized`
divides each row's entropy by that, so 1.0 means completely flat attention and values near 0 sharp alignments.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from transformer.vocab import PAD_ID


def cross_attention_entropy(model, batch: dict) -> dict:
    """{"entropy": mean nats, "normalized": mean entropy / log(source length), "uniform": mean log(source length)}."""
    source, target_in = batch["source"], batch["target_in"]
    weights = model.cross_attention(source, target_in)  # per layer: (B, heads, T, S)
    source_len = np.count_nonzero(np.asarray(source) != PAD_ID, axis=1)  # (B,)
    rows = np.asarray(target_in) != PAD_ID  # (B, T)
    uniform = np.log(np.maximum(source_len, 1)).astype(np.float64)[:, None, None]  # (B, 1, 1)
    entropies, normalized = [], []
    for layer in weights:
        w = tf.cast(layer, tf.float32).numpy().astype(np.float64)  # (B, heads, T, S)
        h = -np.sum(np.where(w > 0, w * np.log(np.where(w > 0, w, 1.0)), 0.0), axis=-1)  # (B, heads, T)
        valid = np.broadcast_to(rows[:, None, :], h.shape)
        entropies.append(h[valid])
        with np.errstate(divide="ignore", invalid="ignore"):
            normalized.append(np.where(uniform > 0, h / uniform, 0.0)[valid])
    entropy = np.concatenate(entropies)
    return {
        "entropy": float(entropy.mean()),
        "normalized": float(np.concatenate(normalized).mean()),
        "uniform": float(np.log(np.maximum(source_len, 1)).mean()),
    }
