"""What a training run directory recorded, reduced to the numbers an ablation compares.

Sources: TensorBoard event files under ``DIR/tensorboard/train`` (scalars written by `nmt.trainer`: ``grad_norm``,
``tokens_per_sec``, ``loss``, ``skipped_steps``...; TF2 summaries store them as tensors) and ``DIR/metrics.jsonl``
(one validation record per evaluation: ``step``, ``loss``, ``elapsed_seconds``...).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np


def read_scalars(event_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] sorted by step (the last value wins for a repeated step), from every event file."""
    import tensorflow as tf

    values: dict[str, dict[int, float]] = {}
    for path in sorted(Path(event_dir).glob("events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(str(path)):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                if value.HasField("tensor"):
                    number = float(tf.make_ndarray(value.tensor).reshape(-1)[0])
                elif value.HasField("simple_value"):
                    number = float(value.simple_value)
                else:
                    continue  # images, histograms
                values.setdefault(value.tag, {})[int(event.step)] = number
    return {tag: sorted(points.items()) for tag, points in values.items()}


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a metrics.jsonl ([] if absent)."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def fluctuation(points: list[tuple[int, float]], first_steps: int) -> dict:
    """Variation of a per-step series over steps 1..first_steps.

    `cv`: standard deviation / mean; `step_change`: median of |x_t - x_{t-1}| / x_{t-1} between consecutive logged
    steps; `max_over_min`. All None with fewer than 2 finite points.
    """
    values = np.array([v for step, v in points if step <= first_steps and math.isfinite(v)], dtype=np.float64)
    if values.size < 2 or values.mean() == 0:
        return {"points": int(values.size), "cv": None, "step_change": None, "max_over_min": None}
    changes = np.abs(np.diff(values)) / np.maximum(np.abs(values[:-1]), 1e-12)
    return {
        "points": int(values.size),
        "cv": float(values.std() / values.mean()),
        "step_change": float(np.median(changes)),
        "max_over_min": float(values.max() / values.min()) if values.min() > 0 else None,
    }


def median_rate(points: list[tuple[int, float]], skip_first: int = 1) -> float | None:
    """Median of a rate series, without the first `skip_first` logged points (they include tracing)."""
    values = [v for _, v in points[skip_first:] if math.isfinite(v)] or [
        v for _, v in points if math.isfinite(v)
    ]
    return float(np.median(values)) if values else None


def steps_to_loss(records: list[dict], target: float) -> tuple[int, float] | None:
    """(step, elapsed minutes) of the first evaluation with validation loss <= target, or None."""
    for record in sorted(records, key=lambda r: r.get("step", 0)):
        loss = record.get("loss")
        if loss is not None and math.isfinite(loss) and loss <= target:
            return int(record["step"]), float(record.get("elapsed_seconds", 0.0)) / 60.0
    return None


def summarize_run(run_dir: str | Path, *, grad_steps: int) -> dict:
    """Steps, time, tokens/s, grad-norm fluctuation and the validation curve of one run directory."""
    run_dir = Path(run_dir)
    scalars = read_scalars(run_dir / "tensorboard" / "train")
    records = read_metrics(run_dir / "metrics.jsonl")
    grad = scalars.get("grad_norm", [])
    last_step = max((step for step, _ in scalars.get("loss", [])), default=0)
    late = [(step - (last_step - grad_steps), v) for step, v in grad if step > last_step - grad_steps]
    skipped = scalars.get("skipped_steps", [])
    return {
        "steps": max([last_step] + [int(r.get("step", 0)) for r in records]),
        "train_minutes": max([float(r.get("elapsed_seconds", 0.0)) / 60.0 for r in records], default=None),
        "tokens_per_sec": median_rate(scalars.get("tokens_per_sec", [])),
        "grad_norm_early": fluctuation(grad, grad_steps),
        "grad_norm_late": fluctuation(late, grad_steps),
        "skipped_steps": int(skipped[-1][1]) if skipped else 0,
        "curve": [(int(r["step"]), float(r["loss"])) for r in records if r.get("loss") is not None],
        "records": records,
    }
