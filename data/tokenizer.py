"""SentencePiece subword tokenizer: trained with the `sentencepiece` package, applied in-graph with TF Text.

    tokenizer = train_tokenizer(cfg, out_dir)        # data.tokenizer_training: writes spm.model (or two)
    tokenizer = Tokenizer.load(out_dir)
    ids = tokenizer.tokenize_source(["A man sleeps."])      # tf.RaggedTensor int32 (1, None), no BOS/EOS
    text = tokenizer.detokenize_target(ids)                  # tf.string (1,)

Lossless by construction, so sacreBLEU can score detokenized cased text against raw references: identity
normalization (no NFKC), whitespace kept as it is (`remove_extra_whitespaces=False`), every character of the
training text in the vocabulary (`character_coverage=1.0`, and `required_chars` for those SentencePiece would not
count: it deletes literal "<s>", "</s>", "<pad>" and "<unk>" from the text it trains on) and, when the vocabulary has
room (>= 2048 pieces), byte fallback for characters never seen in training (below 2048 they become <unk>). Two known
losses: TF Text's bundled SentencePiece drops whitespace at the very start of a line when detokenizing, and a
literal "▁" (U+2581, SentencePiece's mark of a space) in the text comes back as a space. With `data.lowercase` the
normalization lowercases instead (a user-defined SentencePiece rule, `data.tokenizer_training.lowercase_rules`):
lossless up to case, and every reader of the model (TF Text in-graph, the `sentencepiece` package, a SavedModel, a
CTranslate2 export) lowercases alike.

Special ids are the project's (`common.special_ids`): <pad>=0, <unk>=1, <s>=2 (BOS), </s>=3 (EOS). A model file
that reserves other ids is refused. Vocabulary sizes are padded up to a multiple of 8 for the embedding tables;
ids in the padding (never produced by the tokenizer, maybe by a model) are dropped when detokenizing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import sentencepiece as spm
import tensorflow as tf

from common.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from data.errors import DataError
from data.native_stderr import IDENTITY_NOTICE, without_lines
from data.tokenizer_seed import JOINT_MODEL, SOURCE_MODEL, TARGET_MODEL

if TYPE_CHECKING:
    import tensorflow_text as tf_text

log = logging.getLogger(__name__)


BYTE_FALLBACK_MIN_VOCAB = 2048  # below this, 256 byte pieces would crowd out real subwords
SPECIAL_IDS = {"pad_id": PAD_ID, "unk_id": UNK_ID, "bos_id": BOS_ID, "eos_id": EOS_ID}
_BUILDING = threading.RLock()  # the TF Text tokenizers of a `Tokenizer` are built once, on first use


def padded_size(size: int, multiple: int = 8) -> int:
    """`size` rounded up to a multiple of `multiple`."""
    return -(-size // multiple) * multiple


def _model_facts(model: bytes, origin: str) -> tuple[int, int]:
    """Checks a serialized model (whole, the project's special ids); returns its number of pieces and the characters
    of its longest piece ("▁" stands for one space)."""
    processor = spm.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(model)
    except (RuntimeError, OSError) as err:
        raise DataError(f"{origin} is not a SentencePiece model: {err}") from err
    # A model cut between two fields still loads (SentencePiece reads what is there): a file cut short (a full
    # disk, a copy interrupted) could tokenize otherwise, e.g. without its normalizer. Its last fields must be there.
    from sentencepiece import sentencepiece_model_pb2

    try:
        proto = sentencepiece_model_pb2.ModelProto.FromString(model)
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError, or anything its parser raises
        raise DataError(f"{origin} is not a SentencePiece model: {err}") from err
    missing = [name for name in ("trainer_spec", "normalizer_spec") if not proto.HasField(name)]
    if missing:
        raise DataError(
            f"{origin} is incomplete ({len(model)} bytes, no {' or '.join(missing)}): a file cut short?"
        )
    actual = {
        "pad_id": processor.pad_id(),
        "unk_id": processor.unk_id(),
        "bos_id": processor.bos_id(),
        "eos_id": processor.eos_id(),
    }
    if actual != SPECIAL_IDS:
        raise DataError(f"{origin} reserves special ids {actual}; this project needs {SPECIAL_IDS}")
    return processor.GetPieceSize(), max(len(piece.piece) for piece in proto.pieces)


class _SharedSentencepieceModel(tf.saved_model.experimental.TrackableResource):
    """A SentencePiece model resource with a shared name, so it outlives TF's kernel cache.

    TF Text creates its model resource private to the op kernel, and `tf.random.set_seed` (so also
    `keras.utils.set_random_seed`) clears the eager kernel cache, which deletes it: every later call then fails
    with "Resource ... SentencepieceResource does not exist". A shared name keeps it in the resource manager.
    """

    def __init__(self, model: bytes):
        super().__init__()
        self._model = model
        self._shared_name = "nmt_sentencepiece_" + hashlib.sha1(model).hexdigest()
        _ = self.resource_handle  # creates the resource

    def _create_resource(self):
        from tensorflow_text.python.ops.sentencepiece_tokenizer import gen_sentencepiece_tokenizer

        return gen_sentencepiece_tokenizer.sentencepiece_op(model=self._model, shared_name=self._shared_name)


def _sentencepiece(model: bytes) -> tf_text.SentencepieceTokenizer:
    import tensorflow_text as tf_text  # here: its import takes 0.3-1 s; training reads prepared ids

    # SentencePiece's notice about identity normalization, printed once per resource created
    with without_lines(IDENTITY_NOTICE):
        tokenizer = tf_text.SentencepieceTokenizer(model=model, out_type=tf.int32)
        tokenizer._model_resource = _SharedSentencepieceModel(model)  # see _SharedSentencepieceModel
    return tokenizer


class Tokenizer(tf.Module):
    """Source and target SentencePiece tokenizers (one shared model if the vocabulary is joint).

    A `tf.Module`: the SentencePiece models are tracked resources (and, when loaded from files, assets), so a
    SavedModel holding a `Tokenizer` maps raw strings to ids and back with no Python at serving time. The TF Text
    tokenizers (and the `tensorflow_text` import) are built on the first tokenize/detokenize call or SavedModel
    save, not when loading: a training run needs only the vocabulary sizes and the fingerprint until it translates.

    Args:
      source_model: serialized SentencePiece `ModelProto` for the source language (or both, if joint).
      target_model: serialized model for the target language; None for a joint vocabulary.
      files: optional model files to track as SavedModel assets (source first).
    """

    def __init__(
        self,
        source_model: bytes,
        target_model: bytes | None = None,
        *,
        files: list[Path] | None = None,
        name: str = "tokenizer",
    ):
        super().__init__(name=name)
        self.joint = target_model is None
        self._source_pieces, self._longest_source_piece = _model_facts(source_model, "source model")
        self._target_pieces, self._longest_target_piece = (
            (self._source_pieces, self._longest_source_piece)
            if self.joint
            else _model_facts(target_model, "target model")
        )
        self._models = (source_model, target_model)
        self._source = self._target = None  # TF Text tokenizers, built by _in_graph()
        self.assets = [tf.saved_model.Asset(str(path)) for path in files or []]

    def _in_graph(self) -> tuple[tf_text.SentencepieceTokenizer, tf_text.SentencepieceTokenizer]:
        """(source, target) TF Text tokenizers (the same one twice if joint), built once, outside any tf.function."""
        if self._source is None:
            # init_scope: the resources are created eagerly even on a first call while tracing a tf.function
            with _BUILDING, tf.init_scope():
                if self._source is None:
                    source_model, target_model = self._models
                    source = _sentencepiece(source_model)
                    self._target = source if self.joint else _sentencepiece(target_model)
                    self._source = source  # last: other threads take a non-None _source as built
        return self._source, self._target

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        self._in_graph()  # a SavedModel holds the SentencePiece resources even if nothing was tokenized yet
        return super()._trackable_children(save_type, **kwargs)

    @classmethod
    def load(cls, directory: str | Path) -> Tokenizer:
        """Loads `spm.model`, or `spm.source.model` and `spm.target.model`, from `directory`."""
        directory = Path(directory)
        joint = directory / JOINT_MODEL
        source, target = directory / SOURCE_MODEL, directory / TARGET_MODEL
        try:
            if joint.is_file():
                return cls(joint.read_bytes(), files=[joint])
            if source.is_file() and target.is_file():
                return cls(source.read_bytes(), target.read_bytes(), files=[source, target])
        except DataError as err:
            raise DataError(f"{directory}: {err}") from err
        raise DataError(
            f"no tokenizer in {directory}: expected {JOINT_MODEL}, or {SOURCE_MODEL} and {TARGET_MODEL}"
        )

    def save(self, directory: str | Path) -> None:
        """Writes the model file(s) into `directory` (created if needed), in the layout `load` reads."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        source, target = self._models
        files = {JOINT_MODEL: source} if self.joint else {SOURCE_MODEL: source, TARGET_MODEL: target}
        for name, model in files.items():
            with open(directory / name, "wb") as handle:
                handle.write(model)
                handle.flush()
                os.fsync(handle.fileno())  # on disk before the caller renames the directory into place

    @property
    def models(self) -> tuple[bytes, bytes | None]:
        """The serialized SentencePiece models: (source or joint, target or None if joint)."""
        return self._models

    @property
    def fingerprint(self) -> str:
        """sha256 of the model(s): equal fingerprints tokenize every text identically."""
        source, target = self._models
        return hashlib.sha256(source + b"\0" + (target or b"")).hexdigest()

    def source_chars_for(self, pieces: int) -> int:
        """At most how many characters of a source text its first `pieces` pieces cover: `pieces` times the longest
        piece, times 4 for a normalizer that merges characters (composed accents). Text past that cannot change
        those pieces: a decoder that keeps only the first `pieces` need not tokenize it."""
        return 4 * pieces * self._longest_source_piece

    def target_chars_for(self, pieces: int) -> int:
        """`source_chars_for` for a target text (the target model's longest piece)."""
        return 4 * pieces * self._longest_target_piece

    @property
    def source_vocab_size(self) -> int:
        """Source embedding rows: SentencePiece pieces padded up to a multiple of 8."""
        return padded_size(self._source_pieces)

    @property
    def target_vocab_size(self) -> int:
        """Target embedding rows / logits: SentencePiece pieces padded up to a multiple of 8."""
        return padded_size(self._target_pieces)

    def tokenize_source(self, strings) -> tf.RaggedTensor:
        """tf.string (B,) -> int32 RaggedTensor (B, None) of piece ids, no BOS/EOS (a scalar gives (None,))."""
        return self._in_graph()[0].tokenize(strings)

    def tokenize_target(self, strings) -> tf.RaggedTensor:
        """tf.string (B,) -> int32 RaggedTensor (B, None) of piece ids, no BOS/EOS (a scalar gives (None,))."""
        return self._in_graph()[1].tokenize(strings)

    def detokenize_source(self, ids) -> tf.Tensor:
        """Like `detokenize_target`, with the source model."""
        return _detokenize(self._in_graph()[0], ids, self._source_pieces)

    def detokenize_target(self, ids) -> tf.Tensor:
        """Ids -> text. Drops PAD and BOS and ids outside the vocabulary; stops at the first EOS.

        Args:
          ids: int tensor (B, L) (dense, e.g. decoder output padded with PAD) or RaggedTensor (B, None);
            a single sequence (L,) gives a scalar.
        Returns:
          tf.string (B,) (or a scalar for (L,) input).
        """
        return _detokenize(self._in_graph()[1], ids, self._target_pieces)


def _detokenize(tokenizer: tf_text.SentencepieceTokenizer, ids, pieces: int) -> tf.Tensor:
    if isinstance(ids, tf.RaggedTensor):
        ids = ids.to_tensor(default_value=PAD_ID)
    ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
    single = ids.shape.rank == 1
    if single:
        ids = ids[tf.newaxis]  # (1, L)
    before_eos = tf.math.cumsum(tf.cast(ids == EOS_ID, tf.int32), axis=-1) == 0  # (B, L)
    keep = before_eos & (ids != PAD_ID) & (ids != BOS_ID) & (ids >= 0) & (ids < pieces)
    text = tokenizer.detokenize(tf.ragged.boolean_mask(ids, keep))  # (B,)
    return text[0] if single else text
