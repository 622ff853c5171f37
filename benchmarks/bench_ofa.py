"""Once-for-All ResNet-50 (``ofa_resnet50``) served the SubNetAct way: memory, actuation latency, forward time.

- memory: the converted supernet plus per-subnet statistics for the 6 SuperServe subnets and for N random subnets
  (really calibrated, on tiny inputs: the statistics' size does not depend on the input size), versus the 6
  exported subnets and versus torchvision's resnet18/34/50/101 (parameters + buffers, fp32, 1000 classes);
- actuation: ``model.actuate(cfg)`` for registered subnets (median);
- forward (CPU, eval, inference_mode): the actuated supernet with its weight cache at the default budget and without
  it, vs the exported subnet vs once-for-all's own dynamic forward (``set_active_subnet`` + forward, which slices and
  copies weights every call), interleaved; medians and ratios per subnet;
- with ``--budgets``: weight-cache budget -> memory ratio, median actuated/exported and MB copied per forward, the six
  subnets round-robin;
- with ``--compare-pointwise``: also the cache without 1x1 copies (their GEMM on the strided view).

    python benchmarks/bench_ofa.py --batch-sizes 1 16 --reps 7 --random-subnets 500
    python benchmarks/bench_ofa.py --batch-sizes 1 8 16 --reps 5 --random-subnets 6 --calibrated 0 --threads 1 \
        --clock cpu --budgets 0 5 10 15.4 30 80
"""

from __future__ import annotations

import argparse
import copy
import random
import time
import warnings

import torch

import subnetact
from subnetact import zoo

from _common import cache_peak_bytes, machine, median, timeit


