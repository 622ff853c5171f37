"""Policies by name: :func:`register_policy` and the one :func:`make_policy` that the CLI, the demo, the HTTP
backend and the Ray router build their policy with.

Adding a policy is one file and one registration::

    @scheduling.register_policy("fastest")
    class Fastest(scheduling.Policy):
        ...

    scheduling.make_policy("fastest", profile)  # also: subnetact-serve --policy fastest, the demo's policies=

A policy whose name takes an argument (``"fixed:<subnet id>"``) registers the argument's allowed values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .errors import InvalidRequestError
from .policies import Fixed, MaxAcc, MaxBatch, MinCost, Policy
from .profile import Profile
from .slackfit import SlackFit

#: ``(profile, **options) -> Policy`` (a :class:`~scheduling.Policy` class is one); for a policy registered with
#: ``choices``, ``(profile, argument, **options) -> Policy`` with the argument as written after the colon.
PolicyFactory = Callable[..., Policy]


@dataclass(frozen=True)
class _Registered:
    factory: PolicyFactory
    choices: Callable[[Profile], Iterable[str]] | None  # the allowed arguments (None: the name takes none)


_POLICIES: dict[str, _Registered] = {}


def register_policy(
    name: str, *, choices: Callable[[Profile], Iterable[str]] | None = None
) -> Callable[[PolicyFactory], PolicyFactory]:
    """Decorator registering a policy class (or factory) under ``name`` for :func:`make_policy`; a later
    registration of the same name replaces the earlier one.

    Args:
        name: lower-case name without a colon, e.g. ``"slackfit"``.
        choices: for a policy that takes an argument (``"fixed:<id>"``): ``profile -> allowed arguments`` (strings);
            the factory is then called as ``factory(profile, argument, **options)``.

    Raises:
        InvalidRequestError: (a ``ValueError``) ``name`` is not a non-empty string without ``":"``, or the factory is
            not callable.
    """
    if not isinstance(name, str) or not name or ":" in name or name != name.strip():
        raise InvalidRequestError(f"name={name!r} must be a non-empty policy name without ':' or spaces")
    if choices is not None and not callable(choices):
        raise InvalidRequestError(f"choices={choices!r} must be a callable profile -> allowed arguments, or None")

    def decorator(factory: PolicyFactory) -> PolicyFactory:
        if not callable(factory):
            raise InvalidRequestError(f"the factory of policy {name!r} must be callable, got {factory!r}")
        _POLICIES[name] = _Registered(factory, choices)
        return factory

    return decorator


def policy_names(profile: Profile | None = None) -> list[str]:
    """The names :func:`make_policy` accepts: plain ones, then ``"name:<argument>"`` ones (spelled out for
    ``profile``'s subnets when one is given, e.g. ``"fixed:0"``, else as ``"fixed:<arg>"``)."""
    names = [n for n, r in _POLICIES.items() if r.choices is None]
    for n, r in _POLICIES.items():
        if r.choices is not None:
            names += [f"{n}:{a}" for a in r.choices(profile)] if profile is not None else [f"{n}:<arg>"]
    return names


def make_policy(name: str | Policy, profile: Profile, **options: Any) -> Policy:
    """The policy registered as ``name`` for ``profile`` (a :class:`~scheduling.Policy` is returned as it is).

    Args:
        name: a registered name (built in: ``slackfit``, ``slackfit-paper``, ``maxacc``, ``maxbatch``, ``mincost``,
            ``fixed:<subnet id>``), case and surrounding spaces ignored; or a policy.
        profile: the profile the policy decides from.
        **options: keyword arguments of the policy, e.g. ``latency_stat="p99"``.

    Raises:
        InvalidRequestError: (a ``ValueError``) ``name`` is not registered, naming the allowed names.
    """
    if isinstance(name, Policy):
        return name
    if isinstance(name, str):
        base, colon, argument = name.strip().partition(":")
        registered = _POLICIES.get(base.lower())
        if registered is not None and registered.choices is None and not colon:
            return registered.factory(profile, **options)
        if registered is not None and registered.choices is not None and colon:
            if argument in {str(a) for a in registered.choices(profile)}:
                return registered.factory(profile, argument, **options)
    raise InvalidRequestError(f"policy={name!r} is not one of {policy_names(profile)}")


def _fixed(profile: Profile, subnet: str, **options: Any) -> Fixed:
    ids = {str(i): i for i in profile.ids}
    return Fixed(profile, ids[subnet], **options)


def _slackfit_paper(profile: Profile, **options: Any) -> SlackFit:
    """The paper's rule (the slack only, the mean latency), as SlackFit was before issue 20: for reproductions."""
    return SlackFit(profile, **{"backlog_aware": False, "latency_stat": "mean", **options})


register_policy("slackfit")(SlackFit)
register_policy("slackfit-paper")(_slackfit_paper)
register_policy("maxacc")(MaxAcc)
register_policy("maxbatch")(MaxBatch)
register_policy("mincost")(MinCost)
register_policy("fixed", choices=lambda profile: [str(i) for i in profile.ids])(_fixed)
