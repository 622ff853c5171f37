"""``reorder_channels``: put each elastic channel group's most important channels first (once-for-all's channel sort).

Width slicing keeps a *prefix* of every channel group. A conventionally trained model has its important channels
anywhere, so its small subnets keep arbitrary ones. Reordering permutes each group once, by the L1 norm of the weights
that read each channel (the consumers' input columns; once-for-all's ``re_organize_middle_weights``), and applies the
same permutation to every producer's output rows, every norm's affine parameters and statistics, and every consumer's
input columns, so the full-width model computes exactly the same function (up to float summation order).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .attention import PackedSliceLinear
from .errors import ConfigError
from .slimmable_norm import SubnetGroupNorm, SubnetLayerNorm
from .subnet_norm import SubnetNorm
from .supernet import state_of
from .weight_slice import WeightSlice, WeightSliceConv2d


@torch.no_grad()
def reorder_channels(model: nn.Module) -> list[torch.Tensor]:
    """Permute every elastic channel group of a converted model in place, most important channels first.

    Importance of channel ``c`` of a group: the sum over the group's consumers of ``|W[:, c]|`` (L1 of the input
    column). Groups of a grouped convolution move in whole groups (importance summed per group). Parameters and
    buffers keep their identity (values are permuted in place), so optimisers and checkpoints keep pointing at them.

    Args:
        model: a model returned by :func:`subnetact.convert` with no registered (calibrated) subnets: their
            statistics are stored for the current channel order.

    Returns:
        The permutation applied to each channel group (``perm[i]`` is the old index of new channel ``i``).

    Raises:
        ConfigError: subnets are registered; call this before :func:`subnetact.calibrate`.
    """
    state = state_of(model)
    if state.stats:
        raise ConfigError(
            f"model has {len(state.stats)} registered subnets; reorder_channels permutes the channels their "
            "statistics were computed for, so call it before subnetact.calibrate"
        )
    producers: list[list[WeightSlice]] = [[] for _ in state.groups]
    consumers: list[list[WeightSlice]] = [[] for _ in state.groups]
    norms: list[list[nn.Module]] = [[] for _ in state.groups]
    for m in model.modules():
        if isinstance(m, WeightSlice):
            if m.out_group is not None:
                producers[m.out_group].append(m)
            # A grouped convolution is listed as a producer only: each output row reads its own group's inputs.
            if m.in_group is not None and not (isinstance(m, WeightSliceConv2d) and m.groups > 1):
                consumers[m.in_group].append(m)
        elif isinstance(m, (SubnetNorm, SubnetLayerNorm, SubnetGroupNorm)) and m.group is not None:
            norms[m.group].append(m)
    perms = []
    for g, group in enumerate(state.groups):
        if any(isinstance(m, PackedSliceLinear) for m in producers[g]):
            # Attention heads: channels may only move in whole heads, consistently in q, k and v; not done, so the
            # heads keep their order. (nn.MultiheadAttention's heads have no WeightSlice layers: identity below.)
            perms.append(torch.arange(group.full))
            continue
        unit = 1
        for m in producers[g]:
            if isinstance(m, WeightSliceConv2d) and m.groups > 1:
                unit = math.lcm(unit, m.out_channels // m.groups)
        for m in norms[g]:
            if isinstance(m, SubnetGroupNorm):  # its statistics are per group: move whole groups
                unit = math.lcm(unit, m.num_channels // m.num_groups)
        importance = torch.zeros(group.full, dtype=torch.float64)
        for m in consumers[g]:
            w = m.weight.detach().abs().double().cpu()  # (out, in, ...) or (out, in); the order is built on the CPU
            importance += w.sum(dim=[d for d in range(w.dim()) if d != 1])
        if unit > 1:  # whole groups of a grouped convolution
            order = torch.argsort(importance.view(-1, unit).sum(1), descending=True, stable=True)
            perm = (order[:, None] * unit + torch.arange(unit)).reshape(-1)
        else:
            perm = torch.argsort(importance, descending=True, stable=True)
        for m in producers[g]:
            m.weight.copy_(m.weight[perm.to(m.weight.device)])
            if m.bias is not None:
                m.bias.copy_(m.bias[perm.to(m.bias.device)])
        for m in consumers[g]:
            m.weight.copy_(m.weight[:, perm.to(m.weight.device)])
        for m in norms[g]:
            for t in (m.weight, m.bias, getattr(m, "running_mean", None), getattr(m, "running_var", None)):
                if t is not None:
                    t.copy_(t[perm.to(t.device)])
        perms.append(perm)
    state.invalidate()
    return perms
