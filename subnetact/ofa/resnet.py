"""once-for-all's ``OFAResNets`` (e.g. ``ofa_resnet50``) -> a plain-PyTorch ResNet with SubNetAct operators.

``subnetact.convert(ofa_net)`` runs :func:`ofa_resnets_adapter` (registered by class name, so ``ofa`` is never
imported). Phase 1 checks the whole network and builds the plan; phase 2 first turns the OFA object, in place, into
an :class:`OFAResNet` holding the same Parameters (``prepare``), then inserts the operators. The space:

- ``depth``: 5 entries. Entry 0 is the input stem's residual block, choices ``(0, 1)`` (OFA's ``d[0]`` stem flag);
  entries 1-4 are the stages, in *absolute* blocks ``base + d`` with ``base = (2, 2, 4, 2)``.
- ``expand``: 18 entries, one per bottleneck block (OFA's ``e``, including blocks a depth skips).
- ``width``: 6 entries of width *multipliers* (OFA's ``w`` holds indices into ``width_mult_list``): the stem's first
  two convolutions, its third, then stages 1-4. A stage width slices the residual stream, the downsample path and
  the next stage's inputs.

A block's middle width depends on two entries, ``make_divisible(round(stage_out * expand), 8)``, so its channel
group is keyed by ``(expand[i], width[2 + stage])``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..plan import ConversionPlan, ConvertConfig, StagePlan, register_model_adapter
from ..space import Entry
from ..state import ChannelGroup
from ._common import (
    expect,
    expect_bn,
    expect_conv,
    expect_shape,
    make_divisible,
    padded_conv,
    plain_activation,
    seq,
    take_over,
)

OFA_RESNETS = "ofa.imagenet_classification.elastic_nn.networks.ofa_resnets.OFAResNets"
# ofa.imagenet_classification.networks.ResNets.BASE_DEPTH_LIST: blocks every subnet runs per stage; OFA's ``d``
# counts the blocks beyond these.
BASE_DEPTH = (2, 2, 4, 2)
STEM_DEPTH_PATH = "input_stem.1"


# -- the plain model -------------------------------------------------------------------------------------------------
class StemResidual(nn.Module):
    """The input stem's residual block: ``x + relu(bn(conv(x)))`` (no activation after the sum, as in OFA)."""

    def __init__(self, conv: nn.Conv2d, bn: nn.BatchNorm2d, act: nn.Module) -> None:
        super().__init__()
        self.conv, self.bn, self.act = conv, bn, act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    """OFA's ResNet bottleneck: ``relu(conv3(conv2(conv1(x))) + downsample(x))``; ``downsample`` is None for the
    identity shortcut, else ``[avg_pool,] conv 1x1, bn`` (``avg_pool`` only when strided: OFA's stride-1 average
    pool of kernel 1 is the identity)."""

    def __init__(
        self, conv1: nn.Sequential, conv2: nn.Sequential, conv3: nn.Sequential, downsample: nn.Sequential | None
    ) -> None:
        super().__init__()
        self.conv1, self.conv2, self.conv3, self.downsample = conv1, conv2, conv3, downsample
        self.final_act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x if self.downsample is None else self.downsample(x)
        return self.final_act(self.conv3(self.conv2(self.conv1(x))) + residual)


class OFAResNet(nn.Module):
    """Plain-PyTorch twin of once-for-all's ``ResNets`` (what ``convert`` turns an ``OFAResNets`` into).

    State-dict keys are OFA's flat static names except that block ``blocks.{i}`` lives at ``stages.{s}.{j}``
    (:attr:`ofa_block_paths` maps them; :func:`subnetact.ofa.load_checkpoint` and
    :func:`subnetact.ofa.ofa_state_dict` translate).

    Shapes: ``x`` (N, 3, H, W) -> logits (N, n_classes).
    """

    ofa_family = "resnet"

    def __init__(self, input_stem: nn.Sequential, stages: nn.ModuleList, classifier: nn.Sequential) -> None:
        super().__init__()
        self.input_stem = input_stem
        self.max_pooling = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.stages = stages
        self.classifier = classifier
        self.ofa_block_paths = [f"stages.{s}.{j}" for s, stage in enumerate(stages) for j in range(len(stage))]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.max_pooling(self.input_stem(x))  # (N, C_stem, H/4, W/4)
        for stage in self.stages:
            x = stage(x)
        x = x.mean(3).mean(2)  # (N, C) global average pool, in OFA's order
        return self.classifier(x)


