"""The float32 cumulative sum that inverse-CDF sampling drew from, by TensorFlow's kernel and by XLA, against float64.

Usage: python docs/sampling-reproducibility-2026-12-06/cumsum_diff.py
32 rows of 8,000 probabilities (random logits, temperature 1.3); prints one JSON line per computation.
"""

import json

import numpy as np
import tensorflow as tf

rng = np.random.default_rng(0)
logits = rng.normal(0, 3, size=(32, 8000)).astype(np.float32)
probs = tf.nn.softmax(tf.constant(logits) / 1.3, axis=-1)
exact = np.cumsum(probs.numpy().astype(np.float64), -1)
plain = tf.function(lambda p: tf.math.cumsum(p, axis=-1))
xla = tf.function(lambda p: tf.math.cumsum(p, axis=-1), jit_compile=True)
sums = {"tensorflow": plain(probs).numpy(), "xla": xla(probs).numpy()}
for name, values in sums.items():
    diff = np.abs(values.astype(np.float64) - exact)
    print(
        json.dumps(
            {"cumsum float32": name, "abs_diff_vs_float64_max": float(diff.max()), "mean": float(diff.mean())}
        )
    )
diff = np.abs(sums["tensorflow"].astype(np.float64) - sums["xla"])
print(
    json.dumps(
        {"cumsum float32": "tensorflow vs xla", "abs_diff_max": float(diff.max()), "mean": float(diff.mean())}
    )
)
fours = np.concatenate([plain(probs[k : k + 4]).numpy() for k in range(0, 32, 4)])
print(
    json.dumps(
        {
            "cumsum float32": "tensorflow, batch of 32 vs 4",
            "abs_diff_max": float(np.abs(sums["tensorflow"] - fours).max()),
        }
    )
)
