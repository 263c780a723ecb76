"""evaluate.py with other engines: a CTranslate2 export (int8) and an ensemble of run directories."""

import json
import shutil
import sys
from pathlib import Path

import pytest
import sacrebleu

from common.cpu import int8_saturates
from tests.run_fixture import MAX_SENTENCE_NLL, assert_int8_translations, tiny_corpus

ROOT = Path(__file__).resolve().parent.parent


def test_export_ctranslate2_then_evaluate_with_it(tiny_run_dir, tmp_path, capsys, restore_logging):
    """export.py --format ctranslate2 --quantization int8, then evaluate.py --engine ctranslate2: same contract."""
    pytest.importorskip("ctranslate2")
    from tests.test_cli_translate import in_process

    export = tmp_path / "ct2"
    code, captured = in_process("export.py", "--model-dir", tiny_run_dir, "--output", export, "--format",
                                "ctranslate2", "--quantization", "int8", capsys=capsys)  # fmt: skip
    assert code == 0, captured.err[-3000:]
    assert captured.out.strip().splitlines()[-1] == str(export)
    assert "reloaded, a test sentence gives" in captured.err
    metadata = json.loads((export / "nmt_export.json").read_text(encoding="utf-8"))
    assert metadata["quantization"] == "int8" and (export / "spm.model").is_file()

    hypotheses_file = tmp_path / "hyp.txt"
    code, captured = in_process(
        "evaluate.py", "--model-dir", tiny_run_dir, "--split", "test", "--beam", 2, "--alpha", 0,
        "--engine", "ctranslate2", "--engine-dir", export, "--output", hypotheses_file, "--json", capsys=capsys,
    )  # fmt: skip
    assert code == 0, captured.err[-3000:]
    record = json.loads(captured.out.strip().splitlines()[-1])
    hypotheses = hypotheses_file.read_text(encoding="utf-8").splitlines()
    references = [t for _, t in tiny_corpus()["test"]]
    # Memorised with a margin far above int8 rounding where the CPU has VNNI (tests/run_fixture.py); with alpha 0
    # CTranslate2's beam search stops at the best hypothesis (nmt/ctranslate2_engine.py), which the margin makes the
    # reference. Without VNNI int8 saturates (a warning says so) and most references stay.
    assert_int8_translations(hypotheses, references)
    assert record["int8_saturates"] == int8_saturates()
    assert ("CPU without VNNI" in captured.err) == record["int8_saturates"]
    assert record["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score, abs=1e-9)
    assert record["engine"] == "ctranslate2" and record["engine_dir"] == str(export)
    assert record["compute_type"] == "int8_float32" and record["num_sentences"] == len(references)
    assert record["sentences_per_sec"] > 0 and record["beam"] == 2 and record["xla"] is False
    # The loss is the run directory's TensorFlow weights' (those the export was made from), not the engine's.
    assert record["loss_weights"] == metadata["weights"] and 0 < record["loss"] < MAX_SENTENCE_NLL

    # A run directory without weights (config and tokenizer, next to its export): the loss is null, with a note.
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(tiny_run_dir / "config.yaml", bare)
    shutil.copytree(tiny_run_dir / "tokenizer", bare / "tokenizer")
    sys.path.insert(0, str(ROOT))
    import evaluate

    argv = ["--model-dir", str(bare), "--split", "test", "--beam", "2", "--max-sentences", "4", "--json"]
    assert evaluate.main([*argv, "--engine", "ctranslate2", "--engine-dir", str(export)]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out.strip().splitlines()[-1])
    assert (record["loss"], record["perplexity"], record["loss_tokens"]) == (None, None, None)
    assert (
        record["loss_note"].startswith("no TensorFlow weights for the loss: ")
        and "loss_pairs_cut" not in record
    )
    assert "loss           n/a (not measured: no TensorFlow weights)" in captured.err
    assert (
        f"({record['compute_type']}); no TensorFlow weights for the loss: " in captured.err
    )  # not "loss from..."


def test_evaluate_an_ensemble(tiny_run_dir, tmp_path, capsys):
    """A run with itself as its ensemble: the same distribution at every step, so the same translations and loss;
    the record and report name the ensemble. Its usage errors come before TensorFlow loads a model."""
    sys.path.insert(0, str(ROOT))
    import evaluate
    from nmt.cli import CliError

    argv = ["--model-dir", str(tiny_run_dir), *"--split test --beam 2 --max-sentences 12 --json".split()]
    assert evaluate.main([*argv, "--output", str(tmp_path / "alone.txt")]) == 0
    alone = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (
        evaluate.main([*argv, "--output", str(tmp_path / "both.txt"), "--ensemble", str(tiny_run_dir)]) == 0
    )
    captured = capsys.readouterr()
    both = json.loads(captured.out.strip().splitlines()[-1])
    assert both["ensemble"] == [str(tiny_run_dir)] and "ensemble " in captured.err
    said = f"{tiny_run_dir.resolve()} is in the ensemble 2 times: the same model decodes as once, at 2 times the cost"
    assert said in captured.err
    assert (tmp_path / "both.txt").read_text() == (tmp_path / "alone.txt").read_text()
    assert both["bleu"] == alone["bleu"] and both["loss"] == pytest.approx(alone["loss"], rel=1e-4)
    from nmt.run_dir import RunDirError

    ct2 = ["--engine", "ctranslate2", "--engine-dir", str(tmp_path)]
    with pytest.raises(CliError, match="--ensemble needs --engine tensorflow") as raised:
        evaluate.main([*argv, *ct2, "--ensemble", str(tiny_run_dir)])
    assert raised.value.exit_code == 2
    with pytest.raises(RunDirError, match=f"model directory does not exist: {tmp_path / 'missing'}"):
        evaluate.main([*argv, "--ensemble", str(tmp_path / "missing")])
    other = tmp_path / "other"
    shutil.copytree(tiny_run_dir, other)
    (model_file,) = (other / "tokenizer").glob("*.model")
    model_file.write_bytes(model_file.read_bytes() + b" ")  # not loaded: compared before TensorFlow starts
    with pytest.raises(
        CliError, match=f"--ensemble {other} has another tokenizer than --model-dir"
    ) as raised:
        evaluate.main([*argv, "--ensemble", str(other)])
    assert raised.value.exit_code == 2
    reverse = reversed_run(
        tiny_run_dir, tmp_path / "reverse"
    )  # the same joint tokenizer, the other direction
    with pytest.raises(CliError, match=f"--ensemble {reverse} translates de into en, --model-dir") as raised:
        evaluate.main([*argv, "--ensemble", str(reverse)])
    assert raised.value.exit_code == 2
    import translate

    plot = ["--plot-attention", str(tmp_path / "a.svg"), "--ensemble", str(tiny_run_dir)]
    with pytest.raises(CliError, match="--plot-attention shows one model's attention: not with --ensemble"):
        translate.main(["--model-dir", str(tiny_run_dir), *plot])


def reversed_run(run_dir, copy):
    """A copy of a run directory whose config.yaml translates the other way (a joint tokenizer fits both)."""
    import yaml

    shutil.copytree(run_dir, copy)
    tree = yaml.safe_load((copy / "config.yaml").read_text(encoding="utf-8"))
    tree["data"]["source"], tree["data"]["target"] = tree["data"]["target"], tree["data"]["source"]
    (copy / "config.yaml").write_text(yaml.safe_dump(tree, sort_keys=False), encoding="utf-8")
    return copy


def test_a_run_given_twice_with_another_counts_twice_in_the_mean(tiny_run_dir, tmp_path, caplog):
    """`--model-dir a --ensemble b b` is a weighted ensemble (b counts 2/3): said so, not "decodes as once", which
    holds only when every member is the same run (found by a review of 2026-12-07e)."""
    import argparse

    from nmt.cli import check_ensemble

    other = shutil.copytree(tiny_run_dir, tmp_path / "other")
    args = argparse.Namespace(
        model_dir=str(tiny_run_dir), ensemble=[str(other), str(other)], engine="tensorflow"
    )
    with caplog.at_level("WARNING", logger="nmt.cli"):
        check_ensemble(args)
    assert [r.getMessage() for r in caplog.records] == [
        f"{other.resolve()} is in the ensemble 2 times: it counts 2 times in the mean of the members' probabilities"
    ]
