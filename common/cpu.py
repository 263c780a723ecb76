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


VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def has_vnni(flags: set[str] | None = None) -> bool:
    """Whether the CPU (default: this machine's) multiplies int8 with 32-bit accumulation (AVX-VNNI, AVX512-VNNI or
    AMX-INT8). Without it, oneDNN's u8 x s8 products go through vpmaddubsw, which adds pairs of them in saturating
    16-bit lanes (oneDNN's guide, "Nuances of int8 Computations"): CTranslate2's int8 can then be far from float32."""
    return any(flag in (cpu_flags() if flags is None else flags) for flag in VNNI_FLAGS)
