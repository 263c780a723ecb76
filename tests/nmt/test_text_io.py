"""nmt.text_io.LineWriter: where an output path's lines end up (a file replaced whole, a link, /dev/stdout)."""

from __future__ import annotations

import os

from nmt.text_io import LineWriter, written_in_place


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
