"""once-for-all's evolutionary search under one cost constraint (``ofa/nas/search_algorithm/evolution.py``)."""

from __future__ import annotations

import random
from collections.abc import Callable

from ..config import SubnetConfig
from ..errors import ConfigError
from ..space import Space
from .cost import CostFn


def evolution(
    space: Space,
    accuracy: Callable[[list[SubnetConfig]], list[float]],
    cost: CostFn,
    constraint: float,
    *,
    population: int = 100,
    generations: int = 500,
    parent_ratio: float = 0.25,
    mutation_ratio: float = 0.5,
    mutate_prob: float = 0.1,
    rng: random.Random,
    max_tries: int = 10_000,
) -> list[tuple[SubnetConfig, float]]:
    """once-for-all's evolution under ``cost(cfg) <= constraint``; returns the final population with accuracies,
    best first.

    ``accuracy`` scores a list of configs at once (a predictor is much faster batched). Children violating the
    constraint are re-drawn (at most ``max_tries`` draws per individual before giving up with a ValueError naming the
    constraint). Unlike once-for-all, a child that is already in the population is re-drawn too (up to 100 times).
    """
    dims = [(d, [e.choices for e in space.entries(d)]) for d in space.dims]

    def feasible(draw: Callable[[], SubnetConfig], taken: set[SubnetConfig]) -> SubnetConfig:
        # A child already in the population adds nothing; once-for-all keeps such duplicates, and on small spaces
        # they crowd the population onto one subnet. Prefer a new one, accept a duplicate after 100 draws.
        fallback = None
        for tries in range(max_tries):
            cfg = draw()
            if cost(cfg) <= constraint:
                if cfg not in taken:
                    taken.add(cfg)
                    return cfg
                fallback = cfg
                if tries >= 100:
                    return fallback
        if fallback is not None:
            return fallback
        raise ConfigError(
            f"no subnet with cost <= constraint={constraint!r} found in {max_tries} draws; the smallest subnet costs "
            f"{cost(space.min())!r}"
        )

    def mutate(parent: SubnetConfig) -> SubnetConfig:
        values = {}
        for d, choices in dims:
            values[d] = [rng.choice(ch) if rng.random() < mutate_prob else v for v, ch in zip(parent[d], choices)]
        return SubnetConfig(**values)

    def crossover(a: SubnetConfig, b: SubnetConfig) -> SubnetConfig:
        return SubnetConfig(**{d: [rng.choice(pair) for pair in zip(a[d], b[d])] for d, _ in dims})

    n_parents = max(1, int(round(population * parent_ratio)))
    n_mutate = int(round(population * mutation_ratio))
    taken: set[SubnetConfig] = set()
    pop = [feasible(lambda: space.sample(rng), taken) for _ in range(population)]
    scored = sorted(zip(pop, accuracy(pop)), key=lambda t: -t[1])
    for _ in range(generations):
        parents = [c for c, _ in scored[:n_parents]]
        taken = set(parents)
        children = [feasible(lambda p=parents: mutate(rng.choice(p)), taken) for _ in range(n_mutate)]
        children += [
            feasible(lambda p=parents: crossover(rng.choice(p), rng.choice(p)), taken)
            for _ in range(population - n_parents - n_mutate)
        ]
        scored = sorted(scored[:n_parents] + list(zip(children, accuracy(children))), key=lambda t: -t[1])
    return scored
