"""Walking the tensors inside nested call arguments and model outputs: one definition for the trace, the
verification and checkpoints."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch


def iter_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside nested tuples / lists / dicts / dataclass-like outputs (Hugging Face ``ModelOutput``), in
    order."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from iter_tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from iter_tensors(item)
    elif hasattr(obj, "__dataclass_fields__"):
        for name in obj.__dataclass_fields__:
            yield from iter_tensors(getattr(obj, name, None))


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], obj: Any) -> Any:
    """``obj`` with every tensor inside nested tuples / lists / dicts replaced by ``fn(tensor)``; other objects are
    returned as they are (the same object)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(fn, item) for item in obj)
    if isinstance(obj, dict):
        return {key: map_tensors(fn, item) for key, item in obj.items()}
    return obj
