"""End to end, as a user runs it: train.py -> evaluate.py -> translate.py on a tiny corpus (part of `make test`).

The run directory written by train.py must be all that evaluate and translate need; the metrics it writes must be
consistent with what evaluate.py recomputes from the same weights.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
import yaml

from tests.run_fixture import tiny_config_tree, tiny_corpus, write_corpus

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e


def run(args, **kwargs):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, **kwargs
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    tree = tiny_config_tree(write_corpus(tmp / "corpus"))
    tree["train"] = {
        "max_steps": 60,
        "warmup_steps": 10,
        "learning_rate": 0.01,
        "precision": "float32",
        "checkpoint_every": 20,
        "eval_every": 20,
        "bleu_every": 40,
        "log_every": 10,
        "average_last": 2,
    }
    config = tmp / "tiny.yaml"
    config.write_text(yaml.safe_dump(tree), encoding="utf-8")
    model_dir = tmp / "run"
    result = run(["train.py", "--config", str(config), "--model-dir", str(model_dir)])
    assert result.returncode == 0, result.stderr[-3000:]
    return model_dir, result.stderr


def test_train_writes_a_self_describing_run_directory(trained):
    model_dir, stderr = trained
    for name in ("config.yaml", "tokenizer/spm.model", "checkpoints/checkpoint", "final/checkpoint", "best"):
        assert (model_dir / name).exists(), name
    assert any((model_dir / "tensorboard" / "train").iterdir())
    records = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [20, 40, 60]
    assert records[-1]["tag"] == "final" and "bleu" in records[-1] and "bleu" in records[1]
    assert records[-1]["loss"] < records[0]["loss"]  # it learned
    # The average of the last 2 checkpoints is kept only if it does not raise validation loss.
    kept = re.search(
        r"final weights: average of 2 checkpoints .*validation loss ([\d.]+) \(last ([\d.]+)\)", stderr
    )
    rejected = re.search(
        r"the average of 2 checkpoints had a higher validation loss \(([\d.]+) > ([\d.]+)\)", stderr
    )
    assert bool(kept) != bool(rejected), stderr[-2000:]
    average, last = map(float, (kept or rejected).groups())
    assert records[-1]["loss"] == pytest.approx(min(average, last), abs=1e-4)
    assert "training compiled the step" in stderr


def test_rerun_resumes_and_says_so(trained, tmp_path):
    model_dir, _ = trained
    config = model_dir / "config.yaml"
    result = run(
        ["train.py", "--config", str(config), "--model-dir", str(model_dir), "--set", "train.max_steps=70"]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming" in result.stderr and "from step 60" in result.stderr
    assert "finished at step 70" in result.stderr


def test_evaluate_json_matches_sacrebleu_and_the_training_metrics(trained, tmp_path):
    model_dir, _ = trained
    hypotheses = tmp_path / "hyp.txt"
    result = run(
        [
            "evaluate.py",
            "--model-dir",
            str(model_dir),
            "--split",
            "test",
            "--beam",
            "2",
            "--json",
            "--output",
            str(hypotheses),
        ]  # fmt: skip
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(result.stdout.strip().splitlines()[-1])
    references = [target for _, target in tiny_corpus()["test"]]
    lines = hypotheses.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(references)
    assert record["bleu"] == pytest.approx(sacrebleu.corpus_bleu(lines, [references]).score, abs=1e-9)
    assert {"bleu", "chrf", "loss", "signature"} <= record.keys()


def test_translate_stdin_to_stdout_line_for_line(trained):
    model_dir, _ = trained
    lines = ["The cat sees the ball.", "", "A dog has a hat today."]
    result = run(["translate.py", "--model-dir", str(model_dir)], input="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout.split("\n")[:-1]
    assert len(out) == 3 and out[1] == "" and out[0] and out[2]
