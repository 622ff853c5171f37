"""Per-subnet CUDA graphs: record one graph per (subnet, batch size) of the served set and replay it (issue 7).

Actuation is already O(1) (a plan swap); what remains per request on a GPU is the launch overhead of every layer.
:func:`capture` records each served (subnet, batch size) pair once, all graphs sharing one memory pool, and the
returned :class:`CapturedSupernet` replays the graph of the active subnet when the batch size matches; any other
call runs the model eagerly.

    >>> served = [model.space.max(), model.space.min()]
    >>> graphed = capture(model, served, batch_sizes=[1, 8, 32], sample=torch.randn(1, 3, 224, 224, device="cuda"))
    >>> model.actuate(served[1])
    >>> y = graphed(x)              # replays the (served[1], len(x)) graph when one exists

Constraints (plain ``torch.cuda.graph`` semantics): the model must be in eval mode; graphs bake in the plan's
tensors, so after ``load_state_dict``, ``.to()`` or ``calibrate`` capture again; replays are not thread-safe
(serialise them, e.g. one worker per GPU stream). Only a single positional input tensor is supported.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from .checks import is_int
from .config import SubnetConfig
from .errors import SubnetActError
from .state import converted_state, state_of

__all__ = ["CapturedSupernet", "capture"]


class GraphCaptureError(SubnetActError, ValueError):
    """``capture`` was given a model, subnet or batch size it cannot record."""


@dataclass
class _Graph:
    graph: Any  # torch.cuda.CUDAGraph
    static_input: torch.Tensor
    static_output: Any


class CapturedSupernet:
    """A converted model plus CUDA graphs keyed by (subnet config, batch size). Built by :func:`capture`.

    Args:
        model: the converted model (``subnetact.convert``); still usable and actuatable directly.
        graphs: ``{(config, batch_size): _Graph}``; empty means every call runs eagerly.
        clone_outputs: return a copy of the graph's static output (default). With False, the returned tensors
            are overwritten by the next replay of the same graph.
    """

    def __init__(
        self, model: nn.Module, graphs: Mapping[tuple[SubnetConfig, int], _Graph], *, clone_outputs: bool = True
    ) -> None:
        _check_converted(model)
        self.model = model
        self.graphs = dict(graphs)
        self.clone_outputs = clone_outputs
        self._lock = threading.Lock()

    def __call__(self, x: torch.Tensor, *, subnet: SubnetConfig | Mapping | None = None) -> Any:
        """Run the active subnet (or ``subnet``) on ``x`` (B, ...): replay its graph if one exists for B.

        Returns:
            The model's output (a copy of the graph's static output unless ``clone_outputs=False``).
        """
        state = state_of(self.model)
        if subnet is None:
            config = state.current().config
        else:
            config = state.plan_for(subnet if isinstance(subnet, SubnetConfig) else SubnetConfig.from_dict(subnet))
            config = config.config
        entry = self.graphs.get((config, x.shape[0])) if torch.is_tensor(x) else None
        if (
            entry is None
            or x.shape != entry.static_input.shape
            or x.dtype != entry.static_input.dtype
            or (x.device != entry.static_input.device)
        ):
            return self.model(x, subnet=subnet)
        with self._lock:
            entry.static_input.copy_(x)
            entry.graph.replay()
            if not self.clone_outputs:
                return entry.static_output
            return tree_map(lambda t: t.clone() if torch.is_tensor(t) else t, entry.static_output)

    def has_graph(self, subnet: SubnetConfig, batch_size: int) -> bool:
        """Whether a graph was captured for (``subnet``, ``batch_size``)."""
        return (state_of(self.model).plan_for(subnet).config, batch_size) in self.graphs


def capture(
    model: nn.Module,
    subnets: Iterable[SubnetConfig | Mapping],
    batch_sizes: Iterable[int],
    *,
    sample: torch.Tensor,
    warmup: int = 2,
    clone_outputs: bool = True,
) -> CapturedSupernet:
    """Record a CUDA graph of ``model`` for every (subnet, batch size) pair, sharing one memory pool.

    Everything is validated before anything is recorded.

    Args:
        model: a converted model (``subnetact.convert``) in eval mode on a CUDA device.
        subnets: the served subnets (configs or their ``to_dict()`` form).
        batch_sizes: batch sizes to record for each subnet, each >= 1.
        sample: (B0, ...) example input on the model's device; graph ``b`` records an input of shape
            (b, *sample.shape[1:]) in ``sample``'s dtype and memory format, filled with ``sample[0]``.
        warmup: eager runs per pair before recording, on a side stream (cuBLAS/cuDNN handles, the lazy extension
            load and autotuning must happen outside the capture).
        clone_outputs: see :class:`CapturedSupernet`.

    Returns:
        A :class:`CapturedSupernet` wrapping ``model``.

    Raises:
        GraphCaptureError: (a ``ValueError``) for an unconverted model, training mode, a model or sample not on a
            CUDA device, no subnets or no batch sizes, or a batch size < 1.
        InvalidSubnetError: for a subnet outside the model's space.
    """
    _check_converted(model)
    state = state_of(model)
    configs = [state.plan_for(s if isinstance(s, SubnetConfig) else SubnetConfig.from_dict(s)).config for s in subnets]
    sizes = list(batch_sizes)
    if not configs:
        raise GraphCaptureError("capture: subnets is empty; pass the served subnets, e.g. model.registered_subnets")
    if not sizes or any(not is_int(b) or b < 1 for b in sizes):
        raise GraphCaptureError(f"capture: batch_sizes={sizes!r} must be a non-empty list of ints >= 1")
    if model.training:
        raise GraphCaptureError(
            "capture: the model is in training mode; call model.eval() first (graphs would "
            "record the statistics updates)"
        )
    param = next(iter(model.parameters()), None)
    device = param.device if param is not None else sample.device
    if device.type != "cuda":
        raise GraphCaptureError(
            f"capture: the model is on {device}; CUDA graphs need it on a CUDA device (model.cuda())"
        )
    if not torch.is_tensor(sample) or sample.device != device or sample.dim() < 1 or sample.shape[0] < 1:
        raise GraphCaptureError(
            f"capture: sample must be a tensor with a batch dimension on {device}, got "
            f"{tuple(sample.shape) if torch.is_tensor(sample) else type(sample).__name__} on "
            f"{getattr(sample, 'device', None)}"
        )
    if warmup < 1:
        raise GraphCaptureError(f"capture: warmup={warmup!r} must be >= 1")

    fmt = (
        torch.channels_last
        if sample.dim() == 4 and not sample.is_contiguous() and sample.is_contiguous(memory_format=torch.channels_last)
        else torch.contiguous_format
    )
    inputs = {}
    for b in dict.fromkeys(sizes):
        static = torch.empty((b, *sample.shape[1:]), dtype=sample.dtype, device=device, memory_format=fmt)
        inputs[b] = static.copy_(sample[:1].expand_as(static))

    pairs = [(cfg, b) for cfg in dict.fromkeys(configs) for b in inputs]
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.no_grad(), torch.cuda.stream(side):
        for cfg, b in pairs:
            for _ in range(warmup):
                model(inputs[b], subnet=cfg)
    torch.cuda.current_stream(device).wait_stream(side)

    pool = torch.cuda.graph_pool_handle()
    graphs = {}
    with torch.no_grad():
        for cfg, b in pairs:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = model(inputs[b], subnet=cfg)
            graphs[(cfg, b)] = _Graph(graph, inputs[b], out)
    torch.cuda.synchronize(device)
    return CapturedSupernet(model, graphs, clone_outputs=clone_outputs)


def _check_converted(model: nn.Module) -> None:
    if converted_state(model) is None:
        raise GraphCaptureError(
            f"capture: {type(model).__name__} is not a converted model; call subnetact.convert(model) first"
        )
