"""Cost of a subnet: multiply-accumulates counted from the layer shapes (:class:`FlopsModel`), or measured latency."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..attention import PackedSliceLinear
from ..config import SubnetConfig
from ..layer_select import LayerSelect, LayerSelectList
from ..supernet import state_of
from ..weight_slice import WeightSlice

CostFn = Callable[[SubnetConfig], float]


@dataclass(frozen=True)
class _Term:
    macs_per_unit: float  # positions x kernel area (x input channels per group for grouped convolutions)
    out_group: int | None
    out_full: int
    in_group: int | None
    in_full: int
    stages: tuple[tuple[int, int], ...]  # (LayerSelect index, block position): active iff every block is kept


class FlopsModel:
    """FLOPs of any subnet of a converted model, computed from the layer shapes without running it.

    FLOPs here are multiply-accumulates of the convolution and linear layers per sample, the convention of
    once-for-all and the SuperServe paper ("MFLOPs"); attention's matrix products, norms and activations are not
    counted. One forward of the largest subnet on ``example_input`` records each layer's number of output positions;
    afterwards a config's FLOPs are a sum over layers of ``positions x kernel area x k_out x k_in`` with the channel
    counts the config gives each layer, skipping layers in blocks its depth drops (about 10-100 µs a config).

    Args:
        model: a converted model.
        example_input: one input as the model takes it (a tensor with a batch dimension of 1, a tuple of
            positional arguments, or a dict of keyword arguments). Results are per sample of this input's batch.

    Example::

        >>> flops = FlopsModel(model, torch.randn(1, 3, 224, 224))
        >>> flops(model.space.min()) / 1e6, flops(model.space.max()) / 1e6   # MFLOPs
    """

    def __init__(self, model: nn.Module, example_input: Any) -> None:
        state = state_of(model)
        self._state = state
        selects = [(path, m) for path, m in model.named_modules() if isinstance(m, (LayerSelect, LayerSelectList))]
        self._selects = [m for _, m in selects]
        layers = [(p, m) for p, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
        positions: dict[int, float] = {}
        batch: list[int] = []

        def hook(module: nn.Module, args: Any, out: torch.Tensor) -> None:
            per_channel = out.numel() / out.shape[1 if isinstance(module, nn.Conv2d) else -1]
            positions[id(module)] = per_channel

        handles = [m.register_forward_hook(hook) for _, m in layers]
        was_training = model.training
        model.eval()
        try:
            args, kwargs = _as_call(example_input)
            batch.append(_batch_of(args, kwargs))
            with torch.inference_mode():
                model(*args, subnet=state.space.max(), **kwargs)
        finally:
            for h in handles:
                h.remove()
            model.train(was_training)
        n = batch[0]
        terms = []
        for path, m in layers:
            if id(m) not in positions:
                continue  # never runs, not even in the largest subnet
            pos = positions[id(m)] / n
            stages = []
            for s, (sel_path, sel) in enumerate(selects):
                prefix = sel_path + "." if sel_path else ""
                if path.startswith(prefix):
                    child = path[len(prefix) :].split(".", 1)[0]
                    names = list(sel._modules)
                    if child in names:
                        stages.append((s, names.index(child)))
            if isinstance(m, nn.Conv2d):
                area = pos * m.kernel_size[0] * m.kernel_size[1]
                out_full, in_full = m.out_channels, m.in_channels
                if m.groups > 1:  # whole groups are kept: each output channel reads in_channels / groups inputs
                    area *= m.in_channels // m.groups
                    in_full = 1
                    in_group = None
                else:
                    in_group = getattr(m, "in_group", None) if isinstance(m, WeightSlice) else None
            else:
                area, out_full, in_full = pos, m.out_features, m.in_features
                if isinstance(m, PackedSliceLinear):  # q, k and v: each of its parts runs the group's channels
                    area, out_full = area * m.chunks, out_full // m.chunks
                in_group = getattr(m, "in_group", None) if isinstance(m, WeightSlice) else None
            out_group = getattr(m, "out_group", None) if isinstance(m, WeightSlice) else None
            terms.append(_Term(area, out_group, out_full, in_group, in_full, tuple(stages)))
        self._terms = terms
        # Channel group -> (dims, indices, choice -> size) as dicts: ActuationState.group_sizes does linear scans,
        # which dominate when the search calls this half a million times.
        self._groups = [(g.dim, g.index, dict(g.sizes)) for g in state.groups]
        self._cache: dict[SubnetConfig, float] = {}

    def _group_sizes(self, cfg: SubnetConfig) -> list[int]:
        values = dict(cfg.items())
        sizes = []
        for dim, index, table in self._groups:
            if isinstance(dim, tuple):
                sizes.append(table[tuple(values[d][i] for d, i in zip(dim, index))])
            else:
                sizes.append(table[values[dim][index]])
        return sizes

    def __call__(self, cfg: SubnetConfig) -> float:
        """Multiply-accumulates per sample of ``cfg`` (a config of the model's space)."""
        cached = self._cache.get(cfg)
        if cached is not None:
            return cached
        sizes = self._group_sizes(cfg)
        depth = cfg.get("depth", ())
        kept = [set(m.kept_positions(cfg)) if depth and m.segments else None for m in self._selects]
        total = 0.0
        for t in self._terms:
            if any(kept[s] is not None and p not in kept[s] for s, p in t.stages):
                continue
            k_out = t.out_full if t.out_group is None else sizes[t.out_group]
            k_in = t.in_full if t.in_group is None else sizes[t.in_group]
            total += t.macs_per_unit * k_out * k_in
        if len(self._cache) < 1_000_000:
            self._cache[cfg] = total
        return total


def measured_latency(
    model: nn.Module, example_input: torch.Tensor, *, batch_size: int = 1, warmup: int = 2, repeats: int = 10
) -> CostFn:
    """A cost function measuring each config's median forward latency (seconds) on the model's device, cached.

    Slow (``warmup + repeats`` forwards per new config): use it with small populations or to re-rank a FLOPs
    search's result. ``example_input`` has a batch dimension; it is repeated to ``batch_size``.
    """
    from ..profiler import profile

    cache: dict[SubnetConfig, float] = {}

    def cost(cfg: SubnetConfig) -> float:
        if cfg not in cache:
            prof = profile(
                model, [cfg], [batch_size], example_input=example_input, warmup=warmup, repeats=repeats, progress=False
            )
            cache[cfg] = prof.latency(0, batch_size)
        return cache[cfg]

    return cost


def _as_call(example_input: Any) -> tuple[tuple, dict]:
    if isinstance(example_input, dict):
        return (), dict(example_input)
    if isinstance(example_input, tuple):
        return example_input, {}
    return (example_input,), {}


def _batch_of(args: tuple, kwargs: dict) -> int:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return 1
