"""Peak memory of one call: TensorFlow's allocator statistics where it keeps them (GPU), else the peak RSS.

On CPU, `tf.config.experimental.get_memory_info` raises ("Allocator stats not available"). On Linux the kernel's
high-water mark of the resident set (VmHWM in /proc/self/status) is reset before the call (writing 5 to
/proc/self/clear_refs) and read after it: the exact peak, whatever the load of the machine. Where that cannot be
done, a background thread reads the resident set size every `interval` seconds while the call runs (TensorFlow
releases the GIL inside ops, so it keeps running during long kernels; allocations shorter than the interval, or a
sampler starved by a loaded machine, can be missed). Either way the peak minus the RSS just before the call.
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
RSS_HIGH_WATER = "rss_high_water_mark_minus_baseline"

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
    if _reset_high_water_mark():
        result = fn()
        high = _high_water_mark()
        if high is not None:
            return (max(high, baseline) - baseline) / 2**20, RSS_HIGH_WATER, result
        return (rss_bytes() - baseline) / 2**20, RSS_SAMPLED, result  # not reached on Linux
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


def _reset_high_water_mark() -> bool:
    """Resets the kernel's peak RSS of this process to its current RSS (Linux 4.0+); whether it could."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
    except OSError:
        return False
    return _high_water_mark() is not None


def _high_water_mark() -> int | None:
    """VmHWM of /proc/self/status in bytes, or None."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None
