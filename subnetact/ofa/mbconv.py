"""The parts once-for-all's MobileNetV3 and ProxylessNAS supernets share: inverted-bottleneck blocks of OFA's
``DynamicMBConvLayer`` with elastic expand ratio and kernel size, their checks (by class name: ``ofa`` is never
imported), their plain-PyTorch twins, and the conversion plan of their stages.

A block's middle width is ``make_divisible(round(in_channels * expand), 8)`` (relative to the block's *input*) and
its squeeze-excite width ``make_divisible(mid // 4, 8)``; both are channel groups of the block's ``expand`` entry.
The elastic kernel is :class:`ElasticKernelDepthwiseConv2d`, which reproduces OFA's centre crop and 7->5->3
transform matrices once per subnet, when the subnet's plan is compiled, instead of on every forward.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import SubnetConfig
from ..operator import Operator, cloned_parameter
from ..plan import ConversionPlan, StagePlan
from ..space import Entry
from ..state import ChannelGroup
from ._common import (
    SqueezeExcite,
    expect,
    expect_bn,
    expect_conv,
    expect_shape,
    make_divisible,
    padded_conv,
    plain_activation,
    seq,
    take_over,
    type_name,
)


# -- the elastic-kernel depthwise convolution -----------------------------------------------------------------------
def _centre(kernel: int, sub: int) -> tuple[int, int]:
    start = kernel // 2 - sub // 2
    return start, start + sub


class KernelTransformDepthwise(nn.Module):
    """Plain holder of OFA's ``DynamicSeparableConv2d`` Parameters: the depthwise ``weight`` (C, 1, K, K) at the
    largest kernel and, when OFA's ``KERNEL_TRANSFORM_MODE`` is on, one ``"{k}to{k'}_matrix"`` (k'^2, k'^2) per
    pair of consecutive kernel sizes. Runs the largest kernel; :class:`ElasticKernelDepthwiseConv2d` is the
    elastic operator."""

    def __init__(self, weight: nn.Parameter, kernel_sizes: list[int], stride: int, dilation: int, transform: bool):
        super().__init__()
        self.weight = weight
        self.kernel_sizes = sorted(set(kernel_sizes))
        self.stride, self.dilation, self.transform = stride, dilation, transform

    def matrix(self, src: int, dst: int) -> torch.Tensor:
        return getattr(self, f"{src}to{dst}_matrix")

    def filter(self, channels: int, kernel: int) -> torch.Tensor:
        """OFA's ``get_active_filter``: the centre crop of the largest kernel, or with the transform, successive
        crops each followed by its matrix (7 -> 5 -> 3). Shape (channels, 1, kernel, kernel)."""
        k_max = self.kernel_sizes[-1]
        if not self.transform or kernel == k_max:
            start, end = _centre(k_max, kernel)
            return self.weight[:channels, :, start:end, start:end]
        filt = self.weight[:channels]
        for i in range(len(self.kernel_sizes) - 1, 0, -1):
            src, dst = self.kernel_sizes[i], self.kernel_sizes[i - 1]
            if src <= kernel:
                break
            start, end = _centre(src, dst)
            crop = filt[:, :, start:end, start:end].contiguous().view(-1, dst * dst)  # (C, k'^2)
            filt = F.linear(crop, self.matrix(src, dst)).view(channels, 1, dst, dst)
        return filt

    def conv(self, x: torch.Tensor, filt: torch.Tensor) -> torch.Tensor:
        k = filt.shape[-1]
        return F.conv2d(x, filt, None, self.stride, k // 2, self.dilation, filt.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x, self.filter(self.weight.shape[0], self.kernel_sizes[-1]))


class ElasticKernelDepthwiseConv2d(Operator, KernelTransformDepthwise):
    """Depthwise convolution with elastic channels (channel group ``group``) and elastic kernel size (entry
    ``kernel_entry`` of the space's ``kernel`` dimension).

    The plan holds the subnet's filter, computed once when the plan is compiled (OFA recomputes the transform on
    every forward). With gradients enabled the filter is recomputed from the Parameters, so training reaches them.

    Shapes: ``x`` (N, c, H, W) -> (N, c, H', W') with c the group's active channel count.
    """

    group: int
    kernel_entry: int

    @classmethod
    def from_module(
        cls, base: KernelTransformDepthwise, group: int, kernel_entry: int
    ) -> ElasticKernelDepthwiseConv2d:
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        for name, param in base.named_parameters(recurse=False):
            new.register_parameter(name, param)
        new.kernel_sizes, new.stride, new.dilation = base.kernel_sizes, base.stride, base.dilation
        new.transform, new.training = base.transform, base.training
        new.group, new.kernel_entry = group, kernel_entry
        return new

    def plan_entry(self, cfg: SubnetConfig, sizes: list[int], stats: object) -> tuple[int, int, torch.Tensor]:
        c, k = sizes[self.group], int(cfg["kernel"][self.kernel_entry])
        return (c, k, self.filter(c, k).contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c, k, filt = self._subnetact_state.current().entries[self._op_index]
        if torch.is_grad_enabled() and self.weight.requires_grad:
            filt = self.filter(c, k)
        return self.conv(x, filt)

    def to_dense(self, entry: tuple) -> nn.Conv2d:
        c, k, filt = entry
        with torch.device("meta"):
            dense = nn.Conv2d(c, c, k, self.stride, k // 2, self.dilation, groups=c, bias=False)
        dense.weight = cloned_parameter(filt, self.weight.requires_grad)
        dense.training = self.training
        return dense

    def to_base(self) -> KernelTransformDepthwise:
        base = KernelTransformDepthwise.__new__(KernelTransformDepthwise)
        nn.Module.__init__(base)
        for name, param in self.named_parameters(recurse=False):
            base.register_parameter(name, param)
        base.kernel_sizes, base.stride, base.dilation = self.kernel_sizes, self.stride, self.dilation
        base.transform, base.training = self.transform, self.training
        return base

    def extra_repr(self) -> str:
        return f"kernel_sizes={self.kernel_sizes}, stride={self.stride}, group={self.group}"


# -- the plain model -------------------------------------------------------------------------------------------------
class MBConv(nn.Module):
    """Inverted bottleneck: ``[inverted_bottleneck (1x1, bn, act)] -> depth_conv (dw, bn, act, [se]) ->
    point_linear (1x1, bn)``; the names are OFA's."""

    def __init__(self, inverted_bottleneck: nn.Sequential | None, depth_conv: nn.Sequential, point_linear):
        super().__init__()
        self.inverted_bottleneck, self.depth_conv, self.point_linear = inverted_bottleneck, depth_conv, point_linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inverted_bottleneck is not None:
            x = self.inverted_bottleneck(x)
        return self.point_linear(self.depth_conv(x))


