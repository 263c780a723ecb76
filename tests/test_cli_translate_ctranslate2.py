"""translate.py and evaluate.py with `--engine ctranslate2`: usage errors, the export's weights and metadata checked,
and the TensorFlow engine's contract kept (one line per line, warnings, the fixture's sentences)."""

import shutil
import sys
from pathlib import Path

import pytest

from tests.run_fixture import shared_ct2_export, tiny_corpus
from tests.test_cli_translate import cli, in_process, listing


@pytest.fixture(scope="module")
def ct2_export(tiny_run_dir, tmp_path_factory):
    pytest.importorskip("ctranslate2")
    return shared_ct2_export(tiny_run_dir, tmp_path_factory)


@pytest.mark.parametrize(
    "script, args, message",
    [
        ("translate.py", ["--engine", "ctranslate2"], "--engine ctranslate2 needs --engine-dir"),
        ("evaluate.py", ["--engine", "ctranslate2"], "--engine ctranslate2 needs --engine-dir"),
        ("translate.py", ["--engine-dir", "{run}"], "--engine-dir goes with --engine ctranslate2"),
        ("evaluate.py", ["--engine", "ctranslate2", "--engine-dir", "{run}"], "not a CTranslate2 export"),
        ("translate.py", ["--engine", "ctranslate2", "--engine-dir", "{tmp}/nope"], "no such directory"),
        (
            "translate.py",
            ["--engine", "ctranslate2", "--engine-dir", "{tmp}/nope", "--xla", "on", "--no-cache"],
            "--xla and --no-cache go with --engine tensorflow",
        ),
        (
            "translate.py",
            ["--engine", "ctranslate2", "--engine-dir", "{tmp}/nope", "--weights", "best"],
            "--weights best goes with --engine tensorflow",
        ),
        (
            "evaluate.py",
            ["--engine", "ctranslate2", "--engine-dir", "{tmp}/nope", "--weights", "final"],
            "--weights final goes with --engine tensorflow",
        ),
        (
            "translate.py",
            ["--engine", "ctranslate2", "--plot-attention", "{tmp}/a.svg"],
            "--plot-attention needs",
        ),
        ("translate.py", ["--plot-attention", "{tmp}/a.png"], "give a file name ending in .svg"),
        (
            "export.py",
            ["--output", "{tmp}/out", "--quantization", "int8"],
            "--quantization goes with --format",
        ),
        (
            "export.py",
            ["--output", "{tmp}/out", "--format", "ctranslate2", "--beam", "2"],
            "--beam goes with",
        ),
        ("export.py", ["--output", "{run}/config.yaml"], "output exists and is not a directory"),
        ("export.py", ["--output", "{run}/config.yaml/out", "--format", "ctranslate2"], "is not a directory"),
    ],
)
def test_engine_usage_errors_exit_2(script, args, message, tiny_run_dir, tmp_path):
    """Refused before TensorFlow is imported, nothing written (the run directory a non-export engine dir here)."""
    before = listing(tiny_run_dir)
    args = [a.format(run=tiny_run_dir, tmp=tmp_path) for a in args]
    done = cli(script, "--model-dir", tiny_run_dir, *args)
    assert done.returncode == 2, done.stderr.decode()[-2000:]
    last = done.stderr.decode().strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last
    assert listing(tiny_run_dir) == before and list(tmp_path.iterdir()) == []


def sentence_file(folder: Path) -> Path:
    path = folder / "sentence.en"
    path.write_text("The cat sees a ball.\n", encoding="utf-8")
    return path


def test_an_export_of_other_weights_is_refused_a_moved_run_is_not(
    tiny_run_dir, ct2_export, tmp_path, capsys, restore_logging
):
    """The export records its weights' digest: a run directory with the same tokenizer but without those weights
    (another seed, a fine-tuned child; here a copy with one weight changed) is refused, a copy of the same run is
    not."""

    from nmt.ctranslate2_engine import CTranslate2Translator, ExportError

    moved = shutil.copytree(tiny_run_dir, tmp_path / "moved")
    assert CTranslate2Translator.from_run_dir(moved, ct2_export).weights.startswith(str(tiny_run_dir))
    # Other weights in final/ (as another seed's run would hold): one weight changed
    from nmt.checkpoints import save_model_weights
    from nmt.run_models import load_run_models

    _, _, model, _ = load_run_models(moved)
    model.weights[0].assign(model.weights[0] + 1e-3)
    shutil.rmtree(moved / "final")
    save_model_weights(model, moved / "final", 110)
    with pytest.raises(ExportError, match="was made from other weights .* than any stored in"):
        CTranslate2Translator.from_run_dir(moved, ct2_export)
    code, captured = in_process("translate.py", "--model-dir", moved, "--engine", "ctranslate2", "--engine-dir",
                                ct2_export, "--input", sentence_file(tmp_path), capsys=capsys)  # fmt: skip
    assert code == 2 and "export the run directory you translate with" in captured.err
    # An export of this very run's weights, which it no longer holds: said so
    import json

    from nmt.ctranslate2_export import METADATA

    own = shutil.copytree(ct2_export, tmp_path / "own")
    metadata = json.loads((own / METADATA).read_text(encoding="utf-8"))
    metadata["weights"] = str(moved / "final" / Path(metadata["weights"]).name)
    (own / METADATA).write_text(json.dumps(metadata), encoding="utf-8")
    with pytest.raises(ExportError, match=r"which .*moved no longer holds .*export it again"):
        CTranslate2Translator.from_run_dir(moved, own)


