"""Where an actuated OFA-ResNet50 subnet spends its CPU time, op by op, next to its exported twin (issue 16).

One paper subnet, eval, ``inference_mode``: first the two models' wall-clock medians, interleaved; then
``torch.profiler``'s self CPU time per op and calls per forward for each model, the ops sorted by the larger time.

    python benchmarks/profile_ofa_ops.py --subnet 2 --batch-size 1 --threads 2
"""

from __future__ import annotations

import argparse
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

import subnetact
from subnetact import zoo

from _common import machine, median, timeit


def op_times(model: torch.nn.Module, x: torch.Tensor, forwards: int) -> dict[str, tuple[float, int]]:
    """op name -> (self CPU µs per forward, calls per forward)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(forwards):
            model(x)
    return {e.key: (e.self_cpu_time_total / forwards, e.count // forwards) for e in prof.key_averages()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subnet", type=int, default=2, help="index of the SuperServe paper subnet (0-5)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=30, help="timed forwards per model")
    parser.add_argument("--forwards", type=int, default=20, help="profiled forwards per model")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from ofa.imagenet_classification.elastic_nn.networks import OFAResNets

    torch.manual_seed(0)
    model = subnetact.convert(OFAResNets(n_classes=1000, **zoo.OFA_RESNET50_KWARGS)).eval()
    paper = [s.config(model) for s in zoo.SUPERSERVE_OFA_RESNET50]
    subnetact.calibrate(model, [torch.randn(2, 3, 32, 32)], paper)
    cfg = paper[args.subnet]
    dense = model.export(cfg).eval()
    x = torch.randn(args.batch_size, 3, 224, 224)
    print(f"# ofa_resnet50 paper subnet {args.subnet}, batch {args.batch_size}, {machine()}")
    warnings.simplefilter("ignore")
    with torch.inference_mode():
        model.actuate(cfg)
        for _ in range(5):  # warm-up, and the weight cache admits the subnet
            model(x)
            dense(x)
        actuated, exported = [], []
        for _ in range(args.reps):
            actuated += timeit(lambda: model(x), 1)
            exported += timeit(lambda: dense(x), 1)
        a, e = median(actuated) * 1e3, median(exported) * 1e3
        print(f"\nwall ms, median of {args.reps}: actuated {a:.2f}, exported {e:.2f}, ratio {a / e:.3f}\n")
        ops = {"actuated": op_times(model, x, args.forwards), "exported": op_times(dense, x, args.forwards)}
    names = sorted(
        set(ops["actuated"]) | set(ops["exported"]), key=lambda k: -max(o.get(k, (0, 0))[0] for o in ops.values())
    )
    print("| op | actuated µs | calls | exported µs | calls |")
    print("|---|---:|---:|---:|---:|")
    for name in names[: args.top]:
        (at, an), (et, en) = (ops[m].get(name, (0.0, 0)) for m in ("actuated", "exported"))
        print(f"| {name} | {at:.0f} | {an} | {et:.0f} | {en} |")


if __name__ == "__main__":
    main()
