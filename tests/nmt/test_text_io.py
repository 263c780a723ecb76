"""nmt.text_io.LineWriter: where an output path's lines end up (a file replaced whole, a link, /dev/stdout)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from nmt.text_io import LineWriter, written_in_place

ROOT = Path(__file__).resolve().parents[2]


def write(path, lines, success=True) -> None:
    writer = LineWriter(path)
    for line in lines:
        writer.write(line)
    writer.close(success=success)


def test_a_file_is_replaced_only_when_everything_is_written(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("old\n", encoding="utf-8")
    writer = LineWriter(out)
    writer.write("new")
    writer.flush()
    assert out.read_text(encoding="utf-8") == "old\n"  # still the old file until close
    writer.close(success=False)
    assert out.read_text(encoding="utf-8") == "old\n" and os.listdir(tmp_path) == ["out.txt"]
    write(out, ["a", "b\nc"])
    assert out.read_text(encoding="utf-8") == "a\nb c\n"


def test_a_link_to_a_file_stays_a_link(tmp_path):
    (tmp_path / "real.txt").write_text("old\n", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    link = tmp_path / "sub" / "link.txt"
    link.symlink_to("../real.txt")
    write(link, ["new"])
    assert link.is_symlink() and (tmp_path / "real.txt").read_text(encoding="utf-8") == "new\n"
    assert sorted(os.listdir(tmp_path / "sub")) == ["link.txt"]


def test_a_link_through_proc_writes_to_the_descriptors_file_not_over_the_link(tmp_path):
    """What `--output /dev/stdout` is when stdout is redirected to a file: a link (through /proc/self/fd/1) to
    that file. Renaming a temporary file over it would replace /dev/stdout itself (as root) and leave the file
    empty; the lines must go into the file. (A link of our own: a regression must not replace /dev/stdout.)"""
    target = tmp_path / "redirected.txt"
    with open(target, "wb") as handle:
        link = tmp_path / "my-stdout"
        link.symlink_to(f"/proc/self/fd/{handle.fileno()}")
        assert written_in_place(str(link)) and written_in_place("/dev/stdout")
        write(link, ["one", "two"])
    assert link.is_symlink() and target.read_text(encoding="utf-8") == "one\ntwo\n"
    assert not written_in_place(str(target)) and not written_in_place(str(tmp_path / "new.txt"))


def test_a_replaced_file_keeps_its_permissions_and_a_long_name_works(tmp_path):
    """A private output (600) stays private (the temporary file took the umask's mode); a 250-byte name, legal, is
    not made illegal by the temporary name around it."""
    private = tmp_path / "private.txt"
    private.write_text("old\n")
    os.chmod(private, 0o600)
    with LineWriter(private) as writer:
        writer.write("new")
    assert private.read_text() == "new\n" and (private.stat().st_mode & 0o777) == 0o600
    long = tmp_path / ("a" * 250)
    with LineWriter(long) as writer:
        writer.write("x")
    assert long.read_text() == "x\n" and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [long.name, "private.txt"]
    )


def test_a_failed_rename_leaves_no_temporary_file(tmp_path):
    """The output name taken by a directory while the lines were written: the rename fails, and its error is
    raised, but the temporary file goes (before 2026-12-07 a `.out.PID.tmp` stayed)."""
    out = tmp_path / "out"
    writer = LineWriter(out)
    writer.write("x")
    out.mkdir()
    with pytest.raises(OSError):
        writer.close()
    assert os.listdir(tmp_path) == ["out"] and out.is_dir()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_a_regular_file_under_dev_is_replaced_whole_and_devices_and_fifos_are_written_in_place(tmp_path):
    """/dev/shm is a tmpfs: a file there is a file like any other (before 2026-12-07 every path under /dev was
    written in place: the old file emptied at once, a stopped run's partial output left under its name)."""
    handle, path = tempfile.mkstemp(dir="/dev/shm", prefix="test_text_io.")
    try:
        os.write(handle, b"old\n")
        os.close(handle)
        writer = LineWriter(path)
        writer.write("new")
        writer.flush()
        assert Path(path).read_text() == "old\n"
        writer.close(success=False)
        assert Path(path).read_text() == "old\n"
        write(path, ["new"])
        assert Path(path).read_text() == "new\n"
        assert not [name for name in os.listdir("/dev/shm") if name.startswith(f".{os.path.basename(path)}.")]
    finally:
        os.unlink(path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert written_in_place(str(fifo)) and written_in_place("/dev/null") and written_in_place("/dev/fd/1")
    write("/dev/null", ["nothing"])


# `print` before and after the lines: what evaluate.py does with its report
WRITE_TO = """
import sys
from nmt.text_io import LineWriter
print("before", file=sys.{stream})
with LineWriter(sys.argv[1]) as writer:
    writer.write("one")
    writer.write("two")
print("after", file=sys.{stream})
"""


@pytest.mark.parametrize("path, stream", [("/dev/stdout", "stdout"), ("/dev/stderr", "stderr")])
@pytest.mark.parametrize("mode", ["ab", "wb"])
def test_dev_stdout_is_written_through_stdout(tmp_path, path, stream, mode):
    """`translate.py --output /dev/stdout >> acc.de`: the lines go after acc.de's, where stdout writes; after `>`,
    what is printed afterwards follows them. Before 2026-12-07 /dev/stdout was opened anew ("wb"): acc.de lost its
    lines, and evaluate.py's report, printed on stdout after the hypotheses, overwrote them."""
    out = tmp_path / "out.txt"
    out.write_bytes(b"earlier\n")
    with open(out, mode) as handle:
        done = subprocess.run(
            [sys.executable, "-c", WRITE_TO.format(stream=stream), path],
            **{stream: handle}, cwd=ROOT, timeout=60,
        )  # fmt: skip
    assert done.returncode == 0
    expected = "before\none\ntwo\nafter\n"
    assert out.read_text() == ("earlier\n" if mode == "ab" else "") + expected


# writes through the descriptor before and after the lines, as `{ echo header >&3; translate.py ...; } 3>>file`
WRITE_TO_DESCRIPTOR = """
import os, sys
from nmt.text_io import LineWriter
number = int(sys.argv[1])
os.write(number, b"header\\n")
with LineWriter(sys.argv[2].format(number)) as writer:
    writer.write("one")
    writer.write("two")
os.write(number, b"footer\\n")
"""


@pytest.mark.parametrize("link", ["/dev/fd/{}", "/proc/self/fd/{}"])
@pytest.mark.parametrize("mode", ["ab", "wb"])
def test_a_descriptor_other_than_stdout_is_written_at_its_own_position(tmp_path, link, mode):
    """`--output /dev/fd/3` with `3>file` or `3>>file`: the lines follow what the descriptor wrote before and
    precede what it writes after (before, found by a review of 2026-12-07e: a second opening of the file, in append
    mode, whose lines the descriptor's next write overwrote after `3>file`)."""
    out = tmp_path / "out.txt"
    out.write_bytes(b"earlier\n")
    with open(out, mode) as handle:
        number = handle.fileno()
        done = subprocess.run(
            [sys.executable, "-c", WRITE_TO_DESCRIPTOR, str(number), link],
            pass_fds=[number], cwd=ROOT, timeout=60,
        )  # fmt: skip
    assert done.returncode == 0
    assert out.read_text() == ("earlier\n" if mode == "ab" else "") + "header\none\ntwo\nfooter\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_failed_write_names_the_output():
    """/dev/full fails every write as a full disk does (ENOSPC): the error names the output, which the OS error of a
    write does not (before 2026-12-07e translate.py said only "error: [Errno 28] No space left on device")."""
    writer = LineWriter("/dev/full")
    writer.write("x")
    with pytest.raises(OSError, match=r"No space left on device: '/dev/full'"):
        writer.flush()
