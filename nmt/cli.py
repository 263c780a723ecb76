"""Shared plumbing for the entry points: quiet TensorFlow, logging to stderr, errors -> one message + exit code.

Exit codes: 0 success, 1 a runtime problem (run directory, weights, I/O), 2 a usage problem (bad arguments,
missing input file, invalid config), 130 interrupted. Nothing here imports TensorFlow, so `--help` and argument
errors stay instant.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import sys
from collections.abc import Callable

from common.config_tree import add_set_argument  # noqa: F401  (the entry points import it from here)
from common.cpu import has_amx

log = logging.getLogger("nmt")


class CliError(Exception):
    """An error to report as one line on stderr, with the given exit code."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def quiet_tensorflow() -> None:
    """Silences TensorFlow's C++ and Python chatter; call before TensorFlow is imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")


# Decoding on CPUs without AMX: TensorFlow's own (Eigen) kernels, not oneDNN's, unless TF_ENABLE_ONEDNN_OPTS says
# otherwise. The decoder's shapes change at every step (the self-attention cache grows by one position, finished
# sentences leave the batch), and oneDNN sets up its kernels per shape. Measured on a 2 vCPU AMD EPYC Zen 4
# (AVX-512, AVX512-BF16), Multi30k test2016, runs/base, one thread, interleaved processes: a whole greedy
# evaluate-style run 6.9 -> 6.5 s, beam 4 26.2-28.0 -> 24.1-25.0 s, byte-identical translations. On a 2 vCPU AMX
# Xeon oneDNN won instead: evaluate.py on test2016, 2 rounds, 107.2 / 108.3 -> 124.2 / 121.6 sentences/s with beam
# 4, 280 / 286 -> 313 / 314 greedy, byte-identical (2026-12-02). Training keeps oneDNN (its bfloat16 matmuls need it).
def decoding_onednn(flags: set[str] | None = None) -> str:
    """The decoding CLIs' TF_ENABLE_ONEDNN_OPTS: "1" on a CPU with AMX, else "0" (Eigen)."""
    return "1" if has_amx(flags) else "0"


def decoding_kernels() -> None:
    """Decoding CLIs: the CPU kernels of `decoding_onednn` (oneDNN on AMX, Eigen elsewhere); call before TensorFlow
    is imported.

    Once TensorFlow is imported (a CLI's `main` called in-process, as tests do) the setting could no longer change
    this process, only leak into the processes it starts: then nothing is set.
    """
    if "tensorflow" not in sys.modules:
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", decoding_onednn())


def onednn_enabled() -> bool | None:
    """Whether this process's TensorFlow runs oneDNN kernels (None if TensorFlow no longer says)."""
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:  # a private module: gone in some future TensorFlow
        return None
    return bool(_pywrap_util_port.IsMklEnabled())


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(levelname)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    for noisy in ("tensorflow", "absl", "h5py"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


def run(main: Callable[[], int | None]) -> None:
    """Runs `main()` and exits: known errors become one `error: ...` line on stderr and a non-zero code."""
    from data.errors import DataError, raised_in_pipeline
    from nmt.config import ConfigError
    from nmt.run_dir import RunDirError

    try:
        code = main() or 0
    except CliError as err:
        print(f"error: {err}", file=sys.stderr)
        code = err.exit_code
    except ConfigError as err:
        print(f"error: invalid config: {err}", file=sys.stderr)
        code = 2
    except RunDirError as err:
        print(f"error: {err}", file=sys.stderr)
        code = 1
    except BrokenPipeError:
        # The reader went away (`... | head`): stop quietly, with the code of a filter killed by SIGPIPE (128 + 13),
        # not 1 (a run-directory or model problem).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 128 + signal.SIGPIPE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    except OSError as err:
        print(f"error: {err}", file=sys.stderr)
        code = 1
    except DataError as err:  # a corpus or tokenizer problem, with a message saying what to do
        print(f"error: {err}", file=sys.stderr)
        code = 1
    except Exception as err:  # a DataError raised inside a tf.data function arrives as TensorFlow's OpError
        if (message := raised_in_pipeline(err)) is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        code = 1
    sys.exit(code)


def exit_now(code: int) -> None:
    """Ends the process with `code` once its work is done: the exit handlers run (logging's flush among them), then
    `os._exit` skips the interpreter's teardown, whose wait for TensorFlow's threads is not the user's: a training
    iterator's destructor waited up to 42 s after train.py's last line (docs/make-test-2026-12-07-avx2/), decoding
    threads still inside TensorFlow after a Ctrl-C kept evaluate.py 5-25 s after "interrupted" and once crashed it
    (SIGSEGV), and the threads of an aborted collective can abort the exit ("terminate called ...")."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            pass
    os._exit(code)


def run_script(main: Callable[[], int | None]) -> None:
    """`run` for a script's `__main__`: an interrupted run (exit 130, its output already removed or kept for a
    resume) ends with `exit_now`, not after its decoding threads."""
    try:
        run(main)
    except SystemExit as done:
        if done.code == 130:
            exit_now(130)
        raise


def stop_on_sigterm():
    """SIGTERM as SIGINT: a KeyboardInterrupt, so the CLI stops cleanly (temporary output removed, exit 130).

    Returns the previous handler (to put back with `signal.signal`)."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, interrupt)


