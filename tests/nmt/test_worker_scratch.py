"""nmt.worker_scratch: a non-chief worker's private checkpoint directory is locked while its process lives; one left
by a killed process (SIGKILL: no exit handler runs) is removed at the next worker's start, a live one never."""

import subprocess
import sys
import time
from pathlib import Path

from nmt.worker_scratch import LOCK_NAME, PREFIX, private_directory, remove_abandoned

ROOT = Path(__file__).resolve().parents[2]
HOLDER = (
    "import sys, time\n"
    "from nmt.worker_scratch import private_directory\n"
    "path = private_directory(sys.argv[1])\n"
    "(path / 'ckpt-4.index').write_text('a checkpoint')\n"
    "print(path, flush=True)\n"
    "time.sleep(600)\n"
)


def start_holder(root: Path) -> tuple[subprocess.Popen, Path]:
    """A process (no TensorFlow) that made its private directory and holds it: (process, directory)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    return proc, Path(proc.stdout.readline().strip())


def test_a_killed_workers_directory_goes_at_the_next_start_and_a_live_ones_stays(tmp_path):
    killed, killed_dir = start_holder(tmp_path)
    live, live_dir = start_holder(tmp_path)
    try:
        killed.kill()
        killed.wait(timeout=60)
        assert (killed_dir / "ckpt-4.index").exists()  # SIGKILL: its exit handler never ran
        legacy = tmp_path / f"{PREFIX}older"  # made before the lock: no lock file, left alone
        legacy.mkdir()
        not_ours = tmp_path / "other-tmp"
        not_ours.mkdir()

        mine = private_directory(tmp_path)  # a worker starting
        assert mine.name.startswith(PREFIX) and (mine / LOCK_NAME).exists()
        assert not killed_dir.exists()
        assert live_dir.exists() and (live_dir / "ckpt-4.index").exists()
        assert legacy.exists() and not_ours.exists()
        assert remove_abandoned(tmp_path) == []  # this process holds its own: nothing else to remove
        assert mine.exists()
        assert not list(tmp_path.glob(f".{PREFIX}staging-*"))  # renamed once locked
    finally:
        live.kill()
        live.wait(timeout=60)
    deadline = time.monotonic() + 60  # a hang guard: the kernel releases the lock as the process ends
    while live_dir.exists() and time.monotonic() < deadline:
        remove_abandoned(tmp_path)
        time.sleep(0.05)
    assert not live_dir.exists()
    assert mine.exists()  # still this process'


def test_staging_leftovers_symbolic_links_and_a_filesystem_without_locks(tmp_path, monkeypatch, caplog):
    """A staging directory a worker killed before its rename left goes once it is old (a young one may be a worker
    about to lock it); a symbolic link named like ours is never followed; where flock fails, the worker still
    starts (its directory then removed at exit only)."""
    import fcntl
    import os

    import nmt.worker_scratch as scratch

    old_unlocked = tmp_path / f"{scratch.STAGING}old"
    old_unlocked.mkdir()
    (old_unlocked / LOCK_NAME).write_text("")
    old_bare = tmp_path / f"{scratch.STAGING}bare"  # killed before its lock file existed
    old_bare.mkdir()
    young = tmp_path / f"{scratch.STAGING}young"
    young.mkdir()
    hour_ago = time.time() - 3600
    for path in (old_unlocked, old_bare):
        os.utime(path, (hour_ago, hour_ago))
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / LOCK_NAME).write_text("")
    (victim / "precious").write_text("keep")
    (tmp_path / f"{PREFIX}link").symlink_to(victim)

    assert sorted(p.name for p in remove_abandoned(tmp_path)) == sorted([old_bare.name, old_unlocked.name])
    assert young.exists() and (victim / "precious").read_text() == "keep"

    def no_locks(*args):
        raise OSError(37, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    path = private_directory(tmp_path)
    assert path.is_dir() and "no file locks in" in caplog.text
    assert {p.name for p in tmp_path.glob(f"{scratch.STAGING}*")} == {young.name}  # renamed all the same
    monkeypatch.undo()  # locks work again: its own directory, unlocked, is still not taken for abandoned
    assert remove_abandoned(tmp_path) == [] and path.is_dir()
