"""Check, on the real model, that a :class:`TransformerFamily` describes how the model computes (issue 11).

A family is a list of module paths; what it assumes cannot be read from them: that each encoder layer of the layer
list runs exactly once per forward, in order, each feeding the next (so skipping a layer is removing it), and that
narrower q/k/v projections give fewer heads of the same size (the attention reshapes by head size, not by its fixed
head count), and narrower FFN projections fewer neurons. Families break these silently: ALBERT runs one layer for
every position; DeBERTa-v2 reshapes q/k/v by its head count (unless its family says ``head_count_per_subnet``, which
the emulated run below then does too). So :func:`verify_family` runs the *unconverted* model on a tiny input, twice
(six times to name the culprit of a refusal), with forward hooks (and, for ``head_count_per_subnet``, the head-count
attribute set for the emulated run); the model is left exactly as it was:

1. a traced run counts the calls of every layer and projection and checks the chaining of the layers (it is also
   run 3 below);
2. an emulated run of the narrowest subnet: q/k/v and ``fc1`` (and gate) outputs cut to their first ``h * head_size`` /
   ``f`` features, the zero-padded inputs of the output projection and ``fc2`` -- exactly what the sliced operators
   compute, in the model's own forward;
3. a masked run of the full model with the output projection's input columns of heads ``>= h`` and ``fc2``'s
   input columns ``>= f`` zeroed: what "fewer whole heads and neurons" means, whatever the attention code does.

Runs 2 and 3 must agree; if they do not, the family is refused with the package's error, naming the module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UnsupportedModelError
from ..state import active_size
from .families import LayerParts, TransformerFamily

ExampleInputs = Callable[[nn.Module], Mapping[str, Any]]

# Relative tolerance of the emulated narrow subnet against the masked full model (both fp32 for fp32 models; they
# differ only in the summation order of the attention and projections).
_RTOL = {torch.float32: 1e-4, torch.float64: 1e-9}
_RTOL_LOW_PRECISION = 2e-2


def default_example_inputs(model: nn.Module) -> dict[str, torch.Tensor]:
    """A batch of 2 tiny inputs for ``model.main_input_name``: 8 random token ids, random images, a raw waveform of 8
    feature frames (Wav2Vec2, HuBERT) or random log-mel features (Whisper).

    Raises:
        UnsupportedModelError: another input kind (audio, multimodal): pass ``example_inputs`` to
            :func:`subnetact.hf.register_family`.
    """
    cfg = getattr(model, "config", None)
    name = getattr(model, "main_input_name", None)
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    gen = torch.Generator().manual_seed(0)
    if name == "input_ids" and isinstance(getattr(cfg, "vocab_size", None), int):
        seq = min(8, getattr(cfg, "max_position_embeddings", 8) or 8)
        return {"input_ids": torch.randint(0, cfg.vocab_size, (2, seq), generator=gen).to(device)}
    if name == "pixel_values" and cfg is not None:
        size = getattr(cfg, "image_size", None)
        h, w = (size, size) if isinstance(size, int) else tuple(size or ())[:2] or (None, None)
        channels = getattr(cfg, "num_channels", 3)
        if isinstance(h, int) and isinstance(w, int):
            dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
            return {"pixel_values": torch.randn(2, channels, h, w, generator=gen).to(device, dtype)}
    kernels, strides = getattr(cfg, "conv_kernel", None), getattr(cfg, "conv_stride", None)
    if name == "input_values" and kernels and strides and len(kernels) == len(strides):
        # Raw audio (Wav2Vec2, HuBERT): the shortest waveform whose convolutional feature encoder gives 8 frames.
        length = 8
        for kernel, stride in zip(reversed(kernels), reversed(strides)):
            length = (length - 1) * stride + kernel
        dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
        return {"input_values": torch.randn(2, length, generator=gen).to(device, dtype)}
    bins, frames = getattr(cfg, "num_mel_bins", None), getattr(cfg, "max_source_positions", None)
    if name == "input_features" and isinstance(bins, int) and isinstance(frames, int):
        # Log-mel features (Whisper): the encoder takes exactly 2 * max_source_positions frames (its second
        # convolution has stride 2) and refuses any other length.
        dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
        return {"input_features": torch.randn(2, bins, 2 * frames, generator=gen).to(device, dtype)}
    raise UnsupportedModelError(
        f"{type(model).__qualname__}: cannot build a tiny example input to verify its transformer family "
        f"(main_input_name={name!r}); pass example_inputs=lambda model: {{...}} to subnetact.hf.register_family"
    )


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    if isinstance(value, Mapping):
        return next((v for v in value.values() if isinstance(v, torch.Tensor)), None)
    return None


def _main_output(out: Any) -> torch.Tensor:
    tensor = _first_tensor(out)
    if tensor is None and hasattr(out, "to_tuple"):
        tensor = _first_tensor(out.to_tuple())
    if tensor is None:
        raise UnsupportedModelError(
            f"the model's forward returned {type(out).__qualname__}, with no tensor to compare outputs by"
        )
    return tensor


class _Hooks:
    """Forward hooks installed for one run and always removed."""

    def __init__(self) -> None:
        self.handles: list[torch.utils.hooks.RemovableHandle] = []

    def post(self, module: nn.Module, fn: Callable, with_kwargs: bool = False) -> None:
        self.handles.append(module.register_forward_hook(fn, with_kwargs=with_kwargs))

    def pre(self, module: nn.Module, fn: Callable) -> None:
        self.handles.append(module.register_forward_pre_hook(fn))

    def __enter__(self) -> _Hooks:
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()


def _cut(n: int) -> Callable:
    return lambda module, args, out: out[..., :n].contiguous()


def _pad(n: int, full: int) -> Callable:
    return lambda module, args: (F.pad(args[0], (0, full - n)), *args[1:])


def _mask(n: int) -> Callable:
    def hook(module: nn.Module, args: tuple) -> tuple:
        x = args[0].clone()
        x[..., n:] = 0
        return (x, *args[1:])

    return hook


def _run(model: nn.Module, inputs: Mapping[str, Any]) -> torch.Tensor:
    return _main_output(model(**inputs)).detach().clone()


def verify_family(
    model: nn.Module,
    family: TransformerFamily,
    layers_path: str,
    parts: list[LayerParts],
    widths: tuple[float, ...],
    example_inputs: ExampleInputs | None = None,
) -> None:
    """Raise :class:`~subnetact.UnsupportedModelError` unless ``family`` describes ``model`` (see the module
    docstring). ``model`` is unconverted and left exactly as it was (hooks removed, train/eval flags restored).

    Args:
        layers_path: path of the family's layer list; ``parts``: its layers' elastic modules.
        widths: the space's width choices; the narrowest subnet (``min(widths)`` heads and FFN everywhere) is run.
        example_inputs: ``model -> kwargs`` of a tiny forward (default: :func:`default_example_inputs`).
    """
    inputs = (example_inputs or default_example_inputs)(model)
    w = min(widths)
    # A family with a per-head bias keeps every head (the space has no heads dimension).
    heads = [
        p.heads * p.head_size if family.per_head_bias else active_size(w, p.heads * p.head_size, p.head_size)
        for p in parts
    ]
    ffn = [active_size(w, p.ffn) for p in parts]
    narrow = any(h != p.heads * p.head_size or f != p.ffn for h, f, p in zip(heads, ffn, parts))
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()  # dropout would make the runs differ
        with torch.no_grad():
            # Run 1 is also run 3 (the masked model, when the space has narrower subnets): the structure is the same.
            h, f = (heads, ffn) if narrow else (None, None)
            masked = _trace(model, family, layers_path, parts, inputs, h, f)
            if not narrow or _mismatch(model, family, parts, inputs, heads, ffn, masked) is None:
                return
            for what, h, f in (("heads", heads, None), ("FFN neurons", None, ffn)):
                found = _mismatch(model, family, parts, inputs, h, f)
                if found is not None:
                    _refuse(model, family, parts, what, h, f, *found)
            raise UnsupportedModelError(
                f"{type(model).__qualname__}: the {family.name} family runs fewer heads and fewer FFN neurons "
                "correctly one at a time but not together; refused"
            )
    finally:
        for m, training in modes.items():
            m.training = training


def _trace(
    model: nn.Module,
    family: TransformerFamily,
    layers_path: str,
    parts: list[LayerParts],
    inputs: Mapping,
    heads: list[int] | None,
    ffn: list[int] | None,
) -> list[torch.Tensor]:
    """Run 1: every layer once, in order, each fed the previous one's output; every projection called. With
    ``heads`` / ``ffn`` it runs the masked model (run 3); returns the captured outputs (see :func:`_narrow_run`)."""
    calls: list[tuple[int, torch.Tensor | None, torch.Tensor | None]] = []
    counts: dict[str, int] = {}

    def layer_hook(i: int) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
            x = _first_tensor(args) if args else kwargs.get("hidden_states")
            calls.append((i, x, _first_tensor(out)))

        return hook

    def count(path: str) -> Callable:
        def hook(module: nn.Module, args: tuple, out: Any) -> None:
            counts[path] = counts.get(path, 0) + 1

        return hook

    names = (family.query, family.key, family.value, family.out, family.fc1, family.fc2)
    names += () if family.gate is None else (family.gate,)

    def trace_hooks(hooks: _Hooks) -> None:
        for i, p in enumerate(parts):
            hooks.post(p.layer, layer_hook(i), with_kwargs=True)
            for name in names:
                hooks.post(p.layer.get_submodule(name), count(f"{p.path}.{name}"))

    try:
        masked = _narrow_run(model, family, parts, inputs, heads, ffn, emulate=False, extra=trace_hooks)
    except Exception as exc:
        raise UnsupportedModelError(
            f"{type(model).__qualname__}: the tiny forward that verifies the {family.name} family failed "
            f"({type(exc).__name__}: {exc}); pass example_inputs to subnetact.hf.register_family"
        ) from exc
    order = [i for i, _, _ in calls]
    for i, p in enumerate(parts):
        n = order.count(i)
        if n != 1:
            shared = (
                f"; one layer shared by several positions (ALBERT's cross-layer parameter sharing: "
                f"num_hidden_layers={getattr(getattr(model, 'config', None), 'num_hidden_layers', '?')}, "
                f"{len(parts)} layer module(s)) cannot be given a depth or a width per position"
                if n > 1
                else ""
            )
            raise UnsupportedModelError(
                f"{type(model).__qualname__}: {p.path} ({type(p.layer).__qualname__}) runs {n} times in one "
                f"forward; the {family.name} family needs each layer of {layers_path!r} to run exactly once{shared}. "
                "Refused: the actuated and exported subnets would differ"
            )
    layers_in_config = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if isinstance(layers_in_config, int) and layers_in_config != len(parts):
        raise UnsupportedModelError(
            f"{type(model).__qualname__}: config.num_hidden_layers={layers_in_config} but {layers_path!r} holds "
            f"{len(parts)} layers; an exported subnet's config sets num_hidden_layers to its depth, which this "
            "model reads differently (ALBERT: applications of a layer group), so the export would be wrong"
        )
    if order != sorted(order):
        raise UnsupportedModelError(
            f"{type(model).__qualname__}: the layers of {layers_path!r} run in the order {order}, not in list order; "
            "LayerSelectList keeps layers in list order"
        )
    for (i, _, y), (j, x, _) in zip(calls, calls[1:]):
        if x is None or y is None or x.shape != y.shape or not torch.equal(x, y):
            raise UnsupportedModelError(
                f"{type(model).__qualname__}: {parts[j].path} is not fed the output of {parts[i].path}, so skipping "
                "a layer is not the same as removing it; the family's layer list is not a residual chain"
            )
    for p in parts:
        for name in names:
            if counts.get(f"{p.path}.{name}", 0) == 0:
                raise UnsupportedModelError(
                    f"{type(model).__qualname__}: {p.path}.{name} never runs in the forward; the {family.name} "
                    "family's paths do not describe how this model computes"
                )
    return masked


def _narrow_run(
    model: nn.Module,
    family: TransformerFamily,
    parts: list[LayerParts],
    inputs: Mapping,
    heads: list[int] | None,
    ffn: list[int] | None,
    *,
    emulate: bool,
    extra: Callable[[_Hooks], None] | None = None,
) -> list[torch.Tensor]:
    """Run the model with ``heads`` (head features kept per layer) and/or ``ffn`` (neurons kept per layer) emulated
    (run 2) or masked (run 3); neither: the plain model. Returns the outputs of every layer's output projection and
    ``fc2`` (``2 * layer`` and ``2 * layer + 1``), then the model's main output."""

    def capture(store: list) -> Callable:
        return lambda module, args, out: store.append(out.detach().clone())

    seen: list[torch.Tensor] = []
    with _Hooks() as hooks:
        for i, p in enumerate(parts):
            if heads is not None:
                if emulate:
                    for name in (family.query, family.key, family.value, *(name for name, _ in p.extras)):
                        hooks.post(p.layer.get_submodule(name), _cut(heads[i]))
                    if family.head_count_per_subnet:
                        setattr(p.attention, family.heads_attr, heads[i] // p.head_size)
                hooks.pre(p.out, _pad(heads[i], p.heads * p.head_size) if emulate else _mask(heads[i]))
            if ffn is not None:
                if emulate:
                    hooks.post(p.fc1, _cut(ffn[i]))
                    if p.gate is not None:
                        hooks.post(p.gate, _cut(ffn[i]))
                hooks.pre(p.fc2, _pad(ffn[i], p.ffn) if emulate else _mask(ffn[i]))
            hooks.post(p.out, capture(seen))
            hooks.post(p.fc2, capture(seen))
        if extra is not None:
            extra(hooks)
        try:
            seen.append(_run(model, inputs))
        finally:
            if emulate and heads is not None and family.head_count_per_subnet:  # what the operator does, undone
                for p in parts:
                    setattr(p.attention, family.heads_attr, p.heads)
    return seen


def _mismatch(
    model: nn.Module,
    family: TransformerFamily,
    parts: list[LayerParts],
    inputs: Mapping,
    heads: list[int] | None,
    ffn: list[int] | None,
    masked: list[torch.Tensor] | None = None,
) -> tuple[str, int] | None:
    """Runs 2 and 3 with the same ``heads`` / ``ffn`` (run 3 unless given as ``masked``): the outputs of every
    layer's attention output projection and ``fc2`` must agree, layer by layer (the final output alone can hide a
    wrong head split under a classifier's small scale). Returns (what differs, index of the first differing output:
    ``2 * layer`` for the output projection, ``2 * layer + 1`` for fc2), or None."""
    if masked is None:
        masked = _narrow_run(model, family, parts, inputs, heads, ffn, emulate=False)
    error, where = None, 0
    try:
        emulated = _narrow_run(model, family, parts, inputs, heads, ffn, emulate=True)
    except Exception as exc:  # a narrower projection that the model's code cannot reshape
        error = f"the forward fails ({type(exc).__name__}: {exc})"
    else:
        for k, (a, b) in enumerate(zip(emulated, masked)):
            if a.shape != b.shape:
                error, where = f"an output has shape {tuple(a.shape)} instead of {tuple(b.shape)}", k
                break
            scale = b.abs().max().item() or 1.0
            diff = (a.float() - b.float()).abs().max().item()
            if diff > _RTOL.get(b.dtype, _RTOL_LOW_PRECISION) * scale:
                error, where = f"an output differs from the masked full model by {diff:.3g} (scale {scale:.3g})", k
                break
        if error is None:
            return None
    return error, where


def _refuse(
    model: nn.Module,
    family: TransformerFamily,
    parts: list[LayerParts],
    what: str,
    heads: list[int] | None,
    ffn: list[int] | None,
    error: str,
    where: int,
) -> None:
    p = parts[min(where // 2, len(parts) - 1)]
    name = family.attention if heads is not None else family.fc1
    module = p.layer.get_submodule(name)
    narrow = (
        f"{heads[0] // parts[0].head_size} of {parts[0].heads} heads"
        if heads is not None
        else f"{ffn[0]} of {parts[0].ffn} neurons"
    )
    if heads is None:
        hint = "; the FFN must apply an elementwise activation between fc1 and fc2"
    elif family.head_count_per_subnet:
        hint = (
            "; every projection whose output the attention splits into heads must be named by the family "
            "(query, key, value, extra_head_projections)"
        )
    else:
        hint = (
            "; the attention must reshape q/k/v by head size (view(B, T, -1, head_size)); one that reshapes by its "
            "head-count attribute (DeBERTa-v2) needs head_count_per_subnet=True"
        )
    raise UnsupportedModelError(
        f"{type(model).__qualname__}: the {family.name} family runs fewer {what} wrongly at "
        f"{p.path}.{name} ({type(module).__qualname__}): with {narrow} per layer {error}{hint}. "
        "Refused: the actuated subnet would not be the subnet it names"
    )
