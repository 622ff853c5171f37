"""Simulator: hand-computed runs, an independent reference simulator, determinism, failures and actuation delay."""

import bisect
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_strategies import profiles

from scheduling import (
    Decision,
    Fixed,
    InvalidRequestError,
    LatencyStats,
    MaxAcc,
    MaxBatch,
    MinCost,
    Policy,
    Profile,
    SimConfig,
    SlackFit,
    Subnet,
    datasets,
    simulate,
    traces,
)


def _one_subnet() -> Profile:
    return Profile((Subnet("s", 75.0, {1: LatencyStats(0.010), 2: LatencyStats(0.015)}),))


def test_hand_computed_run():
    # r0 runs alone [0, 10 ms); r1+r2 run as a batch of 2 [10, 25 ms); r3 (deadline 33 ms) then has 8 ms of slack,
    # below the 10 ms single-request latency, so the drop rule completes it as missed.
    arrivals = [0.0, 0.001, 0.002, 0.003]
    r = simulate(Fixed(_one_subnet(), "s"), arrivals, SimConfig(slo_s=0.030, record_timeline=True))
    s = r.summary
    assert (s.total, s.on_time, s.late, s.dropped, s.failed) == (4, 3, 0, 1, 0)
    assert s.slo_attainment == 0.75 and s.mean_accuracy == 75.0
    assert [(d.time, d.batch_size, d.queue_len) for d in r.decisions] == [(0.0, 1, 1), (0.010, 2, 3)]
    assert s.latency_max_s == pytest.approx(0.024)
    assert r.end_time == pytest.approx(0.025)
    # Serve-late instead: r3 runs [25, 35 ms) and finishes 2 ms late.
    r = simulate(Fixed(_one_subnet(), "s"), arrivals, SimConfig(slo_s=0.030, drop_late=False))
    assert (r.summary.on_time, r.summary.late, r.summary.dropped) == (3, 1, 0)
    assert r.summary.latency_max_s == pytest.approx(0.032)


class _Alternate(Policy):
    """Test policy: one request at a time, alternating between two subnets."""

    def __init__(self, profile):
        super().__init__(profile)
        self.reset()

    def reset(self):
        self.n = 0

    def decide(self, slack_s, queue_len, now):
        self.n += 1
        sid = ("a", "b")[self.n % 2]
        lat = self.profile.latency(sid, 1)
        return Decision(sid, 1, 1, lat, self.profile.subnet(sid).accuracy, lat <= slack_s)

    def min_latency(self, queue_len):
        return 0.0


def test_actuation_delay_is_paid_per_switch():
    p = Profile((Subnet("a", 70.0, {1: LatencyStats(0.002)}), Subnet("b", 80.0, {1: LatencyStats(0.003)})))
    arrivals = [0.0, 0.0, 0.0]
    # Batches b, a, b back to back: 3 + (5 + 2) + (5 + 3) ms; the first batch pays no delay.
    r = simulate(_Alternate(p), arrivals, SimConfig(slo_s=1.0, actuation_delay_s=0.005))
    assert r.end_time == pytest.approx(0.018)
    assert simulate(_Alternate(p), arrivals, SimConfig(slo_s=1.0)).end_time == pytest.approx(0.008)


def test_worker_failure_fails_the_running_batch_and_strands_nothing():
    r = simulate(Fixed(_one_subnet(), "s"), [0.0, 0.020], SimConfig(slo_s=0.5, worker_failures=[0.005]))
    s = r.summary
    assert (s.total, s.failed, s.on_time) == (2, 2, 0)  # the running batch fails; the later request has no worker
    arrivals = traces.bursty(1000, 1000, cv2=2, duration_s=2.0, seed=3)
    cfg = SimConfig(slo_s=0.036, num_workers=3, worker_failures=[0.5, 1.0], record_timeline=True)
    r = simulate(SlackFit(datasets.superserve_a40_profile()), arrivals, cfg)
    assert r.summary.total == len(arrivals)
    assert {d.worker for d in r.decisions if d.time > 1.0} == {0}  # workers 2 then 1 were killed


class _WaitForTwo(Policy):
    """Test policy that waits until two requests are queued."""

    def decide(self, slack_s, queue_len, now):
        if queue_len < 2:
            return None
        return Decision("s", 2, 2, 0.015, 75.0, 0.015 <= slack_s)

    def min_latency(self, queue_len):
        return 0.010


def test_waiting_policy_is_woken_and_drop_rule_still_applies():
    r = simulate(_WaitForTwo(_one_subnet()), [0.0, 0.005], SimConfig(slo_s=0.030))
    assert (r.summary.on_time, r.summary.dropped) == (2, 0)
    r = simulate(_WaitForTwo(_one_subnet()), [0.0, 0.5], SimConfig(slo_s=0.030))
    assert (r.summary.on_time, r.summary.dropped) == (0, 2)  # each dropped ~20 ms after arriving


