"""Once-for-All ResNet-50 (``ofa_resnet50``) served the SubNetAct way: memory, actuation latency, forward time.

- memory: the converted supernet plus per-subnet statistics for the 6 SuperServe subnets and for N random subnets
  (really calibrated, on tiny inputs: the statistics' size does not depend on the input size), versus the 6
  exported subnets and versus torchvision's resnet18/34/50/101 (parameters + buffers, fp32, 1000 classes);
- actuation: ``model.actuate(cfg)`` for registered subnets (median);
- forward (CPU, eval, inference_mode): the actuated supernet vs the exported subnet vs once-for-all's own dynamic
  forward (``set_active_subnet`` + forward, which slices and copies weights every call), interleaved; medians and
  ratios per subnet.

    python benchmarks/bench_ofa.py --batch-sizes 1 16 --reps 7 --random-subnets 500
"""

from __future__ import annotations

import argparse
import random
import time
import warnings

import torch

import subnetact
from subnetact import zoo

from _common import machine, median, timeit


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
    args = parser.parse_args()

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
    print(f"| 6 exported paper subnets | {exported6 / mb:.1f} |")
    for name, b in tv.items():
        print(f"| torchvision {name} | {b / mb:.1f} |")
    print(f"| torchvision resnet18+34+50+101 | {sum(tv.values()) / mb:.1f} |")
    print(f"\n- 6 exported / (supernet + 6 subnets' stats): **{exported6 / (weights + stats6):.2f}x**")
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
    print("\n## forward (CPU, ms, median; ratios of medians)")
    print("| batch | subnet | top-1 | actuated | exported | OFA dynamic | actuated/exported | actuated/OFA |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    exported = [model.export(cfg).eval() for cfg in paper]
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for bs in args.batch_sizes:
            x = torch.randn(bs, 3, args.image_size, args.image_size)
            for served, cfg, dense in zip(zoo.SUPERSERVE_OFA_RESNET50, paper, exported):
                arch = served.ofa_dict()

                def run_ofa(arch=arch, x=x):
                    ofa_net.set_active_subnet(**arch)
                    return ofa_net(x)

                def run_ours(cfg=cfg, x=x):
                    model.actuate(cfg)
                    return model(x)

                for _ in range(args.warmup):
                    run_ours(), dense(x), run_ofa()
                ours, dense_t, ofa_t = [], [], []
                for _ in range(args.reps):  # interleaved: drift on a shared machine hits all three alike
                    ours += timeit(run_ours, 1)
                    dense_t += timeit(lambda dense=dense, x=x: dense(x), 1)
                    ofa_t += timeit(run_ofa, 1)
                a, e, o = median(ours) * 1e3, median(dense_t) * 1e3, median(ofa_t) * 1e3
                print(
                    f"| {bs} | {served.id} | {served.accuracy} | {a:.1f} | {e:.1f} | {o:.1f} | {a / e:.3f} | "
                    f"{a / o:.3f} |"
                )


if __name__ == "__main__":
    main()