class MBBlock(nn.Module):
    """OFA's ``ResidualBlock``: ``conv(x) + x`` with an identity shortcut, else ``conv(x)``."""

    def __init__(self, conv: MBConv, shortcut: bool) -> None:
        super().__init__()
        self.conv, self.shortcut = conv, shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y + x if self.shortcut else y


# -- checks and plan ---------------------------------------------------------------------------------------------
_PLAIN = (nn.Conv2d, nn.BatchNorm2d, nn.Linear, nn.Dropout, nn.Dropout2d)


def check_static(layer: nn.Module, path: str) -> None:
    """A static OFA layer runs its children in order (``My2DLayer`` / ``LinearLayer`` / ``nn.Sequential``)."""
    for name, child in layer.named_children():
        if type(child) in _PLAIN:
            if type(child) is nn.BatchNorm2d:
                expect_bn(child, f"{path}.{name}")
            continue
        if type_name(child) == "SEModule":
            continue
        plain_activation(child, f"{path}.{name}")  # raises for anything else


def static(layer: nn.Module) -> nn.Sequential:
    """The plain ``nn.Sequential`` twin of a static OFA layer checked by :func:`check_static` (same Parameters)."""
    out = OrderedDict()
    for name, child in layer.named_children():
        if type(child) in _PLAIN:
            out[name] = child
        elif type_name(child) == "SEModule":
            out[name] = SqueezeExcite(child.fc.reduce, child.fc.expand)
        else:
            out[name] = plain_activation(child, name)
    return nn.Sequential(out)


