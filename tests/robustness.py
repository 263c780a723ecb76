"""Do the tests on the tiny trained fixture pass whatever the float trajectory of its training? Run once, not in CI.

    .venv/bin/python -m tests.robustness [--output docs/robustness-DATE.jsonl]       (or: make robustness)

One CPU cannot stand in for every x86-64 CPU, but the CPU changes only the float summation order of training, and
that order can be changed here too: the fixture's seed (NMT_FIXTURE_SEED), oneDNN on or off (TF_ENABLE_ONEDNN_OPTS),
oneDNN's instruction set capped below this CPU's (ONEDNN_MAX_CPU_ISA=AVX2: other gemm kernels) and the intra-op
thread count (TF_NUM_INTRAOP_THREADS: TensorFlow shards its kernels by it; oneDNN runs on TensorFlow's thread pool,
so OMP_NUM_THREADS plays no part). Each configuration runs the fixture tests (FILES, minus the few that do not use
the fixture) in a fresh pytest process without a cache, so the fixture is retrained. One JSON line per
configuration: seed, environment, passed/failed counts, seconds, the fixture's training record (steps to its
threshold, worst sentence NLL, a hash of the weights: different hashes for one seed show that the variation did
change the trajectory) and the instruction set oneDNN reports under that environment. The first line names the
machine, the last one sums up. Exit status 1 if any test failed or any configuration did not run.

This file is not collected by pytest (not a test_*.py file) and is not part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = [
    "tests/nmt/test_translator.py",
    "tests/nmt/test_translator_batches.py",
    "tests/nmt/test_translator_sampling.py",
    "tests/nmt/test_export.py",
    "tests/nmt/test_evaluation.py",
    "tests/test_cli_translate.py",
    "tests/test_cli_evaluate.py",
    "tests/test_cli_evaluate_engines.py",
]
NOT_FIXTURE = (
    "not test_help and not test_missing_model_dir and not test_scores_are and not test_limit_lengths"
)
SEEDS = [1234, 1, 2, 3, 4]  # 1234 is the fixture's default
VARIATION_SEEDS = [1234, 1]
VARIATIONS = [
    {"TF_ENABLE_ONEDNN_OPTS": "0"},
    {"TF_ENABLE_ONEDNN_OPTS": "1"},
    {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    {"TF_ENABLE_ONEDNN_OPTS": "0", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    {"TF_NUM_INTRAOP_THREADS": "1"},
    {"TF_NUM_INTRAOP_THREADS": "2"},
]
CONTROLLED = ("TF_ENABLE_ONEDNN_OPTS", "ONEDNN_MAX_CPU_ISA", "TF_NUM_INTRAOP_THREADS", "OMP_NUM_THREADS",
              "ONEDNN_VERBOSE", "NMT_FIXTURE_SEED", "PYTEST_ADDOPTS")  # fmt: skip
PROBE = """
import tensorflow as tf
x = tf.ones([64, 64])
tf.function(lambda a: tf.matmul(a, a))(x)
"""


def machine() -> dict:
    """CPU model and flags (from /proc/cpuinfo), core count, Python and TensorFlow versions."""
    info = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    version = subprocess.run(
        [sys.executable, "-c", "import tensorflow as tf; print(tf.__version__)"],
        capture_output=True,
        text=True,
        env=environment({}),
    ).stdout.strip()
    return {
        "cpu_model": info.get("model name", platform.processor()),
        "cpu_flags": info.get("flags", ""),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "tensorflow": version,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def environment(variation: dict, seed: int | None = None) -> dict:
    """os.environ without the variables under study, plus `variation` (and the fixture seed)."""
    env = {k: v for k, v in os.environ.items() if k not in CONTROLLED}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", **variation)
    if seed is not None:
        env["NMT_FIXTURE_SEED"] = str(seed)
    return env


def onednn_isa(variation: dict) -> str:
    """The instruction set oneDNN reports under this environment (ONEDNN_VERBOSE), e.g. "Intel AVX2"."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        env=environment({**variation, "ONEDNN_VERBOSE": "1"}),
    )
    for line in done.stdout.splitlines():
        if ",cpu,isa:" in line:
            return line.split(",cpu,isa:", 1)[1]
    return "unknown"


