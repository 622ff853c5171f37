"""once-for-all's ``OFAProxylessNASNets`` -> a plain-PyTorch ProxylessNAS network with SubNetAct operators.

The network is OFA's MobileNetV3 supernet without squeeze-excite, hard-swish or the final expand layer: a static
stem conv, a static first block, six stages of elastic inverted-bottleneck blocks (five of ``max(depth_list)``
blocks, the last of one), a 1x1 feature-mix conv *before* the global average pool, and a linear classifier. The
blocks, their checks and the plan are shared with MobileNetV3 (:mod:`subnetact.ofa.mbconv`).

The space: ``depth`` (6 entries, *absolute* blocks; the last stage's only choice is 1, as OFA runs
``min(len(stage), d)`` blocks and its sampler sets ``d[-1] = 1``), ``expand`` and ``kernel`` (one entry per elastic
block, 21 for ``ofa_proxyless_d234_e346_k357_w1.3``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..errors import UnsupportedModelError
from ..plan import ConversionPlan, ConvertConfig, register_model_adapter
from .mbconv import MBInfo, check_network, finish, mb_plan, plain_parts, static

OFA_PROXYLESS = "ofa.imagenet_classification.elastic_nn.networks.ofa_proxyless.OFAProxylessNASNets"


class OFAProxylessNet(nn.Module):
    """Plain-PyTorch twin of once-for-all's ``ProxylessNASNets`` (what ``convert`` turns an
    ``OFAProxylessNASNets`` into).

    Keys are OFA's flat names with ``blocks.0`` at ``first_block`` and ``blocks.{i}`` at ``stages.{s}.{j}``
    (:attr:`ofa_block_paths`). Shapes: ``x`` (N, 3, H, W) -> logits (N, n_classes).
    """

    ofa_family = "proxyless"

    def __init__(self, first_conv, first_block, stages: nn.ModuleList, feature_mix_layer, classifier):
        super().__init__()
        self.first_conv, self.first_block, self.stages = first_conv, first_block, stages
        self.feature_mix_layer, self.classifier = feature_mix_layer, classifier
        self.ofa_block_paths = ["first_block"] + [
            f"stages.{s}.{j}" for s, stage in enumerate(stages) for j in range(len(stage))
        ]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first_block(self.first_conv(x))
        for stage in self.stages:
            x = stage(x)
        x = self.feature_mix_layer(x)  # (N, C, H, W): ProxylessNAS mixes before pooling
        return self.classifier(x.mean(3).mean(2))  # (N, C), in OFA's order


def _err(msg: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"once-for-all adapter (OFAProxylessNASNets): {msg}")


def _check(net: nn.Module) -> MBInfo:
    stages = len(net.block_group_info)
    sizes = [max(net.depth_list)] * (stages - 1) + [1]  # OFA's n_block_list: the last stage has one block
    return check_network(net, ("first_conv", "feature_mix_layer", "classifier"), sizes, _err)


def _prepare(info: MBInfo) -> Callable[[nn.Module], None]:
    def prepare(net: nn.Module) -> None:
        first_block, stages = plain_parts(net, info)
        plain = OFAProxylessNet(
            static(net.first_conv),
            first_block,
            stages,
            static(net.feature_mix_layer),
            static(net.classifier),
        )
        finish(net, plain, info)

    return prepare


@register_model_adapter(OFA_PROXYLESS)
def ofa_proxyless_adapter(model: nn.Module, config: ConvertConfig, filter_fn) -> ConversionPlan:
    """Model adapter for ``ofa``'s ``OFAProxylessNASNets`` (see the module docstring); ``config`` is not used."""
    if filter_fn is not None:
        raise _err("filter_fn is not supported: every elastic dimension of the OFA network is converted")
    info = _check(model)
    return mb_plan(info, _prepare(info))
