"""Traces: rates, burstiness, shapes and seeding (all seeded, so the statistical checks are deterministic)."""

import math
import statistics

import pytest

from scheduling import InvalidRequestError, datasets, traces


def _cv2(arrivals):
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    m = statistics.fmean(gaps)
    return statistics.pvariance(gaps) / (m * m)


@pytest.mark.parametrize("cv2", [0.0, 1.0, 4.0])
def test_gamma_arrivals_rate_and_cv2(cv2):
    arr = traces.gamma_arrivals(2000.0, cv2, 20.0, seed=11)
    assert arr == sorted(arr) and 0.0 <= arr[0] and arr[-1] < 20.0
    assert len(arr) / 20.0 == pytest.approx(2000.0, rel=0.05 if cv2 else 1e-3)
    assert _cv2(arr) == pytest.approx(cv2, abs=0.3 * cv2 + 1e-9)


def test_bursty_is_base_plus_variant_and_seeded():
    arr = traces.bursty(1500, 4900, cv2=8, duration_s=10.0, seed=5)
    assert arr == sorted(arr)
    assert len(arr) / 10.0 == pytest.approx(6400, rel=0.1)
    assert arr == traces.bursty(1500, 4900, cv2=8, duration_s=10.0, seed=5)
    assert arr != traces.bursty(1500, 4900, cv2=8, duration_s=10.0, seed=6)
    # The constant-rate base stream is embedded exactly: one arrival every 1/1500 s starting at half a gap.
    base = traces.gamma_arrivals(1500, 0.0, 10.0)
    assert set(base) <= set(arr) and len(base) == 15000
    # Burstier variant streams have a larger inter-arrival CV^2.
    calm = traces.bursty(1500, 4900, cv2=2, duration_s=10.0, seed=5)
    assert _cv2(arr) > _cv2(calm)


def test_time_varying_follows_the_ramp():
    arr = traces.time_varying(2500, 6500, accel=1000, cv2=1.0, duration_s=10.0, ramp_start_s=2.0, seed=1)
    # Expected rate: 2500 until t=2, +1000/s until t=6 (6500), then flat.

    def expected(a, b):  # integral of the rate over [a, b)
        def cum(t):
            if t <= 2:
                return 2500 * t
            if t <= 6:
                return 5000 + 2500 * (t - 2) + 500 * (t - 2) ** 2
            return 5000 + 10000 + 8000 + 6500 * (t - 6)

        return cum(b) - cum(a)

    for a, b in [(0, 2), (2, 4), (4, 6), (6, 10)]:
        got = sum(1 for t in arr if a <= t < b)
        assert got == pytest.approx(expected(a, b), rel=0.05), (a, b)
    down = traces.time_varying(6000, 1000, accel=5000, cv2=0.0, duration_s=3.0, seed=0)
    assert len(down) == pytest.approx(0.5 * (6000 + 1000) * 1.0 + 1000 * 2.0, abs=2)


def test_maf_compression_preserves_shape_and_mean():
    counts = datasets.maf_per_minute()
    assert len(counts) == 1440 and min(counts) == 8563 and max(counts) == 26745
    arr = traces.maf(counts, duration_s=144.0, mean_rate=2000.0, seed=2)  # one minute -> 0.1 s
    assert len(arr) / 144.0 == pytest.approx(2000.0, rel=0.01)
    # Per compressed minute, the count follows the real per-minute totals (expected count = c * scale * 0.1 s).
    got = [0] * 1440
    for t in arr:
        got[int(t / 0.1)] += 1
    scale = 2000.0 * 1440 / sum(counts) * 0.1
    exp = [c * scale for c in counts]
    corr = statistics.correlation(got, exp)
    assert corr > 0.9
    hour = [sum(got[i : i + 60]) for i in range(0, 1440, 60)]
    hour_exp = [sum(exp[i : i + 60]) for i in range(0, 1440, 60)]
    assert all(abs(h - e) < 0.05 * e for h, e in zip(hour, hour_exp, strict=True))
    window = traces.maf(counts, duration_s=10.0, mean_rate=1000.0, minutes=(900, 960), seed=0)
    assert len(window) / 10.0 == pytest.approx(1000.0, rel=0.05)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: traces.gamma_arrivals(-1, 1, 1), "rate must be a finite number >= 0.0, got -1"),
        (lambda: traces.gamma_arrivals(10, math.nan, 1), "cv2 must be a finite number >= 0.0, got nan"),
        (lambda: traces.time_varying(1, 2, accel=0, cv2=1, duration_s=1), "accel must be a finite number > 0.0"),
        (lambda: traces.maf([], duration_s=1, mean_rate=1), "at least one count"),
        (lambda: traces.maf([1, 2], duration_s=1, mean_rate=1, minutes=(1, 5)), "minutes must be"),
        (lambda: traces.piecewise_rate([0, 0], [1, 1], cv2=1), "strictly increasing"),
    ],
)
def test_bad_trace_arguments(call, match):
    with pytest.raises(InvalidRequestError, match=match):
        call()
