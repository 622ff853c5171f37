"""Live Scheduler: results, EDF order, failures, worker churn, rejection, close semantics, exactly-once completion.

No test asserts on wall-clock speed; blocking is done with events, and every wait has a generous timeout.
"""

import asyncio
import math
import threading
from concurrent.futures import CancelledError, wait

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling import (
    DeadlineMissedError,
    InvalidRequestError,
    MinCost,
    NoWorkersError,
    QueueFullError,
    Scheduler,
    SchedulerClosedError,
    SlackFit,
    WorkerFailedError,
    WorkerResultError,
    datasets,
)

T = 30.0  # generous timeout for anything that should happen "soon"
PROFILE = datasets.superserve_a40_profile()


def echo(subnet_id, payloads):
    return list(payloads)


def _policy():
    return SlackFit(PROFILE)


def test_results_metrics_and_batch_bounds():
    calls = []

    def worker(subnet_id, payloads):
        calls.append((subnet_id, len(payloads)))
        return [p * 10 for p in payloads]

    with Scheduler(_policy(), [worker], record_timeline=True) as s:
        futs = [s.submit(i, slo_s=60.0) for i in range(200)]
        assert [f.result(T) for f in futs] == [i * 10 for i in range(200)]
    m = s.metrics()
    assert (m.total, m.on_time, m.dropped, m.failed) == (200, 200, 0, 0)
    assert m.slo_attainment == 1.0 and m.mean_accuracy in {sub.accuracy for sub in PROFILE.subnets} | {m.mean_accuracy}
    assert all(sid in PROFILE.ids and 1 <= n <= 32 for sid, n in calls)
    tl = s.timeline()
    assert sum(d.batch_size for d in tl) == 200
    assert all(1 <= d.batch_size <= min(d.queue_len, 32) for d in tl)


def test_edf_order_across_batches():
    gate, started, seen = threading.Event(), threading.Event(), []

    def worker(subnet_id, payloads):
        started.set()
        gate.wait(T)
        seen.extend(payloads)
        return payloads

    s = Scheduler(_policy(), [worker])
    first = s.submit(-1.0, slo_s=1000.0)
    assert started.wait(T)
    slos = [500.0 + ((i * 37) % 101) for i in range(100)]  # a shuffled set of SLOs
    futs = [s.submit(slo, slo_s=slo) for slo in slos]
    gate.set()
    s.close()
    assert first.result(0) == -1.0 and all(f.done() for f in futs)
    # Everything queued behind the first batch was served in deadline order (submission time is ~equal).
    rest = seen[1:]
    assert sorted(rest) == sorted(slos)
    assert all(a <= b + 1e-3 for a, b in zip(rest, rest[1:], strict=False))


def test_worker_exception_fails_exactly_its_batch():
    batches = []
    boom = ValueError("poisoned batch")

    def worker(subnet_id, payloads):
        batches.append(list(payloads))
        if "poison" in payloads:
            raise boom
        return payloads

    with Scheduler(_policy(), [worker]) as s:
        payloads = [f"r{i}" for i in range(60)] + ["poison"] + [f"q{i}" for i in range(60)]
        futs = {p: s.submit(p, slo_s=60.0) for p in payloads}
    bad = next(b for b in batches if "poison" in b)
    for p, f in futs.items():
        if p in bad:
            assert f.exception(0) is boom
        else:
            assert f.result(0) == p
    assert s.metrics().failed == len(bad)
    assert s.workers != []  # an ordinary exception does not retire the worker


def test_wrong_number_of_results_is_an_error():
    with Scheduler(_policy(), [lambda sid, xs: xs[:-1] if len(xs) > 1 else xs]) as s:
        futs = [s.submit(i, slo_s=60.0) for i in range(40)]
    errors = [f.exception(0) for f in futs if f.exception(0) is not None]
    assert all(isinstance(e, WorkerResultError) and "must return one result per payload" in str(e) for e in errors)