def test_a_damaged_export_that_is_still_json_is_one_clear_error(
    tiny_run_dir, ct2_export, tmp_path, capsys, restore_logging
):
    """A length that is not a number: exit 2 before loading; a vocabulary cut short: exit 1 (no traceback)."""
    import json

    from nmt.ctranslate2_export import METADATA

    bad_meta = shutil.copytree(ct2_export, tmp_path / "bad_meta")
    metadata = json.loads((bad_meta / METADATA).read_text(encoding="utf-8"))
    (bad_meta / METADATA).write_text(json.dumps(dict(metadata, position_table="x")), encoding="utf-8")
    short = shutil.copytree(ct2_export, tmp_path / "short")
    vocabulary = next(short.glob("*vocabulary.json"))
    vocabulary.write_text(
        json.dumps(json.loads(vocabulary.read_text(encoding="utf-8"))[:10]), encoding="utf-8"
    )
    for export, code, message in ((bad_meta, 2, "has position_table 'x'"), (short, 1, "vocabulary entries")):
        # (an exception in the main thread would also fail in_process)
        exit_code, captured = in_process("translate.py", "--model-dir", tiny_run_dir, "--engine", "ctranslate2",
                                         "--engine-dir", export, "--input", sentence_file(tmp_path),
                                         capsys=capsys)  # fmt: skip
        assert exit_code == code and message in captured.err, captured.err[-2000:]
        assert "Traceback" not in captured.err


def test_missing_ctranslate2_is_one_clear_error(tiny_run_dir, ct2_export, monkeypatch):
    import translate
    from nmt.cli import CliError

    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # as if it were not installed
    argv = ["--model-dir", str(tiny_run_dir), "--engine", "ctranslate2", "--engine-dir", str(ct2_export)]
    with pytest.raises(CliError, match=r"pip install ctranslate2==4\.8\.5") as err:
        translate.main(argv)
    assert err.value.exit_code == 1


def test_ctranslate2_engine_messy_file(tiny_run_dir, ct2_export, tmp_path, capsys, restore_logging):
    """The TensorFlow engine's contract: one line per line, blank lines blank, warnings, the fixture's sentences."""
    good = [s for s, _ in tiny_corpus()["test"][:3]]
    translations = [t for _, t in tiny_corpus()["test"][:3]]
    lines = [
        good[0].encode(),
        b"",
        b"The cat \xff\xfe sees a ball.",
        " ".join(["word"] * 5000).encode(),
        b"   ",
        good[1].encode() + b"\r",
        good[2].encode(),
    ]
    source = tmp_path / "input.txt"
    source.write_bytes(b"\n".join(lines))
    before = listing(tiny_run_dir), listing(ct2_export)
    args = [
        "--engine",
        "ctranslate2",
        "--engine-dir",
        ct2_export,
        "--input",
        source,
        "--beam",
        2,
        "--nbest",
        2,
    ]
    output = tmp_path / "output.txt"
    code, captured = in_process("translate.py", "--model-dir", tiny_run_dir, *args, "--output", output,
                                capsys=capsys)  # fmt: skip
    stderr = captured.err
    assert code == 0, stderr[-3000:]
    rows = output.read_bytes().decode("utf-8").split("\n")
    assert rows[-1] == "" and len(rows[:-1]) == len(lines)
    assert rows[1] == "" and rows[4] == ""
    for index in (0, 2, 3, 5, 6):
        fields = rows[index].split("\t")
        assert len(fields) == 4 and float(fields[1]) >= float(fields[3])
    assert [rows[i].split("\t")[0] for i in (0, 5, 6)] == translations
    assert "line 3: invalid UTF-8" in stderr
    assert "line 4: " in stderr and "translated only the first 63" in stderr
    assert (listing(tiny_run_dir), listing(ct2_export)) == before
