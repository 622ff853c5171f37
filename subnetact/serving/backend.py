"""What the HTTP front end talks to: a backend that queues a request until its deadline and returns its answer.

:class:`LocalBackend` runs an in-process :class:`scheduling.Scheduler` with worker threads calling a
:class:`~subnetact.serving.runner.SupernetRunner`. The Ray backend (:mod:`subnetact.serving.ray_serve`) sends the same
requests to a router actor instead. Both take the deadline as a wall-clock time (``time.time()``), which is
comparable across processes and hosts, and turn it into their own ``time.monotonic()`` deadline on arrival.

A backend raises the :mod:`scheduling` errors for requests it could not serve (``DeadlineMissedError``,
``QueueFullError``, ``NoWorkersError``, ``SchedulerClosedError``, ``WorkerFailedError``); the front end maps them to
HTTP statuses.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

from scheduling import LatencyModel, Policy, Profile, Scheduler, make_policy

__all__ = [
    "PROFILE_ERROR_LIMIT",
    "Backend",
    "LocalBackend",
    "make_policy",
    "wall_to_monotonic",
]  # scheduling.make_policy

PROFILE_ERROR_LIMIT = 1000.0
"""The server's latency model accepts batch timings up to this factor away from the profile (``max_ratio``).

``LatencyModel``'s default (20) guards a simulator against absurd timings; a server must also correct a profile that
was measured on a busy machine: with two torch threads on a 2-core machine running other jobs, the digits profile came
out 30-380x too slow (issue 20), and samples rejected as out of range would have left it so forever. A timing the
worker really took is never absurd, and one sample still moves the estimate by at most 2x (``clip``)."""


def wall_to_monotonic(deadline_wall: float) -> float:
    """A ``time.time()`` deadline as a ``time.monotonic()`` deadline of this process."""
    return time.monotonic() + (deadline_wall - time.time())


class Backend(Protocol):
    """The interface the front end needs."""

    profile: Profile

    async def infer(self, payload: Any, deadline_wall: float) -> dict[str, Any]:
        """The runner's answer for ``payload``, or a :mod:`scheduling` error."""

    def queue_len(self) -> int:
        """Requests waiting."""

    def ready(self) -> bool:
        """Whether a request sent now could be served (a live worker that is not stuck, not closing)."""

    def fastest_latency_s(self) -> float:
        """The fastest latency the policy can serve a lone request with now (its drop-rule threshold), seconds.
        Optional: a backend without it is never found infeasible by :class:`~subnetact.serving.PlanGuard`."""

    def set_batch_observer(self, fn: Callable[[int], None]) -> None:
        """Call ``fn(batch_size)`` for every batch run from now on."""

    async def close(self) -> None:
        """Serve what is queued, then stop."""


class LocalBackend:
    """An in-process :class:`scheduling.Scheduler` with ``workers`` threads running ``runner``.

    Args:
        runner: ``runner(subnet_id, payloads) -> answers``, e.g. a :class:`~subnetact.serving.SupernetRunner`.
        profile: The profile the policy decides from.
        policy: A :class:`scheduling.Policy` or a name for :func:`make_policy`. Default ``"slackfit"``.
        workers: Worker threads (one batch at a time each). Default 1.
        max_queue: Queue capacity; beyond it requests fail with ``QueueFullError`` (HTTP 429). Default 1000.
        latency_model: ``True`` (default): correct the profile online from every batch's measured service time with
            a :class:`scheduling.LatencyModel` accepting timings up to :data:`PROFILE_ERROR_LIMIT` away from the
            profile, so a profile measured on a busy machine (or another one) converges to this machine's speed
            within a few batches. A ``LatencyModel`` built on ``profile`` uses that one; ``False``: the static
            profile.
        latency_stat: ``"mean"`` or ``"p99"``: what a policy given by name plans with (with the latency model on, the
            p99 includes the live spread of the batch times it measures). Default ``None``: the policy's own (p99 for
            the default SlackFit, the mean for the baselines).
        deadline_grace_s: The scheduler's ``deadline_grace_s``: a request still running on a worker this long past
            its deadline is answered ``DeadlineMissedError`` (HTTP 504) and the worker marked stuck. Default 0.5 s.

    ``adaptive`` says whether a latency model is on; :class:`~subnetact.serving.PlanGuard` then probes while the plan
    is infeasible.
    """

    def __init__(
        self,
        runner: Callable[[Any, list[Any]], list[Any]],
        profile: Profile,
        *,
        policy: str | Policy = "slackfit",
        workers: int = 1,
        max_queue: int = 1000,
        latency_model: LatencyModel | bool = True,
        latency_stat: str | None = None,
        deadline_grace_s: float = 0.5,
    ) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers={workers!r} must be an int >= 1")
        if latency_model is True:
            latency_model = LatencyModel(profile, max_ratio=PROFILE_ERROR_LIMIT)
        elif latency_model is False:
            latency_model = None
        elif not isinstance(latency_model, LatencyModel):
            raise ValueError(f"latency_model={latency_model!r} must be True, False or a scheduling.LatencyModel")
        self.profile = profile
        self.runner = runner
        self._observe_batch: Callable[[int], None] | None = None
        self.policy = make_policy(policy, profile, **({} if latency_stat is None else {"latency_stat": latency_stat}))
        self.latency_model = latency_model
        self.adaptive = latency_model is not None
        self.scheduler = Scheduler(
            self.policy,
            [self._run] * workers,
            max_queue=max_queue,
            latency_model=latency_model,
            deadline_grace_s=deadline_grace_s,
        )

    def _run(self, subnet_id: Any, payloads: list[Any]) -> list[Any]:
        if self._observe_batch is not None:
            self._observe_batch(len(payloads))
        return self.runner(subnet_id, payloads)

    def set_batch_observer(self, fn: Callable[[int], None]) -> None:
        self._observe_batch = fn

    async def infer(self, payload: Any, deadline_wall: float) -> dict[str, Any]:
        return await self.scheduler.submit_async(payload, deadline=wall_to_monotonic(deadline_wall))

    def queue_len(self) -> int:
        return self.scheduler.queue_len

    def ready(self) -> bool:
        return bool(self.scheduler.healthy_workers)

    def stuck_workers(self) -> int:
        """Workers marked stuck by the scheduler (their batch ran past a deadline + grace)."""
        return len(self.scheduler.stuck_workers)

    def fastest_latency_s(self) -> float:
        # Read without the scheduler's lock: a concurrent re-plan replaces the policy's tables whole, so this sees
        # the old plan or the new one.
        return self.policy.min_latency(1)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, lambda: self.scheduler.close(drain=True))
