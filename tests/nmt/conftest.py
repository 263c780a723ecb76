"""The tiny shared run's translator for the tests of nmt/ that decode with it (test_translator, test_source_pieces):
one per module, so its traces are shared between a module's tests. A module with fixtures of these names uses its
own."""

import pytest

from data.tokenizer import Tokenizer
from nmt.translator import Translator


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
