"""Pareto search over a supernet's space: which subnets to serve.

Evolutionary search as once-for-all does it (``ofa/nas/search_algorithm/evolution.py``): for a cost constraint, a
population of random subnets that satisfy it evolves for a number of generations; each generation keeps the most
accurate quarter as parents, and fills the rest with mutations of parents (each entry re-sampled with a small
probability) and crossovers of two parents (each entry from either), keeping only children that satisfy the
constraint. Running it for several constraints between the smallest and the largest subnet's cost and keeping the
non-dominated results gives the latency/accuracy Pareto set that a SuperServe-style server registers.

Accuracy comes from a user evaluator (e.g. :func:`calibrated_evaluator`: calibrate the subnet, measure it on a
validation set), optionally through a small :class:`AccuracyPredictor` fitted on evaluated samples (once-for-all's
approach when evaluating is expensive). Cost comes from a FLOPs count (:class:`FlopsModel`) or any callable, e.g.
measured latency (:func:`measured_latency`).

Example::

    >>> evaluate = subnetact.search.calibrated_evaluator(model, calib_batches, val_accuracy)
    >>> result = subnetact.search.search(model, evaluate=evaluate, example_input=torch.randn(1, 3, 224, 224))
    >>> served = [c.config for c in result.pareto]
    >>> subnetact.calibrate(model, calib_batches, subnets=served)
"""

from __future__ import annotations

import copy
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ._progress import Progress
from .attention import PackedSliceLinear
from .calibrate import calibrate
from .config import SubnetConfig
from .errors import ConfigError
from .layer_select import LayerSelect, LayerSelectList
from .space import Space
from .supernet import state_of
from .weight_slice import WeightSlice

AccuracyFn = Callable[[SubnetConfig], float]
CostFn = Callable[[SubnetConfig], float]


# ------------------------------------------------------------------------------------------------ cost: FLOPs
@dataclass(frozen=True)
class _Term:
    macs_per_unit: float  # positions x kernel area (x input channels per group for grouped convolutions)
    out_group: int | None
    out_full: int
    in_group: int | None
    in_full: int
    stages: tuple[tuple[int, int], ...]  # (LayerSelect index, block position): active iff every block is kept


