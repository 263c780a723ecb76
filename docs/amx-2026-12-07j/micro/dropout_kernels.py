import os
import statistics
import time

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
import tensorflow as tf

from nmt.kernels import ops

ops = ops()
x = tf.constant(np.random.default_rng(0).normal(size=(2048, 1024)), tf.bfloat16)
key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(seed=tf.constant([1, 2]))
fwd = tf.function(
    lambda x: ops.nmt_dropout(x + tf.constant(0, tf.bfloat16), key, counter, threshold=6554, scale=1.1)[1][:1]
)
y, mask = ops.nmt_dropout(x, key, counter, threshold=6554, scale=1.1)
bwd = tf.function(lambda x: ops.nmt_dropout_grad(x + tf.constant(0, tf.bfloat16), mask, scale=1.1)[:1, :1])
add = tf.function(lambda x: (x + tf.constant(0, tf.bfloat16))[:1, :1])
for f in (fwd, bwd, add):
    f(x)
for name, f in (("add only", add), ("fwd", fwd), ("bwd", bwd)):
    ts = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(20):
            f(x).numpy()
        ts.append((time.perf_counter() - t0) / 20 * 1000)
    print(f"{name:10s} {statistics.median(ts):.3f} ms")
