"""nmt.distill: the folder corpus of a teacher's translations, checked against `Translator.translate`; resume."""

import errno
import json
import os
import re

import pytest

from data import folder
from data.config import DataConfig
from nmt.distill import LOCK, MANIFEST, DistillError, distill, hold, settings_of
from tests.run_fixture import salads, write_corpus


@pytest.fixture(scope="module")
def translator(tiny_run_dir):
    from nmt.translator import Translator

    return Translator.from_run_dir(tiny_run_dir, xla=False, batch_size=4)


SOURCES = salads(23, seed=5) + ["", "  the cat\u2028sees a dog  "]  # a blank line; a break inside a line


@pytest.fixture
def corpus(tmp_path):
    pairs = [(s, f"target {i}") for i, s in enumerate(SOURCES)]
    real = [("the cat sees a dog.", "die katze sieht einen hund."), ("a hat.", "einen hut.")]
    return write_corpus(tmp_path / "corpus", corpus={"train": pairs, "validation": real, "test": real[:1]})


def data_config(corpus):
    return DataConfig(dataset="folder", folder=str(corpus), source="en", target="de")


def run(translator, corpus, output, chunk_size=4, beam=2, **kwargs):
    data = data_config(corpus)
    settings = settings_of(
        data,
        teachers=["teacher"],
        weights=translator.weights,
        beam_size=beam,
        alpha=translator.eval_config.alpha,
    )
    return distill(
        translator, data, output, settings=settings, beam_size=beam, chunk_size=chunk_size, **kwargs
    )


def test_the_folder_holds_the_sources_the_translations_and_the_real_pairs(translator, corpus, tmp_path):
    output = tmp_path / "kd"
    summary = run(translator, corpus, output)
    sources = [" ".join(s.split("\u2028")).strip() for s in SOURCES]  # one line each, no surrounding spaces
    assert (output / "en.train.txt").read_text().splitlines() == sources
    expected = translator.translate(sources, beam_size=2)  # all lines at once: the chunks change nothing
    assert (output / "de.train.txt").read_text().splitlines() == expected
    assert expected[23] == "" and len(set(expected)) > 10  # the blank line; real translations, not one string
    for split in ("validation", "test"):
        for language in ("en", "de"):
            name = f"{language}.{split}.txt"
            assert (output / name).read_text() == (corpus / name).read_text()
    assert (summary.lines, summary.translated, summary.resumed_from) == (25, 25, 0)
    assert summary.references == {"validation": 2, "test": 1}
    student = DataConfig(dataset="folder", folder=str(output), source="en", target="de")
    assert folder.sizes(student) == {"train": 25, "validation": 2, "test": 1}
    assert sorted(p.name for p in output.iterdir() if p.name.startswith(".")) == sorted([MANIFEST, LOCK])


def test_a_stopped_run_resumes_to_the_uninterrupted_file(translator, corpus, tmp_path):
    whole = tmp_path / "whole"
    run(translator, corpus, whole)
    stopped = tmp_path / "stopped"

    def stop(done):
        if done == 12:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(translator, corpus, stopped, on_chunk=stop)
    assert not (stopped / "de.train.txt").exists()  # not a trainable folder until complete
    with pytest.raises(Exception, match="de.train.txt: no such file"):
        folder.split_files(
            DataConfig(dataset="folder", folder=str(stopped), source="en", target="de"), "train"
        )
    partial = stopped / ".de.train.txt.partial"
    with open(partial, "ab") as handle:
        handle.write(b"half a chunk, cut short\nand mo")  # written after the last record, e.g. by a crash
    chunks = []
    summary = run(
        translator, corpus, stopped, chunk_size=5, on_chunk=chunks.append
    )  # the recorded 4 are kept
    assert chunks == [16, 20, 24, 25]
    assert (summary.translated, summary.resumed_from) == (13, 12)
    assert (stopped / "de.train.txt").read_bytes() == (whole / "de.train.txt").read_bytes()
    assert not partial.exists()
    again = run(translator, corpus, stopped)  # complete: nothing translated
    assert (again.translated, again.resumed_from) == (0, 25)
    assert json.loads((stopped / MANIFEST).read_text())["complete"] is True


