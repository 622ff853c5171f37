"""Policies by name (issue 23): one ``make_policy`` for the CLI, demo, HTTP and Ray; ``register_policy`` adds one."""

import pytest

import scheduling
from scheduling import (
    Fixed,
    InvalidRequestError,
    MaxAcc,
    MaxBatch,
    MinCost,
    SimConfig,
    SlackFit,
    datasets,
    make_policy,
    policy_names,
    register_policy,
    registry,
    simulate,
)

PROFILE = datasets.superserve_a40_profile()


@pytest.fixture
def private_registry(monkeypatch):
    """Registrations made by a test vanish after it (the demo's error message lists the registered names)."""
    monkeypatch.setattr(registry, "_POLICIES", dict(registry._POLICIES))


def test_built_in_names_build_their_policies_with_options():
    for name, cls in [("slackfit", SlackFit), ("maxacc", MaxAcc), ("maxbatch", MaxBatch), ("mincost", MinCost)]:
        policy = make_policy(name, PROFILE, latency_stat="p99")
        assert type(policy) is cls and policy.latency_stat == "p99"
    first = PROFILE.ids[0]
    fixed = make_policy(f" Fixed:{first} ".lower(), PROFILE)
    assert type(fixed) is Fixed and fixed.subnet_id == first
    same = SlackFit(PROFILE)
    assert make_policy(same, PROFILE) is same


def test_every_front_end_uses_the_one_make_policy():
    from subnetact.serving import backend
    from subnetact.serving import make_policy as serving_make_policy

    assert serving_make_policy is make_policy and backend.make_policy is make_policy


def test_unknown_names_are_refused_naming_the_allowed_ones():
    allowed = policy_names(PROFILE)
    assert allowed[:5] == ["slackfit", "slackfit-paper", "maxacc", "maxbatch", "mincost"]
    assert allowed[5:] == [f"fixed:{i}" for i in PROFILE.ids]
    for bad in ("fastest", "fixed", "fixed:999", "slackfit:1", 3):
        with pytest.raises(
            InvalidRequestError, match=r"policy=.* is not one of \['slackfit', 'slackfit-paper', 'maxacc'"
        ):
            make_policy(bad, PROFILE)


def test_a_registered_policy_is_one_registration_away_from_every_front_end(private_registry):
    @register_policy("fastest")
    class Fastest(MaxBatch):
        """Always the biggest batch of the fastest subnet: MaxBatch under another name, for this test."""

    policy = make_policy("fastest", PROFILE)
    assert type(policy) is Fastest
    assert "fastest" in policy_names()
    # it runs in the simulator like a built-in, deciding exactly as the policy it extends
    arrivals = [i * 2e-3 for i in range(200)]
    config = SimConfig(slo_s=0.05)
    ours, reference = simulate(policy, arrivals, config), simulate(MaxBatch(PROFILE), arrivals, config)
    assert ours.summary == reference.summary and ours.summary.total == len(arrivals)


def test_register_policy_refuses_bad_names_and_factories(private_registry):
    before = dict(registry._POLICIES)
    for bad in ("", "a:b", " x", 3):
        with pytest.raises(InvalidRequestError, match="must be a non-empty policy name"):
            register_policy(bad)
    with pytest.raises(InvalidRequestError, match="factory of policy 'x' must be callable, got 3"):
        register_policy("x")(3)
    with pytest.raises(InvalidRequestError, match="choices=1 must be a callable"):
        register_policy("x", choices=1)
    assert registry._POLICIES == before
    assert scheduling.make_policy is make_policy


def test_slackfit_paper_is_the_rule_before_issue_20():
    paper = make_policy("slackfit-paper", PROFILE)
    assert not paper.backlog_aware and paper.latency_stat == "mean" and not paper.wants_latency_model
    default = make_policy("slackfit", PROFILE)
    assert default.backlog_aware and default.latency_stat == "p99" and default.wants_latency_model
