"""The demo's load and SLO, derived from the profile it just measured (so the trade-off shows on any machine).

Rule (documented in ``docs/serving.md``):

1. **SLO** = max(``SLO_FLOOR_S``, 2 x the most accurate subnet's planning latency at batch 16): a request that waits
   for one running batch and then runs in the next still meets it with the most accurate subnet at batch 16. The
   floor covers what the profile cannot see: on a shared CPU the OS pauses our threads for a scheduler slice at a
   time. On the 2-core development machine, SLOs below 50 ms made every policy, even the cheapest subnet alone, miss
   1-3 % of its requests.
2. **Capacity** of a subnet within the SLO = ``workers`` x the best ``batch / mean latency`` over the profiled batch
   sizes whose planning latency fits twice in the SLO (the same wait-one-batch argument).
3. **Mean rate** = ``LIVE_EFFICIENCY`` x min(``TOP_LOAD`` x the most accurate subnet's capacity, ``LOW_LOAD`` x the
   least accurate subnet's capacity). ``LIVE_EFFICIENCY`` accounts for what the profile does not time: the live
   path's per-request cost (the scheduler, futures, stacking inputs, one Python thread). Measured on the 2-core
   development machine, quiet (load average 0.5-0.9), with the digits supernet: without the factor (4421 req/s)
   the live path was overloaded (the cheapest subnet alone just held; SlackFit 0.82 attainment); with it (about
   2400-2500 req/s) SlackFit reached 0.993-0.997. Against the profile, the most accurate subnet is busy 80 % of the
   time on average, so the bursts (CV² 8) exceed what it can serve within the SLO; the least accurate one runs at no
   more than half of its capacity, so the mean is within reach of the smaller subnets.

Only :mod:`scheduling` is needed (no torch), so the rule is testable on hand-made profiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import inf

from scheduling import Profile

from .checks import is_int, is_real
from .errors import ConfigError

__all__ = [
    "LIVE_EFFICIENCY",
    "LOW_LOAD",
    "SLO_FLOOR_S",
    "TOP_LOAD",
    "DerivedLoad",
    "capacity_within_slo",
    "derive_load",
]

SLO_FLOOR_S = 0.050
TOP_LOAD = 0.8
LIVE_EFFICIENCY = 0.56
LOW_LOAD = 0.5
REF_BATCH = 16


@dataclass(frozen=True)
class DerivedLoad:
    """The demo's settings and the numbers they come from (all rates in requests/s, times in seconds)."""

    rate: float
    slo_s: float
    top_id: object
    low_id: object
    top_capacity: float
    low_capacity: float
    top_batch: int  # the batch size giving ``top_capacity``
    low_batch: int
    ref_batch: int  # the batch size the SLO is derived from
    ref_latency_s: float  # the most accurate subnet's planning latency at ``ref_batch``
    slo_given: bool = False  # the SLO was given, not derived

    @property
    def narrow(self) -> bool:
        """The least accurate subnet bounds the rate: the served set's capacities are too close for bursts to
        exceed the most accurate subnet's while the mean stays at half the least accurate one's."""
        return LOW_LOAD * self.low_capacity < TOP_LOAD * self.top_capacity

    def describe(self) -> str:
        """How the rate and SLO were derived (the SLO part only when it was derived)."""
        slo = f"SLO {1e3 * self.slo_s:.1f} ms"
        if not self.slo_given:
            slo += (
                f" = max({1e3 * SLO_FLOOR_S:.0f} ms, 2 x {1e3 * self.ref_latency_s:.2f} ms, the most accurate subnet "
                f"{self.top_id} at batch {self.ref_batch})"
            )
        return (
            f"{slo}; capacity within it: subnet "
            f"{self.top_id} {self.top_capacity:.0f} req/s (batch {self.top_batch}), least accurate subnet "
            f"{self.low_id} {self.low_capacity:.0f} req/s (batch {self.low_batch}); mean rate {self.rate:.0f} req/s "
            f"= {LIVE_EFFICIENCY:g} x min({TOP_LOAD:g} x {self.top_capacity:.0f}, "
            f"{LOW_LOAD:g} x {self.low_capacity:.0f})"
            + (" (the served subnets' capacities are close: little trade-off to show)" if self.narrow else "")
        )


