"""nmt.run_start.checkpoints_gone: a run directory whose training checkpoints are gone but whose results show that
training went past its first checkpoint (final/, or metrics.jsonl records and best/ weights after
`train.checkpoint_every`) is not trained over from step 0; a process that never reached its first checkpoint is.
Before 2026-12-08 only final/ was looked at: with checkpoints/ and final/ deleted, a rerun removed best/ and every
record ("removed what training lost with its process") and trained from step 0."""

from __future__ import annotations

import json

import pytest

from nmt.config import config_from_dict
from nmt.run_dir import RunDir, write_atomic
from nmt.run_start import checkpoints_gone

EVERY = 10


def run_dir(tmp_path, steps, best=None, final=None, checkpoint=None) -> RunDir:
    """A run directory (no TensorFlow) with records at `steps` and weights named by step in best/, final/ and
    checkpoints/ (the index file and the state file the readers look at)."""
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    write_atomic(run.config_path, config_from_dict({"train": {"checkpoint_every": EVERY}}).to_yaml())
    lines = [json.dumps({"tag": "validation", "step": step, "loss": 1.0}) + "\n" for step in steps]
    run.metrics_path.write_text("".join(lines), encoding="utf-8")
    for directory, step in ((run.best_dir, best), (run.final_dir, final), (run.checkpoint_dir, checkpoint)):
        if step is not None:
            directory.mkdir()
            (directory / f"ckpt-{step}.index").write_bytes(b"")
            (directory / "checkpoint").write_text(f'model_checkpoint_path: "ckpt-{step}"\n', encoding="utf-8")
    return run


@pytest.mark.parametrize(
    "steps, best, final, checkpoint, refused",
    [
        (
            [5, 10],
            10,
            None,
            None,
            "",
        ),  # killed before its first checkpoint (at 10, after that step's validation)
        ([5, 10], None, None, 10, ""),  # checkpoints there: it resumes
        (
            [5, 10, 15],
            None,
            None,
            None,
            "holds results up to step 15 (metrics.jsonl) but no training checkpoint",
        ),
        (
            [5],
            20,
            None,
            None,
            "holds results up to step 20 (metrics.jsonl, best/) but no training checkpoint",
        ),
        ([5, 10, 15], None, 15, None, "holds trained weights in final/ but no training checkpoint"),
    ],
)
def test_a_run_whose_checkpoints_are_gone_is_refused_only_past_its_first_checkpoint(
    tmp_path, steps, best, final, checkpoint, refused
):
    run = run_dir(tmp_path, steps, best=best, final=final, checkpoint=checkpoint)
    message = checkpoints_gone(run)
    if not refused:
        assert message == ""
        return
    assert message.startswith(f"{run.path} {refused} in checkpoints/: it cannot train on"), message
    kept = "final/" if final is not None else "best/" if best is not None else None
    if kept:
        assert message.endswith(f"; evaluate.py, translate.py and export.py still use {kept})")
    else:
        assert message.endswith("(put the checkpoints back, or use another --model-dir)")
