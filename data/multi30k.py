"""A TFDS builder for Multi30k (WMT16 multimodal translation task 1, text only; en, de, fr).

TFDS has no Multi30k builder. This one reads the upstream raw files of the multi30k/dataset repository,

    data/task1/raw/{train,val,test_2016_flickr}.{en,de,fr}.gz    (29,000 / 1,014 / 1,000 aligned lines)

from a local mirror when one is given (the TFDS `manual_dir` convention: `DownloadConfig(manual_dir=...)`, the
files stored flat as `train.en.gz`, `val.de.gz`, ...; uncompressed `train.en` is accepted too), else downloads
them with the download manager. Every problem with a source file is a `DataError` naming the file: missing,
empty, not gzip, not UTF-8, or a line count that differs from the other language of the pair. Nothing is
truncated silently. TFDS writes into a temporary directory and renames it when everything succeeded, so a failed
prepare leaves no half-prepared dataset behind, and a second prepare reuses the finished one.

    builder = Multi30k(config="en-de", data_dir=tmp)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=mirror))
    ds = builder.as_dataset(split="validation")  # {"en": tf.string, "de": tf.string}, corpus order

One builder config per unordered language pair (`en-de`, `en-fr`, `de-fr`); the direction is chosen by reading
the source and target features. Examples keep corpus order (`disable_shuffling`), so references line up.

Reference: Elliott, Frank, Sima'an and Specia (2016), "Multi30K: Multilingual English-German Image
Descriptions", Proceedings of the 5th Workshop on Vision and Language.
"""

from __future__ import annotations

import dataclasses
import gzip
import socket
import urllib.parse
import zlib
from pathlib import Path

import tensorflow_datasets as tfds
from etils import epath

from data.config import MULTI30K_LANGUAGES
from data.errors import DataError

URL_TEMPLATE = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{stem}.{lang}.gz"
SPLIT_STEMS = {"train": "train", "validation": "val", "test": "test_2016_flickr"}  # TFDS split -> file stem
LANGUAGES = MULTI30K_LANGUAGES
MIRROR_HINT = (
    "give a mirror of the upstream raw files (train/val/test_2016_flickr.{en,de,fr}.gz, stored flat) as "
    "data.manual_dir, or in $NMT_DATA_MIRROR, or at <repo>/../shared/data/multi30k"
)

_CITATION = """\
@inproceedings{elliott-etal-2016-multi30k,
  title = {Multi30K: Multilingual English-German Image Descriptions},
  author = {Elliott, Desmond and Frank, Stella and Sima'an, Khalil and Specia, Lucia},
  booktitle = {Proceedings of the 5th Workshop on Vision and Language},
  year = {2016},
  pages = {70--74},
}"""


@dataclasses.dataclass(eq=False)
class Multi30kConfig(tfds.core.BuilderConfig):
    """One unordered language pair; both languages are features of every example."""

    languages: tuple[str, str] = ("en", "de")


def _pair_config(first: str, second: str) -> Multi30kConfig:
    return Multi30kConfig(
        name=f"{first}-{second}",
        languages=(first, second),
        description=f"Multi30k task 1, {first} and {second} sentences of the same image description.",
    )


def config_name(source: str, target: str) -> str:
    """The builder config holding `source` and `target` (either order); `DataError` if there is none."""
    for config in Multi30k.BUILDER_CONFIGS:
        if {source, target} == set(config.languages) and source != target:
            return config.name
    unknown = [lang for lang in (source, target) if lang not in LANGUAGES]
    if unknown:
        raise DataError(f"language {unknown[0]!r} is not in multi30k (it has: {', '.join(LANGUAGES)})")
    pairs = ", ".join(c.name for c in Multi30k.BUILDER_CONFIGS)
    raise DataError(f"multi30k has no language pair {source}-{target} (pairs: {pairs})")


def read_lines(path: Path | str) -> list[str]:
    """All lines of a (gzipped) UTF-8 text file, split on "\\n" only (never on other Unicode breaks).

    A trailing newline ends the last line; a final "\\r" on a line (CRLF files) and a leading BOM are removed.
    Raises `DataError` naming the file if it is unreadable, not valid gzip, not UTF-8 or has no text.
    """
    path = epath.Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise DataError(f"cannot read {path}: {err}") from err
    if path.name.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:
            raise DataError(f"{path} is not a valid gzip file: {err}") from err
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise DataError(f"{path} is not valid UTF-8 (line {line}, byte {err.start}: {err.reason})") from err
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise DataError(f"{path} is empty: a corpus file needs one sentence per line")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