def _reference(policy, arrivals, slo, num_workers, drop_late):
    """Independent event loop: sorted list as queue, dict of busy workers, same tie rules (completions first)."""
    policy.reset()
    queue, busy = [], {}
    out = {"on_time": 0, "late": 0, "dropped": 0, "lat": [], "acc": 0.0}

    def dispatch(t):
        while len(busy) < num_workers and queue:
            if drop_late:
                while queue and queue[0][0] - t < policy.min_latency(len(queue)):
                    queue.pop(0)
                    out["dropped"] += 1
                if not queue:
                    return
            d = policy.decide(queue[0][0] - t, len(queue), t)
            w = min(set(range(num_workers)) - set(busy))
            batch, queue[:] = queue[: d.batch_size], queue[d.batch_size :]
            busy[w] = (t + policy.profile.latency(d.subnet_id, d.profile_batch), batch, d.accuracy)

    def complete_until(t):
        while busy:
            td, w = min((v[0], w) for w, v in busy.items())
            if td > t:
                return
            _, batch, acc = busy.pop(w)
            for dl, _, a in batch:
                ok = dl >= td
                out["on_time" if ok else "late"] += 1
                out["acc"] += acc if ok else 0.0
                out["lat"].append(td - a)
            dispatch(td)

    for i, a in enumerate(arrivals):
        complete_until(a)
        bisect.insort(queue, (a + slo, i, a))
        policy.observe_arrivals(a)
        dispatch(a)
    complete_until(math.inf)
    return out


@settings(max_examples=60, deadline=None)
@given(
    profiles(max_subnets=4),
    st.lists(st.integers(0, 400), max_size=80).map(lambda xs: sorted(x * 1e-3 for x in xs)),
    st.integers(1, 3),
    st.booleans(),
    st.sampled_from(["slackfit", "maxacc", "maxbatch", "mincost"]),
    st.integers(5, 80),
)
def test_matches_reference_simulator(profile, arrivals, workers, drop_late, name, slo_ms):
    policy = {"slackfit": SlackFit, "maxacc": MaxAcc, "maxbatch": MaxBatch, "mincost": MinCost}[name](profile)
    slo = slo_ms * 1e-3
    r = simulate(
        policy, arrivals, SimConfig(slo_s=slo, num_workers=workers, drop_late=drop_late, record_timeline=True)
    )
    ref = _reference(policy, arrivals, slo, workers, drop_late)
    s = r.summary
    assert (s.on_time, s.late, s.dropped, s.failed) == (ref["on_time"], ref["late"], ref["dropped"], 0)
    assert s.total == len(arrivals)  # exactly once
    lat = sorted(ref["lat"])
    if lat:
        assert s.latency_max_s == lat[-1]
        assert s.latency_p50_s == lat[math.ceil(0.5 * len(lat)) - 1]  # nearest rank
    else:
        assert math.isnan(s.latency_max_s)
    if s.on_time:
        assert s.mean_accuracy == pytest.approx(ref["acc"] / ref["on_time"])
    # Batch bounds in the timeline.
    assert all(1 <= d.batch_size <= min(d.queue_len, max(profile.batch_sizes)) for d in r.decisions)
    assert sum(d.batch_size for d in r.decisions) == s.on_time + s.late
    # Determinism: same inputs and seed, with latency noise and a worker failure, give the identical run.
    noisy = SimConfig(
        slo_s=slo, num_workers=workers, drop_late=drop_late, latency_noise="lognormal", seed=len(arrivals),
        worker_failures=[0.2], record_timeline=True,
    )  # fmt: skip
    a, b = simulate(policy, arrivals, noisy), simulate(policy, arrivals, noisy)
    assert (a.summary, a.decisions, a.outcomes, a.end_time) == (b.summary, b.decisions, b.outcomes, b.end_time)
    assert a.summary.total == len(arrivals)


def test_deterministic_with_noise_and_seed_sensitive():
    p = datasets.superserve_a40_profile()
    arrivals = traces.bursty(1500, 4900, cv2=4, duration_s=1.0, seed=7)
    cfg = SimConfig(slo_s=0.036, num_workers=4, latency_noise="lognormal", seed=1, record_timeline=True)
    a = simulate(SlackFit(p), arrivals, cfg)
    b = simulate(SlackFit(p), arrivals, cfg)
    assert a.summary == b.summary and a.decisions == b.decisions and a.outcomes == b.outcomes
    c = simulate(SlackFit(p), arrivals, SimConfig(slo_s=0.036, num_workers=4, latency_noise="lognormal", seed=2))
    assert c.summary.latency_p50_s != a.summary.latency_p50_s
    gear = simulate(MinCost(p), arrivals, SimConfig(slo_s=0.036, num_workers=4))
    assert gear.summary.mean_accuracy == pytest.approx(p.subnet(0).accuracy)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"slo_s": 0.0}, "slo_s must be a finite number of seconds > 0, got 0.0"),
        ({"slo_s": math.nan}, "slo_s must be a finite number of seconds > 0, got nan"),
        ({"slo_s": 0.03, "num_workers": 0}, "num_workers must be an int >= 1, got 0"),
        ({"slo_s": 0.03, "latency_noise": "gauss"}, "latency_noise must be 'none' or 'lognormal'"),
        ({"slo_s": 0.03, "actuation_delay_s": -1}, "actuation_delay_s must be a finite number >= 0"),
        ({"slo_s": 0.03, "worker_failures": [math.nan]}, "worker_failures must be finite times"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(InvalidRequestError, match=match):
        SimConfig(**kwargs)


def test_bad_arrivals():
    p = _one_subnet()
    with pytest.raises(InvalidRequestError, match=r"arrivals must be finite and sorted ascending; arrivals\[1\]=0.0"):
        simulate(Fixed(p, "s"), [0.1, 0.0], SimConfig(slo_s=0.1))
    with pytest.raises(InvalidRequestError, match="arrivals must be finite"):
        simulate(Fixed(p, "s"), [0.0, math.nan], SimConfig(slo_s=0.1))
