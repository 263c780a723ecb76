"""Config + tokenizer -> batched `tf.data.Dataset`s of token ids for training and validation loss.

    ds = make_train_dataset(cfg, tokenizer, seed=1234)        # endless, reshuffled each epoch, checkpointable
    ds = make_eval_dataset(cfg, tokenizer, "validation")       # one pass, every pair, corpus order per bucket

Both yield `{"source": int32 (B, E), "target_in": int32 (B, E), "target_out": int32 (B, E)}` with

    source     = pieces(source) + [EOS]
    target_in  = [BOS] + pieces(target)
    target_out = pieces(target) + [EOS]

padded with PAD_ID to E, the bucket edge of the batch: source and target share one padded length, the smallest
edge >= max(len(source), len(target_in)) of every pair in the batch. Batch sizes are token budgets: B =
batch_tokens // E, rounded down to a multiple of 8 when >= 8. So a run sees at most 2 x len(bucket_edges(cfg))
batch shapes (a full and a last partial batch per bucket and epoch), which bounds XLA recompilations.

Training drops pairs with more than `max_length` tokens (with EOS, resp. BOS) on either side and says how many;
evaluation drops nothing and truncates instead, keeping the final EOS. The stages are composable transforms
(`ds.apply(tokenize(tokenizer))`, `.apply(pad_with_special_tokens())`) around the in-memory corpus and batch
sampler of `data.batching`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import tensorflow as tf

from data.batching import PieceCorpus, bucketed_batches
from data.corpus import load_batches
from data.errors import DataError
from data.tokenizer import Tokenizer
from nmt.config import DataConfig
from transformer.vocab import BOS_ID, EOS_ID, PAD_ID

log = logging.getLogger(__name__)

Transform = Callable[[tf.data.Dataset], tf.data.Dataset]
MIN_EDGE = 8  # shortest automatic bucket
EDGE_GROWTH_PERCENT = 110  # automatic edges grow by 10% (tensor2tensor's rule), rounded up to even numbers


def bucket_edges(cfg: DataConfig) -> list[int]:
    """The padded lengths batches use: cfg.bucket_boundaries, else automatic; the last edge is cfg.max_length.

    Automatic: 8, 10, 12, ... growing by ~10% per edge (even numbers), then max_length. For max_length 100:
    21 edges, about 10% padding on Multi30k en-de (multiples of 8 would waste about 22%).
    Given boundaries are sorted; those >= max_length are replaced by max_length itself.
    """
    top = cfg.max_length
    if cfg.bucket_boundaries:
        if min(cfg.bucket_boundaries) < 1:
            raise ValueError(f"data.bucket_boundaries must be positive, got {cfg.bucket_boundaries}")
        return sorted({edge for edge in cfg.bucket_boundaries if edge < top} | {top})
    edges, edge = [], MIN_EDGE
    while edge < top:
        edges.append(edge)
        edge = max(edge + 2, 2 * -(-edge * EDGE_GROWTH_PERCENT // 200))  # ceil(edge * 1.1 / 2) * 2
    return [*edges, top]


def batch_sizes(edges: list[int], batch_tokens: int) -> list[int]:
    """Pairs per batch for each edge: batch_tokens // edge, rounded down to a multiple of 8 if >= 8 (min 1)."""
    sizes = []
    for edge in edges:
        size = batch_tokens // edge
        sizes.append(size - size % 8 if size >= 8 else max(size, 1))
    return sizes


# ----------------------------------------------------------------------------------------------------------------
# Composable transforms (`ds.apply(...)`)


