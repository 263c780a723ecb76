"""Two local `train.py` workers (TF_CONFIG) stop together: a SIGTERM that reaches one worker, a time budget spent
on one worker's clock, or validation BLEU that stopped improving on the chief's translations only, stops both after
the same step with one checkpoint and exit code 0, and both resume from there; workers that would resume from
different checkpoints refuse to start.

Marked slow (several pairs of training processes). test_distribute.py keeps a restart of both workers in `make test`
(from a copy of its uninterrupted run rolled back to a checkpoint; its real SIGKILL is slow too); this module uses the
same tiny config.
"""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.faults.helpers import ROOT, RUN_TIMEOUT, latest_step
from tests.nmt.multi_worker import Workers, resumed_step, saved_checkpoints, stop_message
from tests.nmt.test_distribute import config_file

pytestmark = pytest.mark.slow
MANY_STEPS = 1000  # never reached: the runs here are stopped by a signal or a time budget


def assert_all_exit_zero(results):
    for code, stderr in results:
        assert code == 0, stderr[-3000:]


def assert_both_resume(config, run_dir, logs, step: int) -> None:
    """Both workers restarted with the same command (two more steps allowed) resume from `step` and finish
    together."""
    with Workers(config, run_dir, logs, f"train.max_steps={step + 2}") as workers:
        results = workers.wait()
    assert_all_exit_zero(results)
    for _, stderr in results:
        assert resumed_step(stderr) == step
        assert stop_message(stderr) == ("finished", step + 2)


def test_sigterm_to_one_worker_stops_both_at_the_same_step_and_both_resume_there(tmp_path):
    config = config_file(tmp_path, "multi_worker", checkpoint_every=4)
    run_dir = tmp_path / "run"
    with Workers(config, run_dir, tmp_path / "signalled", f"train.max_steps={MANY_STEPS}") as workers:
        workers.wait_for_checkpoint(4)
        workers.procs[1].signal(signal.SIGTERM)
        (_, chief), (_, worker) = results = workers.wait()
    assert_all_exit_zero(results)
    (chief_reason, step), (worker_reason, worker_step) = stop_message(chief), stop_message(worker)
    assert worker_reason == "stopped by SIGTERM"
    assert chief_reason == "stopped by SIGTERM (sent to another worker)"
    assert step == worker_step and 4 <= step < MANY_STEPS
    # One checkpoint at the stop step, written by the chief into the run directory (worker 1 saved its own copy
    # at the same step); nothing after it.
    assert saved_checkpoints(chief)[-1] == run_dir / "checkpoints" / f"ckpt-{step}"
    assert saved_checkpoints(worker)[-1].name == f"ckpt-{step}"
    assert latest_step(run_dir) == step

    # Worker 1 given a run directory without the chief's checkpoints: both refuse to start, naming the steps.
    elsewhere = tmp_path / "elsewhere"
    with Workers(config, run_dir, tmp_path / "split", worker_dirs={1: elsewhere}) as workers:
        results = workers.wait()
    for code, stderr in results:
        assert code == 1, stderr[-3000:]
        assert f"the workers would resume from different steps (worker 0: {step}, worker 1: 0)" in stderr
    assert latest_step(run_dir) == step

    # Restarted with the same command (two more steps allowed): both resume from the stop step and finish together.
    assert_both_resume(config, run_dir, tmp_path / "resumed", step)


def test_time_budget_spent_stops_both_workers_at_the_same_step(tmp_path):
    """A budget of a few milliseconds: each worker's own clock would run out at its own step; the workers share one
    clock after every step, so they stop together (before that fix, one stopped alone and the other waited for it
    in the next step's all-reduce). Two different budgets are refused at the start (the fingerprint: each worker
    plans its schedule from its budget)."""
    config = config_file(tmp_path, "multi_worker")
    budget = ("train.max_minutes=0.0001", f"train.max_steps={MANY_STEPS}")
    with Workers(config, tmp_path / "run", tmp_path / "logs", *budget) as workers:
        results = workers.wait()
    assert_all_exit_zero(results)
    (chief_reason, step), (worker_reason, worker_step) = [stop_message(stderr) for _, stderr in results]
    assert chief_reason == worker_reason == "finished"
    assert step == worker_step and 1 <= step < MANY_STEPS
    assert latest_step(tmp_path / "run") == step

    # The same command again: both workers end at once, the final weights are not evaluated a second time.
    with Workers(config, tmp_path / "run", tmp_path / "rerun", *budget) as workers:
        results = workers.wait()
    assert_all_exit_zero(results)
    for _, stderr in results:
        assert f"train.py: already finished at step {step}: validation loss " in stderr
    finals = [
        r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").open()) if r.get("tag") == "final"
    ]
    assert len(finals) == 1


def test_workers_started_with_different_settings_refuse_to_start(tmp_path):
    """Another seed on one worker would train silently otherwise (another model size: a TensorFlow error deep in a
    collective); where the data is stored may differ."""
    config = config_file(tmp_path, "multi_worker", checkpoint_every=4)
    other = {1: ("train.seed=7", f"data.cache_dir={tmp_path / 'elsewhere'}", "train.max_minutes=5")}
    with Workers(config, tmp_path / "run", tmp_path / "logs", worker_overrides=other) as workers:
        results = workers.wait()
    for code, stderr in results:
        assert code == 1, stderr[-3000:]
        assert "the workers were started with different configs (fingerprints worker 0: " in stderr
    assert not (tmp_path / "run").exists()  # the chief's new run was undone


