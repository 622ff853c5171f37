"""Shared hypothesis strategies and brute-force references for the scheduling tests."""

from __future__ import annotations

from hypothesis import strategies as st

from scheduling import LatencyStats, Profile, Subnet

BATCHES = (1, 2, 3, 4, 8, 16)


@st.composite
def profiles(draw, max_subnets: int = 5) -> Profile:
    """Random profiles, deliberately allowed to violate P1/P2, with missing entries and accuracy ties."""
    n = draw(st.integers(1, max_subnets))
    subnets = []
    for i in range(n):
        sizes = draw(st.lists(st.sampled_from(BATCHES), min_size=1, max_size=len(BATCHES), unique=True))
        lat = {}
        for b in sizes:
            mean = draw(st.integers(1, 60)) * 1e-3  # a coarse grid makes ties (and edge cases) likely
            p99 = mean + draw(st.integers(0, 20)) * 1e-3
            lat[b] = LatencyStats(mean, p99, mean * 0.1)
        acc = float(draw(st.integers(70, 80)))
        subnets.append(Subnet(i, acc, lat))
    return Profile(tuple(subnets))


def cap_for(profile: Profile, queue_len: int) -> int:
    """Largest candidate batch size for a queue of queue_len (queue-aware rule)."""
    bigger = [b for b in profile.batch_sizes if b >= queue_len]
    return min(bigger) if bigger else max(profile.batch_sizes)


def candidates(profile: Profile, queue_len: int, stat: str = "mean", subnet_id=None):
    """All (latency, batch, accuracy, subnet_id) candidates for a queue of queue_len, by brute force."""
    cap = cap_for(profile, queue_len)
    out = []
    for s in profile.subnets:
        if subnet_id is not None and s.id != subnet_id:
            continue
        own = [(b, stt) for b, stt in s.latency.items() if b <= cap]
        if not own and subnet_id is not None:
            # A fixed subnet with no batch size <= cap runs its smallest profiled batch (padded).
            b0 = min(s.latency)
            own = [(b0, s.latency[b0])]
        out += [(stt.stat(stat), b, s.accuracy, s.id) for b, stt in own]
    return out
