"""``HeadCount``: an attention module whose head-count attribute follows the active subnet (DeBERTa-v2, timm's ViT).

Most Hugging Face attentions reshape q/k/v as ``view(B, T, -1, head_size)``, so narrower projections are fewer heads
by themselves. DeBERTa-v2's ``DisentangledSelfAttention`` reshapes by its ``num_attention_heads`` attribute
instead (``view(B, T, num_attention_heads, -1)``, and again around its relative-position scores). Converting such an
attention swaps its class, in place, for a subclass in which that attribute is a read-only property returning the
active subnet's head count for this layer, read from the plan like any operator's entry; the module's own forward
runs unchanged. Its children (the projections) are converted as usual. timm's ``Attention`` (one fused ``qkv``
projection) gets the same treatment from the traced analysis, see :mod:`subnetact.attention`.

Shapes: whatever the attention takes and returns; the heads are ``entry`` of ``H`` whole heads.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from torch import nn

from .config import SubnetConfig
from .operator import Operator, cloned_parameter, shallow_copy_as


class HeadCount(Operator):
    """Mixin of the swapped attention classes (built by :func:`head_count_class`).

    ``group``: the layer's heads channel group (its size is ``heads * head_size``); ``heads_attr`` /
    ``all_head_size_attr``: the attributes the attention reads.
    """

    group: int
    head_size: int
    heads_attr: str
    all_head_size_attr: str | None
    _base_class: type

    def plan_entry(self, cfg: SubnetConfig, sizes: list[int], stats: object) -> int:
        return sizes[self.group] // self.head_size

    def export_dense(self, entry: int, rebuild: Callable[[nn.Module], nn.Module]) -> nn.Module:
        """A plain attention of the original class with ``entry`` heads; the children exported by ``rebuild``."""
        new = self._plain_copy()
        new._modules = {name: None if m is None else rebuild(m) for name, m in self._modules.items()}
        new.__dict__[self.heads_attr] = entry
        if self.all_head_size_attr is not None:
            new.__dict__[self.all_head_size_attr] = entry * self.head_size
        return new

    def to_base(self) -> nn.Module:
        """The original class again, in place: same object, same children (the attribute was never overwritten)."""
        for name in ("group", "head_size", "heads_attr", "all_head_size_attr", "_op_index", "_subnetact_state"):
            self.__dict__.pop(name, None)
        self.__class__ = self._base_class
        return self

    def _plain_copy(self) -> nn.Module:
        cls = self._base_class
        new = cls.__new__(cls)
        # Own copies of every container (hook tables, _modules, ...), as export's generic rebuild makes.
        new.__dict__ = {k: copy.copy(v) if isinstance(v, (dict, set, list)) else v for k, v in self.__dict__.items()}
        for name in ("group", "head_size", "heads_attr", "all_head_size_attr", "_op_index", "_subnetact_state"):
            new.__dict__.pop(name, None)
        if self._parameters or self._buffers:  # DeBERTa's attention holds none; keep export independent anyway
            new._parameters = {n: cloned_parameter(p) for n, p in self._parameters.items()}
            new._buffers = {n: None if b is None else b.detach().clone() for n, b in self._buffers.items()}
        return new


_CLASSES: dict[tuple[type, str, str | None], type] = {}


def head_count_class(base: type, heads_attr: str, all_head_size_attr: str | None) -> type:
    """The subclass of ``base`` whose ``heads_attr`` (and ``all_head_size_attr``) follow the active subnet (one per
    base class, cached)."""
    key = (base, heads_attr, all_head_size_attr)
    if key not in _CLASSES:

        def heads(self: HeadCount) -> int:
            return self.entry

        attrs = {heads_attr: property(heads), "_base_class": base, "__module__": __name__}
        if all_head_size_attr is not None:
            attrs[all_head_size_attr] = property(lambda self: self.entry * self.head_size)
        _CLASSES[key] = type(f"HeadCount{base.__name__}", (HeadCount, base), attrs)
    return _CLASSES[key]


def head_count_factory(
    group: int, head_size: int, heads_attr: str, all_head_size_attr: str | None
) -> Callable[[nn.Module], nn.Module]:
    """A plan ``custom`` factory: swap the attention module's class in place (no copy; the children stay)."""

    def factory(attention: nn.Module) -> nn.Module:
        attention.__class__ = head_count_class(type(attention), heads_attr, all_head_size_attr)
        attention.group, attention.head_size = group, head_size
        attention.heads_attr, attention.all_head_size_attr = heads_attr, all_head_size_attr
        return attention

    return factory


def head_count_copy(
    attention: nn.Module, group: int, head_size: int, heads_attr: str, all_head_size_attr: str | None
) -> nn.Module:
    """A copy of ``attention`` whose class is the head-count subclass; the original object is left untouched.

    The copy shares the Parameters and child modules but has its own containers, so replacing its children with
    operators (and a rollback putting the original back) never changes the original module.
    """
    cls = head_count_class(type(attention), heads_attr, all_head_size_attr)
    new = shallow_copy_as(attention, cls)
    new.group, new.head_size = group, head_size
    new.heads_attr, new.all_head_size_attr = heads_attr, all_head_size_attr
    return new