def test_a_worker_killed_mid_run_is_named_and_restarting_every_worker_resumes(tmp_path):
    """SIGKILL to worker 1 (its host lost): the chief stops with one line naming worker 1 and the remedy, no
    traceback; restarting both resumes from the last checkpoint."""
    config = config_file(tmp_path, "multi_worker", checkpoint_every=4)
    run_dir = tmp_path / "run"
    with Workers(config, run_dir, tmp_path / "killed", f"train.max_steps={MANY_STEPS}") as workers:
        workers.wait_for_checkpoint(4)
        address = workers.addresses[1]
        workers.procs[1].signal(signal.SIGKILL)
        (code, chief), _ = workers.wait()
    assert code == 1, chief[-3000:]
    assert f"train.py: training failed: lost contact with worker 1 ({address})" in chief
    assert "Restart every worker with the same command" in chief
    assert "Traceback" not in chief
    assert_both_resume(config, run_dir, tmp_path / "restarted", latest_step(run_dir))


def test_a_worker_stopped_while_the_cluster_forms_does_not_leave_the_other_waiting(tmp_path):
    """SIGINT to worker 1 just after the tasks met: whether it stops before TensorFlow's start-up, inside it or
    after it, worker 0 gives up within train.cluster_wait_minutes (it used to wait, deaf to signals, for an hour)
    and its new run is undone."""
    config = config_file(tmp_path, "multi_worker")
    with Workers(config, tmp_path / "run", tmp_path / "logs", "train.cluster_wait_minutes=0.1") as workers:
        deadline = time.monotonic() + RUN_TIMEOUT  # a hang guard, not a timing
        while "every task of the cluster has started" not in workers.procs[1].stderr():
            assert time.monotonic() < deadline, workers.procs[1].stderr()[-3000:]
            time.sleep(0.005)
        workers.procs[1].signal(signal.SIGINT)
        (code, chief), (worker_code, worker) = workers.wait()
    assert worker_code == 130, worker[-3000:]
    assert code == 1, chief[-3000:]
    # one of three messages, by when worker 1 stopped: each names the wait it gave up
    assert "train.py: cluster error: " in chief and " min (train.cluster_wait_minutes): " in chief
    assert not (tmp_path / "run").exists()


# Each worker scores its own greedy translations (nmt.scores.score_corpus), replaced here before train.py starts
# (sitecustomize, imported at interpreter start-up): the chief's BLEU never improves, worker 1's always does, as two
# kinds of CPU whose roundings decode differently could (without TensorFlow's numbers having to differ here).
SCRIPTED_SCORES = """
import json
import os

import nmt.scores

WORKER = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
CALLS = []


def scripted(hypotheses, references, *args, **kwargs):
    CALLS.append(len(hypotheses))
    bleu = 5.0 if WORKER == 0 else 10.0 * len(CALLS)
    return {"bleu": bleu, "chrf": bleu, "signature": f"scripted on worker {WORKER}"}


nmt.scores.score_corpus = scripted
"""


def test_early_stopping_follows_the_chiefs_bleu_on_every_worker(tmp_path):
    """BLEU every 2 steps, patience 1: the chief's stays at 5 and ends the run at step 4; worker 1's own BLEU rises
    at every evaluation, but it takes the chief's and stops at step 4 too, saying so (before 2026-12-07 it decided
    alone, trained on and waited for the chief in the next step's all-reduce)."""
    scripted = tmp_path / "scripted"
    scripted.mkdir()
    (scripted / "sitecustomize.py").write_text(SCRIPTED_SCORES, encoding="utf-8")
    path = os.pathsep.join([str(scripted), str(ROOT), os.environ.get("PYTHONPATH", "")])
    config = config_file(tmp_path, "multi_worker", checkpoint_every=2)
    bleu = ("train.bleu_every=2", "train.bleu_max_sentences=4", "train.early_stopping=1")
    with Workers(
        config, tmp_path / "run", tmp_path / "logs", f"train.max_steps={MANY_STEPS}", *bleu,
        worker_env={0: {"PYTHONPATH": path}, 1: {"PYTHONPATH": path}},
    ) as workers:  # fmt: skip
        results = workers.wait()
    assert_all_exit_zero(results)
    (_, chief), (_, worker) = results
    for stderr in (chief, worker):
        assert "train.py: validation BLEU stopped improving" in stderr, stderr[-3000:]
        assert saved_checkpoints(stderr)[-1].name == "ckpt-4"
    assert latest_step(tmp_path / "run") == 4
    assert "this worker's validation BLEU 20.00 (chrF 20.00) differs from the chief's 5.00 (5.00)" in worker
    assert "differs from the chief's" not in chief
    records = [json.loads(line) for line in Path(tmp_path / "run" / "metrics.jsonl").open(encoding="utf-8")]
    assert [(r["step"], r["bleu"]) for r in records if r.get("tag") == "validation" and "bleu" in r] == [
        (2, 5.0),
        (4, 5.0),
    ]
