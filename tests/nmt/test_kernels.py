"""The C++ kernels (nmt.kernels) against the TensorFlow ops they replace: layer norm values and gradients
against `layer_normalization` and float64 NumPy, dropout bit for bit, the cross-entropy on bfloat16 logits against
the TensorFlow path on their float32 values (tests/nmt/test_losses.py runs the float32 cases on both paths against
NumPy); when the layers and the loss use them; the build's failure modes."""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from nmt import kernels
from nmt.kernels import build
from nmt.losses import token_cross_entropy
from transformer.dropout import dropout
from transformer.kernels import active, fused
from transformer.layer_norm import LayerNorm, layer_normalization


def _numpy_layer_norm(x, gamma, beta, dy, epsilon):
    """Float64 values and gradients (x, gamma, beta) of the layer norm over the last axis."""
    x, dy = x.astype(np.float64), dy.astype(np.float64)
    mean = x.mean(-1, keepdims=True)
    inv = 1.0 / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + epsilon)
    xhat = (x - mean) * inv
    g = dy * gamma
    dx = (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True)) * inv
    return xhat * gamma + beta, dx, (dy * xhat).sum(0), dy.sum(0)


def _as_float(t):
    return tf.cast(t, tf.float32).numpy()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", [(37, 7), (5, 33), (300, 256), (1, 16), (0, 8)])
def test_layer_norm_kernels_match_float64_numpy_and_the_tensorflow_path(ops, dtype, shape):
    rng = np.random.default_rng(sum(shape))
    x = tf.cast(rng.normal(2.0, 3.0, size=shape), dtype)
    dy = tf.cast(rng.normal(size=shape), dtype)
    gamma = tf.constant(rng.normal(size=shape[-1]), tf.float32)
    beta = tf.constant(rng.normal(size=shape[-1]), tf.float32)
    y, mean, inv_std = ops.nmt_layer_norm(x, gamma, beta, epsilon=1e-6)
    dx, d_gamma, d_beta = ops.nmt_layer_norm_grad(dy, x, mean, inv_std, gamma)
    assert y.dtype == dx.dtype == tf.as_dtype(dtype) and d_gamma.dtype == d_beta.dtype == tf.float32
    want = _numpy_layer_norm(_as_float(x), gamma.numpy(), beta.numpy(), _as_float(dy), 1e-6)
    # outputs rounded to the dtype: a few of its ulps; the parameter gradients are float32 sums over the rows
    tol = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-3}[dtype]
    for got, expected in zip((y, dx), want[:2]):
        np.testing.assert_allclose(
            _as_float(got), expected, rtol=tol, atol=tol * np.abs(expected).max(initial=1)
        )
    for got, expected in zip((d_gamma, d_beta), want[2:]):
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-4 * np.sqrt(shape[0]))
    with tf.GradientTape() as tape:
        tape.watch([x, gamma, beta])
        reference = layer_normalization(x, gamma, beta, 1e-6)
    grads = tape.gradient(reference, [x, gamma, beta], output_gradients=dy)
    np.testing.assert_allclose(_as_float(y), _as_float(reference), rtol=tol, atol=tol)
    np.testing.assert_allclose(_as_float(dx), _as_float(grads[0]), rtol=tol, atol=tol * 4)


def test_the_fused_layer_norm_matches_the_tensorflow_path_on_rank_3_bfloat16(ops):
    """`fused_layer_normalization` as the layer calls it: (B, L, d) bf16 in and out, gradients for x, gamma, beta."""
    from transformer.layer_norm import fused_layer_normalization

    rng = np.random.default_rng(8)
    x = tf.constant(rng.normal(1.0, 2.0, size=(3, 5, 24)), tf.bfloat16)
    dy = tf.constant(rng.normal(size=(3, 5, 24)), tf.bfloat16)
    gamma = tf.Variable(rng.normal(size=24).astype(np.float32))
    beta = tf.Variable(rng.normal(size=24).astype(np.float32))
    results = []
    for fn in (layer_normalization, lambda *args: fused_layer_normalization(*args, ops)):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x, gamma, beta, 1e-6)
        results.append([y, *tape.gradient(y, [x, gamma, beta], output_gradients=dy)])
    for (want, got), tol in zip(zip(*results), (2e-2, 2e-2, 1e-4, 1e-4)):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(_as_float(got), _as_float(want), rtol=tol, atol=tol)


