"""One 1x1 convolution with a sliced input dimension, three ways (issue 16), at OFA-ResNet50's slice shapes.

- mm (view): one GEMM reading the strided view ``W[:o, :i]`` in place, what the actuated layer runs without a copy
  (``torch.mm`` at batch 1, ``torch.bmm`` otherwise);
- mm (copy): the same GEMM on a contiguous copy of the slice (does the stride cost anything?);
- conv (copy): ``F.conv2d`` (oneDNN) on the contiguous copy, what the weight cache's copy runs and what the
  extracted subnet runs.

Wall clock (the question is how the kernels use two threads), minimum and median of ``--reps`` after 5 warm-ups.

    python benchmarks/bench_pointwise.py --threads 2 --reps 60
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from _common import machine, median

# (batch, full out, full in, active out, active in, input size): 1x1 convolutions of the SuperServe subnets
SHAPES = [
    (1, 2048, 1024, 2048, 816, 7),
    (1, 2048, 720, 2048, 512, 7),
    (8, 2048, 1024, 2048, 816, 7),
    (1, 720, 1024, 512, 816, 14),
    (1, 1024, 512, 816, 336, 14),
    (1, 1024, 360, 816, 160, 14),
    (1, 512, 256, 336, 208, 28),
    (1, 512, 176, 336, 64, 28),
    (1, 88, 64, 40, 48, 56),
]


def timings(fn, reps: int) -> tuple[float, float]:
    """(min, median) wall seconds of ``reps`` calls after 5 warm-ups."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"# {machine()}; wall us, min / median of {args.reps}")
    print("| batch | slice (o x i of O x I) | input | mm (view) | mm (copy) | conv (copy) | conv / mm (view), min |")
    print("|---:|---|---|---:|---:|---:|---:|")
    with torch.inference_mode():
        for n, full_o, full_i, o, i, hw in SHAPES:
            weight = torch.randn(full_o, full_i, 1, 1)
            view, copy = weight[:o, :i, 0, 0], weight[:o, :i].contiguous()
            flat = copy[:, :, 0, 0]
            x = torch.randn(n, i, hw, hw)
            cols = x.view(n, i, hw * hw)

            def gemm(w, cols=cols, n=n, o=o, i=i):
                return torch.mm(w, cols[0]) if n == 1 else torch.bmm(w.expand(n, o, i), cols)

            def conv(x=x, copy=copy):
                return F.conv2d(x, copy)

            reference = conv().flatten(1)
            for got in (gemm(view), gemm(flat)):
                torch.testing.assert_close(got.reshape(n, -1), reference, rtol=1e-4, atol=1e-3)
            results = [timings(fn, args.reps) for fn in (lambda v=view: gemm(v), lambda f=flat: gemm(f), conv)]
            cells = " | ".join(f"{lo * 1e6:.0f} / {mid * 1e6:.0f}" for lo, mid in results)
            ratio = results[2][0] / results[0][0]
            print(f"| {n} | {o} x {i} of {full_o} x {full_i} | {hw}x{hw} | {cells} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
