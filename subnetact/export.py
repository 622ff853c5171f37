"""``export``: the statically extracted subnet as a plain, independent module."""

from __future__ import annotations

from torch import nn

from .config import SubnetConfig
from .operator import Operator
from .state import Plan
from .supernet import SupernetMixin


def export(model: nn.Module, config: SubnetConfig | None = None) -> nn.Module:
    """Build the subnet ``config`` (default: the active one) as a plain module with copied, sliced weights.

    The result has the original model's classes (a ``torchvision.models.ResNet`` stays one, with fewer blocks
    and narrower layers), contains no subnetact operator, shares no storage with the supernet, and carries the
    subnet's own norm statistics. In eval mode ``export(model, cfg)(x)`` equals ``model(x, subnet=cfg)``.

    Args:
        model: a model returned by :func:`subnetact.convert`.
        config: the subnet to extract; None for ``model.active``.
    """
    if not isinstance(model, SupernetMixin):
        raise TypeError(f"model of type {type(model).__name__} is not a converted supernet (see subnetact.convert)")
    state = model._subnetact
    plan = state.default if config is None else state.plan_for(config)
    return _rebuild(model, plan, root_class=type(model)._subnetact_base)


def _rebuild(module: nn.Module, plan: Plan, root_class: type | None = None) -> nn.Module:
    if isinstance(module, Operator):
        return module.export_dense(plan.entries[module._op_index], lambda child: _rebuild(child, plan))
    cls = root_class or type(module)
    new = cls.__new__(cls)
    new.__dict__ = module.__dict__.copy()
    new.__dict__.pop("_subnetact", None)
    # Fresh containers (the shallow copy above shares them) and independent tensors.
    new._parameters = {
        name: None if p is None else nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
        for name, p in module._parameters.items()
    }
    new._buffers = {name: None if b is None else b.detach().clone() for name, b in module._buffers.items()}
    new._non_persistent_buffers_set = set(module._non_persistent_buffers_set)
    new._modules = {name: None if m is None else _rebuild(m, plan) for name, m in module._modules.items()}
    return new
