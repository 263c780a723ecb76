"""Raw parallel text for a `DataConfig`: Multi30k, any TFDS catalog translation dataset, or a folder of files.

    load_split(cfg, "validation")       -> tf.data.Dataset of {"source": tf.string (), "target": tf.string ()}
    load_text_pairs(cfg, "validation")  -> (sources, targets), lists of str in corpus order (BLEU references)
    split_sizes(cfg)                     -> {"train": 29000, "validation": 1014, "test": 1000}

`cfg.dataset` selects the corpus:
- "multi30k": `data.multi30k.Multi30k`, prepared into `cfg.data_dir` from a mirror of the raw files, found as
  `cfg.manual_dir`, else `$NMT_DATA_MIRROR`, else `<repo root>/../shared/data/multi30k`; else downloaded.
- "folder": a folder of files named `<lang>.<split>.txt` (e.g. `en.train.txt`, `de.train.txt`), one sentence
  per line, line-aligned across languages, read line by line by `data.folder`.
- anything else: a TFDS catalog name such as "ted_hrlr_translate/pt_to_en" or "wmt14_translate/de-en", whose
  features are per-language texts; `cfg.source` and `cfg.target` pick two of them.

Problems are `DataError`s that say what to change: unknown dataset, language or split, a malformed folder, a
dataset that needs the network on a machine without it, or a prepared TFDS directory that lost a file or holds a
damaged dataset_info.json (the directory to delete is named).
"""

from __future__ import annotations

import logging
import os
import urllib.parse
from pathlib import Path

import tensorflow as tf
import tensorflow_datasets as tfds

from data.cache import exclusive
from data.config import FOLDER, DataConfig
from data.errors import DataError
from data.multi30k import Multi30k, check_host, config_name

log = logging.getLogger(__name__)

MULTI30K = "multi30k"
MIRROR_ENV = "NMT_DATA_MIRROR"
REPO_ROOT = Path(__file__).resolve().parent.parent


def find_mirror(cfg: DataConfig) -> Path | None:
    """The local mirror of the raw files: cfg.manual_dir, else $NMT_DATA_MIRROR, else ../shared/data/<name>.

    An explicit setting that does not exist is an error; the default location is optional (None if absent).
    """
    for origin, value in (
        ("data.manual_dir", cfg.manual_dir),
        (f"${MIRROR_ENV}", os.environ.get(MIRROR_ENV)),
    ):
        if value:
            path = Path(value).expanduser()
            if not path.is_dir():
                raise DataError(f"{origin}={value}: no such directory (it should hold the raw corpus files)")
            return path
    default = REPO_ROOT.parent / "shared" / "data" / cfg.dataset.split("/")[0]
    return default if default.is_dir() else None


def mirror_places(cfg: DataConfig) -> str:
    """Where `find_mirror` looked, for a message: the setting it used, else all three places (never "None")."""
    if cfg.manual_dir:
        return f"data.manual_dir={cfg.manual_dir}"
    if os.environ.get(MIRROR_ENV):
        return f"${MIRROR_ENV}={os.environ[MIRROR_ENV]}"
    default = REPO_ROOT.parent / "shared" / "data" / cfg.dataset.split("/")[0]
    state = "" if default.is_dir() else ", absent"
    return f"data.manual_dir (unset), ${MIRROR_ENV} (unset), {default}{state}"


def _check_downloadable(builder: tfds.core.DatasetBuilder, cfg: DataConfig, mirror: Path | None) -> None:
    """A DataError, at once, when a catalog dataset must download a file from a host that cannot be reached.

    Without it TFDS's downloader retries (delays up to 102 s, about 3.5 minutes) before failing on a machine without
    network. Files TFDS will not download are skipped: those in the mirror (TFDS reads `<mirror>/<file name>` of
    its registered URLs) and those in its download cache. A builder that registers no URLs is left to TFDS.
    """
    from tensorflow_datasets.core.download.resource import get_dl_fname

    downloads = Path(builder.data_dir_root) / "downloads"
    needed = {}
    for url, info in (builder.url_infos or {}).items():
        name = info.filename or Path(urllib.parse.urlsplit(url).path).name
        cached = {get_dl_fname(url, info.checksum or None), get_dl_fname(url)}
        places = [downloads / n for n in cached] + [downloads / builder.name / n for n in cached]
        if not (mirror is not None and (mirror / name).exists()) and not any(p.exists() for p in places):
            needed[url] = name
    for url in {urllib.parse.urlsplit(url).hostname: url for url in needed}.values():
        try:
            check_host(url)
        except OSError as err:
            files = ", ".join(f"{name} ({source})" for source, name in needed.items())
            raise DataError(
                f"cannot prepare TFDS dataset {cfg.dataset}: {urllib.parse.urlsplit(url).hostname} is unreachable "
                f"({err}). Without network: put its raw files {files} in a mirror (data.manual_dir or "
                f"${MIRROR_ENV}; looked at {mirror_places(cfg)}), or prepare it where there is one and copy the "
                f"prepared folder into data.data_dir ({builder.data_dir_root})."
            ) from err


