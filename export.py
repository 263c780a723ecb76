"""Export a run directory as a TensorFlow SavedModel (raw strings in, translated strings out) or for CTranslate2.

    python export.py --model-dir runs/base --output runs/base/export [--beam 4]
    python export.py --model-dir runs/base --format ctranslate2 --quantization int8 --output runs/base/ct2

The SavedModel holds the SentencePiece tokenizer (in-graph, tensorflow_text), the model weights and the beam
search. Its `serving_default` signature takes `inputs`, a 1-D tf.string tensor, and returns `{"outputs": 1-D
tf.string}`. Load it with plain TensorFlow after `import tensorflow_text`:

    import tensorflow as tf, tensorflow_text
    serve = tf.saved_model.load("runs/base/export").signatures["serving_default"]
    print(serve(inputs=tf.constant(["A man is sleeping."]))["outputs"].numpy())

--format ctranslate2 writes a CTranslate2 model (float32, or int8 weights with --quantization int8) with our
SentencePiece model and an nmt_export.json (nmt/ctranslate2_export.py); translate.py and evaluate.py decode with it
under --engine ctranslate2 --engine-dir DIR. It needs the ctranslate2 package (pinned in requirements.txt).

--output is written through a temporary directory; an existing export of the same format there is replaced, any
other existing non-empty path is refused. Exit codes: 0 ok, 1 run-directory/model problem, 2 usage error.
"""

from __future__ import annotations

import argparse
import logging

from nmt import cli, cli_files

log = logging.getLogger("nmt")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Export a run directory as a SavedModel (strings in, translations out).",
        epilog="serving_default: inputs = 1-D tf.string, outputs = {'outputs': 1-D tf.string}.",
    )
    parser.add_argument("--model-dir", required=True, help="run directory written by train.py")
    parser.add_argument(
        "--output", required=True, help="directory to write (SavedModel or CTranslate2 model)"
    )
    parser.add_argument(
        "--format",
        default="savedmodel",
        choices=["savedmodel", "ctranslate2"],
        help="savedmodel (default: TensorFlow, strings in and out) or ctranslate2 (for --engine ctranslate2)",
    )
    parser.add_argument(
        "--quantization",
        choices=["float32", "int8"],
        default=None,
        help="ctranslate2 only: float32 (default) or int8 weights (float32 activations)",
    )
    parser.add_argument(
        "--beam",
        type=int,
        default=None,
        help="savedmodel only: beam size baked in (1 = greedy); default eval.beam_size",
    )
    cli.add_weights_argument(parser)
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cli.setup_logging(args.verbose)
    cli.check_search(args.beam, None)
    if args.format == "ctranslate2" and args.beam is not None:
        raise cli.CliError(
            "--beam goes with --format savedmodel (CTranslate2 takes the beam when decoding)", 2
        )
    if args.format != "ctranslate2" and args.quantization is not None:
        raise cli.CliError("--quantization goes with --format ctranslate2", exit_code=2)
    cli_files.check_model_dir(args.model_dir)
    cli_files.check_output_dir(args.output)
    if args.format == "ctranslate2":
        cli.require_ctranslate2("--format ctranslate2")
    cli.quiet_tensorflow()
    if args.format == "ctranslate2":
        from nmt.ctranslate2_export import ctranslate2_output_problem as output_problem
    else:
        from nmt.export import savedmodel_output_problem as output_problem
    if problem := output_problem(args.output):  # before the model is loaded
        raise cli.CliError(problem, exit_code=2)
    if args.format == "ctranslate2":
        return _export_ctranslate2(args)

    import tensorflow as tf

    from nmt.export import export_run_dir, load_exported

    try:
        output, module = export_run_dir(
            args.model_dir, args.output, beam_size=args.beam, weights=args.weights
        )
    except FileExistsError as err:
        raise cli.CliError(str(err), exit_code=2) from err
    except tf.errors.OpError as err:  # e.g. no permission there: TensorFlow's errors are not OSErrors
        raise cli.CliError(f"could not write the SavedModel to {args.output}: {err.message}") from err
    serve = load_exported(output)  # check that it loads and runs on its own
    sample = serve(inputs=tf.constant(["", "Hello."]))["outputs"].numpy()
    log.info(
        "exported %s (beam %d); reloaded, a test sentence gives %r",
        output,
        module.beam_size,
        sample[1].decode(),
    )
    print(output)
    return 0


def _export_ctranslate2(args: argparse.Namespace) -> int:
    from nmt.ctranslate2_export import ExportError, UnsupportedModelError, export_run_dir_ctranslate2

    try:
        output = export_run_dir_ctranslate2(
            args.model_dir, args.output, quantization=args.quantization or "float32", weights=args.weights
        )
    except ExportError as err:
        # a model CTranslate2 cannot run is the run directory's problem (1); an --output refused, a usage error (2)
        raise cli.CliError(str(err), exit_code=1 if isinstance(err, UnsupportedModelError) else 2) from err
    translator = cli.load_ctranslate2(args.model_dir, output)  # check that it loads and runs on its own
    sample = translator.translate(["", "Hello."], beam_size=1)
    log.info(
        "exported %s (%s); reloaded, a test sentence gives %r", output, translator.compute_type, sample[1]
    )
    print(output)
    return 0


if __name__ == "__main__":
    cli.stop_on_sigterm()  # SIGTERM stops like SIGINT: exit 130, nothing half-written left
    cli.run_script(main)
