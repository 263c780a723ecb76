"""Pairs that cannot be training data, counted and dropped: empty, invalid UTF-8, over-long, one side empty.

    counts = DropCounts()
    sources, targets = clean(raw_sources, raw_targets, counts)   # lists of str, bad pairs left out
    counts.summary()   # "kept 998 of 1000 pairs; dropped 1 empty, 1 invalid UTF-8"

A pair is dropped (and counted once, under the first reason that applies) when either side is longer than
MAX_LINE_BYTES bytes, is not valid UTF-8, or both sides, or one side, are empty (whitespace only counts as empty).
A split more than a tenth of whose pairs (at least 10) are invalid UTF-8 is refused instead
(`DropCounts.refuse_another_encoding`).

Evaluation reads every line instead (`decode_every_line`): what sacreBLEU scores on the same files.
"""

from __future__ import annotations

import dataclasses

from data.errors import DataError

MAX_LINE_BYTES = 1 << 20  # 1 MiB: longer lines are not sentences (a binary file, a whole document)


@dataclasses.dataclass
class DropCounts:
    total: int = 0
    too_long: int = 0
    invalid_utf8: int = 0
    empty: int = 0
    one_side_empty: int = 0

    @property
    def dropped(self) -> int:
        return self.too_long + self.invalid_utf8 + self.empty + self.one_side_empty

    @property
    def kept(self) -> int:
        return self.total - self.dropped

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "kept": self.kept}

    def summary(self) -> str:
        reasons = [
            f"{count} {name}"
            for name, count in (
                ("empty", self.empty),
                ("with one side empty", self.one_side_empty),
                ("invalid UTF-8", self.invalid_utf8),
                (f"over {MAX_LINE_BYTES} bytes", self.too_long),
            )
            if count
        ]
        return f"kept {self.kept} of {self.total} pairs" + (
            f"; dropped {', '.join(reasons)}" if reasons else ""
        )

    def refuse_another_encoding(self, where: str) -> None:
        """`DataError` when over a tenth of the pairs seen were invalid UTF-8: files in another encoding (Latin-1,
        cp1252), whose every line with an accent or a curly quote would be dropped, not a few damaged lines (those
        are dropped with a warning). Real UTF-8 corpora with damaged lines have far fewer (web-crawled WMT data:
        well under 1%); in a file of a few lines, one damaged line is no sign of an encoding: from 10 invalid pairs
        on, or over half of the pairs."""
        if self.invalid_utf8 * 2 > self.total or (
            self.invalid_utf8 * 10 > self.total and self.invalid_utf8 >= 10
        ):
            raise DataError(
                f"{where}: {self.invalid_utf8} of {self.total} pairs are not valid UTF-8 ({self.summary()}): the "
                "files are in another encoding (Latin-1 or cp1252?); convert them, e.g. iconv -f latin1 -t utf-8"
            )


def usable(source: bytes, target: bytes) -> bool:
    """Whether `clean` keeps the pair (what preparation makes training or validation data of)."""
    return clean([source], [target], DropCounts())[0] != []


def clean(sources: list[bytes], targets: list[bytes], counts: DropCounts) -> tuple[list[str], list[str]]:
    """The usable pairs of a chunk, decoded; `counts` is updated with every pair seen and dropped."""
    kept_sources, kept_targets = [], []
    counts.total += len(sources)
    for source, target in zip(sources, targets):
        if len(source) > MAX_LINE_BYTES or len(target) > MAX_LINE_BYTES:
            counts.too_long += 1
            continue
        try:
            source_text, target_text = source.decode("utf-8"), target.decode("utf-8")
        except UnicodeDecodeError:
            counts.invalid_utf8 += 1
            continue
        source_empty, target_empty = not source_text.strip(), not target_text.strip()
        if source_empty and target_empty:
            counts.empty += 1
        elif source_empty or target_empty:
            counts.one_side_empty += 1
        else:
            kept_sources.append(source_text)
            kept_targets.append(target_text)
    return kept_sources, kept_targets


def decode_every_line(
    sources: list[bytes], targets: list[bytes], counts: DropCounts, kept: list[bool] | None = None
) -> tuple[list[str], list[str]]:
    """Every pair of a chunk, decoded as the evaluation CLIs read files (`nmt.text_io`): invalid UTF-8 becomes
    U+FFFD and NUL bytes are removed; blank lines stay (over-long ones as `data.folder` cut them). `counts` counts
    the pairs with invalid UTF-8 (for `refuse_another_encoding`) and the blank ones, though none is dropped; `kept`
    (if given) gets, per pair, whether `clean` would keep it."""
    counts.total += len(sources)
    decoded: tuple[list[str], list[str]] = ([], [])
    for pair in zip(sources, targets):
        if kept is not None:
            kept.append(usable(*pair))
        texts, invalid = [], False
        for raw in pair:
            raw = raw.replace(b"\x00", b"")
            try:
                texts.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                texts.append(raw.decode("utf-8", errors="replace"))
                invalid = True
        counts.invalid_utf8 += invalid
        source_empty, target_empty = not texts[0].strip(), not texts[1].strip()
        counts.empty += source_empty and target_empty
        counts.one_side_empty += source_empty != target_empty
        decoded[0].append(texts[0])
        decoded[1].append(texts[1])
    return decoded