def preparation_lock(builder: tfds.core.DatasetBuilder) -> Path:
    """Where `_prepare` takes its lock (the path plus ".lock"), one per dataset version and config in a data_dir.

    One preparation at a time: TFDS alone lets a second process remove the first one's files mid-write (two first
    trainings started together: "Failed to finalize writing of split ...: No such file or directory").
    """
    variant = builder.builder_config.name if builder.builder_config else "default"
    return Path(builder.data_dir_root) / f".{builder.name}-{variant}-{builder.version}"


def _prepare(builder: tfds.core.DatasetBuilder, cfg: DataConfig) -> None:
    """download_and_prepare, reusing prepared data; errors that need a person become `DataError`s.

    The mirror is looked for only when the dataset is not prepared: prepared data never reads it again, so a mirror
    moved since (a run's config.yaml keeps its data.manual_dir) does not stop an evaluation or a resume (before
    2026-12-07d: "data.manual_dir=...: no such directory")."""
    prepared = builder.is_prepared()
    mirror = None if prepared else find_mirror(cfg)
    # Multi30k checks its own host
    if not prepared and not isinstance(builder, Multi30k):
        _check_downloadable(builder, cfg, mirror)
    config = tfds.download.DownloadConfig(manual_dir=mirror, try_download_gcs=False)
    # TFDS's own line says "Downloading" for local files too
    if mirror is not None:
        log.info(
            "preparing %s from the local files in %s (into %s)", builder.name, mirror, builder.data_dir_root
        )
    try:
        with exclusive(preparation_lock(builder), required=False):
            builder.download_and_prepare(download_config=config)
    except DataError:
        raise
    except ModuleNotFoundError as err:
        raise DataError(
            f"preparing {builder.name} needs the Python package {err.name!r}, which TFDS 4.9.10 uses without "
            f"declaring it: pip install {err.name}"
        ) from err
    except Exception as err:  # noqa: BLE001 - typically no network; chained for the traceback
        raise DataError(
            f"cannot prepare TFDS dataset {cfg.dataset} in {builder.data_dir_root} ({type(err).__name__}: {err}). "
            "If this machine has no network: prepare it where there is one and copy the prepared folder into "
            "data.data_dir, or put its raw files in a mirror (data.manual_dir or "
            f"${MIRROR_ENV}; looked at {mirror_places(cfg)})."
        ) from err
    _check_complete(builder, cfg)


def _check_complete(builder: tfds.core.DatasetBuilder, cfg: DataConfig) -> None:
    """The prepared version directory has what TFDS reads: its dataset_info.json, some splits, their files.

    TFDS reuses any existing version directory without looking in it: one that lost a file (a partial copy, an
    interrupted deletion) would fail later, as a traceback ("splits is empty", a FileNotFoundError for a shard).
    """
    directory = builder.data_path
    # nothing written: only tfds.testing.mock_data's preparation does nothing (its examples are generated)
    if not directory.exists():
        return
    if not builder.is_prepared():
        missing = "no dataset_info.json"
    elif not builder.info.splits:
        missing = "its dataset_info.json lists no splits"
    else:
        absent = []
        for name, split in builder.info.splits.items():
            try:
                absent += [path.name for path in split.filepaths if not path.is_file()]
            except ValueError:
                # TFDS knows no file names for the split
                absent.append(f"the files of split {name!r}")
        missing = "missing: " + ", ".join(absent[:3]) + (" ..." if len(absent) > 3 else "") if absent else ""
    if missing:
        raise DataError(
            f"the prepared TFDS dataset {cfg.dataset!r} in {directory} is incomplete ({missing}): delete "
            f"{directory} and prepare again"
        )


def _construct(make, cfg: DataConfig) -> tfds.core.DatasetBuilder:
    """make(), the builder, which reads the dataset_info.json of a prepared version: one that cannot be read (cut,
    emptied) is a DataError naming it, not a protobuf ParseError."""
    from google.protobuf.json_format import ParseError

    try:
        return make()
    # AssertionError: TFDS's check that the file is of the builder's version
    except (ParseError, OSError, UnicodeDecodeError, AssertionError) as err:
        reason = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0].rstrip('.')}"
        root = Path(cfg.data_dir or tfds.core.constants.get_default_data_dir()).expanduser()
        base = root / cfg.dataset.split("/")[0].split(":")[0]
        # <name>/<config>/<version>/, or <name>/<version>/ for a dataset without configs
        infos = sorted({*base.glob("*/*/dataset_info.json"), *base.glob("*/dataset_info.json")})
        bad = [path for path in infos if not _readable_info(path)]
        where = ", ".join(map(str, bad)) or f"a dataset_info.json under {base}"
        delete = ", ".join(str(path.parent) for path in bad) or str(base)
        raise DataError(
            f"the prepared TFDS dataset {cfg.dataset!r} is damaged: {where} cannot be read ({reason}): delete "
            f"{delete} and prepare again"
        ) from err


