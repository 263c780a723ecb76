"""Train every ablation variant with the real trainer for the same wall-clock budget, evaluate it, and compare.

For each variant (`benchmarks.variants`), in `ROOT/<variant>` (a normal, self-describing run directory):

1. the shared tokenizer (trained once into `ROOT/tokenizer`) is copied in, so every variant sees the same pieces;
2. `train.py --config CONFIG --set <user overrides> --set <variant overrides> --set <protocol>` runs as a
   subprocess (or `nmt.trainer.Trainer` in-process, for tests), the protocol being `PROTOCOL` below: the same seed,
   `train.max_minutes=BUDGET` of step time and no step limit, per-step TensorBoard scalars, final weights = the
   last weights;
3. the run is read back (`run_metrics`): steps, tokens/s, grad-norm fluctuation, the validation-loss curve;
4. greedy validation BLEU (`nmt.evaluation.evaluate`, as `evaluate.py --beam 1`) and the mean cross-attention
   entropy on a validation batch are measured with the final weights.

Then the mask-fill unit check runs (`benchmarks.mask_fill`) and `ablation_report` writes the markdown.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import keras
import yaml

from benchmarks.variants import BASELINE, DEFAULT_VARIANTS, QUICK_VARIANTS, Variant, resolve_overrides, select

log = logging.getLogger("benchmarks.ablate")

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass
class AblationOptions:
    config: str = "base.yaml"  # YAML config every variant starts from
    overrides: list[str] = dataclasses.field(default_factory=list)  # user --set, before the variant's
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    budget_minutes: float = 5.0  # train.max_minutes per variant (step time, excluding evaluation)
    max_steps: int = 0  # train.max_steps per variant as well (0 = the budget alone; tests bound steps)
    root: str = "runs/ablate"  # run directories ROOT/<variant>, shared tokenizer ROOT/tokenizer
    output: str = "ablations.md"
    eval_every: int = 200  # steps between validation-loss evaluations (the curve for "steps to loss")
    log_every: int = 1  # steps between TensorBoard scalars (1: the grad norm of every step)
    grad_steps: int = 100  # grad-norm fluctuation over steps 1..grad_steps
    bleu_sentences: int = 0  # validation sentences for greedy BLEU (0 = all)
    mask_steps: int = 10  # TrainStep updates per (fill, precision) in the mask-fill check (0 = skip it)
    mask_fills: tuple = ("auto", -1.0e3, -1.0e9, -1.0e20)  # fills of the mask-fill check
    launcher: str = "subprocess"  # "subprocess" (train.py) or "inprocess" (nmt.trainer.Trainer)
    reuse: bool = False  # keep variants that already have final weights (re-evaluate, re-report only)
    command: str = ""  # the command line, for the report

    @classmethod
    def quick(cls, **changes) -> AblationOptions:
        """CI smoke on configs/tiny.yaml: two variants of 40 steps each, its own root and report."""
        settings = dict(
            config="tiny.yaml",
            variants=QUICK_VARIANTS,
            budget_minutes=1.0,
            max_steps=40,  # the step cap ends these runs: tracing alone can take most of a seconds-long budget
            root="runs/ablate_quick",
            output="runs/ablate_quick/ablations.md",
            eval_every=20,
            grad_steps=20,
            bleu_sentences=50,
            mask_steps=2,
        )
        settings.update(changes)
        return cls(**settings)


def protocol_overrides(options: AblationOptions) -> list[str]:
    """The `--set` overrides that make the variants comparable (applied last)."""
    return [
        f"train.max_steps={options.max_steps}",
        f"train.max_minutes={float(options.budget_minutes)!r}",
        "train.average_last=0",
        "train.ema_decay=0.0",
        "train.early_stopping=0",
        "train.bleu_every=0",
        f"train.eval_every={options.eval_every}",
        f"train.log_every={options.log_every}",
    ]


def trained_with(run_dir: Path, wanted) -> bool:
    """Whether the run directory's config.yaml holds the settings `wanted` (where data is stored aside): a run made
    with other options (--set, --max-steps, --budget, the config) is not reported under these."""
    from nmt.config import absolute_paths, load_config

    try:  # train.py saves its config with absolute paths
        return load_config(run_dir / "config.yaml").fingerprint() == absolute_paths(wanted).fingerprint()
    except Exception:  # noqa: BLE001 - missing or unreadable: not the run asked for
        return False


def variant_overrides(options: AblationOptions, variant: Variant, config) -> list[str]:
    return [*options.overrides, *resolve_overrides(variant, config), *protocol_overrides(options)]


# ----------------------------------------------------------------------------------------------------------------
# Preparation


_TOKENIZER_STAMP = "data_config.yaml"


def shared_tokenizer(config, root: Path) -> Path:
    """ROOT/tokenizer, trained on the train split unless it was trained for the same data config.

    Only a tokenizer ablate.py made (its stamp ROOT/data_config.yaml next to it) is replaced: another one (e.g.
    --root at a trained run directory, whose weights need its tokenizer) is an AblationError."""
    from data.tokenizer_training import train_tokenizer

    directory = root / "tokenizer"
    stamp = root / _TOKENIZER_STAMP
    wanted = yaml.safe_dump(dataclasses.asdict(config.data), sort_keys=True)
    if directory.is_dir() and stamp.is_file() and stamp.read_text(encoding="utf-8") == wanted:
        log.info("reusing the tokenizer in %s", directory)
        return directory
    if (directory.exists() or directory.is_symlink()) and not stamp.is_file():
        raise AblationError(
            f"{directory} was not made by ablate.py (no {stamp.name} next to it) and is not replaced: "
            "give another --root"
        )
    if directory.is_dir() and not directory.is_symlink():
        shutil.rmtree(directory)
    else:
        directory.unlink(missing_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    # the stamp first (no data config matches it): a training stopped midway leaves a tokenizer/ known to be ours
    stamp.write_text("", encoding="utf-8")
    log.info("training the shared tokenizer into %s", directory)
    train_tokenizer(config.data, directory, seed=config.train.seed)
    stamp.write_text(wanted, encoding="utf-8")
    return directory


class AblationError(RuntimeError):
    """A variant's run directory cannot be used (not a run directory, or a training is running in it), or ROOT holds
    a tokenizer ablate.py did not make."""


def fresh_run_dir(path: Path, tokenizer_dir: Path) -> None:
    """Empties `path` (only if it is a run directory no training holds) and copies the shared tokenizer in."""
    from nmt.run_dir import RunDir, RunDirError, RunLock

    if path.exists():
        if not (path / "config.yaml").is_file() and any(path.iterdir()):
            raise AblationError(f"{path} exists and is not a run directory: move it away")
        try:  # another ablate.py (or a train.py) training there: not removed under it
            RunLock(RunDir(path)).acquire().release()
        except RunDirError as err:
            raise AblationError(f"{path}: {err}") from None
        log.info("removing the previous run %s", path)
        shutil.rmtree(path)
    path.mkdir(parents=True)
    shutil.copytree(tokenizer_dir, path / "tokenizer")


def resumable(run_dir: Path) -> bool:
    """A variant's run stopped before its end (a signal, a crash) with a checkpoint to resume from."""
    return (run_dir / "config.yaml").is_file() and any((run_dir / "checkpoints").glob("ckpt-*.index"))


