"""A conventionally trained digits CNN, converted and distilled, against the shipped digits supernet's served set.

    PYTHONPATH=. python benchmarks/distill_digits.py --pretrain-epochs 30 --epochs 90

1. Train :func:`subnetact.digits.build` (the shipped architecture) the ordinary way: the full network only, cross
   entropy on augmented views of the training split of ``scripts/train_digits_supernet.py`` (same split, seed and
   augmentation as the shipped supernet).
2. Convert it with the shipped ``CONVERT_CONFIG`` and distil it without labels on augmented training views
   (``subnetact.train.distill``, sandwich rule, channels reordered first), once with the frozen original as the
   teacher and once in place (the largest subnet as the teacher).
3. Calibrate the shipped served set's configs (the same subnets, so equal FLOPs) on training views and measure their
   accuracy on the shipped held-out views (:func:`subnetact.digits.test_set`), next to the shipped supernet's.

CPU time is process time (the machine is shared).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import subnetact
from subnetact import digits
from subnetact.train import Sandwich, distill

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from train_digits_supernet import split  # noqa: E402  (the shipped supernet's data split)


@torch.no_grad()
def accuracy(model, cfg, x, y) -> float:
    model.eval()
    out = model(x) if cfg is None else model(x, subnet=cfg)
    return 100.0 * float((out.argmax(1) == y).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pretrain-epochs", type=int, default=30)
    parser.add_argument(
        "--epochs", type=int, default=90, help="distillation epochs (30 left two subnets 2-3 points short)"
    )
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--teachers", default="original,inplace")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("digits-distill.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    record = digits.info()
    aug = record["evaluation"]["augmentation"]
    seed = record["training"]["seed"]
    train_images, y_train = split(seed)["train"]
    n = len(y_train)
    x_test, y_test = digits.test_set(record)
    x_test, y_test = digits.to_input(x_test), torch.as_tensor(y_test)
    calibration = [digits.to_input(digits.augment(train_images, [seed, 4], **aug))]

    def views(epoch: int, labels: bool):
        gen = torch.Generator().manual_seed(seed * 1000 + epoch)
        order = torch.randperm(n, generator=gen)
        for i in range(0, n, args.batch_size):
            idx = order[i : i + args.batch_size].numpy()
            x = digits.to_input(digits.augment(train_images[idx], [seed, 1, epoch, i], **aug))
            yield (x, torch.as_tensor(y_train[idx])) if labels else x

    cpu0 = time.process_time()
    model = digits.build(record)
    steps = args.pretrain_epochs * -(-n // args.batch_size)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=steps, pct_start=0.15)
    for epoch in range(args.pretrain_epochs):
        model.train()
        for x, y in views(epoch, True):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            sched.step()
    pretrain_cpu = time.process_time() - cpu0
    print(
        f"conventional training: test {accuracy(model, None, x_test, y_test):.2f}% ({pretrain_cpu / 60:.1f} CPU-min)"
    )
    subnetact.convert(model, digits.CONVERT_CONFIG)
    served = [subnetact.SubnetConfig.from_dict(r["config"]) for r in record["pareto"]]

    def served_accuracy(m) -> list[float]:
        work = copy.deepcopy(m)
        subnetact.calibrate(work, calibration, subnets=served)
        return [accuracy(work, c, x_test, y_test) for c in served]

    converted = copy.deepcopy(model)
    subnetact.reorder_channels(converted)
    rows = {"as converted (reordered)": served_accuracy(converted)}
    cpu: dict[str, float] = {}
    for teacher in args.teachers.split(","):
        work = copy.deepcopy(model)
        steps = args.epochs * -(-n // args.batch_size)
        opt = torch.optim.SGD(work.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=5e-5)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps, pct_start=0.15)
        t0 = time.process_time()
        distill(
            work,
            lambda e: views(e, False),
            opt,
            steps=steps,
            teacher=teacher,
            schedule=Sandwich(2),
            lr_scheduler=sched,
        )
        cpu[teacher] = (time.process_time() - t0) / 60
        rows[f"distilled, teacher={teacher}"] = served_accuracy(work)
        print(f"teacher={teacher}: {cpu[teacher]:.1f} CPU-min", flush=True)
    shipped = [r["test_accuracy"] for r in record["pareto"]]
    print(f"{'MFLOPs':>8} {'shipped':>8} " + " ".join(f"{k[:24]:>24}" for k in rows))
    for i, r in enumerate(record["pareto"]):
        print(f"{r['flops'] / 1e6:8.2f} {shipped[i]:8.2f} " + " ".join(f"{v[i]:24.2f}" for v in rows.values()))
    result = {
        "command": shlex.join(["python", "benchmarks/distill_digits.py", *sys.argv[1:]]),
        "pretrain_cpu_minutes": pretrain_cpu / 60,
        "distill_cpu_minutes": cpu,
        "loadavg": os.getloadavg(),
        "flops": [r["flops"] for r in record["pareto"]],
        "shipped_test_accuracy": shipped,
        "rows": rows,
        "max_gap_points": {k: max(s - v for s, v in zip(shipped, vals)) for k, vals in rows.items()},
        "mean_gap_points": {k: float(np.mean([s - v for s, v in zip(shipped, vals)])) for k, vals in rows.items()},
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["max_gap_points"]))


if __name__ == "__main__":
    main()
