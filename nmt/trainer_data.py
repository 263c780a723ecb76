"""What a training run reads: its tokenizer, and the training and validation datasets of this worker.

The tokenizer and the tokenized splits come from the data cache (data.prepare: trained and tokenized once). On a
multi-worker run the chief prepares them while the others wait in a collective, then the others read what it made
(`nmt.distribute.StopControl.chief_first`): a chief that fails, or a worker that does not see the chief's cache,
stops every worker with a message instead of leaving one waiting. The run directory keeps its own copy of the
tokenizer.
"""

from __future__ import annotations

import dataclasses
import logging

from nmt.distribute import StopControl, worker_part

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainingData:
    tokenizer: object
    part: tuple[int, int, int] | None  # this worker's share of every global batch (None: all of it)
    train: object  # tf.data.Dataset of global batches (this worker's part of each), repeated
    validation: object  # tf.data.Dataset of the validation split
    iterator: object  # over `train`: plain, checkpointable (tf.distribute's DistributedIterator is not)
    # what the chief trains on (`train_split_record`), kept once the start is accepted (`keep_train_split_record`)
    train_record: dict | None = None


def training_data(cfg, run_dir, strategy, stop: StopControl, chief: bool) -> TrainingData:
    """The run's tokenizer and datasets, prepared first if the cache lacks them (by the chief alone)."""
    from data.pipeline import make_eval_dataset, make_train_dataset
    from data.prepare import prepare
    from nmt.init_from import run_tokenizer

    records = []

    def prepare_data():
        tokenizer = run_tokenizer(cfg, run_dir, chief=chief)  # init_from: the parent's
        _, splits = prepare(cfg.data, tokenizer=tokenizer, chief=chief)
        if chief:
            records.append(train_split_record(cfg.data.train_split, splits[cfg.data.train_split]))
        return tokenizer

    tokenizer = stop.chief_first(chief, prepare_data, "prepare the data")
    # data.batch_tokens is a per-replica budget: the global batch grows with the replicas (more devices, more
    # tokens per step, and the learning rate follows: nmt.budget); every worker plans the same global batches,
    # reads only its replicas' part of each, and each local replica takes its rows (nmt.distribute).
    replicas = strategy.num_replicas_in_sync
    global_data = dataclasses.replace(cfg.data, batch_tokens=cfg.data.batch_tokens * replicas)
    part = worker_part(strategy)  # None, or this worker's share of each batch (logged)
    train = make_train_dataset(global_data, tokenizer, seed=cfg.train.seed, repeat=True, part=part)
    validation = make_eval_dataset(cfg.data, tokenizer, cfg.data.validation_split)
    return TrainingData(tokenizer, part, train, validation, iter(train), records[0] if records else None)


def train_split_record(split: str, directory) -> dict:
    """What a run trains on: the prepared split's pair and piece counts (not its files' names or times: a corpus
    moved or copied elsewhere is the same corpus)."""
    from data.store import read_manifest

    manifest = read_manifest(directory) or {}
    return {"split": split, "pairs": manifest.get("pairs"), "pieces": manifest.get("pieces")}


def keep_train_split_record(run_dir, record: dict | None, resumed: bool) -> None:
    """Keeps `record` in `DIR/train_data.json` once a start is accepted (train.py, beside config.yaml: a refused
    start or the rerun of a finished run leaves DIR as it was), and warns when a resumed run finds another: its
    corpus changed since (edited, cut, replaced), so the run goes on with other data, in an order that is no longer
    the checkpoint's (an exact resume needs the original corpus)."""
    import json

    from nmt.run_dir import write_atomic

    if record is None:
        return
    path = run_dir.train_data_path
    try:
        before = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        before = None
    if before == record:
        return
    if resumed and isinstance(before, dict) and before.get("split") == record["split"]:

        def counts(r: dict) -> str:
            pieces = r.get("pieces") if isinstance(r.get("pieces"), dict) else {}
            return f"{r.get('pairs')} pairs, {pieces.get('source')} + {pieces.get('target')} pieces"

        log.warning(
            "the %s split is not the one this run trained on so far (%s before, %s now): its corpus changed. The "
            "run goes on with the new data, in an order that is not the checkpoint's; restore the original corpus "
            "for an exact resume",
            record["split"], counts(before), counts(record),
        )  # fmt: skip
    write_atomic(path, json.dumps(record) + "\n")


ITERATOR_KIND = "iterator_kind"  # the checkpoint part saying which kind of data iterator it holds
_KIND_KEY = f"{ITERATOR_KIND}/symbolic/.ATTRIBUTES/VARIABLE_VALUE"
_KINDS = {
    True: "a multi-worker part of each batch",
    False: "whole batches (one process: one device or mirrored)",
}


def iterator_kind(part) -> object:
    """The checkpoint part recording the training iterator's kind: a multi-worker part's is checkpointed as
    positions (tf.data's symbolic checkpoints, data.batching), whole batches as TensorFlow's iterator state. One
    kind cannot read the other's: a mirrored run resumed as a two-worker run (the same replicas and global batch)
    restored its position silently wrong, and the other way failed as a "corrupt" checkpoint."""
    import tensorflow as tf

    module = tf.Module(name=ITERATOR_KIND)
    module.symbolic = tf.Variable(int(part is not None), dtype=tf.int64, trainable=False, name="symbolic")
    return module


def restorable_iterator(prefix: str, parts: dict, symbolic: bool, allow_change: bool) -> dict:
    """The parts of `parts` to restore from checkpoint `prefix` as far as the data iterator goes: all of them when
    it holds this run's kind of iterator (or is older than the record: nothing to compare). Another kind raises
    `BatchChanged`, or with train.allow_batch_change the iterator is not restored (the data order restarts)."""
    import tensorflow as tf

    from nmt.budget import BatchChanged

    reader = tf.train.load_checkpoint(prefix)
    if not reader.has_tensor(_KIND_KEY):
        return {name: part for name, part in parts.items() if name != ITERATOR_KIND}
    saved = bool(reader.get_tensor(_KIND_KEY))
    if saved == symbolic:
        return parts
    change = f"{prefix} holds the data position of {_KINDS[saved]}; this run reads {_KINDS[symbolic]}"
    if not allow_change:
        raise BatchChanged(
            f"{change}: one cannot continue the other's. Resume with the original train.distribute, or pass --set "
            "train.allow_batch_change=true to go on (the data order then restarts from the seed)"
        )
    log.warning("%s: going on (train.allow_batch_change); the data order restarts", change)
    return {name: part for name, part in parts.items() if name not in ("iterator", ITERATOR_KIND)}
