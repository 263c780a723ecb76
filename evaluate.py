"""Evaluate a trained run directory: sacreBLEU BLEU/chrF, validation loss and perplexity.

    python evaluate.py --model-dir runs/base --split test --beam 4
    python evaluate.py --model-dir runs/base --split validation --json          # last stdout line: one JSON object
    python evaluate.py --model-dir runs/base --source news.en --reference news.de --output news.hyp.de
    python evaluate.py --model-dir runs/base --split test --engine ctranslate2 --engine-dir runs/base/ct2

BLEU is sacreBLEU on detokenized, cased hypotheses against the raw references (signature printed); `bleu_lc_tok`
is lowercased, tokenized BLEU (13a, or the target language's sacreBLEU tokenizer), only for comparison with
papers. Hypotheses go to DIR/hypotheses.<split>.txt unless --output says otherwise (hypotheses.test.best.first100.txt for --weights best --max-sentences 100, and
so on for --engine and --ensemble: only a full evaluation of the run's own weights writes hypotheses.test.txt). With --engine ctranslate2 the translations come from the CTranslate2 export and
the loss from the run directory's TensorFlow weights (`loss_weights`; null, with `loss_note`, if it has none), the
ones the export was made from when the run has them (--weights is refused with that engine).
--source/--reference may be pipes (read once) or `-` (stdin, for one of them); a UTF-8 byte order mark is dropped.
Exit codes: 0 ok, 1 run-directory/model problem, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from nmt import cli, cli_files


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Evaluate a run directory with sacreBLEU (BLEU, chrF) and the validation loss.",
        epilog="With --json, the last line printed on stdout is one JSON object (bleu, chrf, loss, signature, ...).",
    )
    parser.add_argument("--model-dir", required=True, help="run directory written by train.py")
    parser.add_argument(
        "--split",
        default=None,
        help="validation (the default) or test (the config's split names), or any split name; not with --source",
    )
    parser.add_argument(
        "--beam", type=int, default=None, help="beam size (1 = greedy); default: eval.beam_size"
    )
    parser.add_argument(
        "--alpha", type=float, default=None, help="beam length-penalty exponent; default: eval.alpha"
    )
    parser.add_argument(
        "--source", help="evaluate on this source file instead of a split (needs --reference; '-': stdin)"
    )
    parser.add_argument("--reference", help="reference translations, line-aligned with --source ('-': stdin)")
    parser.add_argument(
        "--output",
        help="hypotheses file (default: DIR/hypotheses.<split>[.<weights>][.<engine>][.ensemble][.first<N>].txt)",
    )
    cli.add_weights_argument(parser)
    parser.add_argument("--max-sentences", type=int, default=0, help="only the first N sentences (0 = all)")
    parser.add_argument(
        "--batch-size", type=int, default=None, help="sentences per decoding batch; default: eval.batch_size"
    )
    cli.add_xla_argument(parser, chunks=False)
    cli.add_streams_argument(parser)
    cli.add_engine_arguments(parser)
    cli.add_ensemble_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line on stdout")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    return parser.parse_args(argv)


def _print(text: str, stream) -> None:
    """`print` that cannot fail after the whole decode on what the stream's encoding cannot say (a file name's
    undecodable byte, a lone surrogate in Python, on a strict UTF-8 stdout): shown as a backslash escape instead."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    print(text.encode(encoding, "backslashreplace").decode(encoding), file=stream, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cli.setup_logging(args.verbose)
    cli_files.check_paths_given(
        {"--source": args.source, "--reference": args.reference, "--output": args.output}
    )
    if (args.source is None) != (args.reference is None):
        raise cli.CliError("--source and --reference go together", exit_code=2)
    if args.split is not None and args.source is not None:
        raise cli.CliError(
            f"--split {args.split} and --source are alternatives: evaluate a split of the run's dataset or a file",
            exit_code=2,
        )
    cli.check_search(args.beam, args.alpha)
    if args.max_sentences < 0:
        raise cli.CliError(f"--max-sentences must be >= 0, got {args.max_sentences}", exit_code=2)
    if args.batch_size is not None and args.batch_size < 1:
        raise cli.CliError(f"--batch-size must be at least 1, got {args.batch_size}", exit_code=2)
    cli.check_streams(args.streams)
    cli_files.check_input_file(args.source)
    cli_files.check_input_file(args.reference)
    if args.source == args.reference == "-":
        raise cli.CliError("--source and --reference cannot both be stdin ('-')", exit_code=2)
    if args.source is not None:
        from nmt.text_io import count_lines_if_file

        # regular files only: a pipe is read once, by the evaluation (which checks the alignment too)
        counts = count_lines_if_file(args.source), count_lines_if_file(args.reference)
        if None not in counts and counts[0] != counts[1]:
            raise cli.CliError(
                f"--source has {counts[0]} lines but --reference has {counts[1]}: they must be line-aligned",
                exit_code=2,
            )
    cli_files.check_output_file(args.output, "--output")
    cli_files.check_standard_streams(
        stdin="give --source and --reference as files" if "-" in (args.source, args.reference) else "",
        stdout="evaluate.py prints its report there",
    )
    cli_files.check_distinct_files(
        {"--source": args.source, "--reference": args.reference}, {"--output": args.output}
    )
    cli_files.check_model_dir(args.model_dir)
    if args.output is None:
        cli_files.check_writable_folder(
            args.model_dir, "--model-dir (the hypotheses go there; give --output FILE elsewhere)"
        )
    cli.check_ensemble(args)
    cli.check_engine(args)
    cli.quiet_tensorflow()
    cli.decoding_kernels()

    from nmt.ctranslate2_engine import EngineError, ExportError
    from nmt.evaluation import EvaluationError, evaluate_run_dir
    from nmt.evaluation_report import format_report

    warnings = cli.LineWarnings()
    try:
        record = evaluate_run_dir(
            args.model_dir,
            split=args.split or "validation",
            beam_size=args.beam,
            source_file=args.source,
            reference_file=args.reference,
            output=args.output,
            weights=args.weights,
            max_sentences=args.max_sentences,
            batch_size=args.batch_size,
            alpha=args.alpha,
            xla=cli.xla_setting(args.xla),
            streams=args.streams,
            progress=True,  # on a terminal; in a log (not a terminal) a line every 30 s
            warn=warnings,
            engine=args.engine,
            engine_dir=args.engine_dir,
            ensemble=tuple(args.ensemble),
        )
    except (EvaluationError, ExportError) as err:
        raise cli.CliError(str(err), exit_code=2) from err
    except EngineError as err:  # a corrupt CTranslate2 model
        raise cli.CliError(str(err)) from err
    warnings.summary()
    record["onednn"] = cli.onednn_enabled()
    if args.json:
        _print(format_report(record), sys.stderr)
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        print(json.dumps(clean, sort_keys=True), flush=True)
    else:
        _print(format_report(record), sys.stdout)
    if record.get("hypotheses_error"):  # the scores are printed above; the run still failed
        raise cli.CliError(f"the hypotheses were not written: {record['hypotheses_error']}")
    return 0


if __name__ == "__main__":
    cli.stop_on_sigterm()  # SIGTERM stops like SIGINT: exit 130, nothing half-written left
    cli.run_script(main)
