"""Serve once-for-all's ResNet-50 supernet the SuperServe way, with random weights (runs in a few seconds on CPU).

Needs ``pip install ofa``. With the real checkpoint, replace the random weights by
``subnetact.ofa.load_checkpoint(model, "ofa_supernet_resnet50")`` (OFA's ``.pth``; read with weights_only=True) and
calibrate on ~2000 training images at 224x224, as once-for-all does.

    python examples/ofa_resnet50.py
"""

from __future__ import annotations

import time

import torch
from ofa.imagenet_classification.elastic_nn.networks import OFAResNets

import subnetact
from subnetact import zoo


def main() -> None:
    torch.manual_seed(0)
    # 1. Convert the OFA supernet in place: plain PyTorch modules + SubNetAct operators, same Parameters.
    model = subnetact.convert(OFAResNets(**zoo.OFA_RESNET50_KWARGS)).eval()
    print(model.space)

    # 2. The paper's served set: six Pareto subnets, from OFA's {"d", "e", "w"} dicts.
    served = [s.config(model) for s in zoo.SUPERSERVE_OFA_RESNET50]
    print("subnet 3 in OFA's format:", subnetact.ofa.to_ofa(served[3], model))

    # 3. Per-subnet BatchNorm statistics (SubnetNorm), once-for-all's exact recalibration. Random images here.
    batches = [torch.randn(8, 3, 64, 64) for _ in range(2)]
    subnetact.calibrate(model, batches, served)

    # 4. Serve: actuation is a reference swap; every forward runs the subnet chosen for it.
    x = torch.randn(1, 3, 64, 64)
    with torch.inference_mode():
        for s, cfg in zip(zoo.SUPERSERVE_OFA_RESNET50, served):
            start = time.perf_counter()
            model.actuate(cfg)
            us = (time.perf_counter() - start) * 1e6
            top = model(x).argmax(1).item()
            print(
                f"subnet {s.id}: top-1 {s.accuracy:.2f}% (published), A40 forward at batch 16 "
                f"{s.latency[16].forward_mean_s * 1e3:.1f} ms (profiled), actuated in {us:.1f} us, class {top}"
            )
    # 5. The same subnet as a standalone dense model, if you need one.
    dense = model.export(served[0])
    print("exported subnet 0:", sum(p.numel() for p in dense.parameters()) / 1e6, "M parameters")


if __name__ == "__main__":
    main()