def test_other_settings_or_a_foreign_folder_are_refused_untouched(translator, corpus, tmp_path):
    output = tmp_path / "kd"
    run(translator, corpus, output)
    before = {p.name: p.read_bytes() for p in output.iterdir()}
    with pytest.raises(DistillError, match="beam_size: 2 there, 3 now"):
        run(translator, corpus, output, beam=3)
    assert {p.name: p.read_bytes() for p in output.iterdir()} == before
    (corpus / "en.train.txt").write_text("".join(s + "\n" for s in reversed(SOURCES)) + "one more\n")
    (corpus / "de.train.txt").write_text("".join(f"t{i}\n" for i in range(len(SOURCES) + 1)))
    with pytest.raises(DistillError, match=r"corpus: split\(s\) train changed since"):
        run(translator, corpus, output)
    with pytest.raises(DistillError, match="not empty and holds no .distill.json"):
        run(translator, corpus, corpus)
    assert (corpus / "de.train.txt").read_text().splitlines()[0] == "t0"


def test_damaged_progress_is_an_error_not_a_zero_filled_file(translator, corpus, tmp_path):
    output = tmp_path / "kd"

    def stop(done):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(translator, corpus, output, on_chunk=stop)
    (output / ".de.train.txt.partial").write_bytes(b"x\n")  # shorter than the recorded chunk
    with pytest.raises(DistillError, match="the progress is damaged"):
        run(translator, corpus, output)
    (output / MANIFEST).write_text("{")
    with pytest.raises(DistillError, match="cannot be read"):
        run(translator, corpus, output)


def test_one_process_per_folder(translator, corpus, tmp_path):
    import fcntl

    output = tmp_path / "kd"
    output.mkdir()
    with open(output / LOCK, "a") as held:  # another process's distill.py, as far as flock is concerned
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(DistillError, match="another distill.py is writing"):
            run(translator, corpus, output)
    assert [p.name for p in output.iterdir()] == [LOCK]
    assert run(translator, corpus, output).translated == 25  # the lock file alone is an empty folder


def test_the_lock_is_reentrant_and_a_finished_folder_is_read_without_it(
    translator, corpus, tmp_path, monkeypatch
):
    import threading

    import nmt.distill_folder

    output = tmp_path / "kd"
    with hold(output):  # as distill.py holds it before loading TensorFlow
        assert run(translator, corpus, output, chunk_size=10).translated == 25
        with pytest.raises(DistillError, match="another distill.py is writing"):  # still held after the call
            _flock(output)
        refused = []  # re-entrant in this thread only: another thread is a second writer

        def other_thread():
            try:
                hold(output).__enter__()
            except DistillError as err:
                refused.append(err)

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert len(refused) == 1
    assert not nmt.distill_folder._HELD
    _flock(output).close()  # released

    def unwritable(self):  # a read-only mount: the lock file cannot be opened
        raise PermissionError(30, "Read-only file system", str(self.path))

    monkeypatch.setattr(nmt.distill_folder._Lock, "__enter__", unwritable)
    again = run(translator, corpus, output, chunk_size=10)  # finished: nothing to write, no lock needed
    assert (again.lines, again.translated, again.resumed_from) == (25, 0, 25)
    with pytest.raises(
        DistillError, match=r"other settings \(alpha: .*; beam_size: 2 there, 1 now\)"
    ):  # named, unlocked
        run(translator, corpus, output, beam=1)


