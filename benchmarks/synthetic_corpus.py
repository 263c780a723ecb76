"""A synthetic parallel corpus of any size, as a `folder` corpus, for benchmarks (never shipped as data).

    python -m benchmarks.synthetic_corpus --pairs 500000 --out /tmp/corpus-500k [--mirror ../shared/data/multi30k]

Pair k joins two Multi30k train pairs drawn at random (seeded): "<en a> <en b>" / "<de a> <de b>", so sentences
are about twice Multi30k's length and the vocabulary is Multi30k's. Writes `en.train.txt` and `de.train.txt` (N
pairs) and `en.validation.txt` / `de.validation.txt` (Multi30k's validation split as is), streaming in blocks:
memory stays at Multi30k's size whatever N. A hidden `.complete` file is written last; an existing complete corpus of the
same size and seed is reused.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import numpy as np

from benchmarks.common import positive_int

DEFAULT_MIRROR = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
BLOCK = 100_000
LANGUAGES = ("en", "de")


def _lines(path: Path) -> list[str]:
    return gzip.decompress(path.read_bytes()).decode("utf-8").rstrip("\n").split("\n")


def write_corpus(out: Path, pairs: int, *, mirror: Path = DEFAULT_MIRROR, seed: int = 0) -> Path:
    """Writes (or reuses) a folder corpus of `pairs` training pairs into `out`; returns `out`."""
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
    parser.add_argument("--mirror", default=str(DEFAULT_MIRROR))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write_corpus(Path(args.out), args.pairs, mirror=Path(args.mirror), seed=args.seed))
    return 0


if __name__ == "__main__":
    from nmt import cli

    cli.run(main)  # a missing mirror or a taken --out: one line, exit 1
