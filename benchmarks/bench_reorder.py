"""Importance reordering on a conventionally trained model: accuracy of small subnets before and after
``subnetact.importance.reorder_channels``, with no supernet training (issue 11, item 7).

A :class:`subnetact.digits.DigitsResNet` is trained normally (the full model only) on scikit-learn's digits, then
converted twice: as trained, and reordered (each channel group's most important channels first, by the L1 norm of
the weights reading them). Each width subnet (full depth) is calibrated on the training images and evaluated on the
test images.

    python benchmarks/bench_reorder.py --epochs 30
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import subnetact  # noqa: E402
from subnetact.digits import DigitsResNet, to_input  # noqa: E402
from subnetact.importance import reorder_channels  # noqa: E402


def accuracy(model, x, y, cfg) -> float:
    with torch.no_grad():
        return (model(x, subnet=cfg).argmax(1) == y).float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    digits = load_digits()
    xtr, xte, ytr, yte = train_test_split(
        digits.images, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
    xtr, xte = to_input(xtr), to_input(xte)
    ytr, yte = torch.as_tensor(ytr), torch.as_tensor(yte)

    model = DigitsResNet()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(args.epochs):
        model.train()
        for idx in torch.randperm(len(xtr)).split(64):
            opt.zero_grad()
            F.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
            opt.step()
    model.eval()

    widths = (0.25, 0.5, 0.75, 1.0)
    plain = subnetact.convert(copy.deepcopy(model), subnetact.ConvertConfig(width_choices=widths))
    reordered = subnetact.convert(copy.deepcopy(model), subnetact.ConvertConfig(width_choices=widths))
    reorder_channels(reordered)
    n_width = len(plain.space.entries("width"))
    cfgs = [plain.space.max().replace(width=[w] * n_width) for w in widths]
    batches = list(xtr.split(256))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", subnetact.UncalibratedSubnetWarning)
        for m in (plain, reordered):
            subnetact.calibrate(m, batches, subnets=cfgs)
    print(f"# DigitsResNet trained {args.epochs} epochs (full model only), test accuracy per width (full depth)")
    print("| width | as trained | reordered |")
    print("|---|---|---|")
    for w, cfg in zip(widths, cfgs):
        print(f"| {w} | {accuracy(plain, xte, yte, cfg):.3f} | {accuracy(reordered, xte, yte, cfg):.3f} |")


if __name__ == "__main__":
    main()
