"""Block rules: how ``convert`` finds the elastic channels inside a block type.

A rule is a function ``block -> BlockSpec`` registered for a block class with :func:`register_block_rule`. The
registry is looked up along the block's MRO, so a rule for a base class covers its subclasses. A rule may return
None for a block it does not describe (the built-in ResNet rules do for blocks built with ``FrozenBatchNorm2d``):
that block's whole stage then goes to the traced analysis. Built-in rules for
third-party classes (torchvision) are registered by qualified class name, so importing subnetact never imports
torchvision.

Example::

    @subnetact.register_block_rule(MyBlock)
    def my_block_rule(block: MyBlock) -> subnetact.BlockSpec:
        return subnetact.BlockSpec(
            width=subnetact.ChannelSpec(size=block.mid, producers=("conv1",), norms=("bn1",), consumers=("conv2",)),
            skippable=block.stride == 1 and block.downsample is None,
        )
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from .._registry import ClassRegistry
from ..errors import ConfigError, UnsupportedModelError


@dataclass(frozen=True)
class ChannelSpec:
    """An elastic channel dimension inside a block (what one width value slices).

    Args:
        size: full number of channels.
        unit: granularity; active sizes are multiples of it (channels per group for grouped convolutions).
        producers: paths (relative to the block) of conv/linear layers whose *output* channels are these.
        norms: paths of the BatchNorm layers that normalise them.
        consumers: paths of conv/linear layers whose *input* channels are these.
    """

    size: int
    producers: tuple[str, ...]
    norms: tuple[str, ...]
    consumers: tuple[str, ...]
    unit: int = 1

    def __post_init__(self) -> None:
        if self.size < 1 or self.unit < 1 or self.size % self.unit:
            raise ConfigError(f"ChannelSpec size={self.size!r} must be a positive multiple of unit={self.unit!r}")
        if not self.producers:
            raise ConfigError("ChannelSpec needs at least one producer layer")


@dataclass(frozen=True)
class BlockSpec:
    """What ``convert`` needs to know about one block.

    Args:
        width: the block's elastic channels, or None if its width is fixed.
        skippable: whether the block maps its input shape to the same output shape, so ``LayerSelect`` may skip it.
    """

    width: ChannelSpec | None
    skippable: bool


BlockRule = Callable[[nn.Module], "BlockSpec | None"]


_RULES: ClassRegistry[BlockRule] = ClassRegistry()  # built-ins: subnetact/builtins.py


def register_block_rule(block_type: type | str) -> Callable[[BlockRule], BlockRule]:
    """Decorator registering ``rule`` for ``block_type`` (a class, or its ``"module.QualName"``)."""
    return _RULES.register(block_type)


def unregister_block_rule(block_type: type | str) -> None:
    """Remove the rule registered for ``block_type`` (exactly that key), if any."""
    _RULES.pop(block_type)


def find_block_rule(module: nn.Module) -> BlockRule | None:
    return _RULES.lookup(type(module))


def registered_block_types() -> list[str]:
    return _RULES.names()


def unsupported_block_error(path: str, module: nn.Module) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"module {path!r} of type {type(module).__module__}.{type(module).__qualname__} looks like a block (it holds "
        f"convolution/linear layers inside a stage) but no block rule knows it. Register one with "
        f"@subnetact.register_block_rule({type(module).__qualname__}) returning a subnetact.BlockSpec "
        f"(known block types: {', '.join(registered_block_types())})"
    )
