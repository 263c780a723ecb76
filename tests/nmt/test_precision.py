"""`precision: auto` and `xla: auto` on every kind of device, with the device facts injected."""

import pytest

from nmt.precision import cpu_flags, device_kind, resolve_autocluster, resolve_precision, resolve_xla

AVX2 = {"fpu", "sse4_2", "avx", "avx2", "fma"}
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512_vnni"}  # AVX-512 without bf16: bf16 is emulated, float32 wins


@pytest.mark.parametrize(
    ("device", "flags", "policy"),
    [
        ("cpu", AVX2, "float32"),
        ("cpu", AVX512, "float32"),
        ("cpu", AVX512 | {"avx512_bf16"}, "mixed_bfloat16"),
        ("cpu", AVX512 | {"amx_bf16", "amx_tile"}, "mixed_bfloat16"),
        ("cpu", set(), "float32"),  # flags unknown (no /proc/cpuinfo): the safe choice
        ("gpu", AVX2, "mixed_float16"),
        ("gpu", AVX512 | {"amx_bf16"}, "mixed_float16"),  # the host CPU does not matter on a GPU
        ("tpu", AVX2, "mixed_bfloat16"),
    ],
)
def test_auto_precision_per_device(device, flags, policy):
    assert resolve_precision("auto", device, flags=flags) == policy


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("device", ["cpu", "gpu", "tpu"])
def test_explicit_precision_is_kept_on_every_device(policy, device):
    assert resolve_precision(policy, device, flags=AVX512 | {"amx_bf16"}) == policy
    assert resolve_precision(policy, device, flags=AVX2) == policy


def test_auto_precision_reads_this_cpus_flags_by_default():
    expected = "mixed_bfloat16" if {"avx512_bf16", "amx_bf16"} & cpu_flags() else "float32"
    assert resolve_precision("auto", "cpu") == expected


@pytest.mark.parametrize(("device", "xla"), [("cpu", False), ("gpu", True), ("tpu", True)])
def test_auto_xla_per_device(device, xla):
    assert resolve_xla("auto", device) is xla
    assert resolve_xla(True, device) is True and resolve_xla(False, device) is False
    assert resolve_xla("fusible", device) is False  # auto-clustering, not the whole step
    assert resolve_xla("auto", device, 2) is xla and resolve_xla(True, "gpu", 2) is True


def test_whole_step_xla_over_cpu_replicas_is_refused_before_training():
    """A compiled step over two logical CPU devices reads the other device's variables (InvalidArgumentError at the
    first step, before 2026-12-07)."""
    from nmt.config import ConfigError

    with pytest.raises(
        ConfigError, match="train.xla: true cannot compile a step over 2 CPU replicas in one process"
    ):
        resolve_xla(True, "cpu", 2)
    assert resolve_xla("fusible", "cpu", 2) is False and resolve_xla(True, "cpu", 1) is True


@pytest.mark.parametrize(
    ("xla", "expected"), [("fusible", True), ("auto", False), (True, False), (False, False)]
)
def test_autocluster_only_when_asked_for(xla, expected):
    assert resolve_autocluster(xla) is expected


def test_device_kind_from_the_visible_devices():
    assert device_kind(gpus=[]) == "cpu"
    assert device_kind(gpus=["/device:GPU:0"]) == "gpu"
    assert device_kind() == "cpu"  # tests/conftest.py hides every GPU (CUDA_VISIBLE_DEVICES="")


def test_cpu_flags_are_parsed_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Some Xeon\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16\n"
        "bugs\t\t: spectre_v1\n\nprocessor\t: 1\nflags\t\t: fpu\n",
        encoding="utf-8",
    )
    assert cpu_flags(cpuinfo) == {
        "fpu",
        "avx2",
        "avx512f",
        "avx512_bf16",
        "amx_bf16",
    }  # the first processor's
    assert resolve_precision("auto", "cpu", flags=cpu_flags(cpuinfo)) == "mixed_bfloat16"
    assert cpu_flags(tmp_path / "missing") == set()
    (tmp_path / "noflags").write_text("processor\t: 0\n", encoding="utf-8")
    assert cpu_flags(tmp_path / "noflags") == set()


def test_int8_saturates_on_x86_without_vnni_only():
    from common.cpu import has_vnni, int8_saturates

    assert has_vnni({"avx512_vnni"}) and has_vnni({"avx_vnni", "avx2"}) and has_vnni({"amx_int8"})
    assert not has_vnni({"avx2", "fma", "avx512f", "avx512_bf16"}) and not has_vnni(set())
    assert int8_saturates({"sse2", "avx2", "fma"}) and int8_saturates({"sse2", "avx512f", "avx512_bf16"})
    assert not int8_saturates({"sse2", "avx2", "avx_vnni"}) and not int8_saturates({"sse2", "avx512_vnni"})
    assert not int8_saturates(set()) and not int8_saturates({"fp", "asimd", "asimddp"})  # unknown, or ARM
