"""An earlier commit of this repository, checked out beside it for a same-run comparison (benchmarks only)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def resolve_revision(revision: str) -> str:
    """The full commit hash of `revision`; an unknown one is a CliError (exit 2), raised before anything runs."""
    resolved = subprocess.run(
        ["git", "rev-parse", "--verify", f"{revision}^{{commit}}"], cwd=ROOT, capture_output=True, text=True
    )
    if resolved.returncode != 0:
        from nmt.cli import CliError

        raise CliError(f"unknown git revision {revision!r}: {resolved.stderr.strip()}", exit_code=2)
    return resolved.stdout.strip()


@contextlib.contextmanager
def baseline_worktree(revision: str) -> Iterator[tuple[Path, str]]:
    """Yields (directory, full commit hash) of `revision` checked out with `git worktree add --detach` in a temporary
    directory; the worktree is removed (and pruned from git's list) on exit, whatever happens inside."""
    commit = resolve_revision(revision)
    parent = Path(tempfile.mkdtemp(prefix="nmt-baseline-"))
    directory = parent / "tree"
    try:
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(directory), commit],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        yield directory, commit
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(directory)], cwd=ROOT, capture_output=True
        )
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True)
        shutil.rmtree(parent, ignore_errors=True)
