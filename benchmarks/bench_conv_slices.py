"""One 3x3 convolution with a sliced input dimension, four ways (issue 16), at OFA-ResNet50's slice shapes.

- view: ``F.conv2d`` on the strided view ``W[:o, :i]`` (PyTorch copies it into a fresh allocation every call);
- copy: ``F.conv2d`` on a contiguous copy of the slice (what the weight cache keeps; what an extracted subnet runs);
- unfold: ``unfold(x)^T @ W2d^T`` reading the strided slice in place (``subnetact.weight_slice._unfold_conv``);
- prepacked: oneDNN's blocked weight made once (``mkldnn_reorder_conv2d_weight``) and
  ``torch.ops.mkldnn._convolution_pointwise``.

CPU time of this process (``time.process_time``), median of ``--reps``.

    python benchmarks/bench_conv_slices.py --threads 1 --reps 25
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from subnetact.weight_slice import _unfold_conv

from _common import machine, median, timeit

# (batch, full channels, active channels, input size, stride): 3x3 convolutions of the six SuperServe subnets
SHAPES = [
    (1, 720, 576, 7, 1),
    (1, 720, 408, 7, 1),
    (1, 512, 408, 14, 2),
    (1, 512, 408, 14, 1),
    (1, 512, 208, 14, 1),
    (1, 256, 160, 28, 1),
    (1, 128, 40, 56, 1),
    (2, 720, 576, 7, 1),
    (8, 720, 576, 7, 1),
    (8, 256, 160, 28, 1),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=25)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"# {machine()}, CPU ms (process time), median of {args.reps}")
    print("| batch | slice (o x i x 3 x 3) | input | stride | slice MB | view | copy | unfold | prepacked |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|")
    with torch.inference_mode():
        for n, full, k, size, stride in SHAPES:
            ms = measure(n, full, k, size, stride, args.reps)
            print(
                f"| {n} | {k} x {k} of {full} | {size}x{size} | {stride} | {k * k * 9 * 4 / 1e6:.1f} | "
                + " | ".join(f"{t:.2f}" for t in ms.values())
                + " |"
            )


def measure(n: int, full: int, k: int, size: int, stride: int, reps: int) -> dict[str, float]:
    """CPU ms (median) of each variant for ``W[:k, :k]`` of a (full, full, 3, 3) weight on a (n, k, size, size)
    input."""
    conv = torch.nn.Conv2d(full, full, 3, stride=stride, padding=1, bias=False)
    weight = conv.weight.detach()
    x = torch.randn(n, k, size, size)
    view = weight[:k, :k]
    copy = view.contiguous()
    w2d = weight.view(full, full * 9)[:k, : k * 9]  # (k, k * 9) strided: each row's first k * 9 values
    out = F.conv2d(x, copy, None, stride, 1)
    packed = torch._C._nn.mkldnn_reorder_conv2d_weight(
        copy.to_mkldnn(), [1, 1], [stride, stride], [1, 1], 1, list(x.shape)
    )
    variants = {
        "view": lambda: F.conv2d(x, view, None, stride, 1),
        "copy": lambda: F.conv2d(x, copy, None, stride, 1),
        "unfold": lambda: _unfold_conv(x, w2d, None, conv, out.shape[2], out.shape[3]),
        "prepacked": lambda: torch.ops.mkldnn._convolution_pointwise(
            x, packed, None, [1, 1], [stride, stride], [1, 1], 1, "none", [], ""
        ),
    }
    for fn in variants.values():
        torch.testing.assert_close(fn(), out, rtol=1e-3, atol=1e-3)
    times = {name: [] for name in variants}
    for _ in range(3):
        for fn in variants.values():
            fn()
    for _ in range(reps):  # interleaved
        for name, fn in variants.items():
            times[name] += timeit(fn, 1, time.process_time)
    return {name: median(t) * 1e3 for name, t in times.items()}


if __name__ == "__main__":
    main()
