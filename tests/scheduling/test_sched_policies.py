"""Policies against brute-force references over random (often non-monotone) profiles, plus hand-checked cases."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_strategies import candidates, cap_for, profiles

from scheduling import (
    Fixed,
    GearPlan,
    InvalidRequestError,
    LatencyStats,
    MaxAcc,
    MaxBatch,
    MinCost,
    Profile,
    SlackFit,
    Subnet,
    UnknownSubnetError,
    datasets,
)

SETTINGS = settings(max_examples=120, deadline=None)
slacks = st.integers(-5, 90).map(lambda x: x * 1e-3)  # on the same 1 ms grid as the profiles: exact ties happen
queue_lens = st.integers(1, 40)
stats = st.sampled_from(["mean", "p99"])


def _triple(d):
    return (d.latency_s, d.profile_batch, d.accuracy)


def _check_common(profile, d, q, stat):
    """Invariants every decision must satisfy."""
    assert d is not None
    assert 1 <= d.batch_size <= q
    assert d.batch_size <= max(profile.batch_sizes)
    assert d.profile_batch in profile.subnet(d.subnet_id).latency
    assert d.batch_size <= d.profile_batch
    assert d.batch_size == min(d.profile_batch, q)
    assert d.latency_s == profile.latency(d.subnet_id, d.profile_batch, stat)
    assert d.accuracy == profile.subnet(d.subnet_id).accuracy


def _best(cands, slack, key):
    fit = [c for c in cands if c[0] <= slack]
    return max(fit, key=key) if fit else None


@SETTINGS
@given(profiles(), slacks, queue_lens, stats)
def test_maxacc_maxbatch_against_brute_force(profile, slack, q, stat):
    cands = candidates(profile, q, stat)
    for policy, key in (
        (MaxAcc(profile, latency_stat=stat), lambda c: (c[2], c[1], -c[0])),
        (MaxBatch(profile, latency_stat=stat), lambda c: (c[1], c[2], -c[0])),
    ):
        d = policy.decide(slack, q, 0.0)
        _check_common(profile, d, q, stat)
        best = _best(cands, slack, key)
        assert policy.min_latency(q) == min(c[0] for c in cands)
        if best is None:
            assert not d.fits
            assert d.latency_s == min(c[0] for c in cands)
        else:
            assert d.fits and d.latency_s <= slack
            assert _triple(d) == best[:3]


@SETTINGS
@given(profiles(), slacks, queue_lens, stats, st.data())
def test_fixed_against_brute_force(profile, slack, q, stat, data):
    sid = data.draw(st.sampled_from(profile.ids))
    policy = Fixed(profile, sid, latency_stat=stat)
    d = policy.decide(slack, q, 0.0)
    _check_common(profile, d, q, stat)
    assert d.subnet_id == sid
    cands = candidates(profile, q, stat, subnet_id=sid)
    best = _best(cands, slack, lambda c: (c[1], -c[0]))
    assert policy.min_latency(q) == min(c[0] for c in cands)
    if best is None:
        assert not d.fits and d.latency_s == min(c[0] for c in cands)
    else:
        assert d.fits and (d.latency_s, d.profile_batch) == best[:2]


def _slackfit_reference(profile, slack, q, stat, num_buckets):
    """SlackFit by brute force: Pareto filter, bucket grid, highest bucket with a fitting choice, largest batch."""
    every = [(st_.stat(stat), b, s.accuracy) for s in profile.subnets for b, st_ in s.latency.items()]
    lo, hi = min(c[0] for c in every), max(c[0] for c in every)
    width = (hi - lo) / num_buckets or 1.0
    cands = sorted({c[:3] for c in candidates(profile, q, stat)})  # exact duplicates are one choice
    kept = [c for c in cands if not any(o != c and o[0] <= c[0] and o[1] >= c[1] and o[2] >= c[2] for o in cands)]
    fit = [c for c in kept if c[0] <= slack]
    if not fit:
        return None, min(c[0] for c in cands)

    def bucket(c):
        return min(int((c[0] - lo) / width), num_buckets - 1)

    top = max(bucket(c) for c in fit)
    return max((c for c in fit if bucket(c) == top), key=lambda c: (c[1], c[2], -c[0])), None


@SETTINGS
@given(profiles(), slacks, queue_lens, stats, st.integers(1, 30))
def test_slackfit_against_brute_force(profile, slack, q, stat, nb):
    policy = SlackFit(profile, num_buckets=nb, latency_stat=stat, backlog_aware=False)
    d = policy.decide(slack, q, 0.0)
    _check_common(profile, d, q, stat)
    best, fastest = _slackfit_reference(profile, slack, q, stat, nb)
    if best is None:
        assert not d.fits and d.latency_s == fastest
        assert policy.min_latency(q) == fastest
    else:
        assert d.fits
        assert _triple(d) == best


def _backlog_reference(profile, slack, q, stat, demand):
    """The backlog-aware rule by brute force: keep the choices that sustain ``demand`` requests/s on one worker (mean
    throughput) or take the whole queue; if none does, those of the highest throughput level; then the most accurate
    kept choice that fits, at its largest batch (the Pareto filter first, as the policy documents). Levels are the
    geometric grid the policy documents (ratio 1.02 from the smallest throughput), so the demand is first rounded up
    to a level."""
    every = [(st_.stat(stat), b, s.accuracy, s.id) for s in profile.subnets for b, st_ in s.latency.items()]
    tput = {(sid, b): b / profile.latency(sid, b) for _, b, _, sid in every}
    levels = [0.0]
    x = min(tput.values())
    while x <= max(tput.values()):
        levels.append(x)
        x *= 1.02
    level = next((lv for lv in levels if lv >= demand), None)
    cap = cap_for(profile, q)
    whole = cap if q <= max(profile.batch_sizes) else None
    cands = [c for c in every if c[1] <= cap]

    def kept_at(lv):
        return [c for c in cands if tput[(c[3], c[1])] >= lv or c[1] == whole]

    keep = kept_at(level) if level is not None and kept_at(level) else None
    if keep is None:  # overload: the highest level that keeps anything
        keep = next(kept_at(lv) for lv in reversed(levels) if kept_at(lv))
    drop_below = min(profile.latency(c[3], c[1]) for c in keep)
    keep = sorted({c[:3] for c in keep})
    pareto = [c for c in keep if not any(o != c and o[0] <= c[0] and o[1] >= c[1] and o[2] >= c[2] for o in keep)]
    fit = [c for c in pareto if c[0] <= slack]
    if not fit:
        return None, drop_below
    return max(fit, key=lambda c: (c[2], c[1], -c[0])), drop_below


@SETTINGS
@given(profiles(), slacks, queue_lens, stats, st.sampled_from([0, 1, 3, 8]), st.floats(0, 3000))
def test_backlog_aware_slackfit_against_brute_force(profile, slack, q, stat, workers, rate):
    """Sustainable choices only (or the whole queue), then the most accurate that fits; the demand is the larger of
    the measured rate and queue / slack (if nothing sustainable at that fits, at the measured rate); the drop
    threshold is the fastest mean latency at the measured rate. The rate is fed as one burst of arrivals at t=0,
    decided on at t=0 (no decay); the estimate is bias-corrected for the part of a window seen since the first arrival
    (floored at a tenth of a window, so here: count / (window * (1 - exp(-0.1)))). When planning at p99 and the backlog
    is the larger demand, a choice sustainable at the backlog that fits at the mean comes before the rate's choices:
    the slack is scaled by the smallest p99 / mean ratio of the profile."""
    policy = SlackFit(profile, latency_stat=stat, num_workers=workers)
    count = round(rate * policy.rate_window_s)
    if count:
        policy.observe_arrivals(0.0, count)
    measured = count / (policy.rate_window_s * -math.expm1(-0.1)) * policy.headroom
    backlog = q / max(slack, 1e-3)
    d = policy.decide(slack, q, 0.0)
    _check_common(profile, d, q, stat)
    w = max(workers, 1)
    best = None
    if backlog > measured:
        best, _ = _backlog_reference(profile, slack, q, stat, backlog / w)
        ratio = min(st_.stat(stat) / st_.mean_s for s in profile.subnets for st_ in s.latency.values())
        if best is None and ratio > 1.0:
            best, _ = _backlog_reference(profile, slack * ratio, q, stat, backlog / w)
    at_rate, drop_below = _backlog_reference(profile, slack, q, stat, measured / w)
    if at_rate is not None:  # the free margin: a smaller batch as accurate that fits slack / batch_margin
        margin, _ = _backlog_reference(profile, slack / policy.batch_margin, q, stat, measured / w)
        if margin is not None and margin[2] >= at_rate[2]:
            at_rate = margin
    best = best or at_rate  # nothing sustainable at the backlog's demand fits: what the measured rate sustains
    assert policy.min_latency(q) == pytest.approx(drop_below, rel=1e-12)
    if best is None:
        assert not d.fits
    else:
        assert _triple(d) == best[:3] and d.fits == (d.latency_s <= slack)


def _stream(policy, rate, t0, t1):
    """Feed ``policy`` one arrival every ``1 / rate`` seconds from ``t0`` to ``t1``."""
    n = round((t1 - t0) * rate)
    for i in range(1, n + 1):
        policy.observe_arrivals(t0 + i / rate, 1)


def test_backlog_aware_slackfit_by_hand_on_a40():
    """Issue 20's mechanism: 4 workers at 8000 q/s. Each must serve 2000 x 1.1 = 2200 req/s (headroom 1.1); on the A40
    profile only subnet 0 at batch 16 (2430/s) and 32 (2645/s) does. With a 40-request queue and 20 ms of slack the
    paper's rule picks subnet 3 at 32 (17.10 ms, 1871/s: the queue would grow); the backlog-aware rule picks subnet 0
    at 32 (12.10 ms), and drops a head with less than 6.58 ms (subnet 0 at batch 16) instead of running a batch of
    8."""
    p = datasets.superserve_a40_profile()
    paper = SlackFit(p, latency_stat="mean", backlog_aware=False)
    sf = SlackFit(p, latency_stat="mean", num_workers=4, headroom=1.1)
    assert (paper.decide(0.020, 40, 0.1).subnet_id, paper.decide(0.020, 40, 0.1).batch_size) == (3, 32)
    _stream(sf, 8000.0, 0.0, 0.1)  # steady arrivals: the bias-corrected estimate is the rate from the start
    assert sf.arrival_rate() == pytest.approx(8000.0, rel=0.01)
    d = sf.decide(0.020, 40, 0.1)
    assert (d.subnet_id, d.batch_size, d.fits) == (0, 32, True)
    assert sf.min_latency(40) == pytest.approx(p.latency(0, 16))
    assert paper.min_latency(40) == pytest.approx(p.min_latency())
    # A short queue is served whole whatever the rate: 3 requests fit subnet 5 at batch 4 (8.17 ms).
    d = sf.decide(0.036, 3, 0.1)
    assert (d.subnet_id, d.batch_size) == (5, 3)
    # The estimate decays with time constant rate_window_s: 0.1 s later, e^-2 of it.
    assert sf.arrival_rate(0.2) == pytest.approx(sf.arrival_rate() * math.exp(-2.0))
    # 3640 q/s on 4 workers: 1001 req/s each with headroom 1.1. Subnet 0 at batch 4 (1085/s, 3.69 ms) sustains it and
    # is the fastest; with half the workers 1.5x slower (capacity scale 5/6) each must serve 1201/s and the fastest
    # sustainable choice is subnet 0 at batch 8 (2094/s, 3.82 ms).
    sf.reset()
    assert sf.arrival_rate() == 0.0
    _stream(sf, 3640.0, 0.0, 0.1)
    assert sf.min_latency(40) == pytest.approx(p.latency(0, 4))
    sf.set_capacity_scale(5 / 6)
    assert sf.min_latency(40) == pytest.approx(p.latency(0, 8))
    # No rate measured, but 200 queued with 15 ms of slack: 13,333 req/s to serve them by the head's deadline, more
    # than any choice sustains, so the highest-throughput one (subnet 0 at 32); the paper's rule takes subnet 1.
    fresh = SlackFit(p, latency_stat="mean", num_workers=1)
    assert (fresh.decide(0.015, 200, 0.0).subnet_id, fresh.decide(0.015, 200, 0.0).batch_size) == (0, 32)
    assert paper.decide(0.015, 200, 0.0).subnet_id == 1


@SETTINGS
@given(profiles(), slacks, queue_lens, st.booleans())
def test_fit_property_for_every_fit_seeking_policy(profile, slack, q, queue_aware):
    """The chosen (subnet, batch) fits the slack whenever any candidate does (the issue's fit property)."""
    cap = cap_for(profile, q) if queue_aware else max(profile.batch_sizes)
    any_fits = any(st_.mean_s <= slack for s in profile.subnets for b, st_ in s.latency.items() if b <= cap)
    for policy in (
        SlackFit(profile, queue_aware=queue_aware, latency_stat="mean"),
        SlackFit(profile, queue_aware=queue_aware, latency_stat="mean", backlog_aware=False),
        SlackFit(profile, queue_aware=queue_aware, latency_stat="mean", backlog_aware=False, pareto=False),
        MaxAcc(profile, queue_aware=queue_aware),
        MaxBatch(profile, queue_aware=queue_aware),
    ):
        d = policy.decide(slack, q, 0.0)
        assert d.fits == any_fits, policy
        assert d.fits == (d.latency_s <= slack)
        assert 1 <= d.batch_size <= min(q, max(profile.batch_sizes))


def test_slackfit_by_hand_on_a40():
    p = datasets.superserve_a40_profile()
    sf = SlackFit(
        p, latency_stat="mean", backlog_aware=False
    )  # the paper's rule; 20 buckets between 3.688 ms (subnet 0, batch 4) and 36.800 ms (subnet 5, batch 32)
    # Light load: 3 queued, much slack -> the most accurate subnet, padded batch 4 (8.17 ms).
    d = sf.decide(0.036, 3, 0.0)
    assert (d.subnet_id, d.batch_size, d.profile_batch) == (5, 3, 4)
    # One queued request: subnet 4 at batch 1 (5.47 ms) is slower *and* less accurate than subnet 5 (4.99 ms);
    # without the Pareto filter SlackFit picks the dominated choice because it sits in a higher bucket.
    assert sf.decide(0.036, 1, 0.0).subnet_id == 5
    assert SlackFit(p, pareto=False, latency_stat="mean", backlog_aware=False).decide(0.036, 1, 0.0).subnet_id == 4
    # Long queue, 20 ms slack: bucket width 1.6556 ms; 20 ms falls in bucket 9 = [18.59, 20.24) ms, which holds
    # nothing <= 20 ms; bucket 8 = [16.93, 18.59) holds subnet 3 at batch 32 (17.105 ms).
    d = sf.decide(0.020, 100, 0.0)
    assert (d.subnet_id, d.batch_size) == (3, 32)
    assert d.latency_s == pytest.approx(0.0171049621765)
    # Below the fastest latency nothing fits: the fastest candidate, flagged.
    d = sf.decide(0.003, 100, 0.0)
    assert not d.fits and d.latency_s == p.min_latency()
    assert sf.min_latency(100) == p.min_latency()
    # With one queued request the fastest candidate is subnet 0 at batch 1 (batch 4 is not a candidate).
    assert sf.min_latency(1) == pytest.approx(p.latency(0, 1))


def test_queue_unaware_slackfit_ignores_queue_length():
    p = datasets.superserve_a40_profile()
    d = SlackFit(p, queue_aware=False, latency_stat="mean").decide(0.036, 1, 0.0)
    assert d.batch_size == 1 and d.profile_batch > 1  # picks a big-batch bucket even for one request


def test_tail_aware_uses_p99():
    p = Profile(
        (
            Subnet("steady", 75.0, {1: LatencyStats(0.010, 0.011)}),
            Subnet("jittery", 80.0, {1: LatencyStats(0.008, 0.030)}),
        )
    )
    assert MaxAcc(p).decide(0.020, 1, 0.0).subnet_id == "jittery"
    d = MaxAcc(p, latency_stat="p99").decide(0.020, 1, 0.0)
    assert d.subnet_id == "steady" and d.latency_s == 0.011
    assert SlackFit(p, latency_stat="p99").decide(0.020, 1, 0.0).subnet_id == "steady"


def test_mincost_is_least_accurate_subnet():
    p = datasets.superserve_a40_profile()
    m = MinCost(p)
    assert m.subnet_id == 0
    d = m.decide(0.036, 100, 0.0)
    assert (d.subnet_id, d.batch_size) == (0, 32)


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda p: SlackFit(p).decide(math.nan, 1, 0.0), InvalidRequestError, "slack_s must be a number"),
        (lambda p: SlackFit(p).decide(0.01, 0, 0.0), InvalidRequestError, r"queue_len must be an int >= 1 .*got 0"),
        (lambda p: MaxAcc(p).decide(0.01, 2.0, 0.0), InvalidRequestError, r"queue_len must be an int >= 1 .*got 2.0"),
        (lambda p: Fixed(p, 99), UnknownSubnetError, r"unknown subnet id 99; the profile has \[0, 1, 2, 3, 4, 5\]"),
        (lambda p: SlackFit(p, num_buckets=0), InvalidRequestError, "num_buckets must be an int >= 1, got 0"),
        (lambda p: SlackFit(p, latency_stat="p50"), InvalidRequestError, "latency_stat must be 'mean' or 'p99'"),
        (lambda p: SlackFit(p, headroom=0), InvalidRequestError, r"headroom must be a finite number > 0, got 0"),
        (lambda p: SlackFit(p, rate_window_s=-1.0), InvalidRequestError, r"rate_window_s must be .* got -1.0"),
        (lambda p: SlackFit(p, num_workers=2.5), InvalidRequestError, r"num_workers must be an int >= 0, got 2.5"),
        (lambda p: SlackFit(p).set_capacity_scale(0.0), InvalidRequestError, r"capacity scale .* \(0, 1\], got 0.0"),
        (lambda p: MaxAcc("profile"), Exception, "profile must be a scheduling.Profile"),
        (lambda p: GearPlan(p, []), InvalidRequestError, "gears must be a non-empty list"),
        (lambda p: GearPlan(p, [(100, 5), (50, 0)]), InvalidRequestError, "strictly increasing"),
        (lambda p: GearPlan(p, [(100, 5)], window_s=0), InvalidRequestError, "window_s must be > 0"),
        (lambda p: GearPlan(p, [(100, 7)]), UnknownSubnetError, "unknown subnet id 7"),
    ],
)
def test_bad_arguments(call, exc, match):
    with pytest.raises(exc, match=match):
        call(datasets.superserve_a40_profile())


