"""benchmarks.train_sequence on the tiny corpus: the record counts the epoch's real tokens and shapes, per setting."""

import numpy as np
import pytest

from nmt.config import config_from_dict
from tests.run_fixture import tiny_config_tree, write_corpus


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from data.tokenizer import Tokenizer
    from data.tokenizer_training import train_tokenizer

    root = tmp_path_factory.mktemp("sequence")
    config = config_from_dict(tiny_config_tree(write_corpus(root / "corpus")))
    train_tokenizer(config.data, root / "tokenizer", seed=config.train.seed)
    return config, Tokenizer.load(root / "tokenizer")


def test_record_counts_the_real_target_tokens_of_the_epochs_first_batches(tiny):
    from benchmarks.train_sequence import measure
    from data.pipeline import make_train_dataset

    config, tokenizer = tiny
    # Under fusible, only step.autocluster differs: tests/nmt/test_xla.py.
    record = measure(config, tokenizer, precision="float32", xla="off", steps=4)
    batches = list(make_train_dataset(config.data, tokenizer, seed=config.train.seed, repeat=True).take(4))
    assert record["target_tokens"] == sum(int(np.count_nonzero(b["target_out"].numpy())) for b in batches)
    assert record["batch_shapes"] == len({(b["source"].shape, b["target_in"].shape) for b in batches})
    assert record["xla"] == "off" and record["steps"] == 4 and record["seconds"] > 0
    assert record["tokens_per_sec"] == pytest.approx(record["target_tokens"] / record["seconds"], rel=0.01)
    assert set(record["tokens_per_sec_after"]) == {"1", "2", "3"}
    assert all(1 <= step <= 4 for step, _ in record["slow_steps"])  # which ones: the machine's (below, fixed)


def test_slow_steps_are_the_steps_over_the_threshold_from_their_end_times():
    from benchmarks.train_sequence import slow_steps

    assert slow_steps([0.5, 2.5, 2.6, 5.0], threshold=1.5) == [[2, 2.0], [4, 2.4]]
    assert slow_steps([2.0], threshold=1.5) == [[1, 2.0]]  # the first step is timed from 0
    assert slow_steps([1.0, 2.5], threshold=1.5) == []  # exactly the threshold is not over it


def test_cli_refuses_unknown_settings():
    from benchmarks.train_sequence import parse_args

    for argv in (["--xla", "on"], ["--xla", ""], ["--steps", "1"], ["--precision", "bogus"]):
        with pytest.raises(SystemExit) as exit_info:
            parse_args(argv)
        assert exit_info.value.code == 2
    assert parse_args([]).xla == ["off", "fusible"]


def test_rate_after_covers_the_steps_after_the_first_n():
    """Steps of 10, 20, 30, 40 tokens ending at 1, 2, 4, 8 s: after the first 2, steps 3-4 (70 tokens in 6 s);
    before 2026-12-07d the rate after 2 covered step 4 alone (40 tokens in 4 s)."""
    import numpy as np

    from benchmarks.train_sequence import rate_after

    cumulative, ends = np.cumsum([10, 20, 30, 40]), np.array([1.0, 2.0, 4.0, 8.0])
    assert rate_after(cumulative, ends, 2) == round(70 / 6, 1)
    assert rate_after(cumulative, ends, 0) == round(100 / 8, 1) and rate_after(cumulative, ends, 1) == round(
        90 / 7, 1
    )
    assert rate_after(cumulative, ends, 3) is None
