"""`data.config`: the `data:` section read by the data CLIs, the obsolete `shuffle_buffer`, and layering."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from common.config_tree import ConfigError
from data.config import DataConfig, load_data_config

REPO = Path(__file__).resolve().parents[2]


def test_inheritance_overrides_and_strict_data_section(tmp_path):
    (tmp_path / "parent.yaml").write_text("data:\n  vocab_size: 500\n  source: de\n  target: en\n")
    child = tmp_path / "child.yaml"
    child.write_text("base: parent.yaml\ndata:\n  max_length: 30\ntrain:\n  seed: 9\n")
    cfg, tree = load_data_config(child, ["data.target=fr", "data.bucket_boundaries=[8, 16]"])
    assert (cfg.vocab_size, cfg.source, cfg.target, cfg.max_length) == (500, "de", "fr", 30)
    assert cfg.bucket_boundaries == [8, 16] and tree["train"] == {"seed": 9}
    with pytest.raises(ConfigError, match="unknown config key data.vocab_sise"):
        load_data_config(child, ["data.vocab_sise=8"])
    with pytest.raises(ConfigError, match="data.tokenizer: 'wordpiece' is not one of"):
        load_data_config(child, ["data.tokenizer=wordpiece"])
    with pytest.raises(ConfigError, match="data.batch_tokens: must be positive"):
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


def test_data_package_imports_nothing_from_nmt_or_transformer():
    code = (
        "import sys, data.prepare, data.pipeline, data.stats, data.corpus, data.tokenizer, data.cache\n"
        "data.stats._parse_args(['--config', 'x'])\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('nmt', 'transformer'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=300)