def _planning_latency(profile: Profile, subnet_id: object, batch: int, latency_stat: str) -> float:
    st = profile.subnet(subnet_id).latency[batch]
    return st.p99_s if latency_stat == "p99" and st.p99_s is not None else st.mean_s


def capacity_within_slo(
    profile: Profile, subnet_id: object, slo_s: float, *, workers: int = 1, latency_stat: str = "p99"
) -> tuple[float, int]:
    """``(requests/s, batch)``: the best ``workers x batch / mean latency`` over the profiled batch sizes whose
    planning latency (``latency_stat``) fits twice in ``slo_s``; ``(0.0, 0)`` if none fits."""
    best = (0.0, 0)
    for b in profile.batch_sizes:
        if 2.0 * _planning_latency(profile, subnet_id, b, latency_stat) <= slo_s:
            best = max(best, (workers * b / profile.subnet(subnet_id).latency[b].mean_s, b))
    return best


def derive_load(
    profile: Profile, *, workers: int = 1, latency_stat: str = "p99", slo_s: float | None = None
) -> DerivedLoad:
    """The demo's mean rate and SLO for ``profile`` (see the module docstring for the rule).

    Args:
        profile: The measured profile of the served subnets (accuracy and latency per batch size).
        workers: Inference workers serving in parallel (each runs one batch at a time).
        latency_stat: ``"p99"`` or ``"mean"``: the latency the policies plan with.
        slo_s: A given SLO (seconds, > 0): only the rate is derived, with the capacities within this SLO.

    Raises:
        ValueError: ``workers`` < 1, ``latency_stat`` unknown, or ``slo_s`` not a number > 0.
    """
    if not is_int(workers) or workers < 1:
        raise ConfigError(f"workers={workers!r} must be an int >= 1")
    if latency_stat not in ("mean", "p99"):
        raise ConfigError(f"latency_stat={latency_stat!r} must be 'mean' or 'p99'")
    if slo_s is not None and (not is_real(slo_s) or not 0 < slo_s < inf):
        raise ConfigError(f"slo_s={slo_s!r} must be a finite number of seconds > 0")
    top = max(profile.subnets, key=lambda s: s.accuracy).id
    low = min(profile.subnets, key=lambda s: s.accuracy).id
    below = [b for b in profile.batch_sizes if b <= REF_BATCH]
    ref_b = max(below) if below else min(profile.batch_sizes)
    ref_lat = _planning_latency(profile, top, ref_b, latency_stat)
    given = slo_s is not None
    if slo_s is None:
        slo_s = max(SLO_FLOOR_S, 2.0 * ref_lat)
    top_cap, top_b = capacity_within_slo(profile, top, slo_s, workers=workers, latency_stat=latency_stat)
    low_cap, low_b = capacity_within_slo(profile, low, slo_s, workers=workers, latency_stat=latency_stat)
    # No batch of the least accurate subnet fits (an SLO given below its latency): load the most accurate one only.
    rate = min(TOP_LOAD * top_cap, LOW_LOAD * low_cap) if low_cap > 0 else TOP_LOAD * top_cap
    rate *= LIVE_EFFICIENCY  # the live path's per-request cost, which the profile does not time
    if rate <= 0:
        raise ConfigError(
            f"no profiled batch of the most accurate subnet {top!r} fits twice in the SLO of {1e3 * slo_s:.1f} ms "
            f"(its batch-{min(profile.batch_sizes)} latency is "
            f"{1e3 * _planning_latency(profile, top, min(profile.batch_sizes), latency_stat):.1f} ms); give a larger "
            "SLO or a rate"
        )
    return DerivedLoad(rate, float(slo_s), top, low, top_cap, low_cap, top_b, low_b, ref_b, ref_lat, given)
