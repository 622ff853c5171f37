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


def cloned_parameter(p: torch.Tensor | None) -> nn.Parameter | None:
    """An independent Parameter with ``p``'s values and ``requires_grad`` (None stays None): for exports."""
    return None if p is None else nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)


class Operator:
    """Mixin of modules whose forward reads the active subnet's plan entry.

    ``convert`` sets ``_op_index`` (the entry's index in every plan) and ``_subnetact_state`` (the shared
    :class:`~subnetact.state.ActuationState`). Subclasses implement:

    - ``plan_entry(cfg, sizes, stats)``: everything forward needs for ``cfg``, computed once per subnet. ``sizes``
      are the active channel counts of the model's channel groups; ``stats`` is a ``(mean, var)`` pair of the
      subnet's registered statistics for norm operators (None otherwise or when not registered).
    - ``export_dense(entry, rebuild)``: the plain module for that entry; ``rebuild`` exports child modules.
    - ``to_base()``: the original plain module holding the same Parameters (for :func:`subnetact.unconvert`).
    """

    _op_index: int
    is_subnet_norm = False

    def plan_entry(self, cfg: SubnetConfig, sizes: list[int], stats: tuple | None) -> Any:
        raise NotImplementedError

    def export_dense(self, entry: Any, rebuild: Callable[[nn.Module], nn.Module]) -> nn.Module:
        return self.to_dense(entry)

    def to_dense(self, entry: Any) -> nn.Module:
        raise NotImplementedError

    def to_base(self) -> nn.Module:
        raise NotImplementedError

    @property
    def entry(self) -> Any:
        """This operator's entry in the plan running now (in this thread)."""
        return self._subnetact_state.current().entries[self._op_index]
