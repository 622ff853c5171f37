"""Seeded arrival traces (sorted arrival times in seconds): gamma, bursty, time-varying, and the Azure Functions trace.

Inter-arrival times with squared coefficient of variation ``cv2`` are gamma distributed with shape ``1 / cv2``
(``cv2 = 1`` is Poisson, ``cv2 = 0`` is a constant rate). Time-varying and MAF traces use the time-rescaling theorem:
a unit-rate gamma renewal process is mapped through the inverse of the cumulative rate, so the rate follows the
requested shape exactly while the burstiness stays ``cv2``.
"""

from __future__ import annotations

import heapq
import math
import random
from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import pairwise

from .errors import InvalidRequestError

__all__ = ["bursty", "gamma_arrivals", "maf", "piecewise_rate", "time_varying"]


def _num(name: str, value: float, *, minimum: float = 0.0, strict: bool = False) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if ok:
        ok = value > minimum if strict else value >= minimum
    if not ok:
        rel = ">" if strict else ">="
        raise InvalidRequestError(f"{name} must be a finite number {rel} {minimum}, got {value!r}")
    return float(value)


def _unit_renewal(rng: random.Random, cv2: float) -> Callable[[], float]:
    """Sampler of unit-mean inter-arrival gaps with squared coefficient of variation ``cv2``."""
    if cv2 == 0.0:
        return lambda: 1.0
    shape = 1.0 / cv2
    gamma = rng.gammavariate
    return lambda: gamma(shape, cv2)


def gamma_arrivals(rate: float, cv2: float, duration_s: float, *, seed: int = 0, start_s: float = 0.0) -> list[float]:
    """A stationary renewal process with mean rate ``rate`` (req/s) and gamma inter-arrivals of the given ``cv2``.

    Args:
        rate: Mean arrival rate in requests per second (0 gives an empty trace).
        cv2: Squared coefficient of variation of the inter-arrival times (0: constant gaps).
        duration_s: Arrivals are generated in ``[start_s, start_s + duration_s)``.
        seed: Random seed.
        start_s: Time of the first possible arrival.
    """
    rate = _num("rate", rate)
    cv2 = _num("cv2", cv2)
    duration_s = _num("duration_s", duration_s)
    if rate == 0.0:
        return []
    rng = random.Random(seed)
    gap = _unit_renewal(rng, cv2)
    end = start_s + duration_s
    # Start in equilibrium-ish: a constant-rate stream starts half a gap in, a random one after one random gap.
    t = start_s + (0.5 / rate if cv2 == 0.0 else gap() / rate)
    out = []
    while t < end:
        out.append(t)
        t += gap() / rate
    return out


def bursty(base_rate: float, variant_rate: float, *, cv2: float, duration_s: float, seed: int = 0) -> list[float]:
    """The paper's bursty trace: a constant-rate base stream plus a gamma stream of the given burstiness.

    Args:
        base_rate: λ_b, the base stream's rate (req/s), with CV² = 0.
        variant_rate: λ_v, the variant stream's mean rate (req/s).
        cv2: CV² of the variant stream's inter-arrival times.
        duration_s: Trace length in seconds.
        seed: Random seed.

    Example::

        >>> arr = bursty(1500, 4900, cv2=4, duration_s=10.0, seed=1)
        >>> round(len(arr) / 10.0, -2)
        6400.0
    """
    base = gamma_arrivals(base_rate, 0.0, duration_s, seed=seed)
    variant = gamma_arrivals(variant_rate, cv2, duration_s, seed=seed + 1_000_003)
    return list(heapq.merge(base, variant))


def piecewise_rate(
    knots_s: Sequence[float], rates: Sequence[float], *, cv2: float, seed: int = 0, end_s: float | None = None
) -> list[float]:
    """Arrivals whose rate is piecewise *linear* through ``(knots_s[i], rates[i])`` (constant after the last knot).

    Args:
        knots_s: Strictly increasing times, starting at the trace start.
        rates: Rates (req/s, >= 0) at the knots.
        cv2: Burstiness of the underlying renewal process.
        seed: Random seed.
        end_s: End of the trace; default the last knot.
    """
    if len(knots_s) != len(rates) or not knots_s:
        raise InvalidRequestError(
            f"knots_s and rates must be non-empty and of equal length, got {len(knots_s)} and {len(rates)}"
        )
    ks = [_num(f"knots_s[{i}]", k, minimum=-math.inf) for i, k in enumerate(knots_s)]
    rs = [_num(f"rates[{i}]", r) for i, r in enumerate(rates)]
    if any(b <= a for a, b in pairwise(ks)):
        raise InvalidRequestError(f"knots_s must be strictly increasing, got {list(knots_s)!r}")
    cv2 = _num("cv2", cv2)
    end = ks[-1] if end_s is None else _num("end_s", end_s, minimum=-math.inf)
    if end > ks[-1]:
        ks.append(end)
        rs.append(rs[-1])
    # Cumulative intensity at each knot.
    cum = [0.0]
    for j in range(len(ks) - 1):
        cum.append(cum[-1] + 0.5 * (rs[j] + rs[j + 1]) * (ks[j + 1] - ks[j]))
    rng = random.Random(seed)
    gap = _unit_renewal(rng, cv2)
    y = 0.5 if cv2 == 0.0 else gap()
    out = []
    while True:
        j = bisect_right(cum, y) - 1
        if j >= len(ks) - 1:
            break
        # Invert the cumulative intensity inside segment j: r0*u + a*u^2/2 = y - cum[j].
        r0, a, rem = rs[j], (rs[j + 1] - rs[j]) / (ks[j + 1] - ks[j]), y - cum[j]
        if abs(a) < 1e-12:
            u = rem / r0
        else:
            u = (-r0 + math.sqrt(max(r0 * r0 + 2.0 * a * rem, 0.0))) / a
        t = ks[j] + u
        if t >= end:
            break
        out.append(t)
        y += gap()
    return out