def test_a_lock_file_removed_while_waiting_for_it_is_opened_again(tmp_path, monkeypatch):
    """Between this process's open and flock, the holder gave the folder up (distill.py removes a folder it made
    for nothing, lock file included): the lock taken is on the folder's current lock file, not the removed one."""
    import fcntl

    output = tmp_path / "kd"
    real, calls = fcntl.flock, []

    def racing(handle, operation):
        if not calls:
            (output / LOCK).unlink()
            output.rmdir()
        calls.append(operation)
        return real(handle, operation)

    monkeypatch.setattr(fcntl, "flock", racing)
    with hold(output):
        assert len(calls) == 2 and (output / LOCK).exists()
        monkeypatch.setattr(fcntl, "flock", real)
        with pytest.raises(
            DistillError, match="another distill.py is writing"
        ):  # the file in the folder is held
            _flock(output)


def _flock(output):
    import fcntl

    handle = open(output / LOCK, "a")  # noqa: SIM115 - the caller closes it
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        handle.close()
        raise DistillError("another distill.py is writing") from err
    return handle


def test_a_corpus_fixed_after_a_failed_copy_is_taken(translator, corpus, tmp_path):
    """Nothing recorded but the settings: new settings replace them, and the failed copy left no files."""
    from data.errors import DataError

    output = tmp_path / "kd"
    good = (corpus / "de.validation.txt").read_text()
    (corpus / "de.validation.txt").write_text(good.splitlines(keepends=True)[0])  # one line short
    with pytest.raises(DataError, match="line-aligned"):
        run(translator, corpus, output)
    assert sorted(p.name for p in output.iterdir()) == sorted([MANIFEST, LOCK, "en.train.txt"])
    (corpus / "de.validation.txt").write_text(good)
    (
        corpus / "de.test.txt"
    ).unlink()  # the settings change too (no test split now): replaced, nothing stale kept
    (corpus / "en.test.txt").unlink()
    assert run(translator, corpus, output).references == {"validation": 2}
    assert sorted(p.name for p in output.iterdir() if not p.name.startswith(".")) == [
        "de.train.txt", "de.validation.txt", "en.train.txt", "en.validation.txt",
    ]  # fmt: skip


def test_stopped_between_the_rename_and_the_manifest(translator, corpus, tmp_path):
    output = tmp_path / "kd"
    run(translator, corpus, output)
    manifest = json.loads((output / MANIFEST).read_text())
    (output / MANIFEST).write_text(json.dumps({**manifest, "complete": False}))
    again = run(translator, corpus, output)
    assert (again.translated, again.resumed_from) == (0, 25)
    assert json.loads((output / MANIFEST).read_text())["complete"] is True
    (output / MANIFEST).write_text(json.dumps({**manifest, "complete": False}))
    with open(output / "de.train.txt", "ab") as handle:
        handle.write(b"a line from elsewhere\n")  # not the recorded file: not taken as complete
    with pytest.raises(DistillError, match="the progress is damaged"):
        run(translator, corpus, output)


def test_a_corpus_in_another_encoding_is_refused_and_a_few_damaged_lines_are_named(
    translator, corpus, tmp_path, caplog
):
    """As data.prepare does (`DropCounts.refuse_another_encoding`): Latin-1 files are refused, not turned into
    U+FFFD; a damaged line or two are warned about by number (before 2026-12-07: silently U+FFFD, exit 0)."""
    from data.errors import DataError

    latin = [(f"the caf\u00e9 number {i} is tr\u00e8s bon", f"target {i}") for i in range(30)]
    for split in ("train", "validation"):
        (corpus / f"en.{split}.txt").write_bytes("".join(s + "\n" for s, _ in latin).encode("latin-1"))
        (corpus / f"de.{split}.txt").write_text("".join(t + "\n" for _, t in latin), encoding="utf-8")
    output = tmp_path / "kd"
    with pytest.raises(DataError, match=r"split 'train' of the corpus: 30 of 30 pairs are not valid UTF-8"):
        run(translator, corpus, output)
    assert sorted(p.name for p in output.iterdir()) == sorted([MANIFEST, LOCK])  # no half-copied file
    damaged = [line.encode("utf-8") for line in SOURCES]
    damaged[3], damaged[7] = b"caf\xe9 au lait", b"a \x00cat"
    (corpus / "en.train.txt").write_bytes(b"".join(line + b"\n" for line in damaged))
    (corpus / "de.train.txt").write_text(
        "".join(f"target {i}\n" for i in range(len(damaged))), encoding="utf-8"
    )
    write_corpus(corpus, corpus={"validation": [("a hat.", "einen hut.")]})
    caplog.set_level("WARNING", logger="nmt.distill")
    run(translator, corpus, output)
    assert (
        "split 'train', en.train.txt: 1 line(s) had invalid UTF-8 (replaced with U+FFFD): line 4"
        in caplog.text
    )
    assert "split 'train', en.train.txt: 1 line(s) had NUL bytes (removed): line 8" in caplog.text
    assert (output / "en.train.txt").read_text().splitlines()[3] == "caf\ufffd au lait"


