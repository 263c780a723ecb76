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

The splits are read from the cache of `data.prepare` (prepared first if missing): nothing is tokenized here.
Training leaves out pairs with more than `max_length` tokens (with EOS, resp. BOS) on either side, at read time,
and says how many; evaluation drops nothing and truncates instead, keeping the final EOS. With the config's
`subword_dropout`, training pieces are split at random into two pieces of the vocabulary (module
`data.subword_dropout`: a fresh segmentation of the same text every epoch; validation and test keep the
tokenizer's). Batches come from the sampler of `data.batching`, then `pad_with_special_tokens()` (a composable
transform, `ds.apply(...)`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import tensorflow as tf

from common.special_ids import BOS_ID, EOS_ID, PAD_ID
from data.batching import bucketed_batches
from data.cleaning import DropCounts
from data.config import DataConfig
from data.errors import DataError
from data.store import PreparedSplit
from data.subword_dropout import SplitTable
from data.tokenizer import Tokenizer

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


def pad_with_special_tokens() -> Transform:
    """Batched pieces -> model inputs, padded to the batch's bucket edge.

    In: {"source": int32 ragged (B, None), "target": int32 ragged (B, None), "edge": int32 ()}, every side at
    most edge - 1 pieces. Out: {"source", "target_in", "target_out"}, each int32 (B, edge), PAD_ID-filled:
    source = pieces + [EOS], target_in = [BOS] + pieces, target_out = pieces + [EOS]. A "batch_rows" entry (a
    part of a batch, `data.batching.bucketed_batches`) is passed on unchanged.
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
            **{key: batch[key] for key in ("batch_rows",) if key in batch},
        }

    return lambda ds: ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


# ----------------------------------------------------------------------------------------------------------------
# Datasets


def no_usable_pair(cfg: DataConfig, split: str, prepared: PreparedSplit) -> str:
    """What to say of a prepared split without a pair: every one was dropped, and why."""
    drops = DropCounts(**{k: v for k, v in prepared.manifest.get("drops", {}).items() if k != "kept"})
    return f"split {split!r} of {cfg.dataset} has no usable pair ({drops.summary()})"


def open_split(cfg: DataConfig, tokenizer: Tokenizer, split: str) -> PreparedSplit:
    """A split tokenized with `tokenizer`, from the cache (prepared first if missing; see `data.prepare`)."""
    from data.prepare import prepare_split

    vocab = {"source": tokenizer.source_vocab_size, "target": tokenizer.target_vocab_size}
    prepared = PreparedSplit.open(prepare_split(cfg, tokenizer, split), vocab=vocab)
    if len(prepared) == 0:  # nothing to train on or to validate with: stop before any step, saying why
        raise DataError(no_usable_pair(cfg, split, prepared))
    log.info("split %s: %d pairs, read %s", split, len(prepared), prepared.origin)
    return prepared


def make_train_dataset(
    cfg: DataConfig,
    tokenizer: Tokenizer,
    *,
    seed: int,
    repeat: bool = True,
    part: tuple[int, int, int] | None = None,
) -> tf.data.Dataset:
    """Bucketed, token-budget training batches; deterministic for a given seed, reshuffled every epoch.

    Args:
      cfg: data config (dataset, splits, cache_dir, max_length, batch_tokens, bucket_boundaries).
      tokenizer: the trained `Tokenizer` (the prepared split is the one tokenized with it).
      seed: fixes the order of pairs and batches in every epoch.
      repeat: endless epochs (training) or exactly one (statistics, tests).
      part: `(first, count, total)`: this reader's share of every batch, in 1/total units (the batches are the
        same for every reader; one reads, pads and yields only its rows; `data.batching.bucketed_batches`).
    Returns:
      `{"source", "target_in", "target_out"}`, each int32 (B, E), plus `"batch_rows": int64 ()` (the whole
      batch's pairs) with a `part`. The iterator can be saved and restored with
      `tf.train.Checkpoint(iterator=iter(ds))`; a freshly built dataset resumes at the exact batch.
    """
    split = open_split(cfg, tokenizer, cfg.train_split)
    return train_batches(cfg, split, seed=seed, repeat=repeat, part=part, tables=split_tables(cfg, tokenizer))


def split_tables(cfg: DataConfig, tokenizer: Tokenizer) -> tuple[SplitTable, SplitTable] | None:
    """(source, target) `SplitTable`s of the tokenizer when cfg.subword_dropout is on, else None."""
    if cfg.subword_dropout <= 0:
        return None
    source_model, target_model = tokenizer.models
    source = SplitTable.from_model(source_model)
    target = source if target_model is None else SplitTable.from_model(target_model)
    log.info(
        "subword dropout %g: %d of %d source pieces can split",
        cfg.subword_dropout, int((source.counts > 0).sum()), len(source.counts),
    )  # fmt: skip
    return source, target


def train_batches(
    cfg: DataConfig,
    split: PreparedSplit,
    *,
    seed: int,
    repeat: bool = True,
    part: tuple[int, int, int] | None = None,
    tables: tuple[SplitTable, SplitTable] | None = None,
) -> tf.data.Dataset:
    """`make_train_dataset` from an opened split: pairs over cfg.max_length tokens are left out (and counted).

    `tables`: the (source, target) `split_tables` of the split's tokenizer, needed when cfg.subword_dropout > 0.
    """
    resegment = None
    if cfg.subword_dropout > 0:
        if tables is None:
            raise ValueError("data.subword_dropout > 0 needs the tokenizer's split tables (split_tables)")

        def resegment(flat, lengths, rows, epoch, side, max_pieces):
            return tables[side].resegment(
                flat, lengths, rows, rate=cfg.subword_dropout, seed=seed, epoch=epoch, side=side,
                max_pieces=max_pieces,
            )  # fmt: skip

    max_pieces = cfg.max_length - 1  # + EOS (source, target_out) or BOS (target_in)
    long = int(((split.source_lengths > max_pieces) | (split.target_lengths > max_pieces)).sum())
    if long:
        log.info(
            "dropped %d of %d training pairs longer than max_length=%d tokens (%.2f%%)",
            long, len(split), cfg.max_length, 100.0 * long / len(split),
        )  # fmt: skip
    if long == len(split):
        raise DataError(
            f"no training pairs of at most data.max_length={cfg.max_length} tokens in split {cfg.train_split!r}"
        )
    edges = bucket_edges(cfg)
    batches = bucketed_batches(
        split,
        edges=edges,
        batch_sizes=batch_sizes(edges, cfg.batch_tokens),
        max_pieces=max_pieces,
        seed=seed,
        shuffle=True,
        repeat=repeat,
        part=part,
        resegment=resegment,
    )
    return batches.apply(pad_with_special_tokens()).prefetch(tf.data.AUTOTUNE)


def make_eval_dataset(cfg: DataConfig, tokenizer: Tokenizer, split: str) -> tf.data.Dataset:
    """Every pair of `split` once, in batches of cfg.eval_batch_tokens, for validation loss.

    Nothing is dropped (beyond what preparation drops: empty or unreadable lines): sides longer than
    cfg.max_length are cut to max_length - 1 pieces, then get their EOS (BOS). No shuffling: buckets in order,
    corpus order within a bucket. Same dict of int32 (B, E) as training.
    """
    return eval_batches(cfg, open_split(cfg, tokenizer, split))


def eval_batches(cfg: DataConfig, split: PreparedSplit) -> tf.data.Dataset:
    """`make_eval_dataset` from an opened split."""
    edges = bucket_edges(cfg)
    batches = bucketed_batches(
        split,
        edges=edges,
        batch_sizes=batch_sizes(edges, cfg.eval_batch_tokens),
        max_pieces=cfg.max_length - 1,
        truncate=True,
        shuffle=False,
        repeat=False,
    )
    return batches.apply(pad_with_special_tokens()).prefetch(tf.data.AUTOTUNE)
