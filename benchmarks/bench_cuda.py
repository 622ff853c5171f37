"""GPU benchmarks of the subnetact_cuda kernels (issue 7). Needs a CUDA GPU and the built extension.

    SUBNETACT_BUILD_CUDA=1 pip install --no-build-isolation -e .
    python benchmarks/bench_cuda.py linear --batch-sizes 1 8 32 128 256
    python benchmarks/bench_cuda.py conv --batch-sizes 1 2 4 8 16 32 --dtype float16
    python benchmarks/bench_cuda.py e2e --arch resnet50 --batch-sizes 1 8 32

linear: ``sliced_linear`` reading W[:o, :i] in place vs cuBLAS (F.linear) on the pre-extracted contiguous weight,
        and F.linear on the strided view; BERT-base and ResNet classifier shapes. Target: ratio <= 1.05.
conv:   ``sliced_conv2d`` with the fused norm/ReLU epilogue (KRSC weight) vs (a) cuDNN on the pre-extracted weight
        followed by a separate norm and ReLU, (b) slice + .contiguous() + cuDNN + norm + ReLU (once-for-all's way),
        (c) cuDNN on the strided view + norm + ReLU; ResNet-50 layer shapes. Target: fused <= (a) at batch <= 8.
e2e:    the actuated model (kernels, with and without CUDA graphs, and with SUBNETACT_DISABLE_EXTENSION-equivalent
        PyTorch path) vs the exported subnet run by plain PyTorch/cuDNN, for 6 subnets spanning the space.
        Target: graphed actuated / exported median <= 1.05.

Times are medians of CUDA-synchronised ``torch.utils.benchmark`` measurements, in microseconds. Print-only;
copy results with the command line into docs/benchmarks.md.
"""

# The timed lambdas are called (by us()) before the loop moves on, so closing over loop variables is intended.
# ruff: noqa: B023

from __future__ import annotations

import argparse
import statistics
import warnings

import torch
import torch.nn.functional as F
from torch.utils import benchmark

import subnetact
import subnetact_cuda
from subnetact import ops

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# (name, O, I, o, i): full weight (O, I) and the active slice (o, i)
LINEAR_SHAPES = [
    ("bert qkv/out 768x768 @0.5", 768, 768, 768, 384),
    ("bert ffn-up 3072x768 @0.5", 3072, 768, 1536, 768),
    ("bert ffn-down 768x3072 @0.5", 768, 3072, 768, 1536),
    ("bert ffn-up 3072x768 @0.75", 3072, 768, 2304, 768),
    ("resnet fc 1000x2048 @0.65", 1000, 2048, 1000, 1336),
]

# (name, C_full, K_full, kernel, stride, input hw, fraction of channels kept)
CONV_SHAPES = [
    ("l1 1x1 64->64", 64, 64, 1, 1, 56, 0.75),
    ("l1 3x3 64->64", 64, 64, 3, 1, 56, 0.75),
    ("l1 1x1 64->256", 64, 256, 1, 1, 56, 0.75),
    ("l2 3x3 128->128 s2", 128, 128, 3, 2, 56, 0.75),
    ("l3 3x3 256->256", 256, 256, 3, 1, 14, 0.65),
    ("l3 1x1 256->1024", 256, 1024, 1, 1, 14, 0.65),
    ("l4 3x3 512->512", 512, 512, 3, 1, 7, 0.65),
    ("l4 1x1 2048->512", 2048, 512, 1, 1, 7, 0.65),
]


def us(fn, min_run_time: float) -> float:
    fn()
    torch.cuda.synchronize()
    return benchmark.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time).median * 1e6


def bench_linear(args) -> None:
    dtype = DTYPES[args.dtype]
    print(f"# sliced_linear, {args.dtype}, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| shape | batch | sliced_linear us | cuBLAS contiguous us | strided view us | ratio (<= 1.05) |")
    print("|---|---|---|---|---|---|")
    for name, o_full, i_full, o, i in LINEAR_SHAPES:
        w = torch.randn(o_full, i_full, device="cuda", dtype=dtype) / i_full**0.5
        b = torch.randn(o_full, device="cuda", dtype=dtype)
        w_packed, b_packed = w[:o, :i].contiguous(), b[:o].contiguous()
        for batch in args.batch_sizes:
            x = torch.randn(batch, i, device="cuda", dtype=dtype)
            t_op = us(lambda: ops.sliced_linear(x, w, b, out_features=o), args.min_run_time)
            t_packed = us(lambda: F.linear(x, w_packed, b_packed), args.min_run_time)
            t_view = us(lambda: F.linear(x, w[:o, :i], b[:o]), args.min_run_time)
            print(f"| {name} | {batch} | {t_op:.1f} | {t_packed:.1f} | {t_view:.1f} | {t_op / t_packed:.3f} |")


