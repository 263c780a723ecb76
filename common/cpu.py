"""CPU feature flags, read without TensorFlow (the decoding CLIs choose their kernels before importing it)."""

from __future__ import annotations

from pathlib import Path

AMX_FLAGS = ("amx_bf16", "amx_tile")


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    """The CPU feature flags of the first processor listed in `cpuinfo` (empty if unreadable, e.g. not Linux)."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def has_amx(flags: set[str] | None = None) -> bool:
    """Whether the CPU (default: this machine's) has Intel AMX matrix units."""
    return any(flag in (cpu_flags() if flags is None else flags) for flag in AMX_FLAGS)
