"""One optimizer step, built for any `tf.distribute` strategy and any precision.

The step is split in two compiled functions:

* `accumulate(batch)`: every replica computes gradients of its summed, label-smoothed loss (scaled by the dynamic
  loss scale under float16); the sums are all-reduced and added to accumulator variables. This is the part that
  is XLA-compiled (`jit_compile`), once per bucketed batch shape; `num_traces` counts those compilations.
* `apply()`: in cross-replica context, on the all-reduced gradients: unscale, normalise by the TRUE number of
  target tokens of all accumulated micro-batches, check finiteness, clip by the global norm (so `clipnorm` is
  the norm of the real, unscaled, global gradient, as in fairseq), then apply Adam, or skip the step when a
  gradient or the loss is not finite (lowering the loss scale under float16).

Dynamic loss scaling (float16): the scale starts at 2^15, halves (never below 1) on every skipped step, and doubles
after `loss_scale_growth_steps` finite steps in a row; a skipped step or a doubling restarts that count.

Metrics of `apply()`: `grad_norm` is the global norm of the unclipped gradient, and `layer_grad_norms` the norms
of the same unclipped gradient per layer (`source_embedding`, `encoder_layer_0`, ...), so the root of the sum of
their squares is `grad_norm`; the update itself uses the clipped gradient.

Why not Keras' `LossScaleOptimizer` and `global_clipnorm`: under a distribution strategy Keras clips each
replica's gradient before the all-reduce and checks finiteness per replica, and the wrapper refuses `clipnorm`
on itself. Doing both after the all-reduce gives one global norm and one decision for all replicas.
"""

from __future__ import annotations

import collections

import tensorflow as tf

from nmt.losses import smoothed_cross_entropy

INITIAL_LOSS_SCALE = 2.0**15
LOSS_SCALE_GROWTH_STEPS = 2000  # finite steps before the loss scale doubles


def _layer_group(path: str, model_name: str) -> str:
    """A variable's layer, for per-layer gradient norms: 'transformer/encoder_layer_1/...' -> 'encoder_layer_1'.

    The model's own name is dropped: Keras numbers it by how many models the process built before
    ('transformer_1', ...), and the TensorBoard tags must not depend on that.
    """
    parts = path.split("/")
    if len(parts) > 1 and parts[0] == model_name:
        parts = parts[1:]
    return parts[0]


