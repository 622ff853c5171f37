"""Operators of decoder LLM supernets (issue 24): fused projections, GPT-2's ``Conv1D`` and the attention wrapper
that keeps a subnet's KV cache consistent.

- :class:`PartsSliceLinear`: an ``nn.Linear`` whose output packs several parts (Phi-3's ``qkv_proj``: q, k, v of
  unequal sizes; its ``gate_up_proj``: gate, up); each part keeps its own prefix.
- :class:`Conv1DSlice`: Hugging Face's ``Conv1D`` (GPT-2; weight stored transposed, ``(in, out)``) with its output
  columns (in packed parts, for ``c_attn``) and/or input rows sliced.
- :class:`DecoderAttention`: the layer's attention module, class-swapped in a copy (as
  :class:`~subnetact.head_count.HeadCount` does), whose forward first checks the KV cache it is given against the
  subnet (:func:`check_cache_layout`) and whose head-count attributes (``overrides``) follow the subnet.

At the full width every operator runs the original layer's own kernel on the full Parameters, so the largest subnet
is the original model bit for bit.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..config import SubnetConfig
from ..errors import InvalidSubnetError, UnsupportedModelError
from ..handlers import OperatorEntry, register_operator_kind
from ..operator import Operator, cloned_parameter, shallow_copy_as
from ..weight_slice import WeightSlice, WeightSliceLinear

#: A part of a packed output: (first row of the part, rows of the part, channel group setting its active prefix).
Part = tuple[int, int, int]


def _part_rows(parts: tuple[Part, ...], sizes: list[int]) -> list[tuple[int, int]]:
    return [(start, sizes[group]) for start, _, group in parts]


class PartsSliceLinear(WeightSlice, nn.Linear):
    """``nn.Linear`` whose output is the concatenation of ``parts``; each part keeps its first ``k`` rows.

    Shapes: ``x`` (..., in) -> (..., sum of the parts' active rows); at full width ``nn.Linear``'s own output.
    """

    parts: tuple[Part, ...]

    @classmethod
    def from_module(cls, linear: nn.Linear, parts: tuple[Part, ...]) -> PartsSliceLinear:
        with torch.device("meta"):
            new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None)
        new._takes_over(linear)
        new.parts, new.out_group, new.in_group = tuple(parts), None, None
        return new

    def _views(self, rows: list[tuple[int, int]]) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        weights = [self.weight[s : s + k] for s, k in rows]
        biases = [None if self.bias is None else self.bias[s : s + k] for s, k in rows]
        return weights, biases

    def plan_entry(self, cfg: SubnetConfig, sizes: list[int], stats: object) -> tuple | None:
        rows = _part_rows(self.parts, sizes)
        if all(k == full for (_, k), (_, full, _) in zip(rows, self.parts)):
            return None  # full width: the original layer
        return (rows, *self._views(rows))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        entry = self._subnetact_state.current().entries[self._op_index]
        if entry is None:
            return F.linear(x, self.weight, self.bias)
        rows, weights, biases = entry
        if torch.is_grad_enabled() and self.weight.requires_grad:
            weights, biases = self._views(rows)  # planned views were made under no_grad
        return torch.cat([F.linear(x, w, b) for w, b in zip(weights, biases)], dim=-1)

    def to_dense(self, entry: tuple | None) -> nn.Linear:
        rows = [(s, n) for s, n, _ in self.parts] if entry is None else entry[0]
        weights, biases = self._views(rows)
        with torch.device("meta"):
            dense = nn.Linear(self.in_features, sum(k for _, k in rows), bias=self.bias is not None)
        dense.weight = cloned_parameter(torch.cat(weights))
        if self.bias is not None:
            dense.bias = cloned_parameter(torch.cat(biases))
        dense.training = self.training
        return dense

    to_base = WeightSliceLinear.to_base  # the plain nn.Linear holding the same Parameters

    def extra_repr(self) -> str:
        return f"{nn.Linear.extra_repr(self)}, parts={self.parts}"


class Conv1DSlice(Operator, nn.Module):
    """Hugging Face ``Conv1D`` (``y = x @ W + b``, ``W`` of shape ``(in, out)``) on a slice of the shared weight.

    ``parts``: the output columns, as packed parts each keeping its first ``k`` columns (GPT-2's ``c_attn``: q, k,
    v); None: the output is not sliced. ``in_group``: the channel group of the input rows (None: whole).

    Shapes: ``x`` (..., k_in) -> (..., sum of the parts' active columns).
    """

    def __init__(self, conv: nn.Module, parts: tuple[Part, ...] | None, in_group: int | None) -> None:
        nn.Module.__init__(self)
        self.weight, self.bias = conv.weight, conv.bias  # the same Parameters
        self.nx, self.nf = conv.weight.shape
        self.parts, self.in_group = parts, in_group
        self.training = conv.training
        self._base_class = type(conv)

    def _views(self, in_k: int, cols: list[tuple[int, int]]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return [self.weight[:in_k, s : s + k] for s, k in cols], [self.bias[s : s + k] for s, k in cols]

    def plan_entry(self, cfg: SubnetConfig, sizes: list[int], stats: object) -> tuple | None:
        in_k = self.nx if self.in_group is None else sizes[self.in_group]
        cols = [(0, self.nf)] if self.parts is None else _part_rows(self.parts, sizes)
        if in_k == self.nx and cols == ([(0, self.nf)] if self.parts is None else [(s, n) for s, n, _ in self.parts]):
            return None
        return (in_k, cols, *self._views(in_k, cols))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        entry = self._subnetact_state.current().entries[self._op_index]
        flat = x.reshape(-1, x.shape[-1])
        if entry is None:  # the original Conv1D.forward
            return torch.addmm(self.bias, flat, self.weight).view(*x.shape[:-1], self.nf)
        in_k, cols, weights, biases = entry
        if torch.is_grad_enabled() and self.weight.requires_grad:
            weights, biases = self._views(in_k, cols)
        out = [torch.addmm(b, flat, w) for w, b in zip(weights, biases)]
        y = out[0] if len(out) == 1 else torch.cat(out, dim=-1)
        return y.view(*x.shape[:-1], y.shape[-1])

    def to_dense(self, entry: tuple | None) -> nn.Module:
        if entry is None:
            in_k, cols = self.nx, [(0, self.nf)]
        else:
            in_k, cols = entry[0], entry[1]
        weights, biases = self._views(in_k, cols)
        nf = sum(k for _, k in cols)
        dense = self._base_class(nf, in_k)
        dense.weight = cloned_parameter(torch.cat(weights, dim=1))
        dense.bias = cloned_parameter(torch.cat(biases))
        dense.training = self.training
        return dense

    def to_base(self) -> nn.Module:
        base = self._base_class.__new__(self._base_class)
        nn.Module.__init__(base)
        base.nf, base.nx = self.nf, self.nx
        base.weight, base.bias, base.training = self.weight, self.bias, self.training
        return base

    def extra_repr(self) -> str:
        return f"nx={self.nx}, nf={self.nf}, parts={self.parts}, in_group={self.in_group}"


# -- the attention ------------------------------------------------------------------------------------------------
#: What an overridden attention attribute holds for a subnet keeping ``g`` KV groups of ``n_rep`` query heads of
#: ``d`` features: the query heads, the query features, the KV heads, or (Phi-3, which reads
#: ``self.config.num_attention_heads``) a view of the config with ``num_attention_heads`` = the query heads.
OVERRIDE_KINDS = ("q_heads", "q_features", "kv_heads", "config")


class _ConfigView:
    """The attention's config with ``num_attention_heads`` (and ``num_key_value_heads``) of the subnet; every other
    attribute read from the model's config."""

    def __init__(self, config: Any, q_heads: int, kv_heads: int) -> None:
        self._config = config
        self.num_attention_heads = q_heads
        self.num_key_value_heads = kv_heads

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)


def check_cache_layout(cache: Any, layout: tuple, config: SubnetConfig) -> None:
    """Refuse to extend a KV cache that was filled by a subnet of another layout.

    ``layout`` is ``(depth, KV features per layer)`` of the running subnet. A cache holding tokens remembers the
    layout that wrote them (an attribute on the cache object); only subnets of the same layout, i.e. differing in
    FFN widths alone, may extend it. Called by the first attention to run, before it writes, so a refused call
    leaves the cache unchanged.

    Raises:
        InvalidSubnetError: (a ``ValueError``) the layouts differ.
    """
    stamp = getattr(cache, "_subnetact_kv_layout", None)
    if stamp is layout:
        return
    if stamp is None or cache.get_seq_length() == 0:
        cache._subnetact_kv_layout = layout
        return
    if stamp != layout:
        raise InvalidSubnetError(
            f"subnet={config.id}: its KV-cache layout (depth, KV features per layer) {layout!r} differs from the "
            f"layout {stamp!r} that wrote the {cache.get_seq_length()} cached tokens of past_key_values. Between "
            "decode steps of one sequence only FFN widths may change (they share the KV cache); a change of heads or "
            "depth needs a new cache (re-run the prompt with that subnet)"
        )
    cache._subnetact_kv_layout = layout  # equal layout of another plan: identity check next time


def _find_cache(args: tuple, kwargs: dict) -> Any:
    for key in ("cache", "past_key_values", "past_key_value"):
        value = kwargs.get(key)
        if value is not None:
            return value
    for value in args[1:]:  # GPT-2 style positional cache
        if hasattr(value, "get_seq_length") and hasattr(value, "update"):
            return value
    return None


class DecoderAttention(Operator):
    """Mixin of the swapped decoder attention classes (:func:`decoder_attention_copy`).

    Plan entry: ``(q_heads, kv_heads, {attribute: value}, layout)``; ``layout`` is the subnet's KV-cache layout.
    """

    _sa_kv_group: int
    _sa_head_dim: int
    _sa_n_rep: int
    _sa_overrides: tuple[tuple[str, str], ...]
    _sa_layout_groups: tuple[int, ...]  # the KV group of every layer, for the layout
    _sa_depth_index: int | None  # entry of the depth dimension (None: depth not elastic)
    _base_class: type

    def plan_entry(self, cfg: SubnetConfig, sizes: list[int], stats: object) -> tuple:
        kv_heads = sizes[self._sa_kv_group] // self._sa_head_dim
        q_heads = kv_heads * self._sa_n_rep
        values: dict[str, Any] = {}
        for attr, kind in self._sa_overrides:
            if kind == "q_heads":
                values[attr] = q_heads
            elif kind == "q_features":
                values[attr] = q_heads * self._sa_head_dim
            elif kind == "kv_heads":
                values[attr] = kv_heads
            else:
                values[attr] = _ConfigView(vars(self)[attr], q_heads, kv_heads)
        depth = None if self._sa_depth_index is None else cfg["depth"][self._sa_depth_index]
        layout = (depth, tuple(sizes[g] for g in self._sa_layout_groups))
        return (q_heads, kv_heads, values, layout)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        cache = _find_cache(args, kwargs)
        if cache is not None:
            plan = self._subnetact_state.current()
            check_cache_layout(cache, plan.entries[self._op_index][3], plan.config)
        return super().forward(*args, **kwargs)

    def export_dense(self, entry: tuple, rebuild: Callable[[nn.Module], nn.Module]) -> nn.Module:
        """A plain attention of the original class with the subnet's head counts; children exported by
        ``rebuild``. A ``config`` override is set by the export hook (a config of the exported model)."""
        new = self._plain_copy()
        new._modules = {name: None if m is None else rebuild(m) for name, m in self._modules.items()}
        for attr, kind in self._sa_overrides:
            if kind != "config":
                new.__dict__[attr] = entry[2][attr]
        return new

    def to_base(self) -> nn.Module:
        base = self._plain_copy()
        base._parameters, base._buffers, base._modules = self._parameters, self._buffers, self._modules
        return base

    _OWN = ("_sa_kv_group", "_sa_head_dim", "_sa_n_rep", "_sa_overrides", "_sa_layout_groups", "_sa_depth_index")

    def _plain_copy(self) -> nn.Module:
        cls = self._base_class
        new = cls.__new__(cls)
        new.__dict__ = {k: copy.copy(v) if isinstance(v, (dict, set, list)) else v for k, v in self.__dict__.items()}
        for name in (*self._OWN, "_op_index", "_subnetact_state"):
            new.__dict__.pop(name, None)
        new._parameters = {n: cloned_parameter(p) for n, p in self._parameters.items()}
        new._buffers = {n: None if b is None else b.detach().clone() for n, b in self._buffers.items()}
        return new


_CLASSES: dict[tuple[type, tuple[str, ...]], type] = {}


def decoder_attention_class(base: type, attrs: tuple[str, ...]) -> type:
    """The subclass of ``base`` whose attributes ``attrs`` follow the active subnet (one per base class)."""
    key = (base, attrs)
    if key not in _CLASSES:

        def follow(attr: str) -> property:
            return property(lambda self: self.entry[2][attr])

        namespace = {attr: follow(attr) for attr in attrs}
        namespace.update(_base_class=base, __module__=__name__)
        _CLASSES[key] = type(f"Elastic{base.__name__}", (DecoderAttention, base), namespace)
    return _CLASSES[key]


def decoder_attention_copy(
    attention: nn.Module,
    *,
    kv_group: int,
    head_dim: int,
    n_rep: int,
    overrides: tuple[tuple[str, str], ...],
    layout_groups: tuple[int, ...],
    depth_index: int | None,
) -> nn.Module:
    """A copy of ``attention`` of its :func:`decoder_attention_class` (same Parameters and children, own
    containers, so a rollback putting the original back leaves it untouched)."""
    new = shallow_copy_as(attention, decoder_attention_class(type(attention), tuple(a for a, _ in overrides)))
    new._sa_kv_group, new._sa_head_dim, new._sa_n_rep, new._sa_overrides = kv_group, head_dim, n_rep, overrides
    new._sa_layout_groups, new._sa_depth_index = layout_groups, depth_index
    return new


# -- operator kinds (:func:`subnetact.extend.register_operator_kind`) ---------------------------------------------
@register_operator_kind("packed_projection")
def packed_projection(module: nn.Module, entry: OperatorEntry) -> nn.Module:
    """Handler of kind ``"packed_projection"``: an ``nn.Linear`` or ``Conv1D`` whose output packs parts.

    ``entry.groups`` is ``(input group, *one group per part)``; ``entry.options`` the parts' ``(first row, rows)``
    (empty: the output is whole). An ``nn.Linear`` must have parts and a whole input (Phi-3's ``qkv_proj`` and
    ``gate_up_proj``); a ``Conv1D`` may have either (GPT-2's ``c_attn``, ``c_fc``, ``c_proj``).
    """
    in_group, *part_groups = entry.groups
    spans = tuple(entry.options or ())
    if len(spans) != len(part_groups):
        raise UnsupportedModelError(f"packed_projection: {len(spans)} parts but {len(part_groups)} part groups")
    parts = tuple((start, rows, group) for (start, rows), group in zip(spans, part_groups))
    if type(module).__name__ == "Conv1D":
        return Conv1DSlice(module, parts or None, in_group)
    if type(module) is not nn.Linear or in_group is not None or not parts:
        raise UnsupportedModelError(
            f"packed_projection: {type(module).__qualname__} with input group {in_group!r} and {len(parts)} parts; an "
            "nn.Linear needs parts and a whole input"
        )
    return PartsSliceLinear.from_module(module, parts)


@register_operator_kind("decoder_attention")
def decoder_attention(module: nn.Module, entry: OperatorEntry) -> nn.Module:
    """Handler of kind ``"decoder_attention"``: the attention of a decoder layer (:class:`DecoderAttention`).

    ``entry.groups`` is ``(this layer's KV group, *every layer's KV group)`` (the latter give the KV-cache layout);
    ``entry.options`` is ``(head_dim, n_rep, overrides, depth entry or None)``.
    """
    kv_group, *layout_groups = entry.groups
    head_dim, n_rep, overrides, depth_index = entry.options
    return decoder_attention_copy(
        module,
        kv_group=kv_group,
        head_dim=head_dim,
        n_rep=n_rep,
        overrides=tuple(overrides),
        layout_groups=tuple(layout_groups),
        depth_index=depth_index,
    )
