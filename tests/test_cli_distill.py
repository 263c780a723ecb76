"""distill.py: the folder against `Translator.translate`, a finished folder left as it is, usage errors before
TensorFlow, other settings refused. The usage errors run in processes that must not import TensorFlow, the SIGINT
test a real process; the other runs call `main` in this process through `nmt.cli.run` (`in_process`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.run_fixture import salads, write_corpus
from tests.test_cli_translate import ROOT, cli, in_process


@pytest.fixture
def corpus(tmp_path):
    real = [("the cat sees a dog.", "die katze sieht einen hund.")]
    train = [(s, "x") for s in salads(60, seed=8)]  # enough text for the student's tokenizer
    return write_corpus(tmp_path / "corpus", corpus={"train": train, "validation": real, "test": real})


def test_distill_writes_the_teachers_translations_and_prints_the_student_command(
    tiny_run_dir, corpus, tmp_path, capsys, restore_logging
):
    from nmt.translator import Translator

    output = tmp_path / "kd"
    args = ("distill.py", "--model-dir", tiny_run_dir, "--output", output, "--xla", "off", "--chunk-size", 4,
            "--beam", 3, "--alpha", 0.5, "--set", f"data.folder={corpus}")  # fmt: skip
    code, done = in_process(*args, capsys=capsys)
    assert code == 0, done.err[-2000:]
    assert done.out.strip() == str(output)
    sources = (corpus / "en.train.txt").read_text().splitlines()
    # stderr is not a terminal (a log): the distilling bar writes whole lines, no redraws joined by carriage returns
    # (before: tqdm's defaults; found by a review)
    bar = [line for line in done.err.splitlines() if line.startswith("distilling:")]
    assert "\r" not in done.err and bar and bar[-1].startswith("distilling: 100%"), done.err[-2000:]
    assert f"| {len(sources)}/{len(sources)} [" in bar[-1], bar
    teacher = Translator.from_run_dir(tiny_run_dir, xla=False)
    teacher.eval_config.alpha = 0.5
    assert (output / "de.train.txt").read_text().splitlines() == teacher.translate(sources, beam_size=3)
    assert (output / "de.test.txt").read_text() == (corpus / "de.test.txt").read_text()
    settings = json.loads((output / ".distill.json").read_text())["settings"]
    assert (settings["beam_size"], settings["alpha"]) == (3, 0.5)
    assert settings["teachers"] == [str(tiny_run_dir.resolve())]
    student = f"data.folder={output.resolve()} data.source=en data.target=de data.train_split=train"
    assert (
        f"--set data.dataset=folder {student} data.validation_split=validation data.test_split=test"
        in done.err
    )
    _run_the_printed_student_command(done.err, output, tmp_path)

    stamp = (output / "de.train.txt").stat().st_mtime_ns
    settings_before = json.loads((output / ".distill.json").read_text())["settings"]
    code, again = in_process(*args, capsys=capsys)  # finished: nothing to do, nothing rewritten
    assert code == 0 and "complete already" in again.err
    assert (output / "de.train.txt").stat().st_mtime_ns == stamp
    # A folder distilled before 2026-12-07d recorded its corpus as paths, sizes and mtimes: still complete (it was
    # refused as "changed since"), and refused once a file is touched
    manifest = json.loads((output / ".distill.json").read_text())
    manifest["settings"]["corpus"] = {
        split: {"dataset": "folder", "split": split, "source": "en", "target": "de", "files": [
            {"path": str(path), "bytes": path.stat().st_size, "mtime_ns": path.stat().st_mtime_ns}
            for path in (corpus / f"en.{split}.txt", corpus / f"de.{split}.txt")
        ]}
        for split in manifest["settings"]["corpus"]
    }  # fmt: skip
    (output / ".distill.json").write_text(json.dumps(manifest))
    code, old = in_process(*args, capsys=capsys)
    assert code == 0 and "complete already" in old.err, old.err[-2000:]
    os.utime(corpus / "de.test.txt")
    code, touched = in_process(*args, capsys=capsys)
    assert code == 1 and "corpus: split(s) test changed since" in touched.err, touched.err[-2000:]
    (output / ".distill.json").write_text(json.dumps({**manifest, "settings": settings_before}))
    code, other = in_process(*args, "--beam", 2, capsys=capsys)  # the last --beam counts
    assert code == 1
    assert "distilled with other settings (beam_size: 3 there, 2 now)" in other.err
    assert (output / "de.train.txt").stat().st_mtime_ns == stamp


def test_the_student_of_a_lowercased_teacher_is_lowercased(tmp_path):
    from data.config import DataConfig
    from distill import student_overrides

    cased = student_overrides(DataConfig(source="en", target="de"), tmp_path / "kd", {"validation": 5})
    assert cased == [
        "data.dataset=folder", f"data.folder={(tmp_path / 'kd').resolve()}", "data.source=en", "data.target=de",
        "data.train_split=train", "data.validation_split=validation",
    ]  # fmt: skip
    lowered = student_overrides(DataConfig(source="en", target="de", lowercase=True), tmp_path / "kd", {})
    assert lowered[-1] == "data.lowercase=true" and "data.lowercase=true" not in cased


def _run_the_printed_student_command(stderr: str, output, tmp_path) -> None:
    """The student command distill.py printed, run as printed (CONFIG and DIR filled in, a tiny config): it
    trains on the folder, whose training targets are the teacher's, and validates on the real pairs."""
    import re
    import shlex

    import yaml

    from tests.run_fixture import tiny_config_tree

    printed = re.search(r"train a student: (python train\.py .*)$", stderr, re.MULTILINE).group(1)
    tree = tiny_config_tree(tmp_path / "elsewhere")  # the printed --set names the folder
    tree["train"].update(max_steps=4, eval_every=4, bleu_every=0, checkpoint_every=4)
    config = tmp_path / "student.yaml"
    config.write_text(yaml.safe_dump(tree), encoding="utf-8")
    student = tmp_path / "student"
    argv = [{"CONFIG": str(config), "DIR": str(student)}.get(word, word) for word in shlex.split(printed)[1:]]
    assert argv[0] == "train.py"
    import train  # its main in this process: the printed command's arguments are what is under test

    assert train.main(argv[1:]) == 0
    data = yaml.safe_load((student / "config.yaml").read_text())["data"]
    assert (data["dataset"], data["folder"]) == ("folder", str(output.resolve()))
    records = [json.loads(line) for line in (student / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r.get("split") == "validation"][-1] == 4


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--set", "model.d_model=8"],
            "--set model.d_model=8: only the settings that choose the corpus apply",
        ),
        (
            ["--set", "data.vocab_size=128"],
            "--set data.vocab_size=128: only the settings that choose the corpus",
        ),
        (["--set", "data.folder=x", "--set", "data.lowercase=true"], "--set data.lowercase=true: only the"),
        (["--chunk-size", "0"], "--chunk-size must be at least 1, got 0"),
        (["--beam", "0"], "--beam must be between 1 and 1024, got 0"),
        (["--set", "data.train_split=[1"], "invalid config: --set data.train_split"),
        (["--set", "data.source=de", "data.target=en"], "the teacher translates en into de"),
        (  # before 2026-12-06: a folder without validation pairs, exit 0, an INFO line
            ["--set", "data.validation_split=valid"],
            "data.validation_split=valid: the corpus has no such split, and a student",
        ),
        (  # before 2026-12-07e: exit 1 once TensorFlow and the teachers had loaded (found by a review)
            ["--set", "data.train_split=nope"],
            "data.train_split=nope: the corpus has no such split, so there is nothing to translate",
        ),
        (  # the same for the teacher's train split missing from a folder corpus
            ["--set", "data.folder=CORPUS_WITHOUT_TRAIN"],
            "data.train_split=train: the corpus has no such split, so there is nothing to translate",
        ),
        (  # before 2026-12-07: the teacher's validation split missing from the corpus was a warning, exit 0
            ["--set", "data.folder=CORPUS_WITHOUT_VALIDATION"],
            "data.validation_split=validation: the corpus has no such split, and a student",
        ),
        (  # before 2026-12-07c: an error blaming the folder distill.py made there, once the teachers had loaded
            ["--output", "INSIDE_CORPUS"],
            "is inside the corpus it distils (data.folder=",
        ),
        (  # before 2026-12-07c: distilled greedily, the length penalty ignored, exit 0 (found by a review)
            ["--alpha", "1.4", "GREEDY_TEACHER"],
            "--alpha is the beam search's length penalty: nothing to do with greedy search",
        ),
    ],
)
def test_usage_errors_exit_2_before_tensorflow_and_write_nothing(args, message, tiny_run_dir, tmp_path):
    if "data.folder=CORPUS_WITHOUT_VALIDATION" in args:
        corpus = write_corpus(tmp_path / "corpus", corpus={"train": [("a hat.", "einen hut.")]})
        args = [f"data.folder={corpus}" if arg.endswith("WITHOUT_VALIDATION") else arg for arg in args]
    if "data.folder=CORPUS_WITHOUT_TRAIN" in args:
        real = [("a hat.", "einen hut.")]
        corpus = write_corpus(tmp_path / "corpus", corpus={"validation": real, "test": real})
        args = [f"data.folder={corpus}" if arg.endswith("WITHOUT_TRAIN") else arg for arg in args]
    teacher = tiny_run_dir
    if "GREEDY_TEACHER" in args:  # a copy of the teacher whose eval.beam_size is 1
        import shutil

        import yaml

        teacher = tmp_path / "greedy"
        shutil.copytree(tiny_run_dir, teacher)
        tree = yaml.safe_load((teacher / "config.yaml").read_text(encoding="utf-8"))
        tree["eval"]["beam_size"] = 1
        (teacher / "config.yaml").write_text(yaml.safe_dump(tree, sort_keys=False), encoding="utf-8")
        args = [arg for arg in args if arg != "GREEDY_TEACHER"]
    if "INSIDE_CORPUS" in args:  # the teacher's own corpus folder
        import yaml

        folder = yaml.safe_load((tiny_run_dir / "config.yaml").read_text(encoding="utf-8"))["data"]["folder"]
        args = [str(Path(folder) / "kd") if arg == "INSIDE_CORPUS" else arg for arg in args]
    done = without_tensorflow(["--model-dir", str(teacher), "--output", str(tmp_path / "kd"), *args])
    assert done.returncode == 2, done.stderr.decode()[-2000:]
    assert message in done.stderr.decode()
    assert not (tmp_path / "kd").exists()


