"""Beam size and length penalty chosen on validation, over one or more run directories (issue 15, item 4).

    python -m benchmarks.search_grid --model-dir runs/a runs/b --beams 1,4,8 --alphas 0.6,1.0,1.4,1.8

Decodes the validation split of every run with every (beam, alpha) of the grid (greedy search, beam 1, once: the
length penalty does not apply to it) and prints one JSON line per decoding (`kind: "decoding"`: run, beam, alpha,
BLEU, chrF, lowercased BLEU, the hypothesis/reference length ratio), then one per setting (`kind: "setting"`: the
mean over the runs and each run's difference from the setting of the runs' config) and one `kind: "choice"`: the
setting with the highest mean BLEU and its mean gain over the configured setting (a gain under ~0.5 BLEU is noise on
a 1,000-sentence split: no reason to change the config). The test split is refused: it is decoded once per recipe,
with the chosen setting (evaluate.py), never searched over. The runs' hypotheses files are not touched (hypotheses
go to a temporary directory).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

RATIO = re.compile(r"ratio = ([0-9.]+)")


def parse_list(text: str, kind: type) -> list:
    """'1,4,8' -> [1, 4, 8]; duplicates removed, order kept; '' -> []."""
    values = []
    for item in text.split(",") if text.strip() else []:
        value = kind(item.strip())
        if value not in values:
            values.append(value)
    return values


def grid(beams: list[int], alphas: list[float]) -> list[tuple[int, float | None]]:
    """The (beam, alpha) settings to decode: greedy search once (alpha None), every alpha for wider beams."""
    settings: list[tuple[int, float | None]] = []
    for beam in beams:
        settings.extend([(beam, None)] if beam == 1 else [(beam, alpha) for alpha in alphas])
    return settings


def summarize(decodings: list[dict], configured: dict[str, tuple[int, float]]) -> tuple[list[dict], dict]:
    """Per setting, the mean BLEU over the runs (only settings decoded for every run) and each run's difference from
    its configured setting (eval.beam_size, eval.alpha; None if that setting is not in the grid); and the choice,
    the setting with the highest mean BLEU (ties: the earlier in the grid), with its mean difference from the
    configured settings (None if one is not in the grid)."""
    runs = list(dict.fromkeys(d["run"] for d in decodings))
    by_key = {(d["run"], d["beam"], d["alpha"]): d for d in decodings}
    settings = list(dict.fromkeys((d["beam"], d["alpha"]) for d in decodings))
    rows = []
    for beam, alpha in settings:
        if any((run, beam, alpha) not in by_key for run in runs):
            continue
        deltas = {}
        for run in runs:
            base = by_key.get((run, *configured[run])) if run in configured else None
            deltas[run] = None if base is None else by_key[(run, beam, alpha)]["bleu"] - base["bleu"]
        bleus = [by_key[(run, beam, alpha)]["bleu"] for run in runs]
        rows.append(
            {
                "kind": "setting",
                "beam": beam,
                "alpha": alpha,
                "bleu_mean": sum(bleus) / len(bleus),
                "bleu_min": min(bleus),
                "delta_from_configured": deltas,
                "runs": len(runs),
            }
        )
    if not rows:
        raise ValueError("no setting was decoded for every run")
    best = max(rows, key=lambda row: row["bleu_mean"])  # max keeps the first of equal means
    deltas = list(best["delta_from_configured"].values())
    gain = None if None in deltas else sum(deltas) / len(deltas)
    choice = {"kind": "choice", "beam": best["beam"], "alpha": best["alpha"], "bleu_mean": best["bleu_mean"]}
    # the mean BLEU difference from the configured setting: under ~0.5 it is noise, not a reason to change
    choice["gain_over_configured"] = gain
    return rows, choice


def decode(
    model_dir: str, split: str, beam: int, alpha: float | None, output: Path, max_sentences: int
) -> dict:
    from nmt.evaluation import evaluate_run_dir

    record = evaluate_run_dir(
        model_dir, split=split, beam_size=beam, alpha=alpha, output=output, max_sentences=max_sentences
    )
    ratio = RATIO.search(record.get("bleu_detail", ""))
    return {
        "kind": "decoding",
        "run": model_dir,
        "split": split,
        "beam": beam,
        "alpha": alpha,
        "num_sentences": record["num_sentences"],  # all of the split's, or the first --max-sentences
        "bleu": record["bleu"],
        "chrf": record["chrf"],
        "bleu_lc_tok": record["bleu_lc_tok"],
        "length_ratio": float(ratio.group(1)) if ratio else None,
        "weights": record["weights"],
        "signature": record["signature"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.search_grid",
        description="Decode the validation split of run directories with a grid of beam sizes and length penalties; "
        "JSON lines: one per decoding, one per setting (mean over runs), the choice (highest mean BLEU).",
    )
    parser.add_argument("--model-dir", nargs="+", required=True, help="run directories written by train.py")
    parser.add_argument(
        "--beams", default="1,4,8", help="comma-separated beam sizes (1 = greedy; default 1,4,8)"
    )
    parser.add_argument(
        "--alphas",
        default="0.6,1.0,1.4,1.8",
        help="comma-separated length-penalty exponents (default 0.6,1.0,1.4,1.8)",
    )
    parser.add_argument(
        "--split", default="validation", help="the split searched (not the test split; default validation)"
    )
    parser.add_argument("--max-sentences", type=int, default=0, help="only the first N sentences (0 = all)")
    parser.add_argument("--output", help="also write the JSON lines to this file (replaced)")
    args = parser.parse_args(argv)
    try:
        beams = parse_list(args.beams, int)
        alphas = parse_list(args.alphas, float)
    except ValueError as error:
        parser.error(f"--beams/--alphas: {error}")
    from nmt.config import search_setting_problem

    if not beams:
        parser.error("--beams: give at least one beam size")
    if not alphas and any(beam > 1 for beam in beams):  # greedy search alone needs none
        parser.error("--alphas: give at least one length penalty for the beam sizes above 1")
    for option, problem in [("--beams", search_setting_problem(beam, None)) for beam in beams] + [
        ("--alphas", search_setting_problem(None, alpha)) for alpha in alphas
    ]:
        if problem:
            parser.error(f"{option}: {problem.replace('beam_size', 'a beam size')}")
    if args.max_sentences < 0:
        parser.error("--max-sentences must be >= 0")
    from nmt import cli
    from nmt.run_dir import RunDir, RunDirError

    if args.output and os.path.isdir(args.output):  # refused before the search, not once it is done
        print(f"search_grid: --output {args.output} is a directory, not a file", file=sys.stderr)
        return 2
    seen, unique = set(), []  # one run given twice, or spelled two ways (runs/a, runs/a/): decoded once
    for model_dir in args.model_dir:
        if (real := os.path.realpath(model_dir)) not in seen:
            seen.add(real)
            unique.append(model_dir)
    args.model_dir = unique
    configured = {}
    for model_dir in args.model_dir:
        try:
            config = RunDir(model_dir).require().load_config()
        except RunDirError as error:
            print(f"search_grid: {error}", file=sys.stderr)
            return 2
        configured[model_dir] = (
            config.eval.beam_size,
            None if config.eval.beam_size == 1 else config.eval.alpha,
        )
        if args.split.split("[")[0].strip() in ("test", config.data.test_split):  # a TFDS slice of it too
            print(
                f"search_grid: {args.split!r} is {model_dir}'s test split: search settings are chosen on "
                "validation, and the test split is decoded once, with the chosen setting (evaluate.py)",
                file=sys.stderr,
            )
            return 2
    cli.quiet_tensorflow()
    cli.decoding_kernels()
    from nmt.evaluation import EvaluationError

    # --output is written beside itself and put in place at the end: a failed or interrupted search keeps the
    # previous results there
    partial = Path(f"{args.output}.partial-{os.getpid()}") if args.output else None
    try:
        out = open(partial, "w", encoding="utf-8") if partial else None  # noqa: SIM115 (closed below)
    except OSError as error:
        print(f"search_grid: --output: {error}", file=sys.stderr)
        return 2

    def emit(record: dict) -> None:
        line = json.dumps(record, sort_keys=True)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    decodings = []
    try:
        with tempfile.TemporaryDirectory(prefix="search_grid-") as tmp:
            for model_dir in args.model_dir:
                for beam, alpha in grid(beams, alphas):
                    record = decode(
                        model_dir, args.split, beam, alpha, Path(tmp) / "hyp.txt", args.max_sentences
                    )
                    decodings.append(record)
                    emit(record)
                    print(
                        f"{model_dir} beam {beam} alpha {alpha}: BLEU {record['bleu']:.2f} "
                        f"ratio {record['length_ratio']}",
                        file=sys.stderr,
                    )
        rows, choice = summarize(decodings, configured)
        for row in rows:
            emit(row)
        emit(choice)
        if out:
            out.close()
            os.replace(partial, args.output)
    except EvaluationError as error:  # e.g. a split the dataset does not have
        print(f"search_grid: {error}", file=sys.stderr)
        return 2
    finally:
        if out:
            out.close()
            partial.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    from nmt import cli

    cli.stop_on_sigterm()  # SIGTERM like Ctrl-C: the temporary directory and the partial --output go
    cli.run(main)  # a data or run-directory problem: one "error: ..." line and a non-zero exit
