"""Benchmark: live ``Scheduler`` overhead - requests/s dispatched and completed with a no-op worker.

One thread submits ``--requests`` requests as fast as it can (generous SLO, so nothing is dropped); the clock stops
when the last future is done. Reports the median over repeats. Example::

    python benchmarks/scheduling/bench_live.py --workers 1 4 --requests 200000 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from scheduling import MinCost, Profile, Scheduler, SlackFit, Subnet, datasets


def noop(subnet_id, payloads):
    return payloads


def run_once(policy, n_workers: int, n: int) -> tuple[float, float]:
    s = Scheduler(policy, [noop] * n_workers, max_queue=n + 1)
    submit = s.submit
    t0 = time.perf_counter()
    futs = [submit(i, slo_s=60.0) for i in range(n)]
    for f in futs:
        f.result()
    dt = time.perf_counter() - t0
    s.close()
    m = s.metrics()
    assert m.on_time == n, m  # zero lost requests
    return n / dt, m.mean_batch_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--policy", choices=["slackfit", "mincost"], default="slackfit")
    ap.add_argument(
        "--max-batch", type=int, default=None, help="keep only profiled batch sizes <= this (1: one request per batch)"
    )
    args = ap.parse_args()
    profile = datasets.superserve_a40_profile()
    if args.max_batch is not None:
        profile = Profile(
            tuple(
                Subnet(s.id, s.accuracy, {b: st for b, st in s.latency.items() if b <= args.max_batch})
                for s in profile.subnets
            )
        )
    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPUs; policy {args.policy}; batch sizes "
        f"{profile.batch_sizes}; median of {args.repeats}"
    )
    print(f"{'workers':>7} {'median req/s':>13} {'min':>9} {'max':>9} {'mean batch':>10}")
    for w in args.workers:
        rates, batch = [], 0.0
        for _ in range(args.repeats):
            policy = SlackFit(profile) if args.policy == "slackfit" else MinCost(profile)
            r, batch = run_once(policy, w, args.requests)
            rates.append(r)
        print(f"{w:>7} {statistics.median(rates):>13,.0f} {min(rates):>9,.0f} {max(rates):>9,.0f} {batch:>10.1f}")


if __name__ == "__main__":
    main()