def test_dead_worker_is_removed_and_others_carry_on():
    died = threading.Event()

    def fragile(subnet_id, payloads):
        died.set()
        raise WorkerFailedError("GPU lost")

    s = Scheduler(_policy(), [fragile])
    f0 = s.submit("x", slo_s=60.0)
    assert isinstance(f0.exception(T), WorkerFailedError)
    assert died.is_set()
    # The only worker died: the scheduler has none and rejects at once instead of leaving futures pending.
    assert isinstance(s.submit("y", slo_s=60.0).exception(T), NoWorkersError)
    s.add_worker(echo)
    futs = [s.submit(i, slo_s=60.0) for i in range(50)]
    assert [f.result(T) for f in futs] == list(range(50))
    s.close()


def test_one_of_two_workers_dies_mid_run():
    calls = {"n": 0}
    lock = threading.Lock()

    def flaky(subnet_id, payloads):
        with lock:
            calls["n"] += 1
        raise WorkerFailedError("device gone")

    s = Scheduler(_policy(), [flaky, echo])
    futs = [s.submit(i, slo_s=60.0) for i in range(300)]
    s.close()
    fails = [f for f in futs if isinstance(f.exception(0), WorkerFailedError)]
    # The flaky worker may or may not have been handed a batch before the other one drained the queue.
    assert calls["n"] <= 1 and len(s.workers) == 2 - calls["n"]
    assert sum(1 for f in futs if f.exception(0) is None) == 300 - len(fails)


def test_last_worker_dying_fails_queued_requests():
    gate, started = threading.Event(), threading.Event()

    def dying(subnet_id, payloads):
        started.set()
        gate.wait(T)
        raise WorkerFailedError("gone")

    s = Scheduler(MinCost(PROFILE), [dying])
    first = s.submit(0, slo_s=60.0)
    assert started.wait(T)
    queued = [s.submit(i, slo_s=60.0) for i in range(1, 20)]
    gate.set()
    assert isinstance(first.exception(T), WorkerFailedError)
    for f in queued:
        assert isinstance(f.exception(T), NoWorkersError)
    s.close()


def test_add_and_remove_workers_while_running():
    s = Scheduler(_policy(), [echo])
    futs = []
    stop = threading.Event()

    def producer():
        i = 0
        while not stop.is_set() and i < 20000:
            futs.append(s.submit(i, slo_s=60.0))
            i += 1

    th = threading.Thread(target=producer)
    th.start()
    extra = [s.add_worker(echo) for _ in range(3)]
    s.remove_worker(extra[0])
    s.remove_worker(s.workers[0])
    w = s.add_worker(echo, name="late")
    assert w in s.workers and extra[0] not in s.workers
    stop.set()
    th.join(T)
    s.close()
    assert [f.result(0) for f in futs] == list(range(len(futs)))
    with pytest.raises(InvalidRequestError, match=r"unknown worker_id 999; live workers are \["):
        s.remove_worker(999)


def test_queue_full_rejects_and_others_are_served():
    gate, started = threading.Event(), threading.Event()

    def worker(subnet_id, payloads):
        started.set()
        gate.wait(T)
        return payloads

    s = Scheduler(_policy(), [worker], max_queue=5)
    first = s.submit(0, slo_s=60.0)
    assert started.wait(T)
    queued = [s.submit(i, slo_s=60.0) for i in range(1, 6)]
    rejected = s.submit(6, slo_s=60.0)
    assert isinstance(rejected.exception(0), QueueFullError) and "max_queue=5" in str(rejected.exception(0))
    gate.set()
    s.close()
    assert first.result(0) == 0 and [f.result(0) for f in queued] == [1, 2, 3, 4, 5]
    assert s.metrics().rejected == 1


def test_close_without_drain_cancels_queued_and_finishes_running():
    gate, started = threading.Event(), threading.Event()

    def worker(subnet_id, payloads):
        started.set()
        gate.wait(T)
        return payloads

    s = Scheduler(_policy(), [worker])
    running = s.submit("running", slo_s=60.0)
    assert started.wait(T)
    queued = [s.submit(i, slo_s=60.0) for i in range(10)]
    closer = threading.Thread(target=s.close, kwargs={"drain": False})
    closer.start()
    done, not_done = wait(queued, timeout=T)  # cancelled futures must count as done for wait()
    assert not not_done and all(f.cancelled() for f in queued)
    gate.set()
    closer.join(T)
    assert running.result(0) == "running"
    with pytest.raises(SchedulerClosedError, match="scheduler is closed"):
        s.submit(1, slo_s=1.0)
    with pytest.raises(SchedulerClosedError):
        s.add_worker(echo)
    assert s.metrics().cancelled == 10


