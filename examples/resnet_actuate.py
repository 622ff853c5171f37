"""Convert a torchvision ResNet into an actuatable supernet, switch between three subnets, and time them.

    python examples/resnet_actuate.py --arch resnet50

The weights are random (nothing is downloaded); with a trained supernet, pass your own model and calibrate with
real images (a few thousand from the training set, as once-for-all does).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torchvision

import subnetact


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="resnet50", help="any torchvision ResNet / ResNeXt / Wide ResNet builder")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--reps", type=int, default=10, help="timed forwards per subnet (batch 1)")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = subnetact.convert(getattr(torchvision.models, args.arch)()).eval()  # in place: same weights
    print(model.space)

    space = model.space
    subnets = {
        "smallest": space.min(),
        "middle": space.make(depth=[(e.choices[0] + e.choices[-1]) // 2 for e in space.entries("depth")], width=0.5),
        "largest": space.max(),
    }
    # Per-subnet BatchNorm statistics for the served set (random images here; use real ones in practice).
    calibration = [torch.randn(16, 3, 64, 64) for _ in range(2)]
    subnetact.calibrate(model, calibration, subnets=list(subnets.values()))

    x = torch.randn(1, 3, args.image_size, args.image_size)
    print(f"\n{'subnet':>9} | {'params':>8} | {'actuate':>9} | {'forward (batch 1)':>17}")
    with torch.inference_mode():
        for name, cfg in subnets.items():
            start = time.perf_counter()
            model.actuate(cfg)  # O(1): one swap of a precompiled plan
            actuate_us = (time.perf_counter() - start) * 1e6
            params = sum(p.numel() for p in model.export().parameters())  # the subnet's own parameter count
            model(x)  # warm-up
            times = []
            for _ in range(args.reps):
                start = time.perf_counter()
                model(x)
                times.append(time.perf_counter() - start)
            forward_ms = statistics.median(times) * 1e3
            print(f"{name:>9} | {params / 1e6:7.1f}M | {actuate_us:7.1f}µs | {forward_ms:14.1f} ms")


if __name__ == "__main__":
    main()
