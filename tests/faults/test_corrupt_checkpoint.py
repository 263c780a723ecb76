"""Truncated or mismatched checkpoints: a clear error naming the file, a non-zero exit, never a silent re-init."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

import evaluate
import train as train_cli
import translate
from tests.faults.helpers import MAX_STEPS, run_main, snapshot, snapshot_run, train


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def data_file(directory: Path, step: int) -> Path:
    (path,) = directory.glob(f"ckpt-{step}.data-*")
    return path


def test_truncated_training_checkpoint_is_refused(fault_config, reference_copy, capsys, caplog):
    """train.main in this process (exit code and stderr as train.py's; saves a process start)."""
    run_dir = reference_copy
    truncate(data_file(run_dir / "checkpoints", MAX_STEPS))
    before = snapshot_run(run_dir)
    # More steps than were trained: a silent re-init (or a silent skip of the bad file) would write checkpoints.
    # A changed train section: the refused start must not rewrite config.yaml with it either.
    argv = [
        "--config",
        str(fault_config),
        "--model-dir",
        str(run_dir),
        "--set",
        f"train.max_steps={MAX_STEPS + 10}",
    ]
    caplog.set_level(logging.INFO)  # train.main's INFO records (under pytest its basicConfig adds no handler)
    code = train_cli.main(argv)
    stderr = capsys.readouterr().err
    assert code == 1, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"train.py: training failed: cannot resume from checkpoint {run_dir / 'checkpoints' / f'ckpt-{MAX_STEPS}'}: "
    )
    assert "corrupt" in last
    assert snapshot_run(run_dir) == before  # config.yaml included: still the run's own config
    assert "nmt.train" in {r.name for r in caplog.records}  # the records are there to look at...
    assert not [r for r in caplog.records if "saved checkpoint" in r.getMessage()]  # ...and none says this


def test_checkpoint_of_another_model_size_is_refused(fault_config, reference_copy):
    before = snapshot(reference_copy)
    done = train(fault_config, reference_copy, "model.d_model=32")
    assert done.returncode == 3, done.stderr[-3000:]
    assert "model.d_model: 16 -> 32" in done.stderr
    assert "use another --model-dir or the original config" in done.stderr
    assert snapshot(reference_copy) == before


@pytest.fixture
def reference_model_parts(reference_copy):
    from data.tokenizer import Tokenizer
    from nmt.run_dir import RunDir

    run_dir = RunDir(reference_copy)
    return run_dir, run_dir.load_config(), Tokenizer.load(run_dir.tokenizer_dir)


@pytest.mark.parametrize("which", ["final", "latest"])
def test_restore_of_mismatched_weights_raises_rundirerror(reference_model_parts, which):
    from nmt.checkpoints import restore_model_weights
    from nmt.run_dir import RunDirError
    from transformer.model import build_model

    run_dir, config, tokenizer = reference_model_parts
    wider = dataclasses.replace(config.model, d_model=32, d_ff=64)
    model = build_model(wider, tokenizer.source_vocab_size, tokenizer.target_vocab_size)
    prefix = run_dir.weights_prefix(which)
    with pytest.raises(RunDirError, match=f"cannot restore model weights from {prefix}: .*shape"):
        restore_model_weights(model, prefix)


def test_restore_of_truncated_weights_raises_rundirerror(reference_model_parts):
    from nmt.checkpoints import restore_model_weights
    from nmt.run_dir import RunDirError
    from transformer.model import build_model

    run_dir, config, tokenizer = reference_model_parts
    prefix = run_dir.weights_prefix("final")
    truncate(data_file(run_dir.final_dir, MAX_STEPS))
    model = build_model(config.model, tokenizer.source_vocab_size, tokenizer.target_vocab_size)
    with pytest.raises(RunDirError, match=f"cannot restore model weights from {prefix}"):
        restore_model_weights(model, prefix)


@pytest.mark.parametrize("module", [translate, evaluate], ids=["translate", "evaluate"])
def test_cli_on_truncated_final_weights_fails_clearly(
    module, reference_copy, tmp_path, capsys, restore_logging
):
    truncate(data_file(reference_copy / "final", MAX_STEPS))
    source = tmp_path / "input.txt"
    source.write_text("The cat sees a ball.\n", encoding="utf-8")
    before = snapshot(reference_copy)
    extra = ["--input", str(source)] if module is translate else ["--json"]
    code = run_main(module, ["--model-dir", str(reference_copy), *extra])
    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""
    assert "Traceback" not in captured.err
    prefix = reference_copy / "final" / f"ckpt-{MAX_STEPS}"
    assert (
        captured.err.strip().splitlines()[-1].startswith(f"error: cannot restore model weights from {prefix}")
    )
    assert snapshot(reference_copy) == before


@pytest.mark.parametrize(
    "damage",
    [
        lambda final: next(final.glob("ckpt-*.index")).unlink(),
        lambda final: (final / "checkpoint").write_bytes(b"\x8b\x1f\xff\x00 not a state"),
        lambda final: (final / "checkpoint").write_text("model_checkpoint_path: ckpt-\n}{", encoding="utf-8"),
        lambda final: (final / "checkpoint").write_text(""),  # TensorFlow raises on these two
        lambda final: (final / "checkpoint").write_text('model_checkpoint_path: ""\n', encoding="utf-8"),
    ],
    ids=["index-gone", "binary-state", "garbled-state", "empty-state", "no-latest-state"],
)
def test_damaged_final_weights_are_reported_not_replaced_by_other_weights(reference_copy, damage):
    """--weights auto reads final/, else best/, else the latest checkpoint: that order is for weights never saved,
    not for final weights that were saved and are now damaged (the user would evaluate other weights unawares)."""
    from nmt.run_dir import RunDir, RunDirError

    run_dir = RunDir(reference_copy)
    assert run_dir.weights_prefix("latest")
    damage(run_dir.final_dir)
    for which in ("auto", "final"):
        with pytest.raises(
            RunDirError, match=rf"{run_dir.final_dir} is damaged: .* read others with --weights"
        ):
            run_dir.weights_prefix(which)
    assert run_dir.weights_prefix("latest").endswith(f"ckpt-{MAX_STEPS}")  # the others still read


@pytest.mark.parametrize(
    ("text", "missing"),
    [
        ("", "data, model, train"),
        ("model: {}\neval: {}\n", "data, train"),
        # the default data.max_length (128) over this model's 64: before, that clash was reported instead
        ("model: {max_length: 64}\ntrain: {}\neval: {}\n", "data"),
    ],
)
def test_an_emptied_or_cut_config_is_refused_not_read_as_the_defaults(
    reference_copy, tmp_path, capsys, restore_logging, text, missing
):
    """An empty config.yaml would load as the defaults (another eval.alpha, dataset, ...), not the run's settings."""
    (reference_copy / "config.yaml").write_text(text, encoding="utf-8")
    source = tmp_path / "input.txt"
    source.write_text("The cat sees a ball.\n", encoding="utf-8")
    code = run_main(translate, ["--model-dir", str(reference_copy), "--input", str(source)])
    captured = capsys.readouterr()
    assert code == 1 and captured.out == "" and "Traceback" not in captured.err
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith(f"error: {reference_copy / 'config.yaml'} is incomplete (no {missing} section"), (
        last
    )