def test_layer_norm_gradients_are_the_same_bits_on_every_call(ops):
    """dgamma/dbeta are summed per fixed block of rows, then the blocks in order: no dependence on scheduling."""
    rng = np.random.default_rng(3)
    x = tf.constant(rng.normal(size=(1000, 64)), tf.bfloat16)
    dy = tf.constant(rng.normal(size=(1000, 64)), tf.bfloat16)
    gamma, beta = tf.ones([64]), tf.zeros([64])
    _, mean, inv_std = ops.nmt_layer_norm(x, gamma, beta, epsilon=1e-6)
    first = [t.numpy() for t in ops.nmt_layer_norm_grad(dy, x, mean, inv_std, gamma)]
    for _ in range(3):
        again = [t.numpy() for t in ops.nmt_layer_norm_grad(dy, x, mean, inv_std, gamma)]
        for a, b in zip(first, again):
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


def test_layer_norm_kernel_names_a_wrong_gamma(ops):
    with pytest.raises(tf.errors.InvalidArgumentError, match="gamma/beta must be"):
        ops.nmt_layer_norm(tf.ones([4, 8]), tf.ones([7]), tf.zeros([8]), epsilon=1e-6)


@pytest.fixture(params=["native", "avx2"])
def isa(request, monkeypatch):
    """The dropout kernels' AVX-512 paths where this CPU has them ("native"), and the AVX2 paths an AVX2-only CPU
    runs (``NMT_KERNELS_ISA=avx2``, read at each kernel call): both tested on any x86 machine."""
    monkeypatch.setenv(kernels.ISA_ENV, request.param)
    return request.param


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
# 0.2533721923828125: a float16 scale that rounds differently through float32 than straight from the double
@pytest.mark.parametrize("rate", [0.1, 0.5, 0.2533721923828125])
def test_dropout_kernel_is_the_tensorflow_path_bit_for_bit(ops, isa, dtype, rate):
    """Forward and gradient, traced as the training step traces them, with inf, -inf and negative values among
    the inputs (x * 0 keeps -0; a NaN's sign is the one exception, see transformer.dropout)."""
    x = np.random.default_rng(5).normal(size=(33, 65)) * 4
    x[0, :3] = [np.inf, -np.inf, -0.5]
    x = tf.constant(x, dtype)
    dy = tf.cast(tf.random.stateless_normal([33, 65], seed=[4, 4]), dtype)

    def run(library):
        @tf.function
        def f(x, dy):
            with fused(library), tf.GradientTape() as tape:
                tape.watch(x)
                y = dropout(x, rate, tf.constant([9, 1]))
            return y, tape.gradient(y, x, output_gradients=dy)

        return f(x, dy)

    bits = tf.uint16 if dtype != "float32" else tf.uint32
    for tf_path, kernel_path in zip(run(None), run(ops)):
        assert tf_path.dtype == kernel_path.dtype
        same = tf.bitcast(tf_path, bits).numpy() == tf.bitcast(kernel_path, bits).numpy()
        nan = np.isnan(_as_float(tf_path)) & np.isnan(_as_float(kernel_path))
        assert np.all(same | nan)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_dropout_add_kernel_is_the_tensorflow_path_bit_for_bit(ops, isa, dtype):
    """residual + dropout(x) in one pass (the residual connection): value and both gradients as the TensorFlow
    path's multiply then add, with inf and -inf in x (a NaN's sign aside, as above); a residual of another dtype
    keeps the separate add."""
    x = np.random.default_rng(6).normal(size=(33, 65)) * 4
    x[0, :3] = [np.inf, -np.inf, -0.5]
    x = tf.constant(x, dtype)
    residual = tf.cast(tf.random.stateless_normal([33, 65], seed=[5, 5]), dtype)
    dy = tf.cast(tf.random.stateless_normal([33, 65], seed=[4, 4]), dtype)

    def run(library, residual=residual):
        @tf.function
        def f(x, residual, dy):
            with fused(library), tf.GradientTape() as tape:
                tape.watch([x, residual])
                y = dropout(x, 0.1, tf.constant([9, 1]), residual=residual)
            return (y, *tape.gradient(y, [x, residual], output_gradients=tf.cast(dy, y.dtype)))

        ops_used = {op.type for op in f.get_concrete_function(x, residual, dy).graph.get_operations()}
        return f(x, residual, dy), ops_used

    (tf_path, tf_ops), (kernel_path, kernel_ops) = run(None), run(ops)
    assert "NmtDropoutAdd" in kernel_ops and "NmtDropoutAdd" not in tf_ops
    bits = tf.uint16 if dtype != "float32" else tf.uint32
    for a, b in zip(tf_path, kernel_path):
        assert a.dtype == b.dtype
        nan = np.isnan(_as_float(a)) & np.isnan(_as_float(b))
        assert np.all((tf.bitcast(a, bits).numpy() == tf.bitcast(b, bits).numpy()) | nan)
    wide = tf.cast(residual, tf.float64)
    (wide_tf, _), (wide_kernel, wide_ops) = run(None, residual=wide), run(ops, residual=wide)
    assert "NmtDropoutAdd" not in wide_ops and "NmtDropout" in wide_ops
    for a, b in zip(wide_tf, wide_kernel):
        np.testing.assert_array_equal(
            _as_float(a) if a.dtype != tf.float64 else a.numpy(),
            b.numpy() if b.dtype == tf.float64 else _as_float(b),
        )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dropout_kernel_draws_tensorflows_philox_numbers_across_a_counter_carry(ops, isa, dtype):
    """The kernel's Philox against TensorFlow's on a counter whose low 64 bits overflow within the tensor (the
    128-bit add of PhiloxRandom::Skip), on a size that is no multiple of the kernel's 256-element blocks nor of 8
    (the mask's last byte partly used); bfloat16 runs 16 elements a step on AVX-512 (the rest one by one)."""
    size, threshold = 1002, 30000
    key = tf.constant([0x0123456789ABCDEF], tf.uint64)
    counter = tf.constant([2**64 - 37, 2**32 - 1], tf.uint64)  # blocks 37.. carry into the high word
    words = tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=[size // 2], key=key, counter=counter, alg=1, dtype=tf.uint32
    )
    draws = tf.bitcast(words, tf.uint16).numpy().reshape(-1)
    x = tf.constant(np.arange(1, size + 1), dtype)
    y, mask = ops.nmt_dropout(x, key, counter, threshold=threshold, scale=2.0)
    keep = draws >= threshold
    np.testing.assert_array_equal(_as_float(y), np.where(keep, 2.0 * _as_float(x), 0.0))
    # the keep decisions as bits, element i at bit i % 8 of byte i / 8; the gradient kernel multiplies by them
    np.testing.assert_array_equal(mask.numpy(), np.packbits(keep, bitorder="little"))
    dy = tf.constant(np.arange(size, 0, -1), dtype)
    dx = ops.nmt_dropout_grad(dy, mask, scale=2.0)
    np.testing.assert_array_equal(_as_float(dx), np.where(keep, 2.0 * _as_float(dy), 0.0))


