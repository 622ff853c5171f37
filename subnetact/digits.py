"""The embedded default supernet: a small ResNet trained on scikit-learn's handwritten digits.

``subnetact demo`` serves it. It is also a worked example of a model family subnetact does not know out of the box:
:class:`DigitsBlock` is a plain residual block registered with :func:`subnetact.register_block_rule`, and
:class:`DigitsResNet` is converted by the generic pass.

The shipped files (``subnetact/data/``) are produced by ``benchmarks/train_digits_supernet.py`` (command line and
results in ``docs/benchmarks.md``):

- ``digits_supernet.safetensors``: the converted, trained model with the calibrated statistics of its Pareto set
  (written by :func:`subnetact.save`);
- ``digits_supernet.json``: how it was trained, and per Pareto subnet its config, FLOPs, ``accuracy`` (the search's
  and the profile's metric: validation images and their one-pixel shifts) and accuracy on the validation and test
  splits, with and without per-subnet statistics;
- ``digits_test.npz``: the test split (360 images of 8x8 pixels with values 0..16, and their labels), so the demo
  needs neither scikit-learn nor a download.

Example::

    >>> from subnetact import digits
    >>> model, info = digits.load_supernet()
    >>> images, labels = digits.test_split()
    >>> logits = model(digits.to_input(images[:16]), subnet=model.registered_subnets[0])
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import numpy as np
import torch
from torch import nn

from .convert import ConvertConfig
from .errors import ConfigError
from .rules import BlockSpec, ChannelSpec, register_block_rule

DATA_PACKAGE = "subnetact.data"
WEIGHTS_FILE = "digits_supernet.safetensors"
INFO_FILE = "digits_supernet.json"
TEST_FILE = "digits_test.npz"
NUM_CLASSES = 10
#: The convert options the shipped supernet was built with.
CONVERT_CONFIG = ConvertConfig(width_choices=(0.03125, 0.0625, 0.125, 0.25, 0.5, 1.0), min_depth=1)


class DigitsBlock(nn.Module):
    """A residual block: conv3x3 -> BN -> ReLU -> conv3x3 -> BN, plus the (optionally downsampled) input.

    Shapes: ``x`` (N, C_in, H, W) -> (N, C_out, H / stride, W / stride).
    """

    def __init__(self, c_in: int, c_out: int, stride: int = 1, mid: int | None = None) -> None:
        super().__init__()
        mid = c_out if mid is None else mid
        self.stride = stride
        self.conv1 = nn.Conv2d(c_in, mid, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


@register_block_rule(DigitsBlock)
def digits_block_rule(block: DigitsBlock) -> BlockSpec:
    # The middle channels (conv1's output, bn1, conv2's input) are elastic; conv2's output is the residual stream.
    return BlockSpec(
        width=ChannelSpec(size=block.conv1.out_channels, producers=("conv1",), norms=("bn1",), consumers=("conv2",)),
        skippable=block.downsample is None and block.stride == 1,
    )


class DigitsResNet(nn.Module):
    """A three-stage ResNet for 8x8 digits, upsampled to 16x16 inside the model.

    Args:
        widths: channels of the residual stream in the three stages (16x16, 8x8 and 4x4 feature maps).
        blocks: blocks per stage.
        expansion: a block's middle (elastic) channels are ``expansion`` times its stage's width.
        num_classes: output classes.

    Shapes: ``x`` (N, 1, 8, 8) with values in [0, 1] (see :func:`to_input`) -> logits (N, num_classes).
    """

    def __init__(
        self,
        widths: tuple[int, int, int] = (16, 32, 64),
        blocks: tuple[int, int, int] = (3, 3, 3),
        expansion: int = 2,
        num_classes: int = 10,
    ) -> None:
        super().__init__()
        self.widths, self.blocks, self.expansion = tuple(widths), tuple(blocks), expansion
        # Upsampling gives the convolutions enough positions that the subnets' costs differ several-fold (issue 6
        # asks for >= 3x latency at batch 16 on a CPU); 8x8 is too small for the stride-2 stages.
        self.upsample = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.stem = nn.Sequential(nn.Conv2d(1, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        stages = []
        c_in = widths[0]
        for i, (c, n) in enumerate(zip(widths, blocks)):
            stride = 1 if i == 0 else 2
            stage = [DigitsBlock(c_in if j == 0 else c, c, stride if j == 0 else 1, expansion * c) for j in range(n)]
            stages.append(nn.Sequential(*stage))
            c_in = c
        self.layer1, self.layer2, self.layer3 = stages
        self.fc = nn.Linear(widths[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(self.upsample(x))  # (N, 1, 8, 8) -> (N, 1, 16, 16) -> (N, C0, 16, 16)
        x = self.layer3(self.layer2(self.layer1(x)))  # -> (N, C2, 4, 4)
        return self.fc(x.mean(dim=(2, 3)))  # -> (N, num_classes)


def to_input(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Digits as scikit-learn stores them (values 0..16, (N, 8, 8) or (N, 64)) -> float (N, 1, 8, 8) in [0, 1]."""
    x = torch.as_tensor(np.asarray(images), dtype=torch.float32)
    if x.dim() == 2 and x.shape[1] == 64:
        x = x.view(-1, 8, 8)
    if x.dim() != 3 or tuple(x.shape[1:]) != (8, 8):
        raise ConfigError(f"images must have shape (N, 8, 8) or (N, 64), got {tuple(x.shape)}")
    return (x / 16.0).unsqueeze(1)


def _data_path(name: str):
    return resources.files(DATA_PACKAGE).joinpath(name)


def info() -> dict[str, Any]:
    """The shipped supernet's record: training command and settings, and its Pareto set with accuracies."""
    return json.loads(_data_path(INFO_FILE).read_text())


def test_split() -> tuple[np.ndarray, np.ndarray]:
    """The test split the shipped supernet was evaluated on: images (360, 8, 8) uint8 in 0..16, labels (360,)."""
    with _data_path(TEST_FILE).open("rb") as f:
        data = np.load(f)
        return data["images"], data["labels"]


def build(record: dict[str, Any] | None = None) -> DigitsResNet:
    """An untrained :class:`DigitsResNet` with the shipped architecture (from ``info()['architecture']``)."""
    arch = (record or info())["architecture"]
    return DigitsResNet(tuple(arch["widths"]), tuple(arch["blocks"]), arch["expansion"], NUM_CLASSES)


def load_supernet() -> tuple[nn.Module, dict[str, Any]]:
    """The shipped supernet (converted, eval mode, Pareto set registered) and its record (see :func:`info`).

    Returns:
        ``(model, record)``; ``record["pareto"]`` lists the served subnets in increasing cost, each with ``config``
        (a :class:`~subnetact.SubnetConfig` dict), ``flops`` and accuracies.
    """
    from .io import load

    record = info()
    with resources.as_file(_data_path(WEIGHTS_FILE)) as path:
        model = load(path, lambda: build(record))
    return model.eval(), record
