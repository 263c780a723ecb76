import os
import statistics
import time

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
import tensorflow as tf

from nmt import kernels

ops = kernels.ops()
if os.environ.get("INTRA"):
    tf.config.threading.set_intra_op_parallelism_threads(int(os.environ["INTRA"]))
enc = [(256, 256)] * 4 + [(256,)] * 4 + [(256,)] * 4 + [(256, 1024), (1024,), (1024, 256), (256,)]
dec = [(256, 256)] * 8 + [(256,)] * 8 + [(256,)] * 6 + [(256, 1024), (1024,), (1024, 256), (256,)]
sizes = [(8000, 256)] + enc * 3 + dec * 3
print(len(sizes), "variables", sum(np.prod(s) for s in sizes), "params")
rng = np.random.default_rng(0)
V = [tf.Variable(rng.normal(size=s).astype(np.float32)) for s in sizes]
M = [tf.Variable(tf.zeros(s)) for s in sizes]
S = [tf.Variable(tf.zeros(s)) for s in sizes]
G = [tf.constant(rng.normal(size=s).astype(np.float32)) for s in sizes]


@tf.function
def tf_path(factor):
    for a, m, v, g in zip(V, M, S, G):
        tf.raw_ops.ResourceApplyAdam(
            var=a.handle,
            m=m.handle,
            v=v.handle,
            beta1_power=0.9,
            beta2_power=0.98,
            lr=1e-6,
            beta1=0.9,
            beta2=0.98,
            epsilon=1e-9,
            grad=g * factor,
        )
    return tf.constant(0)


@tf.function
def fused(factor):
    ops.nmt_apply_adam(
        var=[a.handle for a in V],
        m=[m.handle for m in M],
        v=[v.handle for v in S],
        grad=G,
        factor=factor,
        beta1_power=0.9,
        beta2_power=0.98,
        lr=1e-6,
        beta1=0.9,
        beta2=0.98,
        epsilon=1e-9,
    )
    return tf.constant(0)


@tf.function
def l2(factor):
    return tf.stack([tf.nn.l2_loss(g) for g in G]) * factor


f = tf.constant(0.5)
fns = {"tf mul+adam": tf_path, "fused": fused, "l2 per var": l2}
for fn in fns.values():
    fn(f)
res = {k: [] for k in fns}
for _r in range(7):
    for k, fn in fns.items():
        t0 = time.perf_counter()
        for _ in range(10):
            fn(f).numpy()
        res[k].append((time.perf_counter() - t0) / 10 * 1000)
for k in res:
    print(f"{k:14s} {statistics.median(res[k]):.2f} ms")
hs = tf.function(lambda f: ops.nmt_half_squares(G) * f)
hs(f)
ts = []
for _r in range(7):
    t0 = time.perf_counter()
    for _ in range(10):
        hs(f).numpy()
    ts.append((time.perf_counter() - t0) / 10 * 1000)
print(f"half_squares   {statistics.median(ts):.2f} ms")
print(np.abs(hs(f).numpy() / l2(f).numpy() - 1).max())
