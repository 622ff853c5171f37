"""Tiny torchvision-style models for tests, with randomised (non-trivial) BatchNorm parameters and statistics."""

from __future__ import annotations

import torch
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet


def randomize_norms(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every BatchNorm random affine parameters and running statistics, so that prefix slicing, wrong
    statistics or a wrong channel selection all change the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                m.bias.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
    return model


def tiny_basic(seed: int = 0) -> ResNet:
    torch.manual_seed(seed)
    return randomize_norms(ResNet(BasicBlock, [2, 1, 3, 1], num_classes=10), seed).eval()


def tiny_bottleneck(seed: int = 0) -> ResNet:
    torch.manual_seed(seed)
    return randomize_norms(ResNet(Bottleneck, [2, 2, 1, 1], num_classes=10, width_per_group=16), seed).eval()


def tiny_resnext(seed: int = 0) -> ResNet:
    torch.manual_seed(seed)
    model = ResNet(Bottleneck, [1, 2, 1, 1], num_classes=10, groups=4, width_per_group=8)
    return randomize_norms(model, seed).eval()


TINY_MODELS = {"basic": tiny_basic, "bottleneck": tiny_bottleneck, "resnext": tiny_resnext}


def image_batch(n: int = 2, size: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))
