"""Online latency estimates from measured service times, so a policy re-plans when the machine changes under it.

A policy plans with a :class:`~scheduling.Profile` measured offline. When a co-located job, another tenant or a thermal
limit slows a worker down, that profile is wrong and a policy that fits choices tightly into the slack (SlackFit)
misses deadlines (issue 12). :class:`LatencyModel` corrects the profile online from each batch's measured service time.

The model is multiplicative, in log space::

    log latency(subnet, batch, worker) = log prior(subnet, batch) + entry[subnet, batch] + worker_factor[worker]

- ``worker_factor`` is a time-based EWMA (half-life ``halflife_s``) of each worker's log ratio measured / expected: it
  follows a slowdown or a recovery within a few half-lives of traffic and scales *every* entry of that worker,
  including entries never measured.
- ``entry`` is a per-(subnet, batch size) offset learned 20x more slowly (half-life ``entry_halflife_s``) from what the
  worker factor does not explain: a profile that is wrong for one entry only. The split between the two is not
  identifiable from one worker's samples (a worker that only ever runs one entry could be slow, or that entry could
  be mis-profiled), so the offsets also shrink slowly towards 0: an offset survives only while the data keep asking
  for it, and a common slowdown ends up in the worker factor, which also scales the entries never measured.
- ``tail`` is each worker's live spread: an online estimate of the 98th percentile of the log ratio measured /
  estimated — over a worker's first 32 batches the empirical quantile minus the median (its spread, whatever its
  speed), then a stochastic quantile (step ``tail_step``) that follows changes. The published **p99** of an entry is
  the larger of the prior's p99 (scaled like the mean) and the estimated mean times ``exp(tail)`` of the most
  spread-out worker. This matters on
  a shared CPU: a descheduled thread (CPU steal) makes a few batches take several times longer while most run at
  profiled speed. The median, and so the worker factor, barely moves, but a policy planning with p99 must see the
  tail or it plans batches that finish late (reproduced in the simulator with an intermittent
  :class:`~scheduling.Interference`). Policies planning with the mean are unaffected.
- ``shock`` is each worker's largest recent surprise, decaying with half-life ``shock_halflife_s``; the published
  spread is the larger of it and the tail. The stochastic tail is robust to one outlier by design, so after a sudden
  slowdown it takes tens of batches to open the margin, and every batch planned meanwhile fills the slack at the old
  speed and misses. The shock opens it with the first slow batch, and a margin that grows re-plans at once (only the
  50x-cost limit applies, not ``refresh_s``): issue 20 measured 2-3x fewer misses at the start of a 1.5x slowdown and
  of intermittent 2x interference.
- Each update moves the state by at most ``clip`` in log space and by at most half the way to the new sample, so one
  outlier cannot swing the plan; timings that are not finite, not positive, or more than ``max_ratio`` away from the
  profile are ignored and counted in :attr:`LatencyModel.rejected`.

A policy sees the estimates through the same interface as the static profile: :meth:`LatencyModel.refresh` returns a
:class:`~scheduling.Profile` (same subnets, accuracies, batch sizes) built with the factor of the *fastest* worker, and
:meth:`~scheduling.Policy.update_profile` rebuilds the policy's tables from it. Slower workers plan with their own
factor by scaling the slack they decide with (:meth:`LatencyModel.slack_scale`): a choice whose latency is ``L`` in the
table takes ``L * f`` on a worker ``f`` times slower, and ``L * f <= slack`` exactly when ``L <= slack / f``. So
``decide()`` costs the same as with a static profile, and the drop rule (the table's fastest latency) drops a request
only when even the fastest worker could not serve it in time.

The published estimates keep P1 (latency grows with batch size) and P2 (latency grows with subnet cost, i.e. the
prior's latency order at each batch size) wherever the prior profile has them; where the prior itself violates P1
(e.g. the A40 profile's subnet 0 at batch 2 vs 4) the estimates may violate it by no more than the prior does.

The :class:`~scheduling.Scheduler` and :func:`~scheduling.simulate` drive a model passed as ``latency_model=``; with
none (the default) policies plan with the static profile, as before.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Hashable
from typing import TYPE_CHECKING

from .errors import InvalidProfileError, InvalidRequestError
from .profile import LatencyStats, Profile, Subnet, SubnetId

if TYPE_CHECKING:
    from .policies import Policy

__all__ = ["LatencyModel"]


_TAIL_WARMUP = 32
"""Samples per worker during which the tail is the empirical quantile of the surprises seen so far (then the
stochastic update takes over from there): a stochastic quantile moving by ``tail_step`` needs hundreds of batches to
reach a tail of 2x, and every batch planned meanwhile at too small a margin can miss (issue 20: the first two seconds
of intermittent interference)."""


class _WorkerState:
    """One worker's estimates, all in log space."""

    __slots__ = ("factor", "last_t", "shock", "tail", "warmup")

    def __init__(self, factor: float, now: float) -> None:
        self.factor = factor  # log slowdown vs the prior
        self.last_t = now  # time of its last sample
        self.tail = 0.0  # log of the tail_quantile of measured / estimated (>= 0)
        self.shock = 0.0  # log of the largest recent surprise, decayed to last_t (>= 0)
        self.warmup: list[float] | None = []  # the first _TAIL_WARMUP surprises, then None

    def margin(self, now: float, tau: float) -> float:
        """The log planning margin at ``now``: the tail, or the recent shock if larger."""
        dt = now - self.last_t
        shock = self.shock * math.exp(-dt / tau) if dt > 0.0 else self.shock
        return shock if shock > self.tail else self.tail


