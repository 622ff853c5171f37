"""Actuation state shared by the operators of one converted model: compiled plans and the active subnet.

Why plans: actuating a subnet must be O(1) in model size. The first time a config is seen, :meth:`compile` walks the
operators once and records, per operator, everything its forward needs (how many blocks to run, sliced weight
views, the subnet's norm statistics). Actuation then swaps one reference; each operator's forward does a tuple
index into the current plan.

Concurrency: ``actuate`` sets the model-wide default plan. A forward pins the plan it starts with in a
thread-local slot for its whole duration, so a concurrent ``actuate`` never changes a forward half-way, and
``model(x, subnet=cfg)`` runs ``cfg`` in the calling thread only, leaving other threads and the default alone.

One lock discipline: every change to the plan caches and to the default plan happens under ``ActuationState._lock``
(``activate``, ``invalidate``, a cache miss or an LRU reorder in ``plan_for``). The active config is read from the
default plan itself (``default_config`` is ``default.config``), so the two can never disagree, and a plan compiled
before an ``invalidate`` can never become the default after it. Lock-free reads are only dictionary lookups of
pinned (registered) plans.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from .config import SubnetConfig
from .errors import InvalidSubnetError, NotConvertedError, UncalibratedSubnetWarning
from .space import Space
from .weight_cache import WeightCache, default_budget_bytes

# Plans for configs that are not registered are cached in an LRU of this size (registered ones are pinned).
PLAN_CACHE_SIZE = 1024


def active_size(width: float, full: int, unit: int = 1) -> int:
    """Channels a group of ``full`` channels in whole units of ``unit`` runs at ``width``: ``unit * ceil(width *
    full / unit)``, at least one unit. The one definition of the width rounding (the trace, block rules, the Hugging
    Face adapter and its verification all use it, so an export and the supernet never disagree by a channel)."""
    units = full // unit
    # The 1e-9 keeps e.g. ceil(0.3 * 10) at 3 despite 0.3 * 10 == 3.0000000000000004.
    return unit * max(1, math.ceil(width * units - 1e-9))


def width_sizes(full: int, choices: Iterable[float], unit: int = 1) -> tuple[tuple[float, int], ...]:
    """``ChannelGroup.sizes`` of a group of ``full`` channels: ``(w, active_size(w, full, unit))`` per choice."""
    return tuple((w, active_size(w, full, unit)) for w in choices)


@dataclass(frozen=True)
class ChannelGroup:
    """An elastic channel dimension: the entry ``index`` of space dimension ``dim`` sets its active size.

    A group may also depend on several entries: ``dim`` and ``index`` are then equal-length tuples and ``sizes`` is
    keyed by tuples of choices, one per entry. once-for-all's ResNet needs this: a block's middle width is
    ``make_divisible(round(stage_width * expand_ratio), 8)``, a function of two entries (issue 4).

    Args:
        dim: space dimension name, e.g. ``"width"`` (or a tuple of names).
        index: entry index in that dimension (or a tuple of indices, one per name).
        full: channel count of the supernet.
        sizes: choice (or tuple of choices) -> active channel count.
    """

    dim: str | tuple[str, ...]
    index: int | tuple[int, ...]
    full: int
    sizes: tuple[tuple[Any, int], ...]

    def value_in(self, cfg: SubnetConfig) -> Any:
        """The choice (or tuple of choices) of ``cfg`` this group's size depends on."""
        if isinstance(self.dim, tuple):
            return tuple(cfg[d][i] for d, i in zip(self.dim, self.index))
        return cfg[self.dim][self.index]

    def size_for(self, value: Any) -> int:
        for choice, k in self.sizes:
            if choice == value:
                return k
        raise InvalidSubnetError(f"{self.dim}[{self.index}]={value!r} has no channel count in {self.sizes}")


@dataclass(frozen=True)
class Plan:
    """Everything the operators need to run one subnet. ``entries[i]`` belongs to operator ``i``."""

    config: SubnetConfig
    entries: tuple[Any, ...]
    calibrated: bool