def without_tensorflow(argv):
    """distill.main(argv) in a subprocess that fails if it imports TensorFlow."""
    code = (
        "import sys, distill\n"
        "from nmt import cli\n"
        f"try:\n    cli.run(lambda: distill.main({argv!r}))\n"
        "finally:\n    assert 'tensorflow' not in sys.modules, 'tensorflow imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=ROOT, timeout=300)
    assert (
        b"tensorflow imported" not in done.stderr
    )  # the exit code alone would not say (sys.exit, then this)
    return done


def test_a_busy_folder_is_refused_before_tensorflow_and_a_failed_start_leaves_no_trace(
    tiny_run_dir, tmp_path, capsys, restore_logging
):
    import fcntl

    busy = tmp_path / "busy"
    busy.mkdir()
    with open(busy / ".distill.lock", "a") as held:  # another distill.py, as far as flock is concerned
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = without_tensorflow(["--model-dir", str(tiny_run_dir), "--output", str(busy)])
    assert done.returncode == 1, done.stderr.decode()[-2000:]
    assert "another distill.py is writing" in done.stderr.decode()
    assert [p.name for p in busy.iterdir()] == [".distill.lock"]

    new = tmp_path / "new" / "kd"
    code, failed = in_process(
        "distill.py",
        "--model-dir",
        tiny_run_dir,
        "--output",
        new,
        "--weights",
        "ema",
        "--xla",
        "off",
        capsys=capsys,
    )
    assert code == 1, failed.err[-2000:]  # the run keeps no EMA: fails after loading
    assert "ema" in failed.err.lower()
    assert not new.exists()  # the folder it made for its lock is gone again

    empty = tmp_path / "empty"  # made by the user: it stays, without the lock file the run made in it
    empty.mkdir()
    code, failed = in_process(
        "distill.py", "--model-dir", tiny_run_dir, "--output", empty, "--weights", "ema", "--xla", "off",
        capsys=capsys,
    )  # fmt: skip
    assert code == 1 and "ema" in failed.err.lower(), failed.err[-2000:]
    assert empty.is_dir() and list(empty.iterdir()) == []


def test_a_folder_that_is_not_a_distillations_is_left_untouched(tiny_run_dir, corpus):
    before = {p.name: p.read_bytes() for p in corpus.iterdir()}
    done = cli("distill.py", "--model-dir", tiny_run_dir, "--output", corpus, "--xla", "off")
    assert done.returncode == 1
    assert "not empty and holds no .distill.json" in done.stderr.decode()
    assert {p.name: p.read_bytes() for p in corpus.iterdir()} == before


@pytest.mark.slow  # make test keeps the distill run and train.py's resume tests; make test-all runs this one
def test_sigint_stops_and_the_same_command_resumes_to_the_uninterrupted_folder(tiny_run_dir, tmp_path):
    """A real SIGINT once some chunks are recorded: exit 130, no training targets yet; the same command again
    resumes and writes the bytes of an uninterrupted run."""
    import os
    import signal
    import time

    from tests.test_cli_translate import RUN_DEADLINE

    real = [("a hat.", "einen hut.")]
    train = [(s, "x") for s in salads(1500, seed=9)]
    corpus = write_corpus(tmp_path / "corpus", corpus={"train": train, "validation": real})

    def command(output):
        return ["distill.py", "--model-dir", tiny_run_dir, "--output", output, "--xla", "off", "--chunk-size",
                10, "--set", f"data.folder={corpus}"]  # fmt: skip

    whole = cli(*command(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr.decode()[-2000:]
    output = tmp_path / "kd"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    with open(tmp_path / "stderr.txt", "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, *map(str, command(output))], stderr=stderr, cwd=ROOT, env=env
        )

    def recorded() -> int:
        try:
            return json.loads((output / ".distill.json").read_text()).get("translated", 0)
        except (OSError, ValueError):
            return 0

    deadline = time.monotonic() + RUN_DEADLINE  # a hang guard, not a timing
    while recorded() < 30 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    code = process.wait(timeout=RUN_DEADLINE)
    assert code == 130, (tmp_path / "stderr.txt").read_text()[-2000:]
    stopped_at = recorded()
    assert 30 <= stopped_at < 1500 and not (output / "de.train.txt").exists()
    resumed = cli(*command(output))
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    assert f"resuming {output}: {stopped_at} of 1500 lines translated already" in resumed.stderr.decode()
    assert (output / "de.train.txt").read_bytes() == (tmp_path / "whole" / "de.train.txt").read_bytes()
    assert (output / "en.train.txt").read_bytes() == (tmp_path / "whole" / "en.train.txt").read_bytes()
