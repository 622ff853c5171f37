"""Benchmark: discrete-event simulator throughput (simulated requests per wall-clock second).

Runs each policy on the same bursty trace (8 workers, SLO 36 ms, A40 profile) and reports the median over repeats.
Example::

    python benchmarks/scheduling/bench_simulator.py --duration 30 --repeats 5
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

from scheduling import Fixed, MaxAcc, MaxBatch, MinCost, SimConfig, SlackFit, datasets, simulate, traces


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=30.0, help="trace length in simulated seconds")
    ap.add_argument("--base-rate", type=float, default=1500.0)
    ap.add_argument("--variant-rate", type=float, default=5550.0)
    ap.add_argument("--cv2", type=float, default=8.0)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--noise", choices=["none", "lognormal"], default="none")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    p = datasets.superserve_a40_profile()
    arrivals = traces.bursty(args.base_rate, args.variant_rate, cv2=args.cv2, duration_s=args.duration, seed=0)
    cfg = SimConfig(slo_s=0.036, num_workers=args.workers, latency_noise=args.noise)
    print(f"python {platform.python_version()}; {len(arrivals):,} requests; median of {args.repeats}")
    print(f"{'policy':<10} {'median req/s':>13} {'min':>11} {'max':>11} {'attainment':>10}")
    for name, make in [
        ("SlackFit", lambda: SlackFit(p)),
        ("MaxAcc", lambda: MaxAcc(p)),
        ("MaxBatch", lambda: MaxBatch(p)),
        ("MinCost", lambda: MinCost(p)),
        ("Fixed(4)", lambda: Fixed(p, 4)),
    ]:
        rates, att = [], 0.0
        for _ in range(args.repeats):
            policy = make()
            t0 = time.perf_counter()
            r = simulate(policy, arrivals, cfg)
            rates.append(len(arrivals) / (time.perf_counter() - t0))
            att = r.summary.slo_attainment
        print(f"{name:<10} {statistics.median(rates):>13,.0f} {min(rates):>11,.0f} {max(rates):>11,.0f} {att:>10.5f}")


if __name__ == "__main__":
    main()
