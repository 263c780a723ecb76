"""OS errors that name their file: a failed write (a full disk's ENOSPC, a file-size limit's EFBIG) raises an
`OSError` with no file name, so "[Errno 28] No space left on device" alone says nothing of what was being written.

    with naming(output_path):
        handle.write(data)        # an OSError without a file name is raised again naming output_path
"""

from __future__ import annotations

import contextlib
from pathlib import Path


def named(err: OSError, path: str | Path) -> OSError:
    """`err` itself if it names a file, else an error of its type and errno naming `path`."""
    if err.filename is not None:
        return err
    return type(err)(err.errno, err.strerror or str(err), str(path))


@contextlib.contextmanager
def naming(path: str | Path):
    """Raises an `OSError` of the block that names no file again naming `path` (chained to the original)."""
    try:
        yield
    except OSError as err:
        error = named(err, path)
        if error is err:
            raise
        raise error from err
