"""Adaptive vs static planning in the simulator (issue 12): SlackFit with and without a LatencyModel.

Two checks, each over several seeds with lognormal latency noise, 8 workers, the A40 profile, SLO 36 ms:

- ``interference``: half the workers (0-3) run ``--factor`` (1.5x) slower from ``--start`` to ``--end`` (10-20 s) of a
  ``--duration`` (30 s) bursty trace, λ_b = 1500 and λ_v, CV² over the grid below. Target: adaptive SlackFit >= 0.99
  attainment where static SlackFit falls below it, at an accuracy within 0.5 points of static SlackFit's.
- ``quiet``: the same traces (the paper's Fig. 9 grid) without interference. Target: adaptive matches static within
  noise (no cost to the quiet case).

Example::

    python benchmarks/scheduling/bench_adaptive.py --seeds 0 1 2 --jobs 2 --json /tmp/adaptive.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from scheduling import Interference, LatencyModel, MinCost, SimConfig, SlackFit, datasets, simulate, traces

PROFILE = datasets.superserve_a40_profile()
SLO, WORKERS = 0.036, 8


def run(job: tuple) -> dict[str, Any]:
    """(check, λ_v, CV², seed, adaptive, policy, args) -> summary."""
    check, lv, cv2, seed, adaptive, policy_name, a = job
    arrivals = traces.bursty(1500, lv, cv2=cv2, duration_s=a["duration"], seed=seed)
    windows = (Interference(a["start"], a["end"], a["factor"], tuple(range(WORKERS // 2))),)
    cfg = SimConfig(
        slo_s=SLO,
        num_workers=WORKERS,
        latency_noise="lognormal",
        interference=windows if check == "interference" else (),
        seed=seed,
    )
    policy = SlackFit(PROFILE) if policy_name == "SlackFit" else MinCost(PROFILE)
    model = LatencyModel(PROFILE) if adaptive else None
    t0 = time.perf_counter()
    s = simulate(policy, arrivals, cfg, latency_model=model).summary
    return {
        "check": check, "lambda_v": lv, "cv2": cv2, "seed": seed, "adaptive": adaptive, "policy": policy_name,
        "attainment": s.slo_attainment, "accuracy": s.mean_accuracy, "dropped": s.dropped, "late": s.late,
        "replans": model.refreshes if model else 0, "wall_s": time.perf_counter() - t0,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checks", default="interference,quiet")
    ap.add_argument("--lambda-v", type=int, nargs="+", default=[2950, 4900, 5550])
    ap.add_argument("--cv2", type=float, nargs="+", default=[2, 4, 8])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--start", type=float, default=10.0)
    ap.add_argument("--end", type=float, default=20.0)
    ap.add_argument("--factor", type=float, default=1.5)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    a = {"duration": args.duration, "start": args.start, "end": args.end, "factor": args.factor}
    jobs = [
        (check, lv, cv2, seed, adaptive, pol, a)
        for check in args.checks.split(",")
        for lv in args.lambda_v
        for cv2 in args.cv2
        for seed in args.seeds
        for adaptive, pol in ((False, "SlackFit"), (True, "SlackFit"), (False, "MinCost"))
    ]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as ex:
        rows = list(ex.map(run, jobs, chunksize=1))
    print(f"{len(rows)} simulations in {time.perf_counter() - t0:.1f} s")
    for check in args.checks.split(","):
        print(f"\n{check}: mean over seeds {args.seeds} (worst seed in brackets)")
        print("| λv | CV² | static SlackFit att / acc | adaptive SlackFit att / acc | MinCost att / acc | target |")
        print("|---|---|---|---|---|---|")
        for lv in args.lambda_v:
            for cv2 in args.cv2:
                cell = [r for r in rows if (r["check"], r["lambda_v"], r["cv2"]) == (check, lv, cv2)]
                st = [r for r in cell if r["policy"] == "SlackFit" and not r["adaptive"]]
                ad = [r for r in cell if r["adaptive"]]
                mc = [r for r in cell if r["policy"] == "MinCost"]

                def fmt(rs):
                    att = statistics.mean(r["attainment"] for r in rs)
                    worst = min(r["attainment"] for r in rs)
                    return f"{att:.4f} ({worst:.4f}) / {statistics.mean(r['accuracy'] for r in rs):.2f}"

                dacc = max(abs(x["accuracy"] - y["accuracy"]) for x, y in zip(st, ad, strict=True))
                if check == "interference":
                    ok = all(r["attainment"] >= 0.99 for r in ad) and dacc <= 0.5
                    ok_s = f"{'met' if ok else 'MISSED'}: adaptive >= 0.99 every seed, |Δacc| <= {dacc:.2f}"
                else:
                    datt = max(abs(x["attainment"] - y["attainment"]) for x, y in zip(st, ad, strict=True))
                    ok_s = f"max |Δatt| {datt:.4f}, max |Δacc| {dacc:.3f}"
                print(f"| {lv} | {cv2:g} | {fmt(st)} | {fmt(ad)} | {fmt(mc)} | {ok_s} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
