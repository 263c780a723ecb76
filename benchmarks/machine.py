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


# CPU features deciding which matmul kernels run (Eigen's AVX2/FMA or AVX-512 paths, oneDNN's bf16 and int8, AMX)
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


# Environment variables that change which kernels run on the same CPU: oneDNN capped to an instruction set (e.g.
# AVX2 on an AMX Xeon, the code an AVX2 CPU runs), our C++ kernels off or on their AVX2 paths (nmt.kernels)
KERNEL_ENV = ("ONEDNN_MAX_CPU_ISA", "NMT_KERNELS", "NMT_KERNELS_ISA")


def _number(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def machine_facts() -> dict:
    """{"cpu_model", "cpu_vendor", "cpu_family", "cpu_model_number", "cpu_stepping", "cpus", one bool per `ISA_FLAGS`,
    "memory_gib", "gpu", "load_average", "onednn", "kernel_env"}.

    `cpu_model`: the full model name /proc/cpuinfo gives (a virtual machine may give little: "AMD EPYC"), so the
    family / model / stepping numbers tell the generation; `cpus`: the cores this process may use; the ISA flags:
    whether the CPU reports each; `gpu`: the first GPU's name (None without one); `load_average`: the 1-minute load
    when called (an idle machine shows about 0; measurements under load are not comparable); `onednn`: whether this
    process runs TensorFlow's oneDNN kernels (`nmt.cli.onednn_enabled`); `kernel_env`: those of `KERNEL_ENV` set in
    this process's environment, with their values (a row measured under ``ONEDNN_MAX_CPU_ISA=AVX2`` says so).
    """
    import tensorflow as tf

    from nmt.cli import onednn_enabled

    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    gpus = tf.config.list_physical_devices("GPU")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu_model": info.get("model name", "unknown"),
        "cpu_vendor": info.get("vendor_id"),
        "cpu_family": _number(info.get("cpu family")),
        "cpu_model_number": _number(info.get("model")),
        "cpu_stepping": _number(info.get("stepping")),
        "cpus": cores,
        **{flag: flag in flags for flag in ISA_FLAGS},
        "memory_gib": _memory_gib(),
        "gpu": tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU") if gpus else None,
        "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "onednn": onednn_enabled(),
        "kernel_env": {name: os.environ[name] for name in KERNEL_ENV if name in os.environ},
    }