def _readable_info(path: Path) -> bool:
    """Whether TFDS reads the dataset_info.json at `path` as the one of its version directory."""
    try:
        return tfds.core.dataset_info.read_from_json(path).version == path.parent.name
    except Exception:  # noqa: BLE001 - any reason: it is named
        return False


def tfds_builder(cfg: DataConfig) -> tfds.core.DatasetBuilder:
    """The prepared builder for cfg.dataset (Multi30k or a TFDS catalog name; not a folder).

    Checked before anything reads it: the languages before preparing (the features are known without the data: a
    wrong data.source or data.target does not wait for a download), and the config's split names once the split
    sizes are known (a malformed or out-of-range slice is named before a tokenizer is trained or a split read).
    """
    if cfg.dataset == MULTI30K:
        builder = _construct(
            lambda: Multi30k(config=config_name(cfg.source, cfg.target), data_dir=cfg.data_dir), cfg
        )
        _check_languages(builder, cfg)
        # a download failure names the mirror locations (MIRROR_HINT)
        _prepare(builder, cfg)
        _check_config_splits(builder, cfg)
        return builder
    if cfg.dataset == FOLDER:
        raise ValueError("a folder corpus has no TFDS builder: read it with data.folder")
    try:
        builder = _construct(lambda: tfds.builder(cfg.dataset, data_dir=cfg.data_dir), cfg)
    except tfds.core.registered.DatasetNotFoundError as err:
        first_line = str(err).splitlines()[0]
        raise DataError(
            f"unknown dataset {cfg.dataset!r} ({first_line}): data.dataset must be 'multi30k', 'folder' or a "
            "TFDS catalog name such as 'ted_hrlr_translate/pt_to_en'"
        ) from err
    except ValueError as err:  # e.g. an unknown builder config
        raise DataError(f"data.dataset={cfg.dataset!r}: {err}") from err
    _check_languages(builder, cfg)
    _prepare(builder, cfg)
    _check_config_splits(builder, cfg)
    return builder


def _check_languages(builder: tfds.core.DatasetBuilder, cfg: DataConfig) -> None:
    features = builder.info.features
    keys = list(features.keys()) if hasattr(features, "keys") else []
    for key, lang in (("data.source", cfg.source), ("data.target", cfg.target)):
        if lang not in keys:
            raise DataError(
                f"{key}={lang!r}: language not in dataset {cfg.dataset!r} (it has: {', '.join(keys) or 'none'})"
            )


def split_problem(builder: tfds.core.DatasetBuilder, cfg: DataConfig, split: str) -> str | None:
    """Why `split` cannot be read from the prepared `builder` (an unknown split name, a malformed slice, a slice
    out of the split's range), or None (also when TFDS does not know the dataset's splits)."""
    splits = builder.info.splits
    names = list(splits.keys())
    if not names:
        return None
    if split.split("[")[0] not in names:
        return f"split {split!r} is not in dataset {cfg.dataset!r} (splits: {', '.join(names)})"
    try:
        absolute = tfds.core.ReadInstruction.from_spec(split).to_absolute(splits)
    except ValueError as err:
        # TFDS's reason is on its last line ("Unrecognized split format: ...", "Requested slice [5000:1014] ...")
        reason = str(err).strip().splitlines()[-1]
        return f"split {split!r} of dataset {cfg.dataset!r} cannot be read: {reason}"
    # a reversed slice ("[5:2]", in any part of "a+b": TFDS fails reading it, calling the files damaged) or one
    # selecting nothing ("[:0]", "[:1%]" of a small split: TFDS reads it as no data)
    sizes = {name: splits[name].num_examples for name in names}
    if not any(sizes.values()):  # TFDS does not know the sizes: nothing to compare
        return None
    ranges = [
        (part.from_ or 0, sizes.get(part.splitname, 0) if part.to is None else part.to) for part in absolute
    ]
    if any(end < start for start, end in ranges):
        return f"split {split!r} of dataset {cfg.dataset!r} has a reversed slice"
    if sum(end - start for start, end in ranges) <= 0:
        return f"split {split!r} of dataset {cfg.dataset!r} selects no examples (an empty slice)"
    return None


def _check_split(builder: tfds.core.DatasetBuilder, cfg: DataConfig, split: str, key: str = "") -> None:
    problem = split_problem(builder, cfg, split)
    if problem:
        raise DataError(f"{key}: {problem}" if key else problem)


