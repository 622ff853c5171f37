"""SuperServe's architecture on Ray Serve: router replicas with the EDF queue and the policy, single-batch workers.

::

    client --HTTP--> Ray's proxy (every node) --> Router x R (2)   ServingApp front end + EDF queue + policy:
                                                       |           the shared scheduling.dispatch_step
                                                       |  run(subnet_id, payloads): one batch at a time per worker
                                                       v
                                                  Worker actors    num_workers in all, split among the routers; each
                                                                   loads the model from a subnetact.save file

- **The routers are the ingress**: Ray's proxy terminates HTTP and forwards to a router replica, which runs the
  :class:`~subnetact.serving.ServingApp` front end (parsing, deadlines, JSON errors, metrics) with itself as the
  backend. A separate ingress deployment would cost one more actor call per request for no gain: a router must see
  every request it schedules anyway.
- **No single point of failure** (issue 22): ``num_routers`` replicas (default 2), each with its own queue and its
  share of the workers (replica ``rank`` of ``R`` gets ``num_workers // R``, one more if ``rank < num_workers % R``).
  When a router dies, Ray's proxy stops sending to it at its first failed request and the others take the traffic;
  the requests it held are answered 500 by the proxy and clients send them again (idempotent: a prediction is a pure
  function of its input). Its workers are **detached** actors *leased* to it (renewed every ``lease_s / 4`` from a
  thread): they outlive it, and the router Serve starts in its place adopts them once their lease lapses instead of
  loading the model again, if they serve the same model (:func:`model_key`). A worker no router has leased for
  ``orphan_ttl_s`` is killed.
- **Model distribution.** A converted model does not pickle; workers get a :class:`~subnetact.serving.ModelSpec`
  (checkpoint path, factory, profile: plain data) and each loads the :func:`subnetact.save` file itself. The file
  must be readable at that path on every node (shared storage, or baked into the image).
- **Deadlines** cross processes as wall-clock times (``time.time()``): :meth:`Router.submit` takes one from callers
  in other processes or hosts and converts it to the router's ``time.monotonic()``. Over HTTP the budget starts when
  the request reaches the router (Ray's proxy hop before that is not counted).
- **Workers** are Ray actors leased to one router (not Serve replicas), so the router knows which one is free and
  sends each a batch only when it is idle, as in the paper. ``reconfigure({"num_workers": n})`` (Serve's
  ``user_config``, sent to every replica: ``n`` is the total) or :meth:`Router.scale` (the one replica a handle call
  reaches: its own count) adds or removes workers while serving; a removed worker finishes its batch first.
- **Deadlines on the router's clock.** With every worker busy (or hung) the router still applies the drop rule to its
  queue when the head's time comes, and a request whose batch is still running on a worker at its deadline +
  ``deadline_grace_s`` (0.5 s) is answered ``DeadlineMissedError`` (HTTP 504); the worker is marked stuck (logged,
  counted in :meth:`Router.stats`, not ready) until its call returns, and its late results are dropped.
- **Worker death.** A batch whose worker dies is put back in the queue once (it is retried on another worker if its
  deadline still allows, else dropped as missed); if a retried request's worker dies too, it fails with
  ``WorkerFailedError`` (HTTP 503). Every request completes exactly once: the router holds one future per request.

:func:`build_app` returns the bound application for ``serve.run``; :func:`serve_batch_app` is the Clipper+-style
baseline on the same engine (Ray's ``@serve.batch`` running one fixed subnet, or a policy through
:func:`scheduling.plan_batch`).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import ray
from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError, RayActorError

from scheduling import (
    DeadlineMissedError,
    EDFQueue,
    LatencyModel,
    NoWorkersError,
    Profile,
    QueueFullError,
    SchedulerClosedError,
    WorkerFailedError,
    dispatch_step,
    plan_batch,
)
from scheduling.dispatch import WAKE_FLOOR_S

from ..errors import ConfigError
from .app import ServingApp
from .backend import PROFILE_ERROR_LIMIT, make_policy, wall_to_monotonic
from .runner import ModelSpec

__all__ = [
    "WORKER_NAMESPACE",
    "Router",
    "Worker",
    "app_builder",
    "build_app",
    "model_key",
    "serve_batch_app",
]

_log = logging.getLogger("subnetact.serving")

WORKER_NAMESPACE = "subnetact"
"""The Ray namespace of the worker actors."""

_WORKER_DIED = (ActorDiedError, ActorUnavailableError, RayActorError)


class Worker:
    """A worker actor: loads the model from its spec and runs one batch per call (``max_concurrency=1``).

    It is a detached actor leased to one router at a time: the router renews the lease every ``lease_s / 4``; when
    its router dies the lease lapses and a restarted router adopts the worker, model already loaded. The lease
    methods run in their own ``"control"`` thread, so a router can renew (or adopt) while a batch runs or hangs.
    """

    def __init__(self, spec: ModelSpec, owner: str, lease_s: float, model_key: str) -> None:
        self.runner = spec.build()
        self.model_key = model_key  # which model it serves (:func:`model_key`): only a router of that model adopts it
        self._lease_lock = threading.Lock()  # the control thread and nothing else touches the lease; one at a time
        self._owner = owner
        self._renewed_at = time.monotonic()
        self._lease_s = lease_s

    def run(self, subnet_id: Any, payloads: list[Any]) -> list[dict[str, Any]]:
        return self.runner(subnet_id, payloads)

    @ray.method(concurrency_group="control")
    def ready(self) -> bool:
        return True

    @ray.method(concurrency_group="control")
    def claim(self, router_id: str, lease_s: float, model_key: str) -> dict[str, Any]:
        """Take or renew the lease for ``router_id``: granted if it holds it already or the holder's has lapsed,
        and only for a router of the same model (``model_key``: another application, or a new version, must not
        adopt a worker that runs another checkpoint or profile).

        Returns ``{"granted": bool, "since_renewal_s": seconds since the holder last renewed, "same_model": bool,
        "pid": ...}``.
        """
        with self._lease_lock:
            now = time.monotonic()
            since = now - self._renewed_at
            same_model = model_key == self.model_key
            granted = same_model and (self._owner == router_id or since > self._lease_s)
            if granted:
                self._owner, self._renewed_at, self._lease_s = router_id, now, lease_s
            return {"granted": granted, "since_renewal_s": since, "same_model": same_model, "pid": os.getpid()}

    @ray.method(concurrency_group="control")
    def orphaned_for(self) -> float:
        """Seconds since the lease lapsed (0 while a router holds it)."""
        with self._lease_lock:
            return max(0.0, time.monotonic() - self._renewed_at - self._lease_s)


@dataclass(eq=False)
class _WorkerSlot:
    wid: int
    name: str
    actor: Any
    busy: bool = False
    retiring: bool = False
    stuck: bool = False  # its batch ran past a request's deadline + grace and has not returned
    lost: bool = False  # another router holds its lease now (ours lapsed): not ours to use or kill
    reaper: asyncio.TimerHandle | None = None  # when its running batch's next request is due


@dataclass(eq=False)
class _Request:
    future: asyncio.Future
    payload: Any
    attempts: int = 0  # batches it was sent in whose worker died


@serve.deployment(ray_actor_options={"num_cpus": 0}, num_replicas=2, max_ongoing_requests=100_000)
@serve.ingress()
class Router:
    """A router replica and HTTP ingress: front end, EDF queue and policy for its share of the workers (see the module
    docstring).

    It is the :class:`~subnetact.serving.ServingApp`'s backend (``infer``, ``queue_len``, ``ready``, ``close``);
    handle methods: :meth:`scale`, :meth:`stats`, :meth:`worker_names`, :meth:`submit`.

    Args:
        spec: The model; every worker builds it.
        policy: A policy name for :func:`~subnetact.serving.make_policy` (``"slackfit"``...).
        num_workers: Workers at start, over all router replicas: replica ``rank`` of ``R`` runs
            ``num_workers // R`` of them, one more if ``rank < num_workers % R`` (changed later by ``reconfigure``,
            which every replica gets, or by :meth:`scale` on the one replica a handle call reaches).
        max_queue: Queue capacity; beyond it ``QueueFullError`` (HTTP 429).
        worker_options: Ray actor options of each worker, e.g. ``{"num_cpus": 1}`` (default) or
            ``{"num_gpus": 1}``.
        name_prefix: Workers are named actors ``f"{name_prefix}-{i}"`` in the Ray namespace ``WORKER_NAMESPACE``
            (``ray.get_actor(name, namespace=WORKER_NAMESPACE)``).
        app_options: Keyword arguments of :class:`~subnetact.serving.ServingApp` (``default_deadline_ms``...).
        adaptive: Refine the profile from measured batch times with a :class:`scheduling.LatencyModel` (slow workers
            get proportionally less slack), as ``Scheduler(latency_model=...)`` does. Default ``False``: only for
            policies that want one (the default SlackFit always plans with one).
        deadline_grace_s: A request still running on a worker this long past its deadline is answered
            ``DeadlineMissedError`` and the worker marked stuck, as in :class:`scheduling.Scheduler`. Default 0.5 s.
        lease_s: How long a worker stays leased to this router without a renewal (renewed every ``lease_s / 4``
            from a thread of its own). A router that starts adopts workers whose lease has lapsed instead of
            loading new ones, waiting up to ``lease_s`` for those whose router has stopped renewing. Default 3 s.
        orphan_ttl_s: A worker nobody has leased for this long is killed (its router is gone for good, e.g. after
            ``num_replicas`` went down). Default 60 s.
    """

    def __init__(
        self,
        spec: ModelSpec,
        *,
        policy: str = "slackfit",
        num_workers: int = 2,
        max_queue: int = 1000,
        worker_options: dict[str, Any] | None = None,
        name_prefix: str = "subnetact-worker",
        app_options: dict[str, Any] | None = None,
        adaptive: bool = False,
        deadline_grace_s: float = 0.5,
        lease_s: float = 3.0,
        orphan_ttl_s: float = 60.0,
    ) -> None:
        _check_seconds("lease_s", lease_s)
        _check_seconds("orphan_ttl_s", orphan_ttl_s)
        self.spec = spec
        self.deadline_grace_s = float(deadline_grace_s)
        self.lease_s = float(lease_s)
        self.orphan_ttl_s = float(orphan_ttl_s)
        self.router_id = uuid.uuid4().hex
        self.rank, self.num_routers = _replica_rank()
        self.profile = spec.load_profile()
        self.model_key = model_key(spec, self.profile)
        self.policy = make_policy(policy, self.profile)
        # Adaptive planning as in scheduling.Scheduler(latency_model=...): each batch's service time as the router
        # sees it (the worker's forward plus the actor call) refines the profile the policy decides from.
        # The default SlackFit plans with one (wants_latency_model), as in scheduling.Scheduler's default.
        adaptive = adaptive or self.policy.wants_latency_model
        self.latency_model = LatencyModel(self.profile, max_ratio=PROFILE_ERROR_LIMIT) if adaptive else None
        self.adaptive = self.latency_model is not None
        if self.latency_model is not None:
            self.policy.update_profile(self.latency_model.prior)
        self.queue = EDFQueue(capacity=max_queue)
        self.worker_options = {"num_cpus": 1, **(worker_options or {})}
        self.name_prefix = name_prefix
        self.workers: dict[int, _WorkerSlot] = {}
        self._ids = itertools.count()
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self.counts = {
            "submitted": 0, "completed": 0, "batches": 0, "retried": 0, "worker_deaths": 0, "stuck": 0,
            "adopted": 0, "started": 0, "leases_lost": 0, "orphans_killed": 0,
        }  # fmt: skip
        self._observe_batch: Any = None
        self._closing = False
        share = self._share(num_workers)
        adopted = self._adopt_orphans(share)  # a restarted router takes over its predecessor's loaded workers
        for w in adopted + self._start_workers(share - len(adopted)):
            self.workers[w.wid] = w
        self._stop_leases = threading.Event()
        self._start_lease_keeper()
        # Behind Ray's proxy: the budget starts at the proxy's X-Request-Start (subnetact_proxy) when it is there.
        app_options = {"trust_request_start": True, **(app_options or {})}
        self.front_end = ServingApp(self, input_shape=spec.input_shape, **app_options)

    def __serve_build_asgi_app__(self) -> ServingApp:
        return self.front_end

    # ------------------------------------------------------------------ workers
    def _share(self, num_workers: int) -> int:
        """This replica's part of ``num_workers`` (split by rank, the first ones get the remainder)."""
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ConfigError(f"num_workers={num_workers!r} must be an int >= 0")
        return num_workers // self.num_routers + (self.rank < num_workers % self.num_routers)

    def _start_workers(self, n: int) -> list[_WorkerSlot]:
        """Start ``n`` worker actors leased to this router and wait until each has loaded the model."""
        cls = ray.remote(
            max_concurrency=1, concurrency_groups={"control": 1}, max_restarts=0, max_task_retries=0,
            **self.worker_options,
        )(Worker)  # fmt: skip
        slots = []
        for _ in range(n):
            # Unique names: workers outlive their router (detached), and a restarted router's ids start at 0 again.
            name = f"{self.name_prefix}-{uuid.uuid4().hex[:12]}"
            actor = cls.options(name=name, namespace=WORKER_NAMESPACE, lifetime="detached").remote(
                self.spec, self.router_id, self.lease_s, self.model_key
            )
            slots.append(_WorkerSlot(next(self._ids), name, actor))
        try:
            ray.get([s.actor.ready.remote() for s in slots], timeout=300)  # the model is loaded: serve from here on
        except BaseException:
            for s in slots:  # detached: nothing else would ever stop them
                ray.kill(s.actor, no_restart=True)
            raise
        self.counts["started"] += n
        return slots

    def _worker_actor_names(self) -> list[str]:
        """Names of the live worker actors of this application (every router's, and orphans)."""
        prefix = f"{self.name_prefix}-"
        return [
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == WORKER_NAMESPACE and a["name"].startswith(prefix)
        ]

    def _adopt_orphans(self, n: int) -> list[_WorkerSlot]:
        """Lease up to ``n`` workers whose router is gone (model loaded: no reload), waiting up to ``lease_s`` for
        the leases of routers that have stopped renewing to lapse."""
        adopted: list[_WorkerSlot] = []
        tried: set[str] = set()
        give_up = time.monotonic() + self.lease_s + 1.0
        while len(adopted) < n:
            lapsing = False  # a worker whose router has stopped renewing: its lease lapses within lease_s
            for name in self._worker_actor_names():
                if name in tried or len(adopted) >= n:
                    continue
                try:
                    actor = ray.get_actor(name, namespace=WORKER_NAMESPACE)
                    lease = ray.get(actor.claim.remote(self.router_id, self.lease_s, self.model_key), timeout=10)
                except (ValueError, GetTimeoutError, *_WORKER_DIED):  # gone (or wedged) since it was listed
                    tried.add(name)
                    continue
                if lease["granted"]:
                    tried.add(name)
                    adopted.append(_WorkerSlot(next(self._ids), name, actor))
                    _log.info("router %s adopted worker %s (model already loaded)", self.router_id[:8], name)
                elif lease["same_model"] and lease["since_renewal_s"] > self.lease_s / 2:
                    lapsing = True
            if not lapsing or time.monotonic() > give_up:
                break
            time.sleep(0.1)
        self.counts["adopted"] += len(adopted)
        return adopted

    def _start_lease_keeper(self) -> None:
        # A thread, not a task on the event loop: leases must be renewed before the first request arrives and while
        # the loop is busy; it only reads self.workers and sets flags on slots.
        threading.Thread(target=self._keep_leases, name="subnetact-leases", daemon=True).start()

    def _keep_leases(self) -> None:
        """Renew this router's leases every ``lease_s / 4``; every ``4 * lease_s``, kill orphans past
        ``orphan_ttl_s``."""
        next_scan = time.monotonic() + 4 * self.lease_s
        while not self._stop_leases.wait(self.lease_s / 4):
            mine = [w for w in list(self.workers.values()) if not w.lost]
            refs = [(w, w.actor.claim.remote(self.router_id, self.lease_s, self.model_key)) for w in mine]
            for w, ref in refs:
                try:
                    granted = ray.get(ref, timeout=self.lease_s / 2)["granted"]
                except (GetTimeoutError, *_WORKER_DIED):
                    continue  # a dead worker is noticed by its next batch; a slow answer, by the next renewal
                if not granted:  # our lease lapsed (this router stalled) and another router adopted it
                    w.lost = w.retiring = True
                    self.counts["leases_lost"] += 1
                    _log.warning("router %s lost the lease of worker %s to another router", self.router_id[:8], w.name)
            if time.monotonic() >= next_scan:
                next_scan = time.monotonic() + 4 * self.lease_s
                self._kill_orphans({w.name for w in mine})

    def _kill_orphans(self, mine: set[str]) -> None:
        for name in self._worker_actor_names():
            if name in mine:
                continue
            try:
                actor = ray.get_actor(name, namespace=WORKER_NAMESPACE)
                if ray.get(actor.orphaned_for.remote(), timeout=self.lease_s) > self.orphan_ttl_s:
                    ray.kill(actor, no_restart=True)
                    self.counts["orphans_killed"] += 1
                    _log.warning("killed worker %s: no router has leased it for %g s", name, self.orphan_ttl_s)
            except (ValueError, GetTimeoutError, *_WORKER_DIED):
                continue

    async def scale(self, num_workers: int) -> list[str]:
        """Run ``num_workers`` workers in this router replica from now on; returns its live workers' names. Removed
        workers finish their batch first."""
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ConfigError(f"num_workers={num_workers!r} must be an int >= 0")
        live = self._live_workers()
        if num_workers > len(live):
            # Loading takes seconds: wait in a thread, then add the workers from the event loop (which owns the dict).
            new = await asyncio.get_running_loop().run_in_executor(None, self._start_workers, num_workers - len(live))
            for w in new:
                self.workers[w.wid] = w
        for w in sorted(live, key=lambda w: (w.busy, -w.wid))[: max(0, len(live) - num_workers)]:
            w.retiring = True
            if not w.busy:
                self._drop_worker(w, kill=True)
        self._kick()
        return self.worker_names()

    async def reconfigure(self, config: dict[str, Any]) -> None:
        """Serve's ``user_config`` hook, sent to every replica: ``{"num_workers": n}`` over all router replicas."""
        if "num_workers" in config:
            await self.scale(self._share(config["num_workers"]))

    def _live_workers(self) -> list[_WorkerSlot]:
        return [w for w in self.workers.values() if not w.retiring]

    def _drop_worker(self, w: _WorkerSlot, *, kill: bool) -> None:
        self.workers.pop(w.wid, None)
        if kill and not w.lost:
            ray.kill(w.actor, no_restart=True)
        if not self._live_workers():
            for e in self.queue.drain():
                self._complete(e[3], exc=NoWorkersError("no live worker is left"))

    def worker_names(self) -> list[str]:
        """Names of this router's live workers (named Ray actors)."""
        return [w.name for w in self._live_workers()]

    # ------------------------------------------------------------------ requests
    async def submit(self, payload: Any, deadline_wall: float) -> dict[str, Any]:
        """Queue one request with its wall-clock deadline (for callers holding a handle instead of using HTTP);
        returns the worker's answer or raises a :mod:`scheduling` error (``DeadlineMissedError``,
        ``QueueFullError``, ``NoWorkersError``, ``WorkerFailedError``) or the model's exception."""
        return await self.infer(payload, deadline_wall)

    async def infer(self, payload: Any, deadline_wall: float) -> dict[str, Any]:
        """The front end's backend call: see :meth:`submit`."""
        self._ensure_loop()
        self.counts["submitted"] += 1
        req = _Request(asyncio.get_running_loop().create_future(), payload)
        if self._closing:
            self._complete(req, exc=SchedulerClosedError("the router is shutting down"))
        elif not self._live_workers():
            self._complete(req, exc=NoWorkersError("no live worker; scale the router up"))
        elif len(self.queue) >= self.queue.capacity:
            self._complete(req, exc=QueueFullError(f"queue is full (max_queue={self.queue.capacity})"))
        else:
            now = time.monotonic()
            self.queue.push(wall_to_monotonic(deadline_wall), now, req)
            if self.policy.needs_arrivals:
                self.policy.observe_arrivals(now, 1)
            self._kick()
        return await req.future

    def queue_len(self) -> int:
        return len(self.queue)

    def ready(self) -> bool:
        return not self._closing and any(not w.retiring and not w.stuck for w in self.workers.values())

    def stuck_workers(self) -> int:
        """Workers whose batch ran past a request's deadline + grace and has not returned."""
        return sum(w.stuck for w in self.workers.values())

    def set_batch_observer(self, fn: Any) -> None:
        self._observe_batch = fn

    def fastest_latency_s(self) -> float:
        return self.policy.min_latency(1)

    async def close(self) -> None:
        """Stop accepting; serve (or drop, by deadline) what is queued; wait for the running batches (<= 60 s); then
        stop the workers (detached actors: they would outlive the router)."""
        self._closing = True
        limit = time.monotonic() + 60.0
        while (self.queue or self._tasks) and self._live_workers() and time.monotonic() < limit:
            self._kick()
            await asyncio.sleep(0.01)
        self._stop_leases.set()
        for w in list(self.workers.values()):
            self._drop_worker(w, kill=True)

    def _complete(self, req: _Request, result: Any = None, exc: BaseException | None = None) -> None:
        if req.future.done():  # the caller went away (cancelled); it was still counted once
            return
        self.counts["completed"] += 1
        if exc is not None:
            req.future.set_exception(exc)
        else:
            req.future.set_result(result)

    def stats(self) -> dict[str, Any]:
        """Counters (submitted, completed, batches, retried, worker_deaths, stuck, adopted, started, leases_lost,
        orphans_killed), queue length, live workers and which replica answered (``router_id``, ``rank``, ``pid``)."""
        return {
            **self.counts,
            "queue_len": len(self.queue),
            "workers": self.worker_names(),
            "router_id": self.router_id,
            "rank": self.rank,
            "pid": os.getpid(),
        }

    # ------------------------------------------------------------------ the dispatch loop
    def _ensure_loop(self) -> None:
        if self._loop_task is None:
            self._wake = asyncio.Event()
            self._loop_task = asyncio.get_running_loop().create_task(self._dispatch_loop())

    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _dispatch_loop(self) -> None:
        q, policy = self.queue, self.policy
        timeout = None
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            timeout = None
            while q:
                free = [w for w in self._live_workers() if not w.busy]
                if not free:
                    # Every worker is busy (or hung): the drop rule still runs when the head's time comes.
                    now = time.monotonic()
                    self._expire_queued(now)
                    if q:
                        timeout = max(q.peek_deadline() - policy.min_latency(len(q)) - now, WAKE_FLOOR_S)
                    break
                now = time.monotonic()
                w = free[0]
                policy.set_num_workers(sum(not v.retiring for v in self.workers.values()))  # load-aware policies
                scale = 1.0 if self.latency_model is None else self.latency_model.slack_scale(w.wid)
                step = dispatch_step(q, policy, now, scale)  # the same step as scheduling.Scheduler and simulate()
                for e in step.expired:
                    slack_ms = 1e3 * (e[0] - now)
                    self._complete(
                        e[3], exc=DeadlineMissedError(f"dropped: remaining slack {slack_ms:.3f} ms is too short")
                    )
                if step.decision is None:
                    if q:
                        timeout = step.wake_at - now
                    break
                w.busy = True
                self.counts["batches"] += 1
                if self._observe_batch is not None:
                    self._observe_batch(len(step.batch))
                task = asyncio.get_running_loop().create_task(self._run_batch(w, step.decision.subnet_id, step.batch))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    def _expire_queued(self, now: float) -> None:
        q = self.queue
        while q:  # the drop rule, as dispatch_step applies it (the threshold depends on the queue length)
            dropped = q.expire(now, self.policy.min_latency(len(q)))
            if not dropped:
                break
            for e in dropped:
                slack_ms = 1e3 * (e.deadline - now)
                self._complete(
                    e.item, exc=DeadlineMissedError(f"dropped: remaining slack {slack_ms:.3f} ms is too short")
                )

    def _reap_batch(self, w: _WorkerSlot, batch: list) -> None:
        """Answer the requests of ``w``'s running batch that are past deadline + grace; mark ``w`` stuck."""
        now = time.monotonic()
        grace = self.deadline_grace_s
        overdue = [e for e in batch if e.deadline + grace <= now and not e.item.future.done()]
        for e in overdue:
            self._complete(
                e.item,
                exc=DeadlineMissedError(
                    f"its batch was still running on a stuck worker {1e3 * (now - e.deadline):.1f} ms past its "
                    f"deadline (grace {grace:g} s)"
                ),
            )
        if overdue and not w.stuck:
            w.stuck = True
            self.counts["stuck"] += 1
            _log.warning("worker %s is stuck: its batch is past a request's deadline + %g s", w.name, grace)
        later = [e.deadline for e in batch if e.deadline + grace > now]
        if later:
            w.reaper = asyncio.get_running_loop().call_later(min(later) + grace - now, self._reap_batch, w, batch)

    async def _run_batch(self, w: _WorkerSlot, subnet_id: Any, batch: list) -> None:
        requests = [e[3] for e in batch]
        t_start = time.monotonic()
        loop = asyncio.get_running_loop()
        # Entries are earliest deadline first: the first request due for the reaper is batch[0].
        due = max(0.0, batch[0].deadline + self.deadline_grace_s - t_start)
        w.reaper = loop.call_later(due, self._reap_batch, w, batch)
        try:
            results = await w.actor.run.remote(subnet_id, [r.payload for r in requests])
        except _WORKER_DIED as exc:
            self.counts["worker_deaths"] += 1
            self._drop_worker(w, kill=False)
            self._retry_once(batch, exc)
        except Exception as exc:  # noqa: BLE001 - the model raised: fail this batch, the worker keeps serving
            for r in requests:
                self._complete(r, exc=RuntimeError(f"worker {w.name} failed: {type(exc).__name__}: {exc}"))
        else:
            t_done = time.monotonic()
            model = self.latency_model
            if model is not None and model.record(w.wid, subnet_id, len(requests), t_done - t_start, t_done):
                model.replan(self.policy, t_done)
            for r, res in zip(requests, results, strict=True):
                self._complete(r, res)
        finally:
            w.reaper.cancel()  # type: ignore[union-attr]
            if w.stuck:
                _log.warning("worker %s returned after being stuck; it serves again", w.name)
            w.busy = w.stuck = False
            if w.retiring and w.wid in self.workers:
                self._drop_worker(w, kill=True)
            self._kick()

    def _retry_once(self, batch: list, exc: BaseException) -> None:
        for deadline, _, arrival, req in batch:
            if req.future.done():  # answered already (deadline + grace passed while it ran)
                continue
            if req.attempts >= 1 or not self._live_workers():
                self._complete(req, exc=WorkerFailedError(f"the worker running this request died twice: {exc}"))
                continue
            req.attempts += 1
            self.counts["retried"] += 1
            self.queue.push(deadline, arrival, req)  # the drop rule decides whether it can still make it


