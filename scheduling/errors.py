"""Exception and warning types raised by :mod:`scheduling`.

Every error subclasses :class:`SchedulingError` *and* the builtin a caller would catch (``ValueError`` for bad
input, ``KeyError`` for an unknown subnet, ``RuntimeError`` for a closed scheduler, ``TimeoutError`` for a missed
deadline), so ``except ValueError`` keeps working for code that does not know this package.
"""

from __future__ import annotations

__all__ = [
    "DeadlineMissedError",
    "InvalidProfileError",
    "InvalidRequestError",
    "NoWorkersError",
    "ProfilePropertyWarning",
    "QueueFullError",
    "SchedulerClosedError",
    "SchedulingError",
    "UnknownSubnetError",
    "WorkerFailedError",
    "WorkerResultError",
]


class SchedulingError(Exception):
    """Base class of every error raised by :mod:`scheduling`."""


class InvalidProfileError(SchedulingError, ValueError):
    """A latency/accuracy profile (or its file) is malformed: empty, duplicate ids, non-finite values, ..."""


class UnknownSubnetError(SchedulingError, KeyError):
    """A subnet id that the profile does not contain."""

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the whole message and wrap it in quotes.
        return str(self.args[0]) if self.args else ""


class InvalidRequestError(SchedulingError, ValueError):
    """A request or call argument is invalid (negative or NaN SLO, both ``slo_s`` and ``deadline``, ...)."""


class QueueFullError(SchedulingError, RuntimeError):
    """The request was rejected because the scheduler's bounded queue is full."""


class SchedulerClosedError(SchedulingError, RuntimeError):
    """The scheduler is closed: no new requests or workers are accepted."""


class NoWorkersError(SchedulingError, RuntimeError):
    """The request cannot be served because the scheduler has no live worker."""


class DeadlineMissedError(SchedulingError, TimeoutError):
    """The request was dropped because its remaining slack was below the fastest latency the policy could run."""


class WorkerFailedError(SchedulingError, RuntimeError):
    """Raise this from a worker callable to say the worker itself is gone (e.g. its GPU was lost).

    The scheduler fails the batch that was running with this exception and retires the worker; the other workers carry
    on. Any other exception only fails the batch.
    """


class WorkerResultError(SchedulingError, ValueError):
    """A worker callable returned something that is not one result per payload."""


class ProfilePropertyWarning(UserWarning):
    """The profile violates property P1 (latency grows with batch size) or P2 (latency grows with accuracy).

    The policies stay correct on such profiles (they check each candidate's own latency); the warning is there so
    that a surprising profile does not go unnoticed.
    """
