"""The "matmul-only" lower bound of a training step: the step's matmuls alone, same shapes, same dtype, no model.

For one batch of shape source ``(B, S)``, target ``(B, T)``, `batch_matmuls` lists the matrix products that our
`transformer.model.Transformer` (`attention: full`) and `nmt.train_step.TrainStep` compute in one training step,
derived from the config (d_model ``d``, d_ff ``f``, num_heads ``h``, num_layers ``L``, target vocabulary ``V``):

- every Dense of every layer, on the padded rows it runs on (Keras' Dense is a 2-D MatMul over the flattened
  rows): per encoder layer the Q, K, V, O projections ``(B*S, d) @ (d, d)`` and the feed-forward
  ``(B*S, d) @ (d, f)``, ``(B*S, f) @ (f, d)``; per decoder layer self Q, K, V, O and cross Q, O on ``B*T`` rows,
  cross K, V on the ``B*S`` memory rows, and the feed-forward on ``B*T`` rows;
- attention scores ``Q K^T`` and context ``P V`` per head, as batched matmuls over ``B*h`` of ``d/h`` wide heads:
  encoder self ``(S, S)``, decoder self ``(T, T)``, cross ``(T, S)``, on padded lengths (as computed);
- the output projection ``(rows, d) @ (d, V)``: ``rows`` is the number of real target tokens when the step projects
  only those (`Transformer.masked_logits`, XLA off) and ``B*T`` under XLA (static shapes); in the compute dtype when
  the projection is tied to the embedding, in float32 otherwise (an untied projection is a float32 Dense);
- the backward pass of each of them: for ``Y = A @ B`` the two products ``dA = dY @ B^T`` and ``dB = A^T @ dY``, as
  TensorFlow's MatMul gradient computes them (so forward + backward is 3x the forward FLOPs). No input gradient is
  skipped: the embedding is trained, so the gradient reaches the first layers' inputs.

Not counted: everything that is not a matmul (bias adds, softmaxes, layer norms, dropout, casts, the loss, the
optimizer update, embedding lookups), and the model's other attention variants (chunked and local encoder attention
are listed as full attention). Shared Q/K/V projections (`share_qkv`) still run one matmul per use, so they are
listed once per use.

The bound: `MatmulOnly` runs these products as one `tf.function` per distinct batch shape, in the row's compute dtype
(bfloat16 for mixed_bfloat16, float16 for mixed_float16, float32 otherwise), one after another (control
dependencies; each matmul already uses every intra-op thread), jit-compiled when the row is. Operands: one fixed
random tensor per operand shape holds the values (so memory does not grow with the number of products; they may be
warmer in cache than the step's own), but every product reads its own input of the function: a distinct tensor
object on that buffer (`tf.identity`; a variable for operands small enough that `tf.function` would inline them as
constants). Products of equal shapes on one input would be merged by XLA's common-subexpression elimination (16 of
201 dots left in a step, before); on distinct inputs none is (tests/benchmarks/test_matmul_bound.py counts the dots
of the optimized HLO, and the MatMul nodes of Grappler's graph). Every product is returned by the function, so
neither Grappler nor XLA can drop or shrink one. Its time per step is what the step would take if everything but
the matmuls were free.

FLOPs: ``2 m k n`` per product. Against `benchmarks.flops.train_flops` (the MFU count): both count
``6 x weights x rows`` and ``12 d x lengths^2`` per attention, but the MFU count uses non-padding lengths, the
target token count for every weight (the encoder runs on source rows), and counts biases and LayerNorm parameters as
weights; here padded rows and no bias. On a batch without padding and with ``S = T`` they differ only by the
``6 x (biases + LayerNorm parameters) x tokens`` term (a shared projection's bias once per use; tested), otherwise by the padding and the source/target
length difference: the record reports both counts.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from benchmarks.flops import COMPUTE_DTYPES
from transformer.vocab import PAD_ID


@dataclasses.dataclass(frozen=True)
class Matmul:
    """``op(A) @ op(B)`` with ``op(A)`` ``(batch, m, k)`` and ``op(B)`` ``(batch, k, n)`` (batch 0: plain 2-D)."""

    name: str
    batch: int
    m: int
    k: int
    n: int
    transpose_a: bool = False
    transpose_b: bool = False
    float32: bool = False  # runs in float32 whatever the compute dtype (an untied output projection)

    @property
    def flops(self) -> int:
        return 2 * max(self.batch, 1) * self.m * self.k * self.n

    @property
    def a_shape(self) -> tuple[int, ...]:
        return self._lead + ((self.k, self.m) if self.transpose_a else (self.m, self.k))

    @property
    def b_shape(self) -> tuple[int, ...]:
        return self._lead + ((self.n, self.k) if self.transpose_b else (self.k, self.n))

    @property
    def _lead(self) -> tuple[int, ...]:
        return (self.batch,) if self.batch else ()


def with_backward(forward: Matmul) -> list[Matmul]:
    """``[Y = A @ B, dA = dY @ B^T, dB = A^T @ dY]`` (shapes of ``op(A)`` and ``op(B)``)."""
    b, m, k, n = forward.batch, forward.m, forward.k, forward.n
    same = dict(batch=b, float32=forward.float32)
    return [
        forward,
        Matmul(f"{forward.name} dA", m=m, k=n, n=k, transpose_b=not forward.transpose_b, **same),
        Matmul(f"{forward.name} dB", m=k, k=m, n=n, transpose_a=not forward.transpose_a, **same),
    ]


def step_matmuls(
    *,
    batch_size: int,
    source_length: int,
    target_length: int,
    projection_rows: int,
    d_model: int,
    d_ff: int,
    num_heads: int,
    num_layers: int,
    vocab_size: int,
    tie_output: bool = True,
) -> list[Matmul]:
    """The matmuls of one training step, forward and backward (see the module docstring)."""
    d, heads = d_model, num_heads
    source_rows, target_rows = batch_size * source_length, batch_size * target_length

    def dense(name, rows, width_in, width_out):
        return [Matmul(name, 0, rows, width_in, width_out)]

    def attention(name, length_q, length_k):
        depth, groups = d // heads, batch_size * heads
        return [
            Matmul(f"{name} scores", groups, length_q, depth, length_k, transpose_b=True),  # Q K^T
            Matmul(f"{name} context", groups, length_q, length_k, depth),  # P V
        ]

    forward = []
    for i in range(num_layers):
        name = f"encoder {i}"
        for projection in "qkvo":
            forward += dense(f"{name} self {projection}", source_rows, d, d)
        forward += attention(f"{name} self", source_length, source_length)
        forward += dense(f"{name} ffn hidden", source_rows, d, d_ff)
        forward += dense(f"{name} ffn output", source_rows, d_ff, d)
    for i in range(num_layers):
        name = f"decoder {i}"
        for projection in "qkvo":
            forward += dense(f"{name} self {projection}", target_rows, d, d)
        forward += attention(f"{name} self", target_length, target_length)
        forward += dense(f"{name} cross q", target_rows, d, d)
        forward += dense(f"{name} cross k", source_rows, d, d)
        forward += dense(f"{name} cross v", source_rows, d, d)
        forward += dense(f"{name} cross o", target_rows, d, d)
        forward += attention(f"{name} cross", target_length, source_length)
        forward += dense(f"{name} ffn hidden", target_rows, d, d_ff)
        forward += dense(f"{name} ffn output", target_rows, d_ff, d)
    # Tied: logits = x @ E^T with E (V, d) in the compute dtype; untied: a float32 Dense (d, V).
    forward.append(
        Matmul(
            "output projection",
            0,
            projection_rows,
            d,
            vocab_size,
            transpose_b=tie_output,
            float32=not tie_output,
        )
    )
    return [product for matmul in forward for product in with_backward(matmul)]


def batch_matmuls(batch: dict, model_config, vocab_size: int, *, masked: bool) -> list[Matmul]:
    """`step_matmuls` for `batch` ({"source", "target_in", "target_out"}); `masked`: projection on real tokens only."""
    batch_size, source_length = (int(n) for n in batch["source"].shape)
    target_length = int(batch["target_in"].shape[1])
    real = int(np.count_nonzero(np.asarray(batch["target_out"]) != PAD_ID))
    return step_matmuls(
        batch_size=batch_size,
        source_length=source_length,
        target_length=target_length,
        projection_rows=real if masked else batch_size * target_length,
        d_model=model_config.d_model,
        d_ff=model_config.d_ff,
        num_heads=model_config.num_heads,
        num_layers=model_config.num_layers,
        vocab_size=vocab_size,
        tie_output=model_config.tie_output,
    )


def matmul_flops(matmuls: list[Matmul]) -> int:
    return sum(matmul.flops for matmul in matmuls)


class MatmulOnly:
    """The matmuls of one training pass over `batches` (one step per batch), runnable and timed alone.

    Args:
      batches: the train bench's batches.
      model_config: `nmt.config.ModelConfig` (d_model, d_ff, num_heads, num_layers, tie_output).
      vocab_size: target vocabulary size.
      precision: a Keras policy name of `benchmarks.flops.COMPUTE_DTYPES`.
      xla: jit-compile the functions (as the row's gradient step).
      masked: output projection on real target tokens only (our step without XLA).
    """

    def __init__(self, batches, model_config, vocab_size: int, *, precision: str, xla: bool, masked: bool):
        self.steps = [batch_matmuls(b, model_config, vocab_size, masked=masked) for b in batches]
        self.flops = sum(matmul_flops(step) for step in self.steps)
        compute_dtype = COMPUTE_DTYPES[precision]
        self.operands: dict = {}  # (shape, dtype name) -> the random values of every operand of that shape
        self.functions: dict = {}  # one per distinct step: tuple of its Matmuls -> tf.function
        for step in self.steps:
            key = tuple(step)
            if key not in self.functions:
                self.functions[key] = _matmul_function(step, compute_dtype, self.operands, jit_compile=xla)
        self._functions = [self.functions[tuple(step)] for step in self.steps]

    def run(self) -> float:
        """One pass (every step's matmuls, in order); returns once the work is done."""
        done = 0.0
        for function in self._functions:
            done += float(function()[1])  # a scalar of the last product: reading it waits for the chain
        return done


# tf.function captures eager tensors of at most this many elements by value, as constants (func_graph's
# _EAGER_CONST_THRESHOLD): products of constants could be folded at trace or compile time.
CAPTURED_BY_VALUE = 128


def _operand(shape: tuple[int, ...], dtype, operands: dict) -> tf.Tensor:
    """The random values of every operand of this shape and dtype (made once, kept in `operands`)."""
    key = (shape, dtype.name)
    if key not in operands:
        seed = [len(operands), 7]
        operands[key] = tf.cast(tf.random.stateless_normal(shape, seed=seed), dtype)
    return operands[key]


def _product_input(shape: tuple[int, ...], dtype, operands: dict):
    """An input of one product: its own tensor object (its own function input) with `_operand`'s values.

    `tf.identity` of an eager CPU tensor shares its buffer: no memory per product. A small operand would be captured
    as a constant, so it gets a variable of its own instead (a few hundred bytes).
    """
    values = _operand(shape, dtype, operands)
    if values.shape.num_elements() <= CAPTURED_BY_VALUE:
        return tf.Variable(values, trainable=False)
    return tf.identity(values)


def _matmul_function(matmuls: list[Matmul], compute_dtype, operands: dict, *, jit_compile: bool):
    """A `tf.function` computing `matmuls` one after another; returns (all products, a scalar of the last one).

    Each product multiplies inputs of its own (`_product_input`), so no two can be merged into one.
    """
    inputs = []
    for matmul in matmuls:
        dtype = tf.float32 if matmul.float32 else compute_dtype
        inputs.append(
            (_product_input(matmul.a_shape, dtype, operands), _product_input(matmul.b_shape, dtype, operands))
        )

    @tf.function(jit_compile=jit_compile)
    def run():
        products, previous = [], []
        for matmul, (a, b) in zip(matmuls, inputs):
            with tf.control_dependencies(previous):
                product = tf.matmul(a, b, transpose_a=matmul.transpose_a, transpose_b=matmul.transpose_b)
            products.append(product)
            previous = [product]
        return products, tf.reduce_sum(tf.cast(products[-1][..., :1, :1], tf.float32))

    return run
