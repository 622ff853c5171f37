"""How a batch of inputs is fed to a model: one convention shared by distillation, evaluation and the refit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from ..config import SubnetConfig


def call(model: nn.Module, batch: Any, subnet: SubnetConfig | None = None) -> Any:
    """``model(batch)``: a dict as keyword arguments, a tuple/list as positional ones, anything else as the one
    input; ``subnet=`` is passed only when given."""
    extra = {} if subnet is None else {"subnet": subnet}
    if isinstance(batch, Mapping):
        return model(**batch, **extra)
    if isinstance(batch, (tuple, list)):
        return model(*batch, **extra)
    return model(batch, **extra)
