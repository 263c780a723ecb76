"""Whether a run directory's tokenizer has the settings its data config trains with, read without TensorFlow.

What a model file records is compared (its files for data.joint_vocab, data.vocab_size, data.tokenizer,
data.lowercase), not the corpus or the languages it was trained on, which it does not record.

A run directory seeded with a tokenizer before its first start (ablate.py copies one shared tokenizer into each
variant's) trains with it (`data.prepare.run_tokenizer`): one that another config made (a leftover of a deleted
run) would be used under settings it does not have, and config.yaml would describe another tokenizer.
"""

from __future__ import annotations

from pathlib import Path

from data.config import DataConfig

# the model files of a run's tokenizer/ (data.tokenizer names them too)
JOINT_MODEL = "spm.model"
SOURCE_MODEL = "spm.source.model"
TARGET_MODEL = "spm.target.model"
_MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}  # SentencePiece's TrainerSpec.ModelType


def seed_problem(cfg: DataConfig, directory: str | Path) -> str:
    """Why the SentencePiece models in `directory` do not have `cfg`'s settings (the files data.joint_vocab
    wants, data.vocab_size, data.tokenizer, data.lowercase), or ""."""
    from sentencepiece import sentencepiece_model_pb2

    directory = Path(directory)
    names = [JOINT_MODEL] if cfg.joint_vocab else [SOURCE_MODEL, TARGET_MODEL]
    if missing := [name for name in names if not (directory / name).is_file()]:
        return f"no {' or '.join(missing)} (data.joint_vocab={str(cfg.joint_vocab).lower()})"
    if not cfg.joint_vocab and (directory / JOINT_MODEL).is_file():  # the loader takes it first
        return f"{JOINT_MODEL} too, which would be used instead (data.joint_vocab=false)"
    for name in names:
        try:
            proto = sentencepiece_model_pb2.ModelProto.FromString((directory / name).read_bytes())
        except Exception as err:  # noqa: BLE001 - protobuf's DecodeError, or an unreadable file
            return f"{name} is not a SentencePiece model ({err})"
        spec = proto.trainer_spec
        model_type = _MODEL_TYPES.get(spec.model_type, str(spec.model_type))
        lowercase = proto.normalizer_spec.name != "identity"
        for key, have, want in (
            ("vocab_size", spec.vocab_size, cfg.vocab_size),
            ("tokenizer", model_type, cfg.tokenizer),
            ("lowercase", lowercase, cfg.lowercase),
        ):
            if have != want:
                return f"{name} has {key} {have!r}, data.{key} is {want!r}"
    return ""
