"""Resolve ``"module:callable"`` strings (``--factory`` of ``subnetact profile``, a serving ``ModelSpec.factory``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from .errors import ConfigError


def import_callable(spec: str, what: str) -> Callable[..., Any]:
    """The callable ``spec`` names, e.g. ``"torchvision.models:resnet50"``.

    Raises:
        ConfigError: naming ``what`` (the option or argument) and ``spec`` when it is not ``module:callable``, cannot
            be imported, or is not callable.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{what}={spec!r} must be 'module:callable', e.g. 'torchvision.models:resnet50'")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{what}={spec!r} cannot be imported: {exc}") from None
    if not callable(fn):
        raise ConfigError(f"{what}={spec!r} is not callable")
    return fn
