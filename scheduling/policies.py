"""Scheduling policies: the interface, the decision type, and the simple baselines.

A policy answers one question, every time a worker is free and the queue is not empty: *given the remaining slack of
the earliest-deadline request, the queue length and the profile, which subnet runs how many requests?*

Conventions shared by every policy in this package:

- **Candidates.** A candidate is a profiled (subnet, batch size ``b``) pair. With a queue of ``q`` requests a candidate
  takes ``min(b, q)`` requests; a partial batch (``q < b``) is charged the latency profiled for ``b`` (the worker may
  pad it to ``b``). With ``queue_aware=True`` (default) only batch sizes up to the smallest profiled size ``>= q`` are
  candidates: a larger ``b`` would take the same ``q`` requests and can only be slower on a monotone profile.
- **Feasibility** is checked on each candidate's *own* latency statistic (``"mean"``, or ``"p99"`` for the tail-aware
  variant of Orloj), never by assuming P1/P2, so policies stay correct on non-monotone profiles.
- **Nothing fits.** :meth:`Policy.decide` then returns the fastest candidate with ``fits=False``; the drop rule of
  :class:`~scheduling.edf.EDFQueue` (with :meth:`Policy.min_latency` as threshold) normally prevents this case.
- **Cost.** Every table is built in ``__init__``; :meth:`Policy.decide` is a couple of bisections, O(log n).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from .errors import InvalidProfileError, InvalidRequestError
from .profile import LatencyStat, Profile, SubnetId

__all__ = [
    "Choice",
    "Decision",
    "Fixed",
    "IterationFit",
    "MaxAcc",
    "MaxBatch",
    "MinCost",
    "Policy",
    "PrefixBest",
]


class Decision(NamedTuple):
    """What to run next.

    Attributes:
        subnet_id: The subnet to actuate.
        batch_size: How many requests to take from the head of the EDF queue (``1 <= batch_size <= queue_len``).
        profile_batch: The profiled batch size whose latency the decision assumes (``>= batch_size``).
        latency_s: That profiled latency (the policy's statistic: mean or p99), in seconds.
        accuracy: The subnet's accuracy.
        fits: Whether ``latency_s <= slack_s`` held when the decision was made.
    """

    subnet_id: SubnetId
    batch_size: int
    profile_batch: int
    latency_s: float
    accuracy: float
    fits: bool


class Choice(NamedTuple):
    """One candidate of a policy's tables: a profiled (subnet, batch size) pair with its latency statistic.

    Attributes:
        subnet_id: The subnet.
        batch: The profiled batch size.
        latency: The policy's latency statistic (mean or p99) of ``batch`` requests, in seconds.
        accuracy: The subnet's accuracy.
    """

    subnet_id: SubnetId
    batch: int
    latency: float
    accuracy: float


class PrefixBest:
    """Choices sorted by latency; ``best[i]`` is the best choice (under ``key``) among the first ``i + 1``.

    ``query(slack)`` is then "the best choice whose latency is <= slack" in one bisection, whatever the shape of the
    profile.
    """

    __slots__ = ("best", "fastest", "lats")

    def __init__(self, choices: Sequence[Choice], key: Callable[[Choice], Any]) -> None:
        ordered = sorted(choices, key=lambda c: (c.latency, -c.batch, -c.accuracy))
        self.lats = [c.latency for c in ordered]
        self.best: list[Choice] = []
        cur = cur_key = None
        for c in ordered:
            k = key(c)
            if cur is None or k > cur_key:
                cur, cur_key = c, k
            self.best.append(cur)
        self.fastest = ordered[0] if ordered else None

    def query(self, slack: float) -> Choice | None:
        i = bisect_right(self.lats, slack)
        return self.best[i - 1] if i else None


def _check_stat(latency_stat: str) -> None:
    if latency_stat not in ("mean", "p99"):
        raise InvalidRequestError(f"latency_stat must be 'mean' or 'p99' (tail-aware), got {latency_stat!r}")


class Policy(ABC):
    """Base class: precomputed candidate tables plus ``decide``.

    Args:
        profile: The latency/accuracy profile.
        latency_stat: ``"mean"`` (default) or ``"p99"``: the statistic used for feasibility and ordering. ``"p99"`` is
            the tail-aware variant (Orloj: decide from a latency quantile rather than the mean).
        queue_aware: If ``True`` (default), only batch sizes up to the smallest profiled size ``>= queue_len`` are
            candidates (see the module docstring). ``False`` always considers every profiled size.

    Subclasses implement :meth:`decide`; stateful ones (those that watch the arrival rate) set
    ``needs_arrivals = True`` and implement :meth:`observe_arrivals` and :meth:`reset`.
    """

    #: Set by policies that need :meth:`observe_arrivals` to be called for every arrival.
    needs_arrivals: bool = False
    #: Set by policies that plan with a :class:`~scheduling.LatencyModel` by default: :func:`~scheduling.simulate`
    #: and :class:`~scheduling.Scheduler` then create one unless given ``latency_model=None``.
    wants_latency_model: bool = False

    def __init__(self, profile: Profile, *, latency_stat: LatencyStat = "mean", queue_aware: bool = True) -> None:
        if not isinstance(profile, Profile):
            raise InvalidProfileError(f"profile must be a scheduling.Profile, got {type(profile).__name__}")
        _check_stat(latency_stat)
        self.latency_stat: LatencyStat = latency_stat
        self.queue_aware = bool(queue_aware)
        self._load(profile)

    def _load(self, profile: Profile) -> None:
        """Derive the candidate list and the queue-length classes from ``profile``."""
        self.profile = profile
        bs = profile.batch_sizes
        self._batch_sizes = bs
        self._max_batch = bs[-1]
        last = len(bs) - 1
        self._k_last = last
        # _k_of[q] = index of the smallest profiled batch size >= q, for q in 1..max batch; O(1) in decide().
        self._k_of = [last] + [bisect_left(bs, q) if self.queue_aware else last for q in range(1, bs[-1] + 1)]
        stat = self.latency_stat
        self._all = [
            Choice(s.id, b, st.stat(stat), s.accuracy) for s in profile.subnets for b, st in s.latency.items()
        ]

    def update_profile(self, profile: Profile) -> None:
        """Re-plan with new latencies: replace the profile and rebuild the decision tables.

        The new profile must have the same subnet ids, accuracies and batch sizes (only latencies may change), so
        state that refers to them (a :class:`Fixed` subnet, :class:`~scheduling.GearPlan` gears, the measured rate)
        stays valid. This is how :class:`~scheduling.LatencyModel` estimates reach a policy; the caller makes it
        atomic with respect to :meth:`decide` (the live :class:`~scheduling.Scheduler` holds its lock).

        Raises:
            InvalidProfileError: ``profile`` is not a :class:`~scheduling.Profile` with the same subnets, accuracies
                and batch sizes; the policy is unchanged.
        """
        if not isinstance(profile, Profile):
            raise InvalidProfileError(f"profile must be a scheduling.Profile, got {type(profile).__name__}")
        old = self.profile
        for a, b in zip(old.subnets, profile.subnets, strict=False):
            if a.id != b.id or a.accuracy != b.accuracy or tuple(a.latency) != tuple(b.latency):
                raise InvalidProfileError(
                    f"update_profile needs the same subnets, accuracies and batch sizes as the current profile; "
                    f"subnet {a.id!r} (accuracy {a.accuracy}, batches {list(a.latency)}) became {b.id!r} "
                    f"(accuracy {b.accuracy}, batches {list(b.latency)})"
                )
        if len(old.subnets) != len(profile.subnets):
            raise InvalidProfileError(
                f"update_profile needs the same {len(old.subnets)} subnets as the current profile, got "
                f"{len(profile.subnets)}"
            )
        self._load(profile)
        self._rebuild()

    def _rebuild(self) -> None:  # noqa: B027 - subclasses with tables override it
        """Build the decision tables from ``self._all`` (called by ``__init__`` and :meth:`update_profile`)."""

    # --------------------------------------------------------------- helpers for subclasses
    def _classes(self) -> range:
        """Queue-length classes: k indexes ``profile.batch_sizes``; class k allows batch sizes <= batch_sizes[k]."""
        return range(len(self._batch_sizes)) if self.queue_aware else range(self._k_last, self._k_last + 1)

    def _candidates(self, k: int, subnet_id: SubnetId | None = None) -> list[Choice]:
        cap = self._batch_sizes[k]
        return [c for c in self._all if c.batch <= cap and (subnet_id is None or c.subnet_id == subnet_id)]

    def _k(self, queue_len: int) -> int:
        return self._k_of[queue_len] if queue_len <= self._max_batch else self._k_last

    @staticmethod
    def _check_args(slack_s: float, queue_len: int) -> None:
        # Cheap guards only: decide() is on the hot path. NaN compares unequal to itself.
        if slack_s != slack_s:
            raise InvalidRequestError(f"slack_s must be a number of seconds (may be negative), got {slack_s!r}")
        if queue_len.__class__ is not int or queue_len < 1:
            raise InvalidRequestError(
                f"queue_len must be an int >= 1 (decide is only called on a non-empty queue), got {queue_len!r}"
            )

    @staticmethod
    def _make(c: Choice, queue_len: int, slack_s: float) -> Decision:
        return Decision(
            c.subnet_id, c.batch if c.batch < queue_len else queue_len, c.batch, c.latency, c.accuracy,
            c.latency <= slack_s,
        )  # fmt: skip

    # --------------------------------------------------------------- interface
    @abstractmethod
    def decide(self, slack_s: float, queue_len: int, now: float) -> Decision | None:
        """Choose what to run next.

        Args:
            slack_s: Remaining slack of the earliest-deadline request, ``deadline - now``, in seconds (may be <= 0).
            queue_len: Number of queued requests (>= 1).
            now: Current time in seconds (the scheduler's clock); only stateful policies use it.

        Returns:
            A :class:`Decision`, or ``None`` to wait (none of the built-in policies waits).
        """

    @abstractmethod
    def min_latency(self, queue_len: int) -> float:
        """The fastest latency this policy could run with ``queue_len`` queued requests: the drop-rule threshold."""

    def observe_arrivals(self, now: float, count: int = 1) -> None:  # noqa: B027 - optional hook, no-op by default
        """Called for arrivals when :attr:`needs_arrivals` is set. No-op by default."""

    def reset(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Forget any state learned at run time (called by the simulator before each run). No-op by default."""

    def set_capacity_scale(self, scale: float) -> None:  # noqa: B027 - optional hook, no-op by default
        """Called by :meth:`LatencyModel.replan <scheduling.LatencyModel.replan>` with the workers' mean speed
        relative to the profile the policy plans with (<= 1 when some workers run slower). No-op by default."""

    def set_num_workers(self, n: int) -> None:  # noqa: B027 - optional hook, no-op by default
        """Called by hosts with the number of workers serving the queue, at start and when it changes. No-op by
        default; load-aware policies (:class:`~scheduling.SlackFit`) use it to turn the arrival rate into a per-worker
        demand."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(latency_stat={self.latency_stat!r})"


class _KeyedPolicy(Policy):
    """A policy that picks, among the candidates that fit, the maximum under a lexicographic key.

    Subclasses set ``_key`` (and ``_only``, a subnet id or ``None``) and then call :meth:`_rebuild`.
    """

    _key: Callable[[Choice], Any]
    _only: SubnetId | None = None

    def _rebuild(self) -> None:
        key, subnet_id = self._key, self._only
        tables: list[PrefixBest | None] = [None] * len(self._batch_sizes)
        for k in self._classes():
            tables[k] = PrefixBest(self._candidates(k, subnet_id), key)
        # Queue classes below the first profiled batch size of a fixed subnet fall back to its next class up.
        for k in range(len(tables) - 1, -1, -1):
            t = tables[k]
            if t is not None and t.fastest is None:
                tables[k] = None
            if tables[k] is None and k + 1 < len(tables):
                tables[k] = tables[k + 1]
        self._tables = tables

    def decide(self, slack_s: float, queue_len: int, now: float) -> Decision:
        self._check_args(slack_s, queue_len)
        t = self._tables[self._k(queue_len)]
        c = t.query(slack_s) or t.fastest
        return self._make(c, queue_len, slack_s)

    def min_latency(self, queue_len: int) -> float:
        return self._tables[self._k(queue_len)].fastest.latency


class MaxAcc(_KeyedPolicy):
    """Maximise accuracy first, then batch size (SuperServe A.5): the most accurate subnet with any candidate that
    fits the slack, at the largest batch size of that subnet that fits.

    Args:
        profile: The latency/accuracy profile.
        latency_stat: ``"mean"`` or ``"p99"``. See :class:`Policy`.
        queue_aware: See :class:`Policy`.

    Example::

        >>> from scheduling import MaxAcc, datasets
        >>> MaxAcc(datasets.superserve_a40_profile()).decide(0.030, 64, 0.0).subnet_id
        5
    """

    def __init__(self, profile: Profile, *, latency_stat: LatencyStat = "mean", queue_aware: bool = True) -> None:
        super().__init__(profile, latency_stat=latency_stat, queue_aware=queue_aware)
        self._key = lambda c: (c.accuracy, c.batch, -c.latency)
        self._rebuild()


class MaxBatch(_KeyedPolicy):
    """Maximise batch size first, then accuracy (SuperServe A.5): the largest batch any subnet can run within the
    slack, with the most accurate subnet that runs it in time.

    Args: as :class:`MaxAcc`.
    """

    def __init__(self, profile: Profile, *, latency_stat: LatencyStat = "mean", queue_aware: bool = True) -> None:
        super().__init__(profile, latency_stat=latency_stat, queue_aware=queue_aware)
        self._key = lambda c: (c.batch, c.accuracy, -c.latency)
        self._rebuild()


class Fixed(_KeyedPolicy):
    """Always the same subnet, at the largest batch size that fits the slack (the paper's Clipper+ baseline).

    Args:
        profile: The latency/accuracy profile.
        subnet_id: The subnet to serve. Raises :class:`~scheduling.errors.UnknownSubnetError` if not in the profile.
        latency_stat: ``"mean"`` or ``"p99"``. See :class:`Policy`.
        queue_aware: See :class:`Policy`.
    """

    def __init__(
        self, profile: Profile, subnet_id: SubnetId, *, latency_stat: LatencyStat = "mean", queue_aware: bool = True
    ) -> None:
        super().__init__(profile, latency_stat=latency_stat, queue_aware=queue_aware)
        profile.index_of(subnet_id)  # raises UnknownSubnetError with the known ids
        self.subnet_id = self._only = subnet_id
        self._key = lambda c: (c.batch, -c.latency)
        self._rebuild()

    def __repr__(self) -> str:
        return f"Fixed(subnet_id={self.subnet_id!r}, latency_stat={self.latency_stat!r})"


class MinCost(Fixed):
    """Always the least accurate subnet (INFaaS without an accuracy constraint: the cheapest model), largest batch that
    fits. Ties in accuracy go to the subnet with the fastest profiled latency.

    Args:
        profile: The latency/accuracy profile.
        latency_stat: ``"mean"`` or ``"p99"``. See :class:`Policy`.
        queue_aware: See :class:`Policy`.
    """

    def __init__(self, profile: Profile, *, latency_stat: LatencyStat = "mean", queue_aware: bool = True) -> None:
        if not isinstance(profile, Profile):
            raise InvalidProfileError(f"profile must be a scheduling.Profile, got {type(profile).__name__}")
        cheapest = min(profile.subnets, key=lambda s: (s.accuracy, min(st.mean_s for st in s.latency.values())))
        super().__init__(profile, cheapest.id, latency_stat=latency_stat, queue_aware=queue_aware)

    def __repr__(self) -> str:
        return f"MinCost(subnet_id={self.subnet_id!r}, latency_stat={self.latency_stat!r})"


class IterationFit(Policy):
    """For iteration-level batching (an LLM's decode steps): the whole batch runs together, so only the subnet is
    chosen. The most accurate subnet whose latency at the batch's profiled size (the smallest profiled batch size
    ``>= queue_len``) fits the slack; when none fits, the fastest at that size (``fits=False``).

    The other policies may take fewer requests than are queued (a smaller batch that fits); a decode step cannot
    leave a running sequence behind, so here ``Decision.batch_size`` is always ``queue_len`` (issue 24).

    Args:
        profile: The latency/accuracy profile; its batch sizes count what one iteration processes (running
            sequences for a decode step, prompt tokens for a prefill).
        subnet_ids: Restrict the choice to these subnets (default: all). One id gives a fixed subnet (a fixed FFN
            width), the baseline an elastic loop is compared with.
        latency_stat: ``"mean"`` (default) or ``"p99"``. See :class:`Policy`.

    Raises:
        UnknownSubnetError: a ``subnet_ids`` entry is not in the profile.
        InvalidRequestError: ``subnet_ids`` is empty.

    Example::

        >>> from scheduling import IterationFit, LatencyStats, Profile, Subnet
        >>> steps = Profile([Subnet("ffn0.5", 0.5, {1: LatencyStats(0.010), 8: LatencyStats(0.020)}),
        ...                  Subnet("ffn1.0", 1.0, {1: LatencyStats(0.015), 8: LatencyStats(0.040)})])
        >>> policy = IterationFit(steps)
        >>> policy.decide(0.025, 1, 0.0).subnet_id, policy.decide(0.025, 6, 0.0)[:3]   # 6 running: profiled at 8
        ('ffn1.0', ('ffn0.5', 6, 8))
    """

    def __init__(
        self,
        profile: Profile,
        *,
        subnet_ids: Sequence[SubnetId] | None = None,
        latency_stat: LatencyStat = "mean",
    ) -> None:
        super().__init__(profile, latency_stat=latency_stat, queue_aware=True)
        if subnet_ids is not None:
            subnet_ids = list(subnet_ids)
            if not subnet_ids:
                raise InvalidRequestError(f"subnet_ids must name at least one subnet of {list(profile.ids)!r}, got []")
            for s in subnet_ids:
                profile.index_of(s)  # raises UnknownSubnetError with the known ids
        self.subnet_ids = None if subnet_ids is None else tuple(subnet_ids)
        self._rebuild()

    def _rebuild(self) -> None:
        ids = None if self.subnet_ids is None else set(self.subnet_ids)
        own: dict[SubnetId, dict[int, Choice]] = {}
        for c in self._all:
            if ids is None or c.subnet_id in ids:
                own.setdefault(c.subnet_id, {})[c.batch] = c
        # Class k: batches of up to batch_sizes[k]; each subnet is charged its smallest profiled size that holds the
        # whole batch (a padded batch), and a subnet profiled only below it cannot run it.
        tables: list[PrefixBest | None] = []
        for b in self._batch_sizes:
            cs = [sizes[min(x for x in sizes if x >= b)] for sizes in own.values() if max(sizes) >= b]
            tables.append(PrefixBest(cs, lambda c: (c.accuracy, -c.latency)) if cs else None)
        self._tables = tables
        self._largest = max(max(sizes) for sizes in own.values())

    @property
    def largest_batch(self) -> int:
        """The largest batch these subnets can run (the largest size profiled for any of them)."""
        return self._largest

    def decide(self, slack_s: float, queue_len: int, now: float) -> Decision:
        self._check_args(slack_s, queue_len)
        if queue_len > self._largest:
            raise InvalidRequestError(
                f"queue_len {queue_len!r} exceeds the largest batch size profiled for these subnets, {self._largest}: "
                f"the whole batch runs together, so profile up to the largest batch the host forms"
            )
        t = self._tables[self._k(queue_len)]
        c = t.query(slack_s) or t.fastest
        return Decision(c.subnet_id, queue_len, c.batch, c.latency, c.accuracy, c.latency <= slack_s)

    def min_latency(self, queue_len: int) -> float:
        """The fastest latency of a batch of ``queue_len`` (``inf`` above the largest profiled batch size)."""
        if queue_len > self._largest:
            return math.inf
        return self._tables[self._k(max(queue_len, 1))].fastest.latency

    def __repr__(self) -> str:
        return f"IterationFit(subnet_ids={self.subnet_ids!r}, latency_stat={self.latency_stat!r})"
