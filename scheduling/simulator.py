"""A discrete-event simulator that drives the *same* policy and EDF queue code as the live scheduler on a trace.

Events are arrivals, batch completions, worker failures and (for policies that may wait) wake-ups. Whenever a worker
is free and the queue is not empty, the drop rule runs and then the policy decides; the chosen batch occupies the
worker for the profiled latency of the chosen (subnet, batch size) - optionally sampled around the mean with the
profile's spread - plus an actuation delay when the worker switches subnet. Everything random comes from one seeded
``random.Random``, so a run is a pure function of (policy, arrivals, config).
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from .dispatch import dispatch_step
from .edf import EDFQueue
from .errors import InvalidRequestError
from .latency_model import LatencyModel
from .metrics import DecisionRecord, MetricsRecorder, MetricsSummary, OutcomeRecord
from .policies import Policy

__all__ = ["AUTO", "Interference", "SimConfig", "SimResult", "simulate"]

_INF = math.inf


@dataclass(frozen=True)
class Interference:
    """A slowdown of some workers for a time window (a co-located job, a noisy neighbour, a thermal limit).

    A batch that *starts* at time ``t`` with ``start_s <= t < end_s`` on one of ``workers`` takes ``factor`` times its
    sampled latency, with probability ``probability`` (default 1: every such batch). Overlapping windows multiply.
    The policy is not told: only a :class:`~scheduling.LatencyModel` fed by the measured times can notice.

    ``probability`` < 1 models intermittent interference, as CPU steal on a shared machine: most batches run at
    profiled speed and a few take several times longer, so the latency distribution grows a heavy tail while its
    median barely moves.

    Args:
        start_s: Start of the window, in seconds (>= 0).
        end_s: End of the window, in seconds (> ``start_s``; ``inf`` allowed).
        factor: Slowdown factor (> 0; 1.5 means 50 % slower, < 1 a speed-up).
        workers: Indices of the affected workers (``0 .. num_workers - 1``); ``None`` (default) means all of them.
        probability: Chance that one batch in the window is slowed (in (0, 1]; drawn from the simulator's seeded
            generator, so runs stay deterministic).
    """

    start_s: float
    end_s: float
    factor: float
    workers: tuple[int, ...] | None = None
    probability: float = 1.0

    def __post_init__(self) -> None:
        a, b, f = self.start_s, self.end_s, self.factor
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 <= a < math.inf:
            raise InvalidRequestError(f"Interference start_s must be a finite time >= 0, got {a!r}")
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not b > a:
            raise InvalidRequestError(f"Interference end_s must be a time > start_s={a!r}, got {b!r}")
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f < math.inf:
            raise InvalidRequestError(f"Interference factor must be a finite number > 0, got {f!r}")
        pr = self.probability
        if isinstance(pr, bool) or not isinstance(pr, (int, float)) or not 0 < pr <= 1:
            raise InvalidRequestError(f"Interference probability must be a number in (0, 1], got {pr!r}")
        if self.workers is not None:
            ws = tuple(self.workers)
            if not ws or any(isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in ws):
                raise InvalidRequestError(
                    f"Interference workers must be None or a non-empty sequence of worker indices >= 0, "
                    f"got {self.workers!r}"
                )
            object.__setattr__(self, "workers", ws)


@dataclass(frozen=True)
class SimConfig:
    """Simulation settings.

    Args:
        slo_s: Every request's SLO in seconds (deadline = arrival + ``slo_s``). Must be > 0.
        num_workers: Number of workers (e.g. GPUs), each running one batch at a time. Default 1.
        drop_late: The queue's drop rule: ``True`` (default) completes a request as missed once its slack is below the
            policy's fastest latency; ``False`` serves it late.
        latency_noise: ``"none"`` (default): a batch takes exactly the profiled mean. ``"lognormal"``: sampled from a
            lognormal with the profiled mean and std (no noise where std is unknown). The policy always decides from
            the profile; only the simulated execution varies.
        actuation_delay_s: Extra time a worker spends when it runs a different subnet than its previous batch (models
            systems that load models; SubNetAct's is ~0). A worker's first batch pays none. Default 0.
        worker_failures: Times (seconds) at which a worker dies; each kills the highest-numbered live worker. Its
            running batch, if any, fails. Default none.
        interference: :class:`Interference` windows slowing some workers down; the policy decides from its profile
            (and a :class:`~scheduling.LatencyModel`, if :func:`simulate` got one) without being told. Default none.
        seed: Seed of the simulator's random generator (latency noise). Default 0.
        record_timeline: Keep per-batch :class:`~scheduling.metrics.DecisionRecord` and per-outcome
            :class:`~scheduling.metrics.OutcomeRecord` lists (for dynamics plots). Default ``False``.
    """

    slo_s: float
    num_workers: int = 1
    drop_late: bool = True
    latency_noise: Literal["none", "lognormal"] = "none"
    actuation_delay_s: float = 0.0
    worker_failures: Sequence[float] = ()
    interference: Sequence[Interference] = ()
    seed: int = 0
    record_timeline: bool = False

    def __post_init__(self) -> None:
        s = self.slo_s
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
            raise InvalidRequestError(f"slo_s must be a finite number of seconds > 0, got {s!r}")
        n = self.num_workers
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidRequestError(f"num_workers must be an int >= 1, got {n!r}")
        if self.latency_noise not in ("none", "lognormal"):
            raise InvalidRequestError(f"latency_noise must be 'none' or 'lognormal', got {self.latency_noise!r}")
        a = self.actuation_delay_s
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a) or a < 0:
            raise InvalidRequestError(f"actuation_delay_s must be a finite number >= 0, got {a!r}")
        fails = tuple(self.worker_failures)
        for t in fails:
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
                raise InvalidRequestError(f"worker_failures must be finite times >= 0, got {self.worker_failures!r}")
        object.__setattr__(self, "worker_failures", tuple(sorted(float(t) for t in fails)))
        windows = tuple(self.interference)
        for i, win in enumerate(windows):
            if not isinstance(win, Interference):
                raise InvalidRequestError(f"interference[{i}] must be an Interference, got {type(win).__name__}")
            if win.workers is not None and max(win.workers) >= n:
                raise InvalidRequestError(
                    f"interference[{i}] names worker {max(win.workers)}, but num_workers={n} (indices 0..{n - 1})"
                )
        object.__setattr__(self, "interference", windows)


@dataclass(frozen=True)
class SimResult:
    """Outcome of :func:`simulate`.

    Attributes:
        summary: Totals, SLO attainment, mean serving accuracy, latency percentiles.
        decisions: One record per dispatched batch (only with ``record_timeline``).
        outcomes: One record per finished group of requests (only with ``record_timeline``).
        end_time: Simulated time of the last event.
    """

    summary: MetricsSummary
    decisions: list[DecisionRecord] = field(repr=False)
    outcomes: list[OutcomeRecord] = field(repr=False)
    end_time: float


def _check_arrivals(arrivals: Sequence[float]) -> None:
    prev = -_INF
    for i, t in enumerate(arrivals):
        # `not t >= prev` also catches NaN.
        if not t >= prev or t == _INF:
            raise InvalidRequestError(
                f"arrivals must be finite and sorted ascending; arrivals[{i}]={t!r} after {prev!r}"
            )
        prev = t


AUTO = "auto"
"""``latency_model=AUTO`` (the default of :func:`simulate` and :class:`~scheduling.Scheduler`): a fresh
:class:`~scheduling.LatencyModel` if the policy ``wants_latency_model`` (the default :class:`~scheduling.SlackFit`),
else none."""


def simulate(
    policy: Policy,
    arrivals: Sequence[float],
    config: SimConfig,
    *,
    latency_model: LatencyModel | None | Literal["auto"] = AUTO,
) -> SimResult:
    """Run ``policy`` on the arrival times ``arrivals`` (seconds, sorted) under ``config``.

    Every request ends exactly once: on time, late, dropped (drop rule), or failed (its worker died, or no worker was
    left).

    Args:
        policy: Any :class:`~scheduling.policies.Policy`; :meth:`~scheduling.policies.Policy.reset` is called first.
        arrivals: Sorted, finite arrival times in seconds.
        config: A :class:`SimConfig`.
        latency_model: Adaptive planning: a :class:`~scheduling.LatencyModel` built on ``policy.profile``. It is reset,
            fed each batch's simulated service time when the batch completes, and re-plans the policy through
            :meth:`~scheduling.Policy.update_profile`; each worker decides with its own slowdown factor. At the end the
            policy is left planning with the model's prior. ``"auto"`` (default): a new model if the policy
            ``wants_latency_model`` (the default SlackFit), else none. ``None``: the static profile.

    Returns:
        A :class:`SimResult`.

    Example::

        >>> from scheduling import SimConfig, SlackFit, datasets, simulate, traces
        >>> policy = SlackFit(datasets.superserve_a40_profile())
        >>> arrivals = traces.bursty(1500, 2950, cv2=2, duration_s=2.0, seed=0)
        >>> r = simulate(policy, arrivals, SimConfig(slo_s=0.036, num_workers=8))
        >>> r.summary.slo_attainment > 0.99
        True
    """
    if not isinstance(policy, Policy):
        raise InvalidRequestError(f"policy must be a scheduling Policy, got {type(policy).__name__}")
    if not isinstance(config, SimConfig):
        raise InvalidRequestError(f"config must be a SimConfig, got {type(config).__name__}")
    _check_arrivals(arrivals)
    model = latency_model
    if isinstance(model, str) and model == AUTO:
        model = LatencyModel(policy.profile) if policy.wants_latency_model else None
    if model is not None:
        if not isinstance(model, LatencyModel):
            raise InvalidRequestError(f"latency_model must be a LatencyModel or None, got {type(model).__name__}")
        model.reset()
        policy.update_profile(model.prior)  # raises if the model was built on another profile
    policy.reset()
    policy.set_num_workers(config.num_workers)
    rng = random.Random(config.seed)
    slo = float(config.slo_s)
    q = EDFQueue(drop_late=config.drop_late)
    rec = MetricsRecorder(record_timeline=config.record_timeline)
    timeline = config.record_timeline

    # Execution time of (subnet, profiled batch): the mean, or lognormal parameters matching mean and std.
    # The ground truth is the profile the policy starts from (the model's prior): re-plans must not change it.
    exec_time: dict[tuple[object, int], tuple[float, float, float]] = {}
    for s in policy.profile.subnets:
        for b, st in s.latency.items():
            sd = st.std_s or 0.0
            sigma2 = math.log1p((sd / st.mean_s) ** 2)
            exec_time[(s.id, b)] = (st.mean_s, math.log(st.mean_s) - sigma2 / 2, math.sqrt(sigma2))
    noisy = config.latency_noise == "lognormal"
    lognorm = rng.lognormvariate
    act_delay = float(config.actuation_delay_s)
    windows = config.interference
    scale = model.slack_scale if model is not None else None

    idle = list(range(config.num_workers))  # a heap: the lowest-numbered free worker goes first
    alive = [True] * config.num_workers
    running = [None] * config.num_workers  # worker -> its busy-heap entry
    current = [None] * config.num_workers  # worker -> subnet of its previous batch
    busy: list = []  # heap of [t_done, seq, worker, accuracy, entries, subnet, batch, service time]
    fails = list(config.worker_failures)
    fi = 0
    seq = 0
    wake = _INF
    n = len(arrivals)
    i = 0
    push = q.push
    heappush, heappop = heapq.heappush, heapq.heappop
    observe = policy.observe_arrivals if policy.needs_arrivals else None
    t = 0.0

    def dispatch(t: float) -> float:
        """Start batches while a worker is free and the queue is not empty; return a wake-up time or inf."""
        nonlocal seq
        while idle and q:
            w = idle[0]
            expired, d, entries, qlen, wake_at = dispatch_step(q, policy, t, 1.0 if scale is None else scale(w))
            if expired:
                rec.record_drop(t, len(expired))
            if d is None:
                # Queue emptied by the drop rule (wake_at is inf), or the policy waits: look again at wake_at (when
                # the head would have to be dropped) or on the next arrival.
                return wake_at
            heappop(idle)
            mean, mu, sigma = exec_time[(d.subnet_id, d.profile_batch)]
            dur = lognorm(mu, sigma) if noisy and sigma > 0.0 else mean
            for win in windows:
                if win.start_s <= t < win.end_s and (win.workers is None or w in win.workers):
                    # Draw only for intermittent windows, so the noise sequence of every other run is unchanged.
                    if win.probability >= 1.0 or rng.random() < win.probability:
                        dur *= win.factor
            if act_delay and current[w] is not None and current[w] != d.subnet_id:
                dur += act_delay
            current[w] = d.subnet_id
            seq += 1
            item = [t + dur, seq, w, d.accuracy, entries, d.subnet_id, d.profile_batch, dur]
            running[w] = item
            heappush(busy, item)
            if timeline:
                rec.record_decision(t, w, d.subnet_id, len(entries), qlen, d.latency_s)
            else:
                rec.batches += 1
                rec._served_requests += len(entries)
        return _INF

    while True:
        t_a = arrivals[i] if i < n else _INF
        t_d = busy[0][0] if busy else _INF
        t_f = fails[fi] if fi < len(fails) else _INF
        if t_d <= t_a and t_d <= t_f and t_d <= wake:
            if t_d == _INF:
                break
            t = t_d
            _, _, w, acc, entries, sid, size, dur = heappop(busy)
            running[w] = None
            rec.record_served(t, entries, acc)
            # A simulated partial batch runs as its profiled (padded) size, so that is the size it measures.
            if model is not None and model.record(w, sid, size, dur, t):
                model.replan(policy, t, limit_by_cost=False)  # deterministic: simulated time only
            heappush(idle, w)
            wake = dispatch(t)
        elif t_f <= t_a and t_f <= wake:
            t = t_f
            fi += 1
            live = [w for w in range(config.num_workers) if alive[w]]
            if live:
                w = live[-1]
                alive[w] = False
                if w in idle:
                    idle.remove(w)
                    heapq.heapify(idle)
                policy.set_num_workers(sum(alive))
                item = running[w]
                if item is not None:
                    busy.remove(item)
                    heapq.heapify(busy)
                    running[w] = None
                    rec.record_failure(t, len(item[4]))
        elif wake <= t_a:
            t = wake
            wake = dispatch(t)
        else:
            t = t_a
            if idle:
                push(t + slo, t, None)
                i += 1
                if observe is not None:
                    observe(t, 1)
                wake = dispatch(t)
            else:
                # No free worker: nothing can happen before the next completion/failure, so queue arrivals in bulk.
                lim = t_d if t_d < t_f else t_f
                if wake < lim:
                    lim = wake
                while i < n:
                    ta = arrivals[i]
                    if ta >= lim:
                        break
                    push(ta + slo, ta, None)
                    if observe is not None:
                        observe(ta, 1)
                    i += 1

    # Left over only when every worker died (or a waiting policy never decided): those requests fail.
    left = q.drain()
    if left:
        rec.record_failure(t, len(left))
    if model is not None:
        policy.update_profile(model.prior)
    return SimResult(rec.summary(), rec.decisions, rec.outcomes, t)
