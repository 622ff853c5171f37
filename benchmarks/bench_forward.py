"""Forward time of the actuated supernet divided by forward time of the exported subnet (CPU, eval, no_grad).

For each of 6 subnets spanning the space (all registered), the actuated model with its weight cache at the default
budget, the same model without the cache (``set_weight_cache(0)``) and ``model.export(cfg)`` run interleaved,
``--reps`` times each, and the ratio of medians is reported; the headline is the median ratio over the 6 subnets.

    python benchmarks/bench_forward.py --arch resnet50 --batch-sizes 1 16 --threads 1 --clock cpu
"""

from __future__ import annotations

import argparse
import copy
import time
import warnings

import torch
import torchvision

import subnetact

from _common import machine, median, spanning_subnets, timeit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="resnet50", help="torchvision model builder name")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument(
        "--calib-size", type=int, default=64, help="image size of the calibration batch (ViT: its --image-size)"
    )
    parser.add_argument("--reps", type=int, default=15, help="timed forwards per model and subnet")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--subnets", type=int, default=6)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall clock, or this process's CPU time (steadier on a loaded shared machine)",
    )
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    torch.manual_seed(0)
    model = subnetact.convert(getattr(torchvision.models, args.arch)()).eval()
    subnets = spanning_subnets(model.space, args.subnets)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", subnetact.UncalibratedSubnetWarning)
        subnetact.calibrate(model, [torch.randn(8, 3, args.calib_size, args.calib_size)], subnets=subnets)
    exported = {cfg: model.export(cfg).eval() for cfg in subnets}
    uncached = copy.deepcopy(model)
    uncached.set_weight_cache(0)
    budget = model.weight_cache_info().budget_bytes / 1e6
    print(f"# {args.arch}, image {args.image_size}, {machine()}, {args.clock} clock")
    print(f"weight cache: default budget {budget:.1f} MB")
    print(
        "| batch | subnet | params (M) | actuated ms | no cache ms | exported ms | ratio | no cache ratio | cache MB |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    with torch.inference_mode():
        for bs in args.batch_sizes:
            x = torch.randn(bs, 3, args.image_size, args.image_size)
            ratios = []
            for cfg in subnets:
                dense = exported[cfg]
                model.actuate(cfg)
                uncached.actuate(cfg)
                for _ in range(args.warmup):
                    model(x)
                    uncached(x)
                    dense(x)
                act, raw, exp = [], [], []
                for _ in range(args.reps):  # interleaved, so drift on a shared machine hits all alike
                    act += timeit(lambda x=x: model(x), 1, clock)
                    raw += timeit(lambda x=x: uncached(x), 1, clock)
                    exp += timeit(lambda x=x, dense=dense: dense(x), 1, clock)
                ratio = median(act) / median(exp)
                ratios.append(ratio)
                params = sum(p.numel() for p in dense.parameters()) / 1e6
                label = f"d={list(cfg.depth)} w={cfg.width[0]}..{cfg.width[-1]}"
                act_ms, raw_ms, exp_ms = median(act) * 1e3, median(raw) * 1e3, median(exp) * 1e3
                cache_mb = model.weight_cache_info().used_bytes / 1e6
                print(
                    f"| {bs} | {label} | {params:.1f} | {act_ms:.2f} | {raw_ms:.2f} | {exp_ms:.2f} | {ratio:.3f} "
                    f"| {raw_ms / exp_ms:.3f} | {cache_mb:.1f} |"
                )
            print(
                f"| {bs} | **median over {len(subnets)} subnets** | | | | | **{median(ratios):.3f}** "
                f"(max {max(ratios):.3f}) | | |"
            )


if __name__ == "__main__":
    main()
