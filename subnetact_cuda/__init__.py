"""Optional CUDA kernels for subnetact's ops (issue 7).

The compiled module ``subnetact_cuda._C`` only registers CUDA implementations of the ops that
:mod:`subnetact.ops` defines (``subnetact::sliced_linear``, ``subnetact::sliced_conv2d``). It is built only on
request (``SUBNETACT_BUILD_CUDA=1 pip install --no-build-isolation -e .``, see ``docs/cuda.md``); without it every
device runs the ops' pure-PyTorch reference kernels.

Nothing here runs at import time: :func:`available` loads the module once, on first use. Set
``SUBNETACT_DISABLE_EXTENSION=1`` to force the fallback (the module is then never loaded, and ``WeightSlice``
layers keep PyTorch's own kernels).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os

__all__ = ["DISABLE_ENV", "available", "disabled", "load_library", "loaded"]

logger = logging.getLogger(__name__)

#: Environment variable that forces the fallback when set to anything but "" or "0".
DISABLE_ENV = "SUBNETACT_DISABLE_EXTENSION"

_LOADED_FROM: list[str] = []


def disabled() -> bool:
    """Whether ``SUBNETACT_DISABLE_EXTENSION`` forces the fallback (read on every call; it is cheap)."""
    return os.environ.get(DISABLE_ENV, "0") not in ("", "0")


@functools.cache
def _load_built_module() -> bool:
    import subnetact.ops  # noqa: F401  # the schemas the compiled kernels implement must exist first

    if importlib.util.find_spec("subnetact_cuda._C") is None:
        return False  # not built: the normal case on CPU machines
    try:
        from . import _C
    except (ImportError, OSError, RuntimeError) as exc:  # built for another torch/CUDA, or a schema mismatch
        logger.warning("subnetact_cuda._C is present but failed to load (%s); using the reference kernels", exc)
        return False
    _LOADED_FROM.append(_C.__file__)
    return True


def available() -> bool:
    """True when the CUDA kernels are registered and not disabled. Loads the built module on first call.

    Never initialises CUDA: loading the module only registers kernels with the dispatcher.
    """
    if disabled():
        return False
    return bool(_LOADED_FROM) or _load_built_module()


def loaded() -> str | None:
    """Path of the loaded kernel library, or None if none is loaded."""
    return _LOADED_FROM[0] if _LOADED_FROM else None


def load_library(path: str) -> None:
    """Load a separately built kernel library (e.g. from ``torch.utils.cpp_extension.load``; used by the tests).

    Raises:
        RuntimeError: if one is already loaded (the dispatcher would reject a second CUDA kernel for the same op).
    """
    import torch

    import subnetact.ops  # noqa: F401

    if _LOADED_FROM:
        raise RuntimeError(f"subnetact_cuda: kernels already loaded from {_LOADED_FROM[0]!r}; cannot load {path!r}")
    torch.ops.load_library(path)
    _LOADED_FROM.append(path)
