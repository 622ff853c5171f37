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

from scheduling import Policy, Profile, Scheduler, make_policy

__all__ = ["Backend", "LocalBackend", "make_policy", "wall_to_monotonic"]  # make_policy: scheduling.make_policy


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
        deadline_grace_s: The scheduler's ``deadline_grace_s``: a request still running on a worker this long past
            its deadline is answered ``DeadlineMissedError`` (HTTP 504) and the worker marked stuck. Default 0.5 s.
    """

    def __init__(
        self,
        runner: Callable[[Any, list[Any]], list[Any]],
        profile: Profile,
        *,
        policy: str | Policy = "slackfit",
        workers: int = 1,
        max_queue: int = 1000,
        deadline_grace_s: float = 0.5,
    ) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers={workers!r} must be an int >= 1")
        self.profile = profile
        self.runner = runner
        self._observe_batch: Callable[[int], None] | None = None
        self.scheduler = Scheduler(
            make_policy(policy, profile), [self._run] * workers, max_queue=max_queue, deadline_grace_s=deadline_grace_s
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

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, lambda: self.scheduler.close(drain=True))
