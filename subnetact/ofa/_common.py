"""Helpers shared by the once-for-all adapters: OFA's channel rounding, structural checks that never import ``ofa``,
and plain-PyTorch replacements for OFA's small modules."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from ..errors import UnsupportedModelError

# ofa.utils.MyNetwork.CHANNEL_DIVISIBLE
CHANNEL_DIVISIBLE = 8


def make_divisible(v: float, divisor: int = CHANNEL_DIVISIBLE, min_val: int | None = None) -> int:
    """once-for-all's channel rounding (``ofa.utils.make_divisible``, from the TF MobileNet code): the nearest
    multiple of ``divisor``, at least ``min_val``, and never more than 10 % below ``v``."""
    if min_val is None:
        min_val = divisor
    new_v = max(min_val, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


def type_name(module: object) -> str:
    return type(module).__name__


def expect(module: object, path: str, *names: str) -> None:
    """Raise if ``module``'s class name is not one of ``names`` (checked by name: ``ofa`` is never imported)."""
    if type_name(module) not in names:
        got = "None" if module is None else f"{type(module).__module__}.{type(module).__qualname__}"
        raise UnsupportedModelError(
            f"once-for-all adapter: {path!r} is {got}; expected {' or '.join(names)}. Only the structure of the "
            "ofa package's own networks (ofa 0.1.0) is supported"
        )


def expect_conv(conv: object, path: str) -> nn.Conv2d:
    if type(conv) is not nn.Conv2d:
        raise UnsupportedModelError(
            f"once-for-all adapter: {path!r} is {type_name(conv)}; expected torch.nn.Conv2d (weight-standardised "
            "MyConv2d is not supported)"
        )
    return conv


def expect_bn(bn: object, path: str) -> nn.BatchNorm2d:
    if type(bn) is not nn.BatchNorm2d:
        raise UnsupportedModelError(
            f"once-for-all adapter: {path!r} is {type_name(bn)}; expected torch.nn.BatchNorm2d (GroupNorm variants "
            "are not supported)"
        )
    return bn


def expect_shape(tensor: torch.Tensor, shape: tuple[int, ...], path: str) -> None:
    if tuple(tensor.shape) != tuple(shape):
        raise UnsupportedModelError(
            f"once-for-all adapter: {path!r} has shape {tuple(tensor.shape)}, but the network's channel lists imply "
            f"{tuple(shape)}"
        )


def plain_activation(act: object, path: str) -> nn.Module:
    """A torch activation equal to OFA's (``build_activation``): ReLU / ReLU6 are torch's own; OFA's ``Hswish``
    and ``Hsigmoid`` compute ``x * relu6(x + 3) / 6`` and ``relu6(x + 3) / 6``, which are ``nn.Hardswish`` and
    ``nn.Hardsigmoid``."""
    if type(act) is nn.ReLU:
        return nn.ReLU(inplace=act.inplace)
    if type(act) is nn.ReLU6:
        return nn.ReLU6(inplace=act.inplace)
    if type_name(act) == "Hswish":
        return nn.Hardswish()
    if type_name(act) == "Hsigmoid":
        return nn.Hardsigmoid()
    raise UnsupportedModelError(
        f"once-for-all adapter: activation {path!r} is {type_name(act)}; supported: ReLU, ReLU6, Hswish, Hsigmoid"
    )


def padded_conv(
    weight: nn.Parameter, kernel_size: int, stride: int, dilation: int = 1, groups: int = 1, bias=None
) -> nn.Conv2d:
    """An ``nn.Conv2d`` taking over ``weight`` (no copy), with OFA's "same" padding ``kernel_size // 2``."""
    out_ch, in_per_group = weight.shape[:2]
    with torch.device("meta"):
        conv = nn.Conv2d(
            in_per_group * groups,
            out_ch,
            kernel_size,
            stride=stride,
            padding=kernel_size // 2,
            dilation=dilation,
            groups=groups,
            bias=bias is not None,
        )
    conv.weight = weight
    if bias is not None:
        conv.bias = bias
    return conv


def seq(**modules: nn.Module | None) -> nn.Sequential:
    """``nn.Sequential`` with named children (None entries skipped), e.g. ``seq(conv=..., bn=..., act=...)``."""
    return nn.Sequential(OrderedDict((k, v) for k, v in modules.items() if v is not None))


class SqueezeExcite(nn.Module):
    """once-for-all's ``SEModule`` in plain PyTorch: ``x * h_sigmoid(expand(relu(reduce(mean_hw(x)))))``.

    Shapes: ``x`` (N, C, H, W) -> (N, C, H, W); ``fc.reduce`` is C -> C_se, ``fc.expand`` C_se -> C (1x1 convs
    with bias), so the state-dict keys are OFA's ``se.fc.reduce.*`` / ``se.fc.expand.*``.
    """

    def __init__(self, reduce: nn.Conv2d, expand: nn.Conv2d) -> None:
        super().__init__()
        self.fc = seq(reduce=reduce, relu=nn.ReLU(inplace=True), expand=expand, h_sigmoid=nn.Hardsigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.mean(3, keepdim=True).mean(2, keepdim=True)  # (N, C, 1, 1), the order OFA averages in
        return x * self.fc(y)


def take_over(target: nn.Module, plain: nn.Module) -> None:
    """Turn ``target`` (an OFA network) into ``plain`` in place: same object, ``plain``'s class and contents.

    ``convert`` documents that it returns the object it was given; the OFA network object therefore becomes the
    plain model (its Parameters are the very same tensors). Hooks registered on the OFA root are dropped.
    """
    training = target.training
    target.__dict__.clear()
    target.__dict__.update(plain.__dict__)
    target.__class__ = type(plain)
    target.training = training