def run_configuration(seed: int, variation: dict, isa: str) -> dict:
    """Runs the fixture tests in a fresh pytest process; returns the JSON record of the configuration."""
    with tempfile.TemporaryDirectory(prefix="robustness-") as scratch:
        scratch = Path(scratch)
        report = scratch / "junit.xml"
        command = [sys.executable, "-m", "pytest", *FILES, "-k", NOT_FIXTURE, "-p", "no:cacheprovider"]
        command += ["--basetemp", str(scratch / "tmp"), "--junitxml", str(report)]
        started = time.monotonic()
        done = subprocess.run(
            command, capture_output=True, text=True, cwd=ROOT, env=environment(variation, seed)
        )
        seconds = round(time.monotonic() - started, 1)
        counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
        failures = []
        if report.is_file():
            for case in ElementTree.parse(report).iter("testcase"):
                outcome = next(
                    (child.tag for child in case if child.tag in ("failure", "error", "skipped")), None
                )
                counts[
                    {"failure": "failed", "error": "errors", "skipped": "skipped"}.get(outcome, "passed")
                ] += 1
                if outcome in ("failure", "error"):
                    failures.append(f"{case.get('classname')}::{case.get('name')}")
        trainings = sorted((scratch / "tmp").glob("**/training.json"))
        fixture = json.loads(trainings[0].read_text()) if trainings else None
    record = {"seed": seed, "env": variation, "onednn_isa": isa, **counts, "seconds": seconds}
    record.update(returncode=done.returncode, fixture=fixture, failures=failures)
    if done.returncode != 0:
        record["output_tail"] = (done.stdout + done.stderr)[-3000:]
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", help="also write the JSON lines to this file")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="seeds run with the default env")
    parser.add_argument("--variation-seeds", default=",".join(map(str, VARIATION_SEEDS)))
    parser.add_argument(
        "--only", default="", help="run only the variations that set this, e.g. TF_ENABLE_ONEDNN_OPTS=0"
    )
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    variation_seeds = [int(s) for s in args.variation_seeds.split(",") if s]
    only = dict(item.split("=", 1) for item in args.only.split(",") if item)
    variations = [v for v in VARIATIONS if all(v.get(key) == value for key, value in only.items())]
    plan = [(seed, {}) for seed in seeds] + [(s, v) for v in variations for s in variation_seeds]
    out = open(args.output, "w", encoding="utf-8") if args.output else None  # noqa: SIM115

    def emit(record: dict) -> None:
        line = json.dumps(record)
        print(line, flush=True)
        if out is not None:
            out.write(line + "\n")
            out.flush()

    emit({"machine": machine()})
    isas: dict[str, str] = {}
    records = []
    for seed, variation in plan:
        key = json.dumps(variation, sort_keys=True)
        if key not in isas:
            isas[key] = onednn_isa(variation)
        records.append(run_configuration(seed, variation, isas[key]))
        emit(records[-1])
    bad = [r for r in records if r["returncode"] != 0 or r["failed"] or r["errors"] or not r["passed"]]
    trained = [r["fixture"] for r in records if r["fixture"]]
    by_seed: dict[int, set] = {}
    for record in records:
        if record["fixture"]:
            by_seed.setdefault(record["seed"], set()).add(record["fixture"]["weights_sha256"])
    emit(
        {
            "summary": {
                "configurations": len(records),
                "failed_configurations": len(bad),
                "tests_passed": sum(r["passed"] for r in records),
                "tests_failed": sum(r["failed"] + r["errors"] for r in records),
                "fixture_steps": [min(t["steps"] for t in trained), max(t["steps"] for t in trained)]
                if trained
                else None,
                "worst_sentence_nll_max": max(t["worst_sentence_nll"] for t in trained) if trained else None,
                "distinct_weights_per_seed": {str(seed): len(hashes) for seed, hashes in by_seed.items()},
                "seconds": round(sum(r["seconds"] for r in records), 1),
            }
        }
    )
    if out is not None:
        out.close()
    return 1 if bad or not records else 0


if __name__ == "__main__":
    sys.exit(main())
