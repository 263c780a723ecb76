"""train.py's argument parsing: `--set` takes one or several overrides, repeatable, in order."""

import subprocess
import sys
from pathlib import Path

import train

ROOT = Path(__file__).resolve().parents[1]


def test_set_takes_several_values_and_repeats_in_order():
    args = train.parse_args(
        [
            "--config",
            "tiny.yaml",
            "--set",
            "train.max_steps=5",
            "data.batch_tokens=64",
            "--set",
            "train.seed=3",
        ]
    )
    assert args.overrides == ["train.max_steps=5", "data.batch_tokens=64", "train.seed=3"]
    assert train.parse_args(["--config", "tiny.yaml"]).overrides == []


def test_bad_override_exits_2_and_writes_nothing(tmp_path):
    model_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "train.py", "--config", "tiny.yaml", "--model-dir", str(model_dir),
         "--set", "train.max_steps=5", "model.no_such_key=1"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,  # against a hang only: it exits before TensorFlow
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith(
        "train.py: config error: unknown config key model.no_such_key (known keys"
    )
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not model_dir.exists()
