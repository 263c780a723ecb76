"""The C++ squared norms (NmtHalfSquares, nmt/kernels/norms.cc) against float64 NumPy and TensorFlow's L2Loss; the
same bits for any thread count; NaN and inf pass through (the training step's finiteness check reads them)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

ROOT = Path(__file__).resolve().parents[2]
SHAPES = [(7,), (300, 256), (1,), (33, 5), (70_001,), (0, 3), (16_384,)]


def _tensors(seed):
    rng = np.random.default_rng(seed)
    return [rng.normal(0.0, 10.0 ** rng.integers(-3, 3), size=s).astype(np.float32) for s in SHAPES]


def test_half_squares_match_float64_numpy_and_l2_loss(ops):
    arrays = _tensors(0)
    ours = ops.nmt_half_squares([tf.constant(a) for a in arrays]).numpy()
    assert ours.shape == (len(SHAPES),) and ours.dtype == np.float32
    expected = np.array([(a.astype(np.float64) ** 2).sum() / 2 for a in arrays])
    np.testing.assert_allclose(ours, expected, rtol=2e-6)
    l2 = np.array([tf.nn.l2_loss(a).numpy() for a in arrays])
    np.testing.assert_allclose(ours, l2, rtol=1e-5)
    assert ours[SHAPES.index((0, 3))] == 0.0


def test_half_squares_are_the_same_bits_on_one_thread_and_on_all(ops):
    """Another process, its intra-op pool one thread (set before TensorFlow starts), gives the same bits."""
    everywhere = ops.nmt_half_squares([tf.constant(a) for a in _tensors(1)]).numpy()
    script = (
        "import sys, tensorflow as tf\n"
        "tf.config.threading.set_intra_op_parallelism_threads(1)\n"
        "sys.path.insert(0, 'tests/nmt')\n"
        "from test_kernels_norms import _tensors\n"
        "from nmt import kernels\n"
        "print(kernels.ops().nmt_half_squares([tf.constant(a) for a in _tensors(1)]).numpy().tobytes().hex())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-1] == everywhere.tobytes().hex()


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_element_makes_its_tensors_sum_non_finite(ops, bad):
    arrays = _tensors(2)
    arrays[4][12_345] = bad
    ours = ops.nmt_half_squares([tf.constant(a) for a in arrays]).numpy()
    assert not np.isfinite(ours[4]) and np.isfinite(np.delete(ours, 4)).all()
