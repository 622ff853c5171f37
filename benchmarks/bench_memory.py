"""Memory: supernet weights plus per-subnet statistics of N registered subnets, versus separately exported subnets;
and the weight cache of the 6 served subnets (issue 16) at its default budget, without a budget and at
``--cache-mb`` budgets.

python benchmarks/bench_memory.py --arch resnet50 --registered 6 500 --cache-mb 0 5 10 20 40
"""

from __future__ import annotations

import argparse
import random

import torch
import torchvision
from torch import nn

import subnetact

from _common import cache_peak_bytes, machine, spanning_subnets


def nbytes(module: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--registered", type=int, nargs="+", default=[6, 500])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-mb", type=float, nargs="*", default=[], help="further weight-cache budgets (MB)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = subnetact.convert(getattr(torchvision.models, args.arch)()).eval()
    weights = nbytes(model)
    six = spanning_subnets(model.space, 6)
    exported_six = sum(nbytes(model.export(cfg)) for cfg in six)
    calibration = [torch.randn(2, 3, 32, 32)]

    print(f"# {args.arch}, {machine()}")
    print(f"supernet weights + buffers: {weights / 1e6:.1f} MB")
    print(f"the 6 spanning subnets exported: {exported_six / 1e6:.1f} MB")
    print()
    print(
        "| registered subnets | statistics total | mean per subnet | per subnet / weights | supernet + statistics "
        "| 6 exported subnets / (supernet + statistics) |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    rng = random.Random(args.seed)
    for n in args.registered:
        subnets = list(six) if n <= 6 else list(six) + [model.space.sample(rng) for _ in range(n - 6)]
        subnets = list(dict.fromkeys(subnets))[:n]
        model._subnetact.stats.clear()
        subnetact.calibrate(model, calibration, subnets=subnets)
        stats = sum(t.numel() * t.element_size() for t in model._subnetact.stats.values())
        per = stats / len(subnets)
        total = weights + stats
        print(
            f"| {len(subnets)} | {stats / 1e6:.2f} MB | {per / 1e3:.1f} kB | 1/{weights / per:,.0f} "
            f"| {total / 1e6:.1f} MB | {exported_six / total:.2f}x |"
        )

    # -- weight cache of the 6 served subnets -------------------------------------------------------------------
    model._subnetact.stats.clear()
    subnetact.calibrate(model, calibration, subnets=six)
    stats6 = sum(t.numel() * t.element_size() for t in model._subnetact.stats.values())
    default_mb = model.weight_cache_info().budget_bytes / 1e6
    print("\nWeight cache of the 6 served subnets (the most it holds while they run round-robin):\n")
    print(
        "| budget | cache | supernet + 6 subnets' statistics + cache | 6 exported subnets / (supernet + statistics "
        "+ cache) |"
    )
    print("|---|---:|---:|---:|")
    for label, mb in [(f"default ({default_mb:.1f} MB)", None), ("unbounded", 1e6)] + [
        (f"{b:g} MB", b) for b in args.cache_mb
    ]:
        cache = cache_peak_bytes(model, six, mb)
        total = weights + stats6 + cache
        print(f"| {label} | {cache / 1e6:.1f} MB | {total / 1e6:.1f} MB | {exported_six / total:.2f}x |")


if __name__ == "__main__":
    main()
