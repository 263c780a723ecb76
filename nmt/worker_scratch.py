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
import stat
import tempfile
import time
from pathlib import Path

log = logging.getLogger("nmt.train")

PREFIX = "nmt-worker-"
STAGING = f".{PREFIX}staging-"
LOCK_NAME = ".in-use"
STAGING_AGE = 600.0  # seconds: a staging directory older than this, unlocked, was left by a killed worker
# This process' directories (by name) and their lock files, open (so locked) until it exits.
_HELD: dict[str, object] = {}


def private_directory(root: str | Path | None = None) -> Path:
    """A new directory `PREFIX*` under `root` (default: the system's temporary directory), locked by this process
    and removed at its exit; the abandoned ones of earlier processes (`remove_abandoned`) are removed first."""
    root = Path(root or tempfile.gettempdir())
    if removed := remove_abandoned(root):
        log.info(
            "removed %d private checkpoint director%s left by killed workers: %s",
            len(removed), "y" if len(removed) == 1 else "ies", ", ".join(str(p) for p in removed),
        )  # fmt: skip
    staging = Path(tempfile.mkdtemp(prefix=STAGING, dir=root))
    handle = open(staging / LOCK_NAME, "w")  # noqa: SIM115 - kept open (locked) for the process' life
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else holds it
    except OSError as err:  # a filesystem without locks (Lustre without -o flock): removed at exit only
        log.warning("no file locks in %s (%s): a killed worker's private directory there stays", root, err)
        handle.close()
        handle = None
    path = staging.with_name(staging.name.replace(STAGING, PREFIX, 1))
    os.rename(staging, path)  # the lock is on the file itself: it stays held under the new name
    _HELD[path.name] = handle
    atexit.register(shutil.rmtree, path, True)
    return path


def remove_abandoned(root: str | Path | None = None) -> list[Path]:
    """Removes the `PREFIX*` directories under `root` whose lock file no process holds, and staging directories
    (`STAGING*`) left unlocked for `STAGING_AGE` seconds; returns them.

    Left alone: directories without a lock file (made by a version before the lock), symbolic links, entries
    another user owns, and this process' own (a lock emulated per process, as on NFS, would not tell)."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    for path in sorted([*root.glob(f"{PREFIX}*"), *root.glob(f"{STAGING}*")]):
        try:
            info = path.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or path.name in _HELD:
            continue
        staging = path.name.startswith(STAGING)
        if staging and time.time() - info.st_mtime < STAGING_AGE:
            continue  # may be a worker between making it and locking it
        try:
            handle = os.fdopen(os.open(path / LOCK_NAME, os.O_RDWR | os.O_NOFOLLOW), "r+")
        except FileNotFoundError:  # made before the lock (left alone), or staged and killed before locking
            if staging:
                with contextlib.suppress(OSError):
                    shutil.rmtree(path)
                    removed.append(path)
            continue
        except OSError:  # not ours to open, or a symbolic link
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
