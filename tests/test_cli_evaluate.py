"""evaluate.py --json: its BLEU is sacreBLEU's on the hypotheses file it wrote."""

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu

from nmt.cli import decoding_onednn
from tests.run_fixture import MAX_SENTENCE_NLL, salads, tiny_corpus

ROOT = Path(__file__).resolve().parent.parent


def test_evaluate_json_bleu_equals_sacrebleu_on_its_hypotheses(tiny_run_dir):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    env.pop("TF_ENABLE_ONEDNN_OPTS", None)  # the decoding CLIs' own default: TensorFlow's Eigen kernels
    done = subprocess.run(
        [
            sys.executable,
            "evaluate.py",
            "--model-dir",
            str(tiny_run_dir),
            "--split",
            "test",
            "--beam",
            "2",
            "--batch-size",
            "3",  # several decoding batches: the translations do not depend on how sentences are grouped
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(done.stdout.strip().splitlines()[-1])
    for key in (
        "bleu",
        "chrf",
        "loss",
        "signature",
        "perplexity",
        "bleu_lc_tok",
        "num_sentences",
        "beam",
        "split",
    ):
        assert key in record, key
    # chosen before TensorFlow's import (nmt.cli.decoding_kernels): oneDNN on an AMX CPU, Eigen elsewhere
    assert record["onednn"] is (env.get("TF_ENABLE_ONEDNN_OPTS", decoding_onednn()) == "1")
    hypotheses_file = tiny_run_dir / "hypotheses.test.txt"
    assert record["hypotheses"] == str(hypotheses_file)
    hypotheses = hypotheses_file.read_text(encoding="utf-8").splitlines()
    references = [t for _, t in tiny_corpus()["test"]]
    assert len(hypotheses) == len(references) == record["num_sentences"]
    # The fixture memorised the test split (tests/run_fixture.py): beam search reproduces it on any CPU. So the
    # hypotheses file holds the references, and BLEU/chrF must be sacreBLEU's on exactly those lines.
    assert hypotheses == references
    assert record["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score, abs=1e-9)
    assert record["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score, abs=1e-9)
    assert record["beam"] == 2 and record["split"] == "test"
    assert 0 < record["loss"] < MAX_SENTENCE_NLL
    assert record["perplexity"] == pytest.approx(math.exp(record["loss"]), rel=1e-6)
    assert "nrefs:1|case:mixed|eff:no|tok:13a" in record["signature"]


def test_evaluate_searches_with_its_beam_and_alpha_and_scores_as_sacrebleu(
    tiny_run_dir, tmp_path, capsys, restore_logging
):
    """--beam 4 --alpha 3 on unseen word salads translates as the Translator API with beam 4 and eval.alpha = 3 (in
    this process), which differs from the run's own eval.beam_size (2) and eval.alpha (0.6): a --beam or --alpha that
    did not reach the search would fail. The references are those translations lowercased without punctuation: the
    BLEU, chrF and lowercased BLEU are sacreBLEU's on imperfect hypotheses (on perfect ones any metric gives 100)."""
    import dataclasses

    from nmt.translator import Translator
    from tests.test_cli_translate import in_process

    lines = salads(40, seed=5)
    translator = Translator.from_run_dir(tiny_run_dir, xla=False)
    configured = translator.translate(lines)
    beam_only = translator.translate(lines, beam_size=4)
    translator.eval_config = dataclasses.replace(translator.eval_config, alpha=3.0)
    alpha_only = translator.translate(lines)
    expected = translator.translate(lines, beam_size=4)
    assert expected not in (configured, beam_only, alpha_only)
    # cased and punctuated German on one side only: BLEU, chrF and the lowercased BLEU all fall short of 100
    references = [re.sub(r"[^\w\s]", "", h).lower() for h in expected]
    source, reference, output = tmp_path / "salads.en", tmp_path / "salads.de", tmp_path / "hyp.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    reference.write_text("\n".join(references) + "\n", encoding="utf-8")
    code, captured = in_process(
        "evaluate.py", "--model-dir", tiny_run_dir, "--source", source, "--reference", reference, "--output", output,
        "--beam", 4, "--alpha", 3.0, "--xla", "off", "--json", capsys=capsys,
    )  # fmt: skip
    assert code == 0, captured.err[-3000:]
    record = json.loads(captured.out.strip().splitlines()[-1])
    hypotheses = output.read_text(encoding="utf-8").splitlines()
    assert hypotheses == expected and record["beam"] == 4 and record["num_sentences"] == len(lines)
    bleu = sacrebleu.corpus_bleu(hypotheses, [references], tokenize="13a").score
    chrf = sacrebleu.corpus_chrf(hypotheses, [references]).score
    bleu_lc = sacrebleu.corpus_bleu(hypotheses, [references], tokenize="13a", lowercase=True).score
    assert 0 < bleu < bleu_lc < 100 and 0 < chrf < 100
    assert record["bleu"] == pytest.approx(bleu, abs=1e-9)
    assert record["chrf"] == pytest.approx(chrf, abs=1e-9)
    assert record["bleu_lc_tok"] == pytest.approx(bleu_lc, abs=1e-9)


def test_evaluate_refuses_a_batch_size_below_one(tiny_run_dir):
    sys.path.insert(0, str(ROOT))
    import evaluate
    from nmt.cli import CliError

    with pytest.raises(CliError, match="--batch-size must be at least 1, got 0") as caught:
        evaluate.main(["--model-dir", str(tiny_run_dir), "--batch-size", "0"])
    assert caught.value.exit_code == 2


@pytest.mark.parametrize(
    "option, message",
    [
        (["--beam", "0"], "--beam must be between 1 and 1024, got 0"),
        (["--alpha", "-1"], "--alpha must be"),
        (["--beam", "1", "--alpha", "0.6"], "--alpha is the beam search's length penalty"),
    ],
)
def test_evaluate_refuses_a_search_setting_out_of_range(tiny_run_dir, option, message):
    sys.path.insert(0, str(ROOT))
    import evaluate
    from nmt.cli import CliError

    with pytest.raises(CliError, match=message) as caught:
        evaluate.main(["--model-dir", str(tiny_run_dir), *option])
    assert caught.value.exit_code == 2


def test_evaluate_never_overwrites_its_reference_and_needs_a_stdout(tiny_run_dir, tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT))
    import evaluate
    from nmt.cli import CliError
    from nmt.cli_files import check_distinct_files

    source, reference = tmp_path / "src.txt", tmp_path / "ref.txt"
    source.write_text("a cat\n")
    reference.write_text("eine katze\n")
    files = ["--model-dir", str(tiny_run_dir), "--source", str(source), "--reference", str(reference)]
    with pytest.raises(CliError, match="--reference and --output are the same file") as caught:
        evaluate.main([*files, "--output", str(reference)])
    assert caught.value.exit_code == 2 and reference.read_text() == "eine katze\n"
    copy = ["--model-dir", str(tiny_run_dir), "--source", str(source), "--reference", str(source)]
    with pytest.raises(CliError, match="--source and --output are the same file"):
        evaluate.main([*copy, "--output", str(source)])
    check_distinct_files(
        {"--source": str(source), "--reference": str(source)}, {"--output": None}
    )  # two inputs
    monkeypatch.setattr(sys, "stdout", None)  # `>&-`: the report would be lost
    with pytest.raises(CliError, match="standard output is closed: evaluate.py prints its report there"):
        evaluate.main(files)


@pytest.mark.parametrize(
    "weights, message",
    [("average", r"no average: train.average_last is 0 \(at least 2\)"), ("ema", "no EMA: trained with")],
)
def test_evaluate_names_a_candidate_the_run_does_not_have(tiny_run_dir, weights, message):
    sys.path.insert(0, str(ROOT))
    import evaluate
    from nmt.run_dir import RunDirError

    with pytest.raises(RunDirError, match=message):  # cli.run: exit code 1 with the message
        evaluate.main(["--model-dir", str(tiny_run_dir), "--weights", weights, "--max-sentences", "1"])


def test_evaluate_refuses_negative_streams(tiny_run_dir):
    sys.path.insert(0, str(ROOT))
    import evaluate
    from nmt.cli import CliError

    with pytest.raises(CliError, match=r"--streams must be >= 0 \(0 = auto\), got -1") as caught:
        evaluate.main(["--model-dir", str(tiny_run_dir), "--streams", "-1"])
    assert caught.value.exit_code == 2


@pytest.mark.parametrize(
    "source", [pytest.param("/dev/stdin", marks=pytest.mark.slow), "-"]
)  # a pipe given as a path (/dev/stdin, <(...)): make test keeps translate.py's, through the same helpers
# (nmt.text_io.count_lines_if_file, nmt.cli_files.check_input_file); "-" takes stdin without them
def test_evaluate_reads_a_pipe_once(source, tiny_run_dir, tmp_path):
    """--source from a pipe (/dev/stdin here, as <(...)) is not read twice; "-" is stdin; a BOM is dropped."""
    pairs = tiny_corpus()["test"][:4]
    reference, output = tmp_path / "ref.de", tmp_path / "hyp.txt"
    reference.write_bytes(b"\xef\xbb\xbf" + "".join(f"{t}\n" for _, t in pairs).encode())
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(
        [sys.executable, "evaluate.py", "--model-dir", str(tiny_run_dir), "--beam", "1", "--json"]
        + ["--source", source, "--reference", str(reference), "--output", str(output)],
        input="".join(f"{s}\n" for s, _ in pairs).encode(),
        capture_output=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    record = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert output.read_text(encoding="utf-8").splitlines() == [t for _, t in pairs]
    assert record["num_sentences"] == 4 and record["bleu"] == pytest.approx(100.0) and record["beam"] == 1


def test_evaluate_refuses_empty_files_with_a_usage_error(tiny_run_dir, tmp_path):
    sys.path.insert(0, str(ROOT))
    import evaluate
    from nmt.cli import CliError

    source, reference = tmp_path / "e0.en", tmp_path / "e0.de"
    source.write_bytes(b"")
    reference.write_bytes(b"")
    argv = ["--model-dir", str(tiny_run_dir), "--source", str(source), "--reference", str(reference)]
    with pytest.raises(CliError, match="nothing to evaluate: e0.en has no sentences") as caught:
        evaluate.main([*argv, "--output", str(tmp_path / "hyp.txt")])
    assert caught.value.exit_code == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e0.de", "e0.en"]
    with pytest.raises(CliError, match="--split test and --source are alternatives") as caught:
        evaluate.main([*argv, "--split", "test"])  # was ignored: the file was evaluated, labelled by its name
    assert caught.value.exit_code == 2


def test_evaluate_refuses_an_unknown_split_with_a_usage_error(tiny_run_dir, monkeypatch):
    """Before a model is loaded (a big model takes a while to load; before 2026-12-07 it loaded first)."""
    sys.path.insert(0, str(ROOT))
    import evaluate
    import nmt.run_models
    from nmt.cli import CliError

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the split was checked")

    monkeypatch.setattr(nmt.run_models, "_load_run", no_model)
    with pytest.raises(CliError, match="split 'bogus' is not in dataset") as caught:
        evaluate.main(["--model-dir", str(tiny_run_dir), "--split", "bogus"])
    assert caught.value.exit_code == 2


def test_evaluate_refuses_a_slice_it_cannot_read_with_a_usage_error_before_loading_a_model(
    tiny_run_dir, tmp_path, monkeypatch
):
    """A TFDS split's malformed or out-of-range slice (before 2026-12-07, a traceback once the model had loaded),
    and any slice of a folder corpus (it has no slicing: before, an error once the model had loaded)."""
    import yaml

    sys.path.insert(0, str(ROOT))
    import evaluate
    import nmt.run_models
    from nmt.cli import CliError
    from tests.data.conftest import SIZES, write_mirror

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the split was checked")

    monkeypatch.setattr(nmt.run_models, "_load_run", no_model)
    with pytest.raises(
        CliError, match=r"split 'test\[:5\]' is not in dataset 'folder' .*no slicing"
    ) as caught:
        evaluate.main(["--model-dir", str(tiny_run_dir), "--split", "test[:5]"])
    assert caught.value.exit_code == 2

    # the run, as if trained on Multi30k (a fake mirror, prepared offline)
    run = tmp_path / "run"
    shutil.copytree(tiny_run_dir, run)
    tree = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    tree["data"].update(
        dataset="multi30k",
        folder=None,
        manual_dir=str(write_mirror(tmp_path / "mirror", languages=("en", "de"))),
        data_dir=str(tmp_path / "tfds"),
    )
    (run / "config.yaml").write_text(yaml.safe_dump(tree, sort_keys=False), encoding="utf-8")
    size = SIZES["test_2016_flickr"]
    for split, message in (
        (
            "test[:abc]",
            r"^split 'test\[:abc\]' of dataset 'multi30k' cannot be read: Unrecognized split format",
        ),
        (
            "test[50:]",
            rf"^split 'test\[50:\]' .*: Requested slice \[50:{size}\] incompatible with {size} examples",
        ),
    ):
        with pytest.raises(CliError, match=message) as caught:
            evaluate.main(["--model-dir", str(run), "--split", split])
        assert caught.value.exit_code == 2


def test_evaluate_refuses_an_unwritable_output_folder_before_any_work(tiny_run_dir, tmp_path, monkeypatch):
    """Said before the model loads, not after a whole decode (root may write anywhere: the folders are made
    unwritable by `os.access`'s answer)."""
    sys.path.insert(0, str(ROOT))
    import evaluate
    from nmt.cli import CliError

    locked = {str(tiny_run_dir), str(tmp_path)}
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: str(path) not in locked and real_access(path, mode))
    with pytest.raises(
        CliError, match=f"--model-dir .*give --output FILE elsewhere.* is not writable: {tiny_run_dir}"
    ) as caught:
        evaluate.main(["--model-dir", str(tiny_run_dir), "--split", "test"])
    assert caught.value.exit_code == 2
    with pytest.raises(CliError, match=f"--output folder is not writable: {tmp_path}") as caught:
        evaluate.main(["--model-dir", str(tiny_run_dir), "--output", str(tmp_path / "hyp.txt")])
    assert caught.value.exit_code == 2
    assert not (tmp_path / "hyp.txt").exists()


def test_evaluate_prints_its_scores_when_the_hypotheses_cannot_be_written(
    tiny_run_dir, capsys, restore_logging
):
    """A full disk after the decode (/dev/full: every write fails with ENOSPC): the scores are printed, the run
    exits 1 naming the file."""
    from tests.test_cli_translate import in_process

    code, captured = in_process(
        "evaluate.py", "--model-dir", tiny_run_dir, "--split", "test", "--max-sentences", 3, "--output",
        "/dev/full", "--json", capsys=capsys,
    )  # fmt: skip
    assert code == 1, captured.err[-3000:]
    record = json.loads(captured.out.strip().splitlines()[-1])
    assert record["num_sentences"] == 3 and record["bleu"] is not None and record["hypotheses"] is None
    assert "/dev/full" in record["hypotheses_error"] and "No space left" in record["hypotheses_error"]
    assert "hypotheses     NOT WRITTEN: /dev/full" in captured.err
    assert "error: the hypotheses were not written: /dev/full" in captured.err


def test_evaluate_on_a_folder_split_scores_every_line_as_sacrebleu_does_on_the_files(
    tiny_run_dir, tmp_path, capsys, restore_logging
):
    """A blank source line in the test split: translated "" and scored, not dropped (the BLEU is sacreBLEU's on the
    split's own reference file; before, the pair was left out and the BLEU was higher)."""
    import yaml

    from tests.test_cli_translate import in_process

    run = shutil.copytree(tiny_run_dir, tmp_path / "run")
    config = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    corpus = shutil.copytree(config["data"]["folder"], tmp_path / "corpus")
    source_file = corpus / f"{config['data']['source']}.test.txt"
    lines = source_file.read_text(encoding="utf-8").splitlines()
    lines[2] = ""
    source_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    config_text = (run / "config.yaml").read_text(encoding="utf-8")
    (run / "config.yaml").write_text(
        config_text.replace(config["data"]["folder"], str(corpus)), encoding="utf-8"
    )
    code, captured = in_process(
        "evaluate.py", "--model-dir", run, "--split", "test", "--json", capsys=capsys
    )  # fmt: skip
    assert code == 0, captured.err[-3000:]
    record = json.loads(captured.out.strip().splitlines()[-1])
    hypotheses = (run / "hypotheses.test.txt").read_text(encoding="utf-8").split("\n")[:-1]
    references = (corpus / f"{config['data']['target']}.test.txt").read_text(encoding="utf-8").splitlines()
    assert len(hypotheses) == len(references) == len(lines) == record["num_sentences"]
    assert hypotheses[2] == "" and references[2]
    assert record["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score, abs=1e-9)
    assert record["bleu"] < 100.0  # the memorised split, but one hypothesis is empty
