"""Peak memory of one call: TensorFlow's allocator statistics where it keeps them (GPU), else sampled RSS.

On CPU, `tf.config.experimental.get_memory_info` raises ("Allocator stats not available"), so a background thread
reads the process's resident set size from /proc/self/statm every `interval` seconds while the call runs; the peak
minus the RSS just before the call is the call's peak memory. TensorFlow releases the GIL inside ops, so the sampler
keeps running during long kernels; allocations shorter than the interval can be missed.
"""

from __future__ import annotations

import os
import resource
import threading
from collections.abc import Callable
from typing import Any

import tensorflow as tf

TF_ALLOCATOR = "tf.config.experimental.get_memory_info"
RSS_SAMPLED = "rss_peak_sampled_minus_baseline"

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Current resident set size (Linux /proc), else the peak RSS so far (getrusage)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _tf_device() -> str | None:
    """The device whose allocator statistics are available ("GPU:0"), or None."""
    if not tf.config.list_logical_devices("GPU"):
        return None
    try:
        tf.config.experimental.get_memory_info("GPU:0")
    except (ValueError, tf.errors.OpError):
        return None
    return "GPU:0"


def measure_peak(fn: Callable[[], Any], *, interval: float = 0.0005) -> tuple[float, str, Any]:
    """Runs `fn()`; returns (peak megabytes above the pre-call level, method, fn's result)."""
    device = _tf_device()
    if device is not None:
        tf.config.experimental.reset_memory_stats(device)
        before = tf.config.experimental.get_memory_info(device)["current"]
        result = fn()
        peak = tf.config.experimental.get_memory_info(device)["peak"]
        return (peak - before) / 2**20, TF_ALLOCATOR, result
    baseline = rss_bytes()
    peak = [baseline]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes())
            done.wait(interval)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        result = fn()
    finally:
        done.set()
        thread.join()
    peak[0] = max(peak[0], rss_bytes())
    return (peak[0] - baseline) / 2**20, RSS_SAMPLED, result