class ActuationState:
    """Per-model state: space, operators, channel groups, registered statistics, plan caches and the default plan."""

    def __init__(self, space: Space, ops: list, groups: list[ChannelGroup], convert_config: Any) -> None:
        self.space = space
        self.ops = ops  # every operator, indexed by its ``op_index``
        self.groups = groups
        self.convert_config = convert_config
        # The example_inputs convert was given, as a call ``(args, kwargs)`` of detached CPU copies (None: convert
        # built its own); ``save`` records it so that ``load`` can convert a fresh model the same way.
        self.example_call: tuple[tuple, dict] | None = None
        # subnet -> flat statistics buffer (see ``stats_layout``); only the channels the subnet uses
        self.stats: dict[SubnetConfig, torch.Tensor] = {}
        self._pinned: dict[SubnetConfig, Plan] = {}
        self._lru: OrderedDict[SubnetConfig, Plan] = OrderedDict()
        # Uncalibrated configs already warned about; bounded like the plan LRU (one may be warned about again).
        self._warned: OrderedDict[SubnetConfig, None] = OrderedDict()
        # (active config, actuate keywords) -> validated config; filled by ``SupernetMixin.actuate``
        self.keyword_configs: dict[tuple, SubnetConfig] = {}
        self._lock = threading.Lock()
        self.local = threading.local()
        self.max_config = space.max()
        self._initial_config = self.max_config  # the default until ``invalidate`` compiles the first plan
        self.default: Plan = None  # type: ignore[assignment]  # compiled by ``invalidate`` once operators are wired
        # Contiguous copies of registered subnets' strided weight slices (issue 16); ``model.set_weight_cache(mb)``
        self.weight_cache = WeightCache(ops, default_budget_bytes(ops), default_budget=True)

    @property
    def default_config(self) -> SubnetConfig:
        """The config ``model(x)`` runs: always the default plan's own config."""
        plan = self.default
        return self._initial_config if plan is None else plan.config

    # -- the hot path --------------------------------------------------------------------------------------------
    def current(self) -> Plan:
        """The plan of the forward running in this thread, else the model-wide default."""
        plan = getattr(self.local, "plan", None)
        return self.default if plan is None else plan

    def plan_for(self, cfg: SubnetConfig) -> Plan:
        """The compiled plan for ``cfg`` (validated and compiled on first use, then cached)."""
        plan = self._pinned.get(cfg)  # registered subnets: one lock-free dict lookup
        if plan is not None:
            return plan
        with self._lock:
            plan, fresh = self._plan_locked(cfg)
        if fresh:
            self._warn_uncalibrated(plan)
        return plan

    def activate(self, cfg: SubnetConfig) -> Plan:
        """Make ``cfg`` the default (what ``model(x)`` runs) and return its plan; the plan and the default change
        together, under the lock ``invalidate`` takes."""
        with self._lock:
            plan, fresh = self._plan_locked(cfg)
            self.default = plan
        if fresh:
            self._warn_uncalibrated(plan)
        return plan

    def _plan_locked(self, cfg: SubnetConfig) -> tuple[Plan, bool]:
        """``(plan, compiled_now)`` for ``cfg``; the caller holds ``_lock``."""
        plan = self._pinned.get(cfg)
        if plan is None:
            plan = self._lru.get(cfg)
            if plan is not None:
                self._lru.move_to_end(cfg)
        if plan is not None:
            return plan, False
        cfg = self.space.validate(cfg)  # may snap values, e.g. 0.5000000001 -> 0.5
        plan = self._pinned.get(cfg) or self._lru.get(cfg)
        if plan is not None:
            return plan, False
        plan = self.compile(cfg)
        if cfg in self.stats:
            self._pinned[cfg] = plan
        else:
            self._lru[cfg] = plan
            while len(self._lru) > PLAN_CACHE_SIZE:
                self._lru.popitem(last=False)
        return plan, True

    def _warn_uncalibrated(self, plan: Plan) -> None:
        # Only models with norms to calibrate warn (a transformer supernet has none: LayerNorm is not sliced).
        cfg = plan.config
        if plan.calibrated or cfg == self.max_config or cfg in self._warned:
            return
        if not any(op.is_subnet_norm for op in self.ops):
            return
        with self._lock:
            self._warned[cfg] = None
            while len(self._warned) > PLAN_CACHE_SIZE:
                self._warned.popitem(last=False)
        warnings.warn(
            f"subnet {cfg.id} has no calibrated SubnetNorm statistics, so its BatchNorm layers use the "
            "supernet's statistics sliced to the subnet's channels, which can be far off for small subnets. "
            "Call subnetact.calibrate(model, batches, subnets=[...]) to register it.",
            UncalibratedSubnetWarning,
            stacklevel=4,
        )

    # -- compilation ---------------------------------------------------------------------------------------------
    def group_sizes(self, cfg: SubnetConfig) -> list[int]:
        return [g.size_for(g.value_in(cfg)) for g in self.groups]

    def active_ops(self, cfg: SubnetConfig) -> list[bool]:
        """Which operators run for ``cfg`` (operators inside skipped blocks do not)."""
        active = [True] * len(self.ops)
        for op in self.ops:
            kept = op.kept_positions(cfg)
            if kept is None:
                continue
            keep = set(kept)
            # An operator held at a kept and at a skipped position (a block object used twice) still runs.
            running = {i for pos in keep for i in op.member_ops[pos]}
            for pos, members in enumerate(op.member_ops):
                if pos not in keep:
                    for i in members:
                        if i not in running:
                            active[i] = False
        return active

    def stats_layout(self, cfg: SubnetConfig) -> list[tuple[int, int]]:
        """``[(norm operator index, active channels), ...]`` in operator order, for the norms ``cfg`` runs.

        A subnet's flat statistics buffer is, for each of these in order, ``mean[k]`` then ``var[k]``.
        """
        sizes = self.group_sizes(cfg)
        active = self.active_ops(cfg)
        return [
            (op.op_index, op.active_channels(sizes)) for op in self.ops if op.is_subnet_norm and active[op.op_index]
        ]

    @torch.no_grad()
    def compile(self, cfg: SubnetConfig) -> Plan:
        sizes = self.group_sizes(cfg)
        active = self.active_ops(cfg)
        buffer = self.stats.get(cfg)
        stats: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        if buffer is not None:
            offset = 0
            for index, k in self.stats_layout(cfg):
                stats[index] = (buffer[offset : offset + k], buffer[offset + k : offset + 2 * k])
                offset += 2 * k
        entries = tuple(
            op.plan_entry(cfg, sizes, stats.get(i)) if active[i] else None for i, op in enumerate(self.ops)
        )
        return Plan(config=cfg, entries=entries, calibrated=buffer is not None)

    def invalidate(self, default: SubnetConfig | None = None) -> None:
        """Drop every compiled plan (after tensors moved or statistics changed) and recompile the default.

        Args:
            default: the config to make the default (``load`` restores the saved one); ``None`` keeps the current.
        """
        with self._lock:
            self._pinned.clear()
            self._lru.clear()
            plan, _ = self._plan_locked(self.default_config if default is None else default)
            self.default = plan
        self.weight_cache.clear()  # copies of tensors that may have been replaced or reloaded

    # -- copying -------------------------------------------------------------------------------------------------
    def __deepcopy__(self, memo: dict) -> ActuationState:
        import copy

        new = ActuationState.__new__(ActuationState)
        memo[id(self)] = new
        new.space = self.space
        new.convert_config = self.convert_config
        new.groups = self.groups
        new.ops = copy.deepcopy(self.ops, memo)
        new.stats = {cfg: t.clone() for cfg, t in self.stats.items()}
        new._pinned, new._lru, new._warned = {}, OrderedDict(), OrderedDict(self._warned)
        new.keyword_configs = dict(self.keyword_configs)
        new._lock, new.local = threading.Lock(), threading.local()
        new.max_config = self.max_config
        # Plans hold views of the old model's tensors; the copied root compiles its own (``invalidate``) once
        # every copied module exists.
        new._initial_config = self.default_config
        new.default = None  # type: ignore[assignment]
        cache = self.weight_cache
        new.weight_cache = WeightCache(new.ops, cache.budget_bytes, cache.default_budget)
        new.weight_cache.pointwise = cache.pointwise
        return new

    def __getstate__(self) -> dict:
        raise TypeError("a converted model cannot be pickled; use subnetact.save(model, path) / subnetact.load")


def converted_state(model: object) -> ActuationState | None:
    """The actuation state of a model converted by :func:`subnetact.convert`, else None."""
    state = getattr(model, "__dict__", {}).get("_subnetact")  # set on the root by ``supernet.to_supernet``
    return state if isinstance(state, ActuationState) else None


def state_of(model: object) -> ActuationState:
    """The actuation state of a converted model.

    Raises:
        NotConvertedError: (a ``TypeError``) ``model`` was not converted by :func:`subnetact.convert`.
    """
    state = converted_state(model)
    if state is None:
        raise NotConvertedError(
            f"model of type {type(model).__name__} is not a converted supernet (see subnetact.convert)"
        )
    return state
