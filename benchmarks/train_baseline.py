"""Training quality of this tree against an earlier commit of it: validation loss at equal steps, over seeds.

    python -m benchmarks.train_baseline --baseline 9fd2060 --steps 600 --seeds 1,2     # ~1 h on 2 cores
    python -m benchmarks.train_baseline --baseline 9fd2060 --config configs/tiny.yaml --steps 40 --seeds 1

The data-at-scale issue asks that the main job through the prepared-data path reach the same validation loss at
equal steps as the in-memory path it replaced (within 0.02, or within the spread of two seeds). This bench checks the
baseline commit out into a temporary `git worktree` and runs `train.py --config CONFIG` there and in this tree, for
each seed, with `train.max_steps=STEPS`, no time budget, validation loss every STEPS/2 steps and no BLEU; runs are
interleaved (baseline seed 1, current seed 1, baseline seed 2, ...). Figures come from each run's own
metrics.jsonl. This tree's runs also get the `--current-set` overrides (default `train.schedule=inverse_sqrt`,
the baseline's only schedule: `base.yaml` has used cosine since 2026-12-02). The tokenizers of the two trees
are compared too: a different tokenizer changes the loss per token, so each row also has the validation negative
log-likelihood summed over the whole validation set (loss x target tokens), which does not depend on the
segmentation.
Quality does not depend on machine load, so this may run beside other work; it is slow, not a timing.

One JSON object per line on stdout: a `train_baseline` row per (tree, seed) with the validation loss at each
evaluation, and a `train_baseline_summary` with the mean of each tree, the spread of the seeds and the difference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import int_list, positive_int
from benchmarks.worktree import ROOT, baseline_worktree


def _validation_losses(run_dir: Path) -> dict[int, tuple[float, int]]:
    """{step: (loss per target token, target tokens)} of every validation record (the final one included: with
    train.average_last=0 it is the last step's raw weights)."""
    losses = {}
    for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record.get("tag") in ("validation", "final") and "loss" in record:
            losses[int(record["step"])] = (float(record["loss"]), int(record.get("tokens") or 0))
    return losses


def _tokenizer_digest(run_dir: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted((run_dir / "tokenizer").rglob("*.model")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--baseline", required=True, help="commit (or any git revision) of the baseline trainer"
    )
    parser.add_argument(
        "--config",
        default="configs/base.yaml",
        help="config path inside each tree: the baseline reads its own copy (its schema)",
    )
    parser.add_argument(
        "--steps", type=positive_int, default=600, help="optimizer steps per run (default 600)"
    )
    parser.add_argument(
        "--seeds", type=int_list(), default=[1, 2], help="comma-separated train.seed values (default 1,2)"
    )
    parser.add_argument("--keep", help="keep the run directories under this directory (default: removed)")
    parser.add_argument(
        "--current-set",
        nargs="*",
        default=["train.schedule=inverse_sqrt"],
        metavar="KEY=VALUE",
        help="overrides for this tree's runs only, to match what the baseline does without them (default: "
        "train.schedule=inverse_sqrt, the only schedule of commits before it became a setting; base.yaml uses cosine)",
    )
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2")
    seeds = args.seeds
    emit = lambda record: print(json.dumps(record), flush=True)  # noqa: E731
    env = dict(os.environ)
    mirror = (
        ROOT.parent / "shared" / "data" / "multi30k"
    )  # found relative to the repository: the worktree is not here
    env.setdefault("NMT_DATA_MIRROR", str(mirror))
    overrides = [
        f"train.max_steps={args.steps}",
        "train.max_minutes=0",
        f"train.eval_every={args.steps // 2}",
        "train.bleu_every=0",
        "train.average_last=0",
        f"train.checkpoint_every={args.steps}",
    ]
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="nmt-train-baseline-") as scratch,
        baseline_worktree(args.baseline) as (worktree, commit),
    ):
        scratch = Path(args.keep).resolve() if args.keep else Path(scratch)
        for seed in seeds:
            for tree, cwd in (("baseline", worktree), ("current", ROOT)):
                run_dir = scratch / f"{tree}-seed{seed}"
                command = [
                    sys.executable, "train.py", "--config", args.config, "--model-dir", str(run_dir),
                    "--set", *overrides, f"train.seed={seed}", *(args.current_set if tree == "current" else []),
                ]  # fmt: skip
                completed = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
                if completed.returncode != 0:
                    raise RuntimeError(
                        f"{tree} seed {seed} exited {completed.returncode}:\n{completed.stderr[-3000:]}"
                    )
                losses = _validation_losses(run_dir)
                row = {
                    "bench": "train_baseline",
                    "tree": tree,
                    "commit": commit if tree == "baseline" else "HEAD",
                    "seed": seed,
                    "steps": args.steps,
                    "validation_loss": {str(step): round(loss, 4) for step, (loss, _) in losses.items()},
                    # summed over the validation set: comparable across tokenizers (loss per token is not)
                    "validation_nll_nats": {
                        str(step): round(loss * n, 1) for step, (loss, n) in losses.items()
                    },
                    "tokenizer_sha256": _tokenizer_digest(run_dir),
                }
                rows.append(row)
                emit(row)
    summary = {"bench": "train_baseline_summary", "baseline_commit": commit, "steps": args.steps}
    for key in ("validation_loss", "validation_nll_nats"):
        for step in sorted({int(s) for row in rows for s in row[key]}):
            means = {}
            for tree in ("baseline", "current"):
                values = [r[key][str(step)] for r in rows if r["tree"] == tree and str(step) in r[key]]
                if values:
                    means[tree] = sum(values) / len(values)
                    summary[f"{key}_{tree}_mean_at_{step}"] = round(means[tree], 4)
                    summary[f"{key}_{tree}_seed_spread_at_{step}"] = round(max(values) - min(values), 4)
            if len(means) == 2:
                summary[f"{key}_difference_at_{step}"] = round(means["current"] - means["baseline"], 4)
    summary["same_tokenizer"] = len({r["tokenizer_sha256"] for r in rows}) == 1
    emit(summary)
    return 0


if __name__ == "__main__":
    from nmt import cli

    cli.stop_on_sigterm()
    cli.run(main)  # a config or data error: one line, exit 2 or 1