def time_varying(
    rate1: float,
    rate2: float,
    *,
    accel: float,
    cv2: float,
    duration_s: float,
    ramp_start_s: float = 0.0,
    seed: int = 0,
) -> list[float]:
    """The paper's time-varying trace: the mean rate moves from ``rate1`` to ``rate2`` at ``accel`` req/s².

    The rate is ``rate1`` until ``ramp_start_s``, changes linearly at ``accel`` (req/s per second) until it reaches
    ``rate2``, and stays there until ``duration_s``.

    Args:
        rate1: λ1, the initial rate (req/s).
        rate2: λ2, the final rate (req/s).
        accel: τ, the magnitude of the rate change per second (> 0).
        cv2: Burstiness (CV² of inter-arrival times).
        duration_s: Trace length in seconds.
        ramp_start_s: When the ramp starts.
        seed: Random seed.
    """
    rate1, rate2 = _num("rate1", rate1), _num("rate2", rate2)
    accel = _num("accel", accel, strict=True)
    duration_s = _num("duration_s", duration_s, strict=True)
    ramp_start_s = _num("ramp_start_s", ramp_start_s)
    ramp_end = ramp_start_s + abs(rate2 - rate1) / accel
    knots, rates = [0.0], [rate1]
    if ramp_start_s > 0:
        knots.append(ramp_start_s)
        rates.append(rate1)
    if ramp_end > ramp_start_s:
        knots.append(ramp_end)
        rates.append(rate2)
    arrivals = piecewise_rate(knots, rates, cv2=cv2, seed=seed, end_s=max(duration_s, knots[-1]))
    return [t for t in arrivals if t < duration_s]


def maf(
    per_minute: Sequence[float],
    *,
    duration_s: float,
    mean_rate: float,
    cv2: float = 1.0,
    seed: int = 0,
    minutes: tuple[int, int] | None = None,
) -> list[float]:
    """An Azure Functions (MAF) trace: per-minute invocation totals compressed to ``duration_s`` seconds.

    The selected minutes are laid end to end, each taking ``duration_s / n_minutes`` seconds, with the rate piecewise
    constant and proportional to the minute's count (shape-preserving), scaled so that the mean rate is ``mean_rate``.
    Within a minute arrivals form a gamma renewal process of the given ``cv2`` (1 = Poisson).

    Args:
        per_minute: Invocations per minute, e.g. :func:`scheduling.datasets.maf_per_minute` (1440 values).
        duration_s: Length of the compressed trace (the paper: 24 h -> 120 s).
        mean_rate: Mean arrival rate of the result in req/s (the paper: 6400 for CNNs).
        cv2: Burstiness inside each compressed minute.
        seed: Random seed.
        minutes: Optional ``(first, last_exclusive)`` slice of ``per_minute`` (0-based) to use.

    Example::

        >>> from scheduling import datasets
        >>> arr = maf(datasets.maf_per_minute(), duration_s=120.0, mean_rate=6400.0, seed=0)
        >>> round(len(arr) / 120.0, -2)
        6400.0
    """
    counts = list(per_minute)
    if minutes is not None:
        a, b = minutes
        if not (isinstance(a, int) and isinstance(b, int) and 0 <= a < b <= len(counts)):
            raise InvalidRequestError(
                f"minutes must be (first, last) with 0 <= first < last <= {len(counts)}, got {minutes!r}"
            )
        counts = counts[a:b]
    if not counts:
        raise InvalidRequestError("per_minute must hold at least one count, got an empty sequence")
    for i, c in enumerate(counts):
        _num(f"per_minute[{i}]", c)
    duration_s = _num("duration_s", duration_s, strict=True)
    mean_rate = _num("mean_rate", mean_rate)
    total = sum(counts)
    if total == 0:
        return []
    seg = duration_s / len(counts)
    scale = mean_rate * len(counts) / total  # rate = count * scale keeps the mean at mean_rate
    # Piecewise-constant rate as a piecewise-linear one with a tiny jump between segments.
    knots, rates = [], []
    for j, c in enumerate(counts):
        knots += [j * seg, (j + 1) * seg - seg * 1e-9]
        rates += [c * scale, c * scale]
    return piecewise_rate(knots, rates, cv2=cv2, seed=seed, end_s=duration_s)
