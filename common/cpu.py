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


def _has_any(names: tuple[str, ...], flags: set[str] | None) -> bool:
    return any(name in (cpu_flags() if flags is None else flags) for name in names)


def has_amx(flags: set[str] | None = None) -> bool:
    """Whether the CPU (default: this machine's) has Intel AMX matrix units."""
    return _has_any(AMX_FLAGS, flags)


VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def has_vnni(flags: set[str] | None = None) -> bool:
    """Whether the CPU (default: this machine's) multiplies int8 with 32-bit accumulation (AVX-VNNI, AVX512-VNNI or
    AMX-INT8)."""
    return _has_any(VNNI_FLAGS, flags)


def int8_saturates(flags: set[str] | None = None) -> bool:
    """Whether int8 matrix products may saturate on this x86 CPU (default: this machine's): one without VNNI, where
    oneDNN's u8 x s8 products go through vpmaddubsw, which sums pairs of them in saturating 16-bit lanes (oneDNN's
    guide, "Nuances of int8 Computations"). Seen as CTranslate2 int8 straying far from float32 on an AVX2 EPYC, never
    on the VNNI CPUs. False where the flags are unknown or not x86 (ARM's int8 dot products accumulate in 32 bits)."""
    flags = cpu_flags() if flags is None else flags
    return "sse2" in flags and not has_vnni(flags)
