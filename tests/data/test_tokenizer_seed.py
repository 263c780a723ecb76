"""data.tokenizer_seed: a tokenizer/ seeded into a new run directory is used only when its model files have the data
config's settings (before 2026-12-07c a leftover of another config was used as it was, and config.yaml described
another tokenizer; found by a review). Real SentencePiece models, trained by data.tokenizer_training."""

from __future__ import annotations

import dataclasses

from data.tokenizer_seed import seed_problem
from data.tokenizer_training import train_tokenizer


def test_a_seed_is_accepted_only_for_the_settings_it_was_trained_with(data_cfg, tmp_path):
    joint = tmp_path / "joint"
    train_tokenizer(data_cfg, joint)
    assert seed_problem(data_cfg, joint) == ""
    cases = [
        (dataclasses.replace(data_cfg, vocab_size=80), "spm.model has vocab_size 96, data.vocab_size is 80"),
        (
            dataclasses.replace(data_cfg, tokenizer="bpe"),
            "spm.model has tokenizer 'unigram', data.tokenizer is 'bpe'",
        ),
        (
            dataclasses.replace(data_cfg, lowercase=True),
            "spm.model has lowercase False, data.lowercase is True",
        ),
        (
            dataclasses.replace(data_cfg, joint_vocab=False),
            "no spm.source.model or spm.target.model (data.joint_vocab=false)",
        ),
    ]
    for cfg, problem in cases:
        assert seed_problem(cfg, joint) == problem
    # the other way round: what a lowercasing BPE config trains is refused for the cased unigram one
    lowered = dataclasses.replace(data_cfg, lowercase=True, tokenizer="bpe")
    train_tokenizer(lowered, tmp_path / "lowered")
    assert seed_problem(lowered, tmp_path / "lowered") == ""
    assert (
        seed_problem(data_cfg, tmp_path / "lowered")
        == "spm.model has tokenizer 'bpe', data.tokenizer is 'unigram'"
    )
    assert seed_problem(dataclasses.replace(data_cfg, tokenizer="bpe"), tmp_path / "lowered") == (
        "spm.model has lowercase True, data.lowercase is False"
    )
    # separate vocabularies beside a joint model: the loader would take the joint one
    (tmp_path / "lowered" / "spm.source.model").write_bytes((tmp_path / "lowered" / "spm.model").read_bytes())
    (tmp_path / "lowered" / "spm.target.model").write_bytes((tmp_path / "lowered" / "spm.model").read_bytes())
    assert seed_problem(dataclasses.replace(lowered, joint_vocab=False), tmp_path / "lowered") == (
        "spm.model too, which would be used instead (data.joint_vocab=false)"
    )
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "spm.model").write_bytes((joint / "spm.model").read_bytes()[:100])
    assert seed_problem(data_cfg, tmp_path / "cut").startswith("spm.model is not a SentencePiece model (")
