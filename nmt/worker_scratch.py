"""The private checkpoint directory of a non-chief worker of a multi-worker run.

TensorFlow's multi-worker convention: only the chief writes the run directory; every other worker saves its
(throw-away) checkpoints into a private temporary directory, removed when the process exits. A worker killed by
SIGKILL, the out-of-memory killer or a crash cannot remove it, and a preemptible cluster restarted many times would
fill the temporary directory with them. So each directory holds a lock file that its process keeps locked
(`fcntl.flock`: the kernel releases it when the process ends, however it ends), and a worker starting removes the
directories whose lock is free: left by processes that are gone.

A directory becomes visible under its final name only once its lock is held (it is made under a staging name and
renamed), so a worker starting at the same moment never takes a live one for abandoned.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("nmt.train")

PREFIX = "nmt-worker-"
LOCK_NAME = ".in-use"
_HELD: list = []  # this process' lock files, open (so locked) until it exits


def private_directory(root: str | Path | None = None) -> Path:
    """A new directory `PREFIX*` under `root` (default: the system's temporary directory), locked by this process
    and removed at its exit; the abandoned ones of earlier processes (`remove_abandoned`) are removed first."""
    root = Path(root or tempfile.gettempdir())
    if removed := remove_abandoned(root):
        log.info(
            "removed %d private checkpoint director%s left by killed workers: %s",
            len(removed), "y" if len(removed) == 1 else "ies", ", ".join(str(p) for p in removed),
        )  # fmt: skip
    staging = Path(tempfile.mkdtemp(prefix=f".{PREFIX}staging-", dir=root))
    handle = open(staging / LOCK_NAME, "w")  # noqa: SIM115 - kept open (locked) for the process' life
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else holds it
    path = staging.with_name(staging.name.replace(f".{PREFIX}staging-", PREFIX, 1))
    os.rename(staging, path)  # the lock is on the file itself: it stays held under the new name
    _HELD.append(handle)
    atexit.register(shutil.rmtree, path, True)
    return path


def remove_abandoned(root: str | Path | None = None) -> list[Path]:
    """Removes the `PREFIX*` directories under `root` whose lock file no process holds; returns them.

    Directories without a lock file (made by a version before the lock, or not ours) and those another user owns
    are left alone."""
    removed = []
    for path in sorted(Path(root or tempfile.gettempdir()).glob(f"{PREFIX}*")):
        try:
            handle = open(path / LOCK_NAME, "r+")  # noqa: SIM115 - closed below
        except OSError:  # no lock file, not a directory, or not ours to open
            continue
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: its worker is running
                continue
            with contextlib.suppress(OSError):
                shutil.rmtree(path)
                removed.append(path)
    return removed