# ----------------------------------------------------------------------------------------------------------------
# Training


def train_subprocess(config_path: Path, run_dir: Path, overrides: list[str], log_path: Path) -> int:
    """`train.py` in a child process (output appended to `log_path`: a resumed run's log follows the first part's);
    returns its exit code.

    The child has its own session: a Ctrl-C or SIGTERM meant for ablate.py reaches it once, from here (SIGTERM: it
    saves a checkpoint and stops), and this process waits for it before KeyboardInterrupt goes on; a second
    interruption kills it (its last checkpoint stays)."""
    command = [
        sys.executable,
        str(REPO_ROOT / "train.py"),
        "--config",
        str(config_path),
        "--model-dir",
        str(run_dir),
    ]
    for text in overrides:
        command += ["--set", text]
    log.info("running %s", " ".join(command))
    with open(log_path, "a", encoding="utf-8") as handle:
        child = subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            return child.wait()
        except KeyboardInterrupt:
            log.warning(
                "interrupted: stopping the training in %s after its step (a checkpoint is saved)", run_dir
            )
            child.send_signal(signal.SIGTERM)
            try:
                child.wait()
            except KeyboardInterrupt:
                child.kill()
                child.wait()
            raise


def train_inprocess(config_path: Path, run_dir: Path, overrides: list[str], log_path: Path) -> int:
    """`nmt.trainer.Trainer` in this process, as train.py drives it; returns 0, or 1 on a training error. The outcome
    is appended to `log_path`, as the subprocess launcher appends its output (a resumed run keeps the first line)."""
    from nmt.config import load_config
    from nmt.run_dir import RunDir, RunLock, write_atomic
    from nmt.trainer import Trainer, TrainingError
    from nmt.trainer_data import keep_train_split_record

    config = load_config(config_path, overrides)
    run = RunDir(run_dir)
    try:
        with RunLock(run):
            write_atomic(run.config_path, config.to_yaml())
            trainer = Trainer(config, run)
            trainer.setup()
            # what it trains on, as train.py keeps it (a resume on a changed corpus warns)
            keep_train_split_record(run, trainer.train_record, resumed=bool(trainer.resumed_from))
            result = trainer.train()
        _append(log_path, f"{result.status}: {result.message}\n")
        return 0
    except TrainingError as err:
        _append(log_path, f"training failed: {err}\n")
        return 1
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(text)


LAUNCHERS = {"subprocess": train_subprocess, "inprocess": train_inprocess}


# ----------------------------------------------------------------------------------------------------------------
# Evaluation


