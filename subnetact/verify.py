"""The example input ``convert`` traces with, and the check it runs before returning.

``convert`` never returns a model whose largest subnet differs from the original: the converted model runs the
example input at its largest subnet (output equal bit for bit) and at its smallest (outputs of the original's
shapes). Any failure names the module that failed and undoes the conversion.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from .errors import ConfigError, UnsupportedModelError
from .state import state_of
from .trace import ChannelTrace, trace_channels
from .tree import iter_tensors, map_tensors

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
    first = next((m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))), None)
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    gen = torch.Generator().manual_seed(0)
    if isinstance(first, nn.Conv2d):
        sizes = _declared_image_size(model)
        return [
            ((torch.randn(1, first.in_channels, h, w, generator=gen).to(device, dtype),), {})
            for h, w in (sizes or [(s, s) for s in IMAGE_SIZES])
        ]
    if isinstance(first, nn.Linear):
        return [((torch.randn(2, first.in_features, generator=gen).to(device, dtype),), {})]
    return []


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


#: Modules whose forward picks a fast path by whether a ``TorchFunctionMode`` is active (``nn.TransformerEncoder``'s
#: nested-tensor path): the trace runs leaves outside its mode (``nn.MultiheadAttention``,
#: ``nn.TransformerEncoderLayer``), but not these containers, so for models holding one the trace's output may differ
#: from a plain forward in the last bits, and convert takes its reference from a plain forward.
MODE_SENSITIVE = (nn.TransformerEncoder, nn.TransformerEncoderLayer)


def plain_output(model: nn.Module, call: Call) -> Any:
    """``model(*args, **kwargs)`` in eval mode without grad (each module's training flag restored after)."""
    args, kwargs = call
    with eval_mode(model), torch.no_grad():
        return model(*args, **kwargs)


def same_output(a: Any, b: Any) -> bool:
    """Whether two outputs hold the same tensors (shapes and values, bit for bit)."""
    ta, tb = list(iter_tensors(a)), list(iter_tensors(b))
    return len(ta) == len(tb) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(ta, tb))


def _shapes(out: Any) -> list[tuple[int, ...]]:
    return [tuple(t.shape) for t in iter_tensors(out)]


def check_largest(model: nn.Module, largest: Any, reference: Any) -> None:
    """Raise unless the converted ``model``'s output at its largest subnet equals the original's, bit for bit.

    Raises:
        UnsupportedModelError: naming the largest absolute difference.
    """
    if same_output(largest, reference):
        return
    diffs = [
        (x.double() - y.double()).abs().max().item()
        for x, y in zip(iter_tensors(largest), iter_tensors(reference))
        if x.shape == y.shape
    ]
    raise UnsupportedModelError(
        f"the converted {type(model).__qualname__} at its largest subnet does not reproduce the original "
        f"model (max abs difference {max(diffs, default=float('nan')):.3g}); convert refuses rather than "
        "return a different model"
    )


def check_smallest(model: nn.Module, call: Call, reference: Any) -> None:
    """Run ``call`` on the converted ``model`` at its smallest subnet: it must run and return ``reference``'s shapes.

    Raises:
        UnsupportedModelError: the smallest subnet fails (the message names the module that was running) or
            changes an output shape.
    """
    state = state_of(model)
    args, kwargs = call
    running: list[str] = []
    paths = {id(m): name for name, m in model.named_modules()}
    handles = [
        m.register_forward_pre_hook(lambda mod, _args: running.append(paths.get(id(mod), "?")))
        for m in model.modules()
    ]

    def leave(*_: Any) -> None:  # (a forward hook that returns a value replaces the output)
        running.pop()

    handles += [m.register_forward_hook(leave) for m in model.modules()]
    state.local.plan = state.compile(state.space.min())  # pinned directly: no plan cached, no warning
    try:
        with eval_mode(model), torch.no_grad():
            out = model(*args, **kwargs)
    except Exception as exc:
        where = running[-1] if running else "<root>"
        raise UnsupportedModelError(
            f"the smallest subnet of the converted {type(model).__qualname__} fails in module {where!r} "
            f"({type(exc).__name__}: {exc}); this module reads channels convert sliced without knowing it"
        ) from exc
    finally:
        state.local.plan = None
        for h in handles:
            h.remove()
    if _shapes(out) != _shapes(reference):
        raise UnsupportedModelError(
            f"the smallest subnet of the converted {type(model).__qualname__} returns shapes {_shapes(out)}, "
            f"the original {_shapes(reference)}"
        )