# -- phase 1: check the OFA network and plan ------------------------------------------------------------------------
@dataclass
class _Info:
    depth_list: list[int]
    expand_list: list[float]
    width_list: list[float]
    stem_out: list[list[int]]  # out_channel_list of input_stem[0] and input_stem[2]
    stages: list[list[int]]  # OFA block indices per stage
    stage_out: list[list[int]]  # out_channel_list per stage


def _check(net: nn.Module) -> _Info:
    depth_list, expand_list, width_list = list(net.depth_list), list(net.expand_ratio_list), list(net.width_mult_list)
    n_w = len(width_list)
    if sorted(set(width_list)) != width_list or sorted(set(expand_list)) != expand_list:
        raise _err(f"width_mult_list={width_list!r} and expand_ratio_list={expand_list!r} must be distinct values")
    if sorted(set(depth_list)) != depth_list or depth_list[0] < 0:
        raise _err(f"depth_list={depth_list!r} must be distinct non-negative ints")
    base = tuple(getattr(net, "BASE_DEPTH_LIST", ()))
    if base != BASE_DEPTH:
        raise _err(f"BASE_DEPTH_LIST={list(base)!r}; this adapter knows ResNets with {list(BASE_DEPTH)}")

    stem = net.input_stem
    if len(stem) != 3:
        raise _err(f"input_stem has {len(stem)} layers; expected 3 (conv, residual conv, conv)")
    expect(stem[0], "input_stem.0", "DynamicConvLayer")
    expect(stem[1], "input_stem.1", "ResidualBlock")
    expect(stem[1].conv, "input_stem.1.conv", "DynamicConvLayer")
    expect(stem[1].shortcut, "input_stem.1.shortcut", "IdentityLayer")
    expect(stem[2], "input_stem.2", "DynamicConvLayer")
    stem_out = [list(stem[0].out_channel_list), list(stem[2].out_channel_list)]
    if list(stem[1].conv.out_channel_list) != stem_out[0]:
        raise _err("input_stem.1 must have input_stem.0's channel list")
    in_ch = 3
    for path, layer, outs in (
        ("input_stem.0", stem[0], stem_out[0]),
        ("input_stem.1.conv", stem[1].conv, stem_out[0]),
        ("input_stem.2", stem[2], stem_out[1]),
    ):
        _check_conv_layer(layer, path, outs, in_ch, n_w)
        in_ch = max(outs)

    blocks = list(net.blocks)
    groups = net.grouped_block_index  # OFA's own grouping (first block of a stage has a downsample path)
    if len(groups) != len(BASE_DEPTH):
        raise _err(f"{len(groups)} stages; expected {len(BASE_DEPTH)}")
    stage_out = []
    for s, idx in enumerate(groups):
        if len(idx) != BASE_DEPTH[s] + max(depth_list):
            raise _err(
                f"stage {s + 1} has {len(idx)} blocks; BASE_DEPTH_LIST + max(depth_list) gives "
                f"{BASE_DEPTH[s] + max(depth_list)}"
            )
        outs = list(blocks[idx[0]].out_channel_list)
        stage_out.append(outs)
        for pos, i in enumerate(idx):
            _check_block(blocks[i], f"blocks.{i}", outs, in_ch, expand_list, n_w, first=pos == 0)
            in_ch = max(outs)
    cls = net.classifier
    expect(cls, "classifier", "DynamicLinearLayer")
    expect(cls.linear, "classifier.linear", "DynamicLinear")
    if type(cls.linear.linear) is not nn.Linear:
        raise _err("classifier.linear.linear must be a torch.nn.Linear")
    expect_shape(cls.linear.linear.weight, (cls.out_features, in_ch), "classifier.linear.linear.weight")
    return _Info(depth_list, expand_list, width_list, stem_out, groups, stage_out)


