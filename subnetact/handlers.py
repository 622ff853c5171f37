"""The operator-handler registry: how phase 2 of :func:`subnetact.convert` turns a module into an operator.

A :class:`~subnetact.plan.ConversionPlan` names, per module path, an :class:`OperatorEntry`: the *kind* of operator
to insert there, the channel groups it reads, and kind-specific options. Phase 2 looks up the handler registered
for the kind and replaces the module at the path with what the handler returns. Adding an operator kind is one
handler (usually in the operator's own module) and one :func:`register_operator_kind`; ``convert`` does not change.

Built-in kinds (each registered next to its operator): ``"slice"`` (``nn.Conv2d`` / ``nn.Linear`` ->
:class:`~subnetact.weight_slice.WeightSlice`, groups ``(out, in)``), ``"norm"`` (BatchNorm ->
:class:`~subnetact.subnet_norm.SubnetNorm`, LayerNorm / GroupNorm -> ``"slimmable_norm"``), ``"slimmable_norm"``,
``"attention"`` (the heads of ``nn.MultiheadAttention`` or a registered packed attention), ``"layer_select"``
(the stages; options: the keep rule) and ``"custom"`` (options: a factory ``module -> operator``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from torch import nn

from .errors import ConfigError


class OperatorEntry(NamedTuple):
    """One operator a plan inserts.

    Args:
        kind: the registered kind whose handler builds the operator.
        groups: the channel groups it reads, as indices into the plan's ``groups`` (None: that side is not sliced),
            e.g. ``(out_group, in_group)`` for ``"slice"``. :meth:`~subnetact.plan.ConversionPlan.merge` shifts
            them, so a handler must read its groups from here, never from ``options``.
        options: anything else the handler needs (a keep rule, a factory); not interpreted by ``convert``.
    """

    kind: str
    groups: tuple[int | None, ...] = ()
    options: Any = None


#: ``(module at the plan's path, its entry) -> the operator replacing it``. The module must not be changed: a
#: failed conversion puts it back as it was. A handler returns a new module (or a copy holding the same Parameters,
#: see :func:`~subnetact.operator.shallow_copy_as`), whose own children it may replace.
OperatorHandler = Callable[[nn.Module, OperatorEntry], nn.Module]

_HANDLERS: dict[str, OperatorHandler] = {}


def register_operator_kind(kind: str) -> Callable[[OperatorHandler], OperatorHandler]:
    """Decorator registering the handler of operator kind ``kind`` (replacing an earlier one of that name).

    Example::

        >>> @register_operator_kind("gated_mlp")
        ... def gated_mlp(module: nn.Module, entry: OperatorEntry) -> nn.Module:
        ...     return GatedMLP.from_module(module, *entry.groups)

    Raises:
        ConfigError: (a ``ValueError``) ``kind`` is not a non-empty string.
    """
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"kind={kind!r} must be a non-empty string naming the operator kind")

    def decorator(handler: OperatorHandler) -> OperatorHandler:
        if not callable(handler):
            raise ConfigError(f"the handler of kind {kind!r} must be callable, got {handler!r}")
        _HANDLERS[kind] = handler
        return handler

    return decorator


def registered_kinds() -> tuple[str, ...]:
    """The operator kinds a plan may name, sorted."""
    return tuple(sorted(_HANDLERS))


def check_kinds(entries: list[tuple[str, OperatorEntry]]) -> None:
    """Raise before anything changes if a plan entry names a kind no handler is registered for.

    Raises:
        ConfigError: (a ``ValueError``) naming the path, the kind and the registered kinds.
    """
    for path, entry in entries:
        if not isinstance(entry, OperatorEntry):
            raise ConfigError(f"plan entry {path!r}: {entry!r} is not a subnetact.extend.OperatorEntry")
        if entry.kind not in _HANDLERS:
            raise ConfigError(
                f"plan entry {path!r} names operator kind {entry.kind!r}; registered kinds: {list(registered_kinds())}"
            )


def build_operator(path: str, module: nn.Module, entry: OperatorEntry) -> nn.Module:
    """The operator the handler of ``entry.kind`` builds from ``module`` (at ``path``, for errors)."""
    check_kinds([(path, entry)])
    return _HANDLERS[entry.kind](module, entry)


@register_operator_kind("custom")
def _custom(module: nn.Module, entry: OperatorEntry) -> nn.Module:
    """A plan's ``custom`` entry: the factory in ``options`` builds the operator."""
    return entry.options(module)
