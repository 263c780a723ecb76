"""data.native_stderr: SentencePiece's identity-normalization notice is held back, every other line passes."""

import os

import tensorflow as tf

from data.native_stderr import IDENTITY_NOTICE, without_lines
from data.tokenizer import Tokenizer

NOTICE = b"normalizer.cc(51) LOG(INFO) precompiled_charsmap is empty. use identity normalization.\n"


def test_building_a_tokenizer_prints_no_identity_notice(tokenizer, capfd):
    """TF Text writes the notice on fd 2 when it creates a model's resource: after `tf.random.set_seed` (which
    clears TF's kernel cache, so the resources are created again), for a new `Tokenizer` of the same model."""
    tf.random.set_seed(3)
    capfd.readouterr()
    fresh = Tokenizer(*tokenizer.models)
    assert (
        fresh.detokenize_target(fresh.tokenize_target(tf.constant(["Ein Hund."]))).numpy()[0] == b"Ein Hund."
    )
    assert "precompiled_charsmap" not in capfd.readouterr().err


def test_other_lines_pass_in_order(capfd):
    with without_lines(IDENTITY_NOTICE):
        os.write(2, b"kept\n" + NOTICE)
        os.write(2, b"also kept\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "kept\nalso kept\nafter\n"


def test_file_descriptor_2_is_restored_when_the_block_raises(capfd):
    try:
        with without_lines(IDENTITY_NOTICE):
            os.write(2, b"before the error\n")
            raise RuntimeError("inside")
    except RuntimeError:
        pass
    os.write(2, b"restored\n")
    assert capfd.readouterr().err == "before the error\nrestored\n"