def model_key(spec: ModelSpec, profile: Profile) -> str:
    """What a worker serves, as a digest: the spec's fields, the loaded profile and the checkpoint file's size and
    modification time (where the router can see it). Workers are adopted only by routers with the same key."""
    try:
        st = os.stat(spec.checkpoint)
        stamp: list[int] | None = [st.st_size, st.st_mtime_ns]
    except OSError:  # not visible from the router's node: the path alone
        stamp = None
    fields = [spec.checkpoint, spec.factory, list(spec.input_shape), spec.postprocess, spec.device, spec.threads]
    text = json.dumps([fields, stamp, profile.to_dict()], sort_keys=True, default=repr)  # same bytes in every process
    return hashlib.sha256(text.encode()).hexdigest()


def _check_seconds(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ConfigError(f"{name}={value!r} must be a number of seconds > 0")


def _replica_rank() -> tuple[int, int]:
    """(rank, number of replicas) of the Serve replica this runs in; (0, 1) outside one."""
    try:
        ctx = serve.get_replica_context()
    except Exception:  # noqa: BLE001 - not in a replica (a test constructing the class): one router
        return 0, 1
    rank = getattr(ctx.rank, "rank", ctx.rank)
    return int(rank), max(1, int(ctx.world_size))


def build_app(
    spec: ModelSpec,
    *,
    num_workers: int = 2,
    num_routers: int = 2,
    policy: str = "slackfit",
    max_queue: int = 1000,
    worker_options: dict[str, Any] | None = None,
    name_prefix: str = "subnetact-worker",
    app_options: dict[str, Any] | None = None,
    adaptive: bool = False,
    deadline_grace_s: float = 0.5,
    lease_s: float = 3.0,
) -> Any:
    """The bound Serve application (Ray's proxy -> ``num_routers`` router replicas -> their workers) for
    ``serve.run``; ``num_workers`` is the total over the routers (at least one each); the other arguments are
    :class:`Router`'s.

    Example::

        >>> ray.init(); serve.start(http_options={"host": "0.0.0.0", "port": 8000})
        >>> serve.run(build_app(digits_spec(), num_workers=2), name="subnetact", route_prefix="/")
        >>> serve.get_deployment_handle("Router", "subnetact").scale.remote(3)   # add a worker while serving
    """
    for name, value in (("num_routers", num_routers), ("num_workers", num_workers)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name}={value!r} must be an int >= 1")
    _check_seconds("lease_s", lease_s)
    if num_workers < num_routers:
        raise ConfigError(
            f"num_workers={num_workers!r} must be >= num_routers={num_routers!r}: a router without a worker "
            "would answer 503 to every request Ray's proxy sends it"
        )
    return Router.options(num_replicas=num_routers).bind(
        spec,
        policy=policy,
        num_workers=num_workers,
        max_queue=max_queue,
        worker_options=worker_options,
        name_prefix=name_prefix,
        app_options=app_options,
        adaptive=adaptive,
        deadline_grace_s=deadline_grace_s,
        lease_s=lease_s,
    )


def serve_batch_app(
    spec: ModelSpec,
    *,
    policy: str = "fixed:0",
    num_replicas: int = 1,
    max_batch_size: int = 16,
    batch_wait_timeout_s: float = 0.002,
    default_deadline_ms: float = 100.0,
) -> Any:
    """The baseline on the same engine: Ray's own ``@serve.batch`` forms batches; each batch runs through
    :func:`scheduling.plan_batch` with ``policy`` (``"fixed:<id>"``: Clipper+, one subnet; ``"slackfit"``: SlackFit on
    a framework batcher). The same HTTP front end (``POST /predict``...) runs in the model's replica.
    """

    @serve.deployment(num_replicas=num_replicas, max_ongoing_requests=1000, ray_actor_options={"num_cpus": 1})
    @serve.ingress()
    class BatchedModel:
        """Ingress and model in one replica, as Ray Serve's own examples do."""

        def __init__(self) -> None:
            self.runner = spec.build()
            self.profile = self.runner.profile
            self.policy = make_policy(policy, self.profile)
            self._observe_batch: Any = None
            self.front_end = ServingApp(self, input_shape=spec.input_shape, default_deadline_ms=default_deadline_ms)

        def __serve_build_asgi_app__(self) -> ServingApp:
            return self.front_end

        @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s)
        async def _batch(self, items: list[tuple[Any, float]]) -> list[Any]:
            answers: list[Any] = [None] * len(items)
            pending = list(range(len(items)))
            while pending:
                plan = plan_batch(self.policy, [wall_to_monotonic(items[i][1]) for i in pending], time.monotonic())
                for i in plan.drop:
                    answers[pending[i]] = DeadlineMissedError("dropped: the deadline can no longer be met")
                if plan.run:
                    if self._observe_batch is not None:
                        self._observe_batch(len(plan.run))
                    outs = self.runner(plan.subnet_id, [items[pending[i]][0] for i in plan.run])
                    for i, out in zip(plan.run, outs, strict=True):
                        answers[pending[i]] = out
                pending = [pending[i] for i in plan.defer]
            return answers

        async def infer(self, payload: Any, deadline_wall: float) -> dict[str, Any]:
            answer = await self._batch((payload, deadline_wall))
            if isinstance(answer, Exception):
                raise answer
            return answer

        def queue_len(self) -> int:
            return 0  # @serve.batch's queue is not visible

        def ready(self) -> bool:
            return True

        def set_batch_observer(self, fn: Any) -> None:
            self._observe_batch = fn

        async def close(self) -> None:
            """Ray Serve drains the replica's ongoing requests itself."""

    return BatchedModel.bind()


def app_builder(args: dict[str, Any]) -> Any:
    """Application builder for a Serve config file (``import_path: subnetact.serving.ray_serve:app_builder``).

    ``args``: ``checkpoint``, ``factory``, ``profile`` (JSON path), ``input_shape`` (list) and optionally
    ``postprocess``, ``device``, ``threads``, ``num_workers`` (default 2, over all routers), ``num_routers`` (default
    2), ``policy``, ``max_queue``, ``worker_options``, ``lease_s`` and ``app_options`` (keyword arguments of
    :class:`ServingApp`); or ``digits: true`` for the
    shipped digits supernet (its profile measured on the router's node unless ``profile`` is given).
    """
    args = dict(args)
    if args.pop("digits", False):
        from .digits import digits_spec

        spec = digits_spec(args.pop("profile", None), threads=args.pop("threads", None))
    else:
        spec = ModelSpec(
            checkpoint=args.pop("checkpoint"),
            factory=args.pop("factory"),
            profile=args.pop("profile"),
            input_shape=tuple(args.pop("input_shape")),
            postprocess=args.pop("postprocess", "argmax"),
            device=args.pop("device", "cpu"),
            threads=args.pop("threads", None),
        )
    return build_app(spec, **args)
