"""A fixed-size, log-bucketed latency histogram: O(1) recording, quantiles within a known relative error.

The live scheduler records a latency per request for as long as it runs. Keeping every value (and sorting them for a
percentile) costs memory that grows with uptime and a sort that grows with it too; a histogram whose bucket edges grow
geometrically by ``gamma = (1 + a) / (1 - a)`` keeps a fixed number of counters and answers any quantile with relative
error at most ``a`` (the DDSketch construction, Masson et al., VLDB 2019), with min and max kept exactly.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from itertools import accumulate

__all__ = ["LatencyHistogram"]


class LatencyHistogram:
    """Counts of non-negative durations (seconds) in geometrically growing buckets.

    Bucket ``k`` (``k_min < k < k_max``) holds values in ``(gamma**(k-1), gamma**k]`` and reports
    ``2 gamma**k / (gamma + 1)``, which is within ``relative_error`` of every value in it. Values at or below ``min_s``
    share the first bucket and values at or above ``max_s`` the last one; estimates are clamped to the exact minimum
    and maximum seen, so a quantile is always within ``relative_error`` (or ``min_s`` absolute) of the exact
    nearest-rank value for data in ``[0, max_s]``.

    Args:
        relative_error: ``a`` in ``(0, 0.5)``. Default 0.005 (0.5 %): 2,304 buckets for the default range.
        min_s: Smallest resolved duration. Default 1 µs.
        max_s: Largest resolved duration. Default 10,000 s.

    Example::

        >>> h = LatencyHistogram()
        >>> h.record_many([0.010, 0.020, 0.030, 0.040])
        >>> [round(v, 4) for v in h.quantiles([50, 100])]
        [0.02, 0.04]
    """

    __slots__ = ("_counts", "_inv_log_gamma", "_offset", "_rep", "count", "max", "max_s", "min", "min_s")

    def __init__(self, *, relative_error: float = 0.005, min_s: float = 1e-6, max_s: float = 1e4) -> None:
        if not 0.0 < relative_error < 0.5:
            raise ValueError(f"relative_error must be in (0, 0.5), got {relative_error!r}")
        if not 0.0 < min_s < max_s < math.inf:
            raise ValueError(f"need 0 < min_s < max_s < inf, got min_s={min_s!r}, max_s={max_s!r}")
        gamma = (1.0 + relative_error) / (1.0 - relative_error)
        log_gamma = math.log(gamma)
        self._inv_log_gamma = 1.0 / log_gamma
        self._offset = math.ceil(math.log(min_s) / log_gamma)  # bucket 0 <=> values <= gamma**offset ~ min_s
        n = math.ceil(math.log(max_s) / log_gamma) - self._offset + 1
        self.min_s, self.max_s = float(min_s), float(max_s)
        self._counts = array("q", bytes(8 * n))
        # Representative of each bucket; the two edge buckets are clamped to the exact min / max at query time.
        self._rep = [2.0 * gamma ** (i + self._offset) / (gamma + 1.0) for i in range(n)]
        self.count = 0
        self.min = math.inf
        self.max = -math.inf

    def __len__(self) -> int:
        return self.count

    @property
    def num_buckets(self) -> int:
        """Number of counters (fixed at construction)."""
        return len(self._counts)

    def index(self, value: float) -> int:
        """Bucket of ``value`` (seconds, >= 0)."""
        if value <= self.min_s:
            return 0
        if value >= self.max_s:
            return len(self._counts) - 1
        return math.ceil(math.log(value) * self._inv_log_gamma) - self._offset

    def record_many(self, values: Iterable[float]) -> None:
        """Count each value: O(1) per value, no allocation that outlives the call."""
        self.add_indexed([(v, self.index(v)) for v in values])

    def add_indexed(self, pairs: Sequence[tuple[float, int]]) -> None:
        """Count ``(value, index(value))`` pairs whose index was computed beforehand (e.g. outside a lock)."""
        counts = self._counts
        lo, hi = self.min, self.max
        for v, i in pairs:
            counts[i] += 1
            if v < lo:
                lo = v
            if v > hi:
                hi = v
        self.min, self.max = lo, hi
        self.count += len(pairs)

    def copy(self) -> LatencyHistogram:
        """An independent snapshot (a copy of the counters: microseconds, whatever the count)."""
        new = LatencyHistogram.__new__(LatencyHistogram)
        for name in self.__slots__:
            setattr(new, name, getattr(self, name))
        new._counts = array("q", self._counts)
        return new

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        """Nearest-rank quantiles ``q`` in ``[0, 100]``; ``nan`` each when nothing was recorded."""
        n = self.count
        if n == 0:
            return [math.nan] * len(qs)
        cum = list(accumulate(self._counts))
        out = []
        for q in qs:
            rank = min(max(1, math.ceil(q / 100.0 * n)), n)
            v = self._rep[bisect_left(cum, rank)]
            out.append(min(max(v, self.min), self.max))
        return out
