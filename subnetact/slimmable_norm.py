"""``SubnetLayerNorm`` / ``SubnetGroupNorm``: LayerNorm and GroupNorm over an elastic channel group.

Slimmable-network semantics: a subnet running the first ``k`` channels of the group normalises over those ``k``
channels only (GroupNorm: over the first ``k / (C / G)`` whole groups), with the affine parameters sliced to the
first ``k``, exactly what the exported layer of ``k`` channels computes. There are no statistics to calibrate. At the
full width the original class's forward runs, so the largest subnet is the original bit for bit.

``convert`` uses them only where the trace shows the norm reads a sliced dimension (an MLP's hidden units, an
attention's heads, a bottleneck's middle channels); norms of residual streams stay plain, full-width modules.

Shapes: LayerNorm ``x`` (..., k) -> (..., k); GroupNorm ``x`` (N, k, *) -> (N, k, *).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .config import SubnetConfig
from .handlers import OperatorEntry, register_operator_kind
from .operator import Operator, cloned_parameter, shallow_copy_as

#: nn.LayerNorm subclasses whose forward is ``F.layer_norm`` over their one normalised dimension (by qualified name,
#: so timm is not imported): timm's ``LayerNorm`` (its optional fast kernel computes the same function).
LAYER_NORM_CLASSES = {"timm.layers.norm.LayerNorm"}

_OPERATOR_ATTRS = ("group", "_op_index", "_subnetact_state", "_base_class")


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def is_layer_norm(module: nn.Module) -> bool:
    """An ``nn.LayerNorm`` (or a class of :data:`LAYER_NORM_CLASSES`) over one dimension."""
    cls = type(module)
    return (
        (cls is nn.LayerNorm or (isinstance(module, nn.LayerNorm) and _qualname(cls) in LAYER_NORM_CLASSES))
        and len(module.normalized_shape) == 1
        and not module._modules
    )


def is_group_norm(module: nn.Module) -> bool:
    return type(module) is nn.GroupNorm


class _SlicedAffineNorm(Operator):
    """Shared parts: built as a copy of the original norm holding the same Parameters; export and unconvert give
    back the original class."""

    group: int
    _base_class: type

    @classmethod
    def from_module(cls, norm: nn.Module, group: int) -> nn.Module:
        """A copy of ``norm`` (same Parameters; ``norm`` itself is not changed) slicing channel group ``group``."""
        new = shallow_copy_as(norm, cls)
        new.group, new._base_class = group, type(norm)
        return new

    def _plain(self) -> nn.Module:
        plain = shallow_copy_as(self, self._base_class)
        for name in _OPERATOR_ATTRS:
            plain.__dict__.pop(name, None)
        return plain

    def _full(self) -> int:
        raise NotImplementedError

    def plan_entry(self, cfg: SubnetConfig, sizes: list[int], stats: object) -> tuple | None:
        k = sizes[self.group]
        if k == self._full():
            return None
        return (k, None if self.weight is None else self.weight[:k], None if self.bias is None else self.bias[:k])

    def export_dense(self, entry: tuple | None, rebuild: Callable[[nn.Module], nn.Module]) -> nn.Module:
        k = self._full() if entry is None else entry[0]
        dense = self._plain()
        dense._parameters = {n: cloned_parameter(None if p is None else p[:k]) for n, p in self._parameters.items()}
        dense._buffers = {n: None if b is None else b.detach().clone() for n, b in self._buffers.items()}
        self._resize(dense, k)
        return dense

    def _resize(self, dense: nn.Module, k: int) -> None:
        raise NotImplementedError

    def to_base(self) -> nn.Module:
        return self._plain()

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, group={self.group}"


class SubnetLayerNorm(_SlicedAffineNorm, nn.LayerNorm):
    """``nn.LayerNorm`` over one elastic dimension: normalises over the active ``k`` channels (see the module
    docstring). Entry: None at full width, else ``(k, weight[:k], bias[:k])``."""

    def _full(self) -> int:
        return self.normalized_shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        entry = self._subnetact_state.current().entries[self._op_index]
        if entry is None:
            return self._base_class.forward(self, x)
        k, weight, bias = entry
        if torch.is_grad_enabled() and self.weight is not None and self.weight.requires_grad:
            weight, bias = self.weight[:k], None if self.bias is None else self.bias[:k]
        return F.layer_norm(x, (k,), weight, bias, self.eps)

    def _resize(self, dense: nn.Module, k: int) -> None:
        dense.normalized_shape = (k,)


class SubnetGroupNorm(_SlicedAffineNorm, nn.GroupNorm):
    """``nn.GroupNorm`` over an elastic channel group in whole groups: ``k`` channels run ``k / (C / G)`` groups
    (see the module docstring). Entry: None at full width, else ``(k, weight[:k], bias[:k])``."""

    def _full(self) -> int:
        return self.num_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        entry = self._subnetact_state.current().entries[self._op_index]
        if entry is None:
            return nn.GroupNorm.forward(self, x)
        k, weight, bias = entry
        if torch.is_grad_enabled() and self.weight is not None and self.weight.requires_grad:
            weight, bias = self.weight[:k], self.bias[:k]
        return F.group_norm(x, k // (self.num_channels // self.num_groups), weight, bias, self.eps)

    def _resize(self, dense: nn.Module, k: int) -> None:
        dense.num_groups = k // (self.num_channels // self.num_groups)
        dense.num_channels = k


@register_operator_kind("slimmable_norm")
def slimmable_norm(module: nn.Module, entry: OperatorEntry) -> nn.Module:
    """Handler of kind ``"slimmable_norm"``: the operator for a LayerNorm / GroupNorm reading channel group
    ``entry.groups[0]``."""
    (group,) = entry.groups
    cls = SubnetGroupNorm if isinstance(module, nn.GroupNorm) else SubnetLayerNorm
    return cls.from_module(module, group)
