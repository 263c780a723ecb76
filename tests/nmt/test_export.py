"""Export: the SavedModel, loaded by plain TensorFlow, translates exactly like the run directory."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tensorflow as tf

from nmt.batch_decoding import MAX_CHARS_GROWTH
from nmt.export import export_run_dir, export_saved_model, load_exported
from nmt.translator import Translator
from tests.run_fixture import tiny_corpus


@pytest.fixture(scope="module")
def shared_export(tiny_run_dir, tmp_path_factory):
    """(output, TranslationModule) of one export_run_dir; the other tests save its module again (its `serve` is
    traced once) instead of loading the run and tracing the search for each export."""
    return export_run_dir(tiny_run_dir, tmp_path_factory.mktemp("export") / "export", beam_size=2)


def test_exported_model_matches_the_run_dir(tiny_run_dir, shared_export, tmp_path):
    pairs = (tiny_corpus()["validation"] + tiny_corpus()["test"])[:48]
    lines = [s for s, _ in pairs] + ["", "The cat sees " * 30, "\xa0", "\u3000 \u2003", "\x1c\x85"]
    translator = Translator.from_run_dir(tiny_run_dir)
    # A run of unknown characters (one <unk> piece) beyond the Translator's bound on the characters tokenized, then
    # a sentence: the Translator keeps the start, and so does the SavedModel (before 2026-12-07d it tokenized the
    # whole input, the sentence too, and without a bound on memory: 650 MB for a 4 MB input).
    limit = MAX_CHARS_GROWTH * translator.tokenizer.source_chars_for(translator.max_source_length)
    lines.append("\U0001f600" * (limit + 1) + " " + pairs[0][0])
    output, module = shared_export
    assert (output / "saved_model.pb").is_file() and module.beam_size == 2
    assert any((output / "assets").glob("*.model"))  # the SentencePiece model travels with the SavedModel

    # Plain TensorFlow in a fresh process, outside the repository: no project code involved.
    script = textwrap.dedent(
        f"""
        import json, sys
        import tensorflow as tf
        import tensorflow_text  # noqa: F401
        serve = tf.saved_model.load({str(output)!r}).signatures["serving_default"]
        lines = json.loads(sys.stdin.read())
        outputs = serve(inputs=tf.constant(lines, tf.string))
        print(json.dumps([o.decode("utf-8") for o in outputs["outputs"].numpy()]))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(lines),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    exported = json.loads(done.stdout.strip().splitlines()[-1])

    expected = translator.translate(lines, beam_size=2)
    assert exported == [t.strip() for t in expected]  # as translate.py writes them
    # The fixture reproduces its memorised sentences on any CPU, so both sides are right, not just equal.
    assert exported[:48] == [t for _, t in pairs]
    # the long line 49: truncated alike on both sides (compared above, never judged)
    assert exported[48] == ""
    assert exported[50:53] == ["", "", ""]  # Unicode whitespace is blank, as Python's strip() says
    assert exported[53] != pairs[0][1]  # the sentence after the bound is not translated


def test_blank_is_pythons_whitespace_on_every_code_point():
    """The SavedModel's test for a blank line against `str.isspace` (what Translator's `line.strip()` removes)."""
    from nmt.export import BLANK

    chars = [chr(c) for c in range(0x10000) if not 0xD800 <= c < 0xE000]  # Python's 29 are all in the BMP
    blank = tf.strings.regex_full_match(tf.constant(chars), BLANK).numpy()
    assert [c for c, b in zip(chars, blank) if b != c.isspace()] == []
    assert sum(blank) == 29  # all of Python 3.11's whitespace characters: the comparison had them all
    lines = ["", " \t\xa0\u3000\n", "\u200b", "a ", "\x1c\x1d\x1e\x1f\x85\u2028"]
    assert list(tf.strings.regex_full_match(lines, BLANK).numpy()) == [not line.strip() for line in lines]


def test_the_savedmodel_strips_its_outputs_as_python_does():
    """`strip_blanks` (what `serve` does to each translation: translate.py's output line has no surrounding
    whitespace, where a final "▁" piece detokenizes to a trailing space) against `str.strip`."""
    from nmt.export import strip_blanks

    texts = [
        "",
        " ",
        "a ",
        " a",
        "\u3000a b\xa0\n",
        "a\u200b ",
        "\x85a\x1c b\u2028",
        "ein Hund",
        "a  b  ",
        "\t\t",
    ]
    assert [t.decode() for t in strip_blanks(tf.constant(texts)).numpy()] == [t.strip() for t in texts]