def evaluate_variant(run_dir: Path, *, bleu_sentences: int, grad_steps: int) -> dict:
    """Run metrics, greedy validation BLEU and cross-attention entropy of a trained run directory."""
    from benchmarks.attention_entropy import cross_attention_entropy
    from benchmarks.run_metrics import summarize_run
    from data.corpus import load_text_pairs
    from data.pipeline import make_eval_dataset
    from nmt.evaluation import evaluate
    from nmt.translator import Translator

    result = summarize_run(run_dir, grad_steps=grad_steps)
    final = [r for r in result["records"] if r.get("tag") == "final"]
    result["val_loss"] = final[-1]["loss"] if final else (result["curve"][-1][1] if result["curve"] else None)
    keras.mixed_precision.set_global_policy("float32")
    translator = Translator.from_run_dir(run_dir)
    config = translator.config
    sources, references = load_text_pairs(config.data, config.data.validation_split, every_line=True)
    if bleu_sentences:
        sources, references = sources[:bleu_sentences], references[:bleu_sentences]
    _, record = evaluate(
        translator,
        sources,
        references,
        beam_size=1,
        target_language=config.data.target,
        lowercase=config.data.lowercase,
    )
    result.update(bleu=record["bleu"], chrf=record["chrf"], bleu_sentences=len(sources))
    result["bleu_signature"] = record["signature"]
    batch = next(iter(make_eval_dataset(config.data, translator.tokenizer, config.data.validation_split)))
    result["entropy"] = cross_attention_entropy(translator.model, batch)
    result["model"] = translator.model
    return result


# ----------------------------------------------------------------------------------------------------------------


def run_ablation(options: AblationOptions) -> tuple[Path, list[str]]:
    """Trains, evaluates and reports every variant of `options`.

    Returns (the markdown written, names of the variants without a result: no weights, or evaluation failed). A
    training that stopped early with weights (e.g. too many non-finite steps) is a result; the report shows its
    exit code.
    """
    from benchmarks.ablation_report import write_report
    from nmt.config import load_config, resolve_config_path

    variants = select(options.variants)
    config_path = resolve_config_path(options.config).resolve()
    config = load_config(config_path, options.overrides)
    root = Path(options.root)
    tokenizer_dir = shared_tokenizer(config, root)
    launcher = LAUNCHERS[options.launcher]
    results: dict[str, dict] = {}
    for variant in variants:
        run_dir = root / variant.name
        overrides = variant_overrides(options, variant, config)
        wanted = load_config(config_path, overrides)  # a bad override fails here, before anything is removed
        entry = {"variant": variant, "overrides": resolve_overrides(variant, config), "run_dir": str(run_dir)}
        same = options.reuse and trained_with(run_dir, wanted)
        if options.reuse and not same and ((run_dir / "final").is_dir() or resumable(run_dir)):
            log.warning("%s: %s was trained with other settings: training it anew", variant.name, run_dir)
        if same and (run_dir / "final").is_dir():
            log.info("%s: reusing %s", variant.name, run_dir)
            entry["exit_code"], entry["wall_minutes"] = 0, None
        else:
            if same and resumable(run_dir):  # stopped before its end: train.py resumes it
                log.info("%s: resuming the interrupted run in %s", variant.name, run_dir)
            else:
                fresh_run_dir(run_dir, tokenizer_dir)
                (root / f"{variant.name}.train.log").unlink(missing_ok=True)  # the log of the removed run
            log.info("%s: training for %.2f minutes", variant.name, options.budget_minutes)
            start = time.perf_counter()
            entry["exit_code"] = launcher(config_path, run_dir, overrides, root / f"{variant.name}.train.log")
            entry["wall_minutes"] = (time.perf_counter() - start) / 60.0
        if (run_dir / "final").is_dir() or (run_dir / "checkpoints").is_dir():
            try:
                entry.update(evaluate_variant(run_dir, bleu_sentences=options.bleu_sentences,
                                              grad_steps=options.grad_steps))  # fmt: skip
            except Exception as err:  # noqa: BLE001 - one broken variant must not lose the others' results
                log.exception("%s: evaluation failed", variant.name)
                entry["error"] = f"{type(err).__name__}: {err}"
        else:
            entry["error"] = (
                f"no weights (exit code {entry['exit_code']}, see {root / (variant.name + '.train.log')})"
            )
        if variant.name != BASELINE:
            entry.pop("model", None)  # only the baseline's weights are used later (mask-fill activations)
        results[variant.name] = entry
        log.info(
            "%s: %s", variant.name, {k: v for k, v in entry.items() if k in ("steps", "val_loss", "bleu")}
        )
    mask = None
    if options.mask_steps > 0:
        from benchmarks.mask_fill import measure_mask_fill
        from data.tokenizer import Tokenizer

        log.info("mask-fill unit check (%d steps per setting)", options.mask_steps)
        baseline_model = results.get(BASELINE, {}).get("model")
        tokenizer = Tokenizer.load(tokenizer_dir)
        mask = measure_mask_fill(
            config, tokenizer, model=baseline_model, steps=options.mask_steps, fills=options.mask_fills
        )
    output = Path(options.output)
    write_report(output, options=options, config=config, results=results, mask=mask)
    failed = [name for name, entry in results.items() if entry.get("error")]  # no result at all
    return output, failed
