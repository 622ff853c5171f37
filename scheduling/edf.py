"""The earliest-deadline-first queue shared by the live scheduler and the simulator.

Entries are :class:`Entry` named tuples ``(deadline, seq, arrival, item)``: one object per request, compared as tuples
by deadline and then by the insertion counter ``seq`` (so equal deadlines pop in arrival order and ``item`` is never
compared).
"""

from __future__ import annotations

import heapq
import math
from typing import Any, NamedTuple

from .errors import InvalidRequestError, QueueFullError

__all__ = ["EDFQueue", "Entry"]


class Entry(NamedTuple):
    """A queued request. Compared as a plain tuple: by ``deadline``, then ``seq``.

    Attributes:
        deadline: The request's absolute deadline, on the clock of the queue's user.
        seq: Insertion counter of the queue: equal deadlines pop in arrival order, ``item`` is never compared.
        arrival: When the request arrived (same clock).
        item: The caller's object (the live scheduler stores ``(future, payload)``).
    """

    deadline: float
    seq: int
    arrival: float
    item: Any


# push() runs once per request: build entries through tuple.__new__ (what Entry._make does, minus the Python-level
# __new__ of NamedTuple); the result is a real Entry with its named fields.
_new_entry = tuple.__new__


class EDFQueue:
    """A binary-heap EDF queue with an optional capacity and a drop rule.

    Args:
        capacity: Maximum number of queued requests; ``None`` (default) means unbounded. :meth:`push` raises
            :class:`~scheduling.errors.QueueFullError` when full.
        drop_late: The drop rule. If ``True`` (default), :meth:`expire` removes requests whose remaining slack is below
            the given threshold (the fastest latency the policy could run), so they complete as "deadline missed"
            instead of occupying a worker. If ``False``, :meth:`expire` removes nothing and such requests are served
            late.

    Example::

        >>> q = EDFQueue()
        >>> q.push(deadline=0.030, arrival=0.0, item="a"); q.push(deadline=0.010, arrival=0.001, item="b")
        >>> [e.item for e in q.pop_batch(2)]
        ['b', 'a']
    """

    __slots__ = ("_heap", "_seq", "capacity", "drop_late")

    def __init__(self, *, capacity: int | None = None, drop_late: bool = True) -> None:
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
            raise InvalidRequestError(f"capacity must be None or an int >= 1, got {capacity!r}")
        self.capacity = capacity
        self.drop_late = bool(drop_late)
        self._heap: list[Entry] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def push(self, deadline: float, arrival: float, item: Any = None) -> None:
        """Queue a request.

        Raises:
            InvalidRequestError: ``deadline`` is NaN or infinite.
            QueueFullError: the queue holds ``capacity`` requests; the queue is unchanged.
        """
        if not math.isfinite(deadline):
            raise InvalidRequestError(f"deadline must be a finite number of seconds, got {deadline!r}")
        if self.capacity is not None and len(self._heap) >= self.capacity:
            raise QueueFullError(f"queue is full (capacity={self.capacity}); request rejected")
        self._seq += 1
        heapq.heappush(self._heap, _new_entry(Entry, (deadline, self._seq, arrival, item)))

    def peek_deadline(self) -> float:
        """Deadline of the earliest-deadline request, ``inf`` when empty. O(1)."""
        return self._heap[0].deadline if self._heap else math.inf

    def pop_batch(self, n: int) -> list[Entry]:
        """Remove and return the ``min(n, len(self))`` earliest-deadline entries, in deadline order."""
        heap = self._heap
        if n >= len(heap):
            heap.sort()
            out = heap[:]
            heap.clear()
            return out
        pop = heapq.heappop
        return [pop(heap) for _ in range(n)]

    def expire(self, now: float, min_latency: float) -> list[Entry]:
        """Apply the drop rule: remove the requests with ``deadline - now < min_latency``.

        Returns the removed entries (earliest deadline first); always empty when ``drop_late`` is ``False``.
        """
        heap = self._heap
        if not self.drop_late or not heap or heap[0].deadline - now >= min_latency:
            return []
        out = []
        pop = heapq.heappop
        while heap and heap[0].deadline - now < min_latency:
            out.append(pop(heap))
        return out

    def pop_due(self, t: float) -> list[Entry]:
        """Remove and return the entries with ``deadline < t`` (earliest first), whatever ``drop_late`` says: the
        live scheduler's hard limit for requests that may be served late."""
        heap = self._heap
        out = []
        pop = heapq.heappop
        while heap and heap[0].deadline < t:
            out.append(pop(heap))
        return out

    def restore(self, entries: list[Entry]) -> None:
        """Put back entries taken from this queue (keeping their order keys), e.g. when the step that took them
        failed. Never exceeds the capacity: they were in the queue a moment ago."""
        for e in entries:
            heapq.heappush(self._heap, e)

    def drain(self) -> list[Entry]:
        """Remove and return every entry, in deadline order."""
        return self.pop_batch(len(self._heap))
