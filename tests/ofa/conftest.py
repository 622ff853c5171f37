"""Shared helpers for the once-for-all interop tests. ``ofa`` is a test-only dependency: without it these tests
are skipped.

Random weights and a damped residual branch: a randomly initialised ResNet-50 whose residual branches keep full
gain is chaotic in fp32 (exporting our own subnet, which only changes the summation order of some convolutions,
already moves its logits by ~3e-5), which leaves no margin under a 1e-4 tolerance. Trained ResNets, and OFA's own
``zero_last_gamma`` initialisation, damp the last BatchNorm of each residual branch; we scale it by 0.2 and draw the
other BatchNorm affine parameters at random so they are not the identity.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

pytest.importorskip("ofa")

import subnetact  # noqa: E402
from subnetact import zoo  # noqa: E402

RESNET50 = dict(zoo.OFA_RESNET50_KWARGS)
# Same 18-block structure, depth and expand lists as ofa_resnet50, about 1/100 of the compute: for the many
# random subnets.
NARROW = {"depth_list": [0, 1, 2], "expand_ratio_list": [0.2, 0.25, 0.35], "width_mult_list": [0.1, 0.15, 0.2]}


def ofa_resnets(seed: int = 0, n_classes: int = 10, **kwargs):
    from ofa.imagenet_classification.elastic_nn.networks import OFAResNets

    torch.manual_seed(seed)
    net = OFAResNets(n_classes=n_classes, **kwargs)
    randomize_bn(net, seed)
    return net.eval()


def randomize_bn(net: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, m in net.named_modules():
            if type(m) is torch.nn.BatchNorm2d:
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.rand(m.bias.shape, generator=gen) * 0.4 - 0.2)
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)
                if name.endswith(("conv3.bn.bn", "conv3.bn")):
                    m.weight.mul_(0.2)


def make_batches(n: int, batch: int, size: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 3, size, size, generator=gen), torch.zeros(batch, dtype=torch.long)) for _ in range(n)]


def ofa_reference(ref: torch.nn.Module, arch: dict, batches) -> torch.nn.Module:
    """OFA's own recipe for evaluating a subnet: activate it, recalibrate BN on the supernet, extract it."""
    from ofa.imagenet_classification.elastic_nn.utils import set_running_statistics

    ref.set_active_subnet(**copy.deepcopy(arch))
    set_running_statistics(ref, batches)  # iterates ``for images, labels in loader``: a list of pairs works
    return ref.get_active_subnet(preserve_weight=True).eval()


def bn_stats(module: torch.nn.Module) -> list[torch.Tensor]:
    """Every BatchNorm's running mean and variance, in module order."""
    out = []
    for m in module.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            out += [m.running_mean, m.running_var]
    return out


def random_archs(net, model, n: int, seed: int) -> list[dict]:
    """Half from OFA's own sampler, half from our space (translated to OFA's format)."""
    random.seed(seed)
    archs = [net.sample_active_subnet() for _ in range(n // 2)]
    rng = random.Random(seed)
    archs += [subnetact.ofa.to_ofa(model.space.sample(rng), model.space) for _ in range(n - n // 2)]
    return archs


@pytest.fixture(scope="module")
def resnet50_pair():
    """(OFA reference net, converted deep copy): ofa_resnet50, random weights."""
    ref = ofa_resnets(seed=0, **RESNET50)
    return ref, subnetact.convert(copy.deepcopy(ref))


@pytest.fixture(scope="module")
def narrow_pair():
    ref = ofa_resnets(seed=1, **NARROW)
    return ref, subnetact.convert(copy.deepcopy(ref))
