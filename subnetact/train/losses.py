"""Distillation losses, and how a model's outputs are matched to one.

A student subnet learns to reproduce its teacher's outputs, so no labels are needed. What "reproduce" means depends on
what the model returns:

- ``"logits"``: class logits (N, C), or per-token logits (N, T, V) of a causal LM (``"next_token"`` is the same loss,
  named for that case): KL(teacher || student) of the softened distributions, times ``T**2``, averaged over samples
  (over non-padding tokens where the batch carries an ``attention_mask``).
- ``"embedding"``: a sentence embedding, mean-pooled over the non-padding tokens of ``last_hidden_state`` as
  sentence-transformers' ``Pooling(pooling_mode_mean_tokens=True)`` does: ``1 - cosine`` to the teacher's embedding,
  averaged over sentences (cosine does not depend on the ``Normalize`` step that follows).
- ``"hidden"``: MSE between the last hidden states (N, T, H), over non-padding tokens.
- a callable ``(student_outputs, teacher_outputs, batch) -> scalar``.

Outputs may be tensors, tuples (their first element) or mappings such as Hugging Face ``ModelOutput`` s (read by key:
``logits``, ``last_hidden_state``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import ConfigError

LOSSES = ("auto", "logits", "next_token", "embedding", "hidden")

DistillLoss = Callable[[Any, Any, Any], torch.Tensor]


def logits_of(outputs: Any) -> torch.Tensor | None:
    """The logits in ``outputs``: the tensor itself, a mapping's ``"logits"``, a tuple's first element; else None."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    if isinstance(outputs, Mapping):
        value = outputs.get("logits")
        return value if isinstance(value, torch.Tensor) else None
    if isinstance(outputs, (tuple, list)) and outputs and isinstance(outputs[0], torch.Tensor):
        return outputs[0]
    return None


def hidden_of(outputs: Any) -> torch.Tensor | None:
    """The last hidden states (N, T, H) in ``outputs``: a mapping's ``"last_hidden_state"``, a 3-d tensor, or a
    tuple's first 3-d element; else None."""
    if isinstance(outputs, Mapping):
        value = outputs.get("last_hidden_state")
        return value if isinstance(value, torch.Tensor) else None
    if isinstance(outputs, (tuple, list)) and outputs:
        outputs = outputs[0]
    return outputs if isinstance(outputs, torch.Tensor) and outputs.dim() == 3 else None


