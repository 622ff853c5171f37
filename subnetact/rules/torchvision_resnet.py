"""Block rules for torchvision's ResNet family (resnet18..152, resnext, wide_resnet).

Registered by qualified name so that subnetact does not import torchvision.
"""

from __future__ import annotations

from torch import nn

from . import BlockSpec, ChannelSpec, register_block_rule


def _skippable(block: nn.Module) -> bool:
    return block.downsample is None and block.stride == 1


def _plain(block: nn.Module, convs: tuple[str, ...], norms: tuple[str, ...]) -> bool:
    """Whether the layers the rule slices are plain ``nn.Conv2d`` / ``nn.BatchNorm2d``; a block built with another
    norm layer (detection backbones' ``FrozenBatchNorm2d``) is left to the traced analysis."""
    return all(type(getattr(block, n, None)) is nn.Conv2d for n in convs) and all(
        type(getattr(block, n, None)) is nn.BatchNorm2d for n in norms
    )


@register_block_rule("torchvision.models.resnet.BasicBlock")
def basic_block_rule(block: nn.Module) -> BlockSpec | None:
    # conv1 -> bn1 -> relu -> conv2: the middle channels are elastic; conv2's output is the residual stream.
    if not _plain(block, ("conv1", "conv2"), ("bn1",)):
        return None
    return BlockSpec(
        width=ChannelSpec(
            size=block.conv1.out_channels, producers=("conv1",), norms=("bn1",), consumers=("conv2",), unit=1
        ),
        skippable=_skippable(block),
    )


@register_block_rule("torchvision.models.resnet.Bottleneck")
def bottleneck_rule(block: nn.Module) -> BlockSpec | None:
    # conv1 (1x1) -> bn1 -> conv2 (3x3, maybe grouped) -> bn2 -> conv3 (1x1): both middle widths are the block's
    # ``width``, so one value slices them together. For ResNeXt, conv2 is grouped and only whole groups are kept.
    if not _plain(block, ("conv1", "conv2", "conv3"), ("bn1", "bn2")):
        return None
    mid = block.conv2.out_channels
    return BlockSpec(
        width=ChannelSpec(
            size=mid,
            producers=("conv1", "conv2"),
            norms=("bn1", "bn2"),
            consumers=("conv2", "conv3"),
            unit=mid // block.conv2.groups if block.conv2.groups > 1 else 1,
        ),
        skippable=_skippable(block),
    )
