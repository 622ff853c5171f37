"""The demo's load and SLO derived from a profile: hand-computed on small profiles."""

import pytest

from scheduling import LatencyStats, Profile, Subnet
from subnetact.demo_load import LIVE_EFFICIENCY, SLO_FLOOR_S, capacity_within_slo, derive_load

MS = 1e-3


def _profile(top_ms: dict, low_ms: dict, scale: float = 1.0) -> Profile:
    """Two subnets, p99 = 1.5 x mean; latencies in ms, times ``scale``."""

    def lat(ms):
        return {b: LatencyStats(m * scale * MS, p99_s=1.5 * m * scale * MS) for b, m in ms.items()}

    return Profile((Subnet("low", 90.0, lat(low_ms)), Subnet("top", 99.0, lat(top_ms))))


TOP = {1: 4.0, 4: 8.0, 16: 20.0, 32: 40.0}
LOW = {1: 2.0, 4: 3.0, 16: 6.0, 32: 10.0}


def test_slo_from_the_top_subnet_and_rate_from_both_capacities():
    d = derive_load(_profile(TOP, LOW))
    # SLO = 2 x p99(top, 16) = 2 x 30 ms = 60 ms (above the floor).
    assert d.slo_s == pytest.approx(0.060) and not d.slo_given
    # top: p99 <= 30 ms at batches 1, 4, 16 -> best 16 / 20 ms = 800 req/s; low: all fit -> 32 / 10 ms = 3200 req/s.
    assert (d.top_id, d.top_batch, d.low_id, d.low_batch) == ("top", 16, "low", 32)
    assert d.top_capacity == pytest.approx(800) and d.low_capacity == pytest.approx(3200)
    assert d.rate == pytest.approx(LIVE_EFFICIENCY * min(0.8 * 800, 0.5 * 3200)) and not d.narrow
    assert "SLO 60.0 ms = max(50 ms, 2 x 30.00 ms" in d.describe()
    # Two workers double both capacities and the rate; the SLO does not change.
    d2 = derive_load(_profile(TOP, LOW), workers=2)
    assert d2.slo_s == d.slo_s and d2.rate == pytest.approx(2 * d.rate)


def test_floor_and_mean_planning():
    # 10x faster: 2 x p99(top, 16) = 6 ms, so the floor sets the SLO and batch 32 fits for both subnets.
    d = derive_load(_profile(TOP, LOW, scale=0.1))
    assert d.slo_s == SLO_FLOOR_S == 0.050 and d.top_batch == d.low_batch == 32
    assert d.rate == pytest.approx(LIVE_EFFICIENCY * min(0.8 * 32 / 0.004, 0.5 * 32 / 0.001))
    # Planning with the mean: SLO = max(50, 2 x 20) = 50 ms; top batch 32 (40 ms) does not fit twice.
    d = derive_load(_profile(TOP, LOW), latency_stat="mean")
    assert d.slo_s == SLO_FLOOR_S and d.top_batch == 16 and d.top_capacity == pytest.approx(800)


def test_given_slo_derives_only_the_rate():
    d = derive_load(_profile(TOP, LOW), slo_s=0.024)
    # p99 <= 12 ms: top at batches 1 and 4 -> 4 / 8 ms = 500 req/s; low up to 16 -> 16 / 6 ms = 2667 req/s.
    assert d.slo_given and d.slo_s == 0.024 and (d.top_batch, d.low_batch) == (4, 16)
    assert d.rate == pytest.approx(LIVE_EFFICIENCY * 400.0)
    assert "SLO 24.0 ms;" in d.describe()


def test_narrow_served_set_is_flagged():
    # low only 1.2x faster than top: half its capacity is below 0.8 x top's, so it bounds the rate.
    low = {b: m / 1.2 for b, m in TOP.items()}
    d = derive_load(_profile(TOP, low))
    assert d.narrow and d.rate == pytest.approx(LIVE_EFFICIENCY * 0.5 * d.low_capacity)
    assert "little trade-off" in d.describe()


def test_capacity_none_fits():
    assert capacity_within_slo(_profile(TOP, LOW), "top", 0.001) == (0.0, 0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"workers": 0}, "workers=0"),
        ({"latency_stat": "p50"}, "latency_stat='p50'"),
        ({"slo_s": -1.0}, "slo_s=-1.0"),
        ({"slo_s": 0.001}, "fits twice in the SLO of 1.0 ms"),
    ],
)
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        derive_load(_profile(TOP, LOW), **kwargs)
