"""End to end, as a user runs it: train.py -> evaluate.py -> translate.py on a tiny corpus (part of `make test`).

The run directory written by train.py must be all that evaluate and translate need, and its contents must be what
the run did: `best/` holds the weights of the best validation BLEU, `final/` the average or the last weights as
the log says, `metrics.jsonl` one record per evaluation, and evaluate.py recomputes the final record's loss and
greedy BLEU from `final/`; translate.py gives the very hypotheses evaluate.py scored. Nothing here depends on
how good the tiny model is (its BLEU is whatever this CPU's float trajectory gives): only on consistency.
"""

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
import yaml

from tests.run_fixture import tiny_config_tree, tiny_corpus, write_corpus

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e
STEPS, EVAL_EVERY, BLEU_EVERY, CHECKPOINT_EVERY = 60, 20, 40, 20


def run(args, **kwargs):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    try:  # a deadline only against a hang (a tiny run takes ~20 s idle)
        return subprocess.run(
            [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, **kwargs
        )
    except subprocess.TimeoutExpired as err:
        raise AssertionError(f"hang: {' '.join(map(str, args))} killed after 900 s") from err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    tree = tiny_config_tree(write_corpus(tmp / "corpus"))
    tree["train"] = {
        "max_steps": STEPS,
        "warmup_steps": 10,
        "learning_rate": 0.01,
        "precision": "float32",
        "checkpoint_every": CHECKPOINT_EVERY,
        "eval_every": EVAL_EVERY,
        "bleu_every": BLEU_EVERY,
        "log_every": 10,
        "average_last": 2,
    }
    config = tmp / "tiny.yaml"
    config.write_text(yaml.safe_dump(tree), encoding="utf-8")
    model_dir = tmp / "run"
    result = run(["train.py", "--config", str(config), "--model-dir", str(model_dir)])
    assert result.returncode == 0, result.stderr[-3000:]
    return model_dir, result.stderr


def metrics(model_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]


def weights_of(model_dir: Path, prefixes: list[str]) -> list[list[np.ndarray]]:
    """The model weights stored in each checkpoint prefix (weights-only or training checkpoints alike)."""
    from nmt.checkpoints import restore_model_weights
    from nmt.translator import Translator

    model = Translator.from_run_dir(model_dir, weights="latest").model
    values = []
    for prefix in prefixes:
        restore_model_weights(model, prefix)
        values.append([w.numpy() for w in model.weights])
    return values


def assert_same_weights(actual: list[np.ndarray], expected: list[np.ndarray], what: str) -> None:
    assert len(actual) == len(expected) > 5
    assert all(np.array_equal(a, e) for a, e in zip(actual, expected)), what


def test_train_writes_a_self_describing_run_directory(trained):
    model_dir, stderr = trained
    for name in ("config.yaml", "tokenizer/spm.model", "checkpoints/checkpoint", "final/checkpoint", "best"):
        assert (model_dir / name).exists(), name
    assert any((model_dir / "tensorboard" / "train").iterdir())
    assert "training compiled the step" in stderr

    # One record per evaluation: loss every EVAL_EVERY steps, greedy BLEU every BLEU_EVERY, both at the last step
    # (60, off the BLEU schedule: its weights compete for best/), the final one with both.
    records = metrics(model_dir)
    assert [(r["step"], r["tag"], "bleu" in r) for r in records] == [
        (20, "validation", False),
        (40, "validation", True),
        (60, "validation", True),
        (60, "final", True),
    ]
    assert len({r["tokens"] for r in records}) == 1 and records[0]["tokens"] > 0  # the same validation set
    for record in records:
        assert record["perplexity"] == pytest.approx(math.exp(record["loss"]), rel=1e-9)

    from nmt.run_dir import RunDir

    run = RunDir(model_dir)
    latest = run.weights_prefix("latest")
    assert latest.endswith(f"ckpt-{STEPS}")
    checkpoint = {step: str(model_dir / "checkpoints" / f"ckpt-{step}") for step in (40, STEPS)}
    best, final, at_40, at_60 = weights_of(
        model_dir,
        [run.weights_prefix("best"), run.weights_prefix("final"), checkpoint[40], checkpoint[STEPS]],
    )

    # best/ holds the weights of the best BLEU evaluation before the final one (40 or 60; the first of equals: a
    # later one replaces it only if strictly better).
    scored = [r for r in records if r["tag"] == "validation" and "bleu" in r]
    best_step = max(scored, key=lambda r: (r["bleu"], -r["step"]))["step"]
    assert run.weights_prefix("best").endswith(f"ckpt-{best_step}")
    assert_same_weights(
        best, at_40 if best_step == 40 else at_60, f"best/ is not the step-{best_step} weights"
    )

    # final/ is the average of the last 2 checkpoints (40 and 60) if that lowered the validation loss, else the
    # last weights, as the log says; the final record's loss is that of final/.
    kept = re.search(
        r"final weights: average of 2 checkpoints .*validation loss ([\d.]+) \(last ([\d.]+)\)", stderr
    )
    rejected = re.search(
        r"the average of 2 checkpoints had a higher validation loss \(([\d.]+) > ([\d.]+)\)", stderr
    )
    assert bool(kept) != bool(rejected), stderr[-2000:]
    average, last = map(float, (kept or rejected).groups())
    assert records[-1]["loss"] == pytest.approx(min(average, last), abs=1e-4)
    mean = [((a.astype(np.float64) + b.astype(np.float64)) / 2).astype(a.dtype) for a, b in zip(at_40, at_60)]
    if kept:
        assert_same_weights(final, mean, "final/ is not the average of checkpoints 40 and 60")
    else:
        assert_same_weights(final, at_60, "final/ is not the last weights")
    assert not all(np.array_equal(a, b) for a, b in zip(at_40, at_60))  # the two candidates do differ
    # --weights average makes the mean again from the training checkpoints (no window here), whichever final/ kept
    from nmt.translator import Translator

    averaged = Translator.from_run_dir(model_dir, weights="average")
    assert_same_weights([w.numpy() for w in averaged.model.weights], mean, "--weights average")
    assert averaged.weights.startswith("average of 2 checkpoints") and averaged.weights.endswith("ckpt-60)")


@pytest.mark.slow  # ~19 s; resume stays in make test (tests/faults/test_graceful_stop.py, tests/nmt/test_budget_runs.py)
def test_rerun_resumes_and_says_so(trained, tmp_path):
    """On a copy: the other tests read the original run at step 60."""
    model_dir = tmp_path / "run"
    shutil.copytree(trained[0], model_dir)
    config = model_dir / "config.yaml"
    result = run(
        ["train.py", "--config", str(config), "--model-dir", str(model_dir), "--set", "train.max_steps=70"]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming {model_dir} from step 60" in result.stderr
    assert "finished at step 70" in result.stderr
    records = metrics(model_dir)
    assert [(r["step"], r["tag"]) for r in records[4:]] == [(70, "validation"), (70, "final")]  # appended


@pytest.fixture(scope="module")
def evaluated(trained, tmp_path_factory):
    """evaluate.py --json on the validation split with greedy search: (record, hypotheses file lines)."""
    model_dir, _ = trained
    hypotheses = tmp_path_factory.mktemp("evaluate") / "hyp.txt"
    result = run(
        ["evaluate.py", "--model-dir", str(model_dir), "--split", "validation", "--beam", "1", "--json",
         "--output", str(hypotheses)]
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(result.stdout.strip().splitlines()[-1])
    return record, hypotheses.read_text(encoding="utf-8").splitlines()


def test_evaluate_json_matches_sacrebleu_and_the_training_metrics(trained, evaluated):
    model_dir, _ = trained
    record, lines = evaluated
    references = [target for _, target in tiny_corpus()["validation"]]
    assert len(lines) == len(references) == record["num_sentences"]
    # sacreBLEU's own scores of the tiny model's imperfect hypotheses (the training's metrics below are no reference
    # for chrF: they come from the same nmt.scores)
    assert record["bleu"] == pytest.approx(
        sacrebleu.corpus_bleu(lines, [references], tokenize="13a").score, abs=1e-9
    )
    assert record["chrf"] == pytest.approx(sacrebleu.corpus_chrf(lines, [references]).score, abs=1e-9)
    bleu_lc = sacrebleu.corpus_bleu(lines, [references], tokenize="13a", lowercase=True).score
    assert record["bleu_lc_tok"] == pytest.approx(bleu_lc, abs=1e-9)
    assert record["weights"] == str(model_dir / "final" / f"ckpt-{STEPS}")

    # The same weights (final/), the same split, the same greedy search as the training's final evaluation: the
    # same loss (up to float summation order) and the same BLEU and chrF.
    final = metrics(model_dir)[-1]
    assert final["tag"] == "final" and final["step"] == STEPS
    assert record["loss"] == pytest.approx(final["loss"], rel=1e-6)
    assert record["bleu"] == pytest.approx(final["bleu"], abs=1e-9)
    assert record["chrf"] == pytest.approx(final["chrf"], abs=1e-9)


def test_translate_gives_what_evaluate_scored_line_for_line(trained, evaluated):
    """translate.py on the validation sources, with blank lines added, from stdin to stdout."""
    model_dir, _ = trained
    _, hypotheses = evaluated
    sources = [source for source, _ in tiny_corpus()["validation"]]
    lines = [sources[0], "", *sources[1:], ""]
    result = run(
        ["translate.py", "--model-dir", str(model_dir), "--beam", "1"], input="\n".join(lines) + "\n"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout.split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines)
    assert out[:-1] == [hypotheses[0], "", *hypotheses[1:], ""]
