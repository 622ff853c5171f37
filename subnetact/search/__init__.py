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

from .accuracy import AccuracyFn, AccuracyPredictor, calibrated_evaluator
from .cost import CostFn, FlopsModel, measured_latency
from .evolution import evolution
from .pareto import Candidate, SearchResult, pareto_front
from .run import search

__all__ = [
    "AccuracyFn",
    "AccuracyPredictor",
    "Candidate",
    "CostFn",
    "FlopsModel",
    "SearchResult",
    "calibrated_evaluator",
    "evolution",
    "measured_latency",
    "pareto_front",
    "search",
]
