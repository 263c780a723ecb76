"""ablate.py: two variants trained in-process with the real trainer on a tiny folder corpus, then the report."""

import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.run_fixture import tiny_config_tree, write_corpus

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # ~20 s; the benchmarks' end-to-end run in make test is test_bench's quick run
def test_ablation_of_two_variants_writes_both_tables(tmp_path):
    from benchmarks.ablation import AblationOptions, run_ablation

    config_path = tmp_path / "tiny.yaml"
    config_path.write_text(
        yaml.safe_dump(tiny_config_tree(write_corpus(tmp_path / "corpus"))), encoding="utf-8"
    )
    options = AblationOptions(
        config=str(config_path),
        overrides=["data.bucket_boundaries=[32]"],  # one batch shape: one trace of the training step
        variants=("scale_unscaled", "baseline"),
        budget_minutes=1.0,
        max_steps=3,  # the budget bounds time; tests bound steps too
        root=str(tmp_path / "runs"),
        output=str(tmp_path / "ablations.md"),
        eval_every=2,
        grad_steps=3,
        bleu_sentences=8,
        mask_steps=1,
        mask_fills=("auto", -1.0e9),
        launcher="inprocess",
        command="python ablate.py --test",
    )
    output, failed = run_ablation(options)
    assert failed == []
    text = output.read_text(encoding="utf-8")
    assert "### Claimed" in text and "### Measured" in text
    assert "| baseline |" in text and "| scale_unscaled |" in text
    assert "python ablate.py --test" in text and "Budget: 1 minutes" in text and "CPU" in text
    assert "far from" in text  # the short-budget caveat
    assert "| -1e9 | float16 | NaN" in text  # the classic float16 overflow, measured
    for name in ("baseline", "scale_unscaled"):
        run = tmp_path / "runs" / name
        assert (run / "final").is_dir() and (run / "tensorboard" / "train").is_dir()
        assert yaml.safe_load((run / "config.yaml").read_text())["train"]["seed"] == 1234
        # as train.py keeps it: a resume (--reuse) on another corpus warns
        assert (run / "train_data.json").is_file()
        assert len((tmp_path / "runs" / f"{name}.train.log").read_text().splitlines()) == 1  # the outcome
    assert (
        yaml.safe_load((tmp_path / "runs" / "scale_unscaled" / "config.yaml").read_text())["model"]["scale"]
        == 1.0
    )


def test_run_metrics_reductions():
    from benchmarks.run_metrics import fluctuation, steps_to_loss

    flat = fluctuation([(1, 2.0), (2, 2.0), (3, 2.0)], first_steps=3)
    assert flat["cv"] == 0.0 and flat["step_change"] == 0.0 and flat["max_over_min"] == 1.0
    wild = fluctuation([(1, 1.0), (2, 4.0), (3, 1.0), (50, 100.0)], first_steps=3)
    assert wild["points"] == 3 and wild["step_change"] == pytest.approx((3.0 + 0.75) / 2)
    assert fluctuation([(1, 1.0)], first_steps=3)["cv"] is None
    records = [
        {"step": 10, "loss": 3.0, "elapsed_seconds": 60},
        {"step": 20, "loss": 2.0, "elapsed_seconds": 120},
    ]
    assert steps_to_loss(records, 2.5) == (20, 2.0)
    assert steps_to_loss(records, 1.0) is None


def test_mask_fill_leak_measurement():
    from benchmarks.mask_fill import synthetic_leak

    safe = synthetic_leak("auto", "float16", 1000.0)
    assert safe["leak"] == 0.0 and not safe["nonfinite"] and safe["fully_masked_rows_mass"] == 0.0
    small = synthetic_leak(-1.0e3, "float32", 1000.0)
    assert 0.0 < small["leak"] < 1.0 and small["fully_masked_rows_mass"] == pytest.approx(1.0)
    overflow = synthetic_leak(-1.0e9, "float16", 1.0)
    assert overflow["nonfinite"] and math.isnan(overflow["leak"])


def test_variants_use_existing_config_keys():
    from benchmarks.variants import VARIANTS, resolve_overrides
    from nmt.config import load_config

    base = load_config("base.yaml")
    for variant in VARIANTS:
        load_config(
            "base.yaml", resolve_overrides(variant, base)
        )  # ConfigError on an unknown key or bad type
    over = next(v for v in VARIANTS if v.name == "scale_over")
    assert resolve_overrides(over, base) == ["model.scale=0.015625"]  # 1 / d_head, d_head = 256 / 4


def test_ablate_cli_rejects_unknown_variant(capsys):
    import ablate

    assert ablate.main(["--variants", "baseline,nope"]) == 2
    assert "nope" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--budget", "nan"], "--budget must be a positive number of minutes, got nan"),
        (["--max-steps", "-5"], "--max-steps must be >= 0, got -5"),
        (["--grad-steps", "-3"], "--grad-steps must be >= 0, got -3"),
        (["--variants", ","], "--variants names no variant"),
        (["--output", "/proc/no/report.md"], "--output /proc/no/report.md: cannot write there"),
        (  # before 2026-12-06: silently replaced by the protocol's values (--max-steps 0: no step cap)
            ["--set", "train.max_steps=300", "model.d_model=16"],
            "--set train.max_steps=300: the ablation protocol sets these for every variant (use --max-steps",
        ),
    ],
)
def test_ablate_cli_refuses_bad_options_before_training(tmp_path, capsys, args, message):
    """Checked up front: before, --budget nan failed after the tokenizer was trained, and a report path that
    cannot be written failed after every variant had trained (and lost the report)."""
    import ablate

    root = tmp_path / "runs"
    assert ablate.main(["--quick", "--root", str(root), *args]) == 2
    assert f"ablate.py: {message}" in capsys.readouterr().err
    assert not root.exists()


