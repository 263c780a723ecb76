"""A synthetic parallel corpus of any size, as a `folder` corpus, for benchmarks (never shipped as data).

    python -m benchmarks.synthetic_corpus --pairs 500000 --out /tmp/corpus-500k [--mirror DIR]

Pair k joins two Multi30k train pairs drawn at random (seeded): "<en a> <en b>" / "<de a> <de b>", so sentences
are about twice Multi30k's length and the vocabulary is Multi30k's. Writes `en.train.txt` and `de.train.txt` (N
pairs) and `en.validation.txt` / `de.validation.txt` (Multi30k's validation split as is), streaming in blocks:
memory stays at Multi30k's size whatever N. A hidden `.complete` file is written last; an existing complete corpus of the
same size and seed is reused.

The Multi30k mirror: `--mirror` (`mirror`) if given, else where `data.corpus.find_mirror` looks ($NMT_DATA_MIRROR,
else <repo>/../shared/data/multi30k). One without the raw train and validation files is a `DataError` naming it.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import numpy as np

from benchmarks.common import positive_int

BLOCK = 100_000
LANGUAGES = ("en", "de")
MIRROR_FILES = tuple(f"{split}.{lang}.gz" for split in ("train", "val") for lang in LANGUAGES)


def multi30k_mirror(mirror: str | Path | None = None) -> Path:
    """The folder of Multi30k's raw files to draw from: `mirror`, else `data.corpus.find_mirror`'s for Multi30k
    ($NMT_DATA_MIRROR, else <repo>/../shared/data/multi30k). A `DataError` if there is none or it lacks a file."""
    from data.config import DataConfig
    from data.corpus import MIRROR_ENV, find_mirror
    from data.errors import DataError

    if mirror is None:
        mirror = find_mirror(DataConfig(dataset="multi30k"))
        if mirror is None:
            raise DataError(
                f"the synthetic corpus needs a Multi30k mirror (raw {', '.join(MIRROR_FILES)}): point "
                f"${MIRROR_ENV} (or synthetic_corpus's --mirror) at its folder"
            )
    mirror = Path(mirror).expanduser().absolute()
    missing = [name for name in MIRROR_FILES if not (mirror / name).is_file()]
    if missing:
        raise DataError(
            f"Multi30k mirror {mirror} has no {', '.join(missing)} (the synthetic corpus is drawn from them): "
            f"point ${MIRROR_ENV} (or synthetic_corpus's --mirror) at a folder of Multi30k's raw files"
        )
    return mirror


def _lines(path: Path) -> list[str]:
    return gzip.decompress(path.read_bytes()).decode("utf-8").rstrip("\n").split("\n")


def write_corpus(out: Path, pairs: int, *, mirror: str | Path | None = None, seed: int = 0) -> Path:
    """Writes (or reuses) a folder corpus of `pairs` training pairs into `out`; returns `out`.

    `mirror`: the Multi30k mirror (default: `multi30k_mirror`'s); checked first, a `DataError` if unusable."""
    mirror = multi30k_mirror(mirror)
    out = Path(out)
    marker = out / ".complete"
    spec = {"pairs": pairs, "seed": seed, "mirror": str(mirror)}
    if marker.is_file() and json.loads(marker.read_text()) == spec:
        return out
    out.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    train = {lang: np.array(_lines(mirror / f"train.{lang}.gz"), dtype=object) for lang in LANGUAGES}
    rng = np.random.default_rng(seed)
    handles = {lang: open(out / f"{lang}.train.txt", "w", encoding="utf-8") for lang in LANGUAGES}  # noqa: SIM115
    try:
        for start in range(0, pairs, BLOCK):
            size = min(BLOCK, pairs - start)
            first, second = rng.integers(0, len(train["en"]), (2, size))
            for lang, handle in handles.items():
                joined = [f"{a} {b}" for a, b in zip(train[lang][first], train[lang][second])]
                handle.write("\n".join(joined) + "\n")
    finally:
        for handle in handles.values():
            handle.close()
    for lang in LANGUAGES:
        (out / f"{lang}.validation.txt").write_text("\n".join(_lines(mirror / f"val.{lang}.gz")) + "\n")
    marker.write_text(json.dumps(spec))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=positive_int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--mirror", help="Multi30k's raw files (default: $NMT_DATA_MIRROR, else ../shared/data/multi30k)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write_corpus(Path(args.out), args.pairs, mirror=args.mirror, seed=args.seed))
    return 0


if __name__ == "__main__":
    from nmt import cli

    cli.run(main)  # a missing mirror or a taken --out: one line, exit 1