def test_gearplan_follows_measured_rate_with_hysteresis():
    p = datasets.superserve_a40_profile()
    g = GearPlan(p, [(1000.0, 5), (math.inf, 0)], window_s=0.1, hysteresis_s=0.05)
    assert g.decide(0.036, 1, 0.0).subnet_id == 5  # no rate measured yet: gear 0
    # 200 arrivals in [0, 0.1) -> 2000 req/s measured when the window rolls.
    for i in range(200):
        g.observe_arrivals(i * 0.0005)
    assert g.decide(0.036, 10, 0.1).subnet_id == 0 and g.gear == 1
    # Next window: 50 arrivals -> 500 req/s; the target is gear 0, but 30 queued > 0.05 s * 500 req/s = 25
    # keeps gear 1.
    for i in range(50):
        g.observe_arrivals(0.1 + i * 0.002)
    assert g.decide(0.036, 30, 0.2).subnet_id == 0 and g.rate == pytest.approx(500.0)
    # Once the backlog is small enough the plan moves down.
    assert g.decide(0.036, 20, 0.2).subnet_id == 5 and g.gear == 0
    # No arrivals for two windows: rate 0.
    g.decide(0.036, 1, 0.5)
    assert g.rate == 0.0
    g.reset()
    assert g.gear == 0 and g.rate == 0.0