def _check_conv_layer(layer: nn.Module, path: str, outs: list[int], in_ch: int, n_w: int) -> None:
    if len(outs) != n_w or sorted(outs) != outs:
        raise _err(f"{path}.out_channel_list={outs!r} must hold one increasing count per width multiplier")
    if not layer.use_bn or layer.act_func != "relu":
        raise _err(f"{path} must have BatchNorm and ReLU (use_bn={layer.use_bn!r}, act_func={layer.act_func!r})")
    expect(layer.conv, f"{path}.conv", "DynamicConv2d")
    expect(layer.bn, f"{path}.bn", "DynamicBatchNorm2d")
    k = layer.kernel_size
    expect_shape(expect_conv(layer.conv.conv, f"{path}.conv.conv").weight, (max(outs), in_ch, k, k), path)
    expect_shape(expect_bn(layer.bn.bn, f"{path}.bn.bn").weight, (max(outs),), f"{path}.bn.bn.weight")


def _check_block(
    block: nn.Module, path: str, outs: list[int], in_ch: int, expand_list: list[float], n_w: int, first: bool
) -> None:
    expect(block, path, "DynamicResNetBottleneckBlock")
    if list(block.out_channel_list) != outs or len(outs) != n_w or sorted(outs) != outs:
        raise _err(f"{path}.out_channel_list={block.out_channel_list!r}; expected its stage's {outs!r}")
    if list(block.expand_ratio_list) != expand_list:
        raise _err(f"{path}.expand_ratio_list={block.expand_ratio_list!r}; expected the network's {expand_list!r}")
    if block.act_func != "relu":
        raise _err(f"{path}.act_func={block.act_func!r}; only 'relu' is supported")
    mid = make_divisible(round(max(outs) * max(expand_list)))
    k = block.kernel_size
    for name, shape in (("conv1", (mid, in_ch, 1, 1)), ("conv2", (mid, mid, k, k)), ("conv3", (max(outs), mid, 1, 1))):
        layer = getattr(block, name)
        expect(layer.conv, f"{path}.{name}.conv", "DynamicConv2d")
        expect(layer.bn, f"{path}.{name}.bn", "DynamicBatchNorm2d")
        expect_shape(expect_conv(layer.conv.conv, f"{path}.{name}.conv.conv").weight, shape, f"{path}.{name}")
        expect_shape(expect_bn(layer.bn.bn, f"{path}.{name}.bn.bn").weight, shape[:1], f"{path}.{name}.bn")
    identity = type(block.downsample).__name__ == "IdentityLayer"
    if identity == first:
        raise _err(f"{path}: the first block of a stage (and only it) must have a downsample path")
    if not identity:
        expect(block.downsample.conv, f"{path}.downsample.conv", "DynamicConv2d")
        expect(block.downsample.bn, f"{path}.downsample.bn", "DynamicBatchNorm2d")
        conv = expect_conv(block.downsample.conv.conv, f"{path}.downsample.conv.conv")
        expect_shape(conv.weight, (max(outs), in_ch, 1, 1), f"{path}.downsample.conv")
        expect_bn(block.downsample.bn.bn, f"{path}.downsample.bn.bn")
        if block.downsample_mode not in ("avgpool_conv", "conv"):
            raise _err(f"{path}.downsample_mode={block.downsample_mode!r}; supported: 'avgpool_conv', 'conv'")


def _err(msg: str) -> Exception:
    from ..errors import UnsupportedModelError

    return UnsupportedModelError(f"once-for-all adapter (OFAResNets): {msg}")


