"""once-for-all's ``OFAMobileNetV3`` -> a plain-PyTorch MobileNetV3 with SubNetAct operators.

The space: ``depth`` (5 stages, *absolute* blocks in ``depth_list``, first blocks kept), ``expand`` and ``kernel``
(one entry per elastic block, 20 for ``ofa_mbv3_d234_e346_k357``). The blocks, their checks and the plan are shared
with ProxylessNAS (:mod:`subnetact.ofa.mbconv`: middle width ``make_divisible(round(in_channels * expand), 8)``,
squeeze-excite width ``make_divisible(mid // 4, 8)``, the elastic kernel
:class:`~subnetact.ofa.mbconv.ElasticKernelDepthwiseConv2d`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..errors import UnsupportedModelError
from ..plan import ConversionPlan, ConvertConfig, register_model_adapter
from .mbconv import (
    ElasticKernelDepthwiseConv2d,
    KernelTransformDepthwise,
    MBBlock,
    MBConv,
    MBInfo,
    check_network,
    finish,
    mb_plan,
    plain_parts,
    static,
)

__all__ = ["ElasticKernelDepthwiseConv2d", "KernelTransformDepthwise", "MBBlock", "MBConv", "OFAMobileNet"]

OFA_MBV3 = "ofa.imagenet_classification.elastic_nn.networks.ofa_mbv3.OFAMobileNetV3"


class OFAMobileNet(nn.Module):
    """Plain-PyTorch twin of once-for-all's ``MobileNetV3`` (what ``convert`` turns an ``OFAMobileNetV3`` into).

    Keys are OFA's flat names with ``blocks.0`` at ``first_block`` and ``blocks.{i}`` at ``stages.{s}.{j}``
    (:attr:`ofa_block_paths`). Shapes: ``x`` (N, 3, H, W) -> logits (N, n_classes).
    """

    ofa_family = "mbv3"

    def __init__(
        self, first_conv, first_block, stages: nn.ModuleList, final_expand_layer, feature_mix_layer, classifier
    ):
        super().__init__()
        self.first_conv, self.first_block, self.stages = first_conv, first_block, stages
        self.final_expand_layer, self.feature_mix_layer, self.classifier = (
            final_expand_layer,
            feature_mix_layer,
            classifier,
        )
        self.ofa_block_paths = ["first_block"] + [
            f"stages.{s}.{j}" for s, stage in enumerate(stages) for j in range(len(stage))
        ]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first_block(self.first_conv(x))
        for stage in self.stages:
            x = stage(x)
        x = self.final_expand_layer(x)
        x = x.mean(3, keepdim=True).mean(2, keepdim=True)  # (N, C, 1, 1), in OFA's order
        x = self.feature_mix_layer(x)
        return self.classifier(torch.flatten(x, 1))


def _err(msg: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"once-for-all adapter (OFAMobileNetV3): {msg}")


def _check(net: nn.Module) -> MBInfo:
    stages = len(net.block_group_info)
    sizes = [max(net.depth_list)] * stages  # every stage has max(depth_list) blocks
    return check_network(net, ("first_conv", "final_expand_layer", "feature_mix_layer", "classifier"), sizes, _err)


def _prepare(info: MBInfo) -> Callable[[nn.Module], None]:
    def prepare(net: nn.Module) -> None:
        first_block, stages = plain_parts(net, info)
        plain = OFAMobileNet(
            static(net.first_conv),
            first_block,
            stages,
            static(net.final_expand_layer),
            static(net.feature_mix_layer),
            static(net.classifier),
        )
        finish(net, plain, info)

    return prepare


@register_model_adapter(OFA_MBV3)
def ofa_mbv3_adapter(model: nn.Module, config: ConvertConfig, filter_fn) -> ConversionPlan:
    """Model adapter for ``ofa``'s ``OFAMobileNetV3`` (see the module docstring); ``config`` is not used."""
    if filter_fn is not None:
        raise _err("filter_fn is not supported: every elastic dimension of the OFA network is converted")
    info = _check(model)
    return mb_plan(info, _prepare(info))
