"""The tiny shared run's translator for the tests of nmt/ that decode with it (test_translator,
test_translator_batches, test_source_pieces): one per module, so its traces are shared between a module's tests;
and for the CTranslate2 tests (test_ctranslate2_export, test_ctranslate2_engine) the run's `ours`, its float32 and
int8 `exports` (one pair per module) and a fresh `tokenizer`; the C++ kernels' library (`ops`, test_kernels and
test_losses). A module with fixtures of these names uses its own."""

import pytest

from data.tokenizer import Tokenizer
from nmt import kernels
from nmt.kernels import build
from nmt.translator import Translator
from tests.nmt.ctranslate2_helpers import export_float32_and_int8


@pytest.fixture(scope="module")
def shared_translator(tiny_run_dir):
    return Translator.from_run_dir(tiny_run_dir)


@pytest.fixture
def translator(shared_translator, tiny_run_dir):
    """The module's translator (traces shared between tests) with a tokenizer loaded for this test.

    conftest reseeds TensorFlow before each test, and tf.random.set_seed clears the eager kernel cache, which holds
    tensorflow_text's SentencePiece resources: a tokenizer created in an earlier test no longer works.
    """
    shared_translator.tokenizer = Tokenizer.load(tiny_run_dir / "tokenizer")
    shared_translator.batch_size = shared_translator.eval_config.batch_size
    return shared_translator


@pytest.fixture(scope="module")
def ours(tiny_run_dir):
    return Translator.from_run_dir(tiny_run_dir)


@pytest.fixture(scope="module")
def exports(ours, tmp_path_factory):
    """The fixture exported in float32 and int8 (needs ctranslate2: only its tests ask for it)."""
    return export_float32_and_int8(ours, tmp_path_factory.mktemp("ct2"))


@pytest.fixture
def tokenizer(tiny_run_dir):
    # conftest reseeds TensorFlow before each test, which destroys the SentencePiece resources of older tokenizers
    return Tokenizer.load(tiny_run_dir / "tokenizer")


@pytest.fixture(scope="module")
def ops():
    """The C++ kernels' op library (nmt.kernels), built here if `make install` has not (a machine without a C++
    compiler skips)."""
    try:
        build.build()
    except build.BuildError as error:
        if "no C++ compiler" in str(error):
            pytest.skip(str(error))
        raise
    kernels._load.cache_clear()
    library = kernels.ops()
    assert library is not None, kernels.unavailable()
    return library
