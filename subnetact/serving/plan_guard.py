"""Readiness from the plan: can any subnet meet the deadline budget? While none can, probe so that the plan recovers.

A profile measured while the machine was busy (or on another machine) can say that even the fastest subnet takes
longer than the deadline budget. The drop rule then answers 504 to every request before any of them runs, so no batch
is ever timed and the backend's :class:`scheduling.LatencyModel` never sees that the machine is fast again: the server
fails closed, while a readiness check that only looks at the workers says 200 (issue 20: a start-up profile of
108-1188 ms per batch, 504 for all 3,021 requests).

:class:`PlanGuard` closes that loop:

- :meth:`PlanGuard.check` compares the policy's fastest latency for a lone request (the drop rule's threshold) with
  the deadline budget; ``/readyz`` answers 503 with the reason while it is above **half** the budget. Half, because a
  request reaches the queue with a little less than its budget and may have to wait for the batch ahead of it: at a
  fastest latency just under the budget every request would still be dropped unserved, nothing would be timed, and
  the plan would never improve.
- :meth:`PlanGuard.run` (started by the app's lifespan) logs the plan once at start and on every re-plan that changes
  feasibility, and while the plan is infeasible on an adaptive backend sends **probes**: one request with an all-zero
  input and a deadline of twice the fastest planned latency, so a worker runs (and the latency model times) a real
  batch of a fast choice. Each probe on an idle machine halves the estimate at least (the latency model's step
  limit), so a plan 100x too slow is back within the budget after a handful; from then on ordinary traffic refines
  it. One probe is in flight at a time, and the next is sent no earlier than ``max(interval_s,
  4 x the time the last one took)``, so probing a machine that is really too slow costs at most a quarter of one
  worker, while a machine that is fast again gets a probe every ``interval_s``.

Probes are not ``/predict`` requests: the HTTP metrics do not count them (the scheduler's own metrics do).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["HEADROOM", "PlanGuard", "PlanStatus"]

HEADROOM = 2.0
"""The plan is feasible when the fastest planned latency fits this many times in the deadline budget."""

logger = logging.getLogger("subnetact.serving")


@dataclass(frozen=True)
class PlanStatus:
    """Whether the backend's plan can meet the deadline budget.

    Attributes:
        feasible: The fastest planned latency fits :data:`HEADROOM` times in the budget (or the backend does not say).
        fastest_s: The policy's fastest latency for a lone request, seconds (``nan`` when the backend does not say).
        budget_s: The deadline budget it is compared with, seconds.
        reason: Why the plan is infeasible (for ``/readyz``); ``None`` when feasible.
    """

    feasible: bool
    fastest_s: float
    budget_s: float
    reason: str | None = None


class PlanGuard:
    """Watches a backend's plan against a deadline budget and probes while no subnet can meet it.

    Args:
        backend: The app's backend. Backends with ``fastest_latency_s()`` are checked; those with a true ``adaptive``
            attribute are also probed (their latency model learns from the probe's batch).
        budget_s: The deadline budget every request should be servable within (the app's ``default_deadline_ms``).
        input_shape: One request's input shape (the probe's input is zeros of this shape, float32).
        interval_s: How often the plan is checked, and the shortest time between two probes (default 0.1 s).
    """

    def __init__(self, backend: Any, *, budget_s: float, input_shape: Sequence[int], interval_s: float = 0.1) -> None:
        if not (isinstance(interval_s, (int, float)) and math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"interval_s={interval_s!r} must be a number of seconds > 0")
        self.backend = backend
        self.budget_s = float(budget_s)
        self.interval_s = float(interval_s)
        self.probe_input = np.zeros(tuple(input_shape), np.float32)
        self.probes = 0  # probes sent
        self.changes = 0  # feasibility changes logged after the start
        self._last: bool | None = None

    def check(self) -> PlanStatus:
        """The plan's status now (cheap: one call to the policy's drop-rule threshold)."""
        fastest_fn = getattr(self.backend, "fastest_latency_s", None)
        fastest = fastest_fn() if fastest_fn is not None else math.nan
        if math.isnan(fastest) or HEADROOM * fastest <= self.budget_s:  # nan: the backend does not say
            return PlanStatus(True, fastest, self.budget_s)
        recovery = (
            "re-measuring with probes" if self.adaptive else "the backend does not re-measure (no latency model)"
        )
        reason = (
            f"no subnet can meet the {1e3 * self.budget_s:g} ms deadline budget: the fastest planned latency is "
            f"{1e3 * fastest:.1f} ms (ready at <= {1e3 * self.budget_s / HEADROOM:g} ms, time for one batch ahead); "
            f"{recovery}"
        )
        return PlanStatus(False, fastest, self.budget_s, reason)

    @property
    def adaptive(self) -> bool:
        """Whether the backend learns from probes (its ``adaptive`` attribute: a latency model is on)."""
        return bool(getattr(self.backend, "adaptive", False))

    def describe(self, status: PlanStatus) -> str:
        """One log line: what the backend plans with and whether it meets the budget."""
        policy = getattr(self.backend, "policy", None)
        profile = getattr(self.backend, "profile", None)
        what = f"{policy!r}" if policy is not None else type(self.backend).__name__
        if profile is not None:
            what += f" on {len(profile.subnets)} subnets x {len(profile.batch_sizes)} batch sizes"
        model = getattr(self.backend, "latency_model", None)
        if model is not None:
            what += f"; latency model on ({model.observed} batches timed, {model.rejected} rejected)"
        elif not self.adaptive:
            what += "; static profile"
        verdict = (
            "ready"
            if status.feasible
            else "NOT READY (/readyz 503)" + (", probing until it is" if self.adaptive else "")
        )
        if math.isnan(status.fastest_s):
            return f"plan: {what}; the backend does not report a planned latency: {verdict}"
        return (
            f"plan: {what}; fastest planned latency {1e3 * status.fastest_s:.2f} ms vs deadline budget "
            f"{1e3 * self.budget_s:g} ms (ready at <= 1/{HEADROOM:g} of it): {verdict}"
        )

    def snapshot(self) -> dict[str, Any]:
        """What the backend plans with now, as JSON-ready values (``GET /stats`` shows it under ``"plan"``).

        Keys: ``feasible``, ``fastest_planned_ms`` (``None`` when the backend does not say), ``budget_ms``,
        ``probes`` (sent so far); with a latency model also ``batches_timed``, ``batches_rejected``,
        ``worker_factors`` (per worker: how many times slower than the profile it runs now) and ``tail`` (the live
        98th-percentile ratio of a batch's time to its estimated mean, of the most spread-out worker); with a policy
        that measures the load, ``arrival_rate`` (requests/s, as the policy last measured it).
        """
        status = self.check()
        out: dict[str, Any] = {
            "feasible": status.feasible,
            "fastest_planned_ms": None if math.isnan(status.fastest_s) else round(1e3 * status.fastest_s, 3),
            "budget_ms": round(1e3 * self.budget_s, 3),
            "probes": self.probes,
        }
        model = getattr(self.backend, "latency_model", None)
        if model is not None:
            scheduler = getattr(self.backend, "scheduler", None)
            workers = scheduler.workers if scheduler is not None else []
            out["batches_timed"] = model.observed
            out["batches_rejected"] = model.rejected
            out["worker_factors"] = {str(w): round(model.worker_factor(w), 4) for w in workers}
            out["tail"] = round(model.tail(), 4)
        arrival_rate = getattr(getattr(self.backend, "policy", None), "arrival_rate", None)
        if arrival_rate is not None:
            out["arrival_rate"] = round(arrival_rate(time.monotonic()), 1)  # the scheduler's clock
        return out

    async def run(self) -> None:
        """Log the plan, then check it every ``interval_s`` until cancelled: log feasibility changes, probe while
        infeasible (adaptive backends only)."""
        next_probe = 0.0
        while True:
            status = self.check()
            if status.feasible != self._last:
                if self._last is not None:
                    self.changes += 1
                log = logger.info if status.feasible else logger.warning
                log(("re-" if self._last is not None else "") + self.describe(status))
                self._last = status.feasible
            now = time.monotonic()
            if not status.feasible and self.adaptive and now >= next_probe:
                await self._probe(status.fastest_s)
                took = time.monotonic() - now
                next_probe = now + took + max(self.interval_s, 4.0 * took)
            await asyncio.sleep(self.interval_s)

    async def _probe(self, fastest_s: float) -> None:
        self.probes += 1
        budget = 2.0 * fastest_s
        try:
            # A probe that waits past its budget (a stuck worker) must not stall the guard: give up a second later.
            await asyncio.wait_for(self.backend.infer(self.probe_input, time.time() + budget), budget + 1.0)
        except Exception as exc:  # noqa: BLE001 - any outcome is fine: what matters is the batch the model timed
            logger.debug("plan probe: %s: %s", type(exc).__name__, exc)
