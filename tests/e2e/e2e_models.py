"""Tiny models and data for the end-to-end tests (no torchvision, no download)."""

from __future__ import annotations

import torch

import subnetact
from subnetact.digits import DigitsResNet


def tiny_digits(seed: int = 0, *, blocks=(2, 2, 1), widths=(4, 8, 8), width_choices=(0.25, 0.5, 1.0)):
    """A converted DigitsResNet small enough for a forward in well under a millisecond."""
    torch.manual_seed(seed)
    model = DigitsResNet(widths, blocks, expansion=1)
    return subnetact.convert(model, subnetact.ConvertConfig(width_choices=width_choices)).eval()


def blobs(n: int = 256, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A separable 10-class task of 8x8 images: each class lights up its own pixel pattern, plus noise."""
    patterns = (torch.rand(10, 1, 8, 8, generator=torch.Generator().manual_seed(1234)) > 0.6).float()  # fixed task
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    x = patterns[y] + 0.3 * torch.randn(n, 1, 8, 8, generator=g)
    return x, y
