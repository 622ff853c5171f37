"""Elastic heads of ``nn.MultiheadAttention``: :class:`SubnetMultiheadAttention`, its narrow export
:class:`NarrowMultiheadAttention`, and :func:`narrow_attention`, the forward both run with fewer heads.

A subnet keeps the first ``h`` of the module's ``H`` heads: the q, k and v rows of those heads (the first
``h * head_dim`` rows of each of the three parts of ``in_proj_weight``) and the matching input columns of
``out_proj``. At the full head count :class:`SubnetMultiheadAttention` runs ``nn.MultiheadAttention.forward`` itself
(fast path included), so the largest subnet is the original bit for bit. Its export with fewer heads is a
:class:`NarrowMultiheadAttention`: ``nn.MultiheadAttention`` cannot express it, because its heads always span
``embed_dim`` channels, which is also its input and output width (the residual stream), so no choice of
``embed_dim`` / ``num_heads`` / ``kdim`` / ``vdim`` gives ``h * head_dim < embed_dim``. The narrow class is a subclass
of ``nn.MultiheadAttention`` with the same parameter names, smaller ``in_proj_weight`` and ``out_proj``.

Attentions with one fused ``qkv`` projection (timm) are in :mod:`subnetact.attention`, which also holds the
``"attention"`` operator kind building both.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .config import SubnetConfig
from .errors import ConfigError
from .operator import Operator, cloned_parameter, shallow_copy_as


def _float_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean mask (True: do not attend) as an additive float mask, as ``nn.MultiheadAttention`` reads it."""
    if mask is None or mask.is_floating_point():
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, float("-inf"))


