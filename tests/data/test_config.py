"""`data.config`: the `data:` section read by the data CLIs, the obsolete `shuffle_buffer`, and layering."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.config_tree import ConfigError
from data.config import DataConfig, load_data_config, new_data_problem, validate_data_config

REPO = Path(__file__).resolve().parents[2]


def test_inheritance_overrides_and_strict_data_section(tmp_path):
    (tmp_path / "parent.yaml").write_text("data:\n  vocab_size: 500\n  source: de\n  target: en\n")
    child = tmp_path / "child.yaml"
    child.write_text("base: parent.yaml\ndata:\n  max_length: 30\ntrain:\n  seed: 9\n")
    cfg, tree = load_data_config(child, ["data.target=fr", "data.bucket_boundaries=[8, 16]"])
    assert (cfg.vocab_size, cfg.source, cfg.target, cfg.max_length) == (500, "de", "fr", 30)
    assert cfg.bucket_boundaries == [8, 16] and tree["train"] == {"seed": 9}
    with pytest.raises(
        ConfigError, match=r"unknown config key data.vocab_sise \(did you mean data.vocab_size\? "
    ):
        load_data_config(child, ["data.vocab_sise=8"])
    with pytest.raises(
        ConfigError, match=r"unknown config key data.zzz \(known keys of data: "
    ):  # nothing close
        load_data_config(child, ["data.zzz=8"])
    with pytest.raises(ConfigError, match="data.tokenizer: 'wordpiece' is not one of"):
        load_data_config(child, ["data.tokenizer=wordpiece"])
    with pytest.raises(ConfigError, match=r"data\.batch_tokens: must be in \[1, 2147483647\], got 0"):
        load_data_config(child, ["data.batch_tokens=0"])


def test_obsolete_shuffle_buffer_is_accepted_and_ignored_with_a_warning(tmp_path, caplog):
    saved = tmp_path / "config.yaml"  # as in run directories written before the key was removed
    saved.write_text("data:\n  vocab_size: 300\n  shuffle_buffer: 30000\n")
    cfg, _ = load_data_config(saved)
    assert cfg.vocab_size == 300 and not hasattr(cfg, "shuffle_buffer")
    assert "ignoring the obsolete config key data.shuffle_buffer" in caplog.text
    assert "shuffle_buffer" not in DataConfig().__dict__


def test_nmt_config_still_exports_data_config():
    from nmt.config import DataConfig as Reexported
    from nmt.config import load_config

    assert Reexported is DataConfig
    assert load_config("tiny.yaml").data.vocab_size == load_data_config("tiny.yaml")[0].vocab_size


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "data.vocab_size=3",
            r"data\.vocab_size: must be in \[6, 2147483647\], got 3 \(room for the 4 special pieces",
        ),
        ("data.vocab_size=5", r"data\.vocab_size: must be in \[6, 2147483647\], got 5"),
        ("data.max_length=1", r"data\.max_length: must be in \[2, 65535\], got 1"),
        # the length index saturates at 65535: a longer pair would pass the filter (before 2026-12-07d accepted)
        ("data.max_length=65536", r"data\.max_length: must be in \[2, 65535\], got 65536"),
        ("data.max_length=99999999999999999999", r"data\.max_length: must be in \[2, 65535\]"),
        ("data.batch_tokens=-1", r"data\.batch_tokens: must be in \[1, 2147483647\], got -1"),
        ("data.eval_batch_tokens=0", r"data\.eval_batch_tokens: must be in \[1, 2147483647\], got 0"),
        (
            "data.tokenizer_max_sentences=0",
            r"data\.tokenizer_max_sentences: must be in \[1, 2147483647\], got 0",
        ),
        (
            "data.bucket_boundaries=[30, 10, 0]",
            r"data\.bucket_boundaries\[2\]: must be in \[1, 2147483647\], got 0",
        ),
        (
            "data.bucket_boundaries=[-8]",
            r"data\.bucket_boundaries\[0\]: must be in \[1, 2147483647\], got -8",
        ),
        (
            "data.bucket_boundaries=[30, 10]",
            r"data\.bucket_boundaries: must be strictly increasing, got \[30, 10\]",
        ),
        ("data.bucket_boundaries=[8, 16, 16]", r"strictly increasing, got \[8, 16, 16\] \(16 after 16\)"),
        ("data.subword_dropout=1", r"data\.subword_dropout: must be in \[0, 1\), got 1\.0"),
        ("data.subword_dropout=-0.1", r"data\.subword_dropout: must be in \[0, 1\), got -0\.1"),
        ("data.subword_dropout=.nan", r"data\.subword_dropout: expected a number, got NaN"),
        ("data.target=en", r"data\.source and data\.target are both 'en': a direction needs two languages"),
        ("data.target=cs", r"data\.target: multi30k has no language 'cs' \(it has en, de, fr\)"),
    ],
)
def test_data_ranges_are_checked_at_config_time(override, message):
    """Before any data is read: `data.prepare` and `data.stats` exit 2 on these, as train.py does."""
    with pytest.raises(ConfigError, match=message):
        load_data_config("tiny.yaml", [override])


def test_a_batch_budget_below_the_longest_pairs_is_a_new_run_problem():
    """Batches of the longest bucket would be over data.batch_tokens (before 2026-12-07d accepted, silently): a new
    run refuses it (train.py, exit 2: tests/nmt/test_config.py); the data tools and a saved run's config load it."""
    cfg, _ = load_data_config("tiny.yaml", ["data.batch_tokens=39"])
    assert new_data_problem(cfg) == (
        "data.batch_tokens: 39 is less than data.max_length=40: a batch of the longest pairs could not keep to it "
        "(raise data.batch_tokens or lower data.max_length)"
    )
    assert new_data_problem(load_data_config("tiny.yaml", ["data.batch_tokens=40"])[0]) == ""


