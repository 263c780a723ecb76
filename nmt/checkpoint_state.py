"""A checkpoint folder's state file (`checkpoint`, TensorFlow's) read safely: the step saved last, without
TensorFlow (`saved_step`), and the latest checkpoint's prefix, None for a state file TensorFlow raises on
(`latest_checkpoint`). `nmt.run_dir` re-exports both (callers import them from there).
"""

from __future__ import annotations

import re
from pathlib import Path


def saved_step(directory: Path) -> int | None:
    """The step of the latest checkpoint (ckpt-STEP) in `directory`, read without TensorFlow: the one its state file
    names when it is there, else the newest on disk (as `nmt.checkpoints.repair_checkpoint_state` names it), else
    the one the state file names; None without any."""
    try:
        state = (directory / "checkpoint").read_text(encoding="utf-8", errors="replace")
    except OSError:
        state = ""
    named = re.search(r'^model_checkpoint_path:\s*"(?:.*/)?ckpt-(\d+)"', state, re.MULTILINE)
    if named and (directory / f"ckpt-{named[1]}.index").is_file():
        return int(named[1])
    on_disk = [
        int(found[1])
        for index in directory.glob("ckpt-*.index")
        if (found := re.fullmatch(r"ckpt-(\d+)\.index", index.name))
    ]
    return max(on_disk) if on_disk else int(named[1]) if named else None


def latest_checkpoint(directory: str | Path) -> str | None:
    """`tf.train.latest_checkpoint`, None also for a state file TensorFlow raises on: binary bytes, or text that
    parses but names no checkpoint (an empty file, an empty `model_checkpoint_path`). The callers name the damage
    or repair it (`nmt.checkpoints.repair_checkpoint_state`)."""
    import tensorflow as tf

    try:
        return tf.train.latest_checkpoint(str(directory))
    except (UnicodeDecodeError, ValueError):
        return None
