"""How far apart are a model's log-probabilities across decoding paths (XLA on or off, batch composition)?

Usage (from the repository root): python docs/sampling-reproducibility-2026-12-06/logprob_diff.py RUN
The first 32 Multi30k validation pairs, teacher-forced through RUN's model (float32); prints one JSON line per
comparison: the largest and median absolute difference of the log-probabilities at the real target positions, and
of the cumulative distribution at temperature 1.3 over the whole vocabulary (what inverse-CDF sampling drew from).
"""

import gzip
import json
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from common.special_ids import BOS_ID, EOS_ID, PAD_ID  # noqa: E402
from nmt.run_models import load_run_models  # noqa: E402

CORPUS = ROOT / ".." / "shared" / "data" / "multi30k"


def lines(name: str) -> list[str]:
    with gzip.open(CORPUS / name, "rt", encoding="utf-8") as handle:
        return [line.strip() for line in handle][:32]


def main(run: str) -> None:
    _, tokenizer, model, _ = load_run_models(run)
    sources = tokenizer.tokenize_source(lines("val.en.gz"))
    targets = tokenizer.tokenize_target(lines("val.de.gz"))

    def batch(rows):
        source = [list(sources[i].numpy()) + [EOS_ID] for i in rows]
        target = [[BOS_ID] + list(targets[i].numpy()) for i in rows]
        width_s, width_t = max(map(len, source)), max(map(len, target))
        inputs = {
            "source": tf.constant([x + [PAD_ID] * (width_s - len(x)) for x in source], tf.int32),
            "target_in": tf.constant([x + [PAD_ID] * (width_t - len(x)) for x in target], tf.int32),
        }
        return inputs, [len(x) for x in target]

    def log_probs(function, rows):
        inputs, lengths = batch(rows)
        out = tf.nn.log_softmax(tf.cast(function(inputs), tf.float32), axis=-1).numpy()
        return [out[i, : lengths[i]] for i in range(len(rows))]

    plain = tf.function(lambda x: model(x, training=False))
    xla = tf.function(lambda x: model(x, training=False), jit_compile=True)
    rows = list(range(32))
    reference = log_probs(plain, rows)
    in_fours = [r for k in range(0, 32, 4) for r in log_probs(plain, list(range(k, k + 4)))]

    def cumulative(values):
        scaled = values / 1.3
        probs = np.exp(scaled - scaled.max(-1, keepdims=True))
        return np.cumsum(probs / probs.sum(-1, keepdims=True), -1)

    for name, other in (
        ("xla off vs on (batch of 32)", log_probs(xla, rows)),
        ("batch of 32 vs 8 batches of 4 (xla off)", in_fours),
        ("the same path twice", log_probs(plain, rows)),
    ):
        diff = np.concatenate([np.abs(a - b).ravel() for a, b in zip(reference, other)])
        cdf = np.concatenate(
            [np.abs(cumulative(a) - cumulative(b)).ravel() for a, b in zip(reference, other)]
        )
        record = {
            "run": run,
            "paths": name,
            "positions": int(sum(len(a) for a in reference)),
            "logprob_abs_diff_max": float(diff.max()),
            "logprob_abs_diff_median": float(np.median(diff)),
            "cdf_t1.3_abs_diff_mean": float(cdf.mean()),
            "cdf_t1.3_abs_diff_max": float(cdf.max()),
        }
        print(json.dumps(record))


if __name__ == "__main__":
    main(sys.argv[1])
