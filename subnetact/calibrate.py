"""``calibrate``: per-subnet BatchNorm statistics, the exact average over calibration batches."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .config import SubnetConfig
from .errors import ConfigError, InvalidSubnetError, SubnetActError, UncalibratedSubnetWarning
from .supernet import state_of
from .tree import iter_tensors


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
    channels the subnet uses are stored. Re-calibrating a registered subnet replaces its statistics. A SubnetNorm
    that never runs in eval mode (an auxiliary classifier that GoogLeNet and Inception-v3 run only in training) keeps
    the supernet's statistics sliced to the subnet, with an :class:`~subnetact.UncalibratedSubnetWarning` naming it.

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
        InvalidSubnetError: a config is not in the space, or there are no batches. Nothing is registered then.
        ConfigError: a batch fails in ``forward_fn`` (the message names the batch and its shapes; the error is
            chained), ``forward_fn`` runs no SubnetNorm at all, or the batches gave non-finite (NaN or inf)
            statistics; nothing is registered.

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
    skipped: list[str] = []  # norms that never ran in eval mode (a training-only branch)
    try:
        for cfg in configs:
            accumulators: dict[int, list] = {}
            local.plan, local.calibration = state.compile(cfg), accumulators
            try:
                for i, batch in enumerate(batches):
                    _feed(model, batch, i, cfg, forward_fn)
            finally:
                local.plan, local.calibration = None, None
            layout = state.stats_layout(cfg)
            if layout and not any(op_index in accumulators for op_index, _ in layout):
                raise ConfigError(
                    f"forward_fn={forward_fn!r} ran no SubnetNorm of the model while calibrating subnet {cfg.id}; "
                    "does it call the model? Nothing was registered"
                )
            parts = []
            for op_index, k in layout:
                acc = accumulators.get(op_index)
                norm = state.ops[op_index]
                if acc is None:
                    # A branch the model runs only in training (GoogLeNet's and Inception's auxiliary classifiers):
                    # eval never runs it, so its statistics only matter to an export put in training mode; it keeps
                    # the supernet's, sliced to the subnet's channels (what an uncalibrated subnet uses).
                    path = _path(model, norm)
                    if path not in skipped:
                        skipped.append(path)
                    parts += [norm.running_mean[:k].clone(), norm.running_var[:k].clone()]
                    continue
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
    if skipped:
        shown = ", ".join(map(repr, skipped[:3])) + (f" and {len(skipped) - 3} more" if len(skipped) > 3 else "")
        warnings.warn(
            f"calibrate: {len(skipped)} SubnetNorm(s) never ran in eval mode ({shown}): a branch the model runs only "
            "in training, such as an auxiliary classifier. Eval never uses their statistics; they keep the "
            "supernet's, sliced to each subnet's channels.",
            UncalibratedSubnetWarning,
            stacklevel=3,
        )
    return configs


def _feed(model: nn.Module, batch: Any, index: int, cfg: SubnetConfig, forward_fn: Callable) -> None:
    """``forward_fn(model, batch)``; a failure (a batch of the wrong shape or type) becomes a :class:`ConfigError`
    naming the batch and its shapes, with the original error chained."""
    try:
        forward_fn(model, batch)
    except SubnetActError:
        raise
    except Exception as exc:
        shapes = [tuple(t.shape) for t in iter_tensors(batch)]
        raise ConfigError(
            f"calibrating subnet {cfg.id}: batch {index} (a {type(batch).__name__}, tensor shapes {shapes}) failed "
            f"in forward_fn={getattr(forward_fn, '__name__', forward_fn)!r} ({type(exc).__name__}: {exc}); give "
            "batches the model takes (or a forward_fn that feeds them). Nothing was registered"
        ) from exc


def _path(model: nn.Module, target: nn.Module) -> str:
    return next((name for name, m in model.named_modules() if m is target), "?")
