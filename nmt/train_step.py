"""One optimizer step, built for any `tf.distribute` strategy and any precision.

The step is split in compiled functions:

* `gradients(batch)`: every replica computes gradients of its summed, label-smoothed loss (scaled by the dynamic
  loss scale under float16); the sums are all-reduced. The per-replica part is XLA-compiled when `jit_compile`,
  once per bucketed batch shape; `num_traces` counts those traces. The output projection and the loss run on the
  real (non-padding) target tokens only (`Transformer.masked_logits`); under XLA, whose shapes must be static, and
  for models without `masked_logits`, on every position with padding weighted out. Same loss up to summation order.
* `update(grads, sums)`: in cross-replica context, on the all-reduced gradients: unscale, normalise by the TRUE
  number of target tokens, check finiteness, clip by the global norm (so `clipnorm` is the norm of the real,
  unscaled, global gradient, as in fairseq), then apply Adam, or skip the step when a gradient or the loss is not
  finite (lowering the loss scale under float16).
* With gradient accumulation (several micro-batches per step), `accumulate(batch)` adds `gradients(batch)` into
  accumulator variables and `apply()` runs the update on them, then clears them. One micro-batch (the default)
  skips the accumulators: its gradients go straight to the update, with the same result bit for bit.

Dynamic loss scaling (float16): the scale starts at 2^15, halves (never below 1) on every skipped step, and doubles
after `loss_scale_growth_steps` finite steps in a row; a skipped step or a doubling restarts that count.

Metrics: `grad_norm` is the global norm of the unclipped gradient (every step: clipping needs it), and
`half_squared_grad_norms` its per-variable terms. `layer_grad_norms(metrics)` groups those on the host into the
norms of the same unclipped gradient per layer (`source_embedding`, `encoder_layer_0`, ...; the root of the sum of
their squares is `grad_norm`): no extra pass over the gradients, and only the steps that log them pay for the
grouping. The update itself uses the clipped gradient.

Why not Keras' `LossScaleOptimizer` and `global_clipnorm`: under a distribution strategy Keras clips each
replica's gradient before the all-reduce and checks finiteness per replica, and the wrapper refuses `clipnorm`
on itself. Doing both after the all-reduce gives one global norm and one decision for all replicas.

The functions are traced without autograph: their branches are `tf.cond` already, and converting the Python of the
step, the model and the Keras optimizer cost ~2.6 s of CPU per process on the first step (tiny model, AVX2 EPYC),
for the same graph (a 12-step run ended with the same weights, bit for bit). A tensor used as a Python condition
raises at the trace instead of becoming a `tf.cond`.
"""

from __future__ import annotations

import collections
import functools
import os

import numpy as np
import tensorflow as tf

from nmt import kernels
from nmt.losses import smoothed_cross_entropy, token_cross_entropy
from nmt.optimizer import FusedAdam
from nmt.xla import autoclustering
from transformer.kernels import fused
from transformer.vocab import PAD_ID

