"""Two trainings on one run directory: the second is refused at once; the first finishes as if alone.

The scenario runs inside the session's reference run (conftest.ReferenceRun): once the first training has written
a checkpoint it is SIGSTOPped (a stopped process keeps its flock, so the attempt provably overlaps the training
however fast the tiny run is), a second `train.py` is started on the same directory, then the first is resumed
with SIGCONT. That same first run is the "uninterrupted" result the kill and stop tests must match exactly.

"At once" is checked as what the refused process did, not how long it took: it exits before importing any of
the slow libraries (TensorFlow alone takes seconds). The time itself is a `make bench` record ("refusal").
"""

from __future__ import annotations

from tests.faults.helpers import MAX_STEPS, final_weights, latest_step, training_state

# What train.py must not import before it checks the lock (each costs seconds, TensorFlow the most).
SLOW_IMPORTS = {"tensorflow", "keras", "tensorflow_text", "tensorflow_datasets", "sentencepiece"}


def test_second_training_on_same_dir_is_refused_before_the_slow_imports(reference_run):
    run_dir = reference_run.result()
    second = reference_run.second
    assert second.returncode == 3, second.stderr[-3000:]
    assert second.stderr.strip().splitlines()[-1] == (
        f"train.py: another training (pid {second.first_pid}) is already running on {run_dir}; "
        "wait for it to finish or stop it first"
    )
    assert "Traceback" not in second.stderr
    assert "nmt.run_dir" in second.imported, (
        "-X importtime reported nothing: the check below would be vacuous"
    )
    assert not SLOW_IMPORTS & second.imported, sorted(SLOW_IMPORTS & second.imported)


def test_refused_training_writes_nothing_and_first_finishes_normally(reference_run):
    run_dir = reference_run.result()
    second = reference_run.second
    assert (
        second.after == second.before
    )  # no config.yaml rewrite, no checkpoint, not even the lock file's pid
    assert second.before, "the attempt happened while the run directory was empty"
    log = reference_run.stderr()
    assert f"train.py: finished at step {MAX_STEPS}" in log
    assert "resuming" not in log
    assert latest_step(run_dir) == MAX_STEPS
    assert final_weights(run_dir) and training_state(run_dir)
