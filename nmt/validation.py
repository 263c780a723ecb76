"""Validation loss of a model on padded batches, and the batches for in-memory sentence pairs.

Used by the trainer (at every evaluation), by `nmt.evaluation` (the loss next to BLEU) and re-exported by
`nmt.translator`; it imports nothing else from `nmt` but the loss.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence

_LOSS_KEYS = ("source", "target_in", "target_out")

_LOSS_FUNCTIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def validation_loss(model, dataset) -> tuple[float, int]:
    """Mean cross-entropy per target token (no label smoothing, padding excluded) and the number of tokens.

    `dataset` yields (or is a list of) `{"source", "target_in", "target_out"}` int32 batches padded with PAD, as
    `data.pipeline.make_eval_dataset` and `pairs_loss_dataset` make them. The forward pass is traced once per model
    (dynamic shapes) and reused by later calls, so the trainer can call this at every evaluation.
    """
    import tensorflow as tf

    if model not in _LOSS_FUNCTIONS:
        from nmt.losses import smoothed_cross_entropy

        spec = {key: tf.TensorSpec([None, None], tf.int32) for key in _LOSS_KEYS}
        model_ref = weakref.ref(model)  # a strong reference in the value would keep the key alive forever

        @tf.function(input_signature=[spec], autograph=False)
        def batch_nll(batch):
            logits = model_ref()({"source": batch["source"], "target_in": batch["target_in"]}, training=False)
            _, nll, tokens = smoothed_cross_entropy(logits, batch["target_out"], label_smoothing=0.0)
            return nll, tokens

        _LOSS_FUNCTIONS[model] = batch_nll
    batch_nll = _LOSS_FUNCTIONS[model]
    total, count = 0.0, 0.0
    for batch in dataset:
        nll, tokens = batch_nll({key: tf.convert_to_tensor(batch[key], tf.int32) for key in _LOSS_KEYS})
        total += float(nll)
        count += float(tokens)
    return (total / count if count else float("nan")), int(count)


def perplexity(loss: float) -> float:
    return math.exp(min(loss, 50.0))


def cut_pairs(source_lengths, target_lengths, max_length: int) -> int:
    """How many pairs the loss batches cut: either side longer than `max_length - 1` pieces (before EOS/BOS)."""
    import numpy as np

    keep = max_length - 1
    return int(((np.asarray(source_lengths) > keep) | (np.asarray(target_lengths) > keep)).sum())


class LossBatches(list):
    """The batches of `pairs_loss_dataset`, with `cut`: how many of its pairs were cut (`cut_pairs`)."""

    cut: int = 0


def pairs_loss_dataset(data_config, tokenizer, sources: Sequence[str], targets: Sequence[str]) -> LossBatches:
    """Validation-loss batches for in-memory pairs, with the conventions of `data.pipeline.make_eval_dataset`.

    source = pieces + [EOS], target_in = [BOS] + pieces, target_out = pieces + [EOS], each side cut to
    `max_length - 1` pieces first; pairs sorted by length, about `eval_batch_tokens` tokens per batch, PAD-padded
    to the longest pair of the batch. Returns a list of `{"source", "target_in", "target_out"}` int32 arrays
    (a `LossBatches`, which also says how many pairs were cut).
    """
    import numpy as np
    import tensorflow as tf

    from transformer.vocab import BOS_ID, EOS_ID, PAD_ID

    keep = data_config.max_length - 1
    source_pieces = tokenizer.tokenize_source(tf.constant(list(sources), tf.string)).to_list()
    target_pieces = tokenizer.tokenize_target(tf.constant(list(targets), tf.string)).to_list()
    pairs = sorted(
        ((s[:keep], t[:keep]) for s, t in zip(source_pieces, target_pieces)), key=lambda p: max(map(len, p))
    )

    def padded(chunk: list) -> dict:
        width = max(max(map(len, pair)) for pair in chunk) + 1  # + EOS (or BOS)
        batch = {
            key: np.full((len(chunk), width), PAD_ID, np.int32)
            for key in ("source", "target_in", "target_out")
        }
        for row, (source, target) in enumerate(chunk):
            batch["source"][row, : len(source) + 1] = [*source, EOS_ID]
            batch["target_in"][row, : len(target) + 1] = [BOS_ID, *target]
            batch["target_out"][row, : len(target) + 1] = [*target, EOS_ID]
        return batch

    batches, chunk = LossBatches(), []
    batches.cut = cut_pairs(
        list(map(len, source_pieces)), list(map(len, target_pieces)), data_config.max_length
    )
    for pair in pairs:  # shortest first: the pair being added is the longest of its batch
        if chunk and (len(chunk) + 1) * (max(map(len, pair)) + 1) > data_config.eval_batch_tokens:
            batches.append(padded(chunk))
            chunk = []
        chunk.append(pair)
    if chunk:
        batches.append(padded(chunk))
    return batches
