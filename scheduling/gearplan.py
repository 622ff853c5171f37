"""GearPlan: a load-indexed baseline after CascadeServe (subnet chosen by the measured arrival rate).

CascadeServe plans offline a "gear" per range of load (QPS) and switches gears online from the arrival rate measured
over a fixed window, with queue-length hysteresis before moving to a lower-load gear. Here a gear is a subnet; within a
gear the batch is the largest that fits the slack (as :class:`~scheduling.policies.Fixed`). Unlike SlackFit, the
choice of subnet does not look at the slack at all, only at the measured rate.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence

from .errors import InvalidRequestError
from .policies import Decision, Fixed, Policy
from .profile import LatencyStat, Profile, SubnetId

__all__ = ["GearPlan"]


class GearPlan(Policy):
    """Subnet by measured QPS range, with queue-length hysteresis.

    Args:
        profile: The latency/accuracy profile.
        gears: ``(max_qps, subnet_id)`` pairs with strictly increasing ``max_qps``: a measured rate ``r`` selects the
            first gear with ``r < max_qps`` (the last gear above that). Typically the accuracy of the subnets falls as
            ``max_qps`` grows. See :meth:`from_profile` for an automatic plan.
        window_s: Length of the fixed window over which the arrival rate is measured (default 0.1 s, as CascadeServe).
        hysteresis_s: Moving to a lower-load gear is postponed while the queue holds more than
            ``hysteresis_s * rate`` requests, i.e. while the backlog exceeds ``hysteresis_s`` seconds of arrivals
            (CascadeServe keeps the gear while ``queue_len > alpha * qps``). Default 0.02 s; 0 disables it.
        latency_stat: ``"mean"`` or ``"p99"``. See :class:`~scheduling.policies.Policy`.
        queue_aware: See :class:`~scheduling.policies.Policy`.

    The policy is stateful (it measures the rate from :meth:`observe_arrivals`); call :meth:`reset` before reusing it.
    """

    needs_arrivals = True

    def __init__(
        self,
        profile: Profile,
        gears: Sequence[tuple[float, SubnetId]],
        *,
        window_s: float = 0.1,
        hysteresis_s: float = 0.02,
        latency_stat: LatencyStat = "mean",
        queue_aware: bool = True,
    ) -> None:
        super().__init__(profile, latency_stat=latency_stat, queue_aware=queue_aware)
        gears = list(gears)
        if not gears:
            raise InvalidRequestError(f"gears must be a non-empty list of (max_qps, subnet_id), got {gears!r}")
        uppers = []
        for i, g in enumerate(gears):
            if not isinstance(g, (tuple, list)) or len(g) != 2:
                raise InvalidRequestError(f"gears[{i}] must be a (max_qps, subnet_id) pair, got {g!r}")
            q = g[0]
            if isinstance(q, bool) or not isinstance(q, (int, float)) or math.isnan(q) or q <= 0:
                raise InvalidRequestError(f"gears[{i}] max_qps must be a number > 0 (inf allowed), got {q!r}")
            if uppers and q <= uppers[-1]:
                raise InvalidRequestError(f"gears max_qps must be strictly increasing, got {[x[0] for x in gears]!r}")
            uppers.append(float(q))
        for name, v in (("window_s", window_s), ("hysteresis_s", hysteresis_s)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise InvalidRequestError(f"{name} must be a finite number >= 0, got {v!r}")
        if window_s <= 0:
            raise InvalidRequestError(f"window_s must be > 0, got {window_s!r}")
        self.gears = [(float(q), sid) for q, sid in gears]
        self._uppers = uppers
        # One Fixed policy per gear gives the batch choice (and its drop threshold) for that gear's subnet.
        self._fixed = [Fixed(profile, sid, latency_stat=latency_stat, queue_aware=queue_aware) for _, sid in gears]
        self.window_s = float(window_s)
        self.hysteresis_s = float(hysteresis_s)
        self.reset()

    def _rebuild(self) -> None:
        # The gears (QPS ranges) stay as planned; each gear's batch choice follows the new latencies.
        for f in getattr(self, "_fixed", ()):
            f.update_profile(self.profile)

    @classmethod
    def from_profile(
        cls,
        profile: Profile,
        *,
        slo_s: float,
        num_workers: int,
        max_qps: float,
        num_gears: int = 8,
        utilization: float = 0.8,
        **kwargs: object,
    ) -> GearPlan:
        """Plan ``num_gears`` equal QPS ranges over ``[0, max_qps]`` (CascadeServe's plan shape).

        Each range gets the most accurate subnet whose capacity covers the range's upper end. A subnet's capacity is
        ``utilization * num_workers * max(b / latency(b))`` over batch sizes whose latency is at most ``slo_s / 2``
        (half the SLO is left for queueing). A range no subnet covers gets the highest-capacity subnet; the last gear
        extends to infinity.

        Args:
            profile: The latency/accuracy profile.
            slo_s: The requests' SLO in seconds.
            num_workers: Number of workers serving.
            max_qps: Upper end of the planned load range.
            num_gears: Number of equal QPS ranges.
            utilization: Target utilisation (< 1 leaves headroom for bursts).
            **kwargs: Passed to :class:`GearPlan` (``window_s``, ``hysteresis_s``, ``latency_stat``, ...).
        """
        for name, v in (("slo_s", slo_s), ("max_qps", max_qps), ("utilization", utilization)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise InvalidRequestError(f"{name} must be a finite number > 0, got {v!r}")
        for name, v in (("num_workers", num_workers), ("num_gears", num_gears)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidRequestError(f"{name} must be an int >= 1, got {v!r}")
        stat = kwargs.get("latency_stat", "mean")
        caps = []
        for s in profile.subnets:
            rates = [b / st.stat(stat) for b, st in s.latency.items() if st.stat(stat) <= slo_s / 2]  # type: ignore[arg-type]
            caps.append((utilization * num_workers * max(rates, default=0.0), s))
        step = max_qps / num_gears
        gears: list[tuple[float, SubnetId]] = []
        for g in range(num_gears):
            upper = (g + 1) * step
            ok = [(s.accuracy, cap, s.id) for cap, s in caps if cap >= upper]
            sid = max(ok)[2] if ok else max(caps, key=lambda x: x[0])[1].id
            gears.append((math.inf if g == num_gears - 1 else upper, sid))
        return cls(profile, gears, **kwargs)  # type: ignore[arg-type]

    # --------------------------------------------------------------- state
    def reset(self) -> None:
        self._window_start = 0.0
        self._count = 0
        self.rate = 0.0
        self._gear = 0

    def observe_arrivals(self, now: float, count: int = 1) -> None:
        if now - self._window_start >= self.window_s:
            self._roll(now)
        self._count += count

    def _roll(self, now: float) -> None:
        elapsed = now - self._window_start
        # A window with no observation at all in between means the last full window saw no arrival.
        self.rate = self._count / self.window_s if elapsed < 2 * self.window_s else 0.0
        self._window_start = now - (elapsed % self.window_s)
        self._count = 0

    @property
    def gear(self) -> int:
        """Index of the current gear."""
        return self._gear

    # --------------------------------------------------------------- decide
    def decide(self, slack_s: float, queue_len: int, now: float) -> Decision:
        self._check_args(slack_s, queue_len)
        if now - self._window_start >= self.window_s:
            self._roll(now)
        target = bisect_right(self._uppers, self.rate)
        if target >= len(self._uppers):
            target = len(self._uppers) - 1
        # Hysteresis: keep a higher-load gear while the backlog from a burst is still there.
        if target >= self._gear or queue_len <= self.hysteresis_s * self.rate:
            self._gear = target
        return self._fixed[self._gear].decide(slack_s, queue_len, now)

    def min_latency(self, queue_len: int) -> float:
        return self._fixed[self._gear].min_latency(queue_len)

    def __repr__(self) -> str:
        return f"GearPlan(gears={self.gears!r}, window_s={self.window_s}, hysteresis_s={self.hysteresis_s})"
