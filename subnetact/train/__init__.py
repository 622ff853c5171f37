"""Supernet training: from a converted model to a supernet whose subnets are all good.

- :func:`distill` (:mod:`.distill`): no labels; every subnet learns to reproduce a teacher (the original pretrained
  model, frozen, or the supernet's largest subnet), on logits, sentence embeddings or next-token distributions
  (:mod:`.losses`), with a schedule of subnets per step (:mod:`.schedules`: :class:`Sandwich`, :class:`Fixed`,
  DynaBERT's :class:`WidthThenDepth`, once-for-all's :class:`ProgressiveShrinking`); importance reordering first;
  data-parallel under ``torchrun``; checkpoint and resume (:mod:`.checkpoint`).
- :func:`order_layers` (:mod:`.layer_order`): which blocks each smaller depth keeps, measured greedily on the metric.
- :func:`refit_sliced_linears` (:mod:`.refit`): before distillation, a closed-form least-squares refit of the
  sliced linear layers so that each served width's prefix best reproduces the full layer's output.
- :func:`evaluate` / :func:`subnet_metric` (:mod:`.evaluate`): each subnet against the teacher on held-out data, and
  the ``cfg -> score`` function :func:`subnetact.search.search` takes.
- :func:`sandwich_step` / :func:`train_supernet` (:mod:`.sandwich`): supervised training on labels with in-place
  distillation from the largest subnet (slimmable networks / BigNAS).

Recipe: ``docs/training.md``.
"""

from .checkpoint import load_checkpoint, save_checkpoint
from .distill import DistillResult, distill
from .evaluate import METRICS, evaluate, subnet_metric
from .layer_order import LayerOrder, order_layers
from .losses import LOSSES, kl_loss, mean_pool
from .refit import LayerRefit, RefitResult, refit_sliced_linears
from .sandwich import StepResult, distillation_loss, sandwich_step, sandwich_subnets, train_supernet
from .schedules import Fixed, ProgressiveShrinking, Sandwich, Schedule, WidthThenDepth

__all__ = [
    "LOSSES",
    "METRICS",
    "DistillResult",
    "Fixed",
    "LayerOrder",
    "LayerRefit",
    "ProgressiveShrinking",
    "RefitResult",
    "Sandwich",
    "Schedule",
    "StepResult",
    "WidthThenDepth",
    "distill",
    "distillation_loss",
    "evaluate",
    "kl_loss",
    "load_checkpoint",
    "mean_pool",
    "order_layers",
    "refit_sliced_linears",
    "sandwich_step",
    "sandwich_subnets",
    "save_checkpoint",
    "subnet_metric",
    "train_supernet",
]