def _positive(name: str, value: object, *, upper: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < upper:
        allowed = "a finite number > 0" if upper == math.inf else f"a number in (0, {upper})"
        raise InvalidRequestError(f"{name} must be {allowed}, got {value!r}")
    return float(value)


class LatencyModel:
    """Per-worker, per-(subnet, batch size) latency estimates fed by measured service times.

    Not thread-safe by itself: the live :class:`~scheduling.Scheduler` calls it under its lock.

    Args:
        profile: The prior: the offline profile the policy was built with. Unmeasured entries keep its shape.
        halflife_s: Half-life, in seconds of traffic, of a worker's slowdown factor (default 0.1 s): after a step
            change in speed, a busy worker's factor is within 3 % of the new value after ~0.5 s.
        entry_halflife_s: Half-life, in seconds of the measuring worker's traffic, of an entry's own offset
            (default 2 s). It must be well above ``halflife_s``: the offset picks up about
            ``halflife_s / entry_halflife_s`` of every step change while the worker factor catches up.
        refresh_s: Minimum time between two re-plans (default 0.05 s); a re-plan also waits until the estimates
            have moved by more than ``tolerance``. :meth:`replan` also stretches the interval to 50x the time the last
            re-plan took, so a large profile never spends more than ~2 % of the time rebuilding tables.
        tolerance: Relative change of an estimate that triggers a re-plan (default 0.02, i.e. 2 %).
        max_ratio: Timings more than this factor above or below the profile are ignored as absurd (default 20).
        clip: Largest change, in log space, that one sample may cause (default ``log(2)``).
        tail_quantile: Quantile of the live spread that sets the published p99 (default 0.98).
        shock_halflife_s: Half-life of a worker's largest recent surprise, which the published spread never falls
            below (default 0.5 s): long enough to cover the batches until the worker factor has caught up with a
            persistent slowdown, short enough that one outlier stops costing accuracy within a second or two.
        tail_step: Step of the tail's stochastic-quantile update, in log space (default 0.05): a sample above the
            estimate raises it by ``tail_step * tail_quantile``, one below lowers it by ``tail_step * (1 -
            tail_quantile)``, so it rises within tens of slow samples and decays over hundreds of normal ones.

    Example::

        >>> from scheduling import LatencyModel, SlackFit, datasets
        >>> profile = datasets.superserve_a40_profile()
        >>> policy, model = SlackFit(profile), LatencyModel(profile)
        >>> for i in range(100):                         # worker 0 now runs everything 1.5x slower than profiled
        ...     t = 0.01 * i
        ...     if model.record(0, 5, 8, 1.5 * profile.latency(5, 8), now=t):
        ...         model.replan(policy, t)                # policy.update_profile(model.refresh(t))
        >>> round(model.estimate(5, 32, worker=0) / profile.latency(5, 32), 1)   # an entry never measured
        1.5
        >>> model.record(0, 5, 8, float("nan"), now=t), model.rejected
        (False, 1)
    """

    def __init__(
        self,
        profile: Profile,
        *,
        halflife_s: float = 0.1,
        entry_halflife_s: float = 2.0,
        refresh_s: float = 0.05,
        tolerance: float = 0.02,
        max_ratio: float = 20.0,
        clip: float = math.log(2.0),
        tail_quantile: float = 0.98,
        tail_step: float = 0.05,
        shock_halflife_s: float = 0.5,
    ) -> None:
        if not isinstance(profile, Profile):
            raise InvalidProfileError(f"profile must be a scheduling.Profile, got {type(profile).__name__}")
        self.prior = profile
        self.halflife_s = _positive("halflife_s", halflife_s)
        self.entry_halflife_s = _positive("entry_halflife_s", entry_halflife_s)
        refresh = refresh_s
        if isinstance(refresh, bool) or not isinstance(refresh, (int, float)) or not 0 <= refresh < math.inf:
            raise InvalidRequestError(f"refresh_s must be a finite number >= 0, got {refresh_s!r}")
        self.refresh_s = float(refresh)
        self.tolerance = _positive("tolerance", tolerance)
        self.max_ratio = _positive("max_ratio", max_ratio)
        if self.max_ratio <= 1.0:
            raise InvalidRequestError(f"max_ratio must be > 1, got {max_ratio!r}")
        self.clip = _positive("clip", clip)
        self.tail_quantile = _positive("tail_quantile", tail_quantile, upper=1.0)
        self.tail_step = _positive("tail_step", tail_step)
        self._tau = self.halflife_s / math.log(2.0)
        self.shock_halflife_s = _positive("shock_halflife_s", shock_halflife_s)
        self._shock_tau = self.shock_halflife_s / math.log(2.0)
        self._entry_rate = self.halflife_s / self.entry_halflife_s  # entry step = worker step * this
        # Per subnet: sorted profiled batch sizes and their mean latencies, for interpolating partial batches.
        self._sizes = {s.id: list(s.latency) for s in profile.subnets}
        self._means = {s.id: [st.mean_s for st in s.latency.values()] for s in profile.subnets}
        # Monotone fix-up orders, fixed by the prior: at each batch size, subnets by increasing prior latency (P2).
        self._p2_order = {
            b: sorted((s for s in profile.subnets if b in s.latency), key=lambda s: (s.latency[b].mean_s, s.accuracy))
            for b in profile.batch_sizes
        }
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget everything measured: estimates go back to the prior profile and counters to zero."""
        self._entry: dict[tuple[SubnetId, int], float] = {}
        self._worker: dict[Hashable, _WorkerState] = {}
        self._published_tail = 0.0
        self._published_entry: dict[tuple[SubnetId, int], float] = {}
        self._published_base = 0.0
        self._scale: dict[Hashable, float] = {}
        self._next_refresh = -math.inf
        self._next_urgent = -math.inf  # an urgent re-plan still waits out 50x the last re-plan's cost
        self._dirty = False
        self.observed = 0
        self.rejected = 0
        self.rejections: Counter[str] = Counter()
        self.refreshes = 0

    def _reject(self, reason: str) -> bool:
        self.rejected += 1
        self.rejections[reason] += 1
        return False

    def _expected(self, subnet_id: SubnetId, batch_size: int) -> float:
        """Prior mean latency of ``batch_size`` requests: exact at profiled sizes, linear in between, and the smallest
        (largest) profiled size's latency below (above) the profiled range."""
        sizes, means = self._sizes[subnet_id], self._means[subnet_id]
        i = bisect_left(sizes, batch_size)
        if i < len(sizes) and sizes[i] == batch_size:
            return means[i]
        if i == 0:
            return means[0]
        if i == len(sizes):
            return means[-1] * batch_size / sizes[-1]
        b0, b1, m0, m1 = sizes[i - 1], sizes[i], means[i - 1], means[i]
        return m0 + (m1 - m0) * (batch_size - b0) / (b1 - b0)

    # ------------------------------------------------------------------ feeding
    def record(self, worker: Hashable, subnet_id: SubnetId, batch_size: int, service_s: float, now: float) -> bool:
        """Feed one batch's measured service time.

        Args:
            worker: Which worker ran it (any hashable id; the scheduler's worker id, the simulator's worker index).
            subnet_id: The subnet it ran.
            batch_size: How many requests it held (need not be a profiled size: it is interpolated).
            service_s: Measured time from the start of the batch to its results, in seconds.
            now: Current time in seconds, on the clock the scheduler uses.

        Returns:
            ``True`` when the estimates have moved by more than ``tolerance`` and the re-plan interval has passed: the
            caller should then run :meth:`replan`. A rejected sample returns ``False`` and leaves every estimate
            unchanged.
        """
        if subnet_id not in self._sizes:
            return self._reject("unknown_subnet")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            return self._reject("bad_batch_size")
        if isinstance(service_s, bool) or not isinstance(service_s, (int, float)) or not math.isfinite(service_s):
            return self._reject("not_finite")
        if service_s <= 0.0:
            return self._reject("not_positive")
        if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
            return self._reject("bad_time")
        ratio = service_s / self._expected(subnet_id, batch_size)
        if not 1.0 / self.max_ratio <= ratio <= self.max_ratio:
            return self._reject("out_of_range")
        self.observed += 1
        r = math.log(ratio)
        key = (subnet_id, batch_size)
        profiled = self._is_profiled(key)
        d = self._entry.get(key, 0.0) if profiled else 0.0
        clip = self.clip

        # Worker factor: time-based EWMA (at most half-way per sample), clipped step.
        state = self._worker.get(worker)
        if state is None:
            # A new worker starts from the fastest known worker's factor (the table's base), not from the prior.
            state = self._worker[worker] = _WorkerState(self._published_base, now)
            alpha = 0.5
        else:
            dt = now - state.last_t
            alpha = min(0.5, -math.expm1(-max(dt, 0.0) / self._tau))
            if dt > 0.0:
                state.shock *= math.exp(-dt / self._shock_tau)
            state.last_t = max(state.last_t, now)
        # Tail: stochastic quantile of this sample's surprise (log measured / estimated, before the update), >= 0 (the
        # prior's own spread is kept anyway); it moves by a fixed step, so one outlier shifts it by tail_step at most.
        surprise = r - d - state.factor
        warm = state.warmup
        if warm is not None:
            # Spread around the worker's own median, so that a worker that is uniformly slower (which its factor is
            # still catching up with) does not look spread out.
            warm.append(r - d)
            ranked = sorted(warm)
            n = len(ranked)
            state.tail = max(0.0, ranked[min(n - 1, int(self.tail_quantile * n))] - ranked[n // 2])
            if len(warm) >= _TAIL_WARMUP:
                state.warmup = None
        elif surprise > state.tail:
            state.tail += self.tail_step * self.tail_quantile
        elif state.tail > 0.0:
            state.tail = max(0.0, state.tail - self.tail_step * (1.0 - self.tail_quantile))
        if surprise > state.shock:
            state.shock = surprise
        step = alpha * (r - d - state.factor)
        state.factor += clip if step > clip else -clip if step < -clip else step
        self._scale.pop(worker, None)

        # Entry offset: what the worker factor does not explain, learned slowly and shrunk slowly towards 0 (see the
        # module docstring); at rest it keeps 95 % of a persistent deviation.
        if profiled:
            beta = alpha * self._entry_rate
            step = beta * (r - state.factor - d) - 0.05 * beta * d
            d += clip if step > clip else -clip if step < -clip else step
            self._entry[key] = d
            if abs(d - self._published_entry.get(key, 0.0)) > self.tolerance:
                self._dirty = True

        base = min(s.factor for s in self._worker.values())
        margin = max(s.margin(now, self._shock_tau) for s in self._worker.values())
        if abs(base - self._published_base) > self.tolerance or abs(margin - self._published_tail) > self.tolerance:
            self._dirty = True
        # A margin that grew is urgent: every batch planned before the re-plan is planned too tight and may miss, so
        # the rate limit (which bounds the cost of re-planning for small moves) does not hold it back.
        if not self._dirty:
            return False
        urgent = margin > self._published_tail + self.tolerance and now >= self._next_urgent
        return urgent or now >= self._next_refresh

    def _is_profiled(self, key: tuple[SubnetId, int]) -> bool:
        sizes = self._sizes[key[0]]
        i = bisect_left(sizes, key[1])
        return i < len(sizes) and sizes[i] == key[1]

    # ------------------------------------------------------------------ reading
    def worker_factor(self, worker: Hashable) -> float:
        """How much slower than the prior ``worker`` currently runs (1.0 for a worker never measured)."""
        state = self._worker.get(worker)
        return math.exp(state.factor) if state is not None else 1.0

    def tail(self, worker: Hashable | None = None) -> float:
        """Live spread of ``worker`` (``None``: the most spread-out worker): the estimated 98th-percentile ratio of a
        batch's service time to its estimated mean (>= 1; 1.0 for a worker never measured)."""
        if worker is None:
            return math.exp(max((s.tail for s in self._worker.values()), default=0.0))
        state = self._worker.get(worker)
        return math.exp(state.tail) if state is not None else 1.0

    def estimate(self, subnet_id: SubnetId, batch_size: int, *, worker: Hashable | None = None) -> float:
        """Current mean-latency estimate (seconds) of a profiled entry on ``worker`` (``None``: the fastest worker).

        This is the raw estimate, before the monotone fix-up that :meth:`refresh` applies.

        Raises:
            InvalidProfileError: the entry is not in the prior profile.
        """
        prior = self.prior.latency(subnet_id, batch_size)
        if worker is None:
            log_f = min((s.factor for s in self._worker.values()), default=0.0)
        else:
            log_f = self._worker[worker].factor if worker in self._worker else 0.0
        return prior * math.exp(self._entry.get((subnet_id, batch_size), 0.0) + log_f)

    def capacity_scale(self) -> float:
        """Mean speed of the measured workers relative to the fastest (<= 1; 1.0 before any measurement).

        The refreshed profile is the fastest worker's; ``n`` workers of which some run slower serve
        ``n * capacity_scale()`` times its throughput. Load-aware policies use it to judge what the workers sustain.
        """
        states = self._worker.values()
        if not states:
            return 1.0
        base = min(s.factor for s in states)
        return sum(math.exp(base - s.factor) for s in states) / len(states)

    def slack_scale(self, worker: Hashable) -> float:
        """Factor (<= 1) by which ``worker`` scales its slack before deciding with the last refreshed profile.

        The refreshed profile is built for the fastest worker; a worker ``f`` times slower than that decides with
        ``slack / f``. A worker never measured gets 1.0.
        """
        scale = self._scale.get(worker)
        if scale is None:
            state = self._worker.get(worker)
            scale = 1.0 if state is None else min(1.0, math.exp(self._published_base - state.factor))
            self._scale[worker] = scale
        return scale

    def refresh(self, now: float) -> Profile:
        """Publish the current estimates as a :class:`~scheduling.Profile` for ``policy.update_profile``.

        Every entry's mean, p99 and std are the prior's times the entry's factor (its offset and the fastest
        worker's factor), then raised where needed so that P1 and P2 hold wherever the prior satisfies them; the p99
        is then at least the mean times the live spread of the most spread-out worker (:meth:`tail`).
        """
        base = min((s.factor for s in self._worker.values()), default=0.0)
        log_tail = max((s.margin(now, self._shock_tau) for s in self._worker.values()), default=0.0)
        spread = math.exp(log_tail)
        est: dict[SubnetId, dict[int, float]] = {}
        for s in self.prior.subnets:
            entry = self._entry
            est[s.id] = {b: st.mean_s * math.exp(entry.get((s.id, b), 0.0) + base) for b, st in s.latency.items()}
        self._make_monotone(est)
        subnets = []
        for s in self.prior.subnets:
            lat = {}
            for b, st in s.latency.items():
                mean = est[s.id][b]
                f = mean / st.mean_s
                p99 = max(st.p99_s * f, mean * spread)  # type: ignore[operator]
                lat[b] = LatencyStats(mean, p99, None if st.std_s is None else st.std_s * f)
            subnets.append(Subnet(s.id, s.accuracy, lat, s.config))
        profile = Profile(tuple(subnets), name=self.prior.name, metadata=self.prior.metadata)
        self._published_entry = dict(self._entry)
        self._published_base = base
        self._published_tail = log_tail
        self._scale.clear()
        self._dirty = False
        self.refreshes += 1
        self._next_refresh = now + self.refresh_s
        return profile

    def replan(self, policy: Policy, now: float, *, limit_by_cost: bool = True) -> None:
        """``policy.update_profile(self.refresh(now))``, rate-limited by its own cost.

        Re-plans rebuild the policy's tables (about 0.3 ms for SlackFit on the A40 profile, tens of ms for thousands
        of entries): the next one is allowed no earlier than ``refresh_s`` and, with ``limit_by_cost`` (the live
        scheduler), no earlier than 50x this one's wall-clock cost, so re-planning never takes more than ~2 % of the
        time. The simulator passes ``limit_by_cost=False``: its clock is simulated, and a wall-clock cost would make
        its results depend on how busy the machine running it is.
        """
        t0 = time.perf_counter()
        policy.update_profile(self.refresh(now))
        policy.set_capacity_scale(self.capacity_scale())
        if limit_by_cost:
            cost = 50.0 * (time.perf_counter() - t0)
            self._next_refresh = now + max(self.refresh_s, cost)
            self._next_urgent = now + cost

    def _make_monotone(self, est: dict[SubnetId, dict[int, float]]) -> None:
        """Raise estimates (in place) to the least values that keep P1 and P2 wherever the prior has them.

        The constraints form a DAG (P1 edges go to larger batch sizes; P2 edges stay at one batch size, along the
        prior's latency order), so one pass in order of batch size, then of that order, reaches the fixpoint.
        """
        for b, order in self._p2_order.items():
            top = 0.0
            for s in order:
                row, lat = est[s.id], s.latency
                v, pb = row[b], lat[b].mean_s
                # P1: no faster than a smaller batch, unless the prior already says so, and then by no more than the
                # prior's own ratio.
                for bi in self._sizes[s.id]:
                    if bi >= b:
                        break
                    floor = row[bi] * min(1.0, pb / lat[bi].mean_s)
                    if floor > v:
                        v = floor
                # P2: a subnet the prior says is slower at this batch size is not estimated faster.
                if top > v:
                    v = top
                row[b] = top = v
