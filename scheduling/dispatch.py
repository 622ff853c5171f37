"""The one dispatch step: drop rule, policy decision, batch pop. Shared by every place that schedules.

The live :class:`~scheduling.Scheduler` (worker threads), the discrete-event :func:`~scheduling.simulate`, the Ray
router of ``subnetact.serving`` and :func:`~scheduling.batcher.plan_batch` (framework batchers) all call
:func:`dispatch_step` whenever a worker is free and the queue is not empty, so they apply the same rule with the same
constants.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from .edf import EDFQueue, Entry
from .policies import Decision, Policy

__all__ = ["WAKE_FLOOR_S", "Step", "dispatch_step"]

WAKE_FLOOR_S = 1e-6
"""When the policy waits, the next look is at least this far in the future (no busy loop at equal times)."""


class Step(NamedTuple):
    """What one dispatch step did.

    Attributes:
        expired: Entries the drop rule removed (their slack was below the policy's fastest latency), earliest
            deadline first. The caller completes them as missed.
        decision: The policy's decision, or ``None`` when the queue was empty after the drop rule or the policy
            chose to wait.
        batch: The entries popped for ``decision`` (earliest deadlines, ``decision.batch_size`` of them); empty when
            ``decision`` is ``None``.
        queue_len: The queue length the policy decided on (0 when it was not asked).
        wake_at: When the policy waits: the time (on ``now``'s clock) to look again, i.e. when the head request
            would have to be dropped; ``inf`` otherwise.
    """

    expired: Sequence[Entry]
    decision: Decision | None
    batch: Sequence[Entry]
    queue_len: int
    wake_at: float


def dispatch_step(queue: EDFQueue, policy: Policy, now: float, slack_scale: float = 1.0) -> Step:
    """Apply the drop rule to ``queue``, ask ``policy`` what to run, and pop that batch.

    Args:
        queue: The EDF queue (its ``drop_late`` switches the drop rule).
        policy: Decides from the head's slack ``deadline - now`` and the queue length.
        now: The current time on the clock the deadlines use.
        slack_scale: Multiplies the slack the policy decides with (default 1): a worker that a
            :class:`~scheduling.LatencyModel` finds ``f`` times slower than the policy's (refreshed) profile passes
            ``1 / f``, so a choice fits exactly when it would on that worker. The drop rule is not scaled: it drops
            only what even the profile's fastest choice could not serve.

    Returns:
        A :class:`Step`. The queue has lost exactly ``expired`` and ``batch``; if the policy raises, the queue has
        lost nothing.

    Example::

        >>> from scheduling import EDFQueue, SlackFit, datasets, dispatch_step
        >>> q = EDFQueue(); q.push(deadline=1.0, arrival=0.0, item="a"); q.push(deadline=0.0001, arrival=0.0, item="b")
        >>> step = dispatch_step(q, SlackFit(datasets.superserve_a40_profile()), now=0.0)
        >>> [e.item for e in step.expired], [e.item for e in step.batch], len(q)
        (['b'], ['a'], 0)
    """
    expired: list[Entry] = _NONE  # type: ignore[assignment]  # shared and never mutated: a list only once one drops
    try:
        if queue.drop_late:
            min_latency = policy.min_latency
            # The threshold depends on the queue length, which the drops change: repeat until nothing more drops.
            while queue:
                dropped = queue.expire(now, min_latency(len(queue)))
                if not dropped:
                    break
                expired = expired + dropped if expired else dropped
        if not queue:
            return _step(Step, (expired, None, _NONE, 0, _INF))
        qlen = len(queue)
        head = queue.peek_deadline()
        d = policy.decide((head - now) * slack_scale, qlen, now)
    except BaseException:
        # A policy that raises must not lose requests: the queue is left as it was and the caller sees the error.
        if expired:
            queue.restore(expired)
        raise
    if d is None:
        return _step(Step, (expired, None, _NONE, qlen, max(head - policy.min_latency(qlen), now + WAKE_FLOOR_S)))
    return _step(Step, (expired, d, queue.pop_batch(d.batch_size), qlen, _INF))


# This runs once per batch in the simulator's inner loop: build the result through tuple.__new__ (what
# NamedTuple._make does, minus the Python-level __new__) and share one empty tuple for "nothing".
_step = tuple.__new__
_NONE: tuple = ()
_INF = math.inf
