"""Which part of the default SlackFit costs it attainment in the live demo? A/B of its variants (issue 20).

    python benchmarks/demo_variants.py                      # 6 trials, the demo's defaults, on a quiet machine
    python benchmarks/demo_variants.py --trials 9 --json /tmp/variants.json

On a quiet machine ``subnetact demo`` found the paper's rule dominating the default SlackFit beyond trial noise in 2
of 3 runs, by 0.001-0.004 attainment at equal accuracy, while the simulator (same profile, rate, SLO, noise) finds
both at 1.0000 (docs/benchmarks.md). This replays the demo's setup (the digits supernet profiled now, the rate and SLO
derived from that profile, the bursty CV² 8 traces, one worker) with the variants that separate the live
differences between the two rules:

- ``slackfit``: the default (backlog-aware, plans at the p99 of its own latency model);
- ``slackfit-static``: the same rule on the static profile (no latency model);
- ``slackfit-paperdrop``: the same rule with the paper's drop threshold (the fastest planned latency of any choice,
  instead of the fastest *sustainable* mean latency);
- ``slackfit-paper``: the paper's rule, as the demo runs it (p99 of the static profile);
- ``slackfit-paper-lm``: the paper's rule with a latency model.

Every variant replays the same trace in a trial; the order rotates from trial to trial and each run starts after a
full garbage collection (as the demo does). Prints per variant: attainment (mean, and paired against the default:
mean ± standard error), requests dropped and late, p50/p99 latency, mean batch size, and per latency-model variant
the model's worker factor and tail at the end of each run. Record the load average with the result: a busy machine
shows its own stalls, not the policies'.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import statistics
import sys

import torch

from scheduling import LatencyModel, SlackFit, make_policy, traces
from subnetact import digits
from subnetact.config import SubnetConfig
from subnetact.demo import DEFAULT_BATCH_SIZES, _run_policy
from subnetact.demo_load import derive_load
from subnetact.profiler import profile

VARIANTS = ("slackfit", "slackfit-static", "slackfit-paperdrop", "slackfit-paper", "slackfit-paper-lm")


class PaperDropSlackFit(SlackFit):
    """The default SlackFit, but the drop rule of the paper's: drop a head only when no choice at all fits it."""

    def min_latency(self, queue_len: int) -> float:
        stat = self.latency_stat
        return min(
            st.p99_s if stat == "p99" and st.p99_s is not None else st.mean_s
            for s in self.profile.subnets
            for st in s.latency.values()
        )


def build(variant: str, prof) -> tuple[object, object]:
    """(policy, latency model or None) of ``variant``; the Scheduler is given the model explicitly."""
    if variant == "slackfit":
        return make_policy("slackfit", prof, latency_stat="p99"), LatencyModel(prof)
    if variant == "slackfit-static":
        policy = make_policy("slackfit", prof, latency_stat="p99")
        policy.wants_latency_model = False  # else the Scheduler gives it one ("auto")
        return policy, None
    if variant == "slackfit-paperdrop":
        return PaperDropSlackFit(prof, latency_stat="p99"), LatencyModel(prof)
    if variant == "slackfit-paper":
        return make_policy("slackfit-paper", prof, latency_stat="p99"), None
    if variant == "slackfit-paper-lm":
        return make_policy("slackfit-paper", prof, latency_stat="p99"), LatencyModel(prof)
    raise SystemExit(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per trace (the demo's default)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write every run here")
    args = ap.parse_args()
    variants = args.variants.split(",")
    torch.set_num_threads(1)
    print(f"load average before: {os.getloadavg()}", flush=True)
    model, record = digits.load_supernet()
    images, labels = digits.test_set(record)
    x_test = digits.to_input(images)
    served = [SubnetConfig.from_dict(r["config"]) for r in record["pareto"]]
    accuracies = [float(r["accuracy"]) for r in record["pareto"]]
    prof = profile(
        model, served, list(DEFAULT_BATCH_SIZES), example_input=x_test[:1], accuracies=accuracies, repeats=15
    )
    load = derive_load(prof, workers=1, latency_stat="p99")
    print(f"load from the profile: {load.describe()}", flush=True)
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for t in range(args.trials):
        arrivals = traces.bursty(load.rate / 2, load.rate / 2, cv2=8.0, duration_s=args.duration, seed=args.seed + t)
        rng = random.Random(args.seed + t)
        requested = [rng.randrange(len(labels)) for _ in arrivals]
        for v in variants[t % len(variants) :] + variants[: t % len(variants)]:
            policy, latency_model = build(v, prof)
            gc.collect()
            gc.freeze()
            row, _ = _run_policy(
                v, policy, model, served, prof, x_test, labels, arrivals, requested, load.slo_s, 1, latency_model
            )
            run = {
                "trial": t,
                "attainment": row.slo_attainment,
                "accuracy": row.accuracy,
                "dropped": row.dropped,
                "late": row.late,
                "p50_ms": row.latency_p50_ms,
                "p99_ms": row.latency_p99_ms,
                "mean_batch": row.mean_batch_size,
                "load1": os.getloadavg()[0],
            }
            if latency_model is not None:
                run["worker_factor"] = latency_model.worker_factor(0)  # the Scheduler's one worker has id 0
                run["tail"] = latency_model.tail()
            runs[v].append(run)
            print(f"  trial {t + 1}/{args.trials} {v:>20}: " + json.dumps({k: _r(x) for k, x in run.items()}))
    gc.unfreeze()
    base = runs.get("slackfit")
    print(f"\nload average after: {os.getloadavg()}")
    heads = f"{'attain.':>8} {'vs default':>18} {'dropped':>8} {'late':>6} {'p50 ms':>7} {'p99 ms':>7} batch"
    print(f"{'variant':<20} {heads}")
    for v, rs in runs.items():
        att = statistics.fmean(r["attainment"] for r in rs)
        diff = "-"
        if base is not None and v != "slackfit":
            d = [r["attainment"] - b["attainment"] for r, b in zip(rs, base, strict=True)]
            se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else 0.0
            diff = f"{statistics.fmean(d):+.4f} ± {se:.4f}"
        print(
            f"{v:<20} {att:>8.4f} {diff:>18} {sum(r['dropped'] for r in rs):>8} {sum(r['late'] for r in rs):>6} "
            f"{statistics.fmean(r['p50_ms'] for r in rs):>7.1f} {statistics.fmean(r['p99_ms'] for r in rs):>7.1f} "
            f"{statistics.fmean(r['mean_batch'] for r in rs):.2f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rate": load.rate, "slo_s": load.slo_s, "runs": runs}, f, indent=1)


def _r(x):
    return round(x, 4) if isinstance(x, float) else x


if __name__ == "__main__":
    sys.exit(main())
