"""The live, in-process scheduler: EDF queue + policy + worker threads, with ``concurrent.futures`` results.

One lock-protected condition variable guards the queue. Each worker is a thread running a user callable
``fn(subnet_id, payloads) -> results`` (typically one per GPU). Whenever a worker is free and the queue is not empty it
applies the drop rule, asks the policy for a decision, pops the batch and runs it outside the lock. Futures are always
completed outside the lock, so callbacks may call back into the scheduler.

Every submitted request completes exactly once: with its result; with ``DeadlineMissedError`` (drop rule); with the
worker's exception (``WorkerResultError`` for a wrong number of results); with ``WorkerFailedError`` (its worker died
outside the callable); with ``QueueFullError`` or ``NoWorkersError`` (rejected, or no worker left); with
``SchedulerClosedError`` (still queued when ``close(drain=True, timeout=...)`` gave up); or cancelled (by the caller,
or by ``close(drain=False)``).

A worker dies when its callable raises ``WorkerFailedError`` or a non-``Exception`` (``KeyboardInterrupt``,
``SystemExit``), or when anything raises in its loop outside the callable (a policy whose ``decide`` raises, an
asynchronous exception). Either way it is retired at once, and the requests it held complete: the batch in the callable
with the callable's exception, anything else it had taken from the queue with ``WorkerFailedError`` (chained to the
cause). Such a batch is failed, never retried: the batch that killed one worker may kill the next, and a callable with
side effects must not run a request twice. When the last worker is gone, queued requests fail with
``NoWorkersError``.

**The deadline guarantee.** Expiry does not wait for a worker to look at the queue: a reaper thread wakes at the next
moment something is due (at least every 50 ms while anything is pending) and, whatever the workers do,

- drops queued requests by the drop rule (their slack fell below the policy's fastest latency; with
  ``drop_late=False``: their deadline + ``deadline_grace_s`` passed), so with every worker busy or hung they still
  complete (``DeadlineMissedError``) by their deadline;
- answers a request whose batch is still running on a worker at its deadline + ``deadline_grace_s`` with
  ``DeadlineMissedError`` and marks that worker **stuck** (logged, counted in :attr:`Scheduler.stuck_total`, left out
  of :attr:`Scheduler.healthy_workers`). A thread cannot be killed: a stuck worker keeps its thread, and if its
  callable ever returns, the late results are discarded (each future still completes once) and the worker serves again.

Latency percentiles are kept in a fixed-size histogram (constant memory, O(1) per request, within 0.5 %), and
:meth:`Scheduler.metrics` computes them after releasing the lock that workers take after each batch.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal

from .dispatch import dispatch_step
from .edf import EDFQueue, Entry
from .errors import (
    DeadlineMissedError,
    InvalidRequestError,
    NoWorkersError,
    QueueFullError,
    SchedulerClosedError,
    WorkerFailedError,
    WorkerResultError,
)
from .latency_model import LatencyModel
from .metrics import DecisionRecord, MetricsRecorder, MetricsSummary
from .policies import Policy
from .profile import SubnetId

__all__ = ["Scheduler", "WorkerFn"]

_log = logging.getLogger(__name__)

REAPER_TICK_S = 0.05
"""While anything is pending, the reaper looks at least this often (it also wakes at the next known due time)."""

WorkerFn = Callable[[SubnetId, list[Any]], Sequence[Any]]
"""A worker: ``fn(subnet_id, payloads) -> results``, one result per payload, in order."""


@dataclass(eq=False)
class _Worker:
    wid: int
    fn: WorkerFn
    name: str
    thread: threading.Thread | None = None
    stop: bool = False  # set by remove_worker() / close(drain=False): exit after the current batch
    # Entries this worker took from the queue and has not completed yet; if the worker dies they are failed.
    held: list[Entry] = field(default_factory=list)
    # How many leading entries of `held` have been through set_running_or_notify_cancel (the rest may be PENDING, or
    # CANCELLED by their caller without the notification that concurrent.futures.wait() needs).
    touched: int = 0
    # The running batch's entries nobody has completed yet, earliest deadline first. Whoever removes an entry from it
    # (under the lock) completes it: the worker when its callable returns, or the reaper past deadline + grace.
    running: list[Entry] = field(default_factory=list)
    claimed: list[Entry] = field(default_factory=list)  # taken back from `running` by the worker, being completed
    stuck_since: float | None = None  # when the reaper found its batch past deadline + grace; None: healthy


class Scheduler:
    """Serve requests with a policy and a pool of worker callables.

    Args:
        policy: The scheduling policy (e.g. :class:`~scheduling.SlackFit`).
        workers: Initial worker callables ``fn(subnet_id, payloads) -> results``; more can be added later with
            :meth:`add_worker`.
        max_queue: Capacity of the queue; a request submitted when it is full completes at once with
            :class:`~scheduling.errors.QueueFullError`. Default 100,000.
        drop_late: Drop rule. ``True`` (default): a request whose slack is below the policy's fastest latency
            completes with :class:`~scheduling.errors.DeadlineMissedError` instead of being served late.
        default_slo_s: SLO used when :meth:`submit` gets neither ``slo_s`` nor ``deadline``. Default ``None`` (one
            of them is then required).
        record_timeline: Keep a :class:`~scheduling.metrics.DecisionRecord` per batch (see :meth:`timeline`).
        latency_model: Adaptive planning: a :class:`~scheduling.LatencyModel` built on ``policy.profile``. Each
            batch's measured service time (the worker call) is fed to it, it re-plans the policy when its estimates
            move, and each worker decides with its own slowdown factor. ``"auto"`` (default): a new model if the
            policy ``wants_latency_model`` (the default :class:`~scheduling.SlackFit`), else none. ``None``: the
            static profile.
        deadline_grace_s: How long past its deadline a request may still be running on a worker (or queued, with
            ``drop_late=False``) before the reaper answers it with :class:`~scheduling.errors.DeadlineMissedError`
            and marks the worker stuck. Default 0.5 s: every future is done by its deadline + 0.5 s (+ the reaper's
            wake-up latency) whatever the workers do. ``None``: no reaper (requests wait for their worker).

    Example::

        >>> from scheduling import Scheduler, SlackFit, datasets
        >>> def worker(subnet_id, payloads):            # the model side: run `payloads` on subnet `subnet_id`
        ...     return [x * 2 for x in payloads]
        >>> with Scheduler(SlackFit(datasets.superserve_a40_profile()), [worker]) as sched:
        ...     futures = [sched.submit(i, slo_s=1.0) for i in range(5)]
        ...     [f.result() for f in futures]
        [0, 2, 4, 6, 8]
    """

    def __init__(
        self,
        policy: Policy,
        workers: Iterable[WorkerFn] = (),
        *,
        max_queue: int = 100_000,
        drop_late: bool = True,
        default_slo_s: float | None = None,
        record_timeline: bool = False,
        latency_model: LatencyModel | None | Literal["auto"] = "auto",
        deadline_grace_s: float | None = 0.5,
    ) -> None:
        if not isinstance(policy, Policy):
            raise InvalidRequestError(f"policy must be a scheduling Policy, got {type(policy).__name__}")
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
            raise InvalidRequestError(f"max_queue must be an int >= 1, got {max_queue!r}")
        if default_slo_s is not None:
            self._check_slo(default_slo_s, "default_slo_s")
        if deadline_grace_s is not None and (
            isinstance(deadline_grace_s, bool)
            or not isinstance(deadline_grace_s, (int, float))
            or not math.isfinite(deadline_grace_s)
            or deadline_grace_s < 0
        ):
            raise InvalidRequestError(
                f"deadline_grace_s must be None or a finite number of seconds >= 0, got {deadline_grace_s!r}"
            )
        workers = list(workers)
        for i, fn in enumerate(workers):
            if not callable(fn):
                raise InvalidRequestError(f"workers[{i}] must be callable fn(subnet_id, payloads), got {fn!r}")
        if isinstance(latency_model, str) and latency_model == "auto":
            latency_model = LatencyModel(policy.profile) if policy.wants_latency_model else None
        if latency_model is not None:
            if not isinstance(latency_model, LatencyModel):
                raise InvalidRequestError(
                    f"latency_model must be a LatencyModel, None or 'auto', got {type(latency_model).__name__}"
                )
            latency_model.reset()
            policy.update_profile(latency_model.prior)  # raises if the model was built on another profile
        policy.reset()
        self.policy = policy
        self.latency_model = latency_model
        self.default_slo_s = default_slo_s
        self._clock = time.monotonic
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # workers wait on it
        self._reaper_cond = threading.Condition(lock)  # the reaper waits on it: one lock, two sets of waiters
        self.deadline_grace_s = None if deadline_grace_s is None else float(deadline_grace_s)
        self._reaper_idle = False  # the reaper waits with nothing pending: the next submit() wakes it
        self._stuck_total = 0
        self._late_results = 0
        self._queue = EDFQueue(capacity=max_queue, drop_late=drop_late)
        self._metrics = MetricsRecorder(record_timeline=record_timeline, thread_safe=True, latencies="histogram")
        self._workers: dict[int, _Worker] = {}
        # Every worker thread that has not finished, registered or not (removed without waiting, retired): close()
        # joins them all, so no thread outlives it unless a callable hangs past the timeout.
        self._threads: set[threading.Thread] = set()
        self._live: set[_Worker] = (
            set()
        )  # workers whose thread has not finished, registered or not (the reaper's view)
        self._ids = itertools.count()
        self._idle = 0  # workers blocked in cond.wait(): submit() only notifies when one is
        self._closing = False
        self._observe = policy.observe_arrivals if policy.needs_arrivals else None
        self._reaper: threading.Thread | None = None
        if self.deadline_grace_s is not None:
            self._reaper = threading.Thread(target=self._reap, name="scheduling-reaper", daemon=True)
            self._reaper.start()
        for fn in workers:
            self.add_worker(fn)

    # ------------------------------------------------------------------ validation helpers
    @staticmethod
    def _check_slo(value: Any, name: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise InvalidRequestError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        return float(value)

    # ------------------------------------------------------------------ submission
    def submit(self, payload: Any, *, slo_s: float | None = None, deadline: float | None = None) -> Future:
        """Queue one request and return its future.

        Args:
            payload: Anything; handed to a worker callable in a list with the other requests of its batch.
            slo_s: Latency target in seconds from now (> 0).
            deadline: Absolute deadline on the :func:`time.monotonic` clock. Give ``slo_s`` or ``deadline``, not both
                (or neither, if ``default_slo_s`` was set).

        Returns:
            A :class:`concurrent.futures.Future` that completes exactly once: with the worker's result, or with an
            exception (:class:`~scheduling.errors.DeadlineMissedError`, the worker's exception,
            :class:`~scheduling.errors.QueueFullError`, :class:`~scheduling.errors.NoWorkersError`), or cancelled.

        Raises:
            InvalidRequestError: bad ``slo_s`` / ``deadline``; nothing is queued.
            SchedulerClosedError: :meth:`close` was called.
        """
        now = self._clock()
        if slo_s is not None:
            if deadline is not None:
                raise InvalidRequestError(
                    f"pass either slo_s or deadline, not both (got slo_s={slo_s!r}, deadline={deadline!r})"
                )
            deadline = now + self._check_slo(slo_s, "slo_s")
        elif deadline is not None:
            if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not math.isfinite(deadline):
                raise InvalidRequestError(f"deadline must be a finite time.monotonic() value, got {deadline!r}")
        elif self.default_slo_s is not None:
            deadline = now + self.default_slo_s
        else:
            raise InvalidRequestError("submit() needs slo_s= or deadline= (or a Scheduler default_slo_s)")
        fut: Future = Future()
        with self._cond:
            if self._closing:
                raise SchedulerClosedError("scheduler is closed; submit() is no longer accepted")
            if not self._workers:
                reject: BaseException = NoWorkersError("no live worker; add one with add_worker()")
            elif len(self._queue) >= self._queue.capacity:  # type: ignore[operator]
                reject = QueueFullError(f"queue is full (max_queue={self._queue.capacity}); request rejected")
            else:
                self._queue.push(deadline, now, (fut, payload))
                if self._observe is not None:
                    self._observe(now, 1)
                if self._idle:
                    self._cond.notify()
                if self._reaper_idle:
                    self._reaper_idle = False
                    self._reaper_cond.notify()
                return fut
        self._metrics.record_rejection(now)
        fut.set_exception(reject)
        return fut

    async def submit_async(self, payload: Any, *, slo_s: float | None = None, deadline: float | None = None) -> Any:
        """``await``-able :meth:`submit`: returns the result or raises the request's exception.

        Cancelling the awaiting task cancels the request if no worker has taken it yet.
        """
        return await asyncio.wrap_future(self.submit(payload, slo_s=slo_s, deadline=deadline))

    # ------------------------------------------------------------------ workers
    def add_worker(self, fn: WorkerFn, *, name: str | None = None) -> int:
        """Start a worker thread running ``fn``; returns its id (for :meth:`remove_worker`)."""
        if not callable(fn):
            raise InvalidRequestError(f"fn must be callable fn(subnet_id, payloads), got {fn!r}")
        with self._cond:
            if self._closing:
                raise SchedulerClosedError("scheduler is closed; add_worker() is no longer accepted")
            wid = next(self._ids)
            w = _Worker(wid, fn, name or f"scheduling-worker-{wid}")
            w.thread = threading.Thread(target=self._run, args=(w,), name=w.name, daemon=True)
            # Started before it is registered, under the lock (its loop waits for the lock, start() does not): a
            # concurrent close() never sees a thread it cannot join, and a failed start leaves no worker that never
            # runs (requests routed to it would hang).
            w.thread.start()
            self._workers[wid] = w
            self._threads.add(w.thread)
            self._live.add(w)
            self.policy.set_num_workers(len(self._workers))
        return wid

    def remove_worker(self, worker_id: int, *, wait: bool = True) -> None:
        """Stop worker ``worker_id`` after its current batch. If it was the last worker, queued requests fail with
        :class:`~scheduling.errors.NoWorkersError`.

        Args:
            worker_id: An id returned by :meth:`add_worker`.
            wait: Block until the worker's thread has finished.
        """
        with self._cond:
            w = self._workers.pop(worker_id, None)
            self.policy.set_num_workers(len(self._workers))
            if w is None:
                raise InvalidRequestError(
                    f"unknown worker_id {worker_id!r}; live workers are {sorted(self._workers)!r}"
                )
            w.stop = True
            orphans = self._orphans_locked()
            self._cond.notify_all()
        self._fail(orphans, NoWorkersError("the last worker was removed"))
        if wait and w.thread is not threading.current_thread():
            w.thread.join()  # type: ignore[union-attr]

    @property
    def workers(self) -> list[int]:
        """Ids of the live workers (stuck ones included)."""
        with self._cond:
            return sorted(self._workers)

    @property
    def healthy_workers(self) -> list[int]:
        """Ids of the live workers that are not stuck: those that could serve a request submitted now."""
        with self._cond:
            return sorted(wid for wid, w in self._workers.items() if w.stuck_since is None)

    @property
    def stuck_workers(self) -> list[int]:
        """Ids of the live workers whose running batch went past a request's deadline + ``deadline_grace_s``."""
        with self._cond:
            return sorted(wid for wid, w in self._workers.items() if w.stuck_since is not None)

    @property
    def stuck_total(self) -> int:
        """How many times a worker was marked stuck since the start."""
        return self._stuck_total

    @property
    def late_results(self) -> int:
        """Results a stuck worker returned after its requests had been answered with a deadline error (discarded)."""
        return self._late_results

    def _orphans_locked(self) -> list[Entry]:
        # With no worker left nobody would ever look at the queue again: fail what is queued now.
        return self._queue.drain() if not self._workers else []

    # ------------------------------------------------------------------ the worker loop
    def _run(self, w: _Worker) -> None:
        """Thread body: serve until told to stop; a worker that dies for any reason is retired, not left registered."""
        try:
            self._serve(w)
        except BaseException as exc:  # noqa: BLE001 - a policy bug or an asynchronous SystemExit must not hang requests
            self._die(w, exc)
        finally:
            with self._cond:
                self._threads.discard(w.thread)  # type: ignore[arg-type]
                self._live.discard(w)
                self._reaper_cond.notify()  # closing: the reaper may be waiting for this thread's batch

    def _serve(self, w: _Worker) -> None:
        cond, q, policy, clock, metrics = self._cond, self._queue, self.policy, self._clock, self._metrics
        model = self.latency_model
        while True:
            expired: list[Entry] = []
            batch: list[Entry] | None = None
            d = None
            cancelled = 0
            with cond:
                while True:
                    if w.stop or (self._closing and not q):
                        break
                    timeout = None
                    if q:
                        now = clock()
                        # A worker the latency model finds slower plans with proportionally less slack.
                        step = dispatch_step(q, policy, now, 1.0 if model is None else model.slack_scale(w.wid))
                        if step.expired:
                            expired += step.expired
                            w.held, w.touched = expired, 0
                        d = step.decision
                        if d is not None:
                            # Marked running under the lock, so that the reaper sees exactly the running entries
                            # (set_running_or_notify_cancel runs no callback). Cancelled ones are left out.
                            batch = [e for e in step.batch if e.item[0].set_running_or_notify_cancel()]
                            w.running = batch[:]
                            w.held, w.touched = [*step.batch, *expired], len(step.batch)
                            cancelled = len(step.batch) - len(batch)
                            metrics.record_decision(now, w.wid, d.subnet_id, len(batch), step.queue_len, d.latency_s)
                            break
                        if expired:
                            break
                        if not q:
                            continue
                        timeout = step.wake_at - now  # the policy waits: look again when the head must be dropped
                    self._idle += 1
                    try:
                        cond.wait(timeout)
                    finally:
                        self._idle -= 1
            if expired:
                self._miss(expired)
                w.touched = len(w.held)
            if batch is not None:
                alive = self._execute(w, d, batch, cancelled)
                w.held = w.claimed = []
                if not alive:
                    return
            elif not expired:
                return  # asked to stop, or closing with an empty queue
            w.held = []

    def _execute(self, w: _Worker, d: Any, entries: list[Entry], cancelled: int) -> bool:
        """Run one batch (its futures already RUNNING); returns False when the worker must retire."""
        if cancelled:
            self._metrics.record_cancel(self._clock(), cancelled)
        if not entries:
            return True
        payloads = [e.item[1] for e in entries]
        t_start = self._clock()
        try:
            results = w.fn(d.subnet_id, payloads)
            if not isinstance(results, Sequence):
                results = list(results)
            if len(results) != len(entries):
                raise WorkerResultError(
                    f"worker {w.name!r} returned {len(results)} results for {len(entries)} payloads "
                    f"(subnet {d.subnet_id!r}); it must return one result per payload, in order"
                )
        except BaseException as exc:  # noqa: BLE001 - any failure, even KeyboardInterrupt in a thread, fails the batch
            t = self._clock()
            live = self._claim(w, entries, t)
            for e in live:
                e.item[0].set_exception(exc)
            self._metrics.record_failure(t, len(live))
            if isinstance(exc, WorkerFailedError) or not isinstance(exc, Exception):
                self._retire(w, exc)
                return False
            return True
        t_done = self._clock()
        model = self.latency_model
        with self._cond:
            live = self._claim_locked(w, entries, t_done)
            if model is not None and model.record(w.wid, d.subnet_id, len(entries), t_done - t_start, t_done):
                model.replan(self.policy, t_done)
        if live is not entries:  # the reaper answered some of them past deadline + grace: drop their results
            keep = {id(e) for e in live}
            results = [r for e, r in zip(entries, results, strict=True) if id(e) in keep]
        self._metrics.record_served(t_done, live, d.accuracy)
        for e, r in zip(live, results, strict=True):
            e.item[0].set_result(r)
        return True

    def _claim(self, w: _Worker, entries: list[Entry], now: float) -> list[Entry]:
        with self._cond:
            return self._claim_locked(w, entries, now)

    def _claim_locked(self, w: _Worker, entries: list[Entry], now: float) -> list[Entry]:
        """The worker's callable returned: take the entries of its batch the reaper has not answered (``entries``
        itself when it answered none), and clear the worker's stuck mark."""
        live, w.running = w.running, []
        w.claimed = live
        if w.stuck_since is not None:
            _log.warning(
                "scheduling worker %r returned after %.3f s stuck; %d late result(s) discarded; it serves again",
                w.name,
                now - w.stuck_since,
                len(entries) - len(live),
            )
            w.stuck_since = None
        if len(live) == len(entries):
            return entries
        self._late_results += len(entries) - len(live)
        return live

    def _retire(self, w: _Worker, cause: BaseException | None = None) -> None:
        with self._cond:
            if self._workers.get(w.wid) is w:
                del self._workers[w.wid]
                self.policy.set_num_workers(len(self._workers))
            orphans = self._orphans_locked()
            self._cond.notify_all()
        if orphans:
            why = f" ({cause!r})" if cause is not None else ""
            err = NoWorkersError(f"worker {w.name!r} died{why} and no live worker is left")
            err.__cause__ = cause
            self._fail(orphans, err)

    def _die(self, w: _Worker, exc: BaseException) -> None:
        """The worker's loop raised outside its callable: fail what it held, then retire it."""
        with self._cond:
            # Still in the batch, or claimed by this (dying) worker: fail them here. The others were completed, or
            # are being completed by the reaper.
            mine = {id(e) for e in (*w.running, *w.claimed)}
            w.running, w.claimed = [], []
        held, touched, w.held = w.held, w.touched, []
        err = WorkerFailedError(
            f"worker {w.name!r} died outside its callable ({exc!r}); the requests it had taken from the queue fail"
        )
        err.__cause__ = exc
        t = self._clock()
        failed = cancelled = 0
        for i, e in enumerate(held):
            if i < touched and (id(e) not in mine or e.item[0].done()):
                continue
            outcome = _settle(e.item[0], err, touched=i < touched)
            failed += outcome == "failed"
            cancelled += outcome == "cancelled"
        self._metrics.record_failure(t, failed)
        self._metrics.record_cancel(t, cancelled)
        self._retire(w, exc)

    # ------------------------------------------------------------------ the reaper: expiry on its own clock
    def _reap(self) -> None:
        """Thread body: answer what is past due whatever the workers do (see the module docstring); exits once the
        scheduler is closed and nothing is queued or running."""
        cond, clock, grace = self._reaper_cond, self._clock, self.deadline_grace_s
        while True:
            try:
                with cond:
                    while True:
                        now = clock()
                        dropped = self._expire_queued_locked(now)
                        overdue = self._overdue_running_locked(now)
                        if dropped or overdue:
                            break
                        due = self._next_due_locked()
                        if due == math.inf:
                            if self._closing:
                                return
                            self._reaper_idle = True
                            cond.wait()
                        else:
                            cond.wait(min(max(due - now, 0.0) + 1e-4, REAPER_TICK_S))
                if dropped:
                    self._miss(dropped)
                for e in overdue:
                    e.item[0].set_exception(
                        DeadlineMissedError(
                            f"its batch was still running on a stuck worker {1e3 * (now - e.deadline):.1f} ms past "
                            f"its deadline (grace {grace:g} s)"
                        )
                    )
                if overdue:
                    self._metrics.record_drop(now, len(overdue))
            except Exception:  # noqa: BLE001 - e.g. a policy whose min_latency raises: keep the guarantee, log it
                _log.exception("scheduling reaper: unexpected error; retrying in %.2f s", REAPER_TICK_S)
                time.sleep(REAPER_TICK_S)

    def _expire_queued_locked(self, now: float) -> list[Entry]:
        q = self._queue
        if not q:
            return []
        if not q.drop_late:
            return q.pop_due(now - self.deadline_grace_s)  # type: ignore[operator]
        dropped: list[Entry] = []
        while q:  # the drop rule, as dispatch_step applies it (the threshold depends on the queue length)
            more = q.expire(now, self.policy.min_latency(len(q)))
            if not more:
                break
            dropped += more
        return dropped

    def _overdue_running_locked(self, now: float) -> list[Entry]:
        """Take the running entries past deadline + grace out of their workers' batches; mark those workers stuck."""
        cutoff = now - self.deadline_grace_s  # type: ignore[operator]
        overdue: list[Entry] = []
        for w in self._live:
            run = w.running
            if not run or run[0].deadline > cutoff:  # earliest deadline first
                continue
            n = 1
            while n < len(run) and run[n].deadline <= cutoff:
                n += 1
            overdue += run[:n]
            del run[:n]
            if w.stuck_since is None:
                w.stuck_since = now
                self._stuck_total += 1
                _log.warning(
                    "scheduling worker %r is stuck: its batch is still running %.3f s past a request's deadline "
                    "(grace %g s); %d request(s) answered with DeadlineMissedError, the worker is not ready until its "
                    "callable returns",
                    w.name,
                    now - overdue[-1].deadline,
                    self.deadline_grace_s,
                    n,
                )
        return overdue

    def _next_due_locked(self) -> float:
        """When something next becomes due: the queue head's drop time or a running request's deadline + grace."""
        grace = self.deadline_grace_s
        q = self._queue
        due = math.inf
        if q:
            head = q.peek_deadline()
            due = head - self.policy.min_latency(len(q)) if q.drop_late else head + grace  # type: ignore[operator]
        for w in self._live:
            if w.running:
                due = min(due, w.running[0].deadline + grace)  # type: ignore[operator]
        return due

    def _miss(self, entries: list[Entry]) -> None:
        t = self._clock()
        done = 0
        for e in entries:
            fut = e.item[0]
            if fut.set_running_or_notify_cancel():  # False: the caller cancelled it while queued
                done += 1
                fut.set_exception(
                    DeadlineMissedError(
                        f"dropped: remaining slack {1e3 * (e.deadline - t):.3f} ms is below the fastest latency the "
                        "policy can run"
                    )
                )
        self._metrics.record_drop(t, done)
        self._metrics.record_cancel(t, len(entries) - done)

    def _fail(self, entries: list[Entry], exc: BaseException) -> None:
        """Fail queued (never started) entries with ``exc``."""
        if not entries:
            return
        t = self._clock()
        done = 0
        for e in entries:
            fut = e.item[0]
            if fut.set_running_or_notify_cancel():
                done += 1
                fut.set_exception(exc)
        self._metrics.record_failure(t, done)
        self._metrics.record_cancel(t, len(entries) - done)

    # ------------------------------------------------------------------ shutdown and metrics
    def close(self, *, drain: bool = True, timeout: float | None = None) -> None:
        """Stop accepting requests and shut the workers down; idempotent.

        Args:
            drain: ``True`` (default): queued requests are still served (or dropped by the deadline rule) before the
                workers exit. ``False``: queued requests are cancelled at once; running batches finish.
            timeout: Seconds to wait for the worker threads (``None``: wait for them). When it runs out, requests
                still queued fail with :class:`~scheduling.errors.SchedulerClosedError` and the workers exit after
                their current batch. A worker callable that never returns keeps its thread, but its batch's futures
                are still answered by the reaper at their deadline + ``deadline_grace_s`` (with
                ``deadline_grace_s=None`` they stay pending).
        """
        with self._cond:
            self._closing = True
            cancelled = [] if drain else self._queue.drain()
            if not drain:
                for w in self._workers.values():
                    w.stop = True
            threads = list(self._threads)
            orphans = self._orphans_locked()
            self._cond.notify_all()
            self._reaper_cond.notify()
        if cancelled:
            self._metrics.record_cancel(self._clock(), len(cancelled))
            for e in cancelled:
                fut = e.item[0]
                fut.cancel()
                # cancel() alone leaves the state CANCELLED, which concurrent.futures.wait()/as_completed() do not
                # count as done; this moves it to CANCELLED_AND_NOTIFIED and wakes their waiters.
                fut.set_running_or_notify_cancel()
        self._fail(orphans, NoWorkersError("scheduler closed with no live worker"))
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in threads:
            if t is not threading.current_thread():
                t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        # Timed out with workers still busy (a hung callable): nobody may ever pop what is left, so fail it now and
        # let the workers exit after their current batch instead of serving a closed scheduler's queue.
        with self._cond:
            left = self._queue.drain()
            if left:
                for w in self._workers.values():
                    w.stop = True
                self._cond.notify_all()
        busy = sum(t.is_alive() for t in threads)
        self._fail(
            left,
            SchedulerClosedError(
                f"close(timeout={timeout!r}) returned with {busy} worker(s) still busy; this request was still queued"
            ),
        )
        reaper = self._reaper
        if not busy and reaper is not None and reaper is not threading.current_thread():
            # Nothing is queued or running any more: the reaper sees that at its next look and exits.
            with self._cond:
                self._reaper_cond.notify()
            reaper.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(drain=True)

    def metrics(self) -> MetricsSummary:
        """SLO attainment, mean serving accuracy, latency percentiles (within 0.5 %) and counts so far.

        Constant time and memory whatever the uptime: a fixed-size histogram is copied under the metrics lock and its
        percentiles are computed after releasing it.
        """
        return self._metrics.summary()

    def timeline(self) -> list[DecisionRecord]:
        """Per-batch decisions (time, worker, subnet, batch size, queue length); empty unless ``record_timeline``."""
        with self._cond:
            return list(self._metrics.decisions)

    @property
    def queue_len(self) -> int:
        """Number of queued requests."""
        return len(self._queue)


def _settle(fut: Future, exc: BaseException, *, touched: bool) -> str:
    """Fail ``fut`` with ``exc`` unless it already finished; returns "failed", "cancelled" or "done".

    ``touched``: the worker already called ``set_running_or_notify_cancel`` on it (calling it twice is an error).
    """
    if fut.running():
        fut.set_exception(exc)
        return "failed"
    if touched:
        return "done"
    if fut.set_running_or_notify_cancel():  # PENDING -> RUNNING; False (and waiters notified) if it was cancelled
        fut.set_exception(exc)
        return "failed"
    return "cancelled"
