"""What every benchmark shares: the config and tokenizer they run on, timing helpers, and the JSON-lines output."""

from __future__ import annotations

import json
import logging
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

log = logging.getLogger("benchmarks")

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")  # the Keras policies the train benchmark compares


def _int_at_least(text: str, minimum: int) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1 (a count of steps, rounds, pairs...): exit 2 otherwise."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: an integer of at least 0 (a limit where 0 means none): exit 2 otherwise."""
    return _int_at_least(text, 0)


def int_list(positive: bool = False):
    """argparse type: comma-separated integers (each at least 1 if `positive`)."""
    import argparse

    def parse(text: str) -> list[int]:
        try:
            values = [int(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"not comma-separated integers: {text!r}") from None
        if not values or (positive and min(values) < 1):
            raise argparse.ArgumentTypeError(
                f"expected integers{' of at least 1' if positive else ''}, got {text!r}"
            )
        return values

    return parse


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of one call."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def rounded(value: float | None, digits: int = 1) -> float | None:
    """JSON-safe rounding: None for None, NaN and infinities."""
    if value is None or not math.isfinite(value):
        return None
    return round(float(value), digits)


class JsonLines:
    """Writes one JSON object per line (flushed), to the stream given at construction (stdout by default).

    The runner redirects `sys.stdout` to stderr while benchmarks run (TFDS and others print progress there), so the
    stream is bound once, before that redirection. Every record is also kept in `records`.
    """

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        self.records: list[dict] = []

    def __call__(self, record: dict) -> dict:
        self.records.append(record)
        print(json.dumps(record), file=self.stream, flush=True)
        return record


@dataclass
class BenchContext:
    """The config every benchmark runs on, and its tokenizer, made once and shared.

    Args:
      config: `nmt.config.Config` (usually configs/base.yaml).
      tokenizer_dir: load the tokenizer from here if it holds one (e.g. runs/base/tokenizer); else a tokenizer is
        trained on the config's train split into a temporary directory (deleted by `close`).
    """

    config: Any
    tokenizer_dir: Path | None = None
    results: dict = field(default_factory=dict)  # cross-benchmark values, e.g. the float32 train tokens/s
    _tokenizer: Any = None
    _tmp: Any = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from data.tokenizer import Tokenizer
            from data.tokenizer_training import train_tokenizer

            directory = self.tokenizer_dir
            if directory is not None and any(Path(directory).glob("*.model")):
                log.info("tokenizer: loading %s", directory)
                self._tokenizer = Tokenizer.load(directory)
            else:
                self._tmp = tempfile.TemporaryDirectory(prefix="bench-spm-")
                log.info(
                    "tokenizer: training one on the %s split (%s)",
                    self.config.data.train_split,
                    self._tmp.name,
                )
                self._tokenizer = train_tokenizer(
                    self.config.data, self._tmp.name, seed=self.config.train.seed
                )
        return self._tokenizer

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
