"""Sequence-level knowledge distillation (Kim and Rush, 2016): a folder corpus whose training targets are a
teacher's translations, for a student to train on with `data.dataset: folder`.

    translator = Translator.from_run_dir(Path("runs/teacher").resolve(), ensemble=[Path("runs/other").resolve()])
    settings = settings_of(data_cfg, teachers=["runs/teacher", "runs/other"], weights=translator.weights,
                           beam_size=4, alpha=1.4)
    summary = distill(translator, data_cfg, "distilled/", settings=settings, beam_size=4, chunk_size=1000)

The folder gets, for the corpus's source and target languages (`en`, `de` below):
- `en.train.txt`: the training sources, as the corpus holds them (one line each: line breaks inside a sentence
  become spaces, surrounding whitespace is dropped, invalid UTF-8 is replaced);
- `de.train.txt`: the teacher's translation of each (beam search; a blank source gives a blank line);
- `en.validation.txt`, `de.validation.txt`, `en.test.txt`, `de.test.txt`: the corpus's real pairs of its
  validation and test splits (those it has), so the student is validated and tested on real references.

Resumable and never half-written. The settings (teachers, weights, search, the corpus's identity), the chunk size
and the progress are kept in the folder's `.distill.json` (a hidden file, which the folder reader skips, as it skips
`.distill.lock`, the lock that keeps a second process out). Translations are
appended to the hidden `.de.train.txt.partial` one chunk at a time, each chunk synced before the manifest records
it, and renamed to `de.train.txt` once every line is there: until then the folder cannot be trained on (the reader
names the missing file). A stopped run resumes at the last recorded chunk (bytes past it, from a chunk cut short,
are dropped); chunks are the same lines as in an uninterrupted run, so the result is the same file. A folder made
with other settings, or any non-empty folder that is not a distillation's, is refused (`DistillError`), untouched.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from common.os_errors import naming
from data.cleaning import DropCounts
from data.config import DataConfig
from data.folder import FILE_NAME
from data.stream import legacy_identity_matches, split_exists, split_identity, stream_pairs
from nmt.distill_folder import (  # noqa: F401 - re-exported: the CLI imports them from here
    LOCK,
    MANIFEST,
    DistillError,
    check_output,
    finished_manifest,
    hold,
    save_manifest,
)
from nmt.text_io import chunked, decode_line, one_line, read_lines

log = logging.getLogger(__name__)

FORMAT = 2  # 2: the chunk size out of the settings, no alpha for greedy search


@dataclass(frozen=True)
class Summary:
    output: Path
    lines: int  # training pairs
    translated: int  # lines translated by this call (0: the folder was complete already)
    resumed_from: int  # lines already translated when this call started
    references: dict[str, int]  # validation/test split -> pairs copied


def settings_of(
    data: DataConfig, *, teachers: Sequence[str], weights: str, beam_size: int, alpha: float
) -> dict:
    """What the folder's text depends on: a resumed run must have the same. `weights`: the teachers' checkpoints
    as loaded (give absolute run directories, so that another spelling of a path is the same teacher).

    Not here: how lines are batched (--batch-size, --xla, --streams: the same translations, up to float rounding
    in the padded batches) and the chunk size (a resumed run keeps the recorded one anyway, so that its batches are
    the uninterrupted run's and even that rounding is the same)."""
    identities = {name: split_identity(data, split) for name, split in _corpus_splits(data).items()}
    return {
        "format": FORMAT,
        "teachers": [os.fspath(Path(path).resolve()) for path in teachers],
        "weights": weights,
        "beam_size": beam_size,
        "alpha": alpha if beam_size > 1 else None,  # greedy search has no length penalty
        "source": data.source,
        "target": data.target,
        "corpus": identities,
    }


def _corpus_splits(data: DataConfig, warn: bool = True) -> dict[str, str]:
    """Folder split name -> the corpus's split name, for the splits the corpus has (train must exist).

    A missing validation split is a DistillError: a student's training needs one (a missing test split only
    leaves the folder without one, with a warning unless `warn` is false: `settings_of` warned already)."""
    splits = {"train": data.train_split}
    for name, split in (("validation", data.validation_split), ("test", data.test_split)):
        if split and split_exists(data, split):
            splits[name] = split
        elif name == "validation":
            raise DistillError(missing_validation(split))
        elif split and warn:
            log.warning("data.%s_split %r: the corpus has no such split; the folder gets none", name, split)
    return splits


def missing_validation(split: str | None) -> str:
    """The refusal of a corpus without the validation split a student's training needs."""
    return (
        f"data.validation_split={split or '(none)'}: the corpus has no such split, and a student trained on the "
        "folder needs one for its validation; name one with --set data.validation_split=NAME"
    )


def distill(
    translator,
    data: DataConfig,
    output: str | os.PathLike,
    *,
    settings: dict,
    beam_size: int,
    chunk_size: int = 1000,
    progress: bool = False,
    on_chunk: Callable[[int], None] | None = None,
    on_truncated: Callable[[int, int], None] | None = None,
) -> Summary:
    """Writes (or completes) the distilled folder corpus `output` (module docstring); `settings` from `settings_of`.

    `chunk_size`: lines per recorded chunk, for a new folder (a resumed one keeps its own). `on_chunk(lines_done)`
    runs after each chunk is recorded; `on_truncated(index, subwords)` for a training source longer than the model
    allows (translated truncated). One process at a time per folder (a lock; `DistillError` for a second one)."""
    output = Path(output)
    finished = finished_manifest(output)
    if finished is not None:  # read without the lock: a finished folder may sit on a read-only mount
        _refuse_other_settings(output, _carried_over(finished["settings"], settings, data), settings)
        log.info("%s is complete already (%d pairs): nothing to do", output, finished["lines"])
        return Summary(output, finished["lines"], 0, finished["lines"], finished["references"])
    with hold(output):
        return _distill(
            translator, data, output, settings, beam_size, chunk_size, progress, on_chunk, on_truncated
        )


def _carried_over(recorded: dict, settings: dict, data: DataConfig) -> dict:
    """`recorded` settings with each corpus split recorded by a version before 2026-12-07d (another identity
    format) replaced by today's identity when it names the same text (before: such folders were refused, "changed
    since", and could be neither resumed nor found complete)."""
    there, now = recorded.get("corpus"), settings.get("corpus")
    if not isinstance(there, dict) or not isinstance(now, dict) or there == now:
        return recorded
    splits = _corpus_splits(data, warn=False)
    corpus = {
        name: now[name]
        if name in now and name in splits and legacy_identity_matches(data, splits[name], entry)
        else entry
        for name, entry in there.items()
    }
    return {**recorded, "corpus": corpus}


def _refuse_other_settings(output: Path, recorded: dict, settings: dict) -> None:
    changed = [k for k in sorted(set(recorded) | set(settings)) if recorded.get(k) != settings.get(k)]
    if changed:
        details = "; ".join(_difference(key, recorded.get(key), settings.get(key)) for key in changed)
        raise DistillError(
            f"{output} was distilled with other settings ({details}): give another folder, or the same "
            "settings to resume it"
        )


def _distill(translator, data, output, settings, beam_size, chunk_size, progress, on_chunk, on_truncated):
    manifest = _open(output, settings, chunk_size, data)
    if manifest.get("complete"):
        log.info("%s is complete already (%d pairs): nothing to do", output, manifest["lines"])
        return Summary(output, manifest["lines"], 0, manifest["lines"], manifest["references"])
    if "lines" not in manifest:  # first call: the sources and the real pairs, each file through a rename
        splits = _corpus_splits(data, warn=False)
        counts = {name: _copy_split(data, split, output, name) for name, split in splits.items()}
        manifest.update(lines=counts.pop("train"), references=counts, translated=0, bytes=0)
        save_manifest(output, manifest)  # from here on, the settings are the folder's
    if manifest["chunk_size"] != chunk_size:
        log.info("%s: chunks of %d lines, as recorded (not %d)", output, manifest["chunk_size"], chunk_size)
    target = data.target
    partial = output / f".{target}.train.txt.partial"
    done, offset = manifest["translated"], manifest["bytes"]
    resumed = done
    if done:
        log.info("resuming %s: %d of %d lines translated already", output, done, manifest["lines"])
    final = output / f"{target}.train.txt"
    if (
        done == manifest["lines"]
        and not partial.exists()
        and final.exists()
        and final.stat().st_size == offset
    ):
        # stopped between the rename and the manifest's save
        manifest.update(complete=True)
        save_manifest(output, manifest)
        return Summary(output, done, 0, done, manifest["references"])
    size = partial.stat().st_size if partial.exists() else 0
    if size < offset:
        raise DistillError(
            f"{partial} holds {size} bytes, {offset} were recorded in {MANIFEST}: the progress is damaged; delete "
            "the folder and distil again"
        )
    started, seconds = time.monotonic(), manifest.get("seconds", 0.0)
    with open(partial, "ab") as handle:
        handle.truncate(offset)  # a chunk cut short after the last record is dropped
        handle.seek(offset)
        with open(output / f"{data.source}.train.txt", "rb") as sources:
            lines = read_lines(sources)
            for _ in itertools.islice(lines, done):  # the lines translated already
                pass
            with _bar(progress, manifest["lines"], done) as bar:  # closed on a stop too: its line ends
                for chunk in chunked(lines, manifest["chunk_size"]):
                    truncated = (
                        None if on_truncated is None else functools.partial(_shifted, on_truncated, done)
                    )
                    translations = translator.translate(
                        chunk, beam_size=beam_size, on_truncated=truncated, first_line=done
                    )
                    with naming(partial):  # a full disk's error names no file
                        handle.write(
                            b"".join(one_line(text).encode("utf-8") + b"\n" for text in translations)
                        )
                        handle.flush()
                        os.fsync(handle.fileno())
                    done += len(chunk)
                    manifest.update(
                        translated=done,
                        bytes=handle.tell(),
                        seconds=round(seconds + time.monotonic() - started, 1),
                    )
                    save_manifest(output, manifest)
                    bar.update(len(chunk))
                    if on_chunk is not None:
                        on_chunk(done)
    if done != manifest["lines"]:
        raise DistillError(
            f"{output / f'{data.source}.train.txt'} has {done} lines, {manifest['lines']} were written: the folder "
            "was changed by hand; delete it and distil again"
        )
    os.replace(partial, final)
    manifest.update(complete=True)
    save_manifest(output, manifest)
    return Summary(output, done, done - resumed, resumed, manifest["references"])


def _open(output: Path, settings: dict, chunk_size: int, data: DataConfig) -> dict:
    """The folder's manifest; a new one while nothing is recorded but the settings (they may still change: e.g. a
    corpus fixed after its copy failed); `DistillError` for a folder of other settings or a damaged manifest."""
    path = output / MANIFEST
    if path.exists():
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
            recorded = manifest["settings"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise DistillError(f"{path} cannot be read ({err}): delete the folder and distil again") from err
        if "lines" in manifest and (carried := _carried_over(recorded, settings, data)) != recorded:
            manifest["settings"] = recorded = carried
            save_manifest(output, manifest)
        if "lines" in manifest:
            _refuse_other_settings(output, recorded, settings)
        if recorded == settings:
            return manifest
        # what the replaced settings' copy wrote (their languages, their splits)
        for stale in output.iterdir():
            if FILE_NAME.match(stale.name) or stale.name.endswith((".tmp", ".partial")):
                stale.unlink()
    manifest = {"settings": settings, "chunk_size": chunk_size}
    save_manifest(output, manifest)
    return manifest


def _difference(key: str, there, now) -> str:
    if key == "corpus" and isinstance(there, dict) and isinstance(now, dict):
        splits = sorted(s for s in set(there) | set(now) if there.get(s) != now.get(s))
        return f"corpus: split(s) {', '.join(splits)} changed since (their text or versions)"
    return f"{key}: {there!r} there, {now!r} now"


def _copy_split(data: DataConfig, split: str, output: Path, name: str) -> int:
    """The corpus's `split` as `<source>.<name>.txt` and `<target>.<name>.txt` (one line per sentence); pairs.

    For train, the sources only: the targets are the teacher's."""
    languages = (data.source,) if name == "train" else (data.source, data.target)
    paths = [output / f"{language}.{name}.txt" for language in languages]
    temporary = [path.with_name(f".{path.name}.tmp") for path in paths]
    handles = [open(path, "wb") for path in temporary]  # noqa: SIM115 - closed below
    count, sources = 0, 0
    damaged = {
        (kind, path.name): set() for path in paths for kind in ("utf8", "nul")
    }  # -> line numbers (from 1)

    def warner(name: str):
        return lambda line_number, kind, message: damaged[kind, name].add(line_number)

    warners = [warner(path.name) for path in paths]
    try:
        for pair in stream_pairs(data, split):
            for handle, chunk, warn, path in zip(handles, pair, warners, paths):
                with naming(path):  # a full disk's error names no file
                    handle.write(b"".join(_line(raw, count + i + 1, warn) for i, raw in enumerate(chunk)))
            sources += sum(1 for raw in pair[0] if raw.strip())
            count += len(pair[0])
        invalid = set().union(*(lines for (kind, _), lines in damaged.items() if kind == "utf8"))  # pairs
        DropCounts(total=count, invalid_utf8=len(invalid)).refuse_another_encoding(
            f"split {split!r} of the corpus"
        )
        if name == "train" and not sources:
            raise DistillError(
                f"split {split!r} of the corpus has no source sentence to translate ({count} lines)"
            )
        for handle, path in zip(handles, paths):
            with naming(path):
                handle.flush()
                os.fsync(handle.fileno())
    except BaseException:
        for handle, tmp in zip(handles, temporary):
            with contextlib.suppress(OSError):  # its buffer's flush fails again on a full disk
                handle.close()
            tmp.unlink(missing_ok=True)
        raise
    for handle in handles:
        handle.close()
    for tmp, path in zip(temporary, paths):
        os.replace(tmp, path)
    what = {"utf8": "had invalid UTF-8 (replaced with U+FFFD)", "nul": "had NUL bytes (removed)"}
    for (kind, name), lines in damaged.items():
        if lines := sorted(lines):
            shown = ", ".join(map(str, lines[:10])) + (", ..." if len(lines) > 10 else "")
            log.warning("split %r, %s: %d line(s) %s: line %s", split, name, len(lines), what[kind], shown)
    log.info("%s: %d pairs of split %r", output, count, split)
    return count


def _shifted(callback: Callable[[int, int], None], start: int, index: int, length: int) -> None:
    callback(start + index, length)  # an index in the chunk -> in the split


def _line(raw: bytes, line_number: int = 0, warn=None) -> bytes:
    return one_line(decode_line(raw, line_number, warn)).encode("utf-8") + b"\n"


def _bar(enabled: bool, total: int, done: int):
    from tqdm import tqdm

    from nmt.progress import bar_settings

    # in a log file, a line every LOG_INTERVAL seconds instead of carriage returns (nmt.progress)
    return tqdm(
        total=total, initial=done, unit="line", desc="distilling", disable=not enabled, **bar_settings()
    )
