"""The cached tokenizer is the same on any machine. SentencePiece's unigram trainer gives other pieces for another
thread count (deterministic for one count), and data.prepare trained with the machine's CPU count (at most 16): the
same config and seed trained one vocabulary on a 2-core machine and another on a 16-core one, silently (found by a
review). Real SentencePiece, trained through data.prepare's cache as train.py and data.stats train it."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from data import cache
from data.prepare import cached_tokenizer
from data.stream import split_identity
from tests.data.conftest import mirror_lines


def _pieces(model: bytes) -> list[tuple[str, float]]:
    return [
        (piece.piece, piece.score) for piece in sentencepiece_model_pb2.ModelProto.FromString(model).pieces
    ]


def test_the_cached_tokenizer_does_not_depend_on_the_cores_of_the_machine(
    data_cfg, tokenizer, tmp_path, monkeypatch
):
    """A 2-core machine (one CPU here) and a 16-core one: the fake corpus gives the same model bytes on both. Before,
    2 and 16 threads trained other scores, and 4 of its 120 train sentences were segmented otherwise. A cache made
    before (its key without the thread count) is not used: its model may be another machine's."""
    small_cfg = dataclasses.replace(data_cfg, cache_dir=str(tmp_path / "small"))
    inputs = cache.tokenizer_key_inputs(small_cfg, split_identity(small_cfg, small_cfg.train_split))
    # another model (the session's, seed 7) where a cache made before would be
    tokenizer.save(
        cache.tokenizer_dir(small_cfg, {key: value for key, value in inputs.items() if key != "threads"})
    )
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    models = {}
    for name, count, affinity in (("small", 2, cpus[:1]), ("large", 16, cpus)):
        monkeypatch.setattr(os, "cpu_count", lambda count=count: count)
        if affinity:
            os.sched_setaffinity(0, affinity)
        try:
            trained = cached_tokenizer(dataclasses.replace(data_cfg, cache_dir=str(tmp_path / name)))
        finally:
            if cpus:
                os.sched_setaffinity(0, cpus)
        models[name] = trained.models[0]
    train = [line for lang in ("en", "de") for line in mirror_lines(Path(data_cfg.manual_dir), "train", lang)]
    small, large = (spm.SentencePieceProcessor(model_proto=models[name]) for name in ("small", "large"))
    assert small.encode(train) == large.encode(train)
    assert _pieces(models["small"]) == _pieces(models["large"])
    assert models["small"] == models["large"] != tokenizer.models[0]
