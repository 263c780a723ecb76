"""The model(s) of run directories, ready to decode: one run's, or an ensemble of several runs' (`--ensemble`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)


def load_run_models(path: str | Path, weights: str = "auto", ensemble: Sequence[str | Path] = ()):
    """(config, tokenizer, model, weights loaded) of the run directory `path`; with `ensemble`, the model is a
    `transformer.ensemble.Ensemble` of `path`'s and each listed run's (the same `weights` of each), and the weights
    loaded are listed joined by " + ". Config and tokenizer are `path`'s.

    Raises RunDirError: a run directory missing, mismatched or corrupt; an ensemble run with another tokenizer (the
    same model bytes are needed) or a position table shorter than `path`'s `data.max_length` (the loss batches
    reach it), found before its model is built.
    """
    from nmt.run_dir import RunDirError, ensemble_direction_error

    config, tokenizer, model, loaded = _load_run(path, weights)
    if not ensemble:
        return config, tokenizer, model, loaded
    from transformer.ensemble import Ensemble

    def check(other, other_config, other_tokenizer):
        if error := ensemble_direction_error(other, other_config.data, path, config.data):
            raise RunDirError(error)
        if other_tokenizer.fingerprint != tokenizer.fingerprint:
            raise RunDirError(
                f"{other} has another tokenizer than {path}: the runs of an ensemble share one (train them with the "
                "same data settings, or fine-tune one with train.init_from)"
            )
        if other_config.model.max_length < config.data.max_length:
            raise RunDirError(
                f"{other}'s position table (model.max_length {other_config.model.max_length}) is shorter than "
                f"{path}'s data.max_length ({config.data.max_length}), which its loss batches reach"
            )

    models = [model]
    for other in ensemble:
        _, _, other_model, other_loaded = _load_run(other, weights, check)
        models.append(other_model)
        loaded = f"{loaded} + {other_loaded}"
    return config, tokenizer, Ensemble(models), loaded


def _load_run(path: str | Path, weights: str, check=None):
    """(config, tokenizer, model with the chosen weights, their name) of one run directory; `check(path, config,
    tokenizer)` runs before the model is built."""
    from data.tokenizer import Tokenizer
    from nmt.final_weights import load_run_weights
    from nmt.run_dir import CANDIDATES, RunDir
    from transformer.model import build_model

    run_dir = RunDir(path).require()
    config = run_dir.load_config()
    if weights not in CANDIDATES:
        run_dir.weights_prefix(weights)  # RunDirError before the tokenizer and model are loaded
    tokenizer = Tokenizer.load(run_dir.tokenizer_dir)
    if check is not None:
        check(path, config, tokenizer)
    model = build_model(config.model, tokenizer.source_vocab_size, tokenizer.target_vocab_size)
    loaded = load_run_weights(
        model, run_dir, weights, config.train
    )  # RunDirError: missing, mismatched, corrupt
    log.info("loaded %s (weights %s)", run_dir.path, loaded)
    return config, tokenizer, model, loaded