def _plan(info: _Info) -> ConversionPlan:
    # Channel groups 0-5: the six width entries; then one middle group per block.
    w_choices = tuple(info.width_list)
    width_outs = [info.stem_out[0], info.stem_out[1], *info.stage_out]
    groups = [ChannelGroup("width", k, max(outs), tuple(zip(w_choices, outs))) for k, outs in enumerate(width_outs)]
    e_choices = tuple(info.expand_list)
    depth = [Entry(STEM_DEPTH_PATH, (0, 1))]
    expand, slices, norms = [], {}, {}

    def conv_bn(path: str, out_g: int | None, in_g: int | None, norm: str = "bn") -> None:
        slices[f"{path}.conv"] = (out_g, in_g)
        norms[f"{path}.{norm}"] = out_g

    conv_bn("input_stem.0", 0, None)
    slices["input_stem.1.conv.conv"] = (0, 0)
    norms["input_stem.1.conv.bn"] = 0
    conv_bn("input_stem.2", 1, 0)
    block = 0
    for s, idx in enumerate(info.stages):
        depth.append(Entry(f"stages.{s}", tuple(BASE_DEPTH[s] + d for d in info.depth_list)))
        out_g = 2 + s
        for j in range(len(idx)):
            path = f"stages.{s}.{j}"
            in_g = out_g if j else out_g - 1
            outs = info.stage_out[s]
            sizes = tuple(
                ((e, w), make_divisible(round(out * e))) for e in e_choices for w, out in zip(w_choices, outs)
            )
            mid = len(groups)
            groups.append(ChannelGroup(("expand", "width"), (block, out_g), max(k for _, k in sizes), sizes))
            expand.append(Entry(path, e_choices))
            conv_bn(f"{path}.conv1", mid, in_g)
            conv_bn(f"{path}.conv2", mid, mid)
            conv_bn(f"{path}.conv3", out_g, mid)
            if j == 0:
                conv_bn(f"{path}.downsample", out_g, in_g)
            block += 1
    slices["classifier.linear"] = (None, 5)
    width = [
        Entry(name, w_choices)
        for name in ("input_stem.0", "input_stem.2", *(f"stages.{s}" for s in range(len(info.stages))))
    ]
    stages = [StagePlan(STEM_DEPTH_PATH)] + [StagePlan(f"stages.{s}") for s in range(len(info.stages))]
    return ConversionPlan(
        stages, {"depth": depth, "expand": expand, "width": width}, groups, slices, norms, prepare=_prepare(info)
    )


# -- phase 2: OFA modules -> plain modules holding the same Parameters ----------------------------------------------
def _conv_layer(layer: nn.Module) -> nn.Sequential:
    dyn = layer.conv
    conv = padded_conv(dyn.conv.weight, dyn.kernel_size, dyn.stride, dyn.dilation)
    return seq(conv=conv, bn=layer.bn.bn, act=plain_activation(layer.act, "act"))


def _bottleneck(block: nn.Module) -> Bottleneck:
    def part(layer: nn.Sequential, act: bool) -> nn.Sequential:
        dyn = layer.conv
        conv = padded_conv(dyn.conv.weight, dyn.kernel_size, dyn.stride, dyn.dilation)
        return seq(conv=conv, bn=layer.bn.bn, act=nn.ReLU(inplace=True) if act else None)

    downsample = None
    if type(block.downsample).__name__ != "IdentityLayer":
        ds = block.downsample
        pool = getattr(ds, "avg_pool", None)
        strided = block.downsample_mode == "avgpool_conv" and block.stride > 1
        conv = padded_conv(ds.conv.conv.weight, 1, 1 if block.downsample_mode == "avgpool_conv" else block.stride)
        downsample = seq(avg_pool=pool if strided else None, conv=conv, bn=ds.bn.bn)
    return Bottleneck(part(block.conv1, True), part(block.conv2, True), part(block.conv3, False), downsample)


def _prepare(info: _Info) -> Callable[[nn.Module], None]:
    def prepare(net: nn.Module) -> None:
        stem = net.input_stem
        res = stem[1].conv
        residual = StemResidual(
            padded_conv(res.conv.conv.weight, res.conv.kernel_size, res.conv.stride, res.conv.dilation),
            res.bn.bn,
            plain_activation(res.act, "input_stem.1.conv.act"),
        )
        input_stem = nn.Sequential(_conv_layer(stem[0]), seq(conv=residual), _conv_layer(stem[2]))
        stages = nn.ModuleList(nn.Sequential(*(_bottleneck(net.blocks[i]) for i in idx)) for idx in info.stages)
        dyn = net.classifier
        classifier = seq(dropout=dyn.dropout, linear=dyn.linear.linear)
        plain = OFAResNet(input_stem, stages, classifier)
        plain.max_pooling = net.max_pooling
        plain.ofa_lists = {
            "depth_list": info.depth_list,
            "expand_ratio_list": info.expand_list,
            "width_mult_list": info.width_list,
        }
        plain.train(net.training)
        take_over(net, plain)

    return prepare


@register_model_adapter(OFA_RESNETS)
def ofa_resnets_adapter(model: nn.Module, config: ConvertConfig, filter_fn) -> ConversionPlan:
    """Model adapter for ``ofa``'s ``OFAResNets`` (see the module docstring). ``config`` is not used: the space is
    the OFA network's own."""
    if filter_fn is not None:
        raise _err("filter_fn is not supported: every elastic dimension of the OFA network is converted")
    return _plan(_check(model))
