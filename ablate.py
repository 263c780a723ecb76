"""Ablations: train each variant with the real trainer for the same budget, evaluate, write a markdown report.

    python ablate.py --budget 10                                  # every default variant, 10 minutes each
    python ablate.py --variants baseline,qkv_qk,qkv_all --budget 5
    python ablate.py --quick                                      # CI smoke on tiny.yaml (< 3 minutes)

Each variant trains in runs/ablate/<variant> (a normal run directory, overwritten on the next run unless --reuse),
from the same seed, with `--set train.max_minutes=BUDGET train.max_steps=0` (or --max-steps N). The report
(ablations.md) puts the measured tables next to the claimed ones. Variants: benchmarks/variants.py (--list).
Exit codes: 0 ok, 1 a variant has no result (no weights, or its evaluation failed; the report is still written),
its directory is in use, or ROOT/tokenizer is not one ablate.py made, 2 bad arguments or config (checked before any
training; e.g. a --root that is a run directory), 130 interrupted (the variant in training keeps a checkpoint:
--reuse resumes it).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import shlex
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from nmt.cli import add_set_argument  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke: tiny.yaml, 2 variants of 40 steps")
    parser.add_argument("--config", help="YAML config (default base.yaml; tiny.yaml with --quick)")
    add_set_argument(parser)
    parser.add_argument(
        "--budget", type=float, help="training minutes per variant (default 5; 1 with --quick)"
    )
    parser.add_argument(
        "--variants", help="comma-separated variant names (default: all but the trained mask ones)"
    )
    parser.add_argument("--output", help="markdown report (default ablations.md)")
    parser.add_argument("--root", help="directory of the variant runs (default runs/ablate)")
    parser.add_argument(
        "--max-steps", type=int, help="also stop each variant after N steps (default: no cap)"
    )
    parser.add_argument(
        "--eval-every", type=int, help="steps between validation-loss evaluations (default 200)"
    )
    parser.add_argument(
        "--grad-steps", type=int, help="grad-norm fluctuation over the first N steps (default 100)"
    )
    parser.add_argument("--bleu-sentences", type=int, help="validation sentences for greedy BLEU (0 = all)")
    parser.add_argument(
        "--mask-steps", type=int, help="updates per setting in the mask-fill check (0 = skip it)"
    )
    parser.add_argument(
        "--in-process", action="store_true", help="train with nmt.trainer.Trainer in this process"
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep variants that already have final weights, resume those stopped with a checkpoint (only runs "
        "trained with the same settings; others are trained anew)",
    )
    parser.add_argument("--list", action="store_true", help="print the variants and exit")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    from benchmarks.ablation import AblationError, AblationOptions, run_ablation
    from benchmarks.variants import DEFAULT_VARIANTS, VARIANTS, select
    from nmt.config import ConfigError, load_config, new_run_problem

    if args.list:
        for variant in VARIANTS:
            default = "default" if variant.name in DEFAULT_VARIANTS else "       "
            print(
                f"{variant.name:16} {default} {' '.join(variant.overrides) or '-':48} {variant.description}"
            )
        return 0
    changes = {
        "config": args.config,
        "budget_minutes": args.budget,
        "output": args.output,
        "root": args.root,
        "eval_every": args.eval_every,
        "max_steps": args.max_steps,
        "grad_steps": args.grad_steps,
        "bleu_sentences": args.bleu_sentences,
        "mask_steps": args.mask_steps,
        "variants": tuple(v.strip() for v in args.variants.split(",") if v.strip())
        if args.variants
        else None,
    }
    changes = {key: value for key, value in changes.items() if value is not None}
    changes.update(
        overrides=args.overrides,
        launcher="inprocess" if args.in_process else "subprocess",
        reuse=args.reuse,
        command=shlex.join(["python", "ablate.py", *(sys.argv[1:] if argv is None else argv)]),
    )
    options = AblationOptions.quick(**changes) if args.quick else AblationOptions(**changes)
    try:
        select(options.variants)
        # its runs are new ones: what train.py refuses for a new run too
        if problem := new_run_problem(load_config(options.config, options.overrides)):
            raise ConfigError(problem)
    except (KeyError, ConfigError) as err:
        print(f"ablate.py: {err.args[0] if isinstance(err, KeyError) else err}", file=sys.stderr)
        return 2
    if problem := check_options(options):
        print(f"ablate.py: {problem}", file=sys.stderr)
        return 2
    try:
        output, failed = run_ablation(options)
    except AblationError as err:
        print(f"ablate.py: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "ablate.py: interrupted; the variant in training stopped with a checkpoint (rerun with --reuse to "
            "resume it and keep the variants already finished); no report written",
            file=sys.stderr,
        )
        return 130
    print(f"ablate.py: wrote {output}", file=sys.stderr)
    if failed:
        print(f"ablate.py: failed variants: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def check_options(options) -> str | None:
    """What is wrong with the numbers or the report path (checked before any training), or None."""
    if not (math.isfinite(options.budget_minutes) and options.budget_minutes > 0):
        return f"--budget must be a positive number of minutes, got {options.budget_minutes}"
    for name in ("max_steps", "eval_every", "grad_steps", "bleu_sentences", "mask_steps"):
        if getattr(options, name) < 0:
            return f"--{name.replace('_', '-')} must be >= 0, got {getattr(options, name)}"
    if not options.variants:
        return "--variants names no variant"
    from benchmarks.ablation import protocol_overrides

    protocol = {text.split("=", 1)[0] for text in protocol_overrides(options)}
    clash = [text for text in options.overrides if text.split("=", 1)[0].strip() in protocol]
    if clash:  # applied last, the protocol's values would silently replace them
        return (
            f"--set {' '.join(clash)}: the ablation protocol sets these for every variant (use --max-steps, "
            "--budget, --eval-every)"
        )
    output = Path(options.output).resolve()
    try:  # the report is written after all the training: a path it cannot be written to is refused now
        output.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=output.parent, prefix=f".{output.name}."):
            pass
    except OSError as err:
        return f"--output {options.output}: cannot write there ({err.strerror or err})"
    if output.is_dir():
        return f"--output {options.output} is a directory"
    root = Path(options.root).resolve()
    if blocked := next((p for p in (root, *root.parents) if p.exists() and not p.is_dir()), None):
        return f"--root {options.root}: {blocked} is a file, not a directory"
    if (root / "config.yaml").is_file():
        # its tokenizer would be replaced by the shared one (its weights no longer load with it)
        return f"--root {options.root} is a run directory (it holds config.yaml): give another --root"
    return None


if __name__ == "__main__":
    from nmt.cli import stop_on_sigterm

    stop_on_sigterm()  # SIGTERM like Ctrl-C: the variant in training saves a checkpoint and stops
    sys.exit(main())
