"""How good the subnets are, measured as a user would: each one's outputs against the teacher's on held-out data.

Metrics (``metric=``):

- ``"cosine"``: mean cosine similarity of the sentence embeddings (mean-pooled ``last_hidden_state`` over the
  non-padding tokens) to the teacher's, over all held-out sentences. Higher is better, 1 is identical.
- ``"agreement"``: % of samples whose top-1 class equals the teacher's (logits (N, C)).
- ``"accuracy"``: % correct against labels; batches are ``(inputs, labels)`` pairs, no teacher needed.
- ``"kl"``: mean KL(teacher || subnet) of the logits (per token for (N, T, V), padding left out). Lower is better.
- ``"perplexity"``: the subnet's own next-token perplexity on the batches' ``input_ids`` (padding left out), no
  teacher needed; compare with the teacher's from ``evaluate(teacher, ...)``.

:func:`subnet_metric` turns one of them into the ``cfg -> score`` function :func:`subnetact.search.search` takes
(with the teacher's outputs computed once), so the served set can be searched on the distilled metric.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..config import SubnetConfig
from ..errors import ConfigError
from .batches import call
from .losses import describe, hidden_of, kl_loss, logits_of, mean_pool, token_mask

METRICS = ("cosine", "agreement", "accuracy", "kl", "perplexity")
_NEEDS_TEACHER = ("cosine", "agreement", "kl")
HIGHER_IS_BETTER = {"cosine": True, "agreement": True, "accuracy": True, "kl": False, "perplexity": False}


def evaluate(
    model: nn.Module,
    subnets: Sequence[SubnetConfig | None],
    batches: Iterable[Any],
    *,
    metric: str,
    teacher: nn.Module | None = None,
) -> dict[SubnetConfig | None, float]:
    """``metric`` of each subnet of ``model`` on ``batches`` (in eval mode, without gradients).

    Args:
        model: a converted model (or any model, with ``subnets=[None]``).
        subnets: the configs to measure (None: the model as it is).
        batches: held-out inputs (``(inputs, labels)`` pairs for ``"accuracy"``); a re-iterable.
        metric: one of :data:`METRICS`.
        teacher: the reference model for ``"cosine"``, ``"agreement"`` and ``"kl"``, called on the same inputs
            (a converted teacher runs its active subnet).

    Returns:
        ``{config: value}`` in the order of ``subnets``.
    """
    score = subnet_metric(model, batches, metric=metric, teacher=teacher)
    return {cfg: score(cfg) for cfg in subnets}


def subnet_metric(
    model: nn.Module, batches: Iterable[Any], *, metric: str, teacher: nn.Module | None = None
) -> Callable[[SubnetConfig | None], float]:
    """A function ``cfg -> metric of model's subnet cfg on batches``; the teacher's outputs are computed once.

    Use it as ``subnetact.search.search(model, evaluate=subnet_metric(...))`` (for ``"kl"`` and ``"perplexity"``,
    where lower is better, search on the negated value).
    """
    if metric not in METRICS:
        raise ConfigError(f"metric={metric!r} must be one of {METRICS}")
    if metric in _NEEDS_TEACHER and teacher is None:
        raise ConfigError(f"metric={metric!r} compares with a teacher: pass teacher= (e.g. the original model)")
    batches = list(batches)
    if not batches:
        raise ConfigError("batches is empty: evaluation needs at least one held-out batch")
    reference: list[Any] = []
    if metric in _NEEDS_TEACHER:
        was = teacher.training
        teacher.eval()
        with torch.no_grad():
            reference = [_reduce(metric, call(teacher, b), b) for b in batches]
        teacher.train(was)

    def score(cfg: SubnetConfig | None) -> float:
        was = model.training
        model.eval()
        total = count = 0.0
        try:
            with torch.no_grad():
                for i, batch in enumerate(batches):
                    inputs = batch[0] if metric == "accuracy" else batch
                    out = call(model, inputs, cfg)
                    value, n = _compare(metric, out, reference[i] if reference else None, batch)
                    total += value
                    count += n
        finally:
            model.train(was)
        mean = total / max(count, 1e-12)
        return math.exp(mean) if metric == "perplexity" else mean

    return score


def _reduce(metric: str, outputs: Any, batch: Any) -> Any:
    """What the comparison needs of the teacher's outputs (embeddings, not whole hidden-state tensors)."""
    if metric == "cosine":
        hidden = _need(hidden_of(outputs), "last_hidden_state", outputs, metric)
        return mean_pool(hidden, token_mask(batch, hidden.shape))
    return _need(logits_of(outputs), "logits", outputs, metric)


def _compare(metric: str, outputs: Any, reference: Any, batch: Any) -> tuple[float, float]:
    """(sum of the metric over the batch's items, number of items)."""
    if metric == "cosine":
        emb = _reduce("cosine", outputs, batch)
        return float(F.cosine_similarity(emb.float(), reference.float(), dim=-1).sum()), emb.shape[0]
    logits = _need(logits_of(outputs), "logits", outputs, metric)
    if metric == "agreement":
        return 100.0 * float((logits.argmax(-1) == reference.argmax(-1)).sum()), logits.shape[0]
    if metric == "accuracy":
        labels = batch[1]
        return 100.0 * float((logits.argmax(-1) == labels).sum()), labels.shape[0]
    if metric == "kl":
        mask = token_mask(batch, logits.shape) if logits.dim() == 3 else None
        n = float(mask.sum()) if mask is not None else float(logits.shape[:-1].numel())
        return float(kl_loss(logits, reference, 1.0, mask)) * n, n
    # perplexity: next-token cross-entropy on input_ids
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    if ids is None or logits.dim() != 3:
        raise ConfigError("metric='perplexity' needs dict batches with input_ids and (N, T, V) logits")
    mask = token_mask(batch, ids.shape)
    target = ids[:, 1:]
    nll = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), target, reduction="none")  # (N, T-1)
    weight = mask[:, 1:].to(nll.dtype) if mask is not None else torch.ones_like(nll)
    return float((nll * weight).sum()), float(weight.sum())


def _need(value: Any, what: str, outputs: Any, metric: str) -> Any:
    if value is None:
        raise ConfigError(f"metric={metric!r} needs {what} in the outputs, but the model returned {describe(outputs)}")
    return value


__all__ = ["HIGHER_IS_BETTER", "METRICS", "evaluate", "subnet_metric"]
