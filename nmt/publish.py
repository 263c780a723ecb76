"""Writing a directory whole (the exports): staged next to or inside `output`, then put in place by renames.

    staging = staging_directory(output, last="MARKER")   # not created: the writer makes it
    try:
        write_everything_into(staging)
        publish_directory(staging, output, last="MARKER")
    finally:
        shutil.rmtree(staging, ignore_errors=True)

An existing `output` directory (an older export, or empty) gets the staging directory inside it, so its entries
move in by rename even when `output` is a mount point or a symlink to another filesystem. The older export's
entries are set aside, not deleted, until every new entry is in; if a rename fails (or Ctrl-C comes) they are put
back. Staging left by a killed process (SIGKILL, the OOM killer) is removed by the next export to the same place.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

_STAGING = "partial"
_SET_ASIDE = "replaced"


def staging_directory(output: Path, last: str) -> Path:
    """The path to write `output`'s new content to (absent; its writer creates it). Leftovers of processes that are
    gone are removed first: next to `output`, and inside it when it is an export (`last` there) or holds nothing
    else (a directory of something else is left as it is, for the caller to refuse)."""
    _remove_leftovers(output, last)
    name = f".{_STAGING}-{os.getpid()}"
    staging = output / name if output.is_dir() else output.with_name(f".{output.name}{name}")
    shutil.rmtree(staging, ignore_errors=True)
    return staging


def publish_directory(staging: Path, output: Path, last: str) -> None:
    """Puts the complete directory `staging` (from `staging_directory(output, last)`) at `output`: renamed there, or,
    inside an existing directory, moved in entry by entry, `last` (the file that marks it complete) last, after the
    old entries (their `last` first) are set aside. The directory itself stays: a shell standing in it
    (`export.py --output .`) is not left in a deleted directory."""
    if staging.parent != output:
        staging.rename(output)
        return
    set_aside = output / f".{_SET_ASIDE}-{os.getpid()}"
    set_aside.mkdir()
    old = [entry for entry in output.iterdir() if entry not in (staging, set_aside)]
    old.sort(key=lambda entry: entry.name != last)
    new = sorted(staging.iterdir(), key=lambda entry: entry.name == last)
    moved_old, moved_new = [], []
    try:
        for entry in old:
            entry.rename(set_aside / entry.name)
            moved_old.append(entry.name)
        for entry in new:
            entry.rename(output / entry.name)
            moved_new.append(entry.name)
    except BaseException:
        for name in reversed(moved_new):
            (output / name).rename(staging / name)
        for name in reversed(moved_old):
            (set_aside / name).rename(output / name)
        set_aside.rmdir()
        raise
    staging.rmdir()
    shutil.rmtree(set_aside)


def _remove_leftovers(output: Path, last: str) -> None:
    candidates = []
    if output.parent.is_dir():
        pattern = re.compile(rf"\.{re.escape(output.name)}\.{_STAGING}-(\d+)")
        candidates += [(entry, pattern.fullmatch(entry.name)) for entry in output.parent.iterdir()]
    if output.is_dir():
        pattern = re.compile(rf"\.(?:{_STAGING}|{_SET_ASIDE})-(\d+)")
        inside = [(entry, pattern.fullmatch(entry.name)) for entry in output.iterdir()]
        if (output / last).is_file() or all(match for _, match in inside):
            candidates += inside
    for entry, match in candidates:
        if match and entry.is_dir() and not entry.is_symlink() and _gone(int(match.group(1))):
            shutil.rmtree(entry, ignore_errors=True)


def _gone(pid: int) -> bool:
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False
