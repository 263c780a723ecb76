"""The entry points' checks of the files and folders they are given, made before any work (and before TensorFlow is
imported): an empty path, a missing or unreadable input, an output that could not be written or would overwrite an
input, a closed standard stream. Each raises a usage `CliError` (exit code 2) naming the option and the path."""

from __future__ import annotations

import os
import sys

from nmt.cli import CliError


def check_input_file(path: str | None) -> None:
    """Raises a usage CliError if an `--input`/`--source` style file is given but cannot be read."""
    if path is None or path == "-":
        return
    if not os.path.exists(path):
        raise CliError(f"input file not found: {path}", exit_code=2)
    if os.path.isdir(path):
        raise CliError(f"input is a directory, not a file: {path}", exit_code=2)
    if not os.access(path, os.R_OK):
        raise CliError(f"input file is not readable: {path}", exit_code=2)


def check_paths_given(paths: dict[str, str | None]) -> None:
    """Refuses a file option given as "" (an unset shell variable in `--output "$OUT"`), which would otherwise be
    the current folder, or be ignored. Option name -> path (None: not given)."""
    for option, path in paths.items():
        if path == "":
            raise CliError(f"{option} is empty: give a file path", exit_code=2)


def check_output_file(path: str | None, option: str = "output") -> None:
    """Raises a usage CliError if an output file could not be created (an empty path, a missing folder, a
    directory); `option` names it in the message. A path written in place (`/dev/stdout`, a FIFO) needs no
    folder to write in, only to be open."""
    from nmt.text_io import written_in_place

    if path is None or path == "-":
        return
    check_paths_given({option: path})
    if os.path.isdir(path):
        raise CliError(f"{option} is a directory, not a file: {path}", exit_code=2)
    if written_in_place(path):
        if not os.path.exists(path):
            raise CliError(f"{option} {path} names a file descriptor that is not open", exit_code=2)
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CliError(f"{option} folder does not exist: {folder}", exit_code=2)
    check_writable_folder(folder, f"{option} folder")


def check_writable_folder(folder: str | os.PathLike, what: str) -> None:
    """Raises a usage CliError naming `what` if files cannot be created in `folder` (read-only, not ours): said
    before any work, not after an evaluation's whole decode."""
    if os.path.isdir(folder) and not os.access(folder, os.W_OK | os.X_OK):
        raise CliError(f"{what} is not writable: {folder}", exit_code=2)


def check_standard_streams(stdin: str = "", stdout: str = "") -> None:
    """A closed standard input or output (`<&-`, `>&-`: Python then has no sys.stdin/sys.stdout) that the command
    would use, named before any work; `stdin`/`stdout` say what to do instead ("" if it does not use it)."""
    if stdin and sys.stdin is None:
        raise CliError(f"standard input is closed: {stdin}", exit_code=2)
    if stdout and sys.stdout is None:
        raise CliError(f"standard output is closed: {stdout}", exit_code=2)


def check_distinct_files(inputs: dict[str, str | None], outputs: dict[str, str | None]) -> None:
    """Refuses an output that is one of the inputs, or another output: the results would overwrite it. Inputs may
    be one file (a copy task's source and reference). Option name -> path; None or "-" (a standard stream) and a
    path that is not a regular file (a pipe, /dev/stdout) are not compared."""

    def identity(path, output=True):
        """A regular file's device and inode; an output yet to be written, its real path."""
        if path is None or path == "-":
            return None
        if not os.path.exists(path):
            return os.path.realpath(path) if output else None  # a missing input: its own check names it
        if not os.path.isfile(path):
            return None
        info = os.stat(path)
        return info.st_dev, info.st_ino

    seen = {}
    for option, path in inputs.items():
        if key := identity(path, output=False):
            seen.setdefault(key, option)
    for option, path in outputs.items():
        if key := identity(path):
            if key in seen:
                raise CliError(
                    f"{seen[key]} and {option} are the same file ({path}): its content would be lost", 2
                )
            seen[key] = option


def check_output_dir(path: str) -> None:
    """Raises a usage CliError if a directory could not be made at `path` (a file there, or on its way)."""
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise CliError(f"output exists and is not a directory: {path}", exit_code=2)
    folder = path
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        raise CliError(f"cannot make the output directory {path}: {folder} is not a directory", exit_code=2)


def check_model_dir(path: str):
    """The run directory behind `--model-dir`, checked before TensorFlow is even imported."""
    from nmt.run_dir import RunDir

    return RunDir(path).require()
