"""The distilled folder's own files (`nmt.distill`): its lock, which keeps a second process out, and its
manifest, `.distill.json` (settings, chunk size, progress), replaced atomically.

    with hold("distilled/"):              # DistillError while another process holds it
        manifest = finished_manifest(Path("distilled/"))   # a complete folder's manifest, else None
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from nmt.run_dir import write_atomic

MANIFEST = ".distill.json"
LOCK = ".distill.lock"


class DistillError(RuntimeError):
    """The output folder cannot be used: another distillation's, not a distillation's, or damaged."""


def hold(output: str | os.PathLike):
    """The folder's lock, as a context manager: `check_output`, then the folder made and an exclusive lock that one
    process holds at a time (`DistillError` for a second; `OSError` if the folder cannot be written). Re-entrant
    within a thread: the CLI takes it before loading TensorFlow, and `distill` inside it finds it held."""
    output = Path(output)
    check_output(output)
    return _Lock(output)


def finished_manifest(output: Path) -> dict | None:
    """The manifest of a complete folder, else None. Safe without the lock: the manifest is replaced atomically,
    and a complete folder is never written again."""
    try:
        manifest = json.loads((output / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    complete = isinstance(manifest, dict) and manifest.get("complete") is True
    return manifest if complete and isinstance(manifest.get("settings"), dict) else None


def check_output(output: Path) -> None:
    """`DistillError` unless `output` can be a distillation's folder: new, empty, or one with a manifest (no
    TensorFlow needed: the CLI checks it first)."""
    if output.exists() and not output.is_dir():
        raise DistillError(f"{output} is a file, not a folder")
    # the lock, and a manifest's temporary file left by a crash during its first write (`write_atomic` names it
    # ".<name>.XXXX": "..distill.json.XXXX")
    ours = (LOCK, f".{MANIFEST}.")
    if (
        output.is_dir()
        and not (output / MANIFEST).exists()
        and any(not p.name.startswith(ours) for p in output.iterdir())
    ):
        raise DistillError(
            f"{output} is not empty and holds no {MANIFEST}: not a distillation's folder, left as it is "
            "(give a new or empty folder)"
        )


_HELD: set[tuple[int, Path]] = set()  # (thread, folder): the locks this process holds


class _Lock:
    """An exclusive, non-blocking lock on the folder (released when the process ends, even by SIGKILL); entering
    it again in the same thread is a no-op (flock would refuse a second open file of the same process). The folder
    is made first; a lock file removed or replaced while this process waited for it is opened again, so that two
    processes never hold locks on two files of one folder (the CLI removes a folder it made for nothing)."""

    def __init__(self, output: Path):
        self.output = output
        self.path = output / LOCK
        self.key = (threading.get_ident(), output.resolve())
        self.handle = None

    def __enter__(self):
        import fcntl

        if self.key in _HELD:
            return self
        for _ in range(100):  # another process only removes its lock file once, when it gives the folder up
            self.output.mkdir(parents=True, exist_ok=True)
            try:
                handle = open(self.path, "a")  # noqa: SIM115 - closed at exit
            except FileNotFoundError:  # the folder was removed since the mkdir: make it again
                continue
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                handle.close()
                raise DistillError(
                    f"another distill.py is writing {self.output}: wait for it or stop it"
                ) from err
            try:
                current = os.stat(self.path)
            except FileNotFoundError:
                current = None
            held = os.fstat(handle.fileno())
            if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
                self.handle = handle
                _HELD.add(self.key)
                return self
            handle.close()  # locked a file that is no longer the folder's: open the folder's again
        raise DistillError(f"the lock file {self.path} keeps being replaced: is another program removing it?")

    def __exit__(self, *exc) -> None:
        if self.handle is not None:
            _HELD.discard(self.key)
            self.handle.close()  # closing releases the lock
            self.handle = None


def save_manifest(output: Path, manifest: dict) -> None:
    write_atomic(output / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