def test_ablate_cli_refuses_a_root_through_a_file(tmp_path, capsys):
    """--root under (or at) a file: exit 2 naming it, before training (before 2026-12-07c: a FileExistsError
    traceback; found by a review)."""
    import ablate

    (tmp_path / "a-file").write_text("")
    for root in (tmp_path / "a-file", tmp_path / "a-file" / "runs"):
        assert ablate.main(["--quick", "--root", str(root), "--output", str(tmp_path / "r.md")]) == 2
        assert (
            f"ablate.py: --root {root}: {tmp_path / 'a-file'} is a file, not a directory"
            in capsys.readouterr().err
        )


def test_ablate_cli_refuses_a_run_directory_as_root(tmp_path, capsys):
    """--root at a trained run directory: exit 2 before training, its tokenizer kept (before 2026-12-07: replaced
    by the shared one, and the run no longer loaded; found by a review)."""
    import ablate

    run = tmp_path / "run"
    (run / "tokenizer").mkdir(parents=True)
    (run / "config.yaml").write_text("train: {}\n")
    (run / "tokenizer" / "spm.model").write_bytes(b"the run's model")
    assert ablate.main(["--quick", "--root", str(run), "--output", str(tmp_path / "r.md")]) == 2
    assert (
        f"ablate.py: --root {run} is a run directory (it holds config.yaml): give another --root"
        in capsys.readouterr().err
    )
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "tokenizer"]
    assert (run / "tokenizer" / "spm.model").read_bytes() == b"the run's model"


def test_the_shared_tokenizer_replaces_only_one_ablate_made(tmp_path):
    """ROOT/tokenizer without ablate's stamp next to it is not its own: an AblationError naming it, kept as it was;
    one with the stamp of another data config is trained anew (and stamped with this one)."""
    from benchmarks.ablation import AblationError, shared_tokenizer
    from data.tokenizer import Tokenizer
    from nmt.config import config_from_dict

    config = config_from_dict(tiny_config_tree(write_corpus(tmp_path / "corpus")))
    root = tmp_path / "root"
    (root / "tokenizer").mkdir(parents=True)
    (root / "tokenizer" / "spm.model").write_bytes(b"someone else's model")
    with pytest.raises(AblationError) as refused:
        shared_tokenizer(config, root)
    assert str(root / "tokenizer") in str(refused.value) and "give another --root" in str(refused.value)
    assert (root / "tokenizer" / "spm.model").read_bytes() == b"someone else's model"

    # ablate's stamp, for another data config
    (root / "data_config.yaml").write_text("vocab_size: 12345\n")
    assert shared_tokenizer(config, root) == root / "tokenizer"
    assert Tokenizer.load(root / "tokenizer").target_vocab_size == config.data.vocab_size == 64
    assert yaml.safe_load((root / "data_config.yaml").read_text())["vocab_size"] == 64


def test_a_variant_directory_in_use_is_not_removed(tmp_path):
    from benchmarks.ablation import AblationError, fresh_run_dir, resumable
    from nmt.run_dir import RunDir, RunLock

    run = tmp_path / "baseline"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("train: {}\n")
    (run / "checkpoints" / "ckpt-2.index").write_text("")
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    assert resumable(run)  # --reuse resumes it instead of starting again
    with RunLock(RunDir(run)):  # another ablate.py's train.py is training there
        with pytest.raises(AblationError, match="already running"):
            fresh_run_dir(run, tokenizer)
    assert (run / "checkpoints" / "ckpt-2.index").is_file()
    fresh_run_dir(run, tokenizer)  # free: emptied for a new run
    assert sorted(p.name for p in run.iterdir()) == ["tokenizer"] and not resumable(run)


@pytest.mark.slow
def test_ablate_quick_cli_on_multi30k(tmp_path):
    """The CI smoke as a user runs it: train.py subprocesses on configs/tiny.yaml (Multi30k), a few minutes."""
    output = tmp_path / "ablations.md"
    command = [
        sys.executable,
        "ablate.py",
        "--quick",
        "--root",
        str(tmp_path / "runs"),
        "--output",
        str(output),
    ]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    text = output.read_text(encoding="utf-8")
    assert "### Claimed" in text and "### Measured" in text and "| scale_unscaled |" in text


def test_reuse_takes_only_a_run_trained_with_the_settings_asked_for(tmp_path, monkeypatch):
    """ablate.py --reuse compares the run's config.yaml (as train.py saved it: absolute paths) with the variant's
    settings now; before 2026-12-06 any finished run was reused and reported under the new options."""
    from benchmarks.ablation import trained_with
    from nmt.config import absolute_paths, load_config
    from nmt.run_dir import write_atomic

    monkeypatch.chdir(tmp_path)
    overrides = ["data.dataset=folder", "data.folder=corpus", "train.max_steps=10"]
    run_dir = tmp_path / "baseline"
    assert not trained_with(run_dir, load_config("tiny.yaml", overrides))  # nothing there
    run_dir.mkdir()
    write_atomic(run_dir / "config.yaml", absolute_paths(load_config("tiny.yaml", overrides)).to_yaml())
    assert trained_with(run_dir, load_config("tiny.yaml", overrides))
    assert not trained_with(run_dir, load_config("tiny.yaml", [*overrides, "train.max_steps=20"]))
    assert not trained_with(run_dir, load_config("tiny.yaml", [*overrides, "model.d_model=16"]))
