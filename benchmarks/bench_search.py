"""Time subnetact.search on once-for-all's ResNet-50 space with a FLOPs cost model (issue 6 target: <= 2 minutes).

    python benchmarks/bench_search.py [--generations 500] [--population 100] [--constraints 6] [--threads 1]

The supernet is ``OFAResNets(**zoo.OFA_RESNET50_KWARGS)`` with random weights (nothing is downloaded), converted by
``subnetact.convert``. Cost: :class:`subnetact.search.FlopsModel` at 224x224 (its MFLOPs for the paper's six subnets
are printed next to the search-time estimates shipped with them). Accuracy: an :class:`AccuracyPredictor` (an MLP,
once-for-all's predictor architecture) fitted on ``--samples`` subnets labelled by a *synthetic* smooth function of
their FLOPs and choices, because the real predictor needs ImageNet; the search's work (predictor calls, FLOPs calls,
evolution) is the same as with a real one, so the timing is representative, the accuracies are not.
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from ofa.imagenet_classification.elastic_nn.networks import OFAResNets

import subnetact
from subnetact import zoo
from subnetact.search import AccuracyPredictor, FlopsModel, search


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--population", type=int, default=100)
    parser.add_argument("--generations", type=int, default=500)
    parser.add_argument("--constraints", type=int, default=6, help="FLOP constraints (the paper serves 6 subnets)")
    parser.add_argument("--samples", type=int, default=1000, help="synthetic-labelled subnets to fit the predictor")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    model = subnetact.convert(OFAResNets(**zoo.OFA_RESNET50_KWARGS)).eval()
    space = model.space
    print(f"space: {space.size:.3g} subnets")
    start = time.perf_counter()
    flops = FlopsModel(model, torch.randn(1, 3, 224, 224))
    build_s = time.perf_counter() - start
    print(f"FlopsModel built in {build_s:.2f}s (one forward of the largest subnet at 224x224)")
    for s in zoo.SUPERSERVE_OFA_RESNET50:
        ours = flops(s.config(model)) / 1e6
        print(f"  paper subnet {s.id}: ours {ours:8.1f} MFLOPs, shipped search estimate {s.predicted_mflops:8.1f}")
    rng = random.Random(args.seed)
    t = time.perf_counter()
    n = 2000
    sample = [space.sample(rng) for _ in range(n)]
    for c in sample:
        flops(c)
    per_call_us = (time.perf_counter() - t) / n * 1e6
    print(f"FLOPs of a new subnet: {per_call_us:.1f} us")

    # Synthetic accuracy: diminishing returns in FLOPs plus a fixed random effect per choice (see the docstring).
    top = flops(space.max())
    effect = {
        (d, i, v): rng.uniform(-0.4, 0.4)
        for d in space.dims
        for i, e in enumerate(space.entries(d))
        for v in e.choices
    }

    def synthetic(cfg):
        bonus = sum(effect[(d, i, v)] for d in space.dims for i, v in enumerate(cfg[d])) / 10
        return 70.0 + 10.0 * (flops(cfg) / top) ** 0.5 + bonus

    t = time.perf_counter()
    configs = [space.sample(rng) for _ in range(args.samples)]
    predictor = AccuracyPredictor(space, seed=args.seed).fit(configs, [synthetic(c) for c in configs])
    fit_s = time.perf_counter() - t
    print(f"predictor fitted on {args.samples} synthetic-labelled subnets in {fit_s:.1f}s")

    result = search(
        model,
        predictor=predictor,
        cost=flops,
        num_constraints=args.constraints,
        population=args.population,
        generations=args.generations,
        seed=args.seed,
    )
    print(
        f"search: {args.constraints} constraints x {args.generations} generations x population {args.population}: "
        f"{result.seconds:.1f}s, {result.cost_calls} FLOPs calls, {len(result.pareto)} Pareto subnets"
    )
    for c in result.pareto:
        print(f"  {c.cost / 1e6:8.1f} MFLOPs  predicted (synthetic) accuracy {c.accuracy:.2f}")
    total = build_s + result.seconds
    print(f"total (FlopsModel + search, predictor fitting excluded): {total:.1f}s; target <= 120s")


if __name__ == "__main__":
    main()
