"""Benchmark: policy ``decide()`` latency after precomputation.

Times batches of calls over pre-drawn random (slack, queue length) arguments and reports the median per-call time
over repeats (timing single calls would measure the timer). Example::

    python benchmarks/scheduling/bench_decide.py --subnets 6 1000 --batch-sizes 16 --repeats 15

Every policy gets one untimed pass over the draws first (SlackFit builds its backlog-aware tables on first use).
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time

from scheduling import Fixed, GearPlan, MaxAcc, MaxBatch, SlackFit, datasets, synthetic_profile


def _profile(n_subnets: int, n_batch: int, a40: bool):
    if a40:
        return datasets.superserve_a40_profile()
    return synthetic_profile(n_subnets, tuple(2**i for i in range(n_batch)), seed=0)


def _loaded_slackfit(profile):
    """The default SlackFit with a measured arrival rate (8 workers, ~70 % of the cheapest subnet's capacity), so
    ``decide`` takes the sustainable-choice path (the other rows see no arrivals, i.e. rate 0)."""
    policy = SlackFit(profile, num_workers=8)
    best = max(b / st.mean_s for s in profile.subnets for b, st in s.latency.items())
    rate = 0.7 * 8 * best
    for i in range(round(rate * policy.rate_window_s)):  # one window of steady arrivals at that rate
        policy.observe_arrivals(i / rate)
    return policy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--subnets", type=int, nargs="+", default=[6, 1000], help="synthetic profile sizes")
    ap.add_argument("--batch-sizes", type=int, default=16, help="number of batch sizes (powers of two)")
    ap.add_argument("--a40", action="store_true", help="also time the real 6x6 A40 profile")
    ap.add_argument("--calls", type=int, default=20000, help="calls per timed batch")
    ap.add_argument("--repeats", type=int, default=15, help="timed batches; the median is reported")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    print(f"python {platform.python_version()} on {platform.machine()}; median of {args.repeats} x {args.calls} calls")
    print(f"{'profile':<14} {'policy':<13} {'build ms':>9} {'median us':>10} {'min us':>8} {'max us':>8}")
    configs = [(n, args.batch_sizes, False) for n in args.subnets] + ([(6, 6, True)] if args.a40 else [])
    for n, nb, a40 in configs:
        profile = _profile(n, nb, a40)
        name = "A40 6x6" if a40 else f"{n}x{nb}"
        lo = profile.min_latency()
        hi = max(st.mean_s for s in profile.subnets for st in s.latency.values())
        rng = random.Random(args.seed)
        draws = [
            (rng.uniform(0.5 * lo, 1.1 * hi), rng.randint(1, 4 * max(profile.batch_sizes))) for _ in range(args.calls)
        ]
        makers = {
            "SlackFit": lambda p: SlackFit(p),
            "MaxAcc": lambda p: MaxAcc(p),
            "MaxBatch": lambda p: MaxBatch(p),
            "Fixed": lambda p: Fixed(p, p.ids[len(p.ids) // 2]),
            "GearPlan": lambda p: GearPlan(p, [(1000.0, p.ids[-1]), (float("inf"), p.ids[0])]),
            "SlackFit-paper": lambda p: SlackFit(p, backlog_aware=False, latency_stat="mean"),
            "SlackFit-load": _loaded_slackfit,
        }
        for pname, make in makers.items():
            t0 = time.perf_counter()
            policy = make(profile)
            build_ms = (time.perf_counter() - t0) * 1e3
            decide = policy.decide
            for slack, q in draws:  # untimed warm-up: the backlog-aware tables are built on first use
                decide(slack, q, 0.0)
            per_call = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                for slack, q in draws:
                    decide(slack, q, 0.0)
                per_call.append((time.perf_counter() - t0) / len(draws) * 1e6)
            print(
                f"{name:<14} {pname:<13} {build_ms:>9.1f} {statistics.median(per_call):>10.2f} "
                f"{min(per_call):>8.2f} {max(per_call):>8.2f}"
            )


if __name__ == "__main__":
    main()