def test_deadline_missed_by_drop_rule():
    with Scheduler(_policy(), [echo]) as s:
        f = s.submit("late", slo_s=1e-5)  # far below the fastest latency (3.7 ms): dropped when a worker looks
    with pytest.raises(DeadlineMissedError, match="below the fastest latency"):
        f.result(0)
    assert s.metrics().dropped == 1


def test_serve_late_option():
    with Scheduler(_policy(), [echo], drop_late=False) as s:
        f = s.submit("late", slo_s=1e-5)
    assert f.result(0) == "late"
    assert s.metrics().late == 1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"slo_s": math.nan}, "slo_s must be a finite number of seconds > 0, got nan"),
        ({"slo_s": -1.0}, "slo_s must be a finite number of seconds > 0, got -1.0"),
        ({"slo_s": 0}, "slo_s must be a finite number of seconds > 0, got 0"),
        ({"slo_s": 1.0, "deadline": 5.0}, "pass either slo_s or deadline, not both"),
        ({}, "needs slo_s= or deadline="),
        ({"deadline": math.inf}, "deadline must be a finite time.monotonic"),
    ],
)
def test_bad_submit_arguments_raise_and_queue_nothing(kwargs, match):
    with Scheduler(_policy(), [echo]) as s:
        with pytest.raises(InvalidRequestError, match=match):
            s.submit("x", **kwargs)
        assert s.queue_len == 0
    assert s.metrics().total == 0


def test_bad_constructor_arguments():
    with pytest.raises(InvalidRequestError, match="max_queue must be an int >= 1, got 0"):
        Scheduler(_policy(), [echo], max_queue=0)
    with pytest.raises(InvalidRequestError, match=r"workers\[0\] must be callable"):
        Scheduler(_policy(), ["not callable"])
    with pytest.raises(InvalidRequestError, match="policy must be a scheduling Policy"):
        Scheduler("slackfit", [echo])
    with pytest.raises(InvalidRequestError, match="default_slo_s must be a finite number"):
        Scheduler(_policy(), [echo], default_slo_s=-2)


def test_async_variant_and_default_slo():
    async def main(s):
        return await asyncio.gather(*(s.submit_async(i) for i in range(20)))

    with Scheduler(_policy(), [echo], default_slo_s=60.0) as s:
        assert asyncio.run(main(s)) == list(range(20))


requests = st.lists(
    st.tuples(st.sampled_from(["ok", "poison", "tiny_slo", "cancel"]), st.booleans()), min_size=1, max_size=25
)


@settings(max_examples=25, deadline=None)
@given(requests, st.integers(1, 3), st.booleans(), st.booleans())
def test_every_request_completes_exactly_once(reqs, n_workers, drain, fatal):
    def worker(subnet_id, payloads):
        if any(p[0] == "poison" for p in payloads):
            raise (WorkerFailedError if fatal else RuntimeError)("poison")
        return [p[1] for p in payloads]

    s = Scheduler(_policy(), [worker] * n_workers, max_queue=20)
    futs = []
    for i, (kind, _) in enumerate(reqs):
        f = s.submit((kind, i), slo_s=1e-5 if kind == "tiny_slo" else 60.0)
        if kind == "cancel":
            f.cancel()
        futs.append(f)
    s.close(drain=drain, timeout=T)
    outcome = {"result": 0, "error": 0, "cancelled": 0}
    for f in futs:
        assert f.done()  # nothing is left pending
        if f.cancelled():
            outcome["cancelled"] += 1
            with pytest.raises(CancelledError):
                f.result(0)
        elif f.exception(0) is not None:
            outcome["error"] += 1
        else:
            outcome["result"] += 1
    m = s.metrics()
    assert m.total == len(reqs)
    assert m.on_time + m.late == outcome["result"]
    assert m.dropped + m.failed + m.rejected == outcome["error"]
    assert m.cancelled == outcome["cancelled"]