class TrainStep:
    """Gradient accumulation, loss scaling, clipping and the optimizer update for one model."""

    def __init__(
        self,
        *,
        model,
        optimizer,
        strategy: tf.distribute.Strategy,
        label_smoothing: float,
        clipnorm: float,
        loss_scaling: bool,
        jit_compile: bool,
        loss_normaliser: float,
        loss_scale_growth_steps: int = LOSS_SCALE_GROWTH_STEPS,
    ):
        self.model = model
        self.optimizer = optimizer
        self.strategy = strategy
        self.label_smoothing = float(label_smoothing)
        self.clipnorm = float(clipnorm)
        self.loss_scaling = loss_scaling
        # Sum losses are divided by this constant (the batch token budget) to keep float16 in range; the true
        # token count is applied exactly in apply().
        self.loss_normaliser = float(loss_normaliser)
        if loss_scale_growth_steps < 1:
            raise ValueError(f"loss_scale_growth_steps must be at least 1, got {loss_scale_growth_steps}")
        self.loss_scale_growth_steps = int(loss_scale_growth_steps)
        self.num_traces = 0
        self.variables = list(model.trainable_variables)
        groups = collections.defaultdict(list)
        for index, variable in enumerate(self.variables):
            groups[_layer_group(variable.path, model.name)].append(index)
        self.layer_groups = dict(groups)
        with strategy.scope():
            self.accumulators = [
                tf.Variable(tf.zeros(v.shape, tf.float32), trainable=False, name="grad_accumulator")
                for v in self.variables
            ]
            self.sums = tf.Variable(tf.zeros([3], tf.float32), trainable=False, name="loss_nll_tokens")
            self.loss_scale = tf.Variable(
                INITIAL_LOSS_SCALE if loss_scaling else 1.0, trainable=False, name="loss_scale"
            )
            self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="good_steps")
            self.bad_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="consecutive_bad_steps")
            self.skipped_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_steps")
        self.set_jit_compile(jit_compile)
        self.apply = tf.function(self._apply_fn)

    def set_jit_compile(self, jit_compile: bool) -> None:
        """Turns XLA on or off for the gradient computation (traced again on the next step).

        The optimizer update (`apply`, never XLA-compiled) keeps its trace; the benchmarks use this to time both
        settings on one model without paying for that trace twice.
        """
        self.jit_compile = jit_compile
        self._replica_grads = tf.function(self._replica_grads_fn, jit_compile=jit_compile)
        # Without XLA one relaxed trace serves every shape; with XLA each bucket shape compiles once.
        self.accumulate = tf.function(self._accumulate_fn, reduce_retracing=not jit_compile)

    def checkpoint_state(self) -> dict:
        """State that must survive a restart (accumulators are empty between optimizer steps)."""
        return {
            "loss_scale": self.loss_scale,
            "good_steps": self.good_steps,
            "bad_steps": self.bad_steps,
            "skipped_steps": self.skipped_steps,
        }

    # --- per replica --------------------------------------------------------------------------------------------
    def _replica_grads_fn(self, batch):
        self.num_traces += 1  # Python side effect: runs once per trace, i.e. once per compiled shape
        with tf.GradientTape() as tape:
            logits = self.model({"source": batch["source"], "target_in": batch["target_in"]}, training=True)
            loss_sum, nll_sum, tokens = smoothed_cross_entropy(
                logits, batch["target_out"], label_smoothing=self.label_smoothing
            )
            scaled = loss_sum / self.loss_normaliser * self.loss_scale
        grads = tape.gradient(scaled, self.variables)
        grads = [
            tf.zeros_like(v, tf.float32) if g is None else tf.cast(g, tf.float32)
            for g, v in zip(grads, self.variables)
        ]
        return grads, tf.stack([loss_sum, nll_sum, tokens])

    # --- cross replica ------------------------------------------------------------------------------------------
    def _accumulate_fn(self, batch):
        grads, sums = self.strategy.run(self._replica_grads, args=(batch,))
        reduce = tf.distribute.ReduceOp.SUM
        grads = [self.strategy.reduce(reduce, g, axis=None) for g in grads]
        sums = self.strategy.reduce(reduce, sums, axis=None)
        for accumulator, grad in zip(self.accumulators, grads):
            accumulator.assign_add(grad)
        self.sums.assign_add(sums)
        return sums

    def _apply_fn(self):
        loss_sum, nll_sum, tokens = tf.unstack(self.sums.read_value())
        factor = self.loss_normaliser / (tf.maximum(tokens, 1.0) * self.loss_scale)
        grads = [a.read_value() * factor for a in self.accumulators]
        grad_norm = tf.linalg.global_norm(grads)
        layer_norms = {  # of the unclipped gradient, like grad_norm
            name: tf.linalg.global_norm([grads[i] for i in indices])
            for name, indices in self.layer_groups.items()
        }
        finite = tf.logical_and(tf.math.is_finite(grad_norm), tf.math.is_finite(loss_sum))
        if self.clipnorm > 0:
            safe_norm = tf.where(finite, grad_norm, 1.0)
            grads, _ = tf.clip_by_global_norm(grads, self.clipnorm, use_norm=safe_norm)

        def apply_update():
            self.optimizer.apply(grads, self.variables)
            self.bad_steps.assign(0)
            if self.loss_scaling:
                grow = tf.equal(self.good_steps + 1, self.loss_scale_growth_steps)
                self.loss_scale.assign(tf.where(grow, self.loss_scale * 2.0, self.loss_scale))
                self.good_steps.assign(tf.where(grow, tf.zeros_like(self.good_steps), self.good_steps + 1))
            return tf.constant(True)

        def skip_update():
            self.bad_steps.assign_add(1)
            self.skipped_steps.assign_add(1)
            if self.loss_scaling:
                self.loss_scale.assign(tf.maximum(self.loss_scale * 0.5, 1.0))
                self.good_steps.assign(0)
            return tf.constant(False)

        applied = tf.cond(finite, apply_update, skip_update)
        for accumulator in self.accumulators:
            accumulator.assign(tf.zeros_like(accumulator))
        self.sums.assign(tf.zeros_like(self.sums))
        return {
            "applied": applied,
            "loss": loss_sum / tf.maximum(tokens, 1.0),
            "nll": nll_sum / tf.maximum(tokens, 1.0),
            "tokens": tokens,
            "grad_norm": grad_norm,
            "loss_scale": self.loss_scale.read_value(),
            "layer_grad_norms": layer_norms,
        }

    def step(self, batches) -> dict:
        """Accumulates the micro-batches, then applies one optimizer update. Returns float metrics."""
        for batch in batches:
            self.accumulate(batch)
        return self.apply()