class FlopsModel:
    """FLOPs of any subnet of a converted model, computed from the layer shapes without running it.

    FLOPs here are multiply-accumulates of the convolution and linear layers per sample, the convention of
    once-for-all and the SuperServe paper ("MFLOPs"); attention's matrix products, norms and activations are not
    counted. One forward of the largest subnet on ``example_input`` records each layer's number of output positions;
    afterwards a config's FLOPs are a sum over layers of ``positions x kernel area x k_out x k_in`` with the channel
    counts the config gives each layer, skipping layers in blocks its depth drops (about 10-100 µs a config).

    Args:
        model: a converted model.
        example_input: one input as the model takes it (a tensor with a batch dimension of 1, a tuple of
            positional arguments, or a dict of keyword arguments). Results are per sample of this input's batch.

    Example::

        >>> flops = FlopsModel(model, torch.randn(1, 3, 224, 224))
        >>> flops(model.space.min()) / 1e6, flops(model.space.max()) / 1e6   # MFLOPs
    """

    def __init__(self, model: nn.Module, example_input: Any) -> None:
        state = state_of(model)
        self._state = state
        selects = [(path, m) for path, m in model.named_modules() if isinstance(m, (LayerSelect, LayerSelectList))]
        self._selects = [m for _, m in selects]
        layers = [(p, m) for p, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
        positions: dict[int, float] = {}
        batch: list[int] = []

        def hook(module: nn.Module, args: Any, out: torch.Tensor) -> None:
            per_channel = out.numel() / out.shape[1 if isinstance(module, nn.Conv2d) else -1]
            positions[id(module)] = per_channel

        handles = [m.register_forward_hook(hook) for _, m in layers]
        was_training = model.training
        model.eval()
        try:
            args, kwargs = _as_call(example_input)
            batch.append(_batch_of(args, kwargs))
            with torch.inference_mode():
                model(*args, subnet=state.space.max(), **kwargs)
        finally:
            for h in handles:
                h.remove()
            model.train(was_training)
        n = batch[0]
        terms = []
        for path, m in layers:
            if id(m) not in positions:
                continue  # never runs, not even in the largest subnet
            pos = positions[id(m)] / n
            stages = []
            for s, (sel_path, sel) in enumerate(selects):
                prefix = sel_path + "." if sel_path else ""
                if path.startswith(prefix):
                    child = path[len(prefix) :].split(".", 1)[0]
                    names = list(sel._modules)
                    if child in names:
                        stages.append((s, names.index(child)))
            if isinstance(m, nn.Conv2d):
                area = pos * m.kernel_size[0] * m.kernel_size[1]
                out_full, in_full = m.out_channels, m.in_channels
                if m.groups > 1:  # whole groups are kept: each output channel reads in_channels / groups inputs
                    area *= m.in_channels // m.groups
                    in_full = 1
                    in_group = None
                else:
                    in_group = getattr(m, "in_group", None) if isinstance(m, WeightSlice) else None
            else:
                area, out_full, in_full = pos, m.out_features, m.in_features
                if isinstance(m, PackedSliceLinear):  # q, k and v: each of its parts runs the group's channels
                    area, out_full = area * m.chunks, out_full // m.chunks
                in_group = getattr(m, "in_group", None) if isinstance(m, WeightSlice) else None
            out_group = getattr(m, "out_group", None) if isinstance(m, WeightSlice) else None
            terms.append(_Term(area, out_group, out_full, in_group, in_full, tuple(stages)))
        self._terms = terms
        # Channel group -> (dims, indices, choice -> size) as dicts: ActuationState.group_sizes does linear scans,
        # which dominate when the search calls this half a million times.
        self._groups = [(g.dim, g.index, dict(g.sizes)) for g in state.groups]
        self._cache: dict[SubnetConfig, float] = {}

    def _group_sizes(self, cfg: SubnetConfig) -> list[int]:
        values = dict(cfg.items())
        sizes = []
        for dim, index, table in self._groups:
            if isinstance(dim, tuple):
                sizes.append(table[tuple(values[d][i] for d, i in zip(dim, index))])
            else:
                sizes.append(table[values[dim][index]])
        return sizes

    def __call__(self, cfg: SubnetConfig) -> float:
        """Multiply-accumulates per sample of ``cfg`` (a config of the model's space)."""
        cached = self._cache.get(cfg)
        if cached is not None:
            return cached
        sizes = self._group_sizes(cfg)
        depth = cfg.get("depth", ())
        kept = [set(m.kept_positions(cfg)) if depth and m.segments else None for m in self._selects]
        total = 0.0
        for t in self._terms:
            if any(kept[s] is not None and p not in kept[s] for s, p in t.stages):
                continue
            k_out = t.out_full if t.out_group is None else sizes[t.out_group]
            k_in = t.in_full if t.in_group is None else sizes[t.in_group]
            total += t.macs_per_unit * k_out * k_in
        if len(self._cache) < 1_000_000:
            self._cache[cfg] = total
        return total


def measured_latency(
    model: nn.Module, example_input: torch.Tensor, *, batch_size: int = 1, warmup: int = 2, repeats: int = 10
) -> CostFn:
    """A cost function measuring each config's median forward latency (seconds) on the model's device, cached.

    Slow (``warmup + repeats`` forwards per new config): use it with small populations or to re-rank a FLOPs
    search's result. ``example_input`` has a batch dimension; it is repeated to ``batch_size``.
    """
    from .profiler import profile

    cache: dict[SubnetConfig, float] = {}

    def cost(cfg: SubnetConfig) -> float:
        if cfg not in cache:
            prof = profile(
                model, [cfg], [batch_size], example_input=example_input, warmup=warmup, repeats=repeats, progress=False
            )
            cache[cfg] = prof.latency(0, batch_size)
        return cache[cfg]

    return cost


# ------------------------------------------------------------------------------------------------ accuracy
def calibrated_evaluator(
    model: nn.Module, calibration_batches: Sequence[Any], evaluate: Callable[[nn.Module, SubnetConfig], float]
) -> AccuracyFn:
    """An evaluator that gives each subnet its own BatchNorm statistics before measuring it, as serving will.

    For each config: a copy of ``model`` is calibrated on ``calibration_batches`` for that config only and
    ``evaluate(copy, cfg)`` is returned (e.g. validation accuracy of ``copy(x, subnet=cfg)``). ``model`` itself
    is not changed. Results are cached per config.
    """
    state_of(model)
    clean = copy.deepcopy(model).eval()
    clean._subnetact.stats.clear()
    cache: dict[SubnetConfig, float] = {}

    def accuracy(cfg: SubnetConfig) -> float:
        if cfg not in cache:
            work = copy.deepcopy(clean)
            calibrate(work, calibration_batches, subnets=[cfg])
            cache[cfg] = float(evaluate(work, cfg))
        return cache[cfg]

    return accuracy


class AccuracyPredictor:
    """A small MLP from a config's one-hot encoding to accuracy (once-for-all's accuracy predictor).

    Args:
        space: the space configs come from.
        hidden: hidden units of the two hidden layers.
        epochs: full-batch Adam steps when fitting.
        seed: initialisation seed.

    Example::

        >>> pred = AccuracyPredictor(model.space).fit(configs, accuracies)
        >>> pred.predict([model.space.sample(0)])
    """

    def __init__(self, space: Space, *, hidden: int = 64, epochs: int = 600, seed: int = 0) -> None:
        self.space = space
        self._slots: list[tuple[str, int, tuple]] = [
            (d, i, e.choices) for d in space.dims for i, e in enumerate(space.entries(d))
        ]
        self.num_features = sum(len(ch) for _, _, ch in self._slots)
        gen = torch.Generator().manual_seed(seed)
        self.net = nn.Sequential(
            nn.Linear(self.num_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(torch.empty_like(p).uniform_(-1, 1, generator=gen) / math.sqrt(max(p.shape[-1], 1)))
        self.epochs = epochs
        self._offset, self._scale = 0.0, 1.0
        self.fitted = False

    def encode(self, configs: Sequence[SubnetConfig]) -> torch.Tensor:
        """(len(configs), num_features) one-hot encoding."""
        x = torch.zeros(len(configs), self.num_features)
        for row, cfg in enumerate(configs):
            col = 0
            for d, i, choices in self._slots:
                x[row, col + choices.index(cfg[d][i])] = 1.0
                col += len(choices)
        return x

    def fit(self, configs: Sequence[SubnetConfig], accuracies: Sequence[float]) -> AccuracyPredictor:
        """Fit on evaluated configs (at least 2); returns self."""
        if len(configs) != len(accuracies) or len(configs) < 2:
            raise ConfigError(
                f"fit needs >= 2 configs with one accuracy each, got {len(configs)} configs, {len(accuracies)} values"
            )
        x = self.encode(configs)
        y = torch.tensor([float(a) for a in accuracies]).unsqueeze(1)
        self._offset, self._scale = float(y.mean()), float(y.std()) or 1.0
        y = (y - self._offset) / self._scale
        opt = torch.optim.Adam(self.net.parameters(), lr=3e-3, weight_decay=1e-4)
        with torch.enable_grad():
            for _ in range(self.epochs):
                opt.zero_grad()
                loss = nn.functional.mse_loss(self.net(x), y)
                loss.backward()
                opt.step()
        self.fitted = True
        return self

    @torch.no_grad()
    def predict(self, configs: Sequence[SubnetConfig]) -> list[float]:
        """Predicted accuracies, in the unit of the fitted data."""
        if not self.fitted:
            raise RuntimeError("AccuracyPredictor.predict() before fit(); fit it on evaluated configs first")
        return (self.net(self.encode(configs)).squeeze(1) * self._scale + self._offset).tolist()

    def __call__(self, cfg: SubnetConfig) -> float:
        return self.predict([cfg])[0]


# ------------------------------------------------------------------------------------------------ the search
@dataclass(frozen=True, order=True)
class Candidate:
    """A subnet found by the search: its cost (FLOPs or seconds), accuracy, and config."""

    cost: float
    accuracy: float
    config: SubnetConfig = field(compare=False)
    predicted: bool = field(default=False, compare=False)  # accuracy from the predictor, not the evaluator


@dataclass(frozen=True)
class SearchResult:
    """What :func:`search` found.

    Attributes:
        pareto: the non-dominated candidates, in increasing cost and accuracy (the served set to register).
        evaluated: every candidate whose accuracy the evaluator measured.
        constraints: the cost constraints the evolution ran under.
        seconds: wall-clock time of the search.
        cost_calls, accuracy_calls: how many times the cost and accuracy functions were consulted.
    """

    pareto: tuple[Candidate, ...]
    evaluated: tuple[Candidate, ...]
    constraints: tuple[float, ...]
    seconds: float
    cost_calls: int
    accuracy_calls: int

    @property
    def configs(self) -> list[SubnetConfig]:
        """The Pareto set's configs, smallest first (ready for :func:`subnetact.calibrate`)."""
        return [c.config for c in self.pareto]


def pareto_front(candidates: Iterable[Candidate]) -> list[Candidate]:
    """The candidates no other candidate dominates (no costlier and strictly more accurate, or cheaper and no less
    accurate), sorted by cost; of equal (cost, accuracy) pairs the first is kept."""
    front: list[Candidate] = []
    for c in sorted(candidates, key=lambda c: (c.cost, -c.accuracy)):
        if not front or c.accuracy > front[-1].accuracy:
            if front and c.cost == front[-1].cost:
                continue  # same cost, sorted by accuracy descending: the first was better
            front.append(c)
    return front


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
    for arg, value, low in (
        ("num_samples", num_samples, 0),
        ("num_constraints", num_constraints, 1),
        ("population", population, 2),
        ("generations", generations, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{arg}={value!r} must be an int >= {low}")
    for arg, value in (("parent_ratio", parent_ratio), ("mutation_ratio", mutation_ratio)):
        if not 0.0 < value < 1.0:
            raise ConfigError(f"{arg}={value!r} must be in (0, 1)")
    if parent_ratio + mutation_ratio > 1.0:
        raise ConfigError(f"parent_ratio + mutation_ratio = {parent_ratio + mutation_ratio!r} must be <= 1")
    if not 0.0 <= mutate_prob <= 1.0:
        raise ConfigError(f"mutate_prob={mutate_prob!r} must be in [0, 1]")

    if cost == "flops":
        if example_input is None:
            raise ConfigError('cost="flops" needs example_input= (one input of batch 1, as the model takes it)')
        cost_fn: CostFn = FlopsModel(model, example_input)
    elif callable(cost):
        cost_fn = cost
    else:
        raise ConfigError(f'cost={cost!r} must be "flops" or a callable cfg -> cost')
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
    found: dict[SubnetConfig, float] = {space.min(): math.nan, space.max(): math.nan}
    bar = Progress(len(constraints), "search: evolution", enabled=progress)
    for limit in constraints:
        final = evolution(
            space,
            batch_accuracy,
            counted_cost,
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


def _as_call(example_input: Any) -> tuple[tuple, dict]:
    if isinstance(example_input, dict):
        return (), dict(example_input)
    if isinstance(example_input, tuple):
        return example_input, {}
    return (example_input,), {}


def _batch_of(args: tuple, kwargs: dict) -> int:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return 1


__all__ = [
    "AccuracyPredictor",
    "Candidate",
    "FlopsModel",
    "SearchResult",
    "calibrated_evaluator",
    "evolution",
    "measured_latency",
    "pareto_front",
    "search",
]
