"""Accuracy of a subnet: measured after per-subnet calibration, or predicted by a small MLP (once-for-all's)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..calibrate import calibrate
from ..config import SubnetConfig
from ..errors import ConfigError
from ..space import Space
from ..state import state_of

AccuracyFn = Callable[[SubnetConfig], float]


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
    state_of(clean).stats.clear()
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
