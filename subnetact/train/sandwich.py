"""Supervised supernet training: the sandwich rule with in-place distillation, then calibration of the served set.

This is how a converted model becomes a trained supernet (the recipe of slimmable networks / BigNAS, also used by
once-for-all's elastic stages): every step trains the largest subnet on the labels, and the smallest and a few random
subnets on the largest subnet's (detached) predictions. All of them share one set of weights, so the gradients of the
subnets of one step are summed before a single optimiser step. Finally the served subnets get their own BatchNorm
statistics (:func:`subnetact.calibrate`), which matters most for the small ones.

Example::

    >>> model = subnetact.convert(MyResNet())
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    >>> for x, y in loader:
    ...     result = subnetact.train.sandwich_step(model, opt, x, y, num_random=2, rng=rng)
    >>> subnetact.calibrate(model, calibration_batches, subnets=served)
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..calibrate import calibrate
from ..config import SubnetConfig
from ..errors import ConfigError, UncalibratedSubnetWarning
from ..supernet import state_of
from .losses import describe, logits_of

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class StepResult:
    """What one :func:`sandwich_step` did.

    Attributes:
        subnets: the subnets trained, in order: the largest (the teacher), the smallest, then the random ones.
        losses: each subnet's loss (a float, before summation); the first is the label loss of the largest.
    """

    subnets: tuple[SubnetConfig, ...]
    losses: tuple[float, ...]

    @property
    def loss(self) -> float:
        """The summed loss the optimiser stepped on."""
        return float(sum(self.losses))


def distillation_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Soft cross-entropy of the student against the teacher's softened distribution, times ``temperature**2``.

    Args:
        student_logits: (N, C) logits (any leading shape, classes last).
        teacher_logits: (N, C) logits; they are detached here, so no gradient reaches the teacher.
        temperature: softmax temperature (> 0); ``T**2`` keeps gradient magnitudes comparable across temperatures.

    Returns:
        A scalar: mean over samples of ``-sum_c p_teacher(c) log p_student(c)`` at temperature T, times ``T**2``.
    """
    if not temperature > 0:
        raise ConfigError(f"temperature={temperature!r} must be > 0")
    if student_logits.shape != teacher_logits.shape:
        raise ConfigError(
            f"student_logits {tuple(student_logits.shape)} and teacher_logits {tuple(teacher_logits.shape)} must "
            "have the same shape"
        )
    target = F.softmax(teacher_logits.detach() / temperature, dim=-1)
    log_probs = F.log_softmax(student_logits / temperature, dim=-1)
    return -(target * log_probs).sum(dim=-1).mean() * temperature**2


def sandwich_subnets(model: nn.Module, num_random: int, rng: random.Random) -> list[SubnetConfig]:
    """The subnets of one sandwich step: largest, smallest, then ``num_random`` uniform samples of the space."""
    space = _space(model)
    return [space.max(), space.min(), *(space.sample(rng) for _ in range(num_random))]


def sandwich_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    inputs: Any,
    targets: torch.Tensor,
    *,
    num_random: int = 2,
    rng: random.Random | int | None = None,
    loss_fn: LossFn = F.cross_entropy,
    distill_weight: float = 1.0,
    temperature: float = 1.0,
    max_grad_norm: float | None = None,
) -> StepResult:
    """One training step with the sandwich rule and in-place distillation (the model is put in train mode).

    The largest subnet runs first and is trained with ``loss_fn(logits, targets)``; its logits, detached, are the
    distillation target of the smallest and ``num_random`` random subnets, which are trained with
    ``distill_weight * distillation_loss + (1 - distill_weight) * loss_fn``. Each subnet's backward runs right after
    its forward (only one subnet's activations are alive at a time); gradients add up in the shared weights and the
    optimiser steps once.

    Args:
        model: a converted model (``subnetact.convert``) whose forward returns logits (N, C), or a mapping with
            ``"logits"`` (a Hugging Face ``ModelOutput``; ``loss_fn`` gets the logits).
        optimizer: the optimiser over the model's parameters; ``zero_grad`` is called here first.
        inputs: the batch's input: a tensor, or a tuple of positional arguments, or a dict of keyword arguments.
        targets: (N,) class labels, or whatever ``loss_fn`` takes.
        num_random: random subnets per step (>= 0); the sandwich rule uses 2.
        rng: a ``random.Random`` or seed for the random subnets (None: a fresh unseeded generator).
        loss_fn: ``(logits, targets) -> scalar``; default cross-entropy.
        distill_weight: in [0, 1]; 1 (default) trains the other subnets on the teacher's predictions only
            (in-place distillation as in slimmable networks and BigNAS), 0 on the labels only.
        temperature: distillation temperature (> 0).
        max_grad_norm: clip the summed gradient to this norm before stepping (None: no clipping).

    Returns:
        A :class:`StepResult` with the subnets (the largest first) and their losses.

    Example::

        >>> rng = random.Random(0)
        >>> for x, y in loader:
        ...     r = subnetact.train.sandwich_step(model, optimizer, x, y, rng=rng)
    """
    _space(model)
    if isinstance(num_random, bool) or not isinstance(num_random, int) or num_random < 0:
        raise ConfigError(f"num_random={num_random!r} must be an int >= 0")
    if not 0.0 <= distill_weight <= 1.0:
        raise ConfigError(f"distill_weight={distill_weight!r} must be in [0, 1]")
    if not temperature > 0:
        raise ConfigError(f"temperature={temperature!r} must be > 0")
    if not isinstance(rng, random.Random):
        rng = random.Random(rng)

    model.train()
    optimizer.zero_grad(set_to_none=True)
    subnets = sandwich_subnets(model, num_random, rng)
    losses: list[float] = []
    teacher: torch.Tensor | None = None
    with warnings.catch_warnings():
        # Training runs arbitrary subnets in train mode (batch statistics); the uncalibrated-statistics warning is
        # about eval mode and would fire once per random subnet.
        warnings.simplefilter("ignore", UncalibratedSubnetWarning)
        for i, cfg in enumerate(subnets):
            logits = _forward(model, inputs, cfg)
            if i == 0:
                loss = loss_fn(logits, targets)
                teacher = logits.detach()
            else:
                loss = distill_weight * distillation_loss(logits, teacher, temperature)
                if distill_weight < 1.0:
                    loss = loss + (1.0 - distill_weight) * loss_fn(logits, targets)
            loss.backward()
            losses.append(float(loss.detach()))
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return StepResult(tuple(subnets), tuple(losses))


