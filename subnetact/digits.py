"""The embedded default supernet: a small ResNet trained on scikit-learn's handwritten digits.

``subnetact demo`` serves it. It is also a worked example of a model family subnetact does not know out of the box:
:class:`DigitsBlock` is a plain residual block registered with :func:`subnetact.register_block_rule`, and
:class:`DigitsResNet` is converted by the generic pass.

The shipped files (``subnetact/data/``) are produced by ``scripts/train_digits_supernet.py`` (command line and
results in ``docs/benchmarks.md``). Plain 8x8 digits are too easy to tell subnets apart (any subnet with a few
channels scores ~97 %), so the supernet is trained on an endless stream of rotated, scaled, shifted and noisy views
of the training images (:func:`augment`) and evaluated on fixed views of held-out images, generated from a seed:

- ``digits_supernet.safetensors``: the converted, trained model with the calibrated statistics of its Pareto set
  (written by :func:`subnetact.save`);
- ``digits_supernet.json``: how it was trained; ``evaluation``: the augmentation and the seeds and view counts of
  the validation views (which the Pareto search ranked on) and of the test views (:func:`test_set`); per Pareto
  subnet its config, FLOPs, ``accuracy`` (the search's and the profile's metric: the validation views) and accuracy
  on the validation views, the test views and the plain test images, with and without per-subnet statistics;
- ``digits_test.npz``: the test split (360 images of 8x8 pixels with values 0..16, and their labels), so the demo
  needs neither scikit-learn nor a download. :func:`test_set` generates its views.

Example::

    >>> from subnetact import digits
    >>> model, info = digits.load_supernet()
    >>> images, labels = digits.test_set()  # 3600 views of the 360 test images
    >>> logits = model(digits.to_input(images[:16]), subnet=model.registered_subnets[0])
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from typing import Any

import numpy as np
import torch
from torch import nn

from .checks import is_int
from .errors import ConfigError
from .plan import ConvertConfig
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


def augment(
    images: np.ndarray,
    seed: int | Sequence[int],
    *,
    views: int = 1,
    rotation_deg: float = 20.0,
    scale: tuple[float, float] = (0.85, 1.15),
    shift_px: float = 1.0,
    noise: float = 0.15,
) -> np.ndarray:
    """Deterministic random views of digits: each image rotated, scaled and shifted (bilinear, zero fill), plus noise.

    The embedded supernet is trained on an endless stream of such views of its training images and evaluated on a
    fixed set of views of its held-out images (:func:`test_set`): the plain 8x8 digits saturate (any subnet with a few
    channels scores ~97 %), the augmented task separates small subnets from large ones.

    Only ``numpy.random.default_rng(seed).random`` (PCG64 doubles, stable across NumPy versions) and float64
    arithmetic are used, so the same seed gives the same views on any machine, up to the last bits of ``sin``/``cos``.

    Args:
        images: (N, 8, 8) or (N, 64) on scikit-learn's scale (0..16).
        seed: seeds the views (an int or a sequence of ints, as ``numpy.random.default_rng`` takes).
        views: views per image; the output repeats each image ``views`` times in a row (image 0's views first).
        rotation_deg: rotation drawn uniformly from +-rotation_deg degrees.
        scale: zoom factor drawn uniformly from this range.
        shift_px: shift along each axis drawn uniformly from +-shift_px pixels.
        noise: standard deviation of additive uniform noise, as a fraction of the full scale (16).

    Returns:
        float32 (N * views, 8, 8) on the 0..16 scale (clipped), ready for :func:`to_input`.
    """
    x = np.asarray(images, dtype=np.float64)
    if x.ndim == 2 and x.shape[1] == 64:
        x = x.reshape(-1, 8, 8)
    if x.ndim != 3 or x.shape[1:] != (8, 8):
        raise ConfigError(f"images must have shape (N, 8, 8) or (N, 64), got {x.shape}")
    if not is_int(views) or views < 1:
        raise ConfigError(f"views={views!r} must be an int >= 1")
    x = np.repeat(x, views, axis=0)  # (M, 8, 8)
    m = len(x)
    rng = np.random.default_rng(seed)
    u = rng.random((m, 4))  # angle, zoom, shift x, shift y
    angle = np.deg2rad(rotation_deg * (2.0 * u[:, 0] - 1.0))[:, None, None]
    zoom = (scale[0] + (scale[1] - scale[0]) * u[:, 1])[:, None, None]
    tx = (shift_px * (2.0 * u[:, 2] - 1.0))[:, None, None]
    ty = (shift_px * (2.0 * u[:, 3] - 1.0))[:, None, None]
    # Inverse map: output pixel p comes from R(-angle) (p - centre - t) / zoom + centre of the source.
    rows, cols = np.meshgrid(np.arange(8.0), np.arange(8.0), indexing="ij")
    dx, dy = cols[None] - 3.5 - tx, rows[None] - 3.5 - ty  # (M, 8, 8)
    cos, sin = np.cos(angle), np.sin(angle)
    src_x = np.clip((cos * dx + sin * dy) / zoom + 3.5, -1.0, 8.0) + 1.0  # in the zero-padded (10 x 10) image
    src_y = np.clip((-sin * dx + cos * dy) / zoom + 3.5, -1.0, 8.0) + 1.0
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1)))  # (M, 10, 10)
    x0 = np.minimum(np.floor(src_x).astype(np.int64), 8)
    y0 = np.minimum(np.floor(src_y).astype(np.int64), 8)
    wx, wy = src_x - x0, src_y - y0
    n = np.arange(m)[:, None, None]
    out = (
        padded[n, y0, x0] * (1 - wy) * (1 - wx)
        + padded[n, y0, x0 + 1] * (1 - wy) * wx
        + padded[n, y0 + 1, x0] * wy * (1 - wx)
        + padded[n, y0 + 1, x0 + 1] * wy * wx
    )
    # Uniform noise with the given standard deviation (a uniform on +-a has std a / sqrt(3)).
    out += 16.0 * noise * np.sqrt(3.0) * (2.0 * rng.random((m, 8, 8)) - 1.0)
    return np.clip(out, 0.0, 16.0).astype(np.float32)


def _data_path(name: str):
    return resources.files(DATA_PACKAGE).joinpath(name)


def info() -> dict[str, Any]:
    """The shipped supernet's record: training command and settings, and its Pareto set with accuracies."""
    return json.loads(_data_path(INFO_FILE).read_text())


def test_split() -> tuple[np.ndarray, np.ndarray]:
    """The plain test split (held out from training and search): images (360, 8, 8) uint8 in 0..16, labels (360,).

    :func:`test_set` generates the augmented views the shipped supernet is evaluated on from these images."""
    with _data_path(TEST_FILE).open("rb") as f:
        data = np.load(f)
        return data["images"], data["labels"]


def test_set(record: dict[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The held-out set the shipped supernet is evaluated on and the demo requests: :func:`augment` views of the
    test split, generated from the seed, views and parameters in ``info()["evaluation"]``.

    Returns:
        ``(images, labels)``: float32 (360 * views, 8, 8) on the 0..16 scale and int64 (360 * views,), each test
        image's views in a row. The test split is disjoint from the training images and from the validation images
        the Pareto search ranked the subnets on.
    """
    spec = (record or info())["evaluation"]
    images, labels = test_split()
    views = augment(images, spec["test_seed"], views=spec["test_views"], **spec["augmentation"])
    return views, np.repeat(labels.astype(np.int64), spec["test_views"])


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
