"""SlackFit (or any policy) for a batch a serving framework has already formed.

Ray Serve's ``@serve.batch``, Triton's dynamic batcher and LitServe collect requests into a batch themselves and then
call the model once. :func:`plan_batch` takes that batch's deadlines and answers what our scheduler would do with
them as its queue: which requests can no longer be served in time, which subnet to run, and how many of the
earliest-deadline requests to run on it now. It is :func:`~scheduling.dispatch_step` on a queue holding that batch,
so the decision is exactly the live scheduler's.

Example (inside a ``@serve.batch`` handler; each request carries its absolute ``time.monotonic()`` deadline)::

    pending = list(range(len(requests)))
    while pending:
        plan = plan_batch(policy, [requests[i].deadline for i in pending], time.monotonic())
        for i in plan.drop: answers[pending[i]] = "deadline missed"
        if plan.run:
            outputs = model(stack([requests[pending[i]].x for i in plan.run]), subnet=configs[plan.subnet_id])
            ...
        pending = [pending[i] for i in plan.defer]   # plan again: less slack now, maybe another subnet
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from .dispatch import dispatch_step
from .edf import EDFQueue
from .errors import InvalidRequestError
from .policies import Decision, Policy
from .profile import SubnetId

__all__ = ["BatchPlan", "plan_batch"]


class BatchPlan(NamedTuple):
    """What to do with a formed batch; every index of the batch is in exactly one of ``run``, ``drop``, ``defer``.

    Attributes:
        subnet_id: The subnet to run ``run`` on; ``None`` when nothing runs now.
        run: Indices (into the given deadlines) to run now, earliest deadline first.
        drop: Indices whose deadline can no longer be met even by the fastest subnet (answer them as missed).
        defer: The other indices, earliest deadline first: plan them again once ``run`` is done (or put them back in
            the framework's queue).
        decision: The policy's :class:`~scheduling.Decision` (latency, accuracy, ``fits``), ``None`` when nothing
            runs.
    """

    subnet_id: SubnetId | None
    run: list[int]
    drop: list[int]
    defer: list[int]
    decision: Decision | None


def plan_batch(policy: Policy, deadlines: Sequence[float], now: float, *, drop_late: bool = True) -> BatchPlan:
    """Plan a formed batch with ``policy``, exactly as the live scheduler's dispatch step would.

    Args:
        policy: Any :class:`~scheduling.Policy` (policies with ``needs_arrivals`` must be fed
            :meth:`~scheduling.Policy.observe_arrivals` by the caller as requests arrive).
        deadlines: Each request's absolute deadline, on the same clock as ``now``.
        now: The current time.
        drop_late: Apply the drop rule (default), as :class:`~scheduling.Scheduler` does.

    Returns:
        A :class:`BatchPlan`.

    Raises:
        InvalidRequestError: a deadline is not a finite number; nothing is planned.

    Example::

        >>> from scheduling import Fixed, datasets, plan_batch
        >>> profile = datasets.superserve_a40_profile()
        >>> plan = plan_batch(Fixed(profile, profile.ids[0]), [0.030, 0.050, 0.001], now=0.0)
        >>> plan.run, plan.drop, plan.defer
        ([0, 1], [2], [])
    """
    if not isinstance(policy, Policy):
        raise InvalidRequestError(f"policy must be a scheduling Policy, got {type(policy).__name__}")
    for i, d in enumerate(deadlines):
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d):
            raise InvalidRequestError(f"deadlines[{i}]={d!r} must be a finite time on the clock of now")
    q = EDFQueue(drop_late=drop_late)
    for i, d in enumerate(deadlines):
        q.push(float(d), now, i)
    step = dispatch_step(q, policy, now)
    run = [e.item for e in step.batch]
    return BatchPlan(
        step.decision.subnet_id if run else None,
        run,
        [e.item for e in step.expired],
        [e.item for e in q.drain()],
        step.decision if run else None,
    )
