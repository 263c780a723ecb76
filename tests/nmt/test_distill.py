"""nmt.distill: the folder corpus of a teacher's translations, checked against `Translator.translate`; resume."""

import json

import pytest

from data import folder
from data.config import DataConfig
from nmt.distill import LOCK, MANIFEST, DistillError, distill, hold, settings_of
from tests.run_fixture import salads, shared_tiny_run_dir, write_corpus


@pytest.fixture(scope="session")
def tiny_run_dir(tmp_path_factory, request):
    return shared_tiny_run_dir(tmp_path_factory, getattr(request.config, "cache", None))


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

    import nmt.distill

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
    assert not nmt.distill._HELD
    _flock(output).close()  # released

    def unwritable(self):  # a read-only mount: the lock file cannot be opened
        raise PermissionError(30, "Read-only file system", str(self.path))

    monkeypatch.setattr(nmt.distill._Lock, "__enter__", unwritable)
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