def test_gearplan_from_profile_orders_gears_by_load():
    p = datasets.superserve_a40_profile()
    g = GearPlan.from_profile(p, slo_s=0.036, num_workers=8, max_qps=16000, num_gears=8)
    accs = [p.subnet(sid).accuracy for _, sid in g.gears]
    assert accs == sorted(accs, reverse=True)  # more load, less accurate
    assert g.gears[0][1] == 5 and g.gears[-1][0] == math.inf
    # Capacity by hand: subnet 5 at batch 8 (12.38 ms <= 18 ms): 0.8 * 8 * 8 / 0.012379 = 4136 req/s >= 2000.
    assert g.gears[0][1] == 5 and g.gears[2][1] != 5


def test_arrival_rate_is_bias_corrected_from_the_first_arrival():
    """A decaying count that starts at zero reads light load for its first windows; the estimate divides by the part
    of a window seen since the first arrival, so a steady stream reads its rate after a fraction of a window."""
    policy = SlackFit(datasets.superserve_a40_profile(), num_workers=4)
    _stream(policy, 8000.0, 1.0, 1.01)  # 80 arrivals in 10 ms, a fifth of the 50 ms window
    uncorrected = 80 / policy.rate_window_s * (1 - math.exp(-0.2))  # what the count alone says: ~0.18 x 8000
    assert policy.arrival_rate() == pytest.approx(8000.0, rel=0.1)
    assert uncorrected < 0.25 * 8000.0
    policy.reset()
    assert policy.arrival_rate() == 0.0
    _stream(policy, 8000.0, 5.0, 5.01)  # reset forgets the first arrival too
    assert policy.arrival_rate() == pytest.approx(8000.0, rel=0.1)


