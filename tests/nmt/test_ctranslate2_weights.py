"""The weights a CTranslate2 export was made from: recorded as an absolute path with their digest, and found in the
run directory by that digest, whatever the directory export.py, evaluate.py or translate.py run from (exports made
before the path was absolute recorded it as typed, relative to a directory no one knows)."""

import json
import shutil
from pathlib import Path

import pytest

from tests.test_cli_translate import in_process

pytest.importorskip("ctranslate2")


def run_with_best(tiny_run_dir: Path, folder: Path) -> Path:
    """A copy of the tiny run whose best/ holds other weights than final/ (some of them scaled)."""
    from nmt.checkpoints import save_model_weights
    from nmt.run_models import load_run_models

    run = shutil.copytree(tiny_run_dir, folder / "run")
    _, _, model, _ = load_run_models(run)
    for weight in model.weights[:6]:
        weight.assign(weight * 0.7)
    save_model_weights(model, run / "best", 100)
    return run


def test_the_loss_is_the_exported_checkpoints_from_any_directory(
    tiny_run_dir, tmp_path, monkeypatch, capsys, restore_logging
):
    """export.py --model-dir run (relative) --weights best, then evaluate.py --engine ctranslate2 from another
    directory: the loss is best/'s (as the TensorFlow engine's with --weights best), not final/'s; also for an export
    that recorded the relative path (older code), and translate.py then says which weights the run lost."""
    from nmt.checkpoints import checkpoint_digest
    from nmt.ctranslate2_engine import CTranslate2Translator, ExportError
    from nmt.evaluation import _loss_model

    run = run_with_best(tiny_run_dir, tmp_path)
    best = run / "best" / "ckpt-100"
    (final,) = (run / "final").glob("ckpt-*.index")
    assert checkpoint_digest(str(best)) != checkpoint_digest(str(final.with_suffix("")))
    monkeypatch.chdir(tmp_path)
    code, captured = in_process("export.py", "--model-dir", "run", "--format", "ctranslate2", "--weights", "best",
                                "--output", "ct2", capsys=capsys)  # fmt: skip
    assert code == 0, captured.err[-2000:]
    export = tmp_path / "ct2"
    metadata = json.loads((export / "nmt_export.json").read_text(encoding="utf-8"))
    assert metadata["weights"] == str(best)
    # An export as older code wrote it: the path as typed, relative to tmp_path
    older = shutil.copytree(export, tmp_path / "older")
    (older / "nmt_export.json").write_text(json.dumps({**metadata, "weights": "run/best/ckpt-100"}))

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    argv = ["--model-dir", run, "--split", "test", "--beam", 1, "--max-sentences", 4, "--json"]
    records = {}
    for name, options in (
        ("tensorflow", ["--weights", "best"]),
        ("export", ["--engine", "ctranslate2", "--engine-dir", export]),
    ):
        code, captured = in_process("evaluate.py", *argv, *options, "--output", f"{name}.txt", capsys=capsys)
        assert code == 0, captured.err[-2000:]
        records[name] = json.loads(captured.out.strip().splitlines()[-1])
    assert records["export"]["loss_weights"] == str(best)
    assert records["export"]["loss"] == pytest.approx(records["tensorflow"]["loss"], rel=1e-6)
    translator = CTranslate2Translator.from_run_dir(run, older)
    assert _loss_model(run, translator, "auto")[1] == {"loss_weights": str(best)}
    # Older still (before 2026-12-06): no digest, found by its path inside the run (a review of 2026-12-07e: the
    # digest lookup alone took final/'s loss for it)
    oldest = shutil.copytree(export, tmp_path / "oldest")
    (oldest / "nmt_export.json").write_text(json.dumps({**metadata, "weights_digest": None}))
    translator = CTranslate2Translator.from_run_dir(run, oldest)
    assert _loss_model(run, translator, "auto")[1] == {"loss_weights": str(best)}

    # The run no longer holds those weights (best/ rotated away): said so, whatever the path recorded.
    shutil.rmtree(run / "best")
    for engine_dir in (export, older):
        with pytest.raises(ExportError, match=rf"made from .*ckpt-100, which {run} no longer holds"):
            CTranslate2Translator.from_run_dir(run, engine_dir)
    # Another run (same tokenizer, without those weights) given the older export: made from other weights, not
    # weights it "no longer holds" (a relative path was taken for this run's before; found by a review)
    other = shutil.copytree(tiny_run_dir, tmp_path / "other")
    with pytest.raises(
        ExportError, match=rf"made from other weights \(run/best/ckpt-100\) than any stored in {other}"
    ):
        CTranslate2Translator.from_run_dir(other, older)
