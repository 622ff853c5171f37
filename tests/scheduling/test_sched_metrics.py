"""Per-subnet served shares (system dynamics): hand-computed records and a simulator run."""

import pytest

from scheduling import Fixed, InvalidRequestError, SimConfig, SlackFit, datasets, simulate, traces
from scheduling.metrics import DecisionRecord, subnet_share_series, subnet_shares


def _d(t, sid, n):
    return DecisionRecord(time=t, worker=0, subnet_id=sid, batch_size=n, queue_len=n, latency_s=0.01)


def test_shares_count_requests_not_batches():
    # 1 batch of 6 on "a", 3 batches of 2 on "b": 6 requests each, so an even split though "b" ran 3x as often.
    ds = [_d(0.0, "a", 6), _d(0.1, "b", 2), _d(0.2, "b", 2), _d(1.4, "b", 2)]
    assert subnet_shares(ds) == {"a": 0.5, "b": 0.5}
    assert subnet_shares([]) == {}
    # Bins of 1 s: [0, 1) holds a:6, b:4; [1, 2) holds b:2.
    assert subnet_share_series(ds, 1.0) == [(0.0, {"a": 0.6, "b": 0.4}), (1.0, {"b": 1.0})]


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "1"])
def test_share_series_rejects_bad_bin(bad):
    with pytest.raises(InvalidRequestError, match="bin_s"):
        subnet_share_series([_d(0.0, "a", 1)], bad)


def test_shares_of_a_simulated_run_match_its_summary():
    profile = datasets.superserve_a40_profile()
    arrivals = traces.bursty(1500, 5500, cv2=2, duration_s=3.0, seed=1)
    r = simulate(Fixed(profile, 3), arrivals, SimConfig(slo_s=0.036, num_workers=8, record_timeline=True))
    assert subnet_shares(r.decisions) == {3: 1.0}
    # Nothing is dropped at this load, so every request was dispatched, and the share-weighted accuracy of the
    # dispatched requests is the summary's mean served accuracy (an independent path: OutcomeRecords).
    r = simulate(SlackFit(profile), arrivals, SimConfig(slo_s=0.036, num_workers=8, record_timeline=True))
    s = r.summary
    assert s.dropped == s.failed == s.late == 0
    shares = subnet_shares(r.decisions)
    acc = {x.id: x.accuracy for x in profile.subnets}
    assert sum(shares.values()) == pytest.approx(1.0)
    assert sum(acc[k] * v for k, v in shares.items()) == pytest.approx(s.mean_accuracy, abs=1e-9)
    series = subnet_share_series(r.decisions, 0.5)
    assert [t for t, _ in series] == sorted({int(d.time // 0.5) * 0.5 for d in r.decisions})