@dataclass
class MBInfo:
    """What phase 1 found in an OFA MobileNet-style network (``stages``: OFA's ``block_group_info``)."""

    stages: list[list[int]]
    depth_list: list[int]
    expand_list: list[float]
    ks_list: list[int]
    mids: list[dict[float, int]]  # per elastic block: expand -> middle width
    ses: list[dict[float, int] | None]  # per elastic block: expand -> squeeze-excite width


def check_block(
    block: nn.Module, path: str, expand_list: list[float], ks_list: list[int], err: Callable[[str], Exception]
) -> tuple[dict[float, int], dict[float, int] | None]:
    """Check one elastic ``ResidualBlock(DynamicMBConvLayer, IdentityLayer | None)``; return its middle widths and
    squeeze-excite widths per expand ratio (None without squeeze-excite). ``err`` builds the network's error."""
    expect(block, path, "ResidualBlock")
    if block.shortcut is not None:
        expect(block.shortcut, f"{path}.shortcut", "IdentityLayer")
    layer = block.conv
    expect(layer, f"{path}.conv", "DynamicMBConvLayer")
    if len(layer.in_channel_list) != 1 or len(layer.out_channel_list) != 1:
        raise err(f"{path}: elastic input/output widths are not supported (in {layer.in_channel_list!r})")
    if list(layer.expand_ratio_list) != expand_list or sorted(set(layer.kernel_size_list)) != ks_list:
        raise err(f"{path}: its expand/kernel lists differ from the network's")
    if layer.inverted_bottleneck is None:
        raise err(f"{path}: blocks without an inverted bottleneck (max expand ratio 1) are not supported")
    in_ch, out_ch = layer.in_channel_list[0], layer.out_channel_list[0]
    mid = {e: make_divisible(round(in_ch * e)) for e in expand_list}
    full = max(mid.values())
    k = max(ks_list)
    ib, dw, pl = layer.inverted_bottleneck, layer.depth_conv, layer.point_linear
    expect(ib.conv, f"{path}.conv.inverted_bottleneck.conv", "DynamicConv2d")
    expect_shape(
        expect_conv(ib.conv.conv, f"{path}.conv.inverted_bottleneck.conv.conv").weight, (full, in_ch, 1, 1), path
    )
    expect(dw.conv, f"{path}.conv.depth_conv.conv", "DynamicSeparableConv2d")
    expect_shape(expect_conv(dw.conv.conv, f"{path}.conv.depth_conv.conv.conv").weight, (full, 1, k, k), path)
    expect(pl.conv, f"{path}.conv.point_linear.conv", "DynamicConv2d")
    expect_shape(expect_conv(pl.conv.conv, f"{path}.conv.point_linear.conv.conv").weight, (out_ch, full, 1, 1), path)
    for part, bn in (("inverted_bottleneck", ib.bn), ("depth_conv", dw.bn), ("point_linear", pl.bn)):
        expect(bn, f"{path}.conv.{part}.bn", "DynamicBatchNorm2d")
        expect_bn(bn.bn, f"{path}.conv.{part}.bn.bn")
    if type(dw.conv).KERNEL_TRANSFORM_MODE is not None:
        for src, dst in zip(ks_list[1:], ks_list[:-1]):
            m = getattr(dw.conv, f"{src}to{dst}_matrix", None)
            if m is None or tuple(m.shape) != (dst * dst, dst * dst):
                raise err(
                    f"{path}.conv.depth_conv.conv has no {src}to{dst}_matrix of shape ({dst * dst}, {dst * dst})"
                )
    se = None
    if layer.use_se:
        expect(dw.se, f"{path}.conv.depth_conv.se", "DynamicSE")
        se = {e: make_divisible(m // dw.se.reduction) for e, m in mid.items()}
        expect_shape(dw.se.fc.reduce.weight, (max(se.values()), full, 1, 1), f"{path}.conv.depth_conv.se.fc.reduce")
        expect_shape(dw.se.fc.expand.weight, (full, max(se.values()), 1, 1), f"{path}.conv.depth_conv.se.fc.expand")
    return mid, se


def check_network(
    net: nn.Module, static_paths: tuple[str, ...], stage_sizes: list[int], err: Callable[[str], Exception]
) -> MBInfo:
    """Phase-1 checks of an OFA MobileNet-style network (``OFAMobileNetV3``, ``OFAProxylessNASNets``): its lists,
    its static layers (``static_paths``), the static first block, and ``stage_sizes[s]`` elastic blocks in stage
    ``s``. ``err`` builds the network's error."""
    depth_list, expand_list, ks_list = list(net.depth_list), list(net.expand_ratio_list), list(net.ks_list)
    for name, values in (("depth_list", depth_list), ("expand_ratio_list", expand_list), ("ks_list", ks_list)):
        if sorted(set(values)) != values:
            raise err(f"{name}={values!r} must hold distinct values")
    if depth_list[0] < 1:
        raise err(f"depth_list={depth_list!r}: every stage runs at least one block")
    if any(k % 2 == 0 for k in ks_list):
        raise err(f"ks_list={ks_list!r}: kernel sizes must be odd")
    for path in static_paths:
        check_static(getattr(net, path), path)
    first = net.blocks[0]
    expect(first, "blocks.0", "ResidualBlock")
    expect(first.conv, "blocks.0.conv", "MBConvLayer")
    for part in ("inverted_bottleneck", "depth_conv", "point_linear"):
        if getattr(first.conv, part) is not None:
            check_static(getattr(first.conv, part), f"blocks.0.conv.{part}")
    stages = [list(idx) for idx in net.block_group_info]
    if [i for idx in stages for i in idx] != list(range(1, len(net.blocks))):
        raise err(f"block_group_info={stages!r} must cover blocks 1..{len(net.blocks) - 1} in order")
    mids, ses = [], []
    for s, idx in enumerate(stages):
        if len(stages) != len(stage_sizes) or len(idx) != stage_sizes[s]:
            raise err(f"block_group_info={stages!r}: expected stages of {stage_sizes} blocks")
        for i in idx:
            mid, se = check_block(net.blocks[i], f"blocks.{i}", expand_list, ks_list, err)
            mids.append(mid)
            ses.append(se)
    return MBInfo(stages, depth_list, expand_list, ks_list, mids, ses)


def mb_plan(info: MBInfo, prepare: Callable[[nn.Module], None]) -> ConversionPlan:
    """The plan for the prepared network's ``stages.{s}.{j}`` blocks: one ``depth`` entry per stage (OFA's
    ``min(len(stage), d)`` for each ``d`` in ``depth_list``), one ``expand`` and one ``kernel`` entry per block."""
    groups: list[ChannelGroup] = []
    slices, norms, custom = {}, {}, {}
    depth, expand, kernel = [], [], []
    b = 0
    for s, idx in enumerate(info.stages):
        depth.append(Entry(f"stages.{s}", tuple(sorted({min(len(idx), d) for d in info.depth_list}))))
        for j in range(len(idx)):
            p = f"stages.{s}.{j}.conv"
            expand.append(Entry(f"stages.{s}.{j}", tuple(info.expand_list)))
            kernel.append(Entry(f"stages.{s}.{j}", tuple(info.ks_list)))
            m = len(groups)
            mid = info.mids[b]
            groups.append(ChannelGroup("expand", b, max(mid.values()), tuple(mid.items())))
            slices[f"{p}.inverted_bottleneck.conv"] = (m, None)
            norms[f"{p}.inverted_bottleneck.bn"] = m
            custom[f"{p}.depth_conv.conv"] = _kernel_factory(m, b)
            norms[f"{p}.depth_conv.bn"] = m
            if info.ses[b] is not None:
                se = len(groups)
                groups.append(ChannelGroup("expand", b, max(info.ses[b].values()), tuple(info.ses[b].items())))
                slices[f"{p}.depth_conv.se.fc.reduce"] = (se, m)
                slices[f"{p}.depth_conv.se.fc.expand"] = (m, se)
            slices[f"{p}.point_linear.conv"] = (None, m)
            b += 1
    stages = [StagePlan(f"stages.{s}") for s in range(len(info.stages))]
    dims = {"depth": depth, "expand": expand, "kernel": kernel}
    return ConversionPlan(stages, dims, groups, slices, norms, custom, prepare=prepare)


def _kernel_factory(group: int, entry: int) -> Callable[[nn.Module], nn.Module]:
    return lambda module: ElasticKernelDepthwiseConv2d.from_module(module, group, entry)


# -- phase 2 ---------------------------------------------------------------------------------------------------------
def dynamic_block(block: nn.Module) -> MBBlock:
    """The plain twin of a block :func:`check_block` accepted, holding its Parameters (no copy)."""
    layer = block.conv
    ib, dw, pl = layer.inverted_bottleneck, layer.depth_conv, layer.point_linear
    dyn = dw.conv
    depthwise = KernelTransformDepthwise(
        dyn.conv.weight, dyn.kernel_size_list, dyn.stride, dyn.dilation, type(dyn).KERNEL_TRANSFORM_MODE is not None
    )
    if depthwise.transform:
        for src, dst in zip(depthwise.kernel_sizes[1:], depthwise.kernel_sizes[:-1]):
            name = f"{src}to{dst}_matrix"
            depthwise.register_parameter(name, getattr(dyn, name))
    se = SqueezeExcite(dw.se.fc.reduce, dw.se.fc.expand) if layer.use_se else None
    conv = MBConv(
        seq(conv=padded_conv(ib.conv.conv.weight, 1, 1), bn=ib.bn.bn, act=plain_activation(ib.act, "act")),
        seq(conv=depthwise, bn=dw.bn.bn, act=plain_activation(dw.act, "act"), se=se),
        seq(conv=padded_conv(pl.conv.conv.weight, 1, 1), bn=pl.bn.bn),
    )
    return MBBlock(conv, block.shortcut is not None)


def plain_parts(net: nn.Module, info: MBInfo) -> tuple[MBBlock, nn.ModuleList]:
    """The plain first block (static) and the plain elastic stages of a network :func:`check_network` accepted."""
    first = net.blocks[0].conv
    parts = [
        None if getattr(first, p) is None else static(getattr(first, p))
        for p in ("inverted_bottleneck", "depth_conv", "point_linear")
    ]
    first_block = MBBlock(MBConv(*parts), net.blocks[0].shortcut is not None)
    stages = nn.ModuleList(nn.Sequential(*(dynamic_block(net.blocks[i]) for i in idx)) for idx in info.stages)
    return first_block, stages


def finish(net: nn.Module, plain: nn.Module, info: MBInfo) -> None:
    """Record OFA's lists on ``plain`` and turn ``net`` into it in place (see :func:`~._common.take_over`)."""
    plain.ofa_lists = {"depth_list": info.depth_list, "expand_ratio_list": info.expand_list, "ks_list": info.ks_list}
    plain.train(net.training)
    take_over(net, plain)