def add_xla_argument(parser, chunks: bool = True) -> None:
    """`--xla [auto|on|off]` for decoding (bare `--xla` = on); `xla_setting(args.xla)` gives Translator's value.
    `chunks`: the command reads a pipe in --chunk-size chunks (its help says auto counts each chunk's lines)."""
    counted = (
        "lines of an input file, or of each --chunk-size chunk of a pipe" if chunks else "sentences in all"
    )
    parser.add_argument(
        "--xla",
        nargs="?",
        const="on",
        default="auto",
        choices=["auto", "on", "off"],
        help="decode with XLA: auto (default: on for GPUs; on CPUs for greedy search of many lines, where it "
        f"was measured to pay: 16,000 {counted}), on or off; the translations are the same",
    )


def add_streams_argument(parser, engines: bool = True) -> None:
    """`--streams N`: decoding batches in flight at once (`Translator(streams=...)`); None keeps eval.streams.
    `engines`: the command has `--engine` (its help says what N means for CTranslate2)."""
    parser.add_argument(
        "--streams",
        type=int,
        default=None,
        help="decoding batches in flight at once, one thread each (default: the run's eval.streams; 0 = auto: "
        "2 on a CPU with 2+ cores, 1 on a GPU); the translations are the same"
        + (
            ". With --engine ctranslate2: its inter_threads, the CPUs shared among them (intra_threads)"
            if engines
            else ""
        ),
    )


def check_search(beam: int | None, alpha: float | None) -> None:
    """--beam and --alpha, checked like eval.beam_size and eval.alpha (None: not given)."""
    from nmt.config import search_setting_problem

    if problem := search_setting_problem(beam, alpha):
        raise CliError("--" + problem.replace("beam_size", "beam"), exit_code=2)
    if beam == 1 and alpha is not None:  # greedy search: one hypothesis per line, nothing to rank by length
        raise CliError(
            "--alpha is the beam search's length penalty: nothing to do with --beam 1", exit_code=2
        )


# --alpha for a run whose eval.beam_size is 1, --beam not given (refused once the run's config is read)
GREEDY_RUN_ALPHA = (
    "--alpha is the beam search's length penalty: nothing to do with greedy search (the run's eval.beam_size is 1: "
    "give --beam N)"
)


def truncation_message(length: int | None, keep: int, done: str = "translated") -> str:
    """The warning for a source line cut to `keep` pieces; `length` None: a very long line, not counted
    (`nmt.batch_decoding.source_ids`)."""
    what = f"more than {keep} subwords (a very long line)" if length is None else f"{length} subwords"
    return f"{what}, longer than the model allows: {done} only the first {keep}"


def check_streams(streams: int | None) -> None:
    if streams is not None and streams < 0:
        raise CliError(f"--streams must be >= 0 (0 = auto), got {streams}", exit_code=2)


def xla_setting(value: str) -> bool | str:
    return {"on": True, "off": False}.get(value, "auto")


def add_weights_argument(parser) -> None:
    """`--weights`: which weights of the run directory (`nmt.final_weights.load_run_weights`)."""
    from nmt.run_dir import WEIGHTS

    parser.add_argument(
        "--weights",
        default="auto",
        choices=WEIGHTS,
        help="final, best (validation BLEU) or latest checkpoint; auto (default): the first of those that exists; "
        "average or ema: the two candidates for final/, made again from the run's checkpoints (the mean of the "
        "averaging window's snapshots; the EMA of train.ema_decay), to evaluate each whichever final/ kept",
    )


def add_ensemble_argument(parser) -> None:
    """`--ensemble DIR [DIR ...]`: more run directories decoding with --model-dir's (`check_ensemble`)."""
    parser.add_argument(
        "--ensemble",
        nargs="+",
        default=[],
        metavar="DIR",
        help="more run directories whose models decode together with --model-dir's: the mean of their "
        "probabilities at every step (the same --weights of each); every run must have --model-dir's tokenizer; "
        "eval settings come from --model-dir",
    )


