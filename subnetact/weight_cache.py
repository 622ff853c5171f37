"""``WeightCache``: contiguous copies of the strided weight slices of registered subnets, under a memory budget.

Why (issue 16): a convolution whose *input* channels are sliced runs on a strided view ``W[:k_out, :k_in]``.
PyTorch's CPU convolution (oneDNN) needs a contiguous weight, so it copies the view into a fresh allocation on every
forward, and those allocations fault in new pages whenever the allocator has handed the memory back to the system.
An extracted subnet pays neither. Keeping the contiguous copy of such a slice makes the actuated layer run exactly
the extracted layer's kernel on exactly the extracted layer's tensor.

The copies cost memory, which is the point of a supernet to save, so they are kept only for registered subnets
(the served set, see :func:`subnetact.calibrate`) and only within a budget the user sets
(``model.set_weight_cache(mb)``). When a subnet needs room, the copies of the least recently run registered subnets
are evicted first; a copy shared by several subnets (same layer, same slice) is stored once and kept while any
admitted subnet uses it. What does not fit runs on the view, as without a cache.

Actuation stays O(1): ``actuate`` never copies. A registered subnet's copies are made by its first forward after
actuation (under a lock), the same copy its view would cost that forward anyway.

Correctness: a copy is used only in eval mode, and never when autograd records (grad enabled and the weight
requires grad): training always reads the shared Parameter. Each copy remembers the version counter and storage of
the weight it came from; a forward that finds the weight changed in place (an optimiser step, ``load_state_dict``,
``copy_`` under ``no_grad``) re-copies before use. ``.to()``, ``load_state_dict`` and ``calibrate`` drop the whole
cache (``ActuationState.invalidate``). Writes through ``weight.data`` bypass the version counter; call
``model.set_weight_cache(...)`` (or ``load_state_dict``) after such a write.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

from .config import SubnetConfig

#: The default budget as a fraction of the supernet's parameter and buffer bytes. 8 % keeps the memory claim of
#: ``docs/benchmarks.md`` (OFA-ResNet50: supernet + statistics + cache of the six served subnets >= 2.6x smaller
#: than the six extracted subnets); see the budget -> forward-time curve there.
DEFAULT_BUDGET_FRACTION = 0.08


@dataclass(frozen=True)
class WeightCacheInfo:
    """What the weight cache holds now.

    Args:
        budget_bytes: the most bytes the copies may take.
        used_bytes: bytes the copies take now.
        subnets: the registered subnets with copies, least recently run first.
        copies: number of stored copies (a copy shared by several subnets counts once).
    """

    budget_bytes: int
    used_bytes: int
    subnets: tuple[SubnetConfig, ...]
    copies: int


class WeightCache:
    """Per-model cache of contiguous weight slices. See the module docstring.

    The copies live on the operators (``op._weight_copies``: ``(k_out, k_in) -> (tensor, version, data_ptr)``) so a
    forward finds its copy with one dict lookup; this object keeps the budget, the recency order of admitted
    subnets and which subnets use which copy.
    """

    def __init__(self, ops: list, budget_bytes: int) -> None:
        self.ops = ops
        self.budget_bytes = budget_bytes
        self.used_bytes = 0
        self._admitted: OrderedDict[SubnetConfig, tuple[tuple[int, int, int], ...]] = OrderedDict()
        self._users: dict[tuple[int, int, int], set[SubnetConfig]] = {}
        self._lock = threading.Lock()

    # -- the hot path --------------------------------------------------------------------------------------------
    def use(self, plan) -> None:
        """Called by the model's forward for a registered subnet's plan: mark it most recently run and make its
        copies if it has none yet. O(1) once admitted."""
        cfg = plan.config
        if cfg in self._admitted:
            try:
                self._admitted.move_to_end(cfg)
            except KeyError:  # evicted by another thread in between: admitted again on its next forward
                pass
            return
        if self.budget_bytes > 0:
            with self._lock:
                if cfg not in self._admitted:
                    self._admit(plan)

    # -- admission and eviction ----------------------------------------------------------------------------------
    @torch.no_grad()
    def _admit(self, plan) -> None:
        wanted = []
        for op, entry in zip(self.ops, plan.entries):
            slice_ = None if entry is None else getattr(op, "cacheable_slice", lambda e: None)(entry)
            if slice_ is not None:
                key, view = slice_
                wanted.append(((op._op_index, *key), view))
        # Smallest first: under a tight budget this covers the most layers; the largest slices (a late stage's 3x3
        # convolution) are the ones whose view costs least relative to their size.
        wanted.sort(key=lambda kv: kv[1].numel() * kv[1].element_size())
        kept, kept_bytes = [], 0
        for key, view in wanted:
            size = view.numel() * view.element_size()
            if key in self._users:  # already copied for another subnet: share it
                self._users[key].add(plan.config)
                kept.append(key)
                kept_bytes += size
                continue
            if kept_bytes + size > self.budget_bytes:
                break  # does not fit even with every other subnet evicted, nor do the larger ones after it
            while self.used_bytes + size > self.budget_bytes:
                self._evict(next(iter(self._admitted)))  # least recently run first
            op = self.ops[key[0]]
            op._weight_copies[key[1:]] = (view.contiguous(), op.weight._version, op.weight.data_ptr())
            self._users[key] = {plan.config}
            self.used_bytes += size
            kept.append(key)
            kept_bytes += size
        self._admitted[plan.config] = tuple(kept)

    def _evict(self, cfg: SubnetConfig) -> None:
        for key in self._admitted.pop(cfg):
            users = self._users[key]
            users.discard(cfg)
            if not users:
                del self._users[key]
                copy, *_ = self.ops[key[0]]._weight_copies.pop(key[1:])
                self.used_bytes -= copy.numel() * copy.element_size()

    def refresh(self, op, k_out: int, k_in: int, view: torch.Tensor) -> torch.Tensor:
        """The copy of ``op``'s slice after its weight changed in place: copied again (same size, same budget)."""
        copy = view.contiguous()
        with self._lock:
            if (k_out, k_in) in op._weight_copies:  # not evicted meanwhile
                op._weight_copies[(k_out, k_in)] = (copy, op.weight._version, op.weight.data_ptr())
        return copy

    # -- management ----------------------------------------------------------------------------------------------
    def clear(self) -> None:
        """Drop every copy (after tensors moved, weights were loaded or statistics changed)."""
        with self._lock:
            for op in self.ops:
                if getattr(op, "_weight_copies", None):
                    op._weight_copies = {}
            self._admitted.clear()
            self._users.clear()
            self.used_bytes = 0

    def set_budget(self, budget_bytes: int) -> None:
        """Set the budget; copies over it are evicted now (least recently run subnets first)."""
        with self._lock:
            self.budget_bytes = budget_bytes
            while self._admitted and (self.used_bytes > budget_bytes or budget_bytes == 0):
                self._evict(next(iter(self._admitted)))

    def info(self) -> WeightCacheInfo:
        with self._lock:
            return WeightCacheInfo(self.budget_bytes, self.used_bytes, tuple(self._admitted), len(self._users))


def default_budget_bytes(ops: list) -> int:
    """The default budget: :data:`DEFAULT_BUDGET_FRACTION` of the operators' parameter and buffer bytes (each tensor
    counted once)."""
    tensors = {id(t): t for op in ops for t in (*op.parameters(), *op.buffers())}
    return int(DEFAULT_BUDGET_FRACTION * sum(t.numel() * t.element_size() for t in tensors.values()))
