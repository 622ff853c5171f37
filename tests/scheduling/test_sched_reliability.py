"""Live Scheduler regressions from the reliability audit (issue 14): worker deaths outside the callable, close() with a
hung worker, metrics in bounded memory.

Every wait has a generous timeout; nothing asserts on wall-clock speed.
"""

import gc
import threading
import tracemalloc
from concurrent.futures import wait

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling import (
    MinCost,
    NoWorkersError,
    Scheduler,
    SchedulerClosedError,
    SlackFit,
    WorkerFailedError,
    datasets,
    synthetic_profile,
)
from scheduling.edf import Entry
from scheduling.metrics import MetricsRecorder

T = 30.0
PROFILE = datasets.superserve_a40_profile()


def echo(subnet_id, payloads):
    return list(payloads)


class RaisingPolicy(MinCost):
    """A policy with a bug: ``decide`` raises (outside the worker callable)."""

    def decide(self, *args):
        raise RuntimeError("policy bug")


def test_policy_that_raises_retires_the_worker_and_fails_queued_requests():
    # The audit's reproduction: the worker thread died, stayed registered, and the request never completed.
    s = Scheduler(RaisingPolicy(synthetic_profile(3)), [echo])
    f = s.submit(1, slo_s=1.0)
    exc = f.exception(timeout=T)
    assert isinstance(exc, NoWorkersError) and "policy bug" in str(exc)
    assert isinstance(exc.__cause__, RuntimeError)
    assert s.workers == []
    # With no worker left, new requests are rejected at once, as when a worker dies the usual way.
    assert isinstance(s.submit(2, slo_s=1.0).exception(0), NoWorkersError)
    s.close(timeout=T)


class BadAccuracyPolicy(MinCost):
    """A policy whose decision carries a non-numeric accuracy: the worker dies *after* its callable returned."""

    def decide(self, slack_s, queue_len, now):
        d = super().decide(slack_s, queue_len, now)
        return None if d is None else d._replace(accuracy="not a number")


def test_death_after_the_batch_was_taken_fails_that_batch():
    ran = []

    def worker(subnet_id, payloads):
        ran.append(list(payloads))
        return list(payloads)

    s = Scheduler(BadAccuracyPolicy(PROFILE), [worker])
    futs = [s.submit(i, slo_s=60.0) for i in range(5)]
    done, not_done = wait(futs, timeout=T)
    assert not not_done
    taken = {p for batch in ran for p in batch}
    for i, f in enumerate(futs):
        exc = f.exception(0)
        if i in taken:  # held by the worker when it died: failed with WorkerFailedError naming the cause
            assert isinstance(exc, WorkerFailedError) and "died outside its callable" in str(exc)
            assert isinstance(exc.__cause__, ValueError)  # float("not a number")
        else:  # still queued: no worker left
            assert isinstance(exc, NoWorkersError)
    assert taken and s.workers == []
    m = s.metrics()
    # Requests queued when the worker died count as failed; any submitted after it died (the worker can die before
    # the loop above has submitted all five) are rejected at the door. Each is counted once either way.
    assert m.total == 5 and m.failed + m.rejected == 5 and m.failed >= len(taken) and m.on_time == 0
    s.close(timeout=T)


class ExitOncePolicy(SlackFit):
    """``decide`` raises ``SystemExit`` (a non-``Exception``) once: its worker dies outside the callable."""

    def __init__(self, profile):
        super().__init__(profile)
        self.exited = False

    def decide(self, slack_s, queue_len, now):
        if not self.exited:  # decide runs under the scheduler's lock: exactly one worker gets this
            self.exited = True
            raise SystemExit("policy called sys.exit")
        return super().decide(slack_s, queue_len, now)


def test_system_exit_outside_the_callable_retires_one_worker_and_the_other_serves():
    s = Scheduler(ExitOncePolicy(PROFILE), [echo, echo])
    futs = [s.submit(i, slo_s=60.0) for i in range(200)]
    done, not_done = wait(futs, timeout=T)
    assert not not_done
    assert [f.result(0) for f in futs] == list(range(200))  # nothing was taken before decide raised
    assert len(s.workers) == 1
    s.close(timeout=T)
    assert s.metrics().on_time == 200


def test_close_with_drain_and_a_hung_worker_completes_every_queued_request():
    gate, started = threading.Event(), threading.Event()

    def hung(subnet_id, payloads):
        started.set()
        gate.wait(T)
        return list(payloads)

    threads_before = set(threading.enumerate())
    s = Scheduler(MinCost(PROFILE), [hung], max_queue=1000)
    (worker_thread,) = {t for t in set(threading.enumerate()) - threads_before if t.name != "scheduling-reaper"}
    running = s.submit("running", slo_s=120.0)
    assert started.wait(T)
    queued = [s.submit(i, slo_s=120.0) for i in range(40)]
    s.close(drain=True, timeout=0.2)
    # Only the hung callable's own batch may still be pending; everything queued completed.
    assert not running.done()
    for f in queued:
        assert f.done()
        assert isinstance(f.exception(0), SchedulerClosedError) and "still queued" in str(f.exception(0))
    gate.set()
    assert running.result(T) == "running"
    worker_thread.join(T)  # the hung worker exits once its batch returns: it does not serve a closed scheduler
    assert not worker_thread.is_alive()
    m = s.metrics()
    assert (m.total, m.on_time, m.failed) == (41, 1, 40)


