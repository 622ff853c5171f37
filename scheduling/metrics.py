"""Serving metrics shared by the live scheduler and the simulator.

Definitions (SuperServe §6.1):

- **SLO attainment** = requests finished by their deadline / requests that finished (cancelled requests excluded).
  Dropped, late, failed and rejected requests count as misses.
- **Mean serving accuracy** = mean profiled accuracy of the subnets that served the requests that met their SLO.
- **Latency** = completion time - arrival time, over served requests (on time or late).

Latency percentiles are exact (every latency is kept) by default, which suits a finite run such as the simulator's.
The live scheduler, which runs for as long as the process does, records them in a fixed-size
:class:`~scheduling.histogram.LatencyHistogram` instead: O(1) per request, constant memory, percentiles within 0.5 %.
"""

from __future__ import annotations

import math
import threading
from array import array
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from .edf import Entry
from .errors import InvalidRequestError
from .histogram import LatencyHistogram
from .profile import SubnetId

__all__ = [
    "DecisionRecord",
    "MetricsRecorder",
    "MetricsSummary",
    "OutcomeRecord",
    "percentile",
    "rate_series",
    "subnet_share_series",
    "subnet_shares",
    "windowed_outcomes",
]


class DecisionRecord(NamedTuple):
    """One dispatched batch: when, on which worker, which subnet, how many requests, the queue length before it."""

    time: float
    worker: int
    subnet_id: SubnetId
    batch_size: int
    queue_len: int
    latency_s: float


class OutcomeRecord(NamedTuple):
    """A group of requests that finished at ``time``: ``count`` of them, ``on_time`` within their deadline."""

    time: float
    kind: Literal["served", "dropped", "failed", "cancelled", "rejected"]
    count: int
    on_time: int
    accuracy: float