class Multi30k(tfds.core.GeneratorBasedBuilder):
    """Multi30k task 1 translation pairs: features `{lang1: Text, lang2: Text}`, splits train/validation/test."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Task 1 raw text: train, val (validation), test_2016_flickr (test)."}
    BUILDER_CONFIGS = [_pair_config("en", "de"), _pair_config("en", "fr"), _pair_config("de", "fr")]
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Optional. Put the upstream files data/task1/raw/{train,val,test_2016_flickr}.{en,de,fr}.gz of "
        "github.com/multi30k/dataset in one flat folder and pass it as download_config.manual_dir."
    )

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:
        # TFDS 4.9.10 derives this through the `importlib_resources` backport, which it does not install.
        return epath.Path(__file__)

    def _info(self) -> tfds.core.DatasetInfo:
        # Built directly: `dataset_info_from_configs` looks for package metadata this module does not ship.
        languages = self.builder_config.languages
        return tfds.core.DatasetInfo(
            builder=self,
            description="Multi30k (WMT16 multimodal translation task 1): image descriptions, text only.",
            features=tfds.features.Translation(languages=languages),
            supervised_keys=languages,
            homepage="https://github.com/multi30k/dataset",
            citation=_CITATION,
            disable_shuffling=True,  # keep corpus order, so hypotheses line up with raw references
        )

    def _source_files(self, dl_manager: tfds.download.DownloadManager) -> dict[tuple[str, str], epath.Path]:
        """(split, language) -> local file, from the mirror if there is one, else downloaded."""
        wanted = [(split, lang) for split in SPLIT_STEMS for lang in self.builder_config.languages]
        try:
            mirror = dl_manager.manual_dir  # raises if the folder is absent or empty
        except AssertionError:
            given = getattr(dl_manager, "_manual_dir", None)
            if given is not None and epath.Path(given).is_dir():  # given and there, but empty: no download
                raise DataError(f"Multi30k mirror {given} is empty: {MIRROR_HINT}") from None
            mirror = None
        if mirror is not None:
            files = {}
            for split, lang in wanted:
                name = f"{SPLIT_STEMS[split]}.{lang}"
                candidates = [mirror / f"{name}.gz", mirror / name]
                found = [path for path in candidates if path.exists()]
                if not found:
                    raise DataError(
                        f"Multi30k mirror {mirror} is missing {name}.gz (upstream data/task1/raw/{name}.gz)"
                    )
                files[split, lang] = found[0]
            return files
        urls = {
            f"{split}.{lang}": URL_TEMPLATE.format(stem=SPLIT_STEMS[split], lang=lang)
            for split, lang in wanted
        }
        _check_reachable(URL_TEMPLATE)
        try:
            paths = dl_manager.download(urls)
        except Exception as err:  # noqa: BLE001 - any failure here means: no usable network
            looked = getattr(dl_manager, "_manual_dir", None)
            raise DataError(
                f"cannot download Multi30k ({type(err).__name__}: {err}); no mirror at {looked}. "
                f"Without network, {MIRROR_HINT}."
            ) from err
        return {(split, lang): epath.Path(paths[f"{split}.{lang}"]) for split, lang in wanted}

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        files = self._source_files(dl_manager)
        first, second = self.builder_config.languages
        generators = {}
        for split in SPLIT_STEMS:
            lines = {lang: read_lines(files[split, lang]) for lang in (first, second)}
            if len(lines[first]) != len(lines[second]):
                raise DataError(
                    f"Multi30k {split}: line counts differ: {files[split, first]} has {len(lines[first])} lines, "
                    f"{files[split, second]} has {len(lines[second])}"
                )
            generators[split] = self._generate_examples(lines)
        return generators

    def _generate_examples(self, lines: dict[str, list[str]]):
        """Yields (line index, {lang: sentence}) in corpus order."""
        languages = list(lines)
        for index, sentences in enumerate(zip(*(lines[lang] for lang in languages))):
            yield index, dict(zip(languages, sentences))


def check_host(url: str, timeout: float = 5.0) -> None:
    """Opens (and closes) a TCP connection to the host of `url`, on its scheme's port; the OSError if it cannot.

    The fail-fast test before a TFDS download: without it, TFDS's downloader retries each file with growing delays
    (minutes per file) on a machine without network before giving up.
    """
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (80 if parts.scheme == "http" else 443)
    socket.create_connection((parts.hostname, port), timeout=timeout).close()


def _check_reachable(url: str, timeout: float = 5.0) -> None:
    """Fails fast, with the mirror hint, when the download host cannot be reached (see `check_host`)."""
    host = urllib.parse.urlsplit(url).hostname
    try:
        check_host(url, timeout)
    except OSError as err:
        raise DataError(
            f"cannot download Multi30k: no mirror was found and {host} is unreachable ({err}). "
            f"Without network, {MIRROR_HINT}."
        ) from err
