"""tokens_per_sec (target tokens/s, per log_every window) of a run's TensorBoard train events, and OpenNMT-tf's
"target" tokens/s from its log; medians over steps 100-400 (the first window has the trace)."""

import glob
import re
import statistics
import sys

import tensorflow as tf

for run in sys.argv[1:]:
    if run.endswith(".log"):
        rates = [
            (int(m.group(1)), float(m.group(2)))
            for m in re.finditer(r"Step = (\d+) ;.*?, (\d+) target", open(run).read())
        ]
    else:
        rates = []
        for path in glob.glob(f"{run}/tensorboard/train/events*"):
            for event in tf.compat.v1.train.summary_iterator(path):
                for value in event.summary.value:
                    if value.tag == "tokens_per_sec":
                        rates.append((event.step, float(tf.make_ndarray(value.tensor))))
    kept = [r for s, r in sorted(rates) if s >= 100]
    print(
        run,
        "windows",
        [f"{s}:{r:.0f}" for s, r in sorted(rates)],
        "median(>=100)",
        round(statistics.median(kept)),
    )
