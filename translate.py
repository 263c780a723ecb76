"""Translate text with a trained run directory: one output line per input line, in order.

    python translate.py --model-dir runs/base < input.en > output.de
    python translate.py --model-dir runs/base --input input.en --output output.de --beam 4
    python translate.py --model-dir runs/base --input input.en --nbest 3     # "text<TAB>score" x 3 per line
    python translate.py --model-dir runs/base --input input.en --beam 8 --alpha 1.0   # another search setting
    python translate.py --model-dir runs/base --engine ctranslate2 --engine-dir runs/base/ct2 < input.en
    python translate.py --model-dir runs/base --input input.en --plot-attention attention.svg   # heat maps, 1st line
    python translate.py --model-dir runs/base --input input.en --score given.de   # "log-probability<TAB>tokens"
    python translate.py --model-dir runs/base --input mono.de --sampling-topk 10 --seed 1   # back-translation

Input is read as bytes: invalid UTF-8 is replaced (U+FFFD) and NUL bytes removed, each with a warning naming the
line on stderr. Empty lines give empty lines without reaching the model; lines longer than the model's position
table are translated truncated, with a warning. The input is streamed in chunks of --chunk-size lines (bounded
memory for any file size; a pipe or FIFO is read once); a UTF-8 byte order mark at its start is dropped. `-` as
--input or --output is stdin or stdout. --output is written through a temporary file renamed at the end; SIGINT
and SIGTERM stop cleanly (exit 130, the temporary file removed). A path that is not a regular file (`/dev/stdout`,
`/dev/fd/3`, a FIFO, a device) is written as the lines come, after what its descriptor has already written.
With --nbest N, each output line holds N tab-separated `text<TAB>score` fields, best first (score: the
length-normalised log-probability of the beam search; an empty translation is an empty text field), so the line
count still matches the input; a blank input line gives a blank output line (no fields).
--score FILE scores the translations in FILE (line-aligned with the input) instead of translating (forced
decoding, `nmt/scoring.py`): each output line is `log-probability<TAB>tokens`, the natural-log probability of the
translation's pieces and EOS given its source line and their count (mean per token: their ratio). A translation
longer than the position table gets `nan`, with a warning; files of different lengths are refused before the
model loads (exit 2), or, from a pipe, once one ends (exit 1). Search and decoding options do not apply (exit 2).
--sampling-topk K draws each token from the K most likely (0: the whole vocabulary; then --sampling-topp P, the
nucleus, and --sampling-temperature T) instead of searching, as back-translation at scale does (Edunov et al.,
2018); line i of the input draws its random numbers from (--seed, i), so they depend on neither batching, streams,
XLA nor chunks (the draws, up to the rounding of the model's probabilities: transformer/sampling.py). Not with a
beam, --alpha, --nbest, --score, --plot-attention or --engine ctranslate2 (exit 2).
--engine ctranslate2 decodes with a CTranslate2 export (export.py --format ctranslate2) under the same contract;
the tokenizer and the eval settings come from --model-dir (see nmt/ctranslate2_engine.py for how its beam search
differs); --weights is refused there (the export holds the weights it was made from: export.py --weights).
Exit codes: 0 ok, 1 run-directory/model problem, 2 usage error (e.g. missing input file), 141 when the reader of
stdout went away (`| head`: as a filter killed by SIGPIPE).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import logging
import sys

from nmt import cli, cli_files


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Translate lines of text with a trained run directory (stdin/stdout by default).",
        epilog="--nbest N prints N tab-separated 'text<TAB>score' fields per line, best first.",
    )
    parser.add_argument("--model-dir", required=True, help="run directory written by train.py")
    parser.add_argument("--input", help="input file, one sentence per line (default or '-': stdin)")
    parser.add_argument("--output", help="output file (default or '-': stdout)")
    parser.add_argument(
        "--beam", type=int, default=None, help="beam size (1 = greedy); default: eval.beam_size"
    )
    parser.add_argument(
        "--alpha", type=float, default=None, help="beam length-penalty exponent; default: eval.alpha"
    )
    parser.add_argument(
        "--nbest", type=int, default=1, help="translations per line, at most the beam size (default 1)"
    )
    parser.add_argument(
        "--no-cache", action="store_true", help="recompute the decoder each step (same output)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=None, help="sentences per batch; default eval.batch_size"
    )
    parser.add_argument(
        "--chunk-size", type=int, default=1000, help="lines read and translated at a time (default 1000)"
    )
    cli.add_weights_argument(parser)
    cli.add_xla_argument(parser)
    cli.add_streams_argument(parser)
    cli.add_engine_arguments(parser)
    cli.add_ensemble_argument(parser)
    parser.add_argument(
        "--plot-attention",
        metavar="FILE.svg",
        help="cross-attention heat maps of the first non-empty line, as an SVG file",
    )
    parser.add_argument(
        "--score",
        metavar="TRANSLATIONS",
        help="score these translations (one per input line) instead of translating: 'log-probability<TAB>tokens' "
        "per line (natural log, the pieces and EOS)",
    )
    parser.add_argument(
        "--sampling-topk",
        type=int,
        default=1,
        metavar="K",
        help="sample each token from the K most likely instead of searching (0: the whole vocabulary; "
        "default 1: no sampling); one draw per line, no beam",
    )
    parser.add_argument(
        "--sampling-topp",
        type=float,
        metavar="P",
        help="with --sampling-topk: then from the smallest set of those reaching probability P (default 1.0)",
    )
    parser.add_argument(
        "--sampling-temperature",
        type=float,
        metavar="T",
        help="with --sampling-topk: log-probabilities divided by T first (default 1.0)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        help="with --sampling-topk: the random seed (default 0); line i draws from (seed, i)",
    )
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    return parser.parse_args(argv)


def _sampling(args: argparse.Namespace):
    """The `transformer.sampling.Sampling` of --sampling-*, None without sampling; CliError (exit 2) on a bad one."""
    extra = [name for name, value in (("--sampling-topp", args.sampling_topp), ("--seed", args.seed),
             ("--sampling-temperature", args.sampling_temperature)) if value is not None]  # fmt: skip
    if args.sampling_topk == 1:
        if extra:
            verb = "applies" if len(extra) == 1 else "apply"
            raise cli.CliError(
                f"{', '.join(extra)} {verb} to sampling: give --sampling-topk K (0: the whole vocabulary)",
                exit_code=2,
            )
        return None
    unsupported = [name for name, given in (("--beam", args.beam not in (None, 1)), ("--nbest", args.nbest != 1),
                   ("--alpha", args.alpha is not None),
                   ("--score", args.score is not None), ("--plot-attention", bool(args.plot_attention)),
                   ("--engine ctranslate2", args.engine != "tensorflow")) if given]  # fmt: skip
    if unsupported:
        raise cli.CliError(
            f"--sampling-topk draws one translation per line: not with {', '.join(unsupported)}", 2
        )
    from common.sampling import Sampling

    try:
        return Sampling(
            topk=args.sampling_topk,
            topp=1.0 if args.sampling_topp is None else args.sampling_topp,
            temperature=1.0 if args.sampling_temperature is None else args.sampling_temperature,
            seed=args.seed or 0,
        )
    except ValueError as err:
        message = str(err).replace("sampling seed", "seed").replace("sampling ", "sampling-", 1)
        raise cli.CliError(f"--{message}", exit_code=2) from None


def _check(args: argparse.Namespace) -> None:
    cli_files.check_paths_given(
        {
            "--input": args.input,
            "--output": args.output,
            "--score": args.score,
            "--plot-attention": args.plot_attention,
        }
    )
    cli.check_search(args.beam, args.alpha)
    if args.batch_size is not None and args.batch_size < 1:
        raise cli.CliError(f"--batch-size must be at least 1, got {args.batch_size}", exit_code=2)
    for option, value in (("--nbest", args.nbest), ("--chunk-size", args.chunk_size)):
        if value < 1:
            raise cli.CliError(f"{option} must be at least 1, got {value}", exit_code=2)
    if args.beam is not None and args.nbest > args.beam:
        raise cli.CliError(f"--nbest {args.nbest} exceeds --beam {args.beam}", exit_code=2)
    cli.check_streams(args.streams)
    if args.input == "-":
        args.input = None  # stdin
    cli_files.check_input_file(args.input)
    cli_files.check_output_file(args.output, "--output")
    cli_files.check_output_file(args.plot_attention, "--plot-attention")
    cli_files.check_standard_streams(
        stdin="give --input FILE" if args.input is None else "give --score FILE" if args.score == "-" else "",
        stdout="give --output FILE" if args.output in (None, "-") else "",
    )
    cli_files.check_distinct_files(
        {"--input": args.input, "--score": args.score},
        {"--output": args.output, "--plot-attention": args.plot_attention},
    )
    if args.plot_attention:
        from nmt.attention_plot import check_path

        try:
            check_path(args.plot_attention)
        except ValueError as err:
            raise cli.CliError(f"--plot-attention: {err}", exit_code=2) from err
    if args.plot_attention and args.engine != "tensorflow":
        raise cli.CliError("--plot-attention needs --engine tensorflow", exit_code=2)
    args.sampling = _sampling(args)
    if args.score is not None:
        _check_score(args)
    cli.check_ensemble(args)
    cli.check_engine(args)


def _check_score(args: argparse.Namespace) -> None:
    from nmt.text_io import count_lines_if_file

    search = [name for name, given in (("--beam", args.beam is not None), ("--alpha", args.alpha is not None),
              ("--nbest", args.nbest != 1), ("--no-cache", args.no_cache), ("--xla", args.xla != "auto"),
              ("--batch-size", args.batch_size is not None), ("--streams", args.streams is not None),
              ("--plot-attention", bool(args.plot_attention))) if given]  # fmt: skip
    if search:
        verb = "does" if len(search) == 1 else "do"
        raise cli.CliError(
            f"--score scores the given translations: {', '.join(search)} {verb} not apply", exit_code=2
        )
    if args.engine != "tensorflow":
        raise cli.CliError("--score needs --engine tensorflow", exit_code=2)
    if args.score == "-" and args.input is None:
        raise cli.CliError(
            "--score - and the input cannot both be stdin: give --input or a --score file", exit_code=2
        )
    try:
        cli_files.check_input_file(None if args.score == "-" else args.score)
    except cli.CliError as err:
        raise cli.CliError(f"--score: {err}", exit_code=2) from None
    sources, translations = (count_lines_if_file(path) for path in (args.input, args.score))
    if None not in (sources, translations) and sources != translations:
        raise cli.CliError(
            f"--score {args.score} has {translations} lines, --input {args.input} {sources}: they must be line-aligned",
            exit_code=2,
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cli.setup_logging(args.verbose)
    _check(args)
    cli_files.check_model_dir(args.model_dir)
    cli.quiet_tensorflow()
    cli.decoding_kernels()

    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    from nmt.attention_plot import plot_attention
    from nmt.progress import bar_settings
    from nmt.text_io import LineWriter, count_lines_if_file, open_input, read_lines
    from nmt.translator import Translator

    if args.engine == "ctranslate2":
        translator = cli.load_ctranslate2(
            args.model_dir, args.engine_dir, batch_size=args.batch_size, inter_threads=args.streams
        )
    else:
        translator = Translator.from_run_dir(
            args.model_dir,
            weights=args.weights,
            xla=cli.xla_setting(args.xla),
            batch_size=args.batch_size,
            streams=args.streams,
            ensemble=tuple(args.ensemble),
        )
    if args.alpha is not None:  # both engines read the length penalty from their eval_config
        translator.eval_config = dataclasses.replace(translator.eval_config, alpha=args.alpha)
    beam = translator.eval_config.beam_size if args.beam is None else args.beam
    beam = 1 if args.sampling is not None else beam
    if args.nbest > beam:
        raise cli.CliError(f"--nbest {args.nbest} exceeds the beam size {beam} (set --beam)", exit_code=2)
    if args.alpha is not None and beam == 1 and args.sampling is None:  # `--beam 1 --alpha`: refused earlier
        raise cli.CliError(cli.GREEDY_RUN_ALPHA, exit_code=2)

    warnings = cli.LineWarnings(source=args.input or "stdin")
    keep = translator.max_source_length - 1

    def truncated(index: int, length: int | None) -> None:
        done = "scored" if args.score is not None else "translated"
        warnings(index + 1, "truncated", cli.truncation_message(length, keep, done))

    interactive = args.input is None and sys.stdin.isatty()
    total = count_lines_if_file(args.input)  # before reading: a pipe is read only once, by read_lines
    if args.engine == "tensorflow" and translator.xla == "auto" and total is not None:
        translator.xla = translator.uses_xla(total, beam)  # for the whole file, not per --chunk-size chunk
    handle = open_input(args.input)
    lines = read_lines(handle, warnings)
    if args.plot_attention:
        head = []  # the lines up to the first non-empty one, put back in front of the stream
        for line in lines:
            head.append(line)
            if line.strip():
                plot_attention(args.plot_attention, translator.attention(line, beam_size=beam))
                break
        else:
            logging.getLogger("nmt").warning("--plot-attention: no non-empty input line, nothing plotted")
        lines = itertools.chain(head, lines)
    if args.score is not None:
        try:
            return _score(args, translator, lines, warnings, truncated, total, interactive)
        finally:
            handle.close()
    results = translator.translate_stream(
        lines,
        chunk_size=1 if interactive else args.chunk_size,
        on_truncated=truncated,
        beam_size=beam,
        use_cache=not args.no_cache,
        nbest=args.nbest,
        **({"sampling": args.sampling} if args.sampling is not None else {}),  # the TensorFlow engine's
    )
    with logging_redirect_tqdm(), LineWriter(args.output) as writer:
        bar = tqdm(total=total, unit="line", desc="translating", disable=not args.input, **bar_settings())
        for result in results:
            if args.nbest > 1:  # text<TAB>score pairs; an empty text keeps its (empty) field
                writer.write_fields(field for text, score in result for field in (text, f"{score:.4f}"))
            else:
                writer.write(result)
            bar.update(1)
            if interactive:
                writer.flush()
        bar.close()
    handle.close()
    warnings.summary()
    return 0


def _score(args, translator, lines, warnings, truncated, total, interactive) -> int:
    """--score: one 'log-probability<TAB>tokens' line per (input line, translation) pair."""
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    from nmt.progress import bar_settings
    from nmt.scoring import LengthMismatch, score_stream
    from nmt.text_io import LineWriter, open_input, read_lines

    limit = translator.max_target_length - 1

    def too_long(index: int, length: int | None) -> None:
        # None: a line so long that only its start was tokenized (memory bounded, nmt.scoring)
        pieces = f"{length} subwords" if length is not None else "more subwords (a very long line)"
        message = f"a translation of {pieces}, over the model's {limit}: nan"
        warnings(index + 1, "not scored", message, source=args.score if args.score != "-" else "stdin")

    handle = open_input(args.score)
    translation_warnings = cli.LineWarnings(source=args.score if args.score != "-" else "stdin")
    translations = read_lines(handle, translation_warnings)
    scores = score_stream(
        translator, lines, translations, chunk_size=1 if interactive else args.chunk_size,
        on_truncated=truncated, on_too_long=too_long,
    )  # fmt: skip
    try:
        with logging_redirect_tqdm(), LineWriter(args.output) as writer:
            bar = tqdm(total=total, unit="line", desc="scoring", disable=not args.input, **bar_settings())
            for log_prob, tokens in scores:
                writer.write_fields([f"{log_prob:.6f}", str(tokens)])
                bar.update(1)
                if interactive:
                    writer.flush()
            bar.close()
    except LengthMismatch as err:
        raise cli.CliError(f"--score {args.score} and the input: {err}", exit_code=1) from None
    finally:
        handle.close()
    warnings.summary()
    translation_warnings.summary()
    return 0


if __name__ == "__main__":
    cli.stop_on_sigterm()
    cli.run_script(main)