def nbytes(module: torch.nn.Module) -> int:
    tensors = {id(t): t for t in [*module.parameters(), *module.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def stats_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in model._subnetact.stats.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--reps", type=int, default=7, help="timed forwards per variant, subnet and batch size")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--random-subnets", type=int, default=500)
    parser.add_argument("--calibrated", type=int, default=20, help="how many of the random subnets to calibrate")
    parser.add_argument("--skip-forward", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument(
        "--round-robin",
        action="store_true",
        help="switch subnet on every forward (a server's pattern) instead of timing one subnet at a time",
    )
    parser.add_argument(
        "--budgets", type=float, nargs="*", default=[], help="weight-cache budgets (MB) for the budget curve"
    )
    parser.add_argument("--budget-batch", type=int, default=1)
    parser.add_argument(
        "--compare-pointwise",
        action="store_true",
        help="add a variant whose cache holds no 1x1 slices (their GEMM on the strided view, as before issue 16's "
        "second round)",
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall clock, or this process's CPU time (steadier on a loaded shared machine)",
    )
    args = parser.parse_args()
    args.clock_fn = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    import torchvision
    from ofa.imagenet_classification.elastic_nn.networks import OFAResNets

    torch.manual_seed(0)
    ofa_net = OFAResNets(n_classes=1000, **zoo.OFA_RESNET50_KWARGS).eval()
    model = subnetact.convert(OFAResNets(n_classes=1000, **zoo.OFA_RESNET50_KWARGS)).eval()
    subnetact.ofa.load_checkpoint(model, ofa_net.state_dict())  # OFA's weights: a like-for-like forward
    paper = [s.config(model) for s in zoo.SUPERSERVE_OFA_RESNET50]
    print(f"# ofa_resnet50 (random weights), {machine()}")

    # -- memory ------------------------------------------------------------------------------------------------
    calib = [torch.randn(2, 3, 32, 32)]
    subnetact.calibrate(model, calib, paper)
    weights = nbytes(model)
    stats6 = stats_bytes(model)
    per_subnet = [t.numel() * t.element_size() for t in model._subnetact.stats.values()]
    exported6 = sum(nbytes(model.export(cfg)) for cfg in paper)
    rng = random.Random(0)
    extra = []
    while len(extra) < args.random_subnets - len(paper):
        cfg = model.space.sample(rng)
        if cfg not in paper and cfg not in extra:
            extra.append(cfg)
    # Really calibrate the first --calibrated of them; the rest are sized from the statistics layout (exactly the
    # buffer calibrate would store: mean and var of every active SubnetNorm's active channels), which is checked
    # against the real buffers here.
    start = time.perf_counter()
    real = extra[: args.calibrated]
    subnetact.calibrate(model, calib, paper + real)
    calib_s = time.perf_counter() - start
    state = model._subnetact
    element = next(iter(state.stats.values())).element_size()
    for cfg in paper + real:
        assert state.stats[cfg].numel() == 2 * sum(k for _, k in state.stats_layout(cfg))
    layout = sum(2 * sum(k for _, k in state.stats_layout(c)) * element for c in extra[len(real) :])
    stats_n = stats_bytes(model) + layout
    tv = {
        name: nbytes(getattr(torchvision.models, name)()) for name in ("resnet18", "resnet34", "resnet50", "resnet101")
    }
    cache_default = cache_peak_bytes(model, paper, None)
    cache_all = cache_peak_bytes(model, paper, 1e6)
    budget = model.weight_cache_info().budget_bytes
    mb = 1e6
    print("\n## memory (MB, fp32 parameters + buffers + registered statistics)")
    print("| what | MB |\n|---|---:|")
    print(f"| converted OFA-ResNet50 supernet (weights) | {weights / mb:.1f} |")
    print(f"| + statistics of the 6 paper subnets | {(weights + stats6) / mb:.1f} (stats {stats6 / mb:.3f}) |")
    print(
        f"| + statistics of {len(paper) + len(extra)} subnets | {(weights + stats_n) / mb:.1f} "
        f"(stats {stats_n / mb:.2f}; {len(paper) + len(real)} calibrated in {calib_s:.0f} s, the rest sized "
        "from the layout) |"
    )
    print(
        f"| + weight cache of the 6 paper subnets, default budget ({budget / mb:.1f} MB) | "
        f"{(weights + stats6 + cache_default) / mb:.1f} (cache {cache_default / mb:.1f}) |"
    )
    print(
        f"| + weight cache of the 6 paper subnets, unbounded | {(weights + stats6 + cache_all) / mb:.1f} "
        f"(cache {cache_all / mb:.1f}) |"
    )
    print(f"| 6 exported paper subnets | {exported6 / mb:.1f} |")
    for name, b in tv.items():
        print(f"| torchvision {name} | {b / mb:.1f} |")
    print(f"| torchvision resnet18+34+50+101 | {sum(tv.values()) / mb:.1f} |")
    print(f"\n- 6 exported / (supernet + 6 subnets' stats): **{exported6 / (weights + stats6):.2f}x**")
    print(
        f"- 6 exported / (supernet + 6 subnets' stats + weight cache, default budget): "
        f"**{exported6 / (weights + stats6 + cache_default):.2f}x**; unbounded cache: "
        f"{exported6 / (weights + stats6 + cache_all):.2f}x"
    )
    print(
        f"- 6 exported / (supernet + {len(paper) + len(extra)} subnets' stats): "
        f"**{exported6 / (weights + stats_n):.2f}x**"
    )
    print(
        f"- 4 torchvision ResNets / (supernet + {len(paper) + len(extra)} subnets' stats): "
        f"**{sum(tv.values()) / (weights + stats_n):.2f}x**"
    )
    print(
        f"- weights / largest per-subnet statistics: **{weights / max(per_subnet):.0f}x** "
        f"(largest {max(per_subnet) / 1e3:.0f} kB, smallest {min(per_subnet) / 1e3:.0f} kB)"
    )

    # -- actuation -----------------------------------------------------------------------------------------------
    for cfg in paper:
        model.actuate(cfg)
    n = 20000
    start = time.perf_counter()
    for i in range(n):
        model.actuate(paper[i % 6])
    act_us = (time.perf_counter() - start) / n * 1e6
    print(f"\n## actuation\n- model.actuate(cfg) for a registered paper subnet: **{act_us:.2f} us** (mean of {n})")
    if args.skip_forward:
        return

    # -- forward -------------------------------------------------------------------------------------------------
    forward_table(args, model, ofa_net, paper)
    if args.budgets:
        budget_curve(args, model, paper, weights + stats6, exported6)


def forward_table(args, model, ofa_net, paper) -> None:
    """Per subnet and batch size: the actuated supernet with the weight cache at its default budget and without it,
    the exported subnet and OFA's dynamic forward, interleaved."""
    cached = model  # default budget
    uncached = copy.deepcopy(model)
    uncached.set_weight_cache(0)
    no_pointwise = None
    if args.compare_pointwise:
        no_pointwise = copy.deepcopy(model)
        no_pointwise._subnetact.weight_cache.pointwise = False  # internal switch, for this comparison only
    order = "round-robin over the six subnets" if args.round_robin else "one subnet at a time"
    print(f"\n## forward (CPU, {args.clock} ms, median of {args.reps}; ratios of medians; {order})")
    print(
        "| batch | subnet | top-1 | actuated (cache) | actuated (no cache) | exported | OFA dynamic "
        "| cache/exported | no cache/exported | cache/OFA | cache MB |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    exported = [model.export(cfg).eval() for cfg in paper]
    served = list(zoo.SUPERSERVE_OFA_RESNET50)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for bs in args.batch_sizes:
            x = torch.randn(bs, 3, args.image_size, args.image_size)
            runs = []  # per subnet: (name -> callable)
            for s, cfg, dense in zip(served, paper, exported):
                arch = s.ofa_dict()

                def run_ofa(arch=arch, x=x):
                    ofa_net.set_active_subnet(**arch)
                    return ofa_net(x)

                def run_cached(cfg=cfg, x=x):
                    cached.actuate(cfg)
                    return cached(x)

                def run_uncached(cfg=cfg, x=x):
                    uncached.actuate(cfg)
                    return uncached(x)

                def run_exported(dense=dense, x=x):
                    return dense(x)

                runs.append({"cache": run_cached, "nocache": run_uncached, "exported": run_exported, "ofa": run_ofa})
                if no_pointwise is not None:

                    def run_no_pointwise(cfg=cfg, x=x):
                        no_pointwise.actuate(cfg)
                        return no_pointwise(x)

                    runs[-1]["no1x1"] = run_no_pointwise
            times = [{name: [] for name in r} for r in runs]
            cache_mb = [0.0] * len(runs)
            # (subnet, record?) in the order they run: round-robin switches subnet on every forward
            if args.round_robin:
                schedule = [(i, False) for _ in range(args.warmup) for i in range(len(runs))]
                schedule += [(i, True) for _ in range(args.reps) for i in range(len(runs))]
            else:
                schedule = [(i, r >= args.warmup) for i in range(len(runs)) for r in range(args.warmup + args.reps)]
            for i, record in schedule:
                for name, fn in runs[i].items():  # interleaved: drift on a shared machine hits every variant alike
                    t = timeit(fn, 1, args.clock_fn)
                    if record:
                        times[i][name] += t
                cache_mb[i] = cached.weight_cache_info().used_bytes / 1e6
            for s, t, mb in zip(served, times, cache_mb):
                a, u, e, o = (median(t[k]) * 1e3 for k in ("cache", "nocache", "exported", "ofa"))
                print(
                    f"| {bs} | {s.id} | {s.accuracy} | {a:.1f} | {u:.1f} | {e:.1f} | {o:.1f} | {a / e:.3f} "
                    f"| {u / e:.3f} | {a / o:.3f} | {mb:.1f} |"
                )
            ratios = [median(t["cache"]) / median(t["exported"]) for t in times]
            print(f"| {bs} | **median** | | | | | | **{median(ratios):.3f}** (max {max(ratios):.3f}) | | | |")
            if no_pointwise is not None:
                other = [median(t["no1x1"]) / median(t["exported"]) for t in times]
                print(
                    f"\n- batch {bs}, cache without 1x1 copies / exported: "
                    f"{', '.join(f'{r:.3f}' for r in other)}; median **{median(other):.3f}** (max {max(other):.3f})\n"
                )


def budget_curve(args, model, paper, base_bytes: int, exported6: int) -> None:
    """Weight-cache budget -> memory ratio and median actuated/exported over the six subnets (round-robin, so a
    budget smaller than the six subnets' copies evicts and re-copies as a server switching subnets would)."""
    print(f"\n## weight-cache budget curve (batch {args.budget_batch}, round-robin over the six subnets)")
    print(
        "| budget MB | cache MB (after the run) | 6 exported / (supernet + stats + cache) | median actuated/exported "
        "| max | MB copied per timed forward |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    exported = [model.export(cfg).eval() for cfg in paper]
    x = torch.randn(args.budget_batch, 3, args.image_size, args.image_size)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for budget in args.budgets:
            model.set_weight_cache(0)  # from an empty cache
            model.set_weight_cache(budget)
            ours = [[] for _ in paper]
            dense_t = [[] for _ in paper]
            peak = 0
            copied_before = 0
            for rep in range(args.warmup + args.reps):
                if rep == args.warmup:
                    copied_before = model.weight_cache_info().copied_bytes
                for i, (cfg, dense) in enumerate(zip(paper, exported)):

                    def run(cfg=cfg):
                        model.actuate(cfg)
                        return model(x)

                    a, e = timeit(run, 1, args.clock_fn), timeit(lambda dense=dense: dense(x), 1, args.clock_fn)
                    peak = max(peak, model.weight_cache_info().used_bytes)
                    if rep >= args.warmup:
                        ours[i] += a
                        dense_t[i] += e
            ratios = [median(a) / median(e) for a, e in zip(ours, dense_t)]
            copied = (model.weight_cache_info().copied_bytes - copied_before) / (args.reps * len(paper))
            print(
                f"| {budget:g} | {peak / 1e6:.1f} | {exported6 / (base_bytes + peak):.2f}x | {median(ratios):.3f} "
                f"| {max(ratios):.3f} | {copied / 1e6:.2f} |"
            )
    model.set_weight_cache(None)


if __name__ == "__main__":
    main()
