"""``subnetact.convert`` time on torchvision models, next to the plain forward it is made of (issue 11's targets:
resnet50 <= 1 s; the largest torchvision model <= 5 s).

Per model: median convert seconds over ``--reps`` (convert, then ``unconvert``, on the same model), and the median of
a plain forward of the original on the example input convert picked (batch 1, the smallest size the model takes), at
the thread count convert runs its forwards with (one). ``convert / forward`` says how many forwards convert costs:
the trace's (which is also the original's reference output), the largest subnet's, and since issue 21 the smallest
and one random subnet's, each also exported (a copy of its weights) and run as the export.

    python benchmarks/bench_convert.py --models resnet50 regnet_y_128gf vit_h_14 --reps 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import torch

import subnetact
from subnetact.verify import candidate_calls, plain_output


def forward_seconds(model: torch.nn.Module, reps: int) -> float:
    """Median seconds of a plain one-thread forward on the first example input ``model`` accepts."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for call in candidate_calls(model, None):
            try:
                plain_output(model, call)  # warm-up, and does the model take this size?
            except Exception:  # noqa: BLE001 (convert tries the next size too)
                continue
            times = []
            for _ in range(reps):
                start = time.perf_counter()
                plain_output(model, call)
                times.append(time.perf_counter() - start)
            return statistics.median(times)
    finally:
        torch.set_num_threads(threads)
    raise RuntimeError("no example input works")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet50", "regnet_y_128gf", "vit_h_14"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads first (0: leave as is)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    import torchvision

    print("| model | params (M) | convert (s), median | runs (s) | plain forward (s) | convert / forward |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        torch.manual_seed(0)
        model = torchvision.models.get_model(name).eval()
        runs = []
        for _ in range(args.reps):
            start = time.perf_counter()
            subnetact.convert(model)
            runs.append(time.perf_counter() - start)
            subnetact.unconvert(model)
        fwd = forward_seconds(model, args.reps)
        conv = statistics.median(runs)
        params = sum(p.numel() for p in model.parameters()) / 1e6
        shown = ", ".join(f"{r:.2f}" for r in runs)
        print(f"| {name} | {params:.1f} | {conv:.2f} | {shown} | {fwd:.2f} | {conv / fwd:.1f} |", flush=True)
    print(f"\n{torch.get_num_threads()} thread(s) outside convert; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
