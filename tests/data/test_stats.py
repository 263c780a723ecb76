"""`python -m data.stats`: one JSON line on stdout, logs on stderr, exit 2 on a config error."""

from __future__ import annotations

import json

import pytest

from data.stats import main
from data.tokenizer import Tokenizer
from tests.data.conftest import SIZES


def write_config(tmp_path, mirror, prepared_dir, extra: str = "") -> str:
    path = tmp_path / "stats.yaml"
    path.write_text(
        "data:\n"
        f"  cache_dir: {tmp_path / 'cache'}\n"
        f"  manual_dir: {mirror}\n"
        f"  data_dir: {prepared_dir}\n"
        "  vocab_size: 96\n"
        "  max_length: 20\n"
        "  batch_tokens: 256\n"
        "model:\n"
        "  max_length: 64\n" + extra
    )
    return str(path)


def test_prints_one_json_line(tmp_path, mirror, prepared_dir, capsys):
    config = write_config(tmp_path, mirror, prepared_dir)
    assert main(["--config", config, "--set", "train.seed=5", "--tokenizer-dir", str(tmp_path / "spm")]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    stats = json.loads(out)
    assert stats["splits"] == {
        "train": SIZES["train"],
        "validation": SIZES["val"],
        "test": SIZES["test_2016_flickr"],
    }
    assert stats["vocab_size"] == 96 and (tmp_path / "spm" / "spm.model").is_file()
    assert sorted(p.name for p in (tmp_path / "spm").iterdir()) == ["spm.model"]  # no staging folder left
    # the tokenizer data.prepare trains for this config (its seed, not train.seed): the same model bytes
    from data.config import DataConfig
    from data.prepare import cached_tokenizer

    data = DataConfig(
        manual_dir=str(mirror), data_dir=str(prepared_dir), cache_dir=str(tmp_path / "cache"), vocab_size=96,
        max_length=20, batch_tokens=256,
    )  # fmt: skip
    assert cached_tokenizer(data).models == Tokenizer.load(tmp_path / "spm").models
    # The round trip, from the sentencepiece package on the validation sentences (96 pieces: no byte fallback for
    # characters unseen in training, capitals of rare sentence starts: some are not exact)
    import numpy as np
    import sentencepiece as spm

    from common.special_ids import PAD_ID
    from data.corpus import load_text_pairs
    from data.pipeline import make_train_dataset

    processor = spm.SentencePieceProcessor(model_file=str(tmp_path / "spm" / "spm.model"))
    sides = load_text_pairs(data, data.validation_split)
    exact = [sum(processor.decode(processor.encode(s)) == s for s in side) for side in sides]
    assert stats["roundtrip_exact_source"] == round(exact[0] / len(sides[0]), 5)
    assert stats["roundtrip_exact_target"] == round(exact[1] / len(sides[1]), 5)
    assert stats["roundtrip_exact"] == round(sum(exact) / (len(sides[0]) + len(sides[1])), 5)
    assert 0.9 <= stats["roundtrip_exact"] <= 1
    # The padding: PAD slots over all slots of source and target_out, one epoch of the run's batches (train.seed)
    batches = list(make_train_dataset(data, Tokenizer.load(tmp_path / "spm"), seed=5, repeat=False))
    slots = sum(b[key].numpy().size for b in batches for key in ("source", "target_out"))
    pads = sum(int(np.sum(b[key].numpy() == PAD_ID)) for b in batches for key in ("source", "target_out"))
    assert stats["padding_waste"] == round(pads / slots, 4) and 0 < pads < slots
    assert 1 <= stats["num_shapes"] <= 2 * stats["num_buckets"]
    assert stats["dropped_long"] > 0 and stats["tokens_per_sec"] > 0
    assert stats["bucket_edges"][-1] == 20


def test_subword_dropout_stats_are_of_the_training_batches(tmp_path, mirror, prepared_dir, capsys):
    """data.subword_dropout > 0: the batches training makes, resegmented (before 2026-12-07d: a traceback)."""
    import dataclasses

    import numpy as np

    from common.special_ids import PAD_ID
    from data.config import DataConfig
    from data.pipeline import make_train_dataset

    config = write_config(tmp_path, mirror, prepared_dir)
    args = ["--config", config, "--set", "train.seed=5", "--set", "data.subword_dropout=0.3"]
    assert main([*args, "--tokenizer-dir", str(tmp_path / "spm")]) == 0
    stats = json.loads(capsys.readouterr().out)
    data = DataConfig(
        manual_dir=str(mirror), data_dir=str(prepared_dir), cache_dir=str(tmp_path / "cache"), vocab_size=96,
        max_length=20, batch_tokens=256, subword_dropout=0.3,
    )  # fmt: skip
    tokenizer = Tokenizer.load(tmp_path / "spm")
    pads = {}
    for rate in (0.3, 0.0):
        batches = list(make_train_dataset(dataclasses.replace(data, subword_dropout=rate), tokenizer, seed=5,
                                          repeat=False))  # fmt: skip
        slots = sum(b[key].numpy().size for b in batches for key in ("source", "target_out"))
        pads[rate] = sum(
            int(np.sum(b[key].numpy() == PAD_ID)) for b in batches for key in ("source", "target_out")
        )
        pads[rate] /= slots
    # the dropout's pieces, not the plain segmentation's
    assert stats["padding_waste"] == round(pads[0.3], 4) != round(pads[0.0], 4)


def test_config_error_exits_2(tmp_path, mirror, prepared_dir, capsys):
    config = write_config(tmp_path, mirror, prepared_dir)
    assert main(["--config", config, "--set", "data.vocab_sise=8"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "unknown config key data.vocab_sise" in captured.err
    assert main(["--config", str(tmp_path / "absent.yaml")]) == 2
    assert main(["--config", config, "--set", "train=[1]"]) == 2
    assert "train: expected a mapping, got list [1]" in capsys.readouterr().err
    assert main(["--config", config, "--set", "train.seed=-1"]) == 2  # before 2026-12-07c: a traceback
    assert f"train.seed: must be in [0, {2**32 - 1}], got -1" in capsys.readouterr().err
    assert (
        main(["--config", config, "--set", "train.init_from=runs/base"]) == 2
    )  # its tokenizer is the parent's
    captured = capsys.readouterr()
    assert captured.out == "" and "give it: --tokenizer-dir runs/base/tokenizer" in captured.err
    typo = str(tmp_path / "tokenzier")  # would be trained into: refused the same way, nothing made
    assert main(["--config", config, "--set", "train.init_from=runs/base", "--tokenizer-dir", typo]) == 2
    assert f"--tokenizer-dir {typo} holds no SentencePiece model" in capsys.readouterr().err
    assert not (tmp_path / "tokenzier").exists()


def test_data_error_exits_1(tmp_path, mirror, prepared_dir, capsys):
    config = write_config(tmp_path, mirror, prepared_dir)
    assert main(["--config", config, "--set", "data.target=cs"]) == 2  # known at config time
    assert "data.target: multi30k has no language 'cs'" in capsys.readouterr().err
    regular = tmp_path / "a-file"
    regular.write_text("")
    assert main(["--config", config, "--tokenizer-dir", str(regular)]) == 1
    assert f"--tokenizer-dir {regular} cannot be a directory" in capsys.readouterr().err


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0 and "--tokenizer-dir" in capsys.readouterr().out


def test_no_validation_sentences_give_no_roundtrip_fraction(tmp_path, capsys):
    """null, not 0.0 (before: 0.0 next to per-side values of 1.0, for a folder corpus whose validation files are
    empty)."""
    import yaml

    from tests.run_fixture import tiny_config_tree, write_corpus

    corpus = write_corpus(tmp_path / "corpus")
    for path in corpus.glob("*.validation.txt"):
        path.write_text("")
    tree = tiny_config_tree(corpus)
    tree["data"]["cache_dir"] = str(tmp_path / "cache")
    config = tmp_path / "stats.yaml"
    config.write_text(yaml.safe_dump(tree))
    assert main(["--config", str(config)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["splits"]["validation"] == 0
    assert [stats[f"roundtrip_exact{side}"] for side in ("", "_source", "_target")] == [None, None, None]
