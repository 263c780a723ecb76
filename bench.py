"""Benchmarks: training and decoding speed, attention memory, input pipeline; one JSON object per line on stdout.

    python bench.py                         # everything (make bench); input_scale prepares 0.5M and 5M pairs
    python bench.py --quick                 # ~1-minute smoke on configs/tiny.yaml
    python bench.py --only train,input --precisions float32 --xla off
    make bench BENCH_ARGS="--only input_scale --input-scale-pairs 500000"
    python bench.py --only train --precisions mixed_bfloat16 --xla off --train-batch-tokens 1024,2048,4096

Records: first {"bench": "run"} (the command line, git commit, config and overrides, model settings, the vocabulary
(`tokenizer`: the sizes of the --tokenizer-dir or RUN_DIR tokenizer used; `data.vocab_size` is then its, not the
config's), options, versions and the machine: CPU model and ISA flags, cores, memory, `load_average_at_start`), then
{"bench": "train"} per precision x XLA (and per --train-batch-tokens x --train-bucket-steps value: the batch-shape
sweep) (our TrainStep vs a stock-Keras reference of the same size, tokens/s, ratio, MFU, the matmul-only lower bound
and overhead ratio; model settings the reference does not model are refused), {"bench": "train_ema"} (the cost of
`train.ema_decay` per step: our step with and without the EMA, the main job's precision), {"bench": "decode"} per
search x cache x XLA, {"bench": "decode_ensemble"} per search (the cost of `--ensemble`: the model twice over
against it alone), {"bench": "decode_sampling"} (top-k 10 against greedy search), then {"bench": "decode"} per
search in CTranslate2 (float32, int8, patiences) and TensorFlow int8, with BLEU, speed-ups and paired bootstraps,
and {"bench": "decode_targets"} (benchmarks/decode_engines.py), {"bench": "attention"} per variant x length (each in
a process of its own: peak memory of the first run), {"bench": "input"}, {"bench": "input_scale"} per synthetic
corpus size (preparation pairs/s, cache size, first batch cold/warm, peak RSS), {"bench": "refusal"} (train.py
refusing a run directory in use), and last {"bench": "timing"} (each benchmark's wall seconds; "complete": false
when stopped early). Logs go to stderr. Exit codes: 0 ok, 1 a benchmark failed (e.g. refusal: train.py exited
otherwise than refusing; one line on stderr), 2 bad arguments or config, 130 interrupted (Ctrl-C or SIGTERM: the
timing record says how far it got).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import nmt.xla  # noqa: E402, F401  (TF_XLA_FLAGS before TensorFlow reads them: train.xla fusible)
from nmt.cli import add_set_argument, decoding_kernels  # noqa: E402


def _list(kind):
    return lambda text: tuple(kind(item) for item in text.split(",") if item.strip())


def _switch(text: str) -> bool:
    if text.lower() not in ("on", "off", "true", "false"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return text.lower() in ("on", "true")


def _xla_setting(text: str) -> bool | str:
    """on/off, or fusible (the train rows' `train.xla: fusible`)."""
    if text.lower() == "fusible":
        return "fusible"
    try:
        return _switch(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected on, off or fusible, got {text!r}") from None


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run (tiny.yaml, float32, no XLA, few items)"
    )
    parser.add_argument(
        "--only",
        type=_list(str),
        help="comma-separated subset of train,train_ema,decode,attention,input,input_scale,refusal",
    )
    parser.add_argument("--config", help="YAML config (default base.yaml; tiny.yaml with --quick)")
    add_set_argument(parser)
    parser.add_argument("--run-dir", help="trained run for decode (and its tokenizer); default runs/base")
    parser.add_argument("--tokenizer-dir", help="tokenizer to use (default: RUN_DIR/tokenizer if compatible)")
    parser.add_argument("--precisions", type=_list(str), help="e.g. float32,mixed_bfloat16,mixed_float16")
    parser.add_argument(
        "--xla", type=_list(_xla_setting), help="e.g. off,on,fusible (fusible: train rows only)"
    )
    parser.add_argument("--train-batches", type=int, help="batches per timed training pass")
    parser.add_argument("--train-shapes", type=int, help="distinct batch shapes among them")
    parser.add_argument("--train-rounds", type=int, help="timed passes per model (median)")
    parser.add_argument("--ema-decay", type=float, help="train_ema: the decay whose cost is measured (0.998)")
    parser.add_argument(
        "--train-batch-tokens", type=_list(int), help="train rows per data.batch_tokens, e.g. 1024,2048,4096"
    )
    parser.add_argument(
        "--train-bucket-steps",
        type=_list(int),
        help="train rows per bucket step: edges n, 2n, ... (0 = automatic)",
    )
    parser.add_argument("--decode-all", type=int, help="test sentences for cached decoding (0 = all)")
    parser.add_argument("--decode-sentences", type=int, help="test sentences for no-cache decoding")
    parser.add_argument("--decode-xla", type=_list(_switch), help="XLA settings for decode (default: --xla)")
    parser.add_argument("--beams", type=_list(int), help="beam sizes, 1 = greedy (default 1,4)")
    parser.add_argument(
        "--decode-ensemble",
        type=int,
        help="members of the ensemble rows: the model repeated, against it alone (default 2; 0 = none)",
    )
    parser.add_argument(
        "--decode-engines",
        type=_list(str),
        help="decode rows beside TensorFlow float32: ctranslate2,tensorflow_int8 (default both; '' = none)",
    )
    parser.add_argument(
        "--ct2-patience", type=_list(float), help="CTranslate2 beam patiences (default 1,2,3)"
    )
    parser.add_argument(
        "--ct2-dir", help="CTranslate2 exports and hypotheses (default runs/bench-ctranslate2)"
    )
    parser.add_argument(
        "--input-scale-pairs", type=_list(int), help="input_scale corpus sizes (default 500000,5000000)"
    )
    parser.add_argument("--attention-lengths", type=_list(int), help="e.g. 256,512,1024,2048,4096,8192")
    parser.add_argument("--memory-budget-mb", type=float, help="skip full attention whose scores exceed this")
    parser.add_argument("--chunk-size", type=int, help="chunked attention block size")
    parser.add_argument("--window", type=int, help="local attention half width")
    return parser.parse_args(argv)


def options_from_args(args):
    from benchmarks.runner import BenchOptions

    names = ("config", "run_dir", "tokenizer_dir", "precisions", "xla", "train_batches", "train_shapes",
             "train_rounds", "ema_decay", "train_batch_tokens", "train_bucket_steps", "decode_all", "decode_sentences",
             "decode_xla", "decode_ensemble", "beams", "decode_engines", "ct2_patience", "ct2_dir", "attention_lengths",
             "memory_budget_mb", "chunk_size", "window", "input_scale_pairs", "only")  # fmt: skip
    changes = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    changes["overrides"] = args.overrides
    return BenchOptions.quick(**changes) if args.quick else BenchOptions(**changes)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    from benchmarks.runner import check_config, check_options
    from nmt.config import ConfigError, load_config

    options = options_from_args(args)
    try:
        check_options(options)
    except ValueError as err:
        print(f"bench.py: {err}", file=sys.stderr)
        return 2
    try:
        config = load_config(options.config, options.overrides)
    except ConfigError as err:
        print(f"bench.py: config error: {err}", file=sys.stderr)
        return 2
    try:
        check_config(options, config)
    except ValueError as err:
        print(f"bench.py: {err}", file=sys.stderr)
        return 2
    # the defaults fall back (no trained runs/base: an untrained model, a temporary tokenizer); a path given is used
    if args.run_dir is not None and not (Path(args.run_dir) / "config.yaml").is_file():
        print(f"bench.py: --run-dir {args.run_dir}: not a run directory (no config.yaml)", file=sys.stderr)
        return 2
    if args.tokenizer_dir is not None and not any(Path(args.tokenizer_dir).glob("*.model")):
        print(
            f"bench.py: --tokenizer-dir {args.tokenizer_dir}: no SentencePiece model there", file=sys.stderr
        )
        return 2
    # Without train rows, decode as evaluate.py and translate.py do (Eigen kernels, oneDNN on AMX); bf16 training needs
    # oneDNN.
    if not {"train", "train_ema"} & set(options.only):
        decoding_kernels()
    from benchmarks.common import JsonLines

    emit = JsonLines(sys.stdout)
    try:
        import tensorflow as tf

        # per-length retracing warnings of the attention benchmark are expected
        tf.get_logger().setLevel("ERROR")

        from benchmarks.runner import run_benchmarks

        run_benchmarks(
            options, emit=emit, config=config, argv=["bench.py", *(sys.argv[1:] if argv is None else argv)]
        )
    except KeyboardInterrupt:
        said = (
            "the timing record says how far it got"
            if emit.records and emit.records[-1].get("bench") == "timing"
            else "before the first record"
        )
        print(f"bench.py: interrupted; {said}", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    from nmt.cli import exit_now, stop_on_sigterm

    stop_on_sigterm()  # SIGTERM like Ctrl-C: temporary files removed, the closing record says "complete": false
    code = main()
    if code == 130:
        # as the other CLIs: not after TensorFlow's threads (a decode benchmark's still running)
        exit_now(130)
    sys.exit(code)
