"""The example input ``convert`` traces with and verifies on: the caller's ``example_inputs`` as a call, or calls
built from the model's first layer (image sizes tried smallest first), the traced forward, and the context managers
(eval mode, one thread) every verification forward runs under. The checks themselves are in :mod:`subnetact.verify`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from .errors import ConfigError, UnsupportedModelError
from .trace import ChannelTrace, trace_channels
from .tree import map_tensors

# Square image sizes tried, smallest first, when the model does not say which it takes: a small forward keeps
# convert fast; bigger ones serve models that pool down to fixed sizes (Inception needs >= 75 pixels).
IMAGE_SIZES = (32, 64, 128, 224, 299)

Call = tuple[tuple, dict]


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Every module in eval mode (no statistics updates, no dropout) for the block; each flag restored after."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in flags:
            m.training = training


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the block's forwards on one intra-op thread, then restore the caller's setting exactly.

    Why: convert's forwards are small (batch 1, 32 px images for CNNs), and a shared machine punishes threads that
    wait for each other. Measured on the 2-core build box (``docs/benchmarks.md``): at load average ~3 one thread vs
    two took 0.08 s vs 0.07 s for resnet50, 1.38 s vs 0.86 s for regnet_y_128gf and 8.8 s vs 14.7 s for vit_h_14; at
    load ~10 resnet50 took 0.62 s vs 9.5 s. The setting is process-wide: forwards that other threads run while
    ``convert`` is verifying also use one thread meanwhile. Left untouched when it already is one.
    """
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def detached_copy(obj: Any) -> Any:
    """``obj`` with every tensor inside nested tuples / lists / dicts replaced by a detached CPU copy."""
    return map_tensors(lambda t: t.detach().to("cpu", copy=True), obj)


def example_call(example_inputs: Any) -> Call:
    """The call ``(args, kwargs)`` that ``example_inputs`` (a tensor, a tuple of arguments or a dict) stands for.

    Raises:
        ConfigError: ``example_inputs`` is of another type.
    """
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, tuple):
        return example_inputs, {}
    if isinstance(example_inputs, (torch.Tensor, list)):
        return (example_inputs,), {}
    raise ConfigError(
        f"example_inputs of type {type(example_inputs).__name__} is not allowed: give a tensor, a tuple of "
        "positional arguments or a dict of keyword arguments"
    )


def candidate_calls(model: nn.Module, example_inputs: Any) -> list[Call]:
    """The example calls to try, in order: the caller's, else ones built from the model's first layer."""
    if example_inputs is not None:
        return [example_call(example_inputs)]
    first = next((m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Conv3d, nn.Linear))), None)
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    gen = torch.Generator().manual_seed(0)
    if isinstance(first, (nn.Conv2d, nn.Conv3d)):
        sizes = _declared_image_size(model) or [(s, s) for s in IMAGE_SIZES]
        # Last resort: the size timm's pretrained_cfg names (models that need e.g. 256 px windows); not first, since
        # a small forward keeps convert fast.
        cfg_size = _pretrained_cfg_size(model)
        if cfg_size is not None and cfg_size not in sizes:
            sizes.append(cfg_size)
        frames = (8,) if isinstance(first, nn.Conv3d) else ()  # video models (torchvision's r3d_18): 8 frames
        return [
            ((torch.randn(1, first.in_channels, *frames, h, w, generator=gen).to(device, dtype),), {})
            for h, w in sizes
        ]
    if isinstance(first, nn.Linear):
        return [((torch.randn(2, first.in_features, generator=gen).to(device, dtype),), {})]
    return []


def _pretrained_cfg_size(model: nn.Module) -> tuple[int, int] | None:
    """``(H, W)`` of timm's ``pretrained_cfg["input_size"]`` (``(C, H, W)``), if the model has one."""
    size = (getattr(model, "pretrained_cfg", None) or {}).get("input_size")
    if not isinstance(size, (tuple, list)) or len(size) != 3:
        return None
    return int(size[1]), int(size[2])


def _declared_image_size(model: nn.Module) -> list[tuple[int, int]] | None:
    size = getattr(model, "image_size", None)  # torchvision's ViT
    if size is None:
        size = getattr(getattr(model, "patch_embed", None), "img_size", None)  # timm's ViT / DeiT
    if size is None:
        cfg = getattr(model, "pretrained_cfg", None) or {}
        if "input_size" in cfg and getattr(model, "patch_embed", None) is not None:
            size = tuple(cfg["input_size"][1:])
    if size is None:
        return None
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    return [(int(h), int(w))]


def trace_model(model: nn.Module, example_inputs: Any, *, required: bool) -> tuple[Call, ChannelTrace] | None:
    """Trace ``model`` on the first example call it accepts (eval mode, no grad; the model is not changed).

    Returns:
        ``(call, trace)``; None if no call works and ``required`` is False.

    Raises:
        UnsupportedModelError: no call works and ``required``; the message has the last error and asks for
            ``example_inputs``.
    """
    calls = candidate_calls(model, example_inputs)
    error: BaseException | None = None
    with eval_mode(model):
        for call in calls:
            try:
                return call, trace_channels(model, *call)
            except Exception as exc:  # the model rejects this input size; try the next one
                error = exc
    if not required:
        return None
    if not calls:
        raise UnsupportedModelError(
            f"convert cannot build an example input for {type(model).__qualname__} (its first layer is neither "
            "nn.Conv2d nor nn.Linear); pass example_inputs= (a tensor, a tuple of arguments or a dict)"
        )
    given = "example_inputs" if example_inputs is not None else "the example inputs convert built"
    raise UnsupportedModelError(
        f"{type(model).__qualname__} failed to run on {given} ({type(error).__name__}: {error}); "
        "pass example_inputs= that the model accepts"
    ) from error
