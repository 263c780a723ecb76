"""Holding back a known, harmless line that native (C++) code writes straight to file descriptor 2.

TF Text's bundled SentencePiece logs "precompiled_charsmap is empty. use identity normalization." for each model
of the project's identity normalization when its resource is created: two lines on every translate.py/evaluate.py
run that say nothing to a user. `without_lines(marker)` captures fd 2 for the duration of a block and writes back
every captured line that does not contain `marker`. Not lossless if the process dies inside the block (a native
abort's message would stay in the capture): keep such blocks short.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

IDENTITY_NOTICE = b"precompiled_charsmap is empty"


@contextlib.contextmanager
def without_lines(marker: bytes = IDENTITY_NOTICE):
    """Within the block, lines written to fd 2 that contain `marker` are dropped; the others follow at its end."""
    try:
        if sys.stderr is not None:
            sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no file descriptor 2: nothing to filter
        yield
        return
    try:
        with tempfile.TemporaryFile() as captured:
            os.dup2(captured.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
                captured.seek(0)
                kept = b"".join(
                    line for line in captured.read().splitlines(keepends=True) if marker not in line
                )
                while kept:
                    kept = kept[os.write(2, kept) :]
    finally:
        os.close(saved)
