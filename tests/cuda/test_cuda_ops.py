"""``subnetact::sliced_linear`` / ``subnetact::sliced_conv2d``: reference kernels on CPU, CUDA kernels when built.

CPU tests always run (reference kernels). Tests marked ``requires_kernels`` need a GPU and the compiled extension;
they are skipped elsewhere. Tolerances for the CUDA kernels follow flash-attention: the kernel's error against a
float64 reference may be at most twice PyTorch's own error in the same dtype (plus a tiny absolute floor).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import subnetact_cuda
from subnetact import ops
from subnetact.ops import OpArgumentError

_HAS_GPU = torch.cuda.is_available()


def _kernels_built() -> bool:
    return _HAS_GPU and subnetact_cuda.available() and "CUDA" in torch._C._dispatch_dump("subnetact::sliced_conv2d")


requires_kernels = pytest.mark.skipif(not _kernels_built(), reason="needs a GPU and the built subnetact_cuda._C")

# (name, x shape, weight shape, out, in, bias, activation)
LINEAR_CASES = [
    ("full", (4, 16), (16, 16), 16, 16, True, "none"),
    ("slice_relu", (3, 5, 11), (24, 16), 13, 11, True, "relu"),
    ("slice_gelu_nobias", (7, 9), (20, 12), 17, 9, False, "gelu"),
    ("slice_gelu_tanh", (1, 12), (20, 12), 1, 12, True, "gelu_tanh"),
]

# (name, N, x channels, H, W, weight shape, out, in per group, stride, padding, dilation, groups, epilogue)
CONV_CASES = [
    ("1x1", 2, 12, 7, 7, (16, 16, 1, 1), 10, 12, 1, 0, 1, 1, "none"),
    ("3x3_bn_relu", 2, 6, 9, 8, (16, 8, 3, 3), 11, 6, 1, 1, 1, 1, "bn_relu"),
    ("3x3_s2_residual", 1, 8, 10, 10, (8, 8, 3, 3), 5, 8, 2, 1, 1, 1, "bn_res_relu"),
    ("grouped", 2, 8, 6, 6, (16, 2, 3, 3), 12, 2, 1, 1, 1, 4, "bn_relu"),  # ResNeXt-style, 4 of 8 groups
    ("depthwise", 2, 9, 7, 7, (12, 1, 5, 5), 9, 1, 2, 2, 1, 9, "bn_relu"),  # MobileNetV3-style
    ("dilated", 1, 4, 11, 9, (6, 5, 3, 3), 6, 4, 1, 2, 2, 1, "shift"),
]


def _linear_args(case, dtype=torch.float32, device="cpu", grad=False):
    _, xs, ws, o, i, has_bias, act = case
    g = torch.Generator().manual_seed(0)
    x = torch.randn(xs, generator=g, dtype=torch.float64).to(device, dtype)
    w = torch.randn(ws, generator=g, dtype=torch.float64).to(device, dtype)
    b = torch.randn(ws[0], generator=g, dtype=torch.float64).to(device, dtype) if has_bias else None
    for t in (x, w, b):
        if t is not None:
            t.requires_grad_(grad)
    return x, w, b, o, i, act


def _conv_args(case, dtype=torch.float32, device="cpu", grad=False, channels_last=True):
    _, n, c, h, w_, ws, o, i, s, p, d, groups, epi = case
    g = torch.Generator().manual_seed(1)

    def rand(*shape):
        return torch.randn(shape, generator=g, dtype=torch.float64).to(device, dtype)

    x = rand(n, c, h, w_)
    weight = rand(*ws)
    if channels_last:  # KRSC: every [:o, :i] slice has unit channel stride
        x = x.to(memory_format=torch.channels_last)
        weight = weight.to(memory_format=torch.channels_last)
    scale = rand(ws[0]).abs() + 0.5 if epi.startswith("bn") else None
    shift = rand(ws[0]) if epi != "none" else None
    out_h = (h + 2 * p - d * (ws[2] - 1) - 1) // s + 1
    out_w = (w_ + 2 * p - d * (ws[3] - 1) - 1) // s + 1
    residual = rand(n, o, out_h, out_w) if "res" in epi else None
    for t in (x, weight, scale, shift, residual):
        if t is not None:
            t.requires_grad_(grad)
    return x, weight, scale, shift, residual, o, i, [s, s], [p, p], [d, d], groups, epi.endswith("relu")


def _conv_composite(x, weight, scale, shift, residual, o, i, stride, padding, dilation, groups, relu):
    # The op's meaning, spelled with PyTorch ops on a packed copy of the slice (independent of ops.py's reference).
    y = F.conv2d(x, weight[:o, :i].contiguous(), None, stride, padding, dilation, groups)
    if scale is not None:
        y = y * scale[:o].view(1, -1, 1, 1)
    if shift is not None:
        y = y + shift[:o].view(1, -1, 1, 1)
    if residual is not None:
        y = y + residual
    return y.relu() if relu else y


def _linear_composite(x, w, b, o, i, act):
    y = x @ w[:o, :i].contiguous().t()
    if b is not None:
        y = y + b[:o]
    return {"none": y, "relu": y.relu(), "gelu": F.gelu(y), "gelu_tanh": F.gelu(y, approximate="tanh")}[act]


# -- reference kernels on CPU ------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", LINEAR_CASES, ids=[c[0] for c in LINEAR_CASES])
def test_sliced_linear_opcheck_cpu(case):
    opcheck(torch.ops.subnetact.sliced_linear.default, _linear_args(case, grad=True))


@pytest.mark.parametrize("case", CONV_CASES, ids=[c[0] for c in CONV_CASES])
@pytest.mark.parametrize("channels_last", [True, False], ids=["krsc", "kcrs"])
def test_sliced_conv2d_opcheck_cpu(case, channels_last):
    opcheck(torch.ops.subnetact.sliced_conv2d.default, _conv_args(case, grad=True, channels_last=channels_last))


@pytest.mark.parametrize("case", LINEAR_CASES, ids=[c[0] for c in LINEAR_CASES])
def test_sliced_linear_matches_composite_and_grads(case):
    x, w, b, o, i, act = _linear_args(case, dtype=torch.float64, grad=True)
    y = ops.sliced_linear(x, w, b, out_features=o, in_features=i, activation=act)
    ref = _linear_composite(x, w, b, o, i, act)
    torch.testing.assert_close(y, ref)
    assert y.shape == (*x.shape[:-1], o) and y.is_contiguous()
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, [t for t in (x, w, b) if t is not None], g)
    want = torch.autograd.grad(ref, [t for t in (x, w, b) if t is not None], g)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)
    assert got[1][o:].abs().sum() == 0 and got[1][:, i:].abs().sum() == 0  # nothing outside the slice
    inputs = tuple(t for t in (x, w, b) if t is not None)

    def fn(*ts):
        return ops.sliced_linear(
            *ts[:2], ts[2] if b is not None else None, out_features=o, in_features=i, activation=act
        )

    assert torch.autograd.gradcheck(fn, inputs)


@pytest.mark.parametrize("case", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_sliced_conv2d_matches_composite_and_grads(case):
    args = _conv_args(case, dtype=torch.float64, grad=True)
    x, weight, scale, shift, residual, o, i, stride, padding, dilation, groups, relu = args
    y = ops.sliced_conv2d(
        x,
        weight,
        scale=scale,
        shift=shift,
        residual=residual,
        out_channels=o,
        in_channels=i,
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
        relu=relu,
    )
    ref = _conv_composite(*args)
    torch.testing.assert_close(y, ref)
    assert y.is_contiguous(memory_format=torch.channels_last)  # follows x's memory format
    leaves = [t for t in (x, weight, scale, shift, residual) if t is not None]
    g = torch.randn_like(y)
    for a, e in zip(torch.autograd.grad(y, leaves, g), torch.autograd.grad(ref, leaves, g)):
        torch.testing.assert_close(a, e)


def test_sliced_conv2d_gradcheck():
    args = list(_conv_args(CONV_CASES[2], dtype=torch.float64, grad=True))
    x, weight, scale, shift, residual = args[:5]

    def fn(x, weight, scale, shift, residual):
        return torch.ops.subnetact.sliced_conv2d.default(x, weight, scale, shift, residual, *args[5:])

    assert torch.autograd.gradcheck(fn, (x, weight, scale, shift, residual))


def test_fold_norm_matches_batch_norm():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 6, 5, 5, generator=g, dtype=torch.float64)
    w = torch.randn(10, 8, 3, 3, generator=g, dtype=torch.float64)
    conv_bias = torch.randn(10, generator=g, dtype=torch.float64)
    mean, var = torch.randn(7, generator=g, dtype=torch.float64), torch.rand(7, generator=g, dtype=torch.float64)
    gamma, beta = torch.randn(10, generator=g, dtype=torch.float64), torch.randn(10, generator=g, dtype=torch.float64)
    scale, shift = ops.fold_norm(mean, var, gamma, beta, eps=1e-3, conv_bias=conv_bias)
    y = ops.sliced_conv2d(x, w, scale=scale, shift=shift, out_channels=7, in_channels=6, padding=1, relu=True)
    conv = F.conv2d(x, w[:7, :6], conv_bias[:7], padding=1)
    ref = F.batch_norm(conv, mean, var, gamma[:7], beta[:7], False, 0.0, 1e-3).relu()
    torch.testing.assert_close(y, ref)


# -- validation: same errors on every path (raised by the public wrappers) -------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"activation": "swish"}, r"activation='swish' is not supported"),
        ({"out_features": 0}, r"out_features=0 must be in \[1, 8\]"),
        ({"out_features": 9}, r"out_features=9 must be in \[1, 8\]"),
        ({"in_features": 5}, r"x.shape\[-1\]=6 must equal in_features=5"),
        ({"bias": torch.zeros(7)}, r"bias must have shape \(8,\)"),
        ({"bias": torch.zeros(8, dtype=torch.float64)}, r"bias has dtype torch.float64, expected x's dtype"),
    ],
)
def test_sliced_linear_errors(kwargs, match):
    kwargs = {"bias": None, **kwargs}
    with pytest.raises(OpArgumentError, match=match):
        ops.sliced_linear(torch.zeros(2, 6), torch.zeros(8, 10), kwargs.pop("bias"), **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"out_channels": 9}, r"out_channels=9 must be in \[1, 8\]"),
        ({"out_channels": 6, "groups": 4, "in_channels": 1}, r"out_channels=6 .* multiple of groups=4"),
        ({"in_channels": 3}, r"x has 4 channels, expected in_channels \* groups = 3 \* 1 = 3"),
        ({"padding": "same"}, r"padding='same' must be an int or a pair of ints"),
        ({"stride": 0}, r"need stride >= 1"),
        ({"scale": torch.zeros(3)}, r"scale must be 1-D with at least out_channels=8 entries"),
        ({"residual": torch.zeros(1, 8, 4, 4)}, r"residual must have the output's shape \(1, 8, 3, 3\)"),
        ({"dilation": 4}, r"too small for kernel \(3, 3\)"),
    ],
)
def test_sliced_conv2d_errors(kwargs, match):
    kwargs = {"in_channels": 4, **kwargs}
    with pytest.raises(OpArgumentError, match=match):
        ops.sliced_conv2d(torch.zeros(1, 4, 5, 5), torch.zeros(8, 5, 3, 3), **kwargs)


def test_errors_are_value_errors():
    with pytest.raises(ValueError):
        ops.sliced_linear(torch.zeros(2, 6), torch.zeros(8, 10), activation="tanh")


# -- torch.compile ---------------------------------------------------------------------------------------------
def test_torch_compile_fullgraph_cpu():
    lin = _linear_args(LINEAR_CASES[1])
    conv = _conv_args(CONV_CASES[2])

    def fn(x, w, b, cx, cw, scale, shift, residual):
        y = ops.sliced_linear(x, w, b, out_features=13, in_features=11, activation="relu")
        z = ops.sliced_conv2d(
            cx,
            cw,
            scale=scale,
            shift=shift,
            residual=residual,
            out_channels=5,
            in_channels=8,
            stride=2,
            padding=1,
            relu=True,
        )
        return y, z

    inputs = (lin[0], lin[1], lin[2], *conv[:5])
    compiled = torch.compile(fn, fullgraph=True)
    for got, want in zip(compiled(*inputs), fn(*inputs)):
        torch.testing.assert_close(got, want)


# -- CUDA kernels (skipped without a GPU and the built extension) --------------------------------------------------
def _assert_within_torch_error(out, ref64, torch_same_dtype, atol):
    err = (out.double() - ref64).abs().max().item()
    base = (torch_same_dtype.double() - ref64).abs().max().item()
    assert err <= 2 * base + atol, f"kernel error {err:.3e} > 2 x PyTorch's {base:.3e} + {atol}"


@requires_kernels
@pytest.mark.parametrize("case", LINEAR_CASES, ids=[c[0] for c in LINEAR_CASES])
def test_sliced_linear_opcheck_cuda(case):
    opcheck(torch.ops.subnetact.sliced_linear.default, _linear_args(case, device="cuda", grad=True))


@requires_kernels
@pytest.mark.parametrize("case", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_sliced_conv2d_opcheck_cuda(case):
    opcheck(torch.ops.subnetact.sliced_conv2d.default, _conv_args(case, device="cuda", grad=True))


@requires_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    ("batch", "o_full", "i_full", "o", "i"),
    [(1, 768, 768, 768, 768), (7, 3072, 768, 2000, 515), (33, 1000, 2048, 1000, 1536), (256, 130, 67, 129, 65)],
)
@pytest.mark.parametrize("activation", ["none", "relu", "gelu", "gelu_tanh"])
def test_sliced_linear_kernel_vs_reference(dtype, batch, o_full, i_full, o, i, activation):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(batch, i, device="cuda", generator=g)
    w = torch.randn(o_full, i_full, device="cuda", generator=g) / i_full**0.5
    b = torch.randn(o_full, device="cuda", generator=g)
    ref64 = _linear_composite(x.double(), w.double(), b.double(), o, i, activation)
    out = ops.sliced_linear(x.to(dtype), w.to(dtype), b.to(dtype), out_features=o, activation=activation)
    same = _linear_composite(x.to(dtype), w.to(dtype), b.to(dtype), o, i, activation)
    _assert_within_torch_error(out, ref64, same, atol=1e-5)


@requires_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", CONV_CASES, ids=[c[0] for c in CONV_CASES])
@pytest.mark.parametrize("channels_last", [True, False], ids=["krsc", "kcrs"])
def test_sliced_conv2d_kernel_vs_reference(dtype, case, channels_last):
    args = _conv_args(case, device="cuda", channels_last=channels_last)
    ref64 = _conv_composite(*[a.double() if torch.is_tensor(a) else a for a in args])
    cast = [a.to(dtype) if torch.is_tensor(a) else a for a in args]
    out = torch.ops.subnetact.sliced_conv2d.default(*cast)
    same = _conv_composite(*cast)
    _assert_within_torch_error(out, ref64, same, atol=1e-4)
    assert out.is_contiguous(memory_format=ops._out_memory_format(cast[0]))


@requires_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_sliced_conv2d_kernel_resnet_shapes(dtype):
    # ResNet-50 stage shapes with odd slices (not multiples of any tile size).
    for n, c_full, hw, k, o_full, o, i, stride in [
        (1, 64, 56, 3, 64, 37, 45, 1),
        (8, 256, 56, 1, 64, 61, 203, 1),
        (3, 128, 28, 3, 128, 128, 99, 2),
        (5, 2048, 7, 1, 512, 500, 2047, 1),
    ]:
        x = torch.randn(n, i, hw, hw, device="cuda").to(memory_format=torch.channels_last)
        w = torch.randn(o_full, c_full, k, k, device="cuda") / (c_full * k * k) ** 0.5
        w = w.to(memory_format=torch.channels_last)
        args = (
            x,
            w,
            torch.rand(o_full, device="cuda") + 0.5,
            torch.randn(o_full, device="cuda"),
            None,
            o,
            i,
            [stride, stride],
            [k // 2] * 2,
            [1, 1],
            1,
            True,
        )
        ref64 = _conv_composite(*[a.double() if torch.is_tensor(a) else a for a in args])
        cast = [a.to(dtype) if torch.is_tensor(a) else a for a in args]
        _assert_within_torch_error(
            torch.ops.subnetact.sliced_conv2d.default(*cast), ref64, _conv_composite(*cast), atol=1e-4
        )


@requires_kernels
def test_torch_compile_fullgraph_cuda():
    x, w, b, *_ = _linear_args(LINEAR_CASES[1], device="cuda")
    fn = torch.compile(lambda x, w, b: ops.sliced_linear(x, w, b, out_features=13, activation="relu"), fullgraph=True)
    torch.testing.assert_close(fn(x, w, b), ops.sliced_linear(x, w, b, out_features=13, activation="relu"))