INITIAL_LOSS_SCALE = 2.0**15
_function = functools.partial(tf.function, autograph=False)  # see the module docstring
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
        autocluster: bool = False,
    ):
        self.model = model
        self.optimizer = optimizer
        self.strategy = strategy
        self.label_smoothing = float(label_smoothing)
        self.clipnorm = float(clipnorm)
        self.loss_scaling = loss_scaling
        # Sum losses are divided by this constant (the batch token budget) to keep float16 in range; the true
        # token count is applied exactly in update().
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
            # whether the scale above is in use (float16): a checkpoint of the other kind resets it on resume
            self.scaling = tf.Variable(
                int(loss_scaling), dtype=tf.int64, trainable=False, name="loss_scaling"
            )
            self.bad_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="consecutive_bad_steps")
            self.skipped_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_steps")
        # the C++ kernels (nmt.kernels: layer norms, dropout), when built: CPU replicas only (they have no GPU kernel),
        # never under jit_compile (no XLA kernel); `fusible` leaves them outside its clusters
        self.on_cpu = not any(tf.config.list_logical_devices(kind) for kind in ("GPU", "TPU"))
        self.set_jit_compile(jit_compile)
        # `train.xla: fusible`: XLA fuses the elementwise ops and reductions of every step's functions, the matmuls
        # stay TensorFlow ops (nmt.xla). Ignored under jit_compile, which compiles everything.
        self.autocluster = autocluster
        self.update = _function(self._update_fn)
        self.apply = _function(self._apply_fn)

    def kernels_in_use(self) -> str:
        """What the step's layer norms, dropouts, loss, bias gradients, attention softmax and Adam update run on,
        for the log: under XLA the step's ops are TensorFlow's, and Adam's update (never compiled) still runs on
        the kernels where `FusedAdam.fuses` the variables."""
        if not self.on_cpu:
            return "TensorFlow ops (not CPU)"
        if kernels.ops() is None:
            return f"TensorFlow ops (C++ kernels unavailable: {kernels.unavailable()})"
        isa = (
            " with the AVX2 paths (NMT_KERNELS_ISA=avx2)" if os.environ.get(kernels.ISA_ENV) == "avx2" else ""
        )
        if not self.jit_compile:
            return f"C++ kernels (nmt.kernels){isa}"
        update = isinstance(self.optimizer, FusedAdam) and self.optimizer.fuses(self.variables)
        return "TensorFlow ops under XLA" + (f"; Adam's update on the C++ kernels{isa}" if update else "")

    def set_jit_compile(self, jit_compile: bool) -> None:
        """Turns XLA on or off for the gradient computation (traced again on the next step).

        The optimizer update (`update` and `apply`, never XLA-compiled) keeps its trace; the benchmarks use this to
        time both settings on one model without paying for that trace twice.
        """
        self.jit_compile = jit_compile
        self._replica_grads = _function(self._replica_grads_fn, jit_compile=jit_compile)
        # Without XLA one trace with every batch dimension unknown serves every shape (`_relax`); with XLA each
        # bucket shape compiles once.
        self.gradients = _function(self._gradients_fn, reduce_retracing=not jit_compile)
        self.accumulate = _function(self._accumulate_fn, reduce_retracing=not jit_compile)
        self._relaxed = set()  # the functions traced for batches of any shape (`_relax`)

    def retrace(self) -> None:
        """Traces the gradient computation again on the next step (after a change to the model's Python
        attributes, e.g. its dropout rate, which a trace bakes in)."""
        self.set_jit_compile(self.jit_compile)

    def checkpoint_state(self) -> dict:
        """State that must survive a restart (accumulators are empty between optimizer steps)."""
        return {
            "loss_scale": self.loss_scale,
            "good_steps": self.good_steps,
            "bad_steps": self.bad_steps,
            "skipped_steps": self.skipped_steps,
            "loss_scaling": self.scaling,
        }

    def reconcile_loss_scaling(self) -> str:
        """After a restore: a checkpoint trained with loss scaling (float16) resumed without it, or the other way
        (train.precision changed, or `auto` resolved otherwise on another machine), starts the scale again as a new
        run does (a float32 run's scale of 1 kept under float16 would take ~30,000 steps to grow back, its small
        gradients flushed to zero meanwhile). Returns what it did ("" when the kinds agree)."""
        if bool(self.scaling.numpy()) == self.loss_scaling:
            return ""
        self.scaling.assign(int(self.loss_scaling))
        self.loss_scale.assign(INITIAL_LOSS_SCALE if self.loss_scaling else 1.0)
        self.good_steps.assign(0)
        return (
            f"the checkpoint was trained {'without' if self.loss_scaling else 'with'} float16 loss scaling and "
            f"this run {'uses' if self.loss_scaling else 'does not use'} it: the loss scale starts again at "
            f"{float(self.loss_scale.numpy()):g}"
        )

    # --- per replica --------------------------------------------------------------------------------------------
    def _loss_sums(self, batch):
        """(smoothed loss, nll, tokens) summed over the real target tokens of `batch`, float32 scalars."""
        inputs = {"source": batch["source"], "target_in": batch["target_in"]}
        labels = batch["target_out"]
        if self.jit_compile or not hasattr(self.model, "masked_logits"):
            logits = self.model(inputs, training=True)  # (batch, length, vocab)
            return smoothed_cross_entropy(logits, labels, label_smoothing=self.label_smoothing)
        mask = tf.not_equal(labels, PAD_ID)  # (batch, length)
        logits = self.model.masked_logits(inputs, mask, training=True)  # (tokens, vocab)
        loss, nll = token_cross_entropy(
            logits, tf.boolean_mask(labels, mask), label_smoothing=self.label_smoothing
        )
        return tf.reduce_sum(loss), tf.reduce_sum(nll), tf.cast(tf.size(loss), tf.float32)

    def _replica_grads_fn(self, batch):
        self.num_traces += 1  # Python side effect: runs once per trace, i.e. once per compiled shape
        with fused(kernels.ops() if self.on_cpu and not self.jit_compile else None):
            with tf.GradientTape() as tape:
                loss_sum, nll_sum, tokens = self._loss_sums(batch)
                scaled = loss_sum / self.loss_normaliser * self.loss_scale
            grads = tape.gradient(scaled, self.variables)
        grads = [  # dense (an untied embedding's gradient is sparse), float32 (no-op: variables are float32)
            tf.zeros_like(v, tf.float32) if g is None else tf.cast(tf.convert_to_tensor(g), tf.float32)
            for g, v in zip(grads, self.variables)
        ]
        return grads, tf.stack([loss_sum, nll_sum, tokens])

    # --- cross replica ------------------------------------------------------------------------------------------
    def _gradients_fn(self, batch):
        """All-reduced (gradient sums, [loss, nll, tokens] sums) of one (distributed) batch."""
        grads, sums = self.strategy.run(self._replica_grads, args=(batch,))
        reduce = tf.distribute.ReduceOp.SUM
        grads = [self.strategy.reduce(reduce, g, axis=None) for g in grads]
        return grads, self.strategy.reduce(reduce, sums, axis=None)

    def _accumulate_fn(self, batch):
        grads, sums = self._gradients_fn(batch)
        for accumulator, grad in zip(self.accumulators, grads):
            accumulator.assign_add(grad)
        self.sums.assign_add(sums)
        return sums

    def _apply_fn(self):
        metrics = self._update_fn([a.read_value() for a in self.accumulators], self.sums.read_value())
        for accumulator in self.accumulators:
            accumulator.assign(tf.zeros_like(accumulator))
        self.sums.assign(tf.zeros_like(self.sums))
        return metrics

    def _update_fn(self, grads, sums):
        loss_sum, nll_sum, tokens = tf.unstack(sums)
        # the summed, loss-scaled gradient times `factor` is the real one (token-normalised, unscaled)
        factor = self.loss_normaliser / (tf.maximum(tokens, 1.0) * self.loss_scale)
        # tf.linalg.global_norm's arithmetic on the real gradient, keeping the per-variable terms for the per-layer
        # norms: sum((factor g)^2) / 2 = factor^2 sum(g^2) / 2, so the gradients are scaled once, in the update, by
        # factor and the clipping factor together (one pass over them instead of two).
        half_squares = tf.stack([tf.nn.l2_loss(g) for g in grads]) * tf.square(factor)  # (variables,)
        grad_norm = tf.sqrt(tf.reduce_sum(half_squares) * 2.0)
        finite = tf.logical_and(tf.math.is_finite(grad_norm), tf.math.is_finite(loss_sum))
        if self.clipnorm > 0:
            # tf.clip_by_global_norm's factor, clipnorm / max(norm, clipnorm)
            safe_norm = tf.where(finite, grad_norm, 1.0)
            factor *= self.clipnorm * tf.minimum(1.0 / safe_norm, 1.0 / self.clipnorm)

        def apply_update():
            if isinstance(self.optimizer, FusedAdam):
                # the multiply inside the update: one C++ op for all variables on CPU (nmt.optimizer)
                self.optimizer.apply_scaled(
                    grads, factor, self.variables, kernels.ops() if self.on_cpu else None
                )
            else:
                self.optimizer.apply([g * factor for g in grads], self.variables)
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
        return {
            "applied": applied,
            "loss": loss_sum / tf.maximum(tokens, 1.0),
            "nll": nll_sum / tf.maximum(tokens, 1.0),
            "tokens": tokens,
            "grad_norm": grad_norm,
            "loss_scale": self.loss_scale.read_value(),
            "half_squared_grad_norms": half_squares,
        }

    def layer_grad_norms(self, metrics: dict) -> dict[str, float]:
        """Per-layer norms of the unclipped gradient of the update that returned `metrics` (grouped on the host).

        Reads `metrics["half_squared_grad_norms"]`, so it waits for that update to finish: call it on the steps that
        log the norms only.
        """
        half = np.asarray(metrics["half_squared_grad_norms"], np.float64)  # (variables,) sum(g^2) / 2
        return {
            name: float(np.sqrt(2.0 * half[indices].sum())) for name, indices in self.layer_groups.items()
        }

    def _relax(self, function, batch) -> None:
        """Traces `function` (`gradients` or `accumulate`) once for batches of any shape, before its first call.

        Left to `reduce_retracing`, the first batch shape of a process got a trace of its own (static shapes, other
        kernels and roundings) and later ones a relaxed trace: which steps ran which trace depended on where the
        process started, so a run resumed from a checkpoint drifted from the uninterrupted one whenever batches
        came in several shapes (buckets). Every step now runs the same relaxed trace, wherever the process started.
        """
        spec = tf.nest.map_structure(
            lambda value: tf.type_spec_from_value(value)._with_tensor_ranks_only(), batch
        )
        function.get_concrete_function(spec)
        self._relaxed.add(function)

    def step(self, batches) -> dict:
        """One optimizer update on the micro-batches `batches`; returns the metrics (tensors, see the module doc).

        One micro-batch goes straight from `gradients` to `update`; several are summed in the accumulators first.
        """
        with autoclustering(self.autocluster and not self.jit_compile):
            function = self.gradients if len(batches) == 1 else self.accumulate
            if not self.jit_compile and function not in self._relaxed:
                self._relax(function, batches[0])
            if len(batches) == 1:
                return self.update(*self.gradients(batches[0]))
            for batch in batches:
                self.accumulate(batch)
            return self.apply()