def test_batch_margin_costs_no_accuracy_and_is_validated():
    """At the measured rate, a smaller batch of an as-accurate subnet that fits slack / batch_margin is preferred; a
    margin that would need a less accurate subnet is not taken. Bad values are refused naming the argument."""
    p = datasets.superserve_a40_profile()
    tight = SlackFit(p, latency_stat="mean", num_workers=4)
    loose = SlackFit(p, latency_stat="mean", num_workers=4, batch_margin=1.0)
    for policy in (tight, loose):  # 2000 q/s on 4 workers: 500/s each; subnet 5 sustains it from batch 8 (646/s)
        _stream(policy, 2000.0, 0.0, 0.1)
    # 20 queued, 25 ms: subnet 5 at 16 (20.5 ms) fits; 25 / 1.4 = 17.9 ms fits subnet 5 at 8 (12.4 ms), which keeps up.
    assert (loose.decide(0.025, 20, 0.1).subnet_id, loose.decide(0.025, 20, 0.1).batch_size) == (5, 16)
    assert (tight.decide(0.025, 20, 0.1).subnet_id, tight.decide(0.025, 20, 0.1).batch_size) == (5, 8)
    # 8 queued, 14 ms: subnet 5 at 8 (12.4 ms) fits; 14 / 1.4 = 10 ms would need batch 4 (489/s: too slow) or a less
    # accurate subnet, so the margin is not taken.
    assert (tight.decide(0.014, 8, 0.1).subnet_id, tight.decide(0.014, 8, 0.1).batch_size) == (5, 8)
    for bad in (0.5, float("nan"), True, "2"):
        with pytest.raises(InvalidRequestError, match="batch_margin"):
            SlackFit(p, batch_margin=bad)