def test_data_range_boundaries_are_accepted():
    cfg, _ = load_data_config(
        "tiny.yaml",
        ["data.vocab_size=6", "data.max_length=2", "data.batch_tokens=2", "data.eval_batch_tokens=1"]
        + [
            "data.tokenizer_max_sentences=1",
            "data.bucket_boundaries=[1, 2, 50]",
            "data.subword_dropout=0.999",
        ],
    )
    assert (cfg.vocab_size, cfg.max_length, cfg.batch_tokens, cfg.eval_batch_tokens) == (6, 2, 2, 1)
    assert (
        load_data_config("tiny.yaml", ["data.max_length=65535", "data.batch_tokens=65535"])[0].max_length
        == 65535
    )
    assert (cfg.tokenizer_max_sentences, cfg.bucket_boundaries, cfg.subword_dropout) == (1, [1, 2, 50], 0.999)
    assert (
        load_data_config("tiny.yaml", ["data.subword_dropout=1e-1"])[0].subword_dropout == 0.1
    )  # YAML 1.1 string


def test_a_data_config_built_in_code_is_checked_too():
    validate_data_config(DataConfig(bucket_boundaries=[8, 16]))
    with pytest.raises(
        ConfigError, match=r"data\.bucket_boundaries\[0\]: must be in \[1, 2147483647\], got 0"
    ):
        validate_data_config(DataConfig(bucket_boundaries=[0, 16]))
    with pytest.raises(ConfigError, match=r"data\.bucket_boundaries: must be strictly increasing"):
        validate_data_config(DataConfig(bucket_boundaries=[16, 8]))
    with pytest.raises(ConfigError, match=r"data\.vocab_size: must be in \[6, 2147483647\], got 4"):
        validate_data_config(DataConfig(vocab_size=4))


def test_non_string_keys_in_the_data_section(tmp_path):
    path = tmp_path / "keys.yaml"
    path.write_text("data:\n  vocab_size: 300\n  1: 2\n  null: 3\n")
    with pytest.raises(ConfigError, match=r"config keys must be strings: data has the key 1 \(int\)"):
        load_data_config(path)


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_has_a_valid_data_section(path):
    cfg, _ = load_data_config(path)
    validate_data_config(cfg)


def test_overrides_of_other_sections_are_named_as_unchecked(caplog):
    """The data tools apply `--set model.d_modle=3` to the tree without a schema for it: they say so."""
    with caplog.at_level("WARNING", logger="data.config"):
        load_data_config("tiny.yaml", ["data.vocab_size=64", "model.d_modle=3", "train.seed=5"])
    (record,) = caplog.records
    assert "model.d_modle, train.seed: not checked here" in record.getMessage()
    caplog.clear()
    with caplog.at_level("WARNING", logger="data.config"):
        load_data_config("tiny.yaml", ["data.vocab_size=64"])
    assert not caplog.records
