"""Translator: how it plans its work, without decoding: batches longest first within the sentence and token budgets
(padded to a length edge under XLA, to the longest sentence without), and when it decodes under XLA on a CPU.
Its translations: test_translator.py."""

import numpy as np
import pytest
import tensorflow as tf

from nmt.translator import Translator


def test_batches_longest_first_within_the_sentence_and_token_budgets(translator):
    small = Translator(
        translator.model, translator.tokenizer, translator.eval_config,
        max_source_length=64, batch_size=4, batch_tokens=64,
    )  # fmt: skip
    widths = [small.padded_length(n) for n in (40, 20, 15, 5)]  # EOS included
    assert small.length_edges[-1] == 64 and widths == [64, 32, 16, 16]
    # 40 -> 64 wide: alone (two would be 128 tokens); 20 opens a 32-wide batch, 15 joins (64 tokens), 5 opens a
    # 16-wide batch that 3 and 2 join (48 tokens).
    assert small.batches([3, 40, 20, 5, 40, 2, 15]) == [[1], [4], [2, 6], [3, 0, 5]]
    lengths = list(np.random.default_rng(0).integers(0, 63, size=50))
    batches = small.batches(lengths)
    assert sorted(i for batch in batches for i in batch) == list(range(50))
    for batch in batches:
        width = max(small.padded_length(lengths[i]) for i in batch)
        assert len(batch) <= 4 and (len(batch) == 1 or len(batch) * width <= 64)
    # Without XLA a batch is as wide as its longest sentence and its EOS: 20 opens a 21-wide batch that 15 and 5
    # join (63 tokens; the 32-wide batch above had room for two), and 3 opens a 4-wide one with 2.
    assert [small.padded_length(n, xla=False) for n in (40, 20, 15, 5)] == [41, 21, 16, 6]
    assert small.batches([3, 40, 20, 5, 40, 2, 15], xla=False) == [[1], [4], [2, 6, 3], [0, 5]]


def test_xla_auto_on_cpu_only_for_greedy_search_of_many_lines(translator):
    from nmt.translator import XLA_AUTO_MIN_LINES

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("the rule for CPUs (a GPU host: XLA for every search)")
    auto = Translator(translator.model, translator.tokenizer, translator.eval_config, max_source_length=64)
    assert auto.xla == "auto"
    assert not auto.uses_xla(1, 1) and not auto.uses_xla(XLA_AUTO_MIN_LINES - 1, 1)
    assert auto.uses_xla(XLA_AUTO_MIN_LINES, 1) and not auto.uses_xla(XLA_AUTO_MIN_LINES, 4)
    for setting in (True, False):
        fixed = Translator(
            translator.model, translator.tokenizer, translator.eval_config, max_source_length=64, xla=setting
        )
        assert fixed.uses_xla(1, 4) is setting and fixed.uses_xla(XLA_AUTO_MIN_LINES, 1) is setting
