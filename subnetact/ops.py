"""Custom operators of subnetact (namespace ``subnetact``): sliced linear and sliced convolution.

Each op's identity lives here and always exists: the schema, a validating public wrapper, a fake (meta) kernel for
``torch.compile``, the autograd formula and a pure-PyTorch reference kernel registered as
``CompositeExplicitAutograd`` (it runs on every device). The optional compiled extension ``subnetact_cuda._C``
adds exactly one thing, a ``CUDA`` kernel for the same ops (``TORCH_LIBRARY_IMPL(subnetact, CUDA, m)``), which the
dispatcher then prefers for CUDA tensors. See ``docs/cuda.md`` and issue 7.

Both ops take the *full* shared weight plus the active sizes, not a sliced view, so the contract "reads
``W[:o, :i]`` in place" is part of the op and gradients land in the shared Parameter (zero outside the slice).

Importing this module defines the ops; it never initialises CUDA and never loads the extension. The extension is
loaded the first time a public wrapper sees a CUDA tensor (or when a ``WeightSlice`` layer plans a CUDA subnet).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .checks import is_int
from .errors import SubnetActError

__all__ = ["ACTIVATIONS", "OpArgumentError", "fold_norm", "sliced_conv2d", "sliced_linear"]

#: Activations ``sliced_linear`` can apply. ``"gelu"`` is the exact (erf) GELU of BERT; ``"gelu_tanh"`` is the tanh
#: approximation, which the CUDA kernel fuses into the GEMM epilogue (cuBLASLt's GELU epilogue is the tanh form).
ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh")


class OpArgumentError(SubnetActError, ValueError):
    """An argument of a ``subnetact`` op has the wrong shape, dtype, device or value."""


# ---------------------------------------------------------------------------------------------------------------
# sliced_linear
# ---------------------------------------------------------------------------------------------------------------
torch.library.define(
    "subnetact::sliced_linear",
    "(Tensor x, Tensor weight, Tensor? bias, SymInt out_features, SymInt in_features, str activation) -> Tensor",
)


def sliced_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out_features: int | None = None,
    in_features: int | None = None,
    activation: str = "none",
) -> torch.Tensor:
    """``act(x @ weight[:out_features, :in_features].T + bias[:out_features])``, reading the slice in place.

    Args:
        x: (..., in_features) input.
        weight: (O, I) full shared weight, any strides; only ``weight[:out_features, :in_features]`` is read.
        bias: optional (O,) full shared bias; only ``bias[:out_features]`` is read.
        out_features: active output features (default: O, the whole dimension).
        in_features: active input features (default: ``x.shape[-1]``).
        activation: one of :data:`ACTIVATIONS` (default ``"none"``).

    Returns:
        (..., out_features) tensor, contiguous, dtype of ``x``.

    Raises:
        OpArgumentError: (a ``ValueError``) naming the argument, its value and what is allowed.

    Example::

        >>> w, b = torch.randn(768, 768), torch.randn(768)
        >>> y = sliced_linear(torch.randn(8, 384), w, b, out_features=512, activation="gelu")  # (8, 512)
    """
    out_features = weight.shape[0] if out_features is None and weight.dim() == 2 else out_features
    in_features = x.shape[-1] if in_features is None and x.dim() >= 1 else in_features
    _check_linear(x, weight, bias, out_features, in_features, activation)
    if x.is_cuda and not _EXTENSION_TRIED:
        _try_load_extension()
    return torch.ops.subnetact.sliced_linear.default(x, weight, bias, out_features, in_features, activation)


def _check_linear(x, weight, bias, out_features, in_features, activation) -> None:
    if activation not in ACTIVATIONS:
        raise OpArgumentError(f"sliced_linear: activation={activation!r} is not supported; use one of {ACTIVATIONS}")
    if weight.dim() != 2:
        raise OpArgumentError(f"sliced_linear: weight must be 2-D (O, I), got shape {tuple(weight.shape)}")
    if x.dim() < 1:
        raise OpArgumentError("sliced_linear: x must have at least one dimension (..., in_features), got a scalar")
    o_full, i_full = weight.shape
    if not 1 <= out_features <= o_full:
        raise OpArgumentError(
            f"sliced_linear: out_features={out_features!r} must be in [1, {o_full}] (weight.shape[0])"
        )
    if not 1 <= in_features <= i_full:
        raise OpArgumentError(f"sliced_linear: in_features={in_features!r} must be in [1, {i_full}] (weight.shape[1])")
    if x.shape[-1] != in_features:
        raise OpArgumentError(
            f"sliced_linear: x.shape[-1]={x.shape[-1]} must equal in_features={in_features} (x.shape={tuple(x.shape)})"
        )
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != o_full):
        raise OpArgumentError(
            f"sliced_linear: bias must have shape ({o_full},) like weight.shape[0], got {tuple(bias.shape)}"
        )
    _check_same(
        "sliced_linear",
        x,
        {"weight": weight, "bias": bias},
    )


def _linear_reference(x, weight, bias, out_features, in_features, activation):
    y = F.linear(x, weight[:out_features, :in_features], None if bias is None else bias[:out_features])
    return _activate(y, activation)


def _activate(y: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "relu":
        return torch.relu(y)
    if activation == "gelu":
        return F.gelu(y)
    if activation == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    torch._check(activation == "none", lambda: f"sliced_linear: unknown activation {activation!r}")
    return y


@torch.library.register_fake("subnetact::sliced_linear")
def _sliced_linear_fake(x, weight, bias, out_features, in_features, activation):
    torch._check(weight.dim() == 2, lambda: f"sliced_linear: weight must be 2-D, got {weight.dim()}-D")
    torch._check(x.shape[-1] == in_features, lambda: "sliced_linear: x.shape[-1] must equal in_features")
    return x.new_empty((*x.shape[:-1], out_features))


def _sliced_linear_setup_context(ctx, inputs, output):
    x, weight, bias, out_features, in_features, activation = inputs
    ctx.sizes = (out_features, in_features)
    ctx.activation = activation
    ctx.has_bias = bias is not None
    # ReLU's derivative needs the output; the GELUs need the pre-activation, recomputed in backward (no extra
    # activation memory kept for inference-style use).
    ctx.save_for_backward(x, weight, bias, output if activation == "relu" else None)


def _sliced_linear_backward(ctx, grad):
    x, weight, bias, output = ctx.saved_tensors
    o, i = ctx.sizes
    w = weight[:o, :i]
    if ctx.activation == "relu":
        grad = torch.ops.aten.threshold_backward(grad, output, 0)
    elif ctx.activation in ("gelu", "gelu_tanh"):
        pre = F.linear(x, w, None if bias is None else bias[:o])
        approximate = "tanh" if ctx.activation == "gelu_tanh" else "none"
        grad = torch.ops.aten.gelu_backward(grad, pre, approximate=approximate)
    g2 = grad.reshape(-1, o)  # (B, o)
    grad_x = grad_w = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_x = (g2 @ w).reshape(x.shape)  # (..., i)
    if ctx.needs_input_grad[1]:
        grad_w = torch.zeros_like(weight)  # (O, I): zero outside the slice
        grad_w[:o, :i] = g2.t() @ x.reshape(-1, i)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_b = torch.zeros_like(bias)
        grad_b[:o] = g2.sum(0)
    return grad_x, grad_w, grad_b, None, None, None


torch.library.register_autograd(
    "subnetact::sliced_linear", _sliced_linear_backward, setup_context=_sliced_linear_setup_context
)
torch.library.impl("subnetact::sliced_linear", "CompositeExplicitAutograd", func=_linear_reference)


# ---------------------------------------------------------------------------------------------------------------
# sliced_conv2d
# ---------------------------------------------------------------------------------------------------------------
torch.library.define(
    "subnetact::sliced_conv2d",
    "(Tensor x, Tensor weight, Tensor? scale, Tensor? shift, Tensor? residual, SymInt out_channels, "
    "SymInt in_channels, int[2] stride, int[2] padding, int[2] dilation, SymInt groups, bool relu) -> Tensor",
)


def sliced_conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    out_channels: int | None = None,
    in_channels: int | None = None,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    groups: int = 1,
    relu: bool = False,
) -> torch.Tensor:
    """Convolution with ``weight[:out_channels, :in_channels]`` read in place, and a fused epilogue.

    Computes ``z = conv2d(x, weight[:o, :i], stride, padding, dilation, groups)`` then, per output channel ``c``,
    ``z = z * scale[c] + shift[c]`` (each optional), ``z = z + residual`` (optional), ``z = relu(z)`` (optional).
    ``scale`` / ``shift`` are a SubnetNorm folded for the active subnet (see :func:`fold_norm`); a convolution bias
    is a ``shift`` without ``scale``. Use a channels-last (KRSC) weight so every ``[:o, :i]`` slice has unit
    channel stride: the CUDA kernel reads any strides, but unit channel stride is what makes its loads coalesce.

    Args:
        x: (N, i * groups, H, W) input, any memory format.
        weight: (O, I, kh, kw) full shared weight, any strides; ``weight[:out_channels, :in_channels]`` is read.
        scale: optional (>= out_channels,) per-channel multiplier; ``scale[:out_channels]`` is read.
        shift: optional (>= out_channels,) per-channel addend; ``shift[:out_channels]`` is read.
        residual: optional (N, out_channels, H', W') tensor added before the ReLU.
        out_channels: active output channels o (default O); a multiple of ``groups``.
        in_channels: active input channels *per group* i (default I = ``weight.shape[1]``).
        stride, padding, dilation: as ``F.conv2d`` (ints or pairs; numeric padding only).
        groups: as ``F.conv2d``.
        relu: apply ReLU last.

    Returns:
        (N, out_channels, H', W') tensor in ``x``'s memory format (channels-last if ``x`` is), dtype of ``x``.

    Raises:
        OpArgumentError: (a ``ValueError``) naming the argument, its value and what is allowed.

    Example::

        >>> w = torch.randn(256, 128, 3, 3).to(memory_format=torch.channels_last)
        >>> scale, shift = fold_norm(mean, var, gamma, beta, eps=1e-5)
        >>> y = sliced_conv2d(x, w, scale=scale, shift=shift, out_channels=192, in_channels=96, padding=1, relu=True)
    """
    out_channels = weight.shape[0] if out_channels is None and weight.dim() == 4 else out_channels
    in_channels = weight.shape[1] if in_channels is None and weight.dim() == 4 else in_channels
    stride, padding, dilation = _pair("stride", stride), _pair("padding", padding), _pair("dilation", dilation)
    _check_conv(x, weight, scale, shift, residual, out_channels, in_channels, stride, padding, dilation, groups)
    if x.is_cuda and not _EXTENSION_TRIED:
        _try_load_extension()
    return torch.ops.subnetact.sliced_conv2d.default(
        x, weight, scale, shift, residual, out_channels, in_channels, stride, padding, dilation, groups, relu
    )


def _pair(name: str, value) -> list[int]:
    if is_int(value):
        return [value, value]
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return list(value)
    raise OpArgumentError(
        f"sliced_conv2d: {name}={value!r} must be an int or a pair of ints (string padding such as "
        "'same' is not supported; pass the numbers)"
    )


def _conv_out_hw(h, w, weight, stride, padding, dilation):
    kh, kw = weight.shape[2], weight.shape[3]
    out_h = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    out_w = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    return out_h, out_w


def _check_conv(x, weight, scale, shift, residual, out_channels, in_channels, stride, padding, dilation, groups):
    if weight.dim() != 4:
        raise OpArgumentError(f"sliced_conv2d: weight must be 4-D (O, I, kh, kw), got shape {tuple(weight.shape)}")
    if x.dim() != 4:
        raise OpArgumentError(f"sliced_conv2d: x must be 4-D (N, C, H, W), got shape {tuple(x.shape)}")
    if any(s < 1 for s in stride) or any(d < 1 for d in dilation) or any(p < 0 for p in padding):
        raise OpArgumentError(
            f"sliced_conv2d: need stride >= 1, dilation >= 1, padding >= 0; got stride={stride}, "
            f"dilation={dilation}, padding={padding}"
        )
    if not isinstance(groups, int) or groups < 1:
        raise OpArgumentError(f"sliced_conv2d: groups={groups!r} must be a positive int")
    o_full, i_full = weight.shape[0], weight.shape[1]
    if not 1 <= out_channels <= o_full or out_channels % groups:
        raise OpArgumentError(
            f"sliced_conv2d: out_channels={out_channels!r} must be in [1, {o_full}] (weight.shape[0]) and a multiple "
            f"of groups={groups}"
        )
    if not 1 <= in_channels <= i_full:
        raise OpArgumentError(
            f"sliced_conv2d: in_channels={in_channels!r} (per group) must be in [1, {i_full}] (weight.shape[1])"
        )
    if x.shape[1] != in_channels * groups:
        raise OpArgumentError(
            f"sliced_conv2d: x has {x.shape[1]} channels, expected in_channels * groups = {in_channels} * {groups} "
            f"= {in_channels * groups}"
        )
    out_h, out_w = _conv_out_hw(x.shape[2], x.shape[3], weight, stride, padding, dilation)
    if out_h < 1 or out_w < 1:
        raise OpArgumentError(
            f"sliced_conv2d: input of size {tuple(x.shape[2:])} is too small for kernel {tuple(weight.shape[2:])} "
            f"with padding={padding}, dilation={dilation} (output would be {out_h}x{out_w})"
        )
    for name, t in (("scale", scale), ("shift", shift)):
        if t is not None and (t.dim() != 1 or t.shape[0] < out_channels):
            raise OpArgumentError(
                f"sliced_conv2d: {name} must be 1-D with at least out_channels={out_channels} entries, "
                f"got shape {tuple(t.shape)}"
            )
    expected = (x.shape[0], out_channels, out_h, out_w)
    if residual is not None and tuple(residual.shape) != expected:
        raise OpArgumentError(
            f"sliced_conv2d: residual must have the output's shape {expected}, got {tuple(residual.shape)}"
        )
    _check_same("sliced_conv2d", x, {"weight": weight, "scale": scale, "shift": shift, "residual": residual})


def _out_memory_format(x: torch.Tensor) -> torch.memory_format:
    # One rule shared by the reference, the fake and the CUDA kernel (csrc), so their output strides agree.
    if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        return torch.channels_last
    return torch.contiguous_format


def _conv_reference(
    x, weight, scale, shift, residual, out_channels, in_channels, stride, padding, dilation, groups, relu
):
    w = weight[:out_channels, :in_channels]
    y = F.conv2d(x, w, None, stride, padding, dilation, groups)  # (N, o, H', W')
    if scale is not None:
        y = y * scale[:out_channels, None, None]
    if shift is not None:
        y = y + shift[:out_channels, None, None]
    if residual is not None:
        y = y + residual
    if relu:
        y = torch.relu(y)
    return y.contiguous(memory_format=_out_memory_format(x))


@torch.library.register_fake("subnetact::sliced_conv2d")
def _sliced_conv2d_fake(
    x, weight, scale, shift, residual, out_channels, in_channels, stride, padding, dilation, groups, relu
):
    torch._check(weight.dim() == 4 and x.dim() == 4, lambda: "sliced_conv2d: x and weight must be 4-D")
    torch._check(x.shape[1] == in_channels * groups, lambda: "sliced_conv2d: x.shape[1] != in_channels * groups")
    out_h, out_w = _conv_out_hw(x.shape[2], x.shape[3], weight, stride, padding, dilation)
    shape = (x.shape[0], out_channels, out_h, out_w)
    return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=_out_memory_format(x))


def _sliced_conv2d_setup_context(ctx, inputs, output):
    x, weight, scale, shift, residual, out_channels, in_channels, stride, padding, dilation, groups, relu = inputs
    ctx.args = (out_channels, in_channels, stride, padding, dilation, groups, relu)
    ctx.has = (scale is not None, shift is not None, residual is not None)
    ctx.save_for_backward(x, weight, scale, shift, output if relu else None)


def _sliced_conv2d_backward(ctx, grad):
    x, weight, scale, shift, output = ctx.saved_tensors
    o, i, stride, padding, dilation, groups, relu = ctx.args
    has_scale, has_shift, has_residual = ctx.has
    need = ctx.needs_input_grad
    w = weight[:o, :i]
    if relu:
        grad = torch.ops.aten.threshold_backward(grad, output, 0)  # (N, o, H', W')
    grad_x = grad_w = grad_scale = grad_shift = grad_residual = None
    if has_residual and need[4]:
        grad_residual = grad
    if has_shift and need[3]:
        grad_shift = torch.zeros_like(shift)
        grad_shift[:o] = grad.sum((0, 2, 3))
    if has_scale:
        if need[2]:
            conv = F.conv2d(x, w, None, stride, padding, dilation, groups)  # recomputed, not kept from forward
            grad_scale = torch.zeros_like(scale)
            grad_scale[:o] = (grad * conv).sum((0, 2, 3))
        grad = grad * scale[:o, None, None]
    if need[0] or need[1]:
        gx, gw, _ = torch.ops.aten.convolution_backward(
            grad, x, w, None, stride, padding, dilation, False, [0, 0], groups, [need[0], need[1], False]
        )
        grad_x = gx
        if need[1]:
            grad_w = torch.zeros_like(weight)  # zero outside the slice
            grad_w[:o, :i] = gw
    return grad_x, grad_w, grad_scale, grad_shift, grad_residual, None, None, None, None, None, None, None


torch.library.register_autograd(
    "subnetact::sliced_conv2d", _sliced_conv2d_backward, setup_context=_sliced_conv2d_setup_context
)
torch.library.impl("subnetact::sliced_conv2d", "CompositeExplicitAutograd", func=_conv_reference)


# ---------------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------------
def fold_norm(
    mean: torch.Tensor,
    var: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    *,
    eps: float,
    conv_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold an eval-mode BatchNorm / SubnetNorm (and an optional preceding conv bias) into ``scale`` / ``shift``.

    ``bn(conv(x) + conv_bias) == conv(x) * scale + shift`` per channel.

    Args:
        mean, var: (k,) the subnet's running statistics.
        weight, bias: (>= k,) affine parameters (None: identity); the first k entries are used.
        eps: the norm's epsilon.
        conv_bias: optional (>= k,) bias of the preceding convolution.

    Returns:
        ``(scale, shift)``, each (k,) in ``mean``'s dtype.
    """
    k = mean.shape[0]
    scale = torch.rsqrt(var + eps)
    if weight is not None:
        scale = scale * weight[:k]
    shift = -mean * scale
    if conv_bias is not None:
        shift = shift + conv_bias[:k] * scale
    if bias is not None:
        shift = shift + bias[:k]
    return scale, shift


def _check_same(op: str, x: torch.Tensor, others: dict[str, torch.Tensor | None]) -> None:
    for name, t in others.items():
        if t is None:
            continue
        if t.dtype != x.dtype:
            raise OpArgumentError(f"{op}: {name} has dtype {t.dtype}, expected x's dtype {x.dtype}")
        if t.device != x.device:
            raise OpArgumentError(f"{op}: {name} is on {t.device}, expected x's device {x.device}")


_EXTENSION_TRIED = False


def _try_load_extension() -> None:
    # Lazy, once: the first CUDA call loads subnetact_cuda._C if it was built (and not disabled by
    # SUBNETACT_DISABLE_EXTENSION=1); otherwise CUDA tensors run the reference kernels above.
    global _EXTENSION_TRIED
    _EXTENSION_TRIED = True
    import subnetact_cuda

    subnetact_cuda.available()
