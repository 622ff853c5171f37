"""``WeightCache``: contiguous copies of the strided weight slices of registered subnets, under a memory budget.

Why (issue 16): a convolution whose *input* channels are sliced runs on a strided view ``W[:k_out, :k_in]``.
PyTorch's CPU convolution (oneDNN) needs a contiguous weight, so it copies the view into a fresh allocation on every
forward, and those allocations fault in new pages whenever the allocator has handed the memory back to the system.
An extracted subnet pays neither. (A 1x1 convolution without a copy runs as a GEMM on the view, which is no slower
at one thread but slower than oneDNN's convolution at two.) Keeping the contiguous copy of such a slice makes the
actuated layer run exactly the extracted layer's kernel on exactly the extracted layer's tensor.

The copies cost memory, which is the point of a supernet to save, so they are kept only for registered subnets
(the served set, see :func:`subnetact.calibrate`) and only within a budget the user sets
(``subnetact.convert(..., weight_cache_mb=)``, ``model.set_weight_cache(mb)``; ``subnetact.save`` / ``load`` keep
a budget the user set). When a subnet needs room, the copies of the least recently run registered subnets are
evicted first, behind a recency guard (see the comment at the top of the code); a copy shared by several subnets
(same layer, same slice) is stored once and kept while any admitted subnet uses it. What does not fit runs on the
view, as without a cache.

Actuation stays O(1): ``actuate`` never copies. A registered subnet's copies are made by a forward after actuation
(its first, or its second in a row when it has to evict others; under a lock), the same copy its view would cost
that forward anyway.

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

from .checks import is_real
from .config import SubnetConfig
from .errors import ConfigError

#: The default budget as a fraction of the supernet's parameter and buffer bytes. 8 % keeps the memory claim of
#: ``docs/benchmarks.md`` (OFA-ResNet50: supernet + statistics + cache of the six served subnets >= 2.6x smaller
#: than the six extracted subnets); see the budget -> forward-time curve there.
DEFAULT_BUDGET_FRACTION = 0.08

# The recency guard (issue 16). Least-recently-run eviction alone thrashes when a server switches among more
# subnets than the budget holds: under a round-robin every switch evicted the least recently run subnet and copied
# the next one again. So a subnet that needs room evicts others only if none of them has run since its own previous
# forward: a subnet run twice in a row (the mix moved to it) takes the room at once, one forward late, while subnets
# that keep alternating keep whatever was copied first and the rest run on the views.


def check_budget_mb(mb: object, where: str) -> None:
    """Raise :class:`~subnetact.ConfigError` (a ``ValueError``) naming ``where`` unless ``mb`` is a finite number
    >= 0 or None (the default budget)."""
    if mb is not None and (not is_real(mb) or not 0 <= mb < float("inf")):
        raise ConfigError(f"{where}={mb!r} must be a finite number >= 0 (MB), or None for the default")


@dataclass(frozen=True)
class WeightCacheInfo:
    """What the weight cache holds now.

    Args:
        budget_bytes: the most bytes the copies may take.
        used_bytes: bytes the copies take now.
        subnets: the registered subnets with copies, least recently run first.
        copies: number of stored copies (a copy shared by several subnets counts once).
        copied_bytes: bytes copied since the cache was created, last emptied or given a budget (a budget that keeps
            evicting and re-copying shows here as a number growing with every switch).
    """

    budget_bytes: int
    used_bytes: int
    subnets: tuple[SubnetConfig, ...]
    copies: int
    copied_bytes: int = 0


class WeightCache:
    """Per-model cache of contiguous weight slices. See the module docstring.

    The copies live on the operators (``op.weight_copies``: ``(k_out, k_in) -> (tensor, version, data_ptr)``) so a
    forward finds its copy with one dict lookup; this object keeps the budget, the recency order of admitted
    subnets, their recent run counts and which subnets use which copy.
    """

    def __init__(self, ops: list, budget_bytes: int, default_budget: bool = False) -> None:
        self.ops = ops
        self.budget_bytes = budget_bytes
        #: whether the budget is the default one (``save`` stores None then, so ``load`` applies its own default)
        self.default_budget = default_budget
        #: whether 1x1 slices are copied (then run as oneDNN convolutions on the copy instead of a GEMM on the view;
        #: measured faster at two threads, docs/benchmarks.md); False is what issue 16 compared against
        self.pointwise = True
        self.used_bytes = 0
        self.copied_bytes = 0
        self._admitted: OrderedDict[SubnetConfig, tuple[tuple[int, int, int], ...]] = OrderedDict()
        self._users: dict[tuple[int, int, int], set[SubnetConfig]] = {}
        # Forwards of registered subnets so far, and the forward each one last ran in (the recency guard).
        self._tick = 0
        self._last_run: dict[SubnetConfig, int] = {}
        # config -> (plan, its cacheable slices), so that a subnet refused room asks again cheaply
        self._wanted_memo: dict[SubnetConfig, tuple[object, list]] = {}
        self._lock = threading.Lock()

    # -- the hot path --------------------------------------------------------------------------------------------
    def use(self, plan) -> None:
        """Called by the model's forward for a registered subnet's plan: note the run, mark it most recently run and
        make its copies if it has none yet and the recency guard lets it in. O(1) once admitted."""
        if self.budget_bytes <= 0:
            return
        cfg = plan.config
        # Not atomic across threads: a lost update only delays or advances one admission.
        self._tick += 1
        previous = self._last_run.get(cfg)
        self._last_run[cfg] = self._tick
        if cfg in self._admitted:
            try:
                self._admitted.move_to_end(cfg)
            except KeyError:  # evicted by another thread in between: admitted again on its next forward
                pass
            return
        with self._lock:
            if cfg not in self._admitted:
                self._admit(plan, previous)

    # -- admission and eviction ----------------------------------------------------------------------------------
    def _wanted(self, plan) -> list[tuple[tuple[int, int, int], torch.Tensor, int]]:
        """``(key, view, bytes)`` of the plan's cacheable slices, smallest first."""
        memo = self._wanted_memo.get(plan.config)
        if memo is not None and memo[0] is plan:
            return memo[1]
        wanted = []
        for op, entry in zip(self.ops, plan.entries):
            slice_ = None if entry is None else op.cacheable_slice(entry, self.pointwise)
            if slice_ is not None:
                key, view = slice_
                wanted.append(((op.op_index, *key), view, view.numel() * view.element_size()))
        # Smallest first: under a tight budget this covers the most layers; the largest slices (a late stage's 3x3
        # convolution) are the ones whose view costs least relative to their size.
        wanted.sort(key=lambda w: w[2])
        self._wanted_memo[plan.config] = (plan, wanted)
        return wanted

    def _victims(self, cfg: SubnetConfig, keys: list, need: int) -> list[SubnetConfig] | None:
        """The least recently run admitted subnets whose eviction frees ``need`` bytes (copies shared with ``keys``
        or with subnets that stay are not freed), or None if evicting all of them would not."""
        if need <= 0:
            return []
        gone: set[SubnetConfig] = set()
        victims, freed = [], 0
        keep = set(keys)
        for victim in self._admitted:
            victims.append(victim)
            gone.add(victim)
            for key in self._admitted[victim]:
                if key not in keep and self._users[key] <= gone:
                    keep.add(key)  # counted once
                    freed += self._size(key)
            if freed >= need:
                return victims
        return None

    def _size(self, key: tuple[int, int, int]) -> int:
        copy = self.ops[key[0]].weight_copies[key[1:]][0]
        return copy.numel() * copy.element_size()

    @torch.no_grad()
    def _admit(self, plan, previous: int | None) -> None:
        """Copy ``plan``'s slices, evicting least recently run subnets if the recency guard allows (``previous``:
        the forward this subnet last ran in before this one, None if never)."""
        cfg = plan.config
        # The copies this subnet can hold with every other subnet evicted: the smallest first, shared ones free.
        kept, kept_bytes, new = [], 0, []
        for key, view, size in self._wanted(plan):
            if key not in self._users:
                if kept_bytes + size > self.budget_bytes:
                    break  # does not fit even with every other subnet evicted, nor do the larger ones after it
                new.append((key, view, size))
            kept.append(key)
            kept_bytes += size
        need = self.used_bytes + sum(size for *_, size in new) - self.budget_bytes
        victims = self._victims(cfg, kept, need)
        if victims is None:  # cannot happen (kept fits the budget alone); evicting everyone is the safe answer
            victims = list(self._admitted)
        if victims and (previous is None or any(self._last_run.get(v, 0) > previous for v in victims)):
            return  # refused: some of them ran since this subnet's previous forward; it runs on the views
        for key in kept:
            if key in self._users:  # shared: claimed before any eviction so that it stays
                self._users[key].add(cfg)
        for victim in victims:
            self._evict(victim)
        for key, view, size in new:
            op = self.ops[key[0]]
            op.weight_copies[key[1:]] = (view.contiguous(), op.weight._version, op.weight.data_ptr())
            self._users[key] = {cfg}
            self.used_bytes += size
            self.copied_bytes += size
        self._admitted[cfg] = tuple(kept)

    def _evict(self, cfg: SubnetConfig) -> None:
        for key in self._admitted.pop(cfg):
            users = self._users[key]
            users.discard(cfg)
            if not users:
                del self._users[key]
                copy, *_ = self.ops[key[0]].weight_copies.pop(key[1:])
                self.used_bytes -= copy.numel() * copy.element_size()

    def refresh(self, op, k_out: int, k_in: int, view: torch.Tensor) -> torch.Tensor:
        """The copy of ``op``'s slice after its weight changed in place: copied again (same size, same budget)."""
        copy = view.contiguous()
        with self._lock:
            if (k_out, k_in) in op.weight_copies:  # not evicted meanwhile
                op.weight_copies[(k_out, k_in)] = (copy, op.weight._version, op.weight.data_ptr())
        return copy

    # -- management ----------------------------------------------------------------------------------------------
    def clear(self) -> None:
        """Drop every copy (after tensors moved, weights were loaded or statistics changed)."""
        with self._lock:
            for op in self.ops:
                if op.weight_copies:
                    op.weight_copies = {}
            self._admitted.clear()
            self._users.clear()
            self._tick, self._last_run, self._wanted_memo = 0, {}, {}
            self.used_bytes = self.copied_bytes = 0

    def set_budget(self, budget_bytes: int, default: bool = False) -> None:
        """Set the budget; copies over it are evicted now (least recently run subnets first). ``default``: the
        budget is the default one."""
        with self._lock:
            self.budget_bytes, self.default_budget = budget_bytes, default
            self.copied_bytes = 0
            while self._admitted and (self.used_bytes > budget_bytes or budget_bytes == 0):
                self._evict(next(iter(self._admitted)))

    def info(self) -> WeightCacheInfo:
        with self._lock:
            return WeightCacheInfo(
                self.budget_bytes, self.used_bytes, tuple(self._admitted), len(self._users), self.copied_bytes
            )


def default_budget_bytes(ops: list) -> int:
    """The default budget: :data:`DEFAULT_BUDGET_FRACTION` of the operators' parameter and buffer bytes (each tensor
    counted once)."""
    tensors = {id(t): t for op in ops for t in (*op.parameters(), *op.buffers())}
    return int(DEFAULT_BUDGET_FRACTION * sum(t.numel() * t.element_size() for t in tensors.values()))