def narrow_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    weights: tuple[torch.Tensor, ...],
    biases: tuple[torch.Tensor | None, ...],
    out_weight: torch.Tensor,
    out_bias: torch.Tensor | None,
    heads: int,
    head_dim: int,
    *,
    batch_first: bool,
    key_padding_mask: torch.Tensor | None = None,
    need_weights: bool = True,
    attn_mask: torch.Tensor | None = None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``nn.MultiheadAttention``'s computation with ``heads`` heads of ``head_dim`` channels, whatever the width of
    the input and output: the semantics of ``F.multi_head_attention_forward`` (masks, ``is_causal`` hint, returned
    weights), on projections ``weights`` = (q, k, v) of shape ``(heads * head_dim, E_q / E_k / E_v)``.

    Shapes: ``query`` (B, L, E) if ``batch_first`` else (L, B, E), or (L, E) unbatched; ``key`` / ``value`` likewise
    with S positions. Returns the output (same layout, ``out_weight.shape[0]`` channels) and the attention weights
    (B, L, S) averaged over heads, or (B, heads, L, S), or None if not ``need_weights``.
    """
    batched = query.dim() == 3
    if not batched:
        query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    elif not batch_first:
        query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
    b, n_q, n_k = query.shape[0], query.shape[1], key.shape[1]
    if attn_mask is not None and attn_mask.dim() != 2:
        raise ConfigError(
            f"attn_mask of shape {tuple(attn_mask.shape)}: an attention running {heads} heads of a supernet takes a "
            "2-D (L, S) mask only (a per-head mask is laid out for the supernet's head count)"
        )
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint.")
    dtype = query.dtype
    kpm = _float_mask(key_padding_mask, dtype)
    if is_causal and kpm is None and not need_weights:
        mask = None  # the hint goes to scaled_dot_product_attention as is_causal, as nn.MultiheadAttention does
    else:
        mask = _float_mask(attn_mask, dtype)
        if kpm is not None:
            is_causal = False
            kpm = kpm.view(b, 1, 1, n_k)
            mask = kpm if mask is None else mask + kpm
    q = F.linear(query, weights[0], biases[0]).view(b, n_q, heads, head_dim).transpose(1, 2)  # (B, h, L, d)
    k = F.linear(key, weights[1], biases[1]).view(b, n_k, heads, head_dim).transpose(1, 2)  # (B, h, S, d)
    v = F.linear(value, weights[2], biases[2]).view(b, n_k, heads, head_dim).transpose(1, 2)  # (B, h, S, d)
    attention = None
    if need_weights:
        scores = (q * math.sqrt(1.0 / head_dim)) @ k.transpose(-2, -1)  # (B, h, L, S)
        if mask is not None:
            scores = scores + mask
        attention = scores.softmax(dim=-1)
        if dropout_p > 0.0:
            attention = F.dropout(attention, p=dropout_p)
        out = attention @ v  # (B, h, L, d)
        if average_attn_weights:
            attention = attention.mean(dim=1)
    else:
        out = F.scaled_dot_product_attention(q, k, v, mask, dropout_p, is_causal)
    out = F.linear(out.transpose(1, 2).reshape(b, n_q, heads * head_dim), out_weight, out_bias)  # (B, L, E)
    if not batched:
        return out.squeeze(0), None if attention is None else attention.squeeze(0)
    return (out if batch_first else out.transpose(0, 1)), attention


def _mha_parts(mha: nn.MultiheadAttention, k: int) -> tuple[tuple, tuple]:
    """The (q, k, v) weight rows and biases of the first ``k`` head channels (views of the parameters)."""
    e = mha.embed_dim
    if mha._qkv_same_embed_dim:
        w = mha.in_proj_weight
        weights = (w[:k], w[e : e + k], w[2 * e : 2 * e + k])
    else:
        weights = (mha.q_proj_weight[:k], mha.k_proj_weight[:k], mha.v_proj_weight[:k])
    b = mha.in_proj_bias
    biases = (None, None, None) if b is None else (b[:k], b[e : e + k], b[2 * e : 2 * e + k])
    return weights, biases


class NarrowMultiheadAttention(nn.MultiheadAttention):
    """``nn.MultiheadAttention`` whose ``num_heads * head_dim`` channels are fewer than its ``embed_dim`` (the export
    of a :class:`SubnetMultiheadAttention` running fewer heads; see the module docstring for why the base class
    cannot express it).

    Same attributes and parameter names as the base class; ``in_proj_weight`` is ``(3 * num_heads * head_dim,
    embed_dim)`` (or ``q/k/v_proj_weight`` of ``num_heads * head_dim`` rows each), ``out_proj`` reads
    ``num_heads * head_dim`` channels. Same forward signature and outputs; ``attn_mask`` must be 2-D.

    Shapes: as ``nn.MultiheadAttention``.
    """

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        width = self.num_heads * self.head_dim
        if self._qkv_same_embed_dim:
            weights = tuple(self.in_proj_weight.split(width))
        else:
            weights = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        b = self.in_proj_bias
        biases = (None, None, None) if b is None else tuple(b.split(width))
        return narrow_attention(
            query,
            key,
            value,
            weights,
            biases,
            self.out_proj.weight,
            self.out_proj.bias,
            self.num_heads,
            self.head_dim,
            batch_first=self.batch_first,
            key_padding_mask=key_padding_mask,
            need_weights=need_weights,
            attn_mask=attn_mask,
            average_attn_weights=average_attn_weights,
            is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0,
        )


class SubnetMultiheadAttention(Operator, nn.MultiheadAttention):
    """``nn.MultiheadAttention`` running the first ``h`` of its heads (see the module docstring).

    ``group``: the heads channel group (``embed_dim`` channels in whole heads of ``head_dim``). Entry: None at the
    full head count (the base class's forward runs), else ``(h, (q, k, v) weight views, biases, out_proj weight
    view)``.

    Shapes: as ``nn.MultiheadAttention``.
    """

    group: int

    @classmethod
    def from_module(cls, mha: nn.MultiheadAttention, group: int) -> SubnetMultiheadAttention:
        """A copy of ``mha`` holding the same Parameters and ``out_proj`` (``mha`` itself is not changed)."""
        new = shallow_copy_as(mha, cls)
        new.group = group
        return new

    def plan_entry(self, cfg: SubnetConfig, sizes: list[int], stats: object) -> tuple | None:
        k = sizes[self.group]
        if k == self.embed_dim:
            return None
        return (k // self.head_dim, *_mha_parts(self, k), self.out_proj.weight[:, :k])

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        entry = self._subnetact_state.current().entries[self._op_index]
        if entry is None:
            return nn.MultiheadAttention.forward(
                self, query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights, is_causal
            )
        heads, weights, biases, out_weight = entry
        if torch.is_grad_enabled() and self.out_proj.weight.requires_grad:
            k = heads * self.head_dim  # planned views were made under no_grad
            (weights, biases), out_weight = _mha_parts(self, k), self.out_proj.weight[:, :k]
        return narrow_attention(
            query,
            key,
            value,
            weights,
            biases,
            out_weight,
            self.out_proj.bias,
            heads,
            self.head_dim,
            batch_first=self.batch_first,
            key_padding_mask=key_padding_mask,
            need_weights=need_weights,
            attn_mask=attn_mask,
            average_attn_weights=average_attn_weights,
            is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0,
        )

    def export_dense(self, entry: tuple | None, rebuild: Callable[[nn.Module], nn.Module]) -> nn.Module:
        """An independent ``nn.MultiheadAttention`` (all heads) or :class:`NarrowMultiheadAttention` (fewer)."""
        k = self.embed_dim if entry is None else entry[0] * self.head_dim
        dense = shallow_copy_as(self, nn.MultiheadAttention if entry is None else NarrowMultiheadAttention)
        for name in ("group", "_op_index", "_subnetact_state"):
            dense.__dict__.pop(name, None)
        (wq, wk, wv), (bq, bk, bv) = _mha_parts(self, k)
        params = dict.fromkeys(self._parameters)
        if self._qkv_same_embed_dim:
            params["in_proj_weight"] = cloned_parameter(torch.cat([wq, wk, wv]))
        else:
            for name, w in zip(("q_proj_weight", "k_proj_weight", "v_proj_weight"), (wq, wk, wv)):
                params[name] = cloned_parameter(w)
        if self.in_proj_bias is not None:
            params["in_proj_bias"] = cloned_parameter(torch.cat([bq, bk, bv]))
        for name in params:
            if params[name] is None and self._parameters[name] is not None:
                # bias_k / bias_v (not sliced: refused by convert)
                params[name] = cloned_parameter(self._parameters[name])
        dense._parameters = params
        dense._buffers = {n: None if b is None else b.detach().clone() for n, b in self._buffers.items()}
        out = self.out_proj
        with torch.device("meta"):
            proj = type(out)(k, out.out_features, bias=out.bias is not None)
        proj.weight = cloned_parameter(out.weight[:, :k])
        proj.bias = cloned_parameter(out.bias)
        proj.training = out.training
        dense._modules = {**{n: rebuild(m) for n, m in self._modules.items() if m is not None}, "out_proj": proj}
        if entry is not None:
            dense.num_heads = entry[0]
        return dense

    def to_base(self) -> nn.MultiheadAttention:
        base = shallow_copy_as(self, nn.MultiheadAttention)
        for name in ("group", "_op_index", "_subnetact_state"):
            base.__dict__.pop(name, None)
        return base

    def extra_repr(self) -> str:
        return f"group={self.group}"
