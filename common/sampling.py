"""Sampling settings for decoding (top-k, top-p, temperature, seed), checked without TensorFlow: the CLIs refuse a
bad value before loading anything. `transformer.sampling` draws with them."""

from __future__ import annotations

import dataclasses
import math

SEED_LIMIT = 2**32


@dataclasses.dataclass(frozen=True)
class Sampling:
    """Sampling settings; `topk` 1 would be greedy search and is refused (use greedy search)."""

    topk: int = 0  # the most likely tokens to draw from; 0 = the whole vocabulary
    topp: float = 1.0  # then the smallest prefix of those reaching this probability (nucleus); 1.0 = no cut
    temperature: float = 1.0  # log-probabilities divided by this before the cuts
    seed: int = 0

    def __post_init__(self):
        if self.topk < 0 or self.topk == 1:
            raise ValueError(f"sampling topk must be 0 (the whole vocabulary) or at least 2, got {self.topk}")
        if not 0.0 < self.topp <= 1.0:
            raise ValueError(f"sampling topp must be in (0, 1], got {self.topp}")
        if not (math.isfinite(self.temperature) and self.temperature > 0.0):
            raise ValueError(f"sampling temperature must be a positive number, got {self.temperature}")
        if not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"sampling seed must be in [0, 2^32), got {self.seed}")
