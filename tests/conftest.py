"""Shared test set-up: quiet TensorFlow, fixed seeds, CPU only, a private prepared-data cache."""

import atexit
import logging
import os
import shutil
import signal
import tempfile

# Tests signal their train.py/translate.py subprocesses with SIGINT. A shell that starts `make test` in the
# background without job control (`(make test &)`, a script's `nohup make test &`) sets SIGINT to "ignored", and
# every child inherits that through exec: those tests would wait for a signal that never lands. With a handler here
# the children start with the default disposition again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# Prepared data goes to a cache of this session (inherited by the train.py subprocesses of the tests), never to
# the user's ~/.cache/nmt/prepared: every temporary corpus has its own cache key and would pile up there.
_DATA_CACHE = tempfile.mkdtemp(prefix="nmt-test-cache-")
os.environ["NMT_DATA_CACHE"] = _DATA_CACHE
atexit.register(shutil.rmtree, _DATA_CACHE, ignore_errors=True)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import nmt.xla  # noqa: E402, F401  (TF_XLA_FLAGS before TensorFlow reads them: train.xla fusible)


@pytest.fixture(autouse=True)
def _fixed_seeds():
    import keras

    keras.utils.set_random_seed(1234)
    np.random.seed(1234)
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.fixture
def restore_logging():
    """The CLIs' `setup_logging` replaces the root handlers and sets the levels of the libraries' loggers: put
    pytest's back after an in-process CLI call (`tests.faults.helpers.run_main`)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    libraries = {name: logging.getLogger(name).level for name in ("tensorflow", "absl", "h5py")}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, library_level in libraries.items():
        logging.getLogger(name).setLevel(library_level)


@pytest.fixture(scope="session")
def tiny_run_dir(tmp_path_factory, request):
    """The tiny trained run directory (tests/run_fixture.py), shared by every test of the session."""
    from tests.run_fixture import shared_tiny_run_dir

    return shared_tiny_run_dir(tmp_path_factory, getattr(request.config, "cache", None))
