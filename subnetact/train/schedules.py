"""Which subnets one training step trains: the sandwich rule, DynaBERT's width-then-depth, OFA's progressive shrinking.

A schedule is a small object with ``subnets(space, step, total_steps, rng) -> list[SubnetConfig]``: the subnets whose
gradients are summed into one optimiser step. It holds no state of its own (``step`` and the random generator are the
trainer's, and both are checkpointed), so a resumed run picks exactly the subnets the uninterrupted run would have.
``check(space)`` refuses, before training, a schedule that names a dimension the space does not have.

Dimensions are named as ``model.actuate`` takes them: ``"depth"``, ``"width"`` (for a transformer a link to
``"heads"`` and ``"ffn"``), or any other dimension of the space.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from ..config import SubnetConfig
from ..errors import ConfigError
from ..space import Space


class Schedule:
    """Base class: subclasses set :attr:`dims` (the dimensions they name) and implement :meth:`subnets`."""

    dims: tuple[str, ...] = ()

    def check(self, space: Space) -> None:
        """Raise :class:`~subnetact.ConfigError` naming the schedule and the dimension if ``space`` lacks one."""
        known = set(space.dims) | set(space.links)
        for dim in self.dims:
            if dim not in known:
                raise ConfigError(
                    f"schedule={self!r} names dimension {dim!r}, which the model's space does not have; it has "
                    f"{sorted(known)}"
                )

    def subnets(self, space: Space, step: int, total_steps: int, rng: random.Random) -> list[SubnetConfig]:
        raise NotImplementedError

    def loss_weights(self, subnets: list[SubnetConfig]) -> list[float]:
        """The weight of each subnet's loss in the step's sum (all 1 unless a schedule says otherwise)."""
        return [1.0] * len(subnets)


@dataclass(frozen=True)
class Sandwich(Schedule):
    """The sandwich rule (slimmable networks, BigNAS): the largest, the smallest and ``num_random`` uniformly random
    subnets every step."""

    num_random: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.num_random, bool) or not isinstance(self.num_random, int) or self.num_random < 0:
            raise ConfigError(f"num_random={self.num_random!r} must be an int >= 0")

    def subnets(self, space: Space, step: int, total_steps: int, rng: random.Random) -> list[SubnetConfig]:
        return [space.max(), space.min(), *(space.sample(rng) for _ in range(self.num_random))]


@dataclass(frozen=True)
class Fixed(Schedule):
    """The same subnets every step, e.g. the set you will serve: all the compute goes to them.

    Args:
        configs: configs of the space, or ``actuate``-style keyword dicts (``{"depth": 3, "width": 0.5}``).
        weights: one positive weight per config for its loss (default all 1). A large weight on the largest subnet
            keeps it close to the teacher while the shared weights move for the small ones: its restoring gradient
            grows with the weight, and so the drift the others cause shrinks.
    """

    configs: tuple
    weights: tuple | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.configs, Sequence) or isinstance(self.configs, (str, bytes)) or not self.configs:
            raise ConfigError(f"configs={self.configs!r} must be a non-empty sequence of subnets")
        object.__setattr__(self, "configs", tuple(self.configs))
        if self.weights is not None:
            weights = self.weights
            if (
                not isinstance(weights, Sequence)
                or len(weights) != len(self.configs)
                or not all(
                    isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and w > 0
                    for w in weights
                )
            ):
                raise ConfigError(
                    f"weights={weights!r} must be {len(self.configs)} finite numbers > 0, one per config"
                )
            object.__setattr__(self, "weights", tuple(float(w) for w in weights))
        dims = set()
        for c in self.configs:
            dims |= set(c.dims if isinstance(c, SubnetConfig) else dict(c))
        object.__setattr__(self, "dims", tuple(sorted(dims)))

    def check(self, space: Space) -> None:
        super().check(space)
        self.resolved(space)

    def resolved(self, space: Space) -> list[SubnetConfig]:
        """The configs as configs of ``space`` (keyword dicts made, values snapped), in order."""
        return [space.validate(c) if isinstance(c, SubnetConfig) else space.make(**dict(c)) for c in self.configs]

    def subnets(self, space: Space, step: int, total_steps: int, rng: random.Random) -> list[SubnetConfig]:
        return self.resolved(space)

    def loss_weights(self, subnets: list[SubnetConfig]) -> list[float]:
        return list(self.weights) if self.weights is not None else [1.0] * len(subnets)


@dataclass(frozen=True)
class WidthThenDepth(Schedule):
    """DynaBERT's two stages: width-adaptive (full depth, every width), then depth- and width-adaptive.

    For the first ``width_fraction`` of the steps every step trains the full-depth subnet at each of
    ``widths``; afterwards every combination of ``depths`` and ``widths``. A fraction ``f`` of a dimension
    means, per entry, the smallest choice >= ``f`` times its largest choice (depth 0.5 of 6 layers is 3).

    Args:
        widths: width fractions, DynaBERT's ``width_mult_list`` (1.0, 0.75, 0.5, 0.25).
        depths: depth fractions, DynaBERT's ``depth_mult_list`` (1.0, 0.75, 0.5).
        width_fraction: share of the steps in the width-only stage (DynaBERT runs the two as separate trainings
            of equal length).
        width, depth: the dimensions (or links) that mean width and depth.
    """

    widths: tuple[float, ...] = (1.0, 0.75, 0.5, 0.25)
    depths: tuple[float, ...] = (1.0, 0.75, 0.5)
    width_fraction: float = 0.5
    width: str = "width"
    depth: str = "depth"

    def __post_init__(self) -> None:
        for name in ("widths", "depths"):
            values = getattr(self, name)
            if not values or not all(isinstance(v, (int, float)) and 0 < v <= 1 for v in values):
                raise ConfigError(f"{name}={values!r} must be a non-empty sequence of fractions in (0, 1]")
            object.__setattr__(self, name, tuple(values))
        if not 0 <= self.width_fraction <= 1:
            raise ConfigError(f"width_fraction={self.width_fraction!r} must be in [0, 1]")
        object.__setattr__(self, "dims", (self.depth, self.width))

    def subnets(self, space: Space, step: int, total_steps: int, rng: random.Random) -> list[SubnetConfig]:
        depths = self.depths if step >= self.width_fraction * total_steps else (1.0,)
        return [
            space.make(
                **{self.depth: at_fraction(space, self.depth, d), self.width: at_fraction(space, self.width, w)}
            )
            for d in depths
            for w in self.widths
        ]


@dataclass(frozen=True)
class ProgressiveShrinking(Schedule):
    """Once-for-all's progressive shrinking: the largest subnet first, then one more elastic dimension per stage.

    The steps are split into ``len(order) + 1`` equal stages. Stage 0 trains the largest subnet only; stage ``k``
    trains the largest and ``num_random`` subnets whose first ``k`` dimensions of ``order`` are sampled uniformly
    (per entry) and whose other dimensions stay at their largest choices. OFA's order is kernel, depth, width;
    subnetact has no elastic kernel, so the default is depth, then width.
    """

    order: tuple[str, ...] = ("depth", "width")
    num_random: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.order, str) or not self.order:
            raise ConfigError(f"order={self.order!r} must be a non-empty sequence of dimension names")
        object.__setattr__(self, "order", tuple(self.order))
        object.__setattr__(self, "dims", self.order)
        if isinstance(self.num_random, bool) or not isinstance(self.num_random, int) or self.num_random < 1:
            raise ConfigError(f"num_random={self.num_random!r} must be an int >= 1")

    def stage(self, step: int, total_steps: int) -> int:
        """The stage of ``step``: 0 (largest only) to ``len(order)`` (every dimension elastic)."""
        stages = len(self.order) + 1
        return min(stages - 1, step * stages // max(total_steps, 1))

    def subnets(self, space: Space, step: int, total_steps: int, rng: random.Random) -> list[SubnetConfig]:
        k = self.stage(step, total_steps)
        largest = space.max()
        if k == 0:
            return [largest]
        elastic = set(space.expand_links(dict.fromkeys(self.order[:k], None)))
        out = [largest]
        for _ in range(self.num_random):
            values = {
                d: tuple(rng.choice(e.choices) for e in space.entries(d)) if d in elastic else largest[d]
                for d in space.dims
            }
            out.append(SubnetConfig(**values))
        return out


def at_fraction(space: Space, dim: str, fraction: float) -> list:
    """Per entry of ``dim`` (or of the first dimension of a link), the smallest choice >= ``fraction`` x its
    largest choice."""
    target = space.links.get(dim, (dim,))[0]
    out = []
    for entry in space.entries(target):
        top = entry.choices[-1]
        out.append(next((c for c in entry.choices if c >= fraction * top - 1e-9), top))
    return out


__all__ = ["Fixed", "ProgressiveShrinking", "Sandwich", "Schedule", "WidthThenDepth", "at_fraction"]