def test_dropout_gradient_kernel_names_a_mask_of_another_size(ops):
    _, mask = ops.nmt_dropout(
        tf.ones([10]), tf.constant([1], tf.uint64), tf.constant([1, 2], tf.uint64), threshold=10, scale=1.5
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="mask must be NmtDropout's for 17 elements"):
        ops.nmt_dropout_grad(tf.ones([17]), mask, scale=1.5)


def test_dropout_kernel_names_a_wrong_key_or_counter(ops):
    with pytest.raises(tf.errors.InvalidArgumentError, match="key and counter must be"):
        ops.nmt_dropout(
            tf.ones([4, 4]), tf.constant([1], tf.uint64), tf.constant([1], tf.uint64), threshold=10, scale=1.5
        )


def _loss_and_gradient(logits, labels, d_loss, d_nll, library):
    """(loss, nll, d logits) of `token_cross_entropy` traced inside ``fused(library)``."""

    @tf.function
    def f(logits):
        with fused(library), tf.GradientTape() as tape:
            tape.watch(logits)
            loss, nll = token_cross_entropy(logits, labels, label_smoothing=0.1)
            total = tf.reduce_sum(loss * d_loss) + tf.reduce_sum(nll * d_nll)
        return loss, nll, tape.gradient(total, logits)

    return f(logits)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cross_entropy_kernel_reads_low_precision_logits_as_the_tensorflow_path_their_float32_cast(
    ops, dtype
):
    """The kernels read bfloat16/float16 logits as they are; the TensorFlow path casts them to float32 first and
    its float32 gradient back: the same values to float32 rounding, the gradient to one unit of the low
    precision's last place where float32 rounding lands on the other side of a rounding boundary."""
    rng = np.random.default_rng(3)
    logits = tf.constant(rng.normal(0.0, 4.0, size=(70, 1003)), dtype)
    labels = tf.constant(rng.integers(0, 1003, 70), tf.int32)
    d_loss = tf.constant(rng.normal(size=70), tf.float32)
    d_nll = tf.constant(rng.normal(size=70), tf.float32)
    loss, nll, grad = _loss_and_gradient(logits, labels, d_loss, d_nll, ops)
    assert grad.dtype == logits.dtype and loss.dtype == nll.dtype == tf.float32
    want_loss, want_nll, want_grad = _loss_and_gradient(
        tf.cast(logits, tf.float32), labels, d_loss, d_nll, None
    )
    np.testing.assert_allclose(loss.numpy(), want_loss.numpy(), rtol=2e-6)
    np.testing.assert_allclose(nll.numpy(), want_nll.numpy(), rtol=2e-6, atol=1e-6)
    want_grad = tf.cast(want_grad, logits.dtype)  # the TensorFlow path's Cast gradient
    # one unit in the last place: relative, and float16's absolute one among its subnormals (under 2^-14)
    ulp, tiny = (2.0**-7, 0.0) if dtype == "bfloat16" else (2.0**-10, 2.0**-24)
    assert np.all(np.abs(_as_float(grad) - _as_float(want_grad)) <= ulp * np.abs(_as_float(want_grad)) + tiny)
    assert np.mean(_as_float(grad) == _as_float(want_grad)) > 0.99