def _check_config_splits(builder: tfds.core.DatasetBuilder, cfg: DataConfig) -> None:
    """The config's splits whose name the dataset has are readable as given (their slices parse and fit).

    A split name the dataset lacks is left to its user: a missing test split is allowed (the corpus has none).
    """
    names = builder.info.splits.keys()
    for key in ("data.train_split", "data.validation_split", "data.test_split"):
        split = getattr(cfg, key.removeprefix("data."))
        if split and split.split("[")[0] in names:
            _check_split(builder, cfg, split, key)


def load_batches(cfg: DataConfig, split: str, batch_size: int = 4096) -> tf.data.Dataset:
    """Like `load_split`, in batches `{"source": tf.string (b,), "target": tf.string (b,)}` (b <= batch_size).

    Faster than `load_split` for a whole pass: the renaming runs once per batch, not once per sentence.
    """
    if cfg.dataset == FOLDER:
        from data import folder

        folder.split_files(cfg, split)  # errors now, not at the first read
        signature = {key: tf.TensorSpec([None], tf.string) for key in ("source", "target")}

        def batches():
            for sources, targets in folder.stream(cfg, split, batch_size):
                yield {"source": sources, "target": targets}

        return tf.data.Dataset.from_generator(batches, output_signature=signature)
    builder = tfds_builder(cfg)
    _check_split(builder, cfg, split)
    ds = builder.as_dataset(split=split, shuffle_files=False).batch(batch_size)
    source, target = cfg.source, cfg.target
    rename = tf.autograph.experimental.do_not_convert(lambda ex: {"source": ex[source], "target": ex[target]})
    return ds.map(rename)


def load_split(cfg: DataConfig, split: str) -> tf.data.Dataset:
    """One split as `{"source": tf.string (), "target": tf.string ()}` examples, in corpus order.

    Args:
      cfg: the data config (dataset, languages, data_dir, manual_dir, folder).
      split: a split name of the dataset ("train", "validation", "test"; TFDS slicing like "train[:1%]" works
        for TFDS datasets).
    """
    return load_batches(cfg, split).unbatch()


def load_text_pairs(
    cfg: DataConfig, split: str, *, every_line: bool = False, kept: list[bool] | None = None
) -> tuple[list[str], list[str]]:
    """The raw (untokenized) sources and targets of a split, in corpus order, as Python strings.

    For a folder corpus, the pairs `data.cleaning` drops (as preparation does) are left out, with a warning; with
    `every_line` (evaluation: BLEU on a split), every line pair is kept, as sacreBLEU would score the files: blank
    lines stay, invalid UTF-8 becomes U+FFFD (with a warning) and NUL bytes are removed, as evaluate.py reads a
    --source/--reference pair of files. `kept` (if given, with `every_line`) gets, per pair, whether preparation
    keeps it (`data.cleaning.usable`): a loss over some of the lines counts those the prepared split has.
    """
    from data.cleaning import usable

    if cfg.dataset == FOLDER:
        from data import folder
        from data.cleaning import DropCounts, clean, decode_every_line

        def read(raw_sources, raw_targets, counts):
            if every_line:
                return decode_every_line(raw_sources, raw_targets, counts, kept)
            return clean(raw_sources, raw_targets, counts)

        sources, targets, counts = [], [], DropCounts()
        for raw_sources, raw_targets in folder.stream(cfg, split, 4096):
            kept_sources, kept_targets = read(raw_sources, raw_targets, counts)
            sources += kept_sources
            targets += kept_targets
        where = f"split {split!r} of data.folder={cfg.folder}"
        counts.refuse_another_encoding(where)
        if every_line and counts.invalid_utf8:
            log.warning("%s: %d pair(s) with invalid UTF-8, replaced with U+FFFD", where, counts.invalid_utf8)
        elif counts.dropped and not every_line:
            log.warning("%s: %s", where, counts.summary())
        return sources, targets
    sources, targets = [], []
    for batch in load_batches(cfg, split).as_numpy_iterator():
        sources.extend(s.decode("utf-8") for s in batch["source"])
        targets.extend(t.decode("utf-8") for t in batch["target"])
        if kept is not None:
            kept.extend(usable(s, t) for s, t in zip(batch["source"], batch["target"]))
    return sources, targets


def split_sizes(cfg: DataConfig) -> dict[str, int]:
    """Split name -> number of pairs, for every split of the dataset (counted if TFDS does not know them)."""
    if cfg.dataset == FOLDER:
        from data import folder

        return folder.sizes(cfg)
    builder = tfds_builder(cfg)
    sizes = {name: int(info.num_examples) for name, info in builder.info.splits.items()}
    if sizes:
        return sizes
    names = dict.fromkeys([cfg.train_split, cfg.validation_split, cfg.test_split])
    return {name: int(builder.as_dataset(split=name).reduce(0, lambda n, _: n + 1)) for name in names}
