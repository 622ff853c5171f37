"""SlackFit (SuperServe §4.2, Appendix A.5): bucket (subnet, batch) choices by latency, pick by the head's slack.

Offline, every candidate (subnet, batch size) is placed in one of ``num_buckets`` evenly spaced latency buckets between
the smallest and the largest profiled latency. Online, SlackFit takes the bucket closest to, but below, the slack of
the earliest-deadline request and, within it, the choice with the largest batch (ties: higher accuracy, then lower
latency).

Made exact on real profiles:

- Only choices whose *own* latency is <= slack are considered, so a bucket straddling the slack contributes just its
  fitting part. Hence SlackFit returns a fitting choice whenever any candidate fits, on any profile.
- ``pareto=True`` (default) first drops choices that another choice dominates (no slower, no smaller batch, no less
  accurate). The paper restricts SlackFit to Pareto-optimal subnets and then relies on P2 (slower means more
  accurate); on a profile violating P2 (in the A40 profile subnet 5 is faster *and* more accurate than subnet 4 at
  batch 1) the highest-latency bucket would otherwise hold a dominated choice.
"""

from __future__ import annotations

from collections.abc import Sequence

from .errors import InvalidRequestError
from .policies import Decision, Policy, _Choice, _PrefixBest
from .profile import LatencyStat, Profile

__all__ = ["SlackFit"]


def _pareto(choices: Sequence[_Choice], batch_sizes: Sequence[int]) -> list[_Choice]:
    """Drop every choice dominated by another: latency <=, batch >=, accuracy >= (exact duplicates keep one)."""
    pos = {b: i for i, b in enumerate(batch_sizes)}
    # best_acc[i]: highest accuracy among kept choices (all no slower than the current one) with batch index >= i.
    best_acc = [float("-inf")] * len(batch_sizes)
    kept = []
    for c in sorted(choices, key=lambda c: (c.latency, -c.batch, -c.accuracy)):
        i = pos[c.batch]
        if best_acc[i] >= c.accuracy:
            continue
        kept.append(c)
        for j in range(i + 1):
            if best_acc[j] < c.accuracy:
                best_acc[j] = c.accuracy
    return kept


class _ClassTable:
    """SlackFit's tables for one queue-length class."""

    __slots__ = ("below", "buckets", "fastest")

    def __init__(self, choices: list[_Choice], lo: float, width: float, n: int) -> None:
        per_bucket: list[list[_Choice]] = [[] for _ in range(n)]
        for c in choices:
            per_bucket[min(int((c.latency - lo) / width), n - 1)].append(c)
        key = _slackfit_key
        self.buckets = [_PrefixBest(cs, key) if cs else None for cs in per_bucket]
        # below[j]: representative (largest batch) of the nearest non-empty bucket strictly below j.
        self.below: list[_Choice | None] = []
        rep = None
        for b in self.buckets:
            self.below.append(rep)
            if b is not None:
                rep = b.best[-1]
        self.fastest = min(choices, key=lambda c: (c.latency, -c.batch, -c.accuracy))


def _slackfit_key(c: _Choice) -> tuple[int, float, float]:
    return (c.batch, c.accuracy, -c.latency)


class SlackFit(Policy):
    """SlackFit scheduling policy.

    Args:
        profile: The latency/accuracy profile.
        num_buckets: Number of evenly spaced latency buckets between the smallest and largest profiled latency
            (default 20). More buckets make SlackFit track the slack more closely (towards "the slowest choice that
            fits"); fewer make it favour larger batches.
        latency_stat: ``"mean"`` (default) or ``"p99"`` (tail-aware). See :class:`~scheduling.policies.Policy`.
        queue_aware: See :class:`~scheduling.policies.Policy`. ``False`` is the paper's literal rule (slack only).
        pareto: Drop dominated choices before bucketing (default ``True``; see the module docstring).

    Example::

        >>> from scheduling import SlackFit, datasets
        >>> policy = SlackFit(datasets.superserve_a40_profile())
        >>> d = policy.decide(0.036, 3, 0.0)         # light load: a small batch on the most accurate subnet
        >>> (d.subnet_id, d.batch_size)
        (5, 3)
        >>> d = policy.decide(0.015, 200, 0.0)       # a burst: little slack, long queue -> big batch, small subnet
        >>> (d.subnet_id, d.batch_size, d.fits)
        (1, 32, True)
    """

    def __init__(
        self,
        profile: Profile,
        *,
        num_buckets: int = 20,
        latency_stat: LatencyStat = "mean",
        queue_aware: bool = True,
        pareto: bool = True,
    ) -> None:
        if isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or num_buckets < 1:
            raise InvalidRequestError(f"num_buckets must be an int >= 1, got {num_buckets!r}")
        super().__init__(profile, latency_stat=latency_stat, queue_aware=queue_aware)
        self.num_buckets = num_buckets
        self.pareto = bool(pareto)
        self._rebuild()

    def _rebuild(self) -> None:
        num_buckets = self.num_buckets
        lats = [c.latency for c in self._all]
        self._lo, self._hi = min(lats), max(lats)
        # A degenerate profile (one latency) still gets a valid grid: everything lands in bucket 0.
        self._width = (self._hi - self._lo) / num_buckets or 1.0
        tables: list[_ClassTable | None] = [None] * len(self._batch_sizes)
        for k in self._classes():
            cands = self._candidates(k)
            if self.pareto:
                cands = _pareto(cands, self._batch_sizes)
            tables[k] = _ClassTable(cands, self._lo, self._width, num_buckets)
        for k in range(len(tables) - 2, -1, -1):
            if tables[k] is None:
                tables[k] = tables[k + 1]
        self._tables = tables

    @property
    def bucket_edges(self) -> list[float]:
        """The ``num_buckets + 1`` bucket edges in seconds."""
        return [self._lo + i * self._width for i in range(self.num_buckets)] + [self._hi]

    def decide(self, slack_s: float, queue_len: int, now: float) -> Decision:
        self._check_args(slack_s, queue_len)
        t = self._tables[self._k_of[queue_len] if queue_len <= self._max_batch else self._k_last]
        if slack_s >= self._lo:
            j = int((slack_s - self._lo) / self._width)
            if j >= self.num_buckets:
                j = self.num_buckets - 1
            b = t.buckets[j]
            c = b.query(slack_s) if b is not None else None
            if c is None:
                c = t.below[j]
            if c is not None:
                # fits is recomputed rather than assumed: bucket edges are floats, so never trust them to the ulp.
                return Decision(
                    c.subnet_id, c.batch if c.batch < queue_len else queue_len, c.batch, c.latency, c.accuracy,
                    c.latency <= slack_s,
                )  # fmt: skip
        return self._make(t.fastest, queue_len, slack_s)

    def min_latency(self, queue_len: int) -> float:
        return self._tables[self._k(queue_len)].fastest.latency

    def __repr__(self) -> str:
        return (
            f"SlackFit(num_buckets={self.num_buckets}, latency_stat={self.latency_stat!r}, "
            f"queue_aware={self.queue_aware}, pareto={self.pareto})"
        )