def test_cross_entropy_kernels_give_the_same_bits_on_every_call(ops):
    """Each row is reduced in one order whatever the thread, schedule or buffer address (an unaligned buffer
    changed the order of Eigen's vectorised sums with its address)."""
    rng = np.random.default_rng(8)
    logits = tf.constant(rng.normal(0.0, 4.0, size=(50, 1003)), tf.bfloat16)
    labels = tf.constant(rng.integers(0, 1003, 50), tf.int32)
    d_loss = tf.constant(rng.normal(size=50), tf.float32)
    first = None
    for _ in range(20):
        loss, nll, top, log_sum = ops.nmt_cross_entropy(logits, labels, label_smoothing=0.1)
        grad = ops.nmt_cross_entropy_grad(logits, labels, top, log_sum, d_loss, d_loss, label_smoothing=0.1)
        got = [t.numpy().tobytes() for t in (loss, nll, log_sum, tf.bitcast(grad, tf.uint16))]
        first = first or got
        assert got == first


def test_cross_entropy_kernel_makes_a_row_with_a_nan_or_an_infinity_nan(ops):
    """The step skips an update whose loss is not finite: a bad logit must not vanish in the max or the sum."""
    logits = np.zeros((4, 9), np.float32)
    logits[0, 2], logits[1, 5], logits[2, 0] = np.nan, np.inf, -np.inf
    loss, nll, _, _ = ops.nmt_cross_entropy(
        tf.constant(logits), tf.constant([1, 1, 1, 1]), label_smoothing=0.1
    )
    assert np.isnan(loss.numpy()[:2]).all() and np.isnan(nll.numpy()[:2]).all()
    # -inf is a logit of probability 0 (the TensorFlow path's smoothing term is then inf too: log p = -inf)
    assert np.isfinite(nll.numpy()[2:]).all() and np.isfinite(loss.numpy()[3])


def test_cross_entropy_kernels_name_a_label_outside_the_vocabulary_and_a_wrong_shape(ops):
    with pytest.raises(tf.errors.InvalidArgumentError, match="label 9 at row 1 is outside the vocabulary"):
        ops.nmt_cross_entropy(tf.zeros([2, 9]), tf.constant([0, 9]), label_smoothing=0.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="one value per row"):
        ops.nmt_cross_entropy_grad(
            tf.zeros([2, 9]),
            *[tf.constant([0, 1]), tf.zeros([2]), tf.zeros([2]), tf.zeros([3]), tf.zeros([2])],
            label_smoothing=0.0,
        )


