"""Actuation latency of a registered subnet versus loading that subnet's exported weights from safetensors.

Also times ``subnetact.convert`` itself.

    python benchmarks/bench_actuation.py --arch resnet50
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import torch
import torchvision
from safetensors.torch import load_file, save_file

import subnetact

from _common import machine, median, percentile, spanning_subnets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--switches", type=int, default=20000, help="timed actuations")
    parser.add_argument("--loads", type=int, default=20, help="timed safetensors loads")
    parser.add_argument("--image-size", type=int, default=32, help="image size of the calibration batch (ViT: 224)")
    args = parser.parse_args()

    torch.manual_seed(0)
    supernet = getattr(torchvision.models, args.arch)()
    converts = []
    for _ in range(5):
        fresh = copy.deepcopy(supernet)
        start = time.perf_counter()
        subnetact.convert(fresh)
        converts.append(time.perf_counter() - start)
    model = subnetact.convert(supernet).eval()
    subnets = spanning_subnets(model.space, 6)
    subnetact.calibrate(model, [torch.randn(2, 3, args.image_size, args.image_size)], subnets=subnets)
    a, b = subnets[1], subnets[4]

    # Actuation: alternate between two registered subnets so every call is a real switch.
    for _ in range(1000):
        model.actuate(a)
        model.actuate(b)
    timings = []
    clock = time.perf_counter_ns
    for i in range(args.switches):
        cfg = a if i % 2 else b
        start = clock()
        model.actuate(cfg)
        timings.append(clock() - start)
    act_us = [t / 1e3 for t in timings]

    # Loading the same subnet's exported weights into an already-built module (the cheapest form of switching
    # models by loading: no construction, file in the page cache).
    dense = model.export(b)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "subnet.safetensors"
        save_file({k: v.contiguous() for k, v in dense.state_dict().items()}, str(path))
        size_mb = path.stat().st_size / 1e6
        loads = []
        for _ in range(args.loads + 2):
            start = time.perf_counter()
            dense.load_state_dict(load_file(str(path)))
            loads.append(time.perf_counter() - start)
        loads = loads[2:]
    load_us = [t * 1e6 for t in loads]

    print(f"# {args.arch}, {machine()}")
    print("| measurement | median | p99 |")
    print("|---|---:|---:|")
    print(f"| `actuate(registered subnet)` | {median(act_us):.2f} µs | {percentile(act_us, 99):.2f} µs |")
    print(
        f"| load exported subnet ({size_mb:.0f} MB safetensors) into a built module | {median(load_us) / 1e3:.1f} ms "
        f"| {percentile(load_us, 99) / 1e3:.1f} ms |"
    )
    print(f"| **speed-up of actuation** | **{median(load_us) / median(act_us):,.0f}x** | |")
    print(f"| `subnetact.convert({args.arch})` | {median(converts) * 1e3:.1f} ms | |")


if __name__ == "__main__":
    main()
