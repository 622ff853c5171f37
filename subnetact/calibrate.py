"""``calibrate``: per-subnet BatchNorm statistics, the exact average over calibration batches."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .config import SubnetConfig
from .errors import ConfigError, InvalidSubnetError
from .supernet import state_of


def default_forward(model: nn.Module, batch: Any) -> Any:
    """Feed one calibration batch: a tensor, a (input, label, ...) tuple/list (labels ignored), or a dict of
    keyword inputs."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(batch[0])
    return model(batch)


@torch.no_grad()
def calibrate(
    model: nn.Module,
    batches: Iterable[Any],
    subnets: Sequence[SubnetConfig | Mapping[str, Sequence[float]]] | None = None,
    *,
    forward_fn: Callable[[nn.Module, Any], Any] = default_forward,
) -> list[SubnetConfig]:
    """Register ``subnets`` and compute each one's SubnetNorm statistics on ``batches``.

    For every subnet, the batches run through it in eval mode with every SubnetNorm normalising by the batch's own
    statistics, as in training; each norm's per-batch mean and biased variance are averaged over batches weighted by
    batch size. This is the exact average once-for-all's ``set_running_statistics`` computes, not an EMA. Only the
    channels the subnet uses are stored. Re-calibrating a registered subnet replaces its statistics.

    Args:
        model: a converted model.
        batches: re-iterable calibration batches (a list, a DataLoader); a one-shot iterator is materialised.
            Each batch is fed by ``forward_fn``.
        subnets: the configs to register; default: the active one.
        forward_fn: ``(model, batch) -> Any``; default feeds a tensor, the first element of a tuple/list, or a dict
            as keyword arguments.

    Returns:
        The registered configs (snapped to the space's choices), in order.

    Raises:
        InvalidSubnetError: a config is not in the space, or there are no batches. Nothing is registered then, nor
            when a forward raises.
        ConfigError: the batches gave non-finite (NaN or inf) statistics; nothing is registered.

    Example::

        >>> subnetact.calibrate(model, [x[i : i + 64] for i in range(0, 2000, 64)], subnets=served_set)
    """
    state = state_of(model)
    configs = [model.active] if subnets is None else list(subnets)
    configs = [state.space.validate(c if isinstance(c, SubnetConfig) else SubnetConfig.from_dict(c)) for c in configs]
    if iter(batches) is batches:
        batches = list(batches)
    if not any(True for _ in batches):
        raise InvalidSubnetError("batches is empty: calibration needs at least one batch")

    was_training = model.training
    model.eval()
    local = state.local
    new_stats: dict[SubnetConfig, torch.Tensor] = {}
    try:
        for cfg in configs:
            accumulators: dict[int, list] = {}
            local.plan, local.calibration = state.compile(cfg), accumulators
            try:
                for batch in batches:
                    forward_fn(model, batch)
            finally:
                local.plan, local.calibration = None, None
            parts = []
            for op_index, _ in state.stats_layout(cfg):
                acc = accumulators.get(op_index)
                if acc is None:
                    raise RuntimeError(
                        f"SubnetNorm {_path(model, state.ops[op_index])!r} did not run while calibrating {cfg!r}; "
                        "does forward_fn call the model?"
                    )
                norm = state.ops[op_index]
                dtype = norm.running_mean.dtype if norm.running_mean is not None else torch.float32
                mean, var = (acc[0] / acc[2]).to(dtype), (acc[1] / acc[2]).to(dtype)
                if not (torch.isfinite(mean).all() and torch.isfinite(var).all()):
                    # NaN/inf statistics would make every output of this subnet NaN; refuse them before registering.
                    raise ConfigError(
                        f"batches gave non-finite statistics for SubnetNorm "
                        f"{_path(model, state.ops[op_index])!r} of subnet {cfg.id}; do the batches contain NaN or "
                        "inf values? Nothing was registered"
                    )
                parts += [mean, var]
            new_stats[cfg] = torch.cat(parts) if parts else torch.empty(0)
    finally:
        model.train(was_training)
    # Commit only after every subnet succeeded.
    for cfg, buffer in new_stats.items():
        state.stats.pop(cfg, None)
        state.stats[cfg] = buffer
    state.invalidate()
    for cfg in configs:
        state.plan_for(cfg)  # compile and pin now, so the first actuation of a served subnet is already O(1)
    return configs


def _path(model: nn.Module, target: nn.Module) -> str:
    return next((name for name, m in model.named_modules() if m is target), "?")