def test_close_joins_threads_of_workers_removed_without_waiting():
    gate, started = threading.Event(), threading.Event()

    def slow(subnet_id, payloads):
        started.set()
        gate.wait(T)
        return list(payloads)

    s = Scheduler(MinCost(PROFILE), [])
    wid = s.add_worker(slow, name="removed-without-wait")
    f = s.submit(0, slo_s=60.0)
    assert started.wait(T)
    s.add_worker(echo)  # only now: the slow worker must be the one running the request
    s.remove_worker(wid, wait=False)
    thread = next(t for t in threading.enumerate() if t.name == "removed-without-wait")
    threading.Timer(0.1, gate.set).start()
    s.close(timeout=T)
    assert not thread.is_alive() and f.result(0) == 0


def test_metrics_memory_does_not_grow_with_requests():
    # Main kept every latency (8 bytes per request, forever) and sorted them all under the workers' lock.
    s = Scheduler(SlackFit(PROFILE), [echo, echo], max_queue=100_000)
    metrics_files = [tracemalloc.Filter(True, "*/scheduling/metrics.py"), tracemalloc.Filter(True, "*/histogram.py")]

    def serve(n):
        futs = [s.submit(i, slo_s=60.0) for i in range(n)]
        wait(futs, timeout=T)
        assert all(f.result(0) == i for i, f in enumerate(futs))

    tracemalloc.start()
    try:
        serve(1_000)
        gc.collect()
        before = tracemalloc.take_snapshot().filter_traces(metrics_files)
        serve(30_000)
        gc.collect()
        after = tracemalloc.take_snapshot().filter_traces(metrics_files)
    finally:
        tracemalloc.stop()
    growth = sum(st.size_diff for st in after.compare_to(before, "filename"))
    assert growth < 4096, f"metrics grew by {growth} bytes over 30,000 requests"
    m = s.metrics()
    assert m.on_time + m.late == 31_000 and 0 < m.latency_p50_s <= m.latency_p99_s <= m.latency_max_s
    s.close(timeout=T)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1e3, allow_nan=False), min_size=1, max_size=300), st.integers(1, 8))
def test_histogram_recorder_matches_exact_percentiles_within_half_a_percent(latencies, batch):
    # The same served batches into the exact recorder (the simulator's) and the histogram one (the live scheduler's).
    exact, hist = MetricsRecorder(), MetricsRecorder(thread_safe=True, latencies="histogram")
    t_done = 2e3
    entries = [Entry(t_done, i, t_done - lat, None) for i, lat in enumerate(latencies)]
    for i in range(0, len(entries), batch):
        for rec in (exact, hist):
            rec.record_served(t_done, entries[i : i + batch], 0.5)
    a, b = exact.summary(), hist.summary()
    assert a.latency_max_s == b.latency_max_s  # exact in both
    for name in ("latency_p50_s", "latency_p90_s", "latency_p99_s"):
        want, got = getattr(a, name), getattr(b, name)
        assert abs(got - want) <= 0.005 * want + 1.02e-6, (name, want, got)  # 0.5 % relative or ~1 µs absolute
    assert (a.on_time, a.late, a.mean_accuracy) == (b.on_time, b.late, b.mean_accuracy)


@pytest.mark.parametrize("drain", [True, False])
def test_close_twice_from_two_threads_is_safe(drain):
    s = Scheduler(SlackFit(PROFILE), [echo, echo])
    futs = [s.submit(i, slo_s=60.0) for i in range(2_000)]
    closers = [threading.Thread(target=s.close, kwargs={"drain": drain, "timeout": T}) for _ in range(2)]
    for t in closers:
        t.start()
    for t in closers:
        t.join(T)
    assert all(f.done() for f in futs)
    assert s.metrics().total == 2_000


class ArmedRaisingPolicy(MinCost):
    """Decides normally until armed, then raises: the drop rule has already taken expired requests by then."""

    armed = False

    def decide(self, slack_s, queue_len, now):
        if self.armed:
            raise RuntimeError("policy bug after the drop rule")
        return super().decide(slack_s, queue_len, now)


def test_requests_dropped_in_the_step_where_the_policy_raises_still_complete():
    gate, started = threading.Event(), threading.Event()

    def gated(subnet_id, payloads):
        started.set()
        gate.wait(T)
        return list(payloads)

    policy = ArmedRaisingPolicy(PROFILE)
    # No reaper: it would drop "late" on its own clock (a DeadlineMissedError, also exactly once) before the worker's
    # step, which is the path under test.
    s = Scheduler(policy, [gated], deadline_grace_s=None)
    first = s.submit("first", slo_s=60.0)
    assert started.wait(T)
    late = s.submit("late", slo_s=1e-5)  # expired by the time the worker looks: taken by the drop rule
    normal = s.submit("normal", slo_s=60.0)
    policy.armed = True
    gate.set()
    assert first.result(T) == "first"
    done, not_done = wait([late, normal], timeout=T)
    assert not not_done  # the dropped request was not lost with the dying worker's step
    assert isinstance(normal.exception(0), NoWorkersError)
    assert isinstance(late.exception(0), (NoWorkersError, WorkerFailedError))
    s.close(timeout=T)