@dataclass(frozen=True)
class MetricsSummary:
    """Totals and derived metrics. Latencies are in seconds, ``nan`` when nothing was served.

    ``latency_max_s`` is always exact; the percentiles are exact from the simulator and within 0.5 % (relative) from
    the live :class:`~scheduling.Scheduler`, which keeps a fixed-size histogram instead of every latency.
    """

    total: int
    on_time: int
    late: int
    dropped: int
    failed: int
    rejected: int
    cancelled: int
    batches: int
    slo_attainment: float
    mean_accuracy: float
    mean_batch_size: float
    latency_p50_s: float
    latency_p90_s: float
    latency_p99_s: float
    latency_max_s: float

    def as_dict(self) -> dict[str, Any]:
        """The summary as a plain dict."""
        return dict(self.__dict__)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0..100) of an already sorted sequence; ``nan`` if empty."""
    n = len(sorted_values)
    if n == 0:
        return math.nan
    rank = max(1, math.ceil(q / 100.0 * n))
    return sorted_values[min(rank, n) - 1]


class MetricsRecorder:
    """Accumulates outcomes batch by batch (cheap enough for the simulator's hot loop).

    Args:
        record_timeline: Keep a :class:`DecisionRecord` per batch and an :class:`OutcomeRecord` per finished group
            (for dynamics plots). Off by default.
        thread_safe: Guard updates with a lock (the live scheduler records from several worker threads).
        latencies: ``"exact"`` (default) keeps every latency, for exact percentiles of a finite run; ``"histogram"``
            counts them in a fixed-size :class:`~scheduling.histogram.LatencyHistogram` (constant memory, O(1) per
            request, percentiles within 0.5 %) for a recorder that lives as long as a server.
    """

    def __init__(
        self,
        *,
        record_timeline: bool = False,
        thread_safe: bool = False,
        latencies: Literal["exact", "histogram"] = "exact",
    ) -> None:
        if latencies not in ("exact", "histogram"):
            raise ValueError(f"latencies must be 'exact' or 'histogram', got {latencies!r}")
        self.record_timeline = bool(record_timeline)
        self._lock = threading.Lock() if thread_safe else nullcontext()
        self.decisions: list[DecisionRecord] = []
        self.outcomes: list[OutcomeRecord] = []
        self._latencies = array("d")
        self._histogram = LatencyHistogram() if latencies == "histogram" else None
        self.on_time = self.late = self.dropped = self.failed = self.rejected = self.cancelled = 0
        self.batches = 0
        self._served_requests = 0
        self._acc_sum = 0.0

    def record_decision(
        self, t: float, worker: int, subnet_id: SubnetId, batch_size: int, queue_len: int, latency_s: float
    ) -> None:
        """Record a dispatched batch."""
        with self._lock:
            self.batches += 1
            self._served_requests += batch_size
            if self.record_timeline:
                self.decisions.append(DecisionRecord(t, worker, subnet_id, batch_size, queue_len, latency_s))

    def record_served(self, t_done: float, entries: Sequence[Entry], accuracy: float) -> int:
        """Record a batch that finished at ``t_done``; returns how many of its requests met their deadline."""
        on_time = 0
        for e in entries:
            if e.deadline >= t_done:
                on_time += 1
        acc_gain = on_time * float(accuracy)  # everything that can raise happens before the first update
        hist = self._histogram
        if hist is not None:  # the logarithms are computed before taking the lock that other workers wait on
            indexed = [(lat, hist.index(lat)) for lat in [t_done - e.arrival for e in entries]]
        with self._lock:
            self.on_time += on_time
            self.late += len(entries) - on_time
            self._acc_sum += acc_gain
            if hist is not None:
                hist.add_indexed(indexed)
            else:
                self._latencies.extend([t_done - e.arrival for e in entries])
            if self.record_timeline:
                self.outcomes.append(OutcomeRecord(t_done, "served", len(entries), on_time, accuracy))
        return on_time

    def _count(self, kind: str, t: float, n: int) -> None:
        if n == 0:
            return
        with self._lock:
            setattr(self, kind, getattr(self, kind) + n)
            if self.record_timeline:
                self.outcomes.append(OutcomeRecord(t, kind, n, 0, math.nan))  # type: ignore[arg-type]

    def record_drop(self, t: float, n: int) -> None:
        """Record ``n`` requests dropped by the deadline rule at ``t``."""
        self._count("dropped", t, n)

    def record_failure(self, t: float, n: int) -> None:
        """Record ``n`` requests failed (worker error or lost worker) at ``t``."""
        self._count("failed", t, n)

    def record_rejection(self, t: float, n: int = 1) -> None:
        """Record ``n`` requests rejected at submission (queue full, no worker)."""
        self._count("rejected", t, n)

    def record_cancel(self, t: float, n: int) -> None:
        """Record ``n`` requests cancelled (by the caller, or by ``close(drain=False)``)."""
        self._count("cancelled", t, n)

    def summary(self) -> MetricsSummary:
        """A :class:`MetricsSummary` of everything recorded so far.

        Only a copy of the counters is taken under the lock (a fixed-size copy with ``latencies="histogram"``); the
        percentiles are computed after it is released, so recording threads never wait for a sort.
        """
        with self._lock:
            counts = (self.on_time, self.late, self.dropped, self.failed, self.rejected, self.cancelled)
            batches, served_requests, acc_sum = self.batches, self._served_requests, self._acc_sum
            hist = self._histogram.copy() if self._histogram is not None else None
            lat = array("d", self._latencies) if hist is None else None
        on_time, late, dropped, failed, rejected, cancelled = counts
        if hist is not None:
            p50, p90, p99 = hist.quantiles((50, 90, 99))
            lat_max = hist.max if hist.count else math.nan
        else:
            lat = sorted(lat)  # type: ignore[arg-type]
            p50, p90, p99 = percentile(lat, 50), percentile(lat, 90), percentile(lat, 99)
            lat_max = lat[-1] if lat else math.nan
        finished = on_time + late + dropped + failed + rejected
        return MetricsSummary(
            total=finished + cancelled,
            on_time=on_time,
            late=late,
            dropped=dropped,
            failed=failed,
            rejected=rejected,
            cancelled=cancelled,
            batches=batches,
            slo_attainment=on_time / finished if finished else math.nan,
            mean_accuracy=acc_sum / on_time if on_time else math.nan,
            mean_batch_size=served_requests / batches if batches else math.nan,
            latency_p50_s=p50,
            latency_p90_s=p90,
            latency_p99_s=p99,
            latency_max_s=lat_max,
        )


def rate_series(arrivals: Iterable[float], bin_s: float, *, end: float | None = None) -> list[tuple[float, float]]:
    """Arrival rate per bin: ``[(bin_start, requests_per_second), ...]``."""
    counts: dict[int, int] = {}
    last = 0
    for t in arrivals:
        i = int(t // bin_s)
        counts[i] = counts.get(i, 0) + 1
        last = max(last, i)
    if end is not None:
        last = max(last, int(end // bin_s) - 1)
    return [(i * bin_s, counts.get(i, 0) / bin_s) for i in range(last + 1)]


def windowed_outcomes(outcomes: Iterable[OutcomeRecord], bin_s: float) -> list[tuple[float, float, float, int]]:
    """SLO attainment and mean served accuracy per time bin of completion.

    Returns:
        ``[(bin_start, attainment, mean_accuracy, finished), ...]`` for bins where something finished; cancelled
        requests are excluded as in :class:`MetricsSummary`.
    """
    bins: dict[int, list[float]] = {}
    for o in outcomes:
        if o.kind == "cancelled":
            continue
        b = bins.setdefault(int(o.time // bin_s), [0, 0, 0.0])
        b[0] += o.count
        b[1] += o.on_time
        if o.on_time:
            b[2] += o.on_time * o.accuracy
    return [(i * bin_s, b[1] / b[0], b[2] / b[1] if b[1] else math.nan, int(b[0])) for i, b in sorted(bins.items())]


def subnet_shares(decisions: Iterable[DecisionRecord]) -> dict[SubnetId, float]:
    """Share of the dispatched requests that each subnet served (the system dynamics in total).

    A batch counts with its real request count (``batch_size``), not its padded profile size. Requests of a batch
    that later failed (its worker died) are counted too: the share describes the policy's choices, not the outcome.

    Returns:
        ``{subnet_id: share}`` over the subnets that served at least one request, shares summing to 1; ``{}`` when
        nothing was dispatched.
    """
    counts: dict[SubnetId, int] = {}
    for d in decisions:
        counts[d.subnet_id] = counts.get(d.subnet_id, 0) + d.batch_size
    total = sum(counts.values())
    return {sid: n / total for sid, n in counts.items()} if total else {}


def subnet_share_series(
    decisions: Iterable[DecisionRecord], bin_s: float
) -> list[tuple[float, dict[SubnetId, float]]]:
    """:func:`subnet_shares` per time bin of dispatch: ``[(bin_start, {subnet_id: share}), ...]``.

    Only bins in which something was dispatched appear, in time order.
    """
    if isinstance(bin_s, bool) or not isinstance(bin_s, (int, float)) or not 0 < bin_s < math.inf:
        raise InvalidRequestError(f"bin_s must be a finite number of seconds > 0, got {bin_s!r}")
    bins: dict[int, list[DecisionRecord]] = {}
    for d in decisions:
        bins.setdefault(int(d.time // bin_s), []).append(d)
    return [(i * bin_s, subnet_shares(ds)) for i, ds in sorted(bins.items())]