def _op_types(function, *args):
    return {op.type for op in function.get_concrete_function(*args).graph.get_operations()}


def test_layers_use_the_kernels_only_when_training_inside_fused(ops):
    """Inference, exports and XLA trace outside `fused()`: a SavedModel never holds an op of the library."""
    norm = LayerNorm(epsilon=1e-6)
    norm.build((None, 8))
    x = tf.TensorSpec([None, 8], tf.bfloat16)

    def traced(training, library):
        @tf.function
        def f(x):
            with fused(library):
                return norm(x, training=training)

        return _op_types(f, x)

    assert "NmtLayerNorm" in traced(True, ops)
    for training, library in ((False, ops), (None, ops), (True, None)):
        assert not any(op.startswith("Nmt") for op in traced(training, library))
    # no float64 kernel: the TensorFlow ops
    x = tf.TensorSpec([None, 8], tf.float64)
    assert not any(op.startswith("Nmt") for op in traced(True, ops))


def test_the_loss_uses_the_kernels_only_inside_fused(ops):
    def traced(library, dtype):
        @tf.function
        def f(logits, labels):
            with fused(library), tf.GradientTape() as tape:
                tape.watch(logits)
                loss, _ = token_cross_entropy(logits, labels, label_smoothing=0.1)
            return tape.gradient(loss, logits)

        return _op_types(f, tf.TensorSpec([None, 8], dtype), tf.TensorSpec([None], tf.int32))

    assert {"NmtCrossEntropy", "NmtCrossEntropyGrad"} <= traced(ops, tf.bfloat16)
    assert "Cast" not in traced(ops, tf.bfloat16)  # no float32 copy of the logits
    assert not any(op.startswith("Nmt") for op in traced(None, tf.bfloat16) | traced(ops, tf.float64))


def test_build_without_a_compiler_says_so_and_loses_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv(build.DIR_ENV, str(tmp_path / "kernels"))
    run = [sys.executable, "-m", "nmt.kernels.build"]
    quiet = subprocess.run(run, capture_output=True, text=True, check=False)
    assert quiet.returncode == 0 and "not built" in quiet.stderr and "TensorFlow's ops" in quiet.stderr
    strict = subprocess.run([*run, "--strict"], capture_output=True, text=True, check=False)
    assert strict.returncode == 1 and "no-such-compiler" in strict.stderr
    assert not list(tmp_path.rglob("*.so"))


def test_a_failing_compile_leaves_no_library_and_the_layers_fall_back(tmp_path, monkeypatch):
    compiler = tmp_path / "cxx"
    compiler.write_text("#!/bin/sh\necho 'x.cc:1: error: boom' >&2\nexit 1\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    monkeypatch.setenv(build.DIR_ENV, str(tmp_path / "kernels"))
    with pytest.raises(build.BuildError, match="boom"):
        build.build()
    # no staging file left behind
    assert list((tmp_path / "kernels").iterdir()) == []
    kernels._load.cache_clear()
    try:
        assert kernels.ops() is None and "not built" in kernels.unavailable()
        with fused(kernels.ops()):
            assert active(tf.bfloat16) is None
    finally:
        kernels._load.cache_clear()


def test_a_broken_library_file_is_reported_and_not_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv(build.DIR_ENV, str(tmp_path))
    build.library_path().write_bytes(b"not an ELF file")
    kernels._load.cache_clear()
    try:
        assert kernels.ops() is None and "does not load" in kernels.unavailable()
    finally:
        kernels._load.cache_clear()


def test_an_unknown_isa_is_named_not_ignored(monkeypatch):
    """A typo in NMT_KERNELS_ISA: TensorFlow's ops, the reason in the log's `C++ kernels:` line (not a crash, nor the
    AVX-512 paths taken silently)."""
    monkeypatch.setenv(kernels.ISA_ENV, "avx3")
    kernels._load.cache_clear()
    try:
        assert kernels.ops() is None
        assert kernels.unavailable() == "NMT_KERNELS_ISA='avx3' is none of avx2 or native (unset: native)"
    finally:
        kernels._load.cache_clear()
