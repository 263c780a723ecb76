"""The facts of the machine a benchmark ran on, for its JSON records (the same keys as the docs/*.jsonl headers)."""

from __future__ import annotations

import os
from pathlib import Path


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())  # the first processor's
    return info


def _memory_gib() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20)
    except OSError:
        pass
    return None


def machine_facts() -> dict:
    """{"cpu_model", "cpus", "avx512f", "avx512_bf16", "amx_bf16", "memory_gib", "gpu", "load_average", "onednn"}.

    `cpus`: the cores this process may use; `gpu`: the first GPU's name (None without one); `load_average`: the
    1-minute load when called (an idle machine shows about 0; measurements under load are not comparable);
    `onednn`: whether this process runs TensorFlow's oneDNN kernels (`nmt.cli.onednn_enabled`).
    """
    import tensorflow as tf

    from nmt.cli import onednn_enabled

    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    gpus = tf.config.list_physical_devices("GPU")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu_model": info.get("model name", "unknown"),
        "cpus": cores,
        "avx512f": "avx512f" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "amx_bf16": "amx_bf16" in flags,
        "memory_gib": _memory_gib(),
        "gpu": tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU") if gpus else None,
        "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "onednn": onednn_enabled(),
    }
