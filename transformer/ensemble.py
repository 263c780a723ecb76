"""An ensemble of Transformers that decodes as one model: the mean of their probabilities at every position.

    ensemble = Ensemble([model_a, model_b])                # same vocabularies (one tokenizer)
    step_fn, cache = cached_decoding(ensemble, source, max_length)     # transformer.step_fns, unchanged
    log_probs = ensemble({"source": source, "target_in": target_in})   # (B, T, V): log of the mean probability

Each member encodes the source itself and keeps its own key/value cache; at each step the members' next-token
distributions are averaged in probability space, ``log(mean_i softmax(logits_i))`` (fairseq's `EnsembleModel`;
averaging log-probabilities, a geometric mean, is the other common choice). What the ensemble returns as "logits"
are those log-probabilities: a log-softmax over them leaves them unchanged, so the searches, the loss and
forced-decoding scores read them as a model's logits. Tokens a search forbids (`transformer.step_fns`: PAD, BOS) are forbidden
on the mean, as fairseq does, in the cached step as in the full pass. An ensemble of one model gives that model's
log-softmax: the same translations and scores.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import tensorflow as tf


def mean_probability(logits: Sequence[tf.Tensor]) -> tf.Tensor:
    """``log(mean_i softmax(logits_i))`` over the last axis, float32, from same-shaped logits."""
    log_probs = tf.stack([tf.nn.log_softmax(tf.cast(x, tf.float32), axis=-1) for x in logits])
    return tf.reduce_logsumexp(log_probs, axis=0) - math.log(len(logits))


class Ensemble:
    """Transformers with the same source and target vocabularies, used where one `Transformer` decodes.

    It offers what decoding, the validation loss and scoring call: ``__call__``, `encode`, `source_mask`, `decode`,
    `decode_last`, `init_cache`, `decode_step`, ``max_length`` (the smallest position table) and the vocabulary
    sizes. Not trainable. Memories and caches are tuples with one entry per member.
    """

    def __init__(self, models: Sequence):
        models = tuple(models)
        if not models:
            raise ValueError("an ensemble needs at least one model")
        sizes = {(m.source_vocab_size, m.target_vocab_size) for m in models}
        if len(sizes) != 1:
            raise ValueError(
                f"the ensemble's models have different vocabulary sizes (source, target): {sorted(sizes)}"
            )
        self.models = models
        self.source_vocab_size, self.target_vocab_size = sizes.pop()
        self.max_length = min(m.max_length for m in models)
        self.pad_id = models[0].pad_id

    def __len__(self) -> int:
        return len(self.models)

    def __call__(self, inputs, training=False):
        if training:
            raise ValueError("an ensemble is for inference only")
        return mean_probability([m(inputs, training=False) for m in self.models])

    def source_mask(self, source):
        return self.models[0].source_mask(source)  # padding only: the same for every member

    def encode(self, source, training=False):
        return tuple(m.encode(source, training=training) for m in self.models)

    def decode(self, target_in, memory, source_mask, training=False):
        return mean_probability(
            [m.decode(target_in, x, source_mask, training=training) for m, x in zip(self.models, memory)]
        )

    def decode_last(self, target_in, memory, source_mask):
        return mean_probability(
            [m.decode_last(target_in, x, source_mask) for m, x in zip(self.models, memory)]
        )

    def init_cache(self, source, memory, max_length, growing=False):
        """``{"memory": (each member's memory part, ...), "self": (each member's self part, ...)}``."""
        caches = [m.init_cache(source, x, max_length, growing) for m, x in zip(self.models, memory)]
        return {"memory": tuple(c["memory"] for c in caches), "self": tuple(c["self"] for c in caches)}

    def decode_step(self, tokens, cache, index, growing=False, logit_bias=None):
        logits, memories, selves = [], [], []
        for model, memory, own in zip(self.models, cache["memory"], cache["self"]):
            step_logits, new = model.decode_step(
                tokens, {"memory": memory, "self": own}, index, growing=growing
            )
            logits.append(step_logits)
            memories.append(new["memory"])
            selves.append(new["self"])
        log_probs = mean_probability(logits)
        if (
            logit_bias is not None
        ):  # on the mean, as the full pass forbids tokens: both paths give the same scores
            log_probs += logit_bias
        return log_probs, {"memory": tuple(memories), "self": tuple(selves)}
