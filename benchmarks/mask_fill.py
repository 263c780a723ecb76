"""Unit-level measurement of the attention mask fill: leaked attention mass, and whether training stays finite.

Three measurements for each fill (``"auto"``, the dtype-aware path of `scaled_dot_product_attention`, and the
legacy additive fills ``-1e3``, ``-1e9``, ``-1e20``) in float32 and float16 / mixed_float16:

- `synthetic_leak`: random q/k whose logits have a chosen standard deviation (1 to 1000), the last quarter of the
  keys masked as padding and one query row fully masked. Leak = attention mass on masked keys, averaged over rows
  with at least one allowed key; also whether any weight or output is NaN/Inf, and the total weight of the fully
  masked row (0 on the safe path; an additive fill spreads it uniformly over the padding).
- `activation_leak`: the same on real activations, the encoder's first self-attention on the validation batch with
  the most source padding (q, k and v from the model's own projections of the embedded source; padding masked).
- `training_check`: a few real `TrainStep` updates of a model built with that fill under that precision: how many
  were applied (a non-finite loss or gradient is skipped) and the last loss.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import keras
import numpy as np
import tensorflow as tf

from transformer.attention import padding_mask, scaled_dot_product_attention
from transformer.vocab import PAD_ID

log = logging.getLogger("benchmarks")

FILLS = ("auto", -1.0e3, -1.0e9, -1.0e20)
LOGIT_STDS = (1.0, 10.0, 100.0, 1000.0)
DTYPES = {"float32": tf.float32, "float16": tf.float16}
PRECISION_OF_DTYPE = {"float32": "float32", "float16": "mixed_float16"}


def fill_name(fill) -> str:
    return "auto" if fill == "auto" else f"{fill:.0e}".replace("e+0", "e").replace("e+", "e")


def leak_stats(weights, output, mask) -> dict:
    """Leaked mass (mean over rows with an allowed key) and non-finite flags of one attention call."""
    weights = tf.cast(weights, tf.float32).numpy()
    output = tf.cast(output, tf.float32).numpy()
    mask = np.broadcast_to(np.asarray(mask, bool), weights.shape)
    has_key = mask.any(axis=-1)  # (..., Lq)
    leaked = np.where(mask, 0.0, weights).sum(axis=-1)  # (..., Lq)
    finite_rows = np.isfinite(weights).all(axis=-1) & np.isfinite(output).all(axis=-1)
    empty = ~has_key
    nonfinite = bool(not finite_rows[has_key].all())
    return {
        "leak": float("nan") if nonfinite else (float(leaked[has_key].mean()) if has_key.any() else 0.0),
        "nonfinite": nonfinite,
        "fully_masked_rows_finite": bool(finite_rows[empty].all()) if empty.any() else None,
        "fully_masked_rows_mass": float(weights.sum(axis=-1)[empty].mean()) if empty.any() else None,
    }


def synthetic_leak(fill, dtype: str, logit_std: float, *, seed: int = 0, heads: int = 4, length: int = 32,
                   depth: int = 64) -> dict:  # fmt: skip
    """Leak of `fill` in `dtype` on random logits of standard deviation about `logit_std`."""
    rng = np.random.default_rng(seed)
    q = (
        rng.standard_normal((1, heads, length, depth)) * logit_std
    )  # logits = q.k / sqrt(depth): std ~ logit_std
    k = rng.standard_normal((1, heads, length, depth))
    v = rng.standard_normal((1, heads, length, depth))
    mask = np.ones((1, 1, length, length), bool)
    mask[..., 3 * length // 4 :] = False  # padding keys
    mask[..., 0, :] = False  # one query that may attend to nothing
    tensors = [tf.constant(x, DTYPES[dtype]) for x in (q, k, v)]
    output, weights = scaled_dot_product_attention(*tensors, tf.constant(mask), mask_fill=fill)
    return leak_stats(weights, output, mask)


def activation_leak(model, batch: dict, fill, dtype: str) -> dict:
    """Leak of `fill` in `dtype` in the first encoder self-attention of `model` on a real batch."""
    source = batch["source"]
    layer = model.encoder_layers[0].self_attention
    x = model.source_embedding(source)  # (batch, S, d_model)
    q, k, v = (tf.cast(layer.project(dense, x), DTYPES[dtype]) for dense in (layer.wq, layer.wk, layer.wv))
    mask = padding_mask(source, model.pad_id)  # (batch, 1, 1, S)
    output, weights = scaled_dot_product_attention(q, k, v, mask, scale=model.scale, mask_fill=fill)
    stats = leak_stats(weights, output, mask)
    stats["max_abs_logit"] = float(
        tf.reduce_max(tf.abs(tf.matmul(q, k, transpose_b=True))).numpy() / math.sqrt(q.shape[-1])
    )
    return stats


def most_padded_batch(dataset) -> dict:
    """The batch with the most source padding (the padding keys are what a fill can leak onto)."""
    best, most = None, -1
    for batch in dataset.as_numpy_iterator():
        padding = int(np.count_nonzero(batch["source"] == PAD_ID))
        if padding > most:
            best, most = batch, padding
    return {key: tf.constant(value) for key, value in best.items()}


def training_check(config, tokenizer, batches: list[dict], fill, precision: str) -> dict:
    """Applies one real `TrainStep` update per batch to a fresh model with `fill` under `precision`.

    The step runs eagerly (`tf.config.run_functions_eagerly`): the same code, without the tracing that would cost
    more than the few steps themselves.
    """
    from benchmarks.train_speed import make_train_step
    from transformer.model import build_model

    keras.mixed_precision.set_global_policy(precision)
    eager = tf.config.functions_run_eagerly()
    tf.config.run_functions_eagerly(True)
    try:
        keras.utils.set_random_seed(config.train.seed)
        model_config = dataclasses.replace(config.model, mask_fill=fill)
        model = build_model(model_config, tokenizer.source_vocab_size, tokenizer.target_vocab_size)
        step = make_train_step(model, config, precision=precision, xla=False)
        applied, losses = 0, []
        for batch in batches:
            metrics = step.step([batch])
            applied += int(bool(metrics["applied"]))
            losses.append(float(metrics["loss"]))
    finally:
        tf.config.run_functions_eagerly(eager)
        keras.mixed_precision.set_global_policy("float32")
    return {
        "steps": len(batches),
        "applied": applied,
        "last_loss": losses[-1] if losses else None,
        "finite": bool(losses) and all(math.isfinite(x) for x in losses),
    }


def measure_mask_fill(
    config, tokenizer, *, model=None, steps: int = 10, fills=FILLS, logit_stds=LOGIT_STDS
) -> dict:
    """All three measurements. `model`: a trained float32 model for the activations (else a fresh one).

    Returns {"synthetic": [...], "activations": [...], "training": [...]}, one dict per (fill, dtype[, std]).
    """
    from data.pipeline import make_eval_dataset, make_train_dataset
    from transformer.model import build_model

    keras.mixed_precision.set_global_policy("float32")
    trained = model is not None
    if model is None:
        keras.utils.set_random_seed(config.train.seed)
        model = build_model(config.model, tokenizer.source_vocab_size, tokenizer.target_vocab_size)
    eval_batch = most_padded_batch(make_eval_dataset(config.data, tokenizer, config.data.validation_split))
    train = make_train_dataset(config.data, tokenizer, seed=config.train.seed, repeat=True)
    batches = (
        [{key: tf.constant(value) for key, value in b.items()} for b in train.take(steps)] if steps else []
    )
    result = {"synthetic": [], "activations": [], "training": [], "trained_activations": trained}
    for fill in fills:
        for dtype in DTYPES:
            base = {"fill": fill_name(fill), "dtype": dtype}
            for std in logit_stds:
                result["synthetic"].append({**base, "logit_std": std, **synthetic_leak(fill, dtype, std)})
            result["activations"].append({**base, **activation_leak(model, eval_batch, fill, dtype)})
            precision = PRECISION_OF_DTYPE[dtype]
            log.info("mask fill %s, %s: %d training steps", base["fill"], precision, steps)
            check = training_check(config, tokenizer, batches, fill, precision)
            result["training"].append({**base, "precision": precision, **check})
    return result
