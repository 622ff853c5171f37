"""Elastic attention heads: the ``"attention"`` operator kind, and attentions with one fused ``qkv`` projection (timm).

A subnet keeps the first ``h`` of an attention's ``H`` heads: the q, k and v rows of those heads (the first
``h * head_dim`` rows of each of the three packed parts) and the matching input columns of the output projection.
The head count is a channel group of ``H * head_dim`` channels in whole heads, actuated like every group: the plan
holds the sliced views, the forward reads its entry.

- ``nn.MultiheadAttention`` becomes :class:`~subnetact.mha.SubnetMultiheadAttention` (:mod:`subnetact.mha`).
- An attention registered with :func:`register_packed_attention` (timm's ``vision_transformer.Attention``, built in)
  keeps its own forward: its class is swapped, in a copy, for a :class:`~subnetact.head_count.HeadCount` subclass
  whose head-count attributes follow the subnet, its ``qkv`` layer becomes a :class:`PackedSliceLinear` and its
  output projection a :class:`~subnetact.weight_slice.WeightSliceLinear`. Its export is the same class with fewer
  heads (``num_heads``, ``attn_dim`` and the layers' sizes; ``head_dim`` unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ._registry import qualified_name
from .config import SubnetConfig
from .errors import ConfigError
from .handlers import OperatorEntry, register_operator_kind
from .head_count import head_count_copy
from .mha import NarrowMultiheadAttention, SubnetMultiheadAttention, narrow_attention  # noqa: F401  (kept importable from here)
from .operator import cloned_parameter
from .slimmable_norm import SubnetLayerNorm, is_layer_norm
from .weight_slice import WeightSlice, WeightSliceLinear


@dataclass(frozen=True)
class PackedAttention:
    """Where an attention module with one fused q/k/v projection keeps its parts.

    The module's forward must reshape the ``qkv`` output as ``(..., 3, heads, head_dim)`` using the ``heads_attr``
    attribute (and ``attn_dim_attr`` for the width of the attention output), as timm's ``Attention`` does.

    Args:
        qkv: the ``nn.Linear`` producing ``3 * heads * head_dim`` channels (q, k, v, each head-major).
        proj: the ``nn.Linear`` reading the ``heads * head_dim`` attention output.
        heads_attr / head_dim_attr: the module's attributes holding the head count and the head size.
        attn_dim_attr: the attribute holding ``heads * head_dim`` (None if the module has none).
        head_producers: further ``nn.Linear`` children producing one channel per attention-output channel (timm's
            ``gate``); sliced like q/k/v. A missing or None child is skipped.
        head_norms: children normalising the attention output (timm's ``norm``, a LayerNorm when ``scale_norm=True``):
            ``nn.Identity``, None, or a LayerNorm over its ``heads * head_dim`` channels, which becomes a
            :class:`~subnetact.slimmable_norm.SubnetLayerNorm` normalising over the active heads' channels.
    """

    qkv: str = "qkv"
    proj: str = "proj"
    heads_attr: str = "num_heads"
    head_dim_attr: str = "head_dim"
    attn_dim_attr: str | None = "attn_dim"
    head_producers: tuple[str, ...] = ()
    head_norms: tuple[str, ...] = ()


#: class or ``"module.QualName"`` -> spec; exact classes only (a subclass may compute differently). Built-ins:
#: subnetact/rules/timm_vit.py.
_PACKED: dict[type | str, PackedAttention] = {}


def register_packed_attention(module_type: type | str, spec: PackedAttention) -> None:
    """Make the traced analysis of :func:`subnetact.convert` slice the heads of ``module_type`` (a class or its
    ``"module.QualName"``; exactly that class, not its subclasses) as ``spec`` describes."""
    if not isinstance(spec, PackedAttention):
        raise ConfigError(f"spec={spec!r} must be a subnetact.attention.PackedAttention")
    if not isinstance(module_type, (type, str)):
        raise ConfigError(f"module_type={module_type!r} must be a class or a 'module.QualName' string")
    _PACKED[module_type] = spec


def _packed_spec(module: nn.Module) -> PackedAttention | None:
    cls = type(module)
    return _PACKED.get(cls) or _PACKED.get(qualified_name(cls))


def is_attention(module: nn.Module) -> bool:
    """Whether the trace treats ``module`` as an attention with elastic heads (one node; its inside is not traced)."""
    return type(module) is nn.MultiheadAttention or _packed_spec(module) is not None


def head_layout(module: nn.Module) -> tuple[int, int] | str:
    """``(heads, head_dim)`` of an attention whose heads can be sliced, else the reason they cannot."""
    name = type(module).__name__
    if isinstance(module, nn.MultiheadAttention):
        if module.bias_k is not None or module.add_zero_attn:
            return f"{name} with add_bias_kv / add_zero_attn keeps its heads whole"
        heads, head_dim = module.num_heads, module.head_dim
    else:
        spec = _packed_spec(module)
        heads, head_dim = getattr(module, spec.heads_attr, None), getattr(module, spec.head_dim_attr, None)
        if not isinstance(heads, int) or not isinstance(head_dim, int):
            return f"{name} has no int {spec.heads_attr!r} / {spec.head_dim_attr!r}"
        width = heads * head_dim
        layers = {spec.qkv: 3 * width, **dict.fromkeys(spec.head_producers, width)}
        for child, size in layers.items():
            layer = getattr(module, child, None)
            if layer is None and child in spec.head_producers:
                continue
            if type(layer) is not nn.Linear or layer.out_features != size:
                return f"{name}.{child} is not an nn.Linear with {size} outputs"
        proj = getattr(module, spec.proj, None)
        if type(proj) is not nn.Linear or proj.in_features != width:
            return f"{name}.{spec.proj} is not an nn.Linear reading {width} channels"
        if spec.attn_dim_attr is not None and getattr(module, spec.attn_dim_attr, None) != width:
            return f"{name}.{spec.attn_dim_attr} is not {width}"
        for child in spec.head_norms:
            norm = getattr(module, child, None)
            if isinstance(norm, (nn.Identity, type(None))):
                continue
            if not is_layer_norm(norm) or norm.normalized_shape[0] != width:
                return f"{name}.{child} ({type(norm).__name__}) reads the attention output whole"
    if heads < 2:
        return f"{name} has {heads} head"
    return heads, head_dim


@register_operator_kind("attention")
def attention_heads(module: nn.Module, entry: OperatorEntry) -> nn.Module:
    """Handler of kind ``"attention"``: the operator slicing the heads of ``module`` (an ``nn.MultiheadAttention``
    or a registered packed attention) with heads channel group ``entry.groups[0]``.

    A packed attention becomes a head-count copy of itself (same Parameters, its own children: ``module`` is not
    changed) whose ``qkv`` is a :class:`PackedSliceLinear`, output projection and head producers
    :class:`~subnetact.weight_slice.WeightSliceLinear` and head norms :class:`SubnetLayerNorm`.
    """
    (group,) = entry.groups
    if isinstance(module, nn.MultiheadAttention):
        return SubnetMultiheadAttention.from_module(module, group)
    spec = _packed_spec(module)
    new = head_count_copy(module, group, getattr(module, spec.head_dim_attr), spec.heads_attr, spec.attn_dim_attr)
    setattr(new, spec.qkv, PackedSliceLinear.from_module(getattr(new, spec.qkv), 3, group))
    setattr(new, spec.proj, WeightSliceLinear.from_module(getattr(new, spec.proj), None, group))
    for child in spec.head_producers:
        if getattr(new, child, None) is not None:
            setattr(new, child, WeightSliceLinear.from_module(getattr(new, child), group, None))
    for child in spec.head_norms:
        norm = getattr(new, child, None)
        if norm is not None and is_layer_norm(norm):
            setattr(new, child, SubnetLayerNorm.from_module(norm, group))
    return new


class PackedSliceLinear(WeightSlice, nn.Linear):
    """``nn.Linear`` whose output packs ``chunks`` equal parts (q, k and v); each part keeps its first k rows.

    Shapes: ``x`` (..., in) -> (..., chunks * k); at the full width exactly ``nn.Linear``'s output. Each part's rows
    are a contiguous prefix of that part, so each part is one ``F.linear`` on an in-place view; the parts are
    concatenated (one copy of the output, not of the weight).
    """

    chunks: int

    @classmethod
    def from_module(cls, linear: nn.Linear, chunks: int, out_group: int) -> PackedSliceLinear:
        if linear.out_features % chunks:
            raise ConfigError(f"{linear.out_features} outputs cannot be split into chunks={chunks} equal parts")
        with torch.device("meta"):
            new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None)
        new._takes_over(linear)
        new.chunks, new.out_group, new.in_group = chunks, out_group, None
        return new

    def _parts(self, k: int) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        part = self.out_features // self.chunks
        weights = [self.weight[i * part : i * part + k] for i in range(self.chunks)]
        biases = [None if self.bias is None else self.bias[i * part : i * part + k] for i in range(self.chunks)]
        return weights, biases

    def plan_entry(self, cfg: SubnetConfig, sizes: list[int], stats: object) -> tuple | None:
        k = sizes[self.out_group]
        return None if k * self.chunks == self.out_features else (k, *self._parts(k))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        entry = self._subnetact_state.current().entries[self._op_index]
        if entry is None:
            return F.linear(x, self.weight, self.bias)
        k, weights, biases = entry
        if torch.is_grad_enabled() and self.weight.requires_grad:
            weights, biases = self._parts(k)  # planned views were made under no_grad
        return torch.cat([F.linear(x, w, b) for w, b in zip(weights, biases)], dim=-1)

    def to_dense(self, entry: tuple | None) -> nn.Linear:
        k = self.out_features // self.chunks if entry is None else entry[0]
        weights, biases = self._parts(k)
        with torch.device("meta"):
            dense = nn.Linear(self.in_features, self.chunks * k, bias=self.bias is not None)
        dense.weight = cloned_parameter(torch.cat(weights), self.weight.requires_grad)
        if self.bias is not None:
            dense.bias = cloned_parameter(torch.cat(biases), self.bias.requires_grad)
        dense.training = self.training
        return dense

    to_base = WeightSliceLinear.to_base  # the plain nn.Linear holding the same Parameters

    def extra_repr(self) -> str:
        return f"{nn.Linear.extra_repr(self)}, chunks={self.chunks}, out_group={self.out_group}"