def check_ensemble(args) -> None:
    """Usage errors (exit 2) of `--ensemble`, and its run directories checked, before TensorFlow."""
    if not args.ensemble:
        return
    if args.engine != "tensorflow":
        raise CliError(
            "--ensemble needs --engine tensorflow (a CTranslate2 export holds one model)", exit_code=2
        )
    if getattr(args, "plot_attention", None):
        raise CliError("--plot-attention shows one model's attention: not with --ensemble", exit_code=2)
    from nmt.cli_files import check_model_dir
    from nmt.run_dir import ensemble_direction_error

    model_dir = check_model_dir(args.model_dir)
    tokenizer, data = _tokenizer_files(model_dir), model_dir.load_config().data
    seen = [model_dir.path.resolve()]
    for path in args.ensemble:
        run_dir = check_model_dir(path)
        seen.append(run_dir.path.resolve())
        error = ensemble_direction_error(
            f"--ensemble {path}", run_dir.load_config().data, "--model-dir", data
        )
        if error:
            raise CliError(error, exit_code=2)
        if _tokenizer_files(run_dir) != tokenizer:
            raise CliError(
                f"--ensemble {path} has another tokenizer than --model-dir {args.model_dir}: the runs of an ensemble "
                "share one (train them with the same data settings, or fine-tune one with train.init_from)",
                exit_code=2,
            )
    for path, count in collections.Counter(seen).items():
        if count > 1 and len(set(seen)) == 1:
            log.warning("%s is in the ensemble %d times: the same model decodes as once, at %d times the cost", path,
                        count, count)  # fmt: skip
        elif count > 1:
            log.warning("%s is in the ensemble %d times: it counts %d times in the mean of the members' "
                        "probabilities", path, count, count)  # fmt: skip


def _tokenizer_files(run_dir) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in run_dir.tokenizer_dir.glob("*.model")}


def add_engine_arguments(parser) -> None:
    """`--engine tensorflow|ctranslate2` and `--engine-dir DIR` (a CTranslate2 export); see `check_engine`."""
    parser.add_argument(
        "--engine",
        default="tensorflow",
        choices=["tensorflow", "ctranslate2"],
        help="decoder: tensorflow (default: the run directory's weights) or ctranslate2 (an export made by "
        "export.py --format ctranslate2, given by --engine-dir; tokenizer and eval settings still come from "
        "--model-dir; --xla does not apply, and --weights is refused: the export holds the weights it was made "
        "from, chosen by export.py --weights)",
    )
    parser.add_argument("--engine-dir", help="the CTranslate2 export to decode with (--engine ctranslate2)")


def check_engine(args) -> None:
    """Usage errors (exit 2) for the engine arguments, and a missing ctranslate2 package (exit 1), before TF."""
    if args.engine != "ctranslate2":
        if args.engine_dir is not None:
            raise CliError("--engine-dir goes with --engine ctranslate2", exit_code=2)
        return
    if getattr(args, "weights", "auto") != "auto":
        raise CliError(
            f"--weights {args.weights} goes with --engine tensorflow: a CTranslate2 export holds the weights it "
            "was made from (choose them with export.py --weights)",
            exit_code=2,
        )
    if args.engine_dir is None:
        raise CliError(
            "--engine ctranslate2 needs --engine-dir DIR (made by export.py --format ctranslate2)", 2
        )
    ignored = [name for name, given in (("--xla", getattr(args, "xla", "auto") != "auto"),
               ("--no-cache", getattr(args, "no_cache", False))) if given]  # fmt: skip
    if ignored:
        verb = "goes" if len(ignored) == 1 else "go"
        raise CliError(f"{' and '.join(ignored)} {verb} with --engine tensorflow", exit_code=2)
    from nmt.ctranslate2_export import ExportError, read_export_metadata

    try:
        read_export_metadata(args.engine_dir)
    except ExportError as err:
        raise CliError(str(err), exit_code=2) from err
    require_ctranslate2("--engine ctranslate2")


def require_ctranslate2(what: str) -> None:
    """Exit 1 with the pip command if the optional ctranslate2 package is missing (found without importing it)."""
    import importlib.util

    from nmt.ctranslate2_export import CTRANSLATE2_PIN

    if importlib.util.find_spec("ctranslate2") is None:
        raise CliError(
            f"{what} needs the ctranslate2 package, which is not installed: pip install {CTRANSLATE2_PIN}"
        )


def load_ctranslate2(model_dir: str, engine_dir: str, **kwargs):
    """`CTranslate2Translator.from_run_dir`, its problems as CliErrors (not an export of this run: 2, corrupt: 1)."""
    from nmt.ctranslate2_engine import CTranslate2Translator, EngineError, ExportError

    try:
        return CTranslate2Translator.from_run_dir(model_dir, engine_dir, **kwargs)
    except ExportError as err:
        raise CliError(str(err), exit_code=2) from err
    except EngineError as err:
        raise CliError(str(err)) from err


class LineWarnings:
    """Per-line warnings on stderr, at most `limit` of each kind, then a summary of what was not shown."""

    def __init__(self, limit: int = 20, source: str = "input"):
        self.limit = limit
        self.source = source
        self.counts: dict[str, int] = {}

    def __call__(self, line_number: int, kind: str, message: str, source: str | None = None) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if self.counts[kind] <= self.limit:
            log.warning("%s line %d: %s", source or self.source, line_number, message)
        elif self.counts[kind] == self.limit + 1:
            log.warning("further %r warnings are not shown (see the summary at the end)", kind)

    def summary(self) -> None:
        for kind, count in self.counts.items():
            if count > self.limit:
                log.warning("%d lines in all had %r warnings", count, kind)
