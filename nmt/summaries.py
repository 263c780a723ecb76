"""TensorBoard summaries of a training run (train/ and validation/ scalars, cross-attention images)."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import tensorflow as tf


def peak_memory_mb() -> float:
    """Peak device memory on a GPU, else this process's peak resident set size, in MiB.

    On Linux the peak is /proc/self/status's VmHWM: `ru_maxrss` of a process started by vfork (subprocess does)
    starts from its parent's peak, so a small run launched by a big one would report the parent's figure.
    """
    if tf.config.list_logical_devices("GPU"):
        return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def write_train_summaries(
    writer, step: int, metrics: dict, lr: float, tokens_per_sec: float | None, skipped, layer_grad_norms: dict
) -> None:
    """train/ scalars; `loss` and `nll` as `metrics` gives them (the trainer's: means over the steps since the last
    logged one, per target token); `grad_norm` and `grad_norm/<layer>` (`layer_grad_norms`, from
    `TrainStep.layer_grad_norms`) are norms of the step's unclipped gradient; `tokens_per_sec` None (step 1's
    window, the trace) is not written."""
    with writer.as_default(step=step):
        tf.summary.scalar("loss", metrics["loss"])
        tf.summary.scalar("nll", metrics["nll"])
        tf.summary.scalar("learning_rate", lr)
        tf.summary.scalar("grad_norm", metrics["grad_norm"])
        tf.summary.scalar("loss_scale", metrics["loss_scale"])
        if tokens_per_sec is not None:
            tf.summary.scalar("tokens_per_sec", tokens_per_sec)
        tf.summary.scalar("skipped_steps", skipped)
        tf.summary.scalar("peak_memory_mb", peak_memory_mb())
        for name, value in layer_grad_norms.items():
            tf.summary.scalar(f"grad_norm/{name}", value)


def write_validation_summaries(writer, step: int, record: dict, model, eval_dataset) -> None:
    """validation/ scalars of one evaluation record, and the cross-attention image of the first batch row."""
    with writer.as_default(step=step):
        tf.summary.scalar("loss", record["loss"])
        tf.summary.scalar("perplexity", record["perplexity"])
        if "bleu" in record:
            tf.summary.scalar("bleu", record["bleu"])
        attention_image(model, eval_dataset)
    writer.flush()


def attention_image(model, eval_dataset) -> None:
    """Cross-attention heat maps (one per head, last decoder layer) of the first validation batch row."""
    batch = next(iter(eval_dataset.take(1)))
    source, target_in = batch["source"][:1], batch["target_in"][:1]
    weights = model.cross_attention(source, target_in)[-1][0]  # (heads, T, S)
    weights = tf.cast(weights, tf.float32)
    weights = weights / (tf.reduce_max(weights, axis=[1, 2], keepdims=True) + 1e-9)
    tf.summary.image("cross_attention_last_layer", weights[..., tf.newaxis], max_outputs=8)


def drop_events_after(directory: Path, step: int) -> int:
    """Removes the events of steps after `step` (and a record cut by a crash) from the event files under `directory`.

    Returns how many went. A resumed run calls it with its checkpoint's step, as for `metrics.jsonl`: those steps
    run again, and TensorBoard would show both runs of them (its own purge of out-of-order steps depends on the
    version and loader). Each changed file is rewritten under a name TensorBoard ignores, then renamed over.
    """
    dropped = 0
    for path in sorted(Path(directory).rglob("events.out.tfevents.*")):
        kept, gone = [], 0
        try:
            for record in tf.data.TFRecordDataset(str(path)):
                raw = record.numpy()
                if tf.compat.v1.Event.FromString(raw).step > step:
                    gone += 1
                else:
                    kept.append(raw)
        except tf.errors.DataLossError:  # the last record, cut by a crash mid-write
            gone += 1
        if gone:
            partial = path.with_name(f".{path.name}.partial")
            with tf.io.TFRecordWriter(str(partial)) as writer:
                for raw in kept:
                    writer.write(raw)
            os.replace(partial, path)
            dropped += gone
    return dropped
