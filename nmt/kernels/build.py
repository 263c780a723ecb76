"""Compiles the C++ kernels of this directory into one TensorFlow op library, once per source, TensorFlow version
and instruction set.

    python -m nmt.kernels.build [--force] [--strict]

`make install` runs it. Without a C++ compiler, or when compiling fails, it says so and exits 0 (1 with
``--strict``): the model then runs on TensorFlow's own ops, slower, with the same math. The library goes to
``$NMT_KERNELS_DIR``, else ``<sys.prefix>/nmt-kernels`` (the environment whose TensorFlow it was built against),
named by a digest of everything it depends on, so a changed source, another TensorFlow or another CPU kind finds
no library and is rebuilt by the next `make install`, never loaded stale. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import importlib.metadata
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCES = (
    "adam.cc",
    "bias.cc",
    "cross_entropy.cc",
    "dropout.cc",
    "heads.cc",
    "layer_norm.cc",
    "masked_softmax.cc",
)
HEADERS = ("common.h", "philox.h")
HERE = Path(__file__).resolve().parent
DIR_ENV = "NMT_KERNELS_DIR"
# AVX2 and FMA where the CPU has them (every machine this project has run on); not -march=native: TensorFlow's
# Eigen headers do not compile with AVX512-FP16 enabled (g++ 12).
VECTOR_FLAGS = ("-mavx2", "-mfma", "-mf16c")


class BuildError(RuntimeError):
    """The kernels cannot be built here (no compiler, no TensorFlow headers, or the compiler failed)."""


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _tensorflow_dir() -> Path:
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        raise BuildError("TensorFlow is not installed in this environment")
    return Path(list(spec.submodule_search_locations)[0])


def _compiler() -> list[str]:
    """$CXX (split as a shell would: ``ccache g++``), else g++ or c++ on PATH."""
    compiler = shlex.split(os.environ.get("CXX", "")) or [shutil.which("g++") or shutil.which("c++") or ""]
    if not compiler[0]:
        raise BuildError("no C++ compiler (g++ or $CXX) on PATH")
    return compiler


def _vector_flags() -> list[str]:
    return list(VECTOR_FLAGS) if {"avx2", "fma", "f16c"} <= _cpu_flags() else []


def _compile_command(source: str, output: Path) -> list[str]:
    """The compiler command that compiles `source` (a file of this directory) into the object file `output`."""
    return [
        *_compiler(),
        "-std=c++17",
        "-fPIC",
        "-O3",
        # lets the compiler turn a float comparison into a vector mask instead of a branch (the kernels never read
        # the floating-point exception flags)
        "-fno-trapping-math",
        *_vector_flags(),
        # TensorFlow's headers warn by the hundred
        "-w",
        "-D_GLIBCXX_USE_CXX11_ABI=1",
        "-DEIGEN_MAX_ALIGN_BYTES=64",
        f"-I{_tensorflow_dir() / 'include'}",
        "-c",
        str(HERE / source),
        "-o",
        str(output),
    ]


def _link_command(objects: list[Path], output: Path) -> list[str]:
    """The command that links the object files into the library `output`."""
    tf_dir = _tensorflow_dir()
    return [
        *_compiler(),
        "-shared",
        *map(str, objects),
        "-o",
        str(output),
        f"-L{tf_dir}",
        "-l:libtensorflow_framework.so.2",
    ]


def _run(commands: list[list[str]]) -> list[str]:
    """Runs the commands, as many at once as there are CPUs; the first error lines of those that failed."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        results = list(
            pool.map(lambda run: subprocess.run(run, capture_output=True, text=True, check=False), commands)
        )
    errors = []
    for result in results:
        if result.returncode != 0:
            errors += [line for line in result.stderr.splitlines() if "error" in line][:5] or ["(no message)"]
    return errors


def _tensorflow_version() -> str:
    for distribution in ("tensorflow", "tensorflow-cpu"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise BuildError(
        "TensorFlow's version is unknown (no tensorflow or tensorflow-cpu distribution installed)"
    )


def library_path() -> Path:
    """Where the library for this environment, source and CPU kind is (whether or not it is built yet). Needs no
    compiler: a library built once loads wherever the same TensorFlow runs on the same kind of CPU."""
    # this file too: it writes the compiler command
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for source in SOURCES + HEADERS:
        digest.update((HERE / source).read_bytes())
    # not the sources' absolute paths (a moved checkout keeps its library), nor the compiler (any that builds it
    # builds the same ABI)
    digest.update(f"{_tensorflow_version()} {' '.join(_vector_flags())}".encode())
    root = Path(os.environ.get(DIR_ENV) or Path(sys.prefix) / "nmt-kernels")
    return root / f"nmt_ops-{digest.hexdigest()[:16]}.so"


def build(force: bool = False) -> Path:
    """Builds the library unless it is there; returns its path. Raises `BuildError`. Concurrent builds are safe:
    each compiles in a directory of its own and renames the library into place."""
    path = library_path()
    if path.is_file() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    # the sources compile in parallel (about 35 s in one compiler process on 2 cores, 20 s in parallel), each to an
    # object file in a directory of this build's own, then link into a staging file renamed into place
    with tempfile.TemporaryDirectory(prefix=".staging-", dir=path.parent) as staging_dir:
        staging = Path(staging_dir)
        objects = [staging / f"{Path(source).stem}.o" for source in SOURCES]
        errors = _run([_compile_command(source, obj) for source, obj in zip(SOURCES, objects)])
        if not errors:
            errors = _run([_link_command(objects, staging / "library.so")])
        if errors:
            raise BuildError(f"compiling {', '.join(SOURCES)} failed: " + " | ".join(errors))
        os.replace(staging / "library.so", path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if the library is there")
    parser.add_argument("--strict", action="store_true", help="exit 1 when the kernels cannot be built")
    args = parser.parse_args(argv)
    try:
        built = library_path().is_file() and not args.force
        path = build(force=args.force)
    except (BuildError, OSError) as error:
        print(f"kernels: not built ({error}); the model runs on TensorFlow's ops", file=sys.stderr)
        return 1 if args.strict else 0
    if not built:
        print(f"kernels: built {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