def train_supernet(
    model: nn.Module,
    batches: Iterable[tuple[Any, torch.Tensor]] | Callable[[int], Iterable[tuple[Any, torch.Tensor]]],
    optimizer: torch.optim.Optimizer,
    *,
    epochs: int,
    lr_scheduler: Any = None,
    num_random: int = 2,
    seed: int = 0,
    served: Sequence[SubnetConfig] | None = None,
    calibration_batches: Iterable[Any] | None = None,
    on_epoch: Callable[[int, float], None] | None = None,
    **step_kwargs: Any,
) -> list[float]:
    """Train a converted model as a supernet with :func:`sandwich_step`, then calibrate the served set.

    Args:
        model: a converted model.
        batches: ``(inputs, targets)`` pairs; a re-iterable (a list, a DataLoader) or a function
            ``epoch -> iterable`` (for per-epoch shuffling or augmentation under your own seed).
        optimizer: the optimiser over the model's parameters.
        epochs: number of passes over ``batches`` (>= 1).
        lr_scheduler: optional; its ``step()`` is called after every optimiser step.
        num_random: random subnets per step.
        seed: seed of the random-subnet generator (training is reproducible given seeded data and weights).
        served: subnets to calibrate after training (registered with :func:`subnetact.calibrate`). Statistics that
            were registered before training are stale once the weights change, so they are dropped here.
        calibration_batches: batches for the calibration (required when ``served`` is given).
        on_epoch: called as ``on_epoch(epoch, mean_loss)`` after each epoch (logging, checkpoints).
        **step_kwargs: passed to :func:`sandwich_step` (``loss_fn``, ``distill_weight``, ``temperature``,
            ``max_grad_norm``).

    Returns:
        The mean summed step loss of each epoch.
    """
    state = state_of(model)
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ConfigError(f"epochs={epochs!r} must be an int >= 1")
    if served is not None and calibration_batches is None:
        raise ConfigError("served= needs calibration_batches= (inputs to compute each subnet's statistics on)")
    if state.stats:
        state.stats.clear()  # trained weights make old statistics wrong
        state.invalidate()
    rng = random.Random(seed)
    history = []
    for epoch in range(epochs):
        total, steps = 0.0, 0
        for inputs, targets in batches(epoch) if callable(batches) else batches:
            result = sandwich_step(model, optimizer, inputs, targets, num_random=num_random, rng=rng, **step_kwargs)
            if lr_scheduler is not None:
                lr_scheduler.step()
            total += result.loss
            steps += 1
        if steps == 0:
            raise ConfigError("batches yielded no batch; training needs at least one (inputs, targets) pair")
        history.append(total / steps)
        if on_epoch is not None:
            on_epoch(epoch, history[-1])
    model.eval()
    if served is not None:
        calibrate(model, calibration_batches, subnets=list(served))
    return history


def _forward(model: nn.Module, inputs: Any, cfg: SubnetConfig) -> torch.Tensor:
    if isinstance(inputs, dict):
        outputs = model(**inputs, subnet=cfg)
    elif isinstance(inputs, tuple):
        outputs = model(*inputs, subnet=cfg)
    else:
        outputs = model(inputs, subnet=cfg)
    logits = logits_of(outputs)  # a tensor, or a Hugging Face ModelOutput's .logits
    if logits is None:
        raise ConfigError(
            f"sandwich_step trains on logits, but the model returned {describe(outputs)}; for a model without "
            "logits (a sentence encoder) use subnetact.train.distill(..., loss='embedding')"
        )
    return logits


def _space(model: nn.Module):
    return state_of(model).space


__all__ = ["StepResult", "distillation_loss", "sandwich_step", "sandwich_subnets", "train_supernet"]