def test_the_savedmodel_reads_invalid_utf8_as_translate_py_does(shared_export, tiny_run_dir):
    """Invalid UTF-8 is U+FFFD to both (translate.py decodes files with errors="replace"), before and beyond the
    bound on the characters tokenized (before 2026-12-07d the SavedModel counted a stray continuation byte as no
    character: 49,152 of them and a sentence were all tokenized, where translate.py kept only <unk>)."""
    _, module = shared_export
    sentence = tiny_corpus()["test"][0][0].encode()
    lines = [
        sentence[:5] + b"\xff" + sentence[5:],
        b"\xc3" + sentence,
        b"\x80" * module.max_chars + b" " + sentence,
        b"\xe2\x82" * module.max_chars + b" " + sentence,
    ]
    got = [t.decode() for t in module.serve(tf.constant(lines))["outputs"].numpy()]
    expected = Translator.from_run_dir(tiny_run_dir).translate(
        [line.decode("utf-8", "replace") for line in lines], beam_size=2
    )
    assert got == [t.strip() for t in expected]


def test_export_refuses_to_overwrite_something_else(shared_export, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a SavedModel"):
        export_saved_model(shared_export[1], tmp_path / "taken")
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("format_", ["savedmodel", "ctranslate2"])
def test_export_py_refuses_a_taken_output_before_loading_the_model(
    tiny_run_dir, tmp_path, monkeypatch, capsys, restore_logging, format_
):
    """A non-empty folder that is not an export of that format: exit 2 naming it, before the model is loaded (a
    big model takes a while), the folder untouched."""
    if format_ == "ctranslate2":
        pytest.importorskip("ctranslate2")
    import nmt.run_models
    from tests.test_cli_translate import in_process

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the output was checked")

    monkeypatch.setattr(nmt.run_models, "_load_run", no_model)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    argv = ["--model-dir", tiny_run_dir, "--output", tmp_path / "taken", "--format", format_]
    code, captured = in_process("export.py", *argv, capsys=capsys)
    assert code == 2, captured.err[-2000:]
    assert f"{tmp_path / 'taken'} exists and is not a" in captured.err
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["notes.txt"]


def test_export_py_refuses_a_model_ctranslate2_cannot_run_with_exit_1(
    tiny_run_dir, tmp_path, capsys, restore_logging
):
    """A run with model.attention: local (a banded encoder mask CTranslate2 has not): a run-directory problem, exit
    1 (not 2, a usage error), one line naming the feature, nothing written."""
    pytest.importorskip("ctranslate2")
    import yaml

    from tests.test_cli_translate import in_process

    run = shutil.copytree(tiny_run_dir, tmp_path / "local")
    tree = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    tree["model"].update(attention="local", window=2)
    (run / "config.yaml").write_text(yaml.safe_dump(tree, sort_keys=False), encoding="utf-8")
    argv = ["--model-dir", run, "--output", tmp_path / "ct2", "--format", "ctranslate2"]
    code, captured = in_process("export.py", *argv, capsys=capsys)
    assert code == 1, captured.err[-2000:]
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("error: CTranslate2 has no equivalent of this model's attention='local'"), last
    assert "Traceback" not in captured.err and sorted(p.name for p in tmp_path.iterdir()) == ["local"]


def test_export_to_the_current_directory(shared_export, tmp_path, monkeypatch):
    """export.py --output . (an empty current directory): written there, not a ValueError about an empty name.
    (export_run_dir hands its output to export_saved_model as given: the shared module is saved here.)"""
    module = shared_export[1]
    target = tmp_path / "here"
    target.mkdir()
    inode = target.stat().st_ino
    monkeypatch.chdir(target)
    output = export_saved_model(module, ".")
    assert output == target and (target / "saved_model.pb").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["here"]  # no leftover staging directory
    # written into the directory, not a new one in its place: the shell standing in it still sees the export
    assert target.stat().st_ino == inode and (Path.cwd() / "saved_model.pb").is_file()
    again = export_saved_model(module, ".")  # an export there is replaced, in place too
    assert again == target and target.stat().st_ino == inode
    assert load_exported(target)(inputs=tf.constant(["A man."]))["outputs"].shape == (1,)