def tokenize(tokenizer: Tokenizer) -> Transform:
    """{"source": tf.string, "target": tf.string} -> {"source": int32, "target": int32} pieces, no BOS/EOS.

    Per example: () -> (S,) dense. Per batch (faster): (b,) -> (b, None) ragged.
    """

    @tf.autograph.experimental.do_not_convert
    def encode(example: dict) -> dict:
        return {
            "source": tokenizer.tokenize_source(example["source"]),
            "target": tokenizer.tokenize_target(example["target"]),
        }

    return lambda ds: ds.map(encode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def pad_with_special_tokens() -> Transform:
    """Batched pieces -> model inputs, padded to the batch's bucket edge.

    In: {"source": int32 ragged (B, None), "target": int32 ragged (B, None), "edge": int32 ()}, every side at
    most edge - 1 pieces. Out: {"source", "target_in", "target_out"}, each int32 (B, edge), PAD_ID-filled:
    source = pieces + [EOS], target_in = [BOS] + pieces, target_out = pieces + [EOS].
    """

    @tf.autograph.experimental.do_not_convert
    def convert(batch: dict) -> dict:
        edge = tf.cast(batch["edge"], tf.int64)

        def dense(pieces: tf.RaggedTensor) -> tf.Tensor:  # (B, edge): pieces, then PAD
            return pieces.to_tensor(default_value=PAD_ID, shape=tf.stack([pieces.nrows(), edge]))

        def with_eos(pieces: tf.RaggedTensor) -> tf.Tensor:  # PAD_ID is 0: add EOS right after the pieces
            eos = tf.one_hot(
                pieces.row_lengths(), tf.cast(edge, tf.int32), on_value=EOS_ID, off_value=0, dtype=tf.int32
            )
            return dense(pieces) + eos

        target = dense(batch["target"])
        bos = tf.fill([tf.shape(target)[0], 1], BOS_ID)  # (B, 1)
        return {
            "source": with_eos(batch["source"]),
            # pieces <= edge - 1, so the dropped last column is PAD
            "target_in": tf.concat([bos, target[:, :-1]], axis=1),
            "target_out": with_eos(batch["target"]),
        }

    return lambda ds: ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


# ----------------------------------------------------------------------------------------------------------------
# Datasets


def load_pieces(cfg: DataConfig, tokenizer: Tokenizer, split: str) -> PieceCorpus:
    """A split tokenized into memory (the pipeline's cache): pieces without special tokens."""
    return PieceCorpus.from_batches(load_batches(cfg, split).apply(tokenize(tokenizer)))


def train_pieces(cfg: DataConfig, tokenizer: Tokenizer) -> tuple[PieceCorpus, int]:
    """The tokenized train split without pairs over cfg.max_length tokens; returns (corpus, number dropped)."""
    corpus = load_pieces(cfg, tokenizer, cfg.train_split)
    return corpus.drop_longer_than(cfg.max_length - 1)  # + EOS (source, target_out) or BOS (target_in)


def make_train_dataset(
    cfg: DataConfig, tokenizer: Tokenizer, *, seed: int, repeat: bool = True
) -> tf.data.Dataset:
    """Bucketed, token-budget training batches; deterministic for a given seed, reshuffled every epoch.

    Args:
      cfg: data config (dataset, splits, max_length, batch_tokens, bucket_boundaries).
      tokenizer: the trained `Tokenizer`.
      seed: fixes the order of pairs and batches in every epoch.
      repeat: endless epochs (training) or exactly one (statistics, tests).
    Returns:
      `{"source", "target_in", "target_out"}`, each int32 (B, E). The iterator can be saved and restored with
      `tf.train.Checkpoint(iterator=iter(ds))`; a freshly built dataset resumes at the exact batch.
    """
    corpus, dropped = train_pieces(cfg, tokenizer)
    total = len(corpus) + dropped
    if dropped:
        log.info(
            "dropped %d of %d training pairs longer than max_length=%d tokens (%.2f%%)",
            dropped, total, cfg.max_length, 100.0 * dropped / total,
        )  # fmt: skip
    return train_batches(cfg, corpus, seed=seed, repeat=repeat)


def train_batches(cfg: DataConfig, corpus: PieceCorpus, *, seed: int, repeat: bool = True) -> tf.data.Dataset:
    """`make_train_dataset` from an already tokenized and length-filtered corpus (see `train_pieces`)."""
    if not len(corpus):
        raise DataError(
            f"no training pairs of at most data.max_length={cfg.max_length} tokens in split {cfg.train_split!r}"
        )
    edges = bucket_edges(cfg)
    batches = bucketed_batches(
        corpus,
        edges=edges,
        batch_sizes=batch_sizes(edges, cfg.batch_tokens),
        seed=seed,
        shuffle=True,
        repeat=repeat,
    )
    return batches.apply(pad_with_special_tokens()).prefetch(tf.data.AUTOTUNE)


def make_eval_dataset(cfg: DataConfig, tokenizer: Tokenizer, split: str) -> tf.data.Dataset:
    """Every pair of `split` once, in batches of cfg.eval_batch_tokens, for validation loss.

    Nothing is dropped: sides longer than cfg.max_length are cut to max_length - 1 pieces, then get their EOS
    (BOS). No shuffling: buckets in order, corpus order within a bucket. Same dict of int32 (B, E) as training.
    """
    corpus = load_pieces(cfg, tokenizer, split).truncate(cfg.max_length - 1)
    edges = bucket_edges(cfg)
    batches = bucketed_batches(
        corpus,
        edges=edges,
        batch_sizes=batch_sizes(edges, cfg.eval_batch_tokens),
        shuffle=False,
        repeat=False,
    )
    return batches.apply(pad_with_special_tokens()).prefetch(tf.data.AUTOTUNE)
