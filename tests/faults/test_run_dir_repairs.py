"""A run directory damaged by hand, or a start that cannot go on: nothing lost, nothing left half-made.

TensorFlow's checkpoint state file deleted, emptied or naming a checkpoint moved away (the resume continues from the
newest complete checkpoint, never from step 0); a finished run rerun with other settings (its config.yaml stays);
a new run whose start fails (undone, so the corrected command is not refused); an unusable --model-dir (exit 2).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import tensorflow as tf

import train as train_cli
from nmt.checkpoints import checkpoint_to_resume, repair_checkpoint_state
from nmt.run_dir import write_atomic
from tests.faults.helpers import CHECKPOINT_EVERY, MAX_STEPS, snapshot, snapshot_run


def _steps(directory: Path) -> list[int]:
    state = tf.train.get_checkpoint_state(str(directory))
    return [int(path.rsplit("-", 1)[-1]) for path in state.all_model_checkpoint_paths]


@pytest.mark.parametrize(
    "damage", ["deleted", "emptied", "newest moved away", "deleted, DIR relative", "names ../../ckpt-N"]
)
def test_a_damaged_checkpoint_state_file_is_rewritten_from_the_checkpoints(
    reference_copy, tmp_path, monkeypatch, damage
):
    """With DIR relative (`--model-dir runs/base`, the default's kind), the repair wrote the names relative to the
    working directory ("../../ckpt-20", TensorFlow's relpath of a relative save_dir), and took that state file for
    intact (it compared base names): every resume failed on a checkpoint "not found" (before 2026-12-07c; found by
    a resume review). The last case is the state file that repair left."""
    checkpoints = reference_copy / "checkpoints"
    if damage == "deleted, DIR relative":
        monkeypatch.chdir(reference_copy.parent)
        checkpoints = Path(reference_copy.name) / "checkpoints"
    kept = _steps(checkpoints)
    assert kept[-1] == MAX_STEPS and len(kept) > 1
    assert repair_checkpoint_state(checkpoints) == ""  # intact: untouched
    state = checkpoints / "checkpoint"
    if damage.startswith("deleted"):
        state.unlink()
    elif damage == "emptied":
        state.write_text("")
    elif damage == "names ../../ckpt-N":
        state.write_text(
            f'model_checkpoint_path: "../../ckpt-{kept[-1]}"\n'
            + "".join(f'all_model_checkpoint_paths: "../../ckpt-{step}"\n' for step in kept)
        )
    else:  # what the error for a corrupt newest checkpoint advises
        for path in checkpoints.glob(f"ckpt-{MAX_STEPS}.*"):
            shutil.move(path, tmp_path / path.name)
        kept = kept[:-1]
    (
        checkpoints / f"ckpt-{MAX_STEPS + CHECKPOINT_EVERY}_temp"
    ).mkdir()  # a half-written save is not a checkpoint
    # What a multi-worker run's other workers read from the chief's directory, before the chief repairs it: the
    # checkpoint the repair will name, nothing written.
    before = snapshot(checkpoints)
    assert checkpoint_to_resume(checkpoints) == str(checkpoints / f"ckpt-{kept[-1]}")
    assert snapshot(checkpoints) == before
    message = repair_checkpoint_state(checkpoints)
    assert f"{state} " in message and f"ckpt-{kept[-1]}), the newest as the latest" in message
    assert _steps(checkpoints) == kept
    assert not list(checkpoints.glob("*_temp"))  # the half-written save went too
    assert tf.train.latest_checkpoint(str(checkpoints)) == str(checkpoints / f"ckpt-{kept[-1]}")
    assert checkpoint_to_resume(checkpoints) == str(checkpoints / f"ckpt-{kept[-1]}")  # and after the repair
    # bare names, found beside the state file from any working directory (and wherever DIR moves)
    assert f'model_checkpoint_path: "ckpt-{kept[-1]}"\n' in state.read_text()
    assert repair_checkpoint_state(checkpoints) == ""  # and intact now
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(), str(checkpoints), max_to_keep=len(kept))
    assert [
        int(p.rsplit("-", 1)[-1]) for p in manager.checkpoints
    ] == kept  # what the trainer's manager rotates


@pytest.mark.parametrize(
    ("folder", "damage"),
    [("checkpoints", "deleted"), ("final", "emptied"), ("final", "names no latest")],
)
def test_a_finished_run_with_its_state_file_deleted_is_still_finished(
    fault_config, reference_copy, capsys, caplog, folder, damage
):
    """Before the repair, this rerun trained from step 0 again, rotating the real checkpoints away; with final/'s
    state file emptied, or naming no latest checkpoint (which TensorFlow raises on), it ended in a traceback."""
    state = reference_copy / folder / "checkpoint"
    if damage == "deleted":
        state.unlink()
    else:
        state.write_text("" if damage == "emptied" else f'all_model_checkpoint_paths: "ckpt-{MAX_STEPS}"\n')
    code = train_cli.main(["--config", str(fault_config), "--model-dir", str(reference_copy)])
    stderr = capsys.readouterr().err
    assert code == 0, stderr[-3000:]
    assert any("rewritten from the checkpoints present" in r.getMessage() for r in caplog.records)
    assert f"train.py: already finished at step {MAX_STEPS}" in stderr


def test_a_finished_run_rerun_with_other_settings_keeps_its_config(
    fault_config, reference_copy, capsys, caplog
):
    before = snapshot_run(reference_copy)
    argv = ["--config", str(fault_config), "--model-dir", str(reference_copy)]
    code = train_cli.main([*argv, "--set", "eval.beam_size=7", "train.learning_rate=0.5"])
    stderr = capsys.readouterr().err
    assert code == 0, stderr[-3000:]
    warned = [r.getMessage() for r in caplog.records if "settings differ from" in r.getMessage()]
    assert len(warned) == 1 and "train.learning_rate: 0.01 -> 0.5; eval.beam_size: 2 -> 7" in warned[0], (
        warned
    )
    assert f"train.py: already finished at step {MAX_STEPS}" in stderr
    assert (
        "train.py: resuming" not in stderr
    )  # printed before training on (its log lines are not captured here)
    assert snapshot_run(reference_copy) == before  # config.yaml too: the run did not use those settings


def test_a_finished_run_rerun_with_another_global_batch_is_already_finished(
    fault_config, reference_copy, capsys
):
    """train.accumulate_steps (or train.distribute, the device count) changed: the checkpoint's global batch was
    refused before the trainer could say "already finished" (exit 1, and make train evaluated nothing; found by a
    review of 2026-12-07). Asked to train on (a larger max_steps), the new batch is still refused; DIR untouched."""
    before = snapshot_run(reference_copy)
    argv = [
        "--config",
        str(fault_config),
        "--model-dir",
        str(reference_copy),
        "--set",
        "train.accumulate_steps=2",
    ]
    code = train_cli.main(argv)
    stderr = capsys.readouterr().err
    assert code == 0, stderr[-3000:]
    assert f"train.py: already finished at step {MAX_STEPS}: validation loss " in stderr
    assert snapshot_run(reference_copy) == before
    code = train_cli.main([*argv, f"train.max_steps={MAX_STEPS + CHECKPOINT_EVERY}"])
    stderr = capsys.readouterr().err
    assert code == 1, stderr[-3000:]
    assert (
        f"ckpt-{MAX_STEPS} was trained with a global batch of 256 tokens on 1 replica(s); this run has 512"
        in stderr
    )
    assert "train.allow_batch_change=true" in stderr and "already finished" not in stderr
    assert snapshot_run(reference_copy) == before


@pytest.mark.parametrize("existed", [False, True])
def test_a_new_run_whose_start_fails_is_undone(
    fault_config, tmp_path, tmp_path_factory, monkeypatch, capsys, existed
):
    cache = tmp_path_factory.mktemp("cache")  # this test's own: nothing of the refused tokenizer stays in it
    monkeypatch.setenv("NMT_DATA_CACHE", str(cache))
    run_dir = tmp_path / "run"
    if existed:  # a directory the user made, with a file of theirs: kept as it was
        run_dir.mkdir()
        (run_dir / "notes.txt").write_text("mine\n")
    before = snapshot(tmp_path)
    # a vocabulary the 200-pair corpus cannot give: SentencePiece refuses, a data error after config.yaml went in
    argv = ["--config", str(fault_config), "--model-dir", str(run_dir), "--set", "data.vocab_size=60000"]
    code = train_cli.main(argv)
    stderr = capsys.readouterr().err
    assert code == 1, stderr[-3000:]
    assert "train.py: data error:" in stderr
    assert (
        snapshot(tmp_path) == before
    )  # nothing of the failed start left: the corrected command starts afresh
    assert run_dir.is_dir() == existed
    assert not list(
        cache.rglob("*.partial")
    )  # nor of the tokenizer's training (before: an empty tokenizer-*.partial)


def test_an_unusable_model_dir_exits_2(fault_config, tmp_path, capsys):
    regular = tmp_path / "a-file"
    regular.write_text("not a directory\n")
    for model_dir, why in (
        (regular, "it is a file, not a directory"),
        (regular / "below", f"{regular} is a file, not a directory"),
    ):
        code = train_cli.main(["--config", str(fault_config), "--model-dir", str(model_dir)])
        stderr = capsys.readouterr().err
        assert code == 2, stderr[-3000:]
        assert f"train.py: cannot use {model_dir} as the run directory: {why}" in stderr
        assert "Errno" not in stderr
    assert regular.read_text() == "not a directory\n"
    code = train_cli.main(["--config", str(fault_config), "--model-dir", ""])
    assert code == 2 and "--model-dir is empty" in capsys.readouterr().err


def test_written_files_are_readable_like_the_rest_of_the_run_directory(tmp_path):
    mask = os.umask(0o027)
    try:
        write_atomic(tmp_path / "config.yaml", "a: 1\n")
        (tmp_path / "plain").write_text("b\n")
    finally:
        os.umask(mask)
    modes = {name: (tmp_path / name).stat().st_mode & 0o777 for name in ("config.yaml", "plain")}
    assert modes == {"config.yaml": 0o640, "plain": 0o640}


def test_a_damaged_token_file_read_batch_by_batch_is_a_data_error(
    fault_config, tmp_path, monkeypatch, capsys
):
    """A split read from its files (as a large corpus is) whose ids were overwritten: opening it reads offsets and
    lengths only, so the first batch finds the bad ids; train.py names the file (exit 1), no TensorFlow traceback."""
    import numpy as np

    import data.store
    from data.prepare import main as prepare_main

    cache = f"data.cache_dir={tmp_path / 'cache'}"
    assert prepare_main(["--config", str(fault_config), "--set", cache, "--no-progress"]) == 0
    (values,) = (tmp_path / "cache").glob("*_train-*/source.values")
    dtype = np.dtype(json.loads((values.parent / "manifest.json").read_text())["dtype"])
    values.write_bytes(np.full(values.stat().st_size // dtype.itemsize, np.iinfo(dtype).max, dtype).tobytes())
    monkeypatch.setattr(data.store, "IN_MEMORY_BYTES", 0)  # every split read from its files
    argv = ["--config", str(fault_config), "--model-dir", str(tmp_path / "run"), "--set", cache]
    code = train_cli.main(argv)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1, last
    assert last.startswith(
        f"train.py: data error: {values} is corrupt (piece id {np.iinfo(dtype).max} outside"
    )
    assert last.endswith("and prepare again")


@pytest.mark.parametrize("entry", ["tensorboard", "metrics.jsonl"])
def test_an_entry_of_the_run_directory_that_cannot_be_written_is_named(
    fault_config, reference_copy, capsys, entry
):
    """tensorboard/ made a file (TensorFlow's error), metrics.jsonl made a directory (an OSError, as a full disk
    writing config.yaml or a metrics line gives): "training failed" naming it, exit 1, no checkpoint lost
    (before 2026-12-07c: a traceback; found by a resume review)."""
    path = reference_copy / entry
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.write_text("") if entry == "tensorboard" else path.mkdir()
    before = snapshot(reference_copy / "checkpoints")
    argv = ["--config", str(fault_config), "--model-dir", str(reference_copy)]
    code = train_cli.main([*argv, "--set", f"train.max_steps={MAX_STEPS + CHECKPOINT_EVERY}"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1, last
    assert last.startswith("train.py: training failed: ") and str(path) in last, last
    assert "once that is fixed, the same command carries on from the last checkpoint" in last
    assert "{{" not in last and "[Op:" not in last  # TensorFlow's wrapping of an eager op's error left out
    if entry == "tensorboard":  # its writer is made before the first step
        assert snapshot(reference_copy / "checkpoints") == before
    else:  # the first metrics line comes after the next checkpoint: nothing of the run's progress is lost
        assert _steps(reference_copy / "checkpoints")[-1] == MAX_STEPS + CHECKPOINT_EVERY


@pytest.mark.parametrize(
    "damage",
    [
        "config.yaml deleted",
        "checkpoints deleted",
        "checkpoints deleted, unfinished",
        "checkpoints deleted, more",
    ],
)
def test_a_run_missing_its_config_or_checkpoints_is_not_trained_over(
    fault_config, reference_copy, capsys, damage
):
    """Without config.yaml, DIR read as a new run that adopted the old checkpoints and tokenizer with any settings
    (and wrote them into config.yaml); without checkpoints/ (deleted to save space), the rerun trained from step 0,
    replacing final/ and dropping every record, exit 0 (before 2026-12-07c; found by a resume review). Now: a
    finished run says so (exit 0) unless asked for more steps, the others are refused (exit 3), DIR untouched before
    TensorFlow loads."""
    if damage == "config.yaml deleted":
        (reference_copy / "config.yaml").unlink()
    else:
        shutil.rmtree(reference_copy / "checkpoints")
    if damage.endswith("unfinished"):  # the final evaluation's record lost: final/ from an earlier end
        metrics = reference_copy / "metrics.jsonl"
        metrics.write_text("".join(metrics.read_text().splitlines(keepends=True)[:-1]))
    before = snapshot_run(reference_copy)
    argv = ["--config", str(fault_config), "--model-dir", str(reference_copy)]
    if "config" in damage:
        argv += ["--set", "data.vocab_size=80"]
    elif damage.endswith("more"):  # a finished run asked to train on: it cannot (exit 3, not "finished")
        argv += ["--set", f"train.max_steps={MAX_STEPS + 5}"]
    code = train_cli.main(argv)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    if damage == "config.yaml deleted":
        assert code == 3, last
        # best/ between them if a validation saved best weights
        assert (
            f"{reference_copy} holds a run's checkpoints/" in last
            and " and final/ but no config.yaml (the settings they were made with)" in last
        )
    else:
        assert code == (0 if damage == "checkpoints deleted" else 3), last
        assert ("already finished; " in last) == (code == 0), last
        assert (
            "holds trained weights in final/ but no training checkpoint in checkpoints/: it cannot train on"
            in last
        )
    assert snapshot_run(reference_copy) == before


def test_a_run_whose_checkpoints_and_final_weights_are_gone_is_not_trained_over(
    fault_config, reference_copy, capsys
):
    """checkpoints/ and final/ deleted (space, or lost), metrics.jsonl left: the rerun removed every record and
    trained from step 0 (before 2026-12-08: "removed what training lost with its process"); now refused, exit 3,
    naming the step its records reach, DIR untouched."""
    shutil.rmtree(reference_copy / "checkpoints")
    shutil.rmtree(reference_copy / "final")
    before = snapshot_run(reference_copy)
    code = train_cli.main(["--config", str(fault_config), "--model-dir", str(reference_copy)])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 3, last
    assert last.startswith(
        f"train.py: {reference_copy} holds results up to step {MAX_STEPS} (metrics.jsonl"
    ), last
    assert "no training checkpoint in checkpoints/: it cannot train on" in last
    assert snapshot_run(reference_copy) == before


def test_a_run_directory_seeded_with_a_tokenizer_alone_is_a_new_run(reference_copy, fault_config):
    """What ablate.py's variants are before their training (a shared tokenizer copied in): a new run, not refused as
    a run without its config.yaml (a regression of the refusal above, found by a review on 2026-12-07c)."""
    from nmt.config import absolute_paths, load_config
    from nmt.run_dir import RunDir, RunDirError
    from nmt.run_start import check_resume_compatible

    seeded = RunDir(reference_copy.parent / "seeded")
    seeded.path.mkdir()
    shutil.copytree(reference_copy / "tokenizer", seeded.tokenizer_dir)
    assert check_resume_compatible(seeded, absolute_paths(load_config(fault_config))) is False
    # a seed another config trained (a leftover): refused, not used under settings it does not have
    other = absolute_paths(load_config(fault_config, ["data.vocab_size=80"]))
    with pytest.raises(
        RunDirError, match=r"tokenizer is not the tokenizer this config trains \(spm.model has "
    ):
        check_resume_compatible(seeded, other)


def test_a_start_that_does_not_train_leaves_the_record_of_the_training_data(
    fault_config, reference_copy, tmp_path, capsys
):
    """DIR/train_data.json is rewritten only by a start that trains: a resume refused (another global batch) or
    the rerun of a finished run on a changed corpus left the new counts there, so the next resume on it no longer
    warned (before 2026-12-07c; found by a review)."""
    import yaml

    record = reference_copy / "train_data.json"
    before = record.read_text(encoding="utf-8")
    # the run's corpus, a copy of its own (then cut): its config.yaml and the command name it
    tree = yaml.safe_load(fault_config.read_text(encoding="utf-8"))
    corpus = tmp_path / "corpus"
    shutil.copytree(tree["data"]["folder"], corpus)
    for path in (reference_copy / "config.yaml", tmp_path / "tiny.yaml"):
        saved = yaml.safe_load((reference_copy / "config.yaml").read_text(encoding="utf-8"))
        saved["data"]["folder"] = str(corpus)
        path.write_text(yaml.safe_dump(saved, sort_keys=False), encoding="utf-8")
    for path in corpus.glob("*.train.txt"):
        path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:40]))
    argv = ["--config", str(tmp_path / "tiny.yaml"), "--model-dir", str(reference_copy)]
    refused = train_cli.main([*argv, "--set", f"train.max_steps={MAX_STEPS + 5}", "train.accumulate_steps=2"])
    assert refused == 1 and "was trained with a global batch" in capsys.readouterr().err
    assert train_cli.main(argv) == 0
    assert f"train.py: already finished at step {MAX_STEPS}" in capsys.readouterr().err
    assert record.read_text(encoding="utf-8") == before