def bench_conv(args) -> None:
    dtype = DTYPES[args.dtype]
    print(
        f"# sliced_conv2d + fused epilogue, {args.dtype}, channels-last activations, "
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cudnn.benchmark={args.cudnn_benchmark}"
    )
    print(
        "| layer | batch | fused us | (a) cuDNN packed + norm + relu us | (b) slice+contiguous+cuDNN us "
        "| (c) strided view us | fused / (a) |"
    )
    print("|---|---|---|---|---|---|---|")
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    for name, c_full, k_full, k, stride, hw, frac in CONV_SHAPES:
        c, o = max(1, round(c_full * frac)), max(1, round(k_full * frac))
        w = torch.randn(k_full, c_full, k, k, device="cuda", dtype=dtype) / (c_full * k * k) ** 0.5
        w_krsc = w.to(memory_format=torch.channels_last)  # the layout the kernel is meant for
        w_packed = w[:o, :c].contiguous(memory_format=torch.channels_last)
        mean, var = torch.randn(k_full, device="cuda", dtype=dtype), torch.rand(k_full, device="cuda", dtype=dtype) + 1
        gamma, beta = (
            torch.rand(k_full, device="cuda", dtype=dtype) + 0.5,
            torch.randn(k_full, device="cuda", dtype=dtype),
        )
        scale, shift = ops.fold_norm(mean[:o], var[:o], gamma, beta, eps=1e-5)
        pad = k // 2

        def norm_relu(y):
            return F.relu(F.batch_norm(y, mean[:o], var[:o], gamma[:o], beta[:o], False, 0.0, 1e-5))

        for batch in args.batch_sizes:
            x = torch.randn(batch, c, hw, hw, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)

            def fused():
                return ops.sliced_conv2d(
                    x,
                    w_krsc,
                    scale=scale,
                    shift=shift,
                    out_channels=o,
                    in_channels=c,
                    stride=stride,
                    padding=pad,
                    relu=True,
                )

            t_fused = us(fused, args.min_run_time)
            t_a = us(lambda: norm_relu(F.conv2d(x, w_packed, None, stride, pad)), args.min_run_time)
            t_b = us(lambda: norm_relu(F.conv2d(x, w_krsc[:o, :c].contiguous(), None, stride, pad)), args.min_run_time)
            t_c = us(lambda: norm_relu(F.conv2d(x, w_krsc[:o, :c], None, stride, pad)), args.min_run_time)
            print(
                f"| {name} @{frac} | {batch} | {t_fused:.1f} | {t_a:.1f} | {t_b:.1f} | {t_c:.1f} "
                f"| {t_fused / t_a:.3f} |"
            )


def _spanning(space, n):
    depth_entries, width_entries = space.entries("depth"), space.entries("width")
    out = []
    for j in range(n):
        t = j / (n - 1)
        out.append(
            space.make(
                depth=[e.choices[round(t * (len(e.choices) - 1))] for e in depth_entries],
                width=[e.choices[round(t * (len(e.choices) - 1))] for e in width_entries],
            )
        )
    return out


def bench_e2e(args) -> None:
    import os

    import torchvision

    from subnetact.cuda_graphs import capture

    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)
    model = subnetact.convert(getattr(torchvision.models, args.arch)()).eval()
    subnets = _spanning(model.space, args.subnets)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", subnetact.UncalibratedSubnetWarning)
        subnetact.calibrate(model, [torch.randn(8, 3, 64, 64)], subnets=subnets)
    exported = {cfg: model.export(cfg).eval().to("cuda", dtype, memory_format=torch.channels_last) for cfg in subnets}
    model = model.to("cuda", dtype, memory_format=torch.channels_last)
    print(
        f"# {args.arch} end to end, {args.dtype}, channels-last, {torch.cuda.get_device_name()}, "
        f"torch {torch.__version__}, kernels loaded: {subnetact_cuda.available()}"
    )
    sample = torch.randn(1, 3, args.image_size, args.image_size, device="cuda", dtype=dtype)
    sample = sample.to(memory_format=torch.channels_last)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", subnetact.UncalibratedSubnetWarning)
        graphed = capture(model, subnets, args.batch_sizes, sample=sample)
    print(
        "| batch | subnet | exported us | actuated (kernels) us | actuated + graphs us | actuated (PyTorch path) us "
        "| graphs / exported |"
    )
    print("|---|---|---|---|---|---|---|")
    ratios = []
    with torch.no_grad():
        for batch in args.batch_sizes:
            x = sample.expand(batch, -1, -1, -1).contiguous(memory_format=torch.channels_last)
            for j, cfg in enumerate(subnets):
                t_exp = us(lambda: exported[cfg](x), args.min_run_time)
                t_act = us(lambda: model(x, subnet=cfg), args.min_run_time)
                t_graph = us(lambda: graphed(x, subnet=cfg), args.min_run_time)
                os.environ[subnetact_cuda.DISABLE_ENV] = "1"
                model._subnetact.invalidate()
                t_torch = us(lambda: model(x, subnet=cfg), args.min_run_time)
                del os.environ[subnetact_cuda.DISABLE_ENV]
                model._subnetact.invalidate()
                ratios.append(t_graph / t_exp)
                print(
                    f"| {batch} | {j} | {t_exp:.0f} | {t_act:.0f} | {t_graph:.0f} | {t_torch:.0f} "
                    f"| {t_graph / t_exp:.3f} |"
                )
    print(f"\nmedian graphs / exported over {len(ratios)} (subnet, batch) pairs: {statistics.median(ratios):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["linear", "conv", "e2e"])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float16")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None)
    parser.add_argument("--min-run-time", type=float, default=0.2, help="seconds of measurement per point")
    parser.add_argument("--cudnn-benchmark", action="store_true", help="let cuDNN autotune (conv)")
    parser.add_argument("--arch", default="resnet50", help="torchvision builder (e2e)")
    parser.add_argument("--subnets", type=int, default=6, help="subnets spanning the space (e2e)")
    parser.add_argument("--image-size", type=int, default=224)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    if not subnetact_cuda.available():
        parser.error(
            "the subnetact_cuda extension is not built (or SUBNETACT_DISABLE_EXTENSION is set); build it with "
            "SUBNETACT_BUILD_CUDA=1 pip install --no-build-isolation -e ."
        )
    if args.batch_sizes is None:
        args.batch_sizes = {"linear": [1, 8, 32, 128, 256], "conv": [1, 2, 4, 8, 16, 32], "e2e": [1, 8, 32]}[args.what]
    {"linear": bench_linear, "conv": bench_conv, "e2e": bench_e2e}[args.what](args)


if __name__ == "__main__":
    main()
