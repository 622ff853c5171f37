"""The search driver: one evolution per cost constraint, survivors scored by the evaluator, the Pareto front kept."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from typing import Any

from torch import nn

from .._progress import Progress
from ..checks import is_int
from ..config import SubnetConfig
from ..errors import ConfigError
from ..supernet import state_of
from .accuracy import AccuracyFn, AccuracyPredictor
from .cost import CostFn, FlopsModel
from .evolution import evolution
from .pareto import Candidate, SearchResult, pareto_front


def search(
    model: nn.Module,
    *,
    evaluate: AccuracyFn | None = None,
    predictor: AccuracyPredictor | Callable[[list[SubnetConfig]], list[float]] | None = None,
    num_samples: int = 0,
    cost: str | CostFn = "flops",
    example_input: Any = None,
    num_constraints: int = 8,
    population: int = 100,
    generations: int = 500,
    parent_ratio: float = 0.25,
    mutation_ratio: float = 0.5,
    mutate_prob: float = 0.1,
    seed: int = 0,
    progress: bool | None = None,
) -> SearchResult:
    """Find the cost/accuracy Pareto set of ``model.space`` with once-for-all's evolutionary search.

    The evolution runs once per cost constraint, for ``num_constraints`` constraints evenly spaced between the
    smallest and the largest subnet's cost (the largest is one of them). The best ``parent_ratio`` of each final
    population, plus the smallest and the largest subnet, are then scored by ``evaluate`` (when given), and the
    non-dominated subnets among everything the evaluator measured (samples included) are returned. Without an
    evaluator, the candidates keep their predicted accuracy.

    Where accuracy comes from:

    - ``predictor``: a fitted :class:`AccuracyPredictor` (or any ``list[cfg] -> list[float]``) drives the evolution.
    - ``evaluate`` with ``num_samples > 0``: ``num_samples`` random subnets (plus the smallest and largest) are
      evaluated, an :class:`AccuracyPredictor` is fitted on them and drives the evolution.
    - ``evaluate`` alone: the evolution calls it directly (cached per config); keep ``population`` x
      ``generations`` small if it is slow.

    Args:
        model: a converted model.
        evaluate: ``cfg -> accuracy`` (e.g. :func:`calibrated_evaluator`); the final candidates are re-scored with it.
        predictor: see above.
        num_samples: random subnets evaluated to fit a predictor (0: no predictor unless ``predictor`` is given).
        cost: ``"flops"`` (a :class:`FlopsModel` on ``example_input``) or a callable ``cfg -> cost`` (FLOPs,
            seconds, ...; e.g. :func:`measured_latency`).
        example_input: one input for ``"flops"`` (batch of 1).
        num_constraints: how many cost constraints (>= 1).
        population, generations, parent_ratio, mutation_ratio, mutate_prob: the evolution's settings
            (once-for-all's defaults).
        seed: seeds sampling and evolution; the search is deterministic given deterministic cost and accuracy.
        progress: progress line on stderr; None: when stderr is a terminal.

    Returns:
        A :class:`SearchResult`; ``result.configs`` are registered-ready configs, smallest first.

    Raises:
        ValueError: a bad argument (named), or neither ``evaluate`` nor ``predictor`` given.
    """
    start = time.perf_counter()
    state = state_of(model)
    space = state.space
    if evaluate is None and predictor is None:
        raise ConfigError("search needs evaluate= (cfg -> accuracy) or predictor= (a fitted AccuracyPredictor)")
    _check_settings(num_samples, num_constraints, population, generations, parent_ratio, mutation_ratio, mutate_prob)
    cost_fn = _cost_function(cost, model, example_input)
    calls = {"cost": 0, "accuracy": 0}

    def counted_cost(cfg: SubnetConfig) -> float:
        calls["cost"] += 1
        return cost_fn(cfg)

    rng = random.Random(seed)
    evaluated: dict[SubnetConfig, float] = {}

    def measure(cfg: SubnetConfig) -> float:
        if cfg not in evaluated:
            calls["accuracy"] += 1
            evaluated[cfg] = float(evaluate(cfg))  # type: ignore[misc]
        return evaluated[cfg]

    # Phase 1: the accuracy the evolution optimises.
    if predictor is not None:
        batch_accuracy = predictor.predict if isinstance(predictor, AccuracyPredictor) else predictor
        uses_predictor = True
    elif num_samples > 0:
        samples = list(dict.fromkeys([space.min(), space.max(), *(space.sample(rng) for _ in range(num_samples))]))
        bar = Progress(len(samples), "search: evaluating samples", enabled=progress)
        for cfg in samples:
            measure(cfg)
            bar.update()
        bar.close()
        fitted = AccuracyPredictor(space, seed=seed).fit(samples, [evaluated[c] for c in samples])
        batch_accuracy = fitted.predict
        uses_predictor = True
    else:

        def batch_accuracy(configs: list[SubnetConfig]) -> list[float]:
            return [measure(c) for c in configs]

        uses_predictor = False

    # Phase 2: one evolution per cost constraint.
    lo, hi = counted_cost(space.min()), counted_cost(space.max())
    constraints = (
        [hi] if num_constraints == 1 else [lo + (hi - lo) * (i + 1) / num_constraints for i in range(num_constraints)]
    )
    found = _evolve(
        space,
        batch_accuracy,
        counted_cost,
        constraints,
        population=population,
        generations=generations,
        parent_ratio=parent_ratio,
        mutation_ratio=mutation_ratio,
        mutate_prob=mutate_prob,
        rng=rng,
        progress=progress,
    )

    # Phase 3: score the survivors with the evaluator (when there is one); every evaluated subnet is a candidate.
    if evaluate is not None:
        bar = Progress(len(found), "search: evaluating candidates", enabled=progress)
        for cfg in found:
            measure(cfg)
            bar.update()
        bar.close()
        candidates = [Candidate(counted_cost(c), a, c) for c, a in evaluated.items()]
    else:
        missing = [c for c, a in found.items() if math.isnan(a)]
        found.update(zip(missing, batch_accuracy(missing)))
        candidates = [Candidate(counted_cost(c), float(a), c, predicted=uses_predictor) for c, a in found.items()]
    front = pareto_front(candidates)
    evaluated_list = tuple(sorted(Candidate(cost_fn(c), a, c) for c, a in evaluated.items()))
    return SearchResult(
        pareto=tuple(front),
        evaluated=evaluated_list,
        constraints=tuple(constraints),
        seconds=time.perf_counter() - start,
        cost_calls=calls["cost"],
        accuracy_calls=calls["accuracy"],
    )


def _check_settings(
    num_samples: int,
    num_constraints: int,
    population: int,
    generations: int,
    parent_ratio: float,
    mutation_ratio: float,
    mutate_prob: float,
) -> None:
    """Raise :class:`ConfigError` naming the first of :func:`search`'s settings that is out of range."""
    for arg, value, low in (
        ("num_samples", num_samples, 0),
        ("num_constraints", num_constraints, 1),
        ("population", population, 2),
        ("generations", generations, 0),
    ):
        if not is_int(value) or value < low:
            raise ConfigError(f"{arg}={value!r} must be an int >= {low}")
    for arg, value in (("parent_ratio", parent_ratio), ("mutation_ratio", mutation_ratio)):
        if not 0.0 < value < 1.0:
            raise ConfigError(f"{arg}={value!r} must be in (0, 1)")
    if parent_ratio + mutation_ratio > 1.0:
        raise ConfigError(f"parent_ratio + mutation_ratio = {parent_ratio + mutation_ratio!r} must be <= 1")
    if not 0.0 <= mutate_prob <= 1.0:
        raise ConfigError(f"mutate_prob={mutate_prob!r} must be in [0, 1]")


def _cost_function(cost: str | CostFn, model: nn.Module, example_input: Any) -> CostFn:
    """``cfg -> cost`` for :func:`search`'s ``cost``: a :class:`FlopsModel` for ``"flops"``, or the callable."""
    if cost == "flops":
        if example_input is None:
            raise ConfigError('cost="flops" needs example_input= (one input of batch 1, as the model takes it)')
        return FlopsModel(model, example_input)
    if callable(cost):
        return cost
    raise ConfigError(f'cost={cost!r} must be "flops" or a callable cfg -> cost')


def _evolve(
    space: Any,
    batch_accuracy: Callable[[list[SubnetConfig]], list[float]],
    cost: CostFn,
    constraints: list[float],
    *,
    population: int,
    generations: int,
    parent_ratio: float,
    mutation_ratio: float,
    mutate_prob: float,
    rng: random.Random,
    progress: bool | None,
) -> dict[SubnetConfig, float]:
    """Phase 2 of :func:`search`: one evolution per cost constraint. Returns the best ``parent_ratio`` of each final
    population with its accuracy, plus the smallest and largest subnet (accuracy NaN: not scored yet)."""
    found: dict[SubnetConfig, float] = {space.min(): math.nan, space.max(): math.nan}
    bar = Progress(len(constraints), "search: evolution", enabled=progress)
    for limit in constraints:
        final = evolution(
            space,
            batch_accuracy,
            cost,
            limit,
            population=population,
            generations=generations,
            parent_ratio=parent_ratio,
            mutation_ratio=mutation_ratio,
            mutate_prob=mutate_prob,
            rng=rng,
        )
        for cfg, acc in final[: max(1, int(round(population * parent_ratio)))]:
            found.setdefault(cfg, acc)
        bar.update()
    bar.close()
    return found
