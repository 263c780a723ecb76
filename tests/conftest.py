"""Shared test set-up: quiet TensorFlow, fixed seeds, CPU only."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fixed_seeds():
    import keras

    keras.utils.set_random_seed(1234)
    np.random.seed(1234)
    yield
    keras.mixed_precision.set_global_policy("float32")
