"""Decoding speed of this tree against an earlier commit of it, on the same trained model, in one run.

    python -m benchmarks.decode_baseline --baseline 250e915 --run-dir runs/base          # ~10 min on 2 cores
    python -m benchmarks.decode_baseline --baseline 250e915 --beams 4 --rounds 1 --max-sentences 50

The decoding issue's targets are ratios against "today's" decoder, the one of the commit it was filed against. This
bench checks that commit out into a temporary `git worktree`, and runs the same command line the issue measured,
`evaluate.py --model-dir RUN --split test --beam B --json`, once with the baseline's code and once with this tree's,
plus this tree's `--engine ctranslate2` on an export of the same weights (float32 and int8, exported here with
`export.py --format ctranslate2`). Each engine runs with its own defaults (XLA setting, batching): a run directory's
config.yaml records the `eval.batch_size` of the code that trained it, which the baseline keeps, whereas this tree's
rows get this tree's default (`--batch-size`, `nmt.config.EvalConfig`) unless `--current-batch-size` says otherwise.
Rounds are interleaved (baseline, current, CTranslate2, ... then again), and every figure is the `sentences_per_sec` that
evaluate.py itself reports for the whole test split (decoding time of the split, compilation included, process
start-up excluded). The baseline reads a copy of the run directory (config, tokenizer, weights), so nothing it
writes lands in RUN.

One JSON object per line on stdout: a `machine` record, a `baseline_config` record (the keys of RUN's config.yaml
that the baseline's code does not know, dropped from its copy), one `decode_baseline` row per (engine, beam, round),
and one `decode_baseline_summary` per beam with the median sentences/s of each engine and the ratios against the baseline.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from benchmarks.common import int_list, non_negative_int, positive_int
from benchmarks.machine import machine_facts
from benchmarks.worktree import ROOT, baseline_worktree, resolve_revision
from nmt.config import EvalConfig

RUN_FILES = ("config.yaml", "tokenizer", "final", "best", "checkpoints")

ENGINES = ("baseline", "current", "ctranslate2_float32", "ctranslate2_int8")  # the rows, in order


def _run_json(command: list[str], cwd: Path) -> dict:
    """Runs one evaluate.py/export.py command; its last stdout line is the JSON result (evaluate.py --json)."""
    completed = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {completed.returncode}:\n{completed.stderr[-3000:]}")
    lines = [line for line in completed.stdout.splitlines() if line.strip()]
    return json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}


def _copy_run(run_dir: Path, into: Path) -> Path:
    into.mkdir(parents=True)
    for name in RUN_FILES:
        if (run_dir / name).is_dir():
            shutil.copytree(run_dir / name, into / name)
        elif (run_dir / name).is_file():
            shutil.copy2(run_dir / name, into / name)
    return into


# Run in the baseline's worktree: the config keys its code knows, per section.
_KNOWN_KEYS = (
    "import dataclasses, json\n"
    "from nmt.config import Config\n"
    "c = Config()\n"
    "print(json.dumps({f.name: [g.name for g in dataclasses.fields(getattr(c, f.name))] for f in dataclasses.fields(c)}))"
)


def _fit_config(run: Path, worktree: Path) -> list[str]:
    """Drops from RUN/config.yaml (the baseline's copy) the keys the baseline's code does not know, which a run
    trained by newer code records (its loader refuses unknown keys); returns them. A dropped key that mattered to
    the model would show as weights that do not load."""
    completed = subprocess.run(
        [sys.executable, "-c", _KNOWN_KEYS], cwd=worktree, capture_output=True, text=True
    )
    if completed.returncode != 0:
        raise RuntimeError(f"cannot read the baseline's config keys:\n{completed.stderr[-3000:]}")
    known = json.loads(completed.stdout.strip().splitlines()[-1])
    tree = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8")) or {}
    dropped = []
    for section in list(tree):
        if section not in known:
            dropped.append(section)
            del tree[section]
            continue
        for key in list(tree[section] or {}):
            if key not in known[section]:
                dropped.append(f"{section}.{key}")
                del tree[section][key]
    (run / "config.yaml").write_text(yaml.safe_dump(tree, sort_keys=False), encoding="utf-8")
    return dropped


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--baseline", required=True, help="commit (or any git revision) of the baseline decoder"
    )
    parser.add_argument("--run-dir", default="runs/base", help="trained run directory (default runs/base)")
    parser.add_argument(
        "--beams",
        type=int_list(positive=True),
        default=[4, 1],
        help="comma-separated beam sizes (default 4,1)",
    )
    parser.add_argument(
        "--rounds", type=positive_int, default=2, help="interleaved rounds (default 2; median reported)"
    )
    parser.add_argument(
        "--max-sentences", type=non_negative_int, default=0, help="first N test sentences (default 0 = all)"
    )
    parser.add_argument(
        "--engines",
        default=",".join(ENGINES),
        help="which rows (default all four)",
    )
    parser.add_argument(
        "--current-batch-size",
        type=int,
        default=EvalConfig.batch_size,
        help=f"decoding batch of this tree's rows (default {EvalConfig.batch_size}, this tree's eval.batch_size)",
    )
    args = parser.parse_args(argv)
    if args.current_batch_size < 1:
        parser.error(f"--current-batch-size must be at least 1, got {args.current_batch_size}")
    run_dir = Path(args.run_dir).resolve()
    if not (run_dir / "config.yaml").is_file():
        parser.error(f"{run_dir} is not a run directory (no config.yaml); train one with train.py")
    beams = args.beams
    run_config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    run_batch_size = (run_config.get("eval") or {}).get("batch_size")  # what the baseline decodes with
    engines = [e for e in args.engines.split(",") if e.strip()]
    if unknown := sorted(set(engines) - set(ENGINES)) or ([] if engines else ["(none)"]):
        parser.error(f"--engines: unknown {', '.join(unknown)}; choose from {', '.join(ENGINES)}")
    baseline = resolve_revision(args.baseline)  # an unknown revision: exit 2 before any record
    python = sys.executable
    emit = lambda record: print(json.dumps(record), flush=True)  # noqa: E731
    emit({"bench": "machine", **machine_facts()})

    with (
        tempfile.TemporaryDirectory(prefix="nmt-decode-baseline-") as scratch,
        baseline_worktree(baseline) as (worktree, commit),
    ):
        scratch = Path(scratch)
        baseline_run = _copy_run(run_dir, scratch / "run")
        if "baseline" in engines:
            emit({"bench": "baseline_config", "dropped_keys": _fit_config(baseline_run, worktree)})
        exports = {}
        for quantization in ("float32", "int8"):
            if f"ctranslate2_{quantization}" in engines:
                exports[quantization] = scratch / f"ct2-{quantization}"
                _run_json(
                    [
                        python,
                        "export.py",
                        "--model-dir",
                        str(run_dir),
                        "--output",
                        str(exports[quantization]),
                        "--format",
                        "ctranslate2",
                        "--quantization",
                        quantization,
                    ],
                    ROOT,
                )
        limit = ["--max-sentences", str(args.max_sentences)] if args.max_sentences else []
        rows: list[dict] = []
        for round_index in range(args.rounds):
            for beam in beams:
                for engine in engines:
                    common = ["--split", "test", "--beam", str(beam), "--json", *limit]
                    output = ["--output", str(scratch / f"hyp-{engine}-{beam}.txt")]
                    if engine == "baseline":
                        command, cwd = [python, "evaluate.py", "--model-dir", str(baseline_run)], worktree
                    else:
                        command = [python, "evaluate.py", "--model-dir", str(run_dir)]
                        command += ["--batch-size", str(args.current_batch_size)]
                        cwd = ROOT
                        if engine.startswith("ctranslate2_"):
                            quantization = engine.removeprefix("ctranslate2_")
                            command += [
                                "--engine",
                                "ctranslate2",
                                "--engine-dir",
                                str(exports[quantization]),
                            ]
                    result = _run_json(command + common + output, cwd)
                    row = {
                        "bench": "decode_baseline",
                        "engine": engine,
                        "commit": commit if engine == "baseline" else "HEAD",
                        "beam_size": beam,
                        "round": round_index,
                        "sentences": result.get("num_sentences"),
                        "sentences_per_sec": result.get("sentences_per_sec"),
                        "seconds": result.get("seconds"),
                        "bleu": result.get("bleu"),
                        "xla": result.get("xla"),
                        "batch_size": run_batch_size if engine == "baseline" else args.current_batch_size,
                    }
                    rows.append(emit(row) or row)
        for beam in beams:
            speed = {
                engine: statistics.median(
                    r["sentences_per_sec"] for r in rows if r["engine"] == engine and r["beam_size"] == beam
                )
                for engine in engines
            }
            bleu = {
                engine: next(r["bleu"] for r in rows if r["engine"] == engine and r["beam_size"] == beam)
                for engine in engines
            }
            summary = {"bench": "decode_baseline_summary", "beam_size": beam, "baseline_commit": commit}
            for engine in engines:
                summary[f"{engine}_sentences_per_sec"] = round(speed[engine], 1)
                summary[f"{engine}_bleu"] = round(bleu[engine], 2)
                if "baseline" in speed and engine != "baseline":
                    summary[f"{engine}_vs_baseline"] = round(speed[engine] / speed["baseline"], 2)
            if "current" in speed and "ctranslate2_float32" in speed:
                summary["current_vs_ctranslate2_float32"] = round(
                    speed["current"] / speed["ctranslate2_float32"], 2
                )
            emit(summary)
    return 0


if __name__ == "__main__":
    from nmt import cli

    cli.stop_on_sigterm()
    cli.run(main)  # a config or data error: one line, exit 2 or 1
