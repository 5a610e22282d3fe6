"""Round-trip times as agents measure them and the manager adds them up: one histogram both sides share."""

from __future__ import annotations

import math
from typing import Any

# Sixteenth-octave buckets from 1 µs, so a quantile (a bucket's middle) is within about 2 % of the samples';
# the last bucket holds everything above ~1 min.
_BUCKETS_PER_OCTAVE = 16
_LATENCY_BUCKETS = 26 * _BUCKETS_PER_OCTAVE


class LatencyHistogram:
    """Counts of durations in log-spaced buckets (about 4.4 % wide): cheap to fill in an agent, exact to add up.

    Agents send theirs with their stats; the manager adds them and reads
    quantiles, so a percentile over all agents is right without shipping every
    sample.
    """

    def __init__(self) -> None:
        self.counts = [0] * _LATENCY_BUCKETS

    def add(self, seconds: float) -> None:
        micros = seconds * 1e6
        bucket = int(math.log2(micros) * _BUCKETS_PER_OCTAVE) if micros > 1 else 0
        self.counts[min(bucket, _LATENCY_BUCKETS - 1)] += 1

    def take(self) -> list[int]:
        counts, self.counts = self.counts, [0] * _LATENCY_BUCKETS
        return counts

    def merge(self, counts: Any) -> None:
        """Add counts an agent sent; anything but a list of as many non-negative ints is ignored."""
        if (
            isinstance(counts, list)
            and len(counts) == _LATENCY_BUCKETS
            and all(type(c) is int and c >= 0 for c in counts)
        ):
            self.counts = [mine + theirs for mine, theirs in zip(self.counts, counts)]

    def quantile(self, q: float) -> float:
        """The ``q`` quantile in milliseconds (the middle of its bucket); NaN when empty."""
        total = sum(self.counts)
        if not total:
            return float("nan")
        seen = 0
        for bucket, count in enumerate(self.counts):
            seen += count
            if seen >= q * total:
                return 2 ** ((bucket + 0.5) / _BUCKETS_PER_OCTAVE) / 1000
        return float("nan")