@pytest.mark.parametrize("lines", [[], ["", "  "]])
def test_a_training_split_without_sources_is_an_error(translator, tmp_path, lines):
    real = [("a hat.", "einen hut.")]
    corpus = write_corpus(tmp_path / "corpus", corpus={"train": [(s, s) for s in lines], "validation": real})
    with pytest.raises(DistillError, match=f"split 'train' of the corpus has no source sentence to translate "
                       f"\\({len(lines)} lines\\)"):  # fmt: skip
        run(translator, corpus, tmp_path / "kd")
    assert not (tmp_path / "kd" / "en.train.txt").exists()


def test_a_corpus_without_the_validation_split_is_refused(translator, tmp_path):
    """A student trained on the folder needs a validation split (before 2026-12-07: a folder without one, exit 0,
    and a printed student command that could not train)."""
    corpus = write_corpus(tmp_path / "corpus", corpus={"train": [("a hat.", "x")]})
    with pytest.raises(DistillError, match="data.validation_split=validation: the corpus has no such split"):
        run(translator, corpus, tmp_path / "kd")


def test_a_folder_left_by_a_crash_during_the_first_manifest_write_is_still_ours(tmp_path, monkeypatch):
    """A process killed between writing the manifest's temporary file and renaming it leaves the lock and that
    file: still a distillation's folder (before 2026-12-07c the allowance named the file without the leading dot
    `write_atomic` adds, so every later run refused the folder; found by a review). Anything else is refused."""
    import os
    from pathlib import Path

    import nmt.run_dir
    from nmt.distill import check_output
    from nmt.run_dir import write_atomic

    output = tmp_path / "kd"
    output.mkdir()
    (output / LOCK).touch()

    def killed(*args):
        raise KeyboardInterrupt

    # the kill: the rename never happens, and nothing cleans up after it
    monkeypatch.setattr(nmt.run_dir.os, "replace", killed)
    monkeypatch.setattr(Path, "unlink", lambda *args, **kwargs: None)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(output / MANIFEST, "{}")
    monkeypatch.undo()
    assert len(os.listdir(output)) == 2 and not (output / MANIFEST).exists()
    check_output(output)
    (output / "notes.txt").touch()
    with pytest.raises(DistillError, match="not a distillation's folder"):
        check_output(output)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd to tell the files apart")
@pytest.mark.parametrize(
    ("failing", "named"), [(".en.train.txt.tmp", "en.train.txt"), (".partial", ".partial")]
)
def test_a_full_disk_names_the_file_and_a_rerun_completes(
    translator, corpus, tmp_path, monkeypatch, failing, named
):
    """The copy of the sources, then the translations: their writes' ENOSPC names no file (distill.py said only
    "[Errno 28] No space left on device"); the error names it, no temporary file stays, and a rerun with space
    completes the folder."""
    real_fsync = os.fsync

    def full_disk(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(failing):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_disk)
    output = tmp_path / "kd"
    with pytest.raises(OSError, match=f"No space left on device: '.*/kd/.*{re.escape(named)}'"):
        run(translator, corpus, output)
    assert not list(output.glob("*.tmp"))
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert run(translator, corpus, output).lines == len(SOURCES)
    assert len((output / "de.train.txt").read_text().splitlines()) == len(SOURCES)
