"""Fine-tuning (`train.init_from`): a new run that starts from another run's weights, with that run's tokenizer.

What the weights mean must be the parent's: the model's architecture (`ARCHITECTURE_KEYS`) and the tokenizer's
settings (`TOKENIZER_KEYS`) are checked against the parent's config.yaml before anything is written or trained,
each difference named. Everything else may change: the corpus (`data.dataset`, `data.folder`, ...), dropout, the
schedule, the budget. The new run copies the parent's tokenizer into its own directory (so it stays
self-describing), tokenizes its corpus with it, and loads the parent's weights (final/, else best/, else its
latest checkpoint). The optimizer, its step count, the schedule and the plan start afresh, as fairseq's
`--finetune-from-model` or OpenNMT-tf's `--checkpoint_path` on a new run do. Only a new run starts from the parent:
a resumed one restores its own checkpoint and no longer needs the parent.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from pathlib import Path

from common.config_tree import ConfigError
from nmt.checkpoints import checkpoint_to_resume
from nmt.run_dir import RunDir, RunDirError

log = logging.getLogger(__name__)

# What gives the weights their shapes and their meaning (attention variants, max_length and dropout do not).
ARCHITECTURE_KEYS = ("d_model", "num_heads", "d_ff", "num_layers", "norm", "residual", "share_embeddings",
                     "tie_output", "share_qkv", "scale")  # fmt: skip
# The parent's tokenizer is used (its source model reads the source language): the config must say what it is
TOKENIZER_KEYS = ("source", "target", "tokenizer", "vocab_size", "joint_vocab", "lowercase")


def parent_run(config, run_dir: RunDir | None = None) -> tuple[RunDir, object] | None:
    """(the run `train.init_from` names, its config), checked against `config`; None without `init_from`.

    Raises ConfigError naming the problem: the new run's own directory (`run_dir`), a file, not a run directory, no
    tokenizer or no trained weights there, or a model/tokenizer setting that differs from the parent's (every
    difference, with both values).
    """
    path = config.train.init_from
    if not path:
        return None
    parent = RunDir(Path(path).expanduser())
    if run_dir is not None and parent.path.resolve() == run_dir.path.resolve():
        raise ConfigError(
            f"train.init_from names this run's own directory ({path}): give the run to start from, and another "
            "--model-dir for the new run"
        )
    if parent.path.is_file():
        raise ConfigError(
            f"train.init_from: {path} is a file; give the run directory train.py wrote (it holds config.yaml, "
            "tokenizer/ and final/)"
        )
    try:
        parent.require()  # a directory with config.yaml and a tokenizer
        parent_config = parent.load_config()
        parent.weights_prefix("auto")  # final/, best/ or a checkpoint
    except RunDirError as err:
        raise ConfigError(f"train.init_from: {err}") from None
    differences = [
        f"{section}.{key}: {getattr(getattr(config, section), key)!r} here, "
        f"{getattr(getattr(parent_config, section), key)!r} in {path}"
        for section, keys in (("model", ARCHITECTURE_KEYS), ("data", TOKENIZER_KEYS))
        for key in keys
        if getattr(getattr(config, section), key) != getattr(getattr(parent_config, section), key)
    ]
    if differences:
        raise ConfigError(
            f"train.init_from: this config's model or tokenizer differs from {path}'s ({'; '.join(differences)}); "
            f"set them as {parent.config_path} has them"
        )
    return parent, parent_config


def starts_from_parent(config, run_dir: RunDir) -> bool:
    """Whether this start takes the parent's tokenizer and weights: `train.init_from` is set and the run has no
    checkpoint to resume from (a new run, or one stopped before its first checkpoint: it starts again)."""
    return bool(config.train.init_from) and not checkpoint_to_resume(run_dir.checkpoint_dir)


def run_tokenizer(config, run_dir: RunDir, *, chief: bool = True):
    """The run's tokenizer. A start from a parent (`starts_from_parent`) takes the parent's: the chief copies it
    into the run directory (atomically, replacing whatever is there), other workers read the parent's. Otherwise
    `data.prepare.run_tokenizer`: the run directory's own copy, or the data cache's (trained there if missing)."""
    from data import prepare
    from data.tokenizer import Tokenizer

    directory = run_dir.tokenizer_dir
    if not starts_from_parent(config, run_dir):
        return prepare.run_tokenizer(config.data, directory, chief=chief)
    parent, _ = parent_run(config, run_dir)  # ConfigError: not a run, another model or another tokenizer
    if not chief:
        return Tokenizer.load(parent.tokenizer_dir)
    partial, old = (directory.with_name(f"{directory.name}.{suffix}") for suffix in ("partial", "old"))
    for leftover in (partial, old):
        shutil.rmtree(leftover, ignore_errors=True)
    shutil.copytree(parent.tokenizer_dir, partial)
    if directory.exists():
        log.warning("replacing the tokenizer in %s with %s's", directory, parent.path)
        os.replace(directory, old)
    os.replace(partial, directory)
    shutil.rmtree(old, ignore_errors=True)
    return Tokenizer.load(directory)


def keep_parent_of_resumed_run(saved, config):
    """`config` with `train.init_from` of the run it resumes (`saved`, its config.yaml): a run started from one
    parent never takes another's tokenizer or weights, and its config.yaml keeps saying where it started."""
    if config.train.init_from == saved.train.init_from:
        return config
    log.warning(
        "train.init_from %s is ignored: this run resumes its own (started from %s)",
        config.train.init_from, saved.train.init_from or "scratch",
    )  # fmt: skip
    return dataclasses.replace(
        config, train=dataclasses.replace(config.train, init_from=saved.train.init_from)
    )


def load_parent_weights(model, parent: RunDir, parent_config) -> str:
    """Sets the (built) model's weights to the parent's (final/, best/ or latest); returns what was loaded."""
    from nmt.final_weights import load_run_weights

    loaded = load_run_weights(model, parent, "auto", parent_config.train)
    log.info(
        "initialised the weights from %s (%s); the optimizer, its step count and the schedule start afresh",
        parent.path, loaded,
    )  # fmt: skip
    return loaded
