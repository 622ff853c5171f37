"""The shared dispatch step and the framework-batcher hook, against brute-force references."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sched_strategies import profiles

from scheduling import (
    EDFQueue,
    Fixed,
    InvalidRequestError,
    LatencyStats,
    MaxAcc,
    Profile,
    SlackFit,
    Subnet,
    dispatch_step,
    plan_batch,
)
from scheduling.dispatch import WAKE_FLOOR_S

deadline_lists = st.lists(st.integers(-20, 200).map(lambda ms: ms * 1e-3), min_size=1, max_size=40)


def _reference_step(queue: EDFQueue, policy, now):
    """The drop/decide/pop sequence written out naively: drop while the head's slack is below the threshold for the
    current queue length, then decide on the head, then take the batch_size earliest deadlines."""
    entries = sorted(queue._heap)
    expired = []
    while entries and queue.drop_late and entries[0][0] - now < policy.min_latency(len(entries)):
        expired.append(entries.pop(0))
    if not entries:
        return expired, None, []
    d = policy.decide(entries[0][0] - now, len(entries), now)
    return expired, d, entries[: d.batch_size]


@given(profile=profiles(), deadlines=deadline_lists, drop_late=st.booleans())
@pytest.mark.parametrize("policy_cls", [SlackFit, MaxAcc])
def test_dispatch_step_matches_the_reference(policy_cls, profile, deadlines, drop_late):
    policy = policy_cls(profile)
    q = EDFQueue(drop_late=drop_late)
    for i, d in enumerate(deadlines):
        q.push(d, 0.0, i)
    expired, d, batch = _reference_step(q, policy, 0.0)
    step = dispatch_step(q, policy, 0.0)
    assert list(step.expired) == expired and step.decision == d and list(step.batch) == batch
    assert len(q) == len(deadlines) - len(expired) - len(batch)  # the queue lost exactly those
    assert step.queue_len == (len(deadlines) - len(expired) if d is not None else 0)
    assert step.wake_at == math.inf


class _Waits(MaxAcc):
    """A policy that waits while the head has more than 50 ms of slack."""

    def decide(self, slack_s, queue_len, now):
        return None if slack_s > 0.050 else super().decide(slack_s, queue_len, now)


def _profile() -> Profile:
    return Profile((Subnet(0, 70.0, {1: LatencyStats(0.010, 0.012)}), Subnet(1, 80.0, {1: LatencyStats(0.030, 0.03)})))


def test_waiting_policy_wakes_when_the_head_would_be_dropped():
    q = EDFQueue()
    q.push(0.100, 0.0, "a")
    q.push(0.005, 0.0, "late")  # slack 5 ms < fastest 10 ms: dropped
    step = dispatch_step(q, _Waits(_profile()), 0.0)
    assert [e[3] for e in step.expired] == ["late"] and step.decision is None and not step.batch
    assert step.wake_at == pytest.approx(0.100 - 0.010) and len(q) == 1  # head deadline - fastest latency
    # just before then the slack (10 ms) is below 50 ms: the policy decides; 10 ms fits, the 30 ms subnet does not
    step = dispatch_step(q, _Waits(_profile()), 0.0899999)
    assert step.decision is not None and step.decision.subnet_id == 0 and [e[3] for e in step.batch] == ["a"]


class _AlwaysWaits(MaxAcc):
    def decide(self, slack_s, queue_len, now):
        return None


def test_wake_floor_when_the_head_is_exactly_at_the_threshold():
    q = EDFQueue()
    q.push(0.010, 0.0, "a")  # slack == fastest latency: kept, and the head's drop time is now
    step = dispatch_step(q, _AlwaysWaits(_profile()), 0.0)
    assert not step.expired and step.decision is None and step.wake_at == WAKE_FLOOR_S


@given(profile=profiles(), deadlines=deadline_lists, now=st.integers(0, 50).map(lambda ms: ms * 1e-3))
def test_plan_batch_partitions_the_batch_like_the_scheduler_step(profile, deadlines, now):
    policy = SlackFit(profile)
    plan = plan_batch(policy, deadlines, now)
    assert sorted(plan.run + plan.drop + plan.defer) == list(range(len(deadlines)))  # each index exactly once
    q = EDFQueue()
    for i, d in enumerate(deadlines):
        q.push(d, now, i)
    expired, d, batch = _reference_step(q, policy, now)
    assert plan.drop == [e[3] for e in expired] and plan.run == [e[3] for e in batch]
    assert plan.decision == d and plan.subnet_id == (d.subnet_id if d else None)
    kept = sorted((deadlines[i], i) for i in plan.run + plan.defer)
    assert plan.run + plan.defer == [i for _, i in kept]  # earliest deadlines run first
    for i in plan.drop:
        assert deadlines[i] - now < policy.min_latency(len(deadlines))


def test_plan_batch_runs_the_fixed_subnet_and_rejects_bad_deadlines():
    profile = _profile()
    plan = plan_batch(Fixed(profile, 1), [0.5, 0.2, 0.01], 0.0)
    assert plan.subnet_id == 1 and plan.run == [1] and plan.drop == [2] and plan.defer == [0]
    with pytest.raises(InvalidRequestError, match=r"deadlines\[1\]=nan must be a finite time"):
        plan_batch(Fixed(profile, 1), [0.5, float("nan")], 0.0)
    with pytest.raises(InvalidRequestError, match="policy must be a scheduling Policy"):
        plan_batch("slackfit", [0.5], 0.0)
