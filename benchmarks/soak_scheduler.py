"""Soak: the live ``Scheduler`` over many requests with failures injected, while ``metrics()`` is polled.

Reports RSS growth (after a warm-up, with the garbage collected), the time of ``metrics()`` at the start and at the
end of the run, and the longest gap between two dispatches while requests were waiting (overall, and among gaps that
overlapped a ``metrics()`` call). Injected: ordinary worker exceptions, ``WorkerFailedError`` deaths, policy
exceptions (deaths outside the callable; a supervisor thread adds workers back), requests with an SLO too short to
meet (dropped) and requests cancelled by their caller. Only the public API is used, so the same script measures any
version of the package. Example::

    python benchmarks/soak_scheduler.py --requests 200000
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import resource
import statistics
import threading
import time
from collections import deque

from scheduling import Scheduler, SlackFit, WorkerFailedError, datasets


def rss_bytes() -> int:
    """Current resident set size (Linux ``/proc``; elsewhere the peak from ``getrusage``)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class FlakySlackFit(SlackFit):
    """SlackFit whose ``decide`` raises now and then: a worker death outside the worker callable."""

    def __init__(self, profile, rate: float, seed: int) -> None:
        super().__init__(profile)
        self.rate, self.rng = rate, random.Random(seed)

    def decide(self, slack_s, queue_len, now):
        if self.rng.random() < self.rate:  # called under the scheduler's lock: one caller at a time
            raise RuntimeError("injected policy failure")
        return super().decide(slack_s, queue_len, now)


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.rng_lock = threading.Lock()
        self.sched = Scheduler(
            FlakySlackFit(datasets.superserve_a40_profile(), args.p_policy, args.seed), max_queue=10 * args.inflight
        )
        self.dispatch_lock = threading.Lock()
        self.last_dispatch = None  # (time, backlog left behind) of the previous dispatch
        self.gaps: list[tuple[float, float]] = []  # (start, end) of every gap > 1 ms with requests waiting
        self.max_gap = 0.0
        self.n_gaps = 0
        self.metrics_calls: deque[tuple[float, float]] = deque()
        self.outcomes: dict[str, int] = {}
        self.slots = threading.Semaphore(args.inflight)
        self.stop = threading.Event()

    # ------------------------------------------------------------------ the model side
    def worker(self, subnet_id, payloads):
        t = time.perf_counter()
        backlog = self.sched.queue_len
        with self.dispatch_lock:
            prev = self.last_dispatch
            self.last_dispatch = (t, backlog)
            if prev is not None and prev[1] > 0:  # requests were waiting since the previous dispatch
                gap = t - prev[0]
                self.n_gaps += 1
                self.max_gap = max(self.max_gap, gap)
                if gap > 1e-3:
                    self.gaps.append((prev[0], t))
        with self.rng_lock:
            r = self.rng.random()
        if r < self.args.p_fatal:
            raise WorkerFailedError("injected device loss")
        if r < self.args.p_fatal + self.args.p_error:
            raise ValueError("injected bad batch")
        return payloads

    def supervisor(self) -> None:
        """Keeps ``--workers`` workers alive (they die from injected failures)."""
        while not self.stop.is_set():
            for _ in range(self.args.workers - len(self.sched.workers)):
                self.sched.add_worker(self.worker)
            time.sleep(0.001)

    def poller(self) -> None:
        """Polls ``metrics()`` like a ``/metrics`` endpoint would."""
        while not self.stop.is_set():
            t0 = time.perf_counter()
            self.sched.metrics()
            self.metrics_calls.append((t0, time.perf_counter()))
            time.sleep(self.args.poll_ms * 1e-3)

    # ------------------------------------------------------------------ the client side
    def on_done(self, fut) -> None:
        if fut.cancelled():
            kind = "cancelled"
        else:
            exc = fut.exception()
            kind = "result" if exc is None else type(exc).__name__
        with self.rng_lock:
            self.outcomes[kind] = self.outcomes.get(kind, 0) + 1
        self.slots.release()

    def submit_many(self, n: int, rng: random.Random) -> None:
        submit = self.sched.submit
        for i in range(n):
            self.slots.acquire()
            r = rng.random()
            fut = submit(i, slo_s=1e-5 if r < self.args.p_drop else 60.0)
            fut.add_done_callback(self.on_done)
            if r > 1.0 - self.args.p_cancel:
                fut.cancel()

    def metrics_time(self, repeats: int = 50) -> float:
        """Median seconds of one ``metrics()`` call."""
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            self.sched.metrics()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def run(self) -> dict[str, float]:
        a = self.args
        for _ in range(a.workers):
            self.sched.add_worker(self.worker)
        threads = [threading.Thread(target=self.supervisor, daemon=True)]
        if a.poll_ms > 0:
            threads.append(threading.Thread(target=self.poller, daemon=True))
        for t in threads:
            t.start()
        rng = random.Random(a.seed + 1)
        self.submit_many(a.warmup, rng)
        for _ in range(a.inflight):  # wait for the warm-up requests to finish
            self.slots.acquire()
        for _ in range(a.inflight):
            self.slots.release()
        gc.collect()
        rss0, metrics0 = rss_bytes(), self.metrics_time()
        t0 = time.perf_counter()
        self.submit_many(a.requests, rng)
        for _ in range(a.inflight):
            self.slots.acquire()
        wall = time.perf_counter() - t0
        self.stop.set()
        for t in threads:
            t.join()
        metrics1 = self.metrics_time()
        gc.collect()
        rss1 = rss_bytes()
        self.sched.close(timeout=30)
        m = self.sched.metrics()
        calls = list(self.metrics_calls)
        durations = sorted(e - s for s, e in calls)
        overlapping = [e - s for s, e in self.gaps if any(cs < e and ce > s for cs, ce in calls)]
        return {
            "requests": a.requests + a.warmup,
            "completed": sum(self.outcomes.values()),
            "scheduler_total": m.total,
            "wall_s": wall,
            "rss_growth_mb": (rss1 - rss0) / 2**20,
            "rss_mb": rss1 / 2**20,
            "metrics_ms_start": 1e3 * metrics0,
            "metrics_ms_end": 1e3 * metrics1,
            "metrics_calls": len(durations),
            "metrics_ms_max_while_serving": 1e3 * durations[-1] if durations else float("nan"),
            "max_gap_ms": 1e3 * self.max_gap,
            "gaps_over_1ms": len(self.gaps),
            "max_gap_overlapping_metrics_ms": 1e3 * max(overlapping, default=0.0),
            "dispatches_with_backlog": self.n_gaps,
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=200_000, help="measured requests (after the warm-up)")
    ap.add_argument("--warmup", type=int, default=20_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--inflight", type=int, default=2_000, help="requests outstanding at once (keeps a backlog)")
    ap.add_argument("--poll-ms", type=float, default=10.0, help="metrics() polling period; 0: no poller")
    ap.add_argument("--p-error", type=float, default=0.01, help="per batch: the worker raises ValueError")
    ap.add_argument("--p-fatal", type=float, default=0.002, help="per batch: the worker raises WorkerFailedError")
    ap.add_argument("--p-policy", type=float, default=0.0005, help="per decision: the policy raises")
    ap.add_argument("--p-drop", type=float, default=0.01, help="per request: SLO too short to meet")
    ap.add_argument("--p-cancel", type=float, default=0.01, help="per request: cancelled by the caller")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    r = Soak(args).run()
    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    for k, v in r.items():
        print(f"{k:>32}: {v:,.3f}" if isinstance(v, float) else f"{k:>32}: {v:,}")
    lost = r["requests"] - r["completed"]
    print(f"{'lost requests':>32}: {lost}")
    if lost:
        raise SystemExit(f"{lost} requests never completed")


if __name__ == "__main__":
    main()
