"""Prometheus metrics of a serving front end (``prometheus-client``), one registry per app.

Exposed at ``GET /metrics`` in Prometheus' text format:

- ``subnetact_requests_total{outcome}``: every answered request, by outcome (``ok``, ``late``, ``deadline_missed``,
  ``bad_request``, ``queue_full``, ``unavailable``, ``failed``, ...).
- ``subnetact_served_total{subnet}``: requests answered with a prediction, by the subnet that served them.
- ``subnetact_request_latency_seconds{outcome}``: time from the request's arrival (its headers parsed) to its answer
  written (the last byte handed to the transport, as nginx's ``$request_time``) (histogram).
- ``subnetact_batch_size``: size of each batch the policy chose (histogram; one observation per batch).
- ``subnetact_queue_length``: requests waiting in the scheduler's queue (gauge, read at scrape time).
- ``subnetact_workers_stuck``: workers whose batch ran past a request's deadline + grace and has not returned
  (gauge, read at scrape time; backends that can tell).
- ``subnetact_upstream_wait_seconds``: time from a request's ``X-Request-Start`` (stamped by Ray's proxy, or a load
  balancer) to its arrival at this front end, where the front end honours the header (the Ray router does): the hop
  before the front end, already counted in the request's budget and latency (histogram).
- ``subnetact_request_start_ignored``: ``X-Request-Start`` values ignored as malformed or implausible (counter; the
  budget of those requests starts at the front end).

404/405 answers are counted (``outcome="not_found"`` / ``"method_not_allowed"``) in both the counter and the latency
histogram; a client that disconnected before its body arrived as ``outcome="client_disconnected"``.

:class:`LatencyWindow` keeps the latencies of the last 100,000 ``POST /predict`` answers, whatever their status, for
exact server-side percentiles (``GET /stats``) that the histogram's buckets cannot give.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

__all__ = ["LatencyWindow", "ServingMetrics"]

# Buckets from 0.5 ms to 10 s: loopback answers of small models are a few ms, deadlines up to seconds.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15,
                    0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)  # fmt: skip
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class LatencyWindow:
    """The last ``size`` latencies (seconds), for exact percentiles; thread-safe, bounded memory."""

    def __init__(self, size: int = 100_000) -> None:
        self._values: deque[float] = deque(maxlen=size)
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self._values.append(seconds)

    def percentiles(self, *qs: float) -> dict[str, float | None]:
        """Nearest-rank percentiles in ms, e.g. ``{"p50_ms": 3.1}``; ``None`` when empty."""
        with self._lock:
            values = sorted(self._values)
        out: dict[str, float | None] = {}
        for q in qs:
            key = f"p{q:g}_ms"
            out[key] = round(1e3 * values[min(len(values) - 1, int(q / 100 * len(values)))], 3) if values else None
        out["count"] = len(values)
        return out


class ServingMetrics:
    """The counters, histograms and gauge above, in their own ``CollectorRegistry`` (several apps per process)."""

    def __init__(
        self, queue_length: Callable[[], float] | None = None, stuck_workers: Callable[[], float] | None = None
    ) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "subnetact_requests", "Answered requests by outcome.", ["outcome"], registry=self.registry
        )
        self.served = Counter(
            "subnetact_served", "Requests answered with a prediction, by subnet.", ["subnet"], registry=self.registry
        )
        self.latency = Histogram(
            "subnetact_request_latency_seconds",
            "Time from a request's arrival to its answer.",
            ["outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "subnetact_batch_size", "Batch size chosen by the policy.", buckets=_BATCH_BUCKETS, registry=self.registry
        )
        self.queue_length = Gauge("subnetact_queue_length", "Requests waiting in the queue.", registry=self.registry)
        if queue_length is not None:
            self.queue_length.set_function(queue_length)
        self.stuck_workers = Gauge(
            "subnetact_workers_stuck", "Workers running a batch past a deadline + grace.", registry=self.registry
        )
        if stuck_workers is not None:
            self.stuck_workers.set_function(stuck_workers)
        self.upstream_wait = Histogram(
            "subnetact_upstream_wait_seconds",
            "Time from X-Request-Start (Ray's proxy or a load balancer) to the front end.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.request_start_ignored = Counter(
            "subnetact_request_start_ignored",
            "X-Request-Start values ignored as malformed or implausible.",
            registry=self.registry,
        )
        self.window = LatencyWindow()

    def observe(self, outcome: str, seconds: float, subnet: object = None, *, window: bool = True) -> None:
        """Count one answered request (``window=False``: not a ``POST /predict``, kept out of ``/stats``)."""
        self.requests.labels(outcome).inc()
        self.latency.labels(outcome).observe(seconds)
        if subnet is not None:
            self.served.labels(str(subnet)).inc()
        if window:
            self.window.add(seconds)

    def render(self) -> tuple[bytes, str]:
        """``(body, content type)`` of the Prometheus text exposition."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
