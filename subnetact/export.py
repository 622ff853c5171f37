"""``export``: the statically extracted subnet as a plain, independent module."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence

from torch import nn

from ._registry import ClassRegistry
from .config import SubnetConfig
from .errors import InvalidSubnetError
from .operator import Operator, cloned_parameter
from .state import Plan, state_of


def export(model: nn.Module, config: SubnetConfig | Mapping[str, Sequence[float]] | None = None) -> nn.Module:
    """Build the subnet ``config`` (default: the active one) as a plain module with copied, sliced weights.

    The result has the original model's classes (a ``torchvision.models.ResNet`` stays one, with fewer blocks
    and narrower layers), contains no subnetact operator, shares no storage with the supernet, and carries the
    subnet's own norm statistics. In eval mode ``export(model, cfg)(x)`` equals ``model(x, subnet=cfg)``.

    Args:
        model: a model returned by :func:`subnetact.convert`.
        config: the subnet to extract (a :class:`SubnetConfig` or its ``to_dict()`` form, as for ``actuate``);
            None for ``model.active``.
    """
    state = state_of(model)
    if config is not None and not isinstance(config, SubnetConfig):
        if not isinstance(config, Mapping):
            raise InvalidSubnetError(f"config={config!r} must be a SubnetConfig or a mapping of dimension -> values")
        config = SubnetConfig.from_dict(config)  # the dict form actuate() accepts
    plan = state.default if config is None else state.plan_for(config)
    return export_plan(model, plan)


def export_plan(model: nn.Module, plan: Plan) -> nn.Module:
    """:func:`export` of a compiled plan (``convert``'s check compiles its plans without caching them)."""
    base = type(model)._subnetact_base
    dense = _rebuild(model, plan, root_class=base)
    hook = _EXPORT_HOOKS.lookup(base)
    return dense if hook is None else hook(model, plan, dense)


ExportHook = Callable[[nn.Module, Plan, nn.Module], nn.Module]
_EXPORT_HOOKS: ClassRegistry[ExportHook] = ClassRegistry()


def register_export_hook(model_type: type | str) -> Callable[[ExportHook], ExportHook]:
    """Decorator registering ``(supernet, plan, dense) -> dense`` for a class (or its ``"module.QualName"``, so the
    class's library need not be imported). It runs after the generic rebuild on the rebuilt model and returns the
    final export, e.g. giving a Hugging Face model the smaller config that matches its narrower layers."""
    return _EXPORT_HOOKS.register(model_type)


_HOOK_TABLES = tuple(
    name
    for name in vars(nn.Module()).keys()
    if name.endswith(("_hooks", "_hooks_with_kwargs", "_hooks_always_called")) and not name.startswith("__")
)


def _rebuild(module: nn.Module, plan: Plan, root_class: type | None = None) -> nn.Module:
    if isinstance(module, Operator):
        return module.export_dense(plan.entries[module.op_index], lambda child: _rebuild(child, plan))
    cls = root_class or type(module)
    new = cls.__new__(cls)
    new.__dict__ = module.__dict__.copy()
    new.__dict__.pop("_subnetact", None)  # the root's actuation state (supernet.to_supernet): not exported
    # Own hook tables: shared ones would let a hook registered later on either model fire on both (Hugging Face
    # models register their output-capturing hooks on the first forward).
    for name in _HOOK_TABLES:
        if name in module.__dict__:
            new.__dict__[name] = copy.copy(module.__dict__[name])
    # Fresh containers (the shallow copy above shares them) and independent tensors; written to ``__dict__``
    # directly (nn.Module.__setattr__ is slow and these are plain dicts).
    new.__dict__["_parameters"] = {name: cloned_parameter(p) for name, p in module._parameters.items()}
    new.__dict__["_buffers"] = {name: None if b is None else b.detach().clone() for name, b in module._buffers.items()}
    new.__dict__["_non_persistent_buffers_set"] = set(module._non_persistent_buffers_set)
    new.__dict__["_modules"] = {name: None if m is None else _rebuild(m, plan) for name, m in module._modules.items()}
    return new
