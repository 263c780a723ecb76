"""A training's start on its run directory, for train.py: what is refused before any work (a run whose model or data
config, or EMA, would not fit its checkpoints; weights without their config.yaml; trained weights whose checkpoints
are gone), and undoing a new run whose start failed (what it wrote into DIR removed, DIR too if it made it)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from nmt.checkpoint_state import saved_step
from nmt.config import LOCATION_KEYS, absolute_paths
from nmt.run_dir import RunDir, RunDirError


def check_resume_compatible(run_dir: RunDir, config) -> bool:
    """True when DIR already holds a run; raises RunDirError if its model/data config differs from this one."""
    if problem := run_dir.config_problem():
        raise RunDirError(problem)
    if not run_dir.exists():
        if made := run_dir.run_files():
            raise RunDirError(
                f"{run_dir.path} holds a run's {', '.join(made[:-1])}{' and ' if made[1:] else ''}{made[-1]} but no "
                f"{run_dir.config_path.name} (the settings they were made with): put it back, or use another "
                "--model-dir"
            )
        if any(
            run_dir.tokenizer_dir.glob("*.model")
        ):  # a seed (ablate.py's): only the one this config trains
            from data.tokenizer_seed import seed_problem

            if problem := seed_problem(config.data, run_dir.tokenizer_dir):
                raise RunDirError(
                    f"{run_dir.tokenizer_dir} is not the tokenizer this config trains ({problem}): a new run there "
                    "would use it as it is; remove it, or use another --model-dir"
                )
        return False
    # a run saved before its paths were made absolute: read as meant from here
    saved = absolute_paths(run_dir.load_config())
    for section in ("data", "model"):
        old, new = getattr(saved, section).__dict__, getattr(config, section).__dict__
        changed = [
            f"{section}.{key}: {old[key]!r} -> {new[key]!r}"
            for key in old
            if old[key] != new[key] and (section, key) not in LOCATION_KEYS
        ]
        if changed:
            raise RunDirError(
                f"{run_dir.path} was trained with a different {section} config ({'; '.join(changed)}); "
                "use another --model-dir or the original config"
            )
    if (saved.train.ema_decay > 0) != (
        config.train.ema_decay > 0
    ):  # Adam's variables: with the EMA or without
        raise RunDirError(
            f"{run_dir.path} was trained {'with' if saved.train.ema_decay > 0 else 'without'} an EMA of the weights "
            f"(train.ema_decay {saved.train.ema_decay} -> {config.train.ema_decay}): it cannot be turned on or off "
            "on resume (its checkpoints hold the optimizer's state as it was); keep it "
            f"{'above 0' if saved.train.ema_decay > 0 else 'at 0'}, or use another --model-dir"
        )
    return True


def checkpoints_gone(run_dir: RunDir) -> str:
    """What to say when DIR's training checkpoints are gone but it holds what training made of them (deleted to save
    space, or lost): final/ with its trained weights, or results past the first checkpoint (`metrics.jsonl` records,
    best/'s weights, at a step after `train.checkpoint_every`: a checkpoint was saved before them). Training from
    step 0 would replace them and drop every record. "" otherwise (a process that never reached its first checkpoint
    is run again from step 0, what it wrote removed)."""
    if saved_checkpoints(run_dir):
        return ""
    if saved_checkpoints(run_dir, run_dir.final_dir):
        start, kept = f"{run_dir.path} holds trained weights in {run_dir.final_dir.name}/ but", "final/"
    else:
        best = saved_step(run_dir.best_dir)
        steps = [r["step"] for r in run_dir.read_metrics() if isinstance(r.get("step"), int)]
        last = max([*steps, best or 0])
        if last <= run_dir.load_config().train.checkpoint_every:
            return ""
        kept = "best/" if best is not None else ""
        start = (
            f"{run_dir.path} holds results up to step {last} (metrics.jsonl{', ' + kept if kept else ''}) but"
        )
    return (
        f"{start} no training checkpoint in {run_dir.checkpoint_dir.name}/: it cannot train on, and training again "
        "from step 0 would replace them (put the checkpoints back, or use another --model-dir"
        + (f"; evaluate.py, translate.py and export.py still use {kept}" if kept else "")
        + ")"
    )


def more_training(saved, wanted) -> bool:
    """Whether the train section `wanted` asks a run trained with `saved` for more than it had: a larger (or no)
    step limit or time budget."""
    return any(
        (new == 0 and old > 0) or (new > old > 0)
        for old, new in ((saved.max_steps, wanted.max_steps), (saved.max_minutes, wanted.max_minutes))
    )


def why_unusable(path: Path, err: OSError) -> str:
    """What is wrong with a run directory that cannot be created or locked, in words."""
    if path.exists() and not path.is_dir():
        return "it is a file, not a directory (give a directory: train.py creates it)"
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            return f"{parent} is a file, not a directory"
    if err.strerror and err.filename:
        return f"{err.strerror}: {err.filename}"
    # a failed write or lock carries no file name: the lock file's (a full disk)
    return f"{err.strerror} (its lock file)" if err.strerror else str(err)


def saved_checkpoints(run_dir: RunDir, directory: Path | None = None) -> list[Path]:
    """The checkpoints in DIR's `directory` (default: the training checkpoints), their index files, whatever the
    state file `checkpoint` says."""
    return sorted((directory or run_dir.checkpoint_dir).glob("ckpt-*.index"))


def existing_entries(run_dir: RunDir) -> set[str] | None:
    """The names in DIR before a new run starts (None: DIR does not exist yet)."""
    if not run_dir.path.is_dir():
        return None if not run_dir.path.exists() else set()
    return {entry.name for entry in run_dir.path.iterdir()}


def missing_parents(run_dir: RunDir) -> list[Path]:
    """DIR's parent folders that do not exist yet (the lock's mkdir makes them), deepest first."""
    missing, parent = [], run_dir.path.absolute().parent
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    return missing


def discard(run_dir: RunDir, before: set[str] | None, made_parents: list[Path] = ()) -> None:
    """Undoes a new run whose start failed: removes what it wrote into DIR (config.yaml, tokenizer/, ...), and DIR
    itself if it made it (`before` None), with the parent folders it made (`made_parents`, if still empty), so that
    the corrected command starts afresh there (not refused as another run's directory, nor handed the failed start's
    tokenizer). What was in DIR before is kept. The lock file goes too: the lock itself is held until the process
    releases it."""
    import shutil

    if not run_dir.path.is_dir():
        return
    for entry in run_dir.path.iterdir():
        if before is None or entry.name not in before:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    if before is None:
        with contextlib.suppress(OSError):
            run_dir.path.rmdir()
            for parent in made_parents:
                parent.rmdir()  # fails (and stops) at one that is not empty