def token_mask(batch: Any, shape: torch.Size) -> torch.Tensor | None:
    """The batch's ``attention_mask`` (N, T) as floats if it matches ``shape``'s first two sizes, else None."""
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    if isinstance(mask, torch.Tensor) and len(shape) >= 2 and tuple(mask.shape) == tuple(shape[:2]):
        return mask
    return None


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``hidden`` (N, T, H) over the tokens where ``mask`` (N, T) is non-zero -> (N, H).

    sentence-transformers' mean pooling: padding tokens do not count; a sentence is never divided by less than 1e-9.
    """
    if mask is None:
        return hidden.mean(dim=1)
    m = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)


def kl_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    temperature: float = 1.0,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """KL(teacher || student) of the softmax at ``temperature`` over the last dimension, times ``temperature**2``.

    Args:
        student_logits: (..., C).
        teacher_logits: (..., C), detached here.
        mask: optional weights of the leading positions, e.g. an ``attention_mask`` (N, T) for (N, T, V) logits.

    Returns:
        A scalar: the mean over positions (weighted by ``mask``) of the per-position KL divergence.
    """
    log_p_teacher = F.log_softmax(teacher_logits.detach().float() / temperature, dim=-1)
    log_p_student = F.log_softmax(student_logits.float() / temperature, dim=-1)
    per_position = (log_p_teacher.exp() * (log_p_teacher - log_p_student)).sum(dim=-1)
    if mask is not None:
        m = mask.to(per_position.dtype)
        return (per_position * m).sum() / m.sum().clamp(min=1.0) * temperature**2
    return per_position.mean() * temperature**2


def resolve_loss(loss: str | DistillLoss, teacher_outputs: Any, *, temperature: float = 1.0) -> DistillLoss:
    """The loss ``(student_outputs, teacher_outputs, batch) -> scalar`` for ``loss``, checked on the teacher's outputs.

    ``"auto"``: a tensor -> ``"logits"``; a mapping with ``logits`` -> ``"logits"`` (masked per token for (N, T, V)
    logits); a mapping with ``last_hidden_state`` and no logits -> ``"embedding"``.

    Raises:
        ConfigError: ``loss`` is not one of :data:`LOSSES` or a callable, or the outputs hold nothing it can read.
    """
    if callable(loss):
        return loss
    if loss not in LOSSES:
        raise ConfigError(f"loss={loss!r} must be one of {LOSSES} or a callable (student, teacher, batch) -> loss")
    kind = loss
    if kind == "auto":
        if isinstance(teacher_outputs, torch.Tensor) or logits_of_mapping(teacher_outputs) is not None:
            kind = "logits"
        elif hidden_of(teacher_outputs) is not None and isinstance(teacher_outputs, Mapping):
            kind = "embedding"
        else:
            raise ConfigError(
                f"loss='auto' cannot match the model's outputs ({describe(teacher_outputs)}) to a loss: expected a "
                "tensor of logits or a mapping (a Hugging Face ModelOutput) with 'logits' or 'last_hidden_state'; "
                "pass loss='logits', 'embedding', 'hidden' or a callable (student_outputs, teacher_outputs, batch) "
                "-> scalar"
            )
    reader = hidden_of if kind in ("embedding", "hidden") else logits_of
    if reader(teacher_outputs) is None:
        needs = "last_hidden_state (N, T, H)" if reader is hidden_of else "logits"
        raise ConfigError(
            f"loss={loss!r} needs {needs} in the outputs, but the model returned {describe(teacher_outputs)}"
        )
    if kind in ("logits", "next_token"):
        return _LogitsLoss(temperature)
    if kind == "embedding":
        return _embedding_loss
    return _hidden_loss


def logits_of_mapping(outputs: Any) -> torch.Tensor | None:
    return logits_of(outputs) if isinstance(outputs, Mapping) else None


def describe(outputs: Any) -> str:
    """A short description of a model's outputs, for error messages."""
    if isinstance(outputs, torch.Tensor):
        return f"a tensor of shape {tuple(outputs.shape)}"
    if isinstance(outputs, Mapping):
        return f"{type(outputs).__name__} with keys {list(outputs.keys())}"
    if isinstance(outputs, (tuple, list)):
        return f"a {type(outputs).__name__} of {len(outputs)} ({', '.join(type(o).__name__ for o in outputs[:4])})"
    return f"a {type(outputs).__name__}"


class _LogitsLoss:
    def __init__(self, temperature: float) -> None:
        self.temperature = temperature

    def __call__(self, student: Any, teacher: Any, batch: Any) -> torch.Tensor:
        s, t = logits_of(student), logits_of(teacher)
        return kl_loss(s, t, self.temperature, token_mask(batch, s.shape) if s.dim() == 3 else None)


def _embedding_loss(student: Any, teacher: Any, batch: Any) -> torch.Tensor:
    s, t = hidden_of(student), hidden_of(teacher)
    mask = token_mask(batch, s.shape)
    return 1.0 - F.cosine_similarity(mean_pool(s, mask), mean_pool(t.detach(), mask), dim=-1).mean()


def _hidden_loss(student: Any, teacher: Any, batch: Any) -> torch.Tensor:
    s, t = hidden_of(student), hidden_of(teacher).detach()
    mask = token_mask(batch, s.shape)
    if mask is None:
        return F.mse_loss(s, t)
    m = mask.to(s.dtype).unsqueeze(-1)
    return ((s - t).square() * m).sum() / (m.sum() * s.shape[-1]).clamp(min=1.0)
