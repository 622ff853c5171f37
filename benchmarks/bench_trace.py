"""Our recording trace vs torch-pruning's ``DependencyGraph`` on torchvision models: time and number of coupled
channel groups (the measurement behind the trace decision in ``docs/design.md``).

    python benchmarks/bench_trace.py
    python benchmarks/bench_trace.py --models resnet50 vit_b_16
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from subnetact.trace import trace_channels  # noqa: E402

MODELS = {
    "resnet50": 64,
    "mobilenet_v3_large": 64,
    "efficientnet_b0": 64,
    "densenet121": 64,
    "convnext_tiny": 64,
    "vit_b_16": 224,
    "swin_t": 64,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch_pruning as tp
    import torchvision

    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)
    print(f"# torch-pruning {tp.__version__}, {args.threads} thread(s), load average {os.getloadavg()[0]:.1f}")
    print("| model | input | plain forward | our trace | torch-pruning | groups: ours / torch-pruning |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        size = MODELS.get(name, 64)
        model = torchvision.models.get_model(name, num_classes=10).eval()
        x = torch.randn(1, 3, size, size)
        with torch.no_grad():
            t = time.perf_counter()
            model(x)
            plain = time.perf_counter() - t
            t = time.perf_counter()
            trace = trace_channels(model, (x,), {})
            ours = time.perf_counter() - t
        roots = {trace.groups.find(g) for use in trace.layers.values() for g in use.outs + use.ins}
        t = time.perf_counter()
        graph = tp.DependencyGraph().build_dependency(model, example_inputs=x)
        theirs = time.perf_counter() - t
        n_tp = sum(1 for _ in graph.get_all_groups())
        print(f"| {name} | {size} px | {plain:.2f} s | {ours:.2f} s | {theirs:.2f} s | {len(roots)} / {n_tp} |")


if __name__ == "__main__":
    main()
