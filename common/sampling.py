"""Sampling settings for decoding (top-k, top-p, temperature, seed), checked without TensorFlow: the CLIs refuse a
bad value before loading anything. `transformer.sampling` draws with them."""

from __future__ import annotations

import dataclasses
import math

SEED_LIMIT = 2**32
# The sampler compares it with the vocabulary size, an int32 (a larger value was a TypeError after the model loaded)
TOPK_LIMIT = 2**31 - 1
# What float32 holds (the sampler divides float32 log-probabilities by it): 1e300 overflowed in the cast, with a
# NumPy warning on stderr; 1e-50 would be 0. The sampler handles both ends of this range (the most likely token, or
# uniform draws: tests/transformer/test_sampling.py).
TEMPERATURES = (1e-45, 3e38)


@dataclasses.dataclass(frozen=True)
class Sampling:
    """Sampling settings; `topk` 1 would be greedy search and is refused (use greedy search)."""

    topk: int = 0  # the most likely tokens to draw from; 0 = the whole vocabulary
    topp: float = 1.0  # then the smallest prefix of those reaching this probability (nucleus); 1.0 = no cut
    temperature: float = 1.0  # log-probabilities divided by this before the cuts
    seed: int = 0

    def __post_init__(self):
        if self.topk < 0 or self.topk == 1 or self.topk > TOPK_LIMIT:
            raise ValueError(
                f"sampling topk must be 0 (the whole vocabulary) or from 2 to {TOPK_LIMIT} (int32), got {self.topk}"
            )
        if not 0.0 < self.topp <= 1.0:
            raise ValueError(f"sampling topp must be in (0, 1], got {self.topp}")
        if not (math.isfinite(self.temperature) and TEMPERATURES[0] <= self.temperature <= TEMPERATURES[1]):
            raise ValueError(
                f"sampling temperature must be a positive number from {TEMPERATURES[0]:g} to {TEMPERATURES[1]:g} "
                f"(float32's range), got {self.temperature}"
            )
        if not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"sampling seed must be in [0, 2^32), got {self.seed}")
