"""Search results: candidates, the cost/accuracy Pareto front of a set of them, and what a search returns."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..config import SubnetConfig


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
