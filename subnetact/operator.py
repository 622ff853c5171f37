"""``Operator``: the interface every SubNetAct operator implements, so the plan compiler, export and unconvert can
treat built-in and user-defined operators alike."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .config import SubnetConfig


def shallow_copy_as(module: nn.Module, cls: type) -> nn.Module:
    """A copy of ``module`` of class ``cls`` holding the same Parameters and children, with its own containers, so
    replacing the copy's children (or a rollback putting the original back) never changes ``module``."""
    new = cls.__new__(cls)
    new.__dict__ = {k: copy.copy(v) if isinstance(v, (dict, set, list)) else v for k, v in module.__dict__.items()}
    return new


def cloned_parameter(p: torch.Tensor | None, requires_grad: bool | None = None) -> nn.Parameter | None:
    """An independent Parameter with ``p``'s values (None stays None): for exports. ``requires_grad`` defaults to
    ``p``'s; a slice taken under ``no_grad`` passes its Parameter's."""
    if p is None:
        return None
    return nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad if requires_grad is None else requires_grad)


class Operator:
    """Mixin of modules whose forward reads the active subnet's plan entry: the one interface the plan compiler
    (:class:`~subnetact.state.ActuationState`), the weight cache, export and unconvert rely on.

    ``convert`` calls :meth:`bind` (the entry's index in every plan and the shared
    :class:`~subnetact.state.ActuationState`). Every operator implements:

    - ``plan_entry(cfg, sizes, stats)``: everything forward needs for ``cfg``, computed once per subnet. ``sizes``
      are the active channel counts of the model's channel groups; ``stats`` is a ``(mean, var)`` pair of the
      subnet's registered statistics for norm operators (None otherwise or when not registered).
    - ``export_dense(entry, rebuild)`` (or just ``to_dense(entry)``): the plain module for that entry; ``rebuild``
      exports child modules.
    - ``to_base()``: the original plain module holding the same Parameters (for :func:`subnetact.unconvert`).

    Optional parts, with the defaults of an operator that has none of them:

    - stage operators (blocks that may be skipped): ``kept_positions(cfg)`` returns the positions that run, and
      ``member_ops[pos]`` the operator indices inside position ``pos`` (set by ``convert``);
    - norms with per-subnet statistics: ``is_subnet_norm`` True and ``active_channels(sizes)``;
    - layers whose planned weight is a strided view: ``cacheable_slice(entry, pointwise)`` and ``weight_copies``,
      the contiguous copies the model's :class:`~subnetact.weight_cache.WeightCache` keeps there.
    """

    _op_index: int
    _subnetact_state: Any
    is_subnet_norm: bool = False
    member_ops: list[list[int]] = []  # noqa: RUF012  (never mutated: stage operators assign their own)
    weight_copies: dict | None = None  # None: this operator holds no copies

    def bind(self, state: Any, index: int) -> None:
        """Attach the operator to a converted model: ``index`` is its entry in every plan of ``state``."""
        self._op_index = index
        self._subnetact_state = state

    @property
    def op_index(self) -> int:
        """This operator's entry index in every plan of its model."""
        return self._op_index

    def plan_entry(self, cfg: SubnetConfig, sizes: list[int], stats: tuple | None) -> Any:
        raise NotImplementedError

    def export_dense(self, entry: Any, rebuild: Callable[[nn.Module], nn.Module]) -> nn.Module:
        return self.to_dense(entry)

    def to_dense(self, entry: Any) -> nn.Module:
        raise NotImplementedError

    def to_base(self) -> nn.Module:
        raise NotImplementedError

    def kept_positions(self, cfg: SubnetConfig) -> list[int] | None:
        """Positions of the blocks that run for ``cfg`` (stage operators); None: this operator holds no blocks."""
        return None

    def active_channels(self, sizes: list[int]) -> int:
        """Channels whose statistics this norm registers per subnet (``is_subnet_norm`` operators)."""
        raise NotImplementedError(f"{type(self).__name__} registers no statistics")

    def cacheable_slice(self, entry: Any, pointwise: bool = True) -> tuple[tuple[int, int], torch.Tensor] | None:
        """``((k_out, k_in), strided view)`` the weight cache may copy for ``entry``; None: nothing to cache."""
        return None

    @property
    def entry(self) -> Any:
        """This operator's entry in the plan running now (in this thread)."""
        return self._subnetact_state.current().entries[self._op_index]
