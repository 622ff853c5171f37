"""``WeightSlice``: convolution and linear layers that use the first k channels of the shared weight."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .config import SubnetConfig
from .errors import ConfigError
from .handlers import OperatorEntry, register_operator_kind
from .operator import Operator, cloned_parameter

_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _cuda_kernel(weight: torch.Tensor, name: str):
    """The ``subnetact::<name>`` CUDA kernel for a layer whose weight is on a GPU, else None (issue 7).

    Decided once per plan, never per forward: CPU layers never reach the custom-op dispatcher (it costs
    microseconds a call), and ``SUBNETACT_DISABLE_EXTENSION=1`` keeps PyTorch's kernels for plans compiled after it
    is set (``model.to(...)`` recompiles plans).
    """
    if not weight.is_cuda or weight.dtype not in _KERNEL_DTYPES:
        return None
    import subnetact_cuda

    if not subnetact_cuda.available():
        return None
    return getattr(torch.ops.subnetact, name).default


#: The unfold + GEMM formulation of a convolution with a strided weight slice runs when the output has at most this
#: many positions (N * H_out * W_out): there the weight dominates the traffic and the GEMM reads the strided slice in
#: place, as fast as the convolution on a contiguous weight (measured on torch 2.14 and 2.15, 1 thread: 0.97x at a
#: 7x7 output, batch 1), while the view passed to ``F.conv2d`` is copied on every call (up to 3.4x slower for a
#: 12 MB slice, whose fresh allocation faults in new pages). At more positions the unfolded input costs more than the
#: copy (1.2-2.1x slower at 98 and more). Issue 16.
UNFOLD_MAX_ROWS = 64

#: A 1x1 convolution's slice is worth a copy in the weight cache (run as oneDNN's convolution instead of a GEMM on the
#: strided view) from this many weight elements on. Measured at two threads (``benchmarks/bench_pointwise.py``, torch
#: 2.15): oneDNN's convolution took 0.83-0.85x the GEMM's time for the 2048 x 512-816 slices of OFA-ResNet50's last
#: stage (0.71x at batch 8), but 1.1-2x for the small slices of the early stages; at one thread both tie. The
#: threshold keeps the budget for the copies that pay. Issue 16.
POINTWISE_MIN_ELEMENTS = 2**19


def _unfold_conv(
    x: torch.Tensor, weight2d: torch.Tensor, bias: torch.Tensor | None, conv: nn.Conv2d, out_h: int, out_w: int
) -> torch.Tensor:
    """``conv2d(x, W)`` as ``unfold(x)^T @ W2d^T``, reading the strided ``(k_out, k_in * kh * kw)`` weight in place.

    Shapes: ``x`` (N, k_in, H, W), ``weight2d`` (k_out, k_in * kh * kw) -> (N, k_out, H_out, W_out), contiguous.
    """
    n = x.shape[0]
    k_out = weight2d.shape[0]
    cols = F.unfold(x, conv.kernel_size, conv.dilation, conv.padding if conv.padding != "valid" else 0, conv.stride)
    rows = cols.transpose(1, 2).reshape(n * out_h * out_w, -1)  # (N * L, k_in * kh * kw); a view when N == 1
    # (N * L, k_out): this orientation of the GEMM measured faster than weight2d @ cols for these shapes
    y = torch.mm(rows, weight2d.t()) if bias is None else torch.addmm(bias, rows, weight2d.t())
    return y.view(n, out_h * out_w, k_out).transpose(1, 2).contiguous().view(n, k_out, out_h, out_w)


class ConvEntry(NamedTuple):
    """The plan entry of a :class:`WeightSliceConv2d` for one subnet (a tuple: ``forward`` unpacks it at tuple
    speed; other readers use the names)."""

    out_k: int
    in_k: int
    groups: int  # the sliced convolution's groups (whole groups kept)
    weight: torch.Tensor  # (k_out, k_in / groups, kh, kw) view of the shared weight; (k_out, k_in) when ``gemm``
    bias: torch.Tensor | None  # (k_out,)
    gemm: bool  # a strided 1x1 slice run as one GEMM reading the weight in place
    unfold_weight: torch.Tensor | None  # (k_out, k_in * kh * kw) view for the unfold + GEMM path, else None
    kernel: tuple | None  # (op, in_per_group, stride, padding, dilation, groups) of the CUDA kernel, else None


class WeightSlice(Operator):
    """Mixin of the weight-slicing layers. ``out_group`` / ``in_group`` index the model's channel groups (None: the
    dimension is not elastic). The parameters are the original layer's Parameters (same tensors, same storage);
    nothing is copied per subnet."""

    out_group: int | None
    in_group: int | None
    _op_index: int

    def _takes_over(self, base: nn.Module) -> None:
        # Same Parameter objects: optimiser state, tied weights and user references keep pointing at them.
        self.weight = base.weight
        self.bias = base.bias
        self.training = base.training
        # (k_out, k_in) -> (contiguous copy of the slice, weight version, weight data_ptr); filled and emptied by the
        # model's WeightCache (registered subnets only, within its budget).
        self.weight_copies: dict[tuple[int, int], tuple[torch.Tensor, int, int]] = {}

    def _out_in(self, sizes: list[int]) -> tuple[int, int]:
        out_k = self.weight.shape[0] if self.out_group is None else sizes[self.out_group]
        in_k = self.weight.shape[1] if self.in_group is None else sizes[self.in_group]
        return out_k, in_k


class WeightSliceConv2d(WeightSlice, nn.Conv2d):
    """``nn.Conv2d`` running ``W[:k_out, :k_in]`` of the shared weight (whole groups for grouped convolutions).

    Shapes: ``x`` (N, k_in, H, W) -> (N, k_out, H', W').

    Slicing strategy, chosen by measurement (``benchmarks/bench_forward.py``, ``benchmarks/bench_ofa.py``, issue
    16): a prefix along the output dimension is a contiguous view and runs the normal convolution. A slice of the
    input dimension is a strided view. For registered subnets the model's weight cache keeps a contiguous copy of
    it (within the budget of ``model.set_weight_cache``) and the layer runs the extracted layer's kernel (oneDNN's
    convolution) on that copy. Without a copy, a 1x1 convolution (stride 1, no padding) runs as one GEMM reading the
    strided weight in place (``mm(W[:o, :i], x.flatten(2))``): as fast as the convolution at one thread, but at two
    threads oneDNN's convolution measured up to 17 % faster on large late-stage 1x1 weights and slower on small
    ones, so the cache copies 1x1 slices only from ``POINTWISE_MIN_ELEMENTS`` on. Other shapes need a
    contiguous weight: ``F.conv2d`` copies the view into a fresh allocation on every call, unless the unfold + GEMM
    formulation reads it in place (small outputs, ``UNFOLD_MAX_ROWS``).
    """

    @classmethod
    def from_module(cls, conv: nn.Conv2d, out_group: int | None, in_group: int | None) -> WeightSliceConv2d:
        if conv.groups > 1 and out_group != in_group:
            raise ConfigError(
                f"a grouped convolution (groups={conv.groups}) must slice input and output with the same channel "
                f"group (it drops whole groups), got out_group={out_group!r}, in_group={in_group!r}"
            )
        with torch.device("meta"):
            new = cls(
                conv.in_channels,
                conv.out_channels,
                conv.kernel_size,
                stride=conv.stride,
                padding=conv.padding,
                dilation=conv.dilation,
                groups=conv.groups,
                bias=conv.bias is not None,
                padding_mode=conv.padding_mode,
            )
        new._takes_over(conv)
        new.out_group, new.in_group = out_group, in_group
        return new

    def _slice(self, out_k: int, in_k: int) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        if self.groups == 1:
            weight = self.weight[:out_k, :in_k]
            groups = 1
        else:
            # Grouped: keep the first out_k / (C_out / G) whole groups; each keeps all its input channels.
            groups = out_k // (self.out_channels // self.groups)
            weight = self.weight[:out_k]
        bias = None if self.bias is None else self.bias[:out_k]
        return weight, bias, groups

    def plan_entry(self, cfg: SubnetConfig, sizes: list[int], stats: object) -> ConvEntry:
        out_k, in_k = self._out_in(sizes)
        weight, bias, groups = self._slice(out_k, in_k)
        gemm = (
            self.kernel_size == (1, 1)
            and self.stride == (1, 1)
            and self.dilation == (1, 1)
            and self.groups == 1
            and self.padding_mode == "zeros"
            and self.padding in ((0, 0), "valid")
            and not weight.is_contiguous()
        )
        if gemm:
            weight = weight[:, :, 0, 0]  # (k_out, k_in) strided view: the GEMM reads it in place
        # (k_out, k_in * kh * kw) strided view of the same slice, for the unfold + GEMM formulation (each output
        # channel's k_in * kh * kw values are contiguous in a contiguous weight; the row stride skips the rest).
        unfold_weight = None
        if (
            not gemm
            and self.weight.device.type == "cpu"  # measured on CPU only (issue 16)
            and groups == 1
            and not weight.is_contiguous()
            and self.weight.is_contiguous()
            and self.padding_mode == "zeros"
            and self.padding != "same"
        ):
            full_out, full_in = self.weight.shape[:2]
            taps = self.weight.shape[2] * self.weight.shape[3]
            unfold_weight = self.weight.view(full_out, full_in * taps)[:out_k, : in_k * taps]
        kernel = None
        if self.padding_mode == "zeros" and self.padding != "same":
            op = _cuda_kernel(self.weight, "sliced_conv2d")
            if op is not None:  # sliced implicit-GEMM conv reading W[:k_out, :k_in] in place; bias in its epilogue
                padding = [0, 0] if self.padding == "valid" else list(self.padding)
                kernel = (op, weight.shape[1], list(self.stride), padding, list(self.dilation), groups)
        return ConvEntry(out_k, in_k, groups, weight, bias, gemm, unfold_weight, kernel)

    def cacheable_slice(self, entry: ConvEntry, pointwise: bool = True) -> tuple[tuple[int, int], torch.Tensor] | None:
        """``((k_out, k_in), view)`` when ``entry`` runs on a strided weight view (``F.conv2d`` copies it every call;
        a 1x1 convolution's GEMM reads it in place, but oneDNN's convolution on a copy of a large one is faster at
        two threads: 1x1 slices from ``POINTWISE_MIN_ELEMENTS`` on, none with ``pointwise=False``), else None.
        Used by :class:`~subnetact.weight_cache.WeightCache`."""
        out_k, in_k, weight = entry.out_k, entry.in_k, entry.weight
        # CPU only: measured there (issue 16), and a CUDA graph captured on a copy would read freed memory once the
        # copy is evicted.
        if entry.kernel is not None or weight.is_contiguous() or weight.device.type != "cpu":
            return None
        if entry.gemm:
            if not pointwise or weight.numel() < POINTWISE_MIN_ELEMENTS:
                return None
            weight = self.weight[:out_k, :in_k]  # the (k_out, k_in, 1, 1) slice the convolution gets
        return (out_k, in_k), weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        entry = self._subnetact_state.current().entries[self._op_index]
        out_k, in_k, groups, weight, bias, gemm, unfold_weight, kernel = entry
        if kernel is not None and x.dtype == self.weight.dtype:  # (dtypes differ under autocast: PyTorch's path)
            op, in_per_group, stride, padding, dilation, groups = kernel
            # The full Parameters go in (the op slices them), so gradients reach the shared weight.
            return op(
                x, self.weight, None, self.bias, None, out_k, in_per_group, stride, padding, dilation, groups, False
            )
        if torch.is_grad_enabled() and self.weight.requires_grad:
            # Planned views were made under no_grad; slice afresh so gradients reach the shared weight.
            weight, bias, groups = self._slice(out_k, in_k)
            unfold_weight = None
            if gemm:
                weight = weight[:, :, 0, 0]
        elif self.weight_copies and not self.training:
            copy = self.weight_copies.get((out_k, in_k))
            if copy is not None:
                unfold_weight = None
                # The copy stands for the weight as it was when copied: re-copy if it changed in place since.
                if copy[1] == self.weight._version and copy[2] == self.weight.data_ptr():
                    weight = copy[0]
                else:
                    fresh = self._slice(out_k, in_k)[0]  # not the planned view: the storage may be new
                    weight = self._subnetact_state.weight_cache.refresh(self, out_k, in_k, fresh)
                gemm = False  # a 1x1 copy runs oneDNN's convolution, the extracted layer's kernel
        if unfold_weight is not None:
            n, _, h, w = x.shape
            (kh, kw), (sh, sw), (dh, dw) = self.kernel_size, self.stride, self.dilation
            ph, pw = (0, 0) if self.padding == "valid" else self.padding
            out_h, out_w = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
            if n * out_h * out_w <= UNFOLD_MAX_ROWS:
                return _unfold_conv(x, unfold_weight, bias, self, out_h, out_w)
        if gemm and x.is_contiguous():
            n, _, h, w = x.shape
            if n == 1:
                y = torch.mm(weight, x.view(in_k, h * w))  # (k_out, k_in) @ (k_in, H*W) -> (k_out, H*W)
            else:
                # bmm, not matmul: matmul folds this case through transposes and returns a channels-last result,
                # which costs a copy in the next op.
                y = torch.bmm(weight.expand(n, out_k, in_k), x.view(n, in_k, h * w))  # (N, k_out, H*W)
            if bias is not None:
                y = y + bias[:, None]
            return y.view(n, out_k, h, w)
        if gemm:
            weight = weight[:, :, None, None]
        if self.padding_mode != "zeros":
            x = F.pad(x, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return F.conv2d(x, weight, bias, self.stride, 0, self.dilation, groups)
        return F.conv2d(x, weight, bias, self.stride, self.padding, self.dilation, groups)

    def to_dense(self, entry: ConvEntry) -> nn.Conv2d:
        out_k = entry.out_k
        weight, bias, groups = self._slice(out_k, entry.in_k)
        with torch.device("meta"):
            dense = nn.Conv2d(
                weight.shape[1] * groups,
                out_k,
                self.kernel_size,
                stride=self.stride,
                padding=self.padding,
                dilation=self.dilation,
                groups=groups,
                bias=bias is not None,
                padding_mode=self.padding_mode,
            )
        dense.weight = cloned_parameter(weight, self.weight.requires_grad)
        if bias is not None:
            dense.bias = cloned_parameter(bias, self.bias.requires_grad)
        dense.training = self.training
        return dense

    def to_base(self) -> nn.Conv2d:
        with torch.device("meta"):
            base = nn.Conv2d(
                self.in_channels,
                self.out_channels,
                self.kernel_size,
                stride=self.stride,
                padding=self.padding,
                dilation=self.dilation,
                groups=self.groups,
                bias=self.bias is not None,
                padding_mode=self.padding_mode,
            )
        base.weight, base.bias, base.training = self.weight, self.bias, self.training
        return base

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, out_group={self.out_group}, in_group={self.in_group}"


class WeightSliceLinear(WeightSlice, nn.Linear):
    """``nn.Linear`` running ``W[:k_out, :k_in]`` of the shared weight.

    Shapes: ``x`` (..., k_in) -> (..., k_out). ``F.linear`` reads the strided slice in place at little cost, so no
    copy is made.
    """

    @classmethod
    def from_module(cls, linear: nn.Linear, out_group: int | None, in_group: int | None) -> WeightSliceLinear:
        with torch.device("meta"):
            new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None)
        new._takes_over(linear)
        new.out_group, new.in_group = out_group, in_group
        return new

    def _slice(self, out_k: int, in_k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.weight[:out_k, :in_k], None if self.bias is None else self.bias[:out_k]

    def plan_entry(self, cfg: SubnetConfig, sizes: list[int], stats: object) -> tuple:
        out_k, in_k = self._out_in(sizes)
        return (out_k, in_k, *self._slice(out_k, in_k), _cuda_kernel(self.weight, "sliced_linear"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out_k, in_k, weight, bias, kernel = self._subnetact_state.current().entries[self._op_index]
        if (
            kernel is not None and x.dtype == self.weight.dtype
        ):  # cuBLASLt on the in-place slice W[:k_out, :k_in], bias in the epilogue
            return kernel(x, self.weight, self.bias, out_k, in_k, "none")
        if torch.is_grad_enabled() and self.weight.requires_grad:
            weight, bias = self._slice(out_k, in_k)
        return F.linear(x, weight, bias)

    def to_dense(self, entry: tuple) -> nn.Linear:
        out_k, in_k, *_ = entry
        weight, bias = self._slice(out_k, in_k)
        with torch.device("meta"):
            dense = nn.Linear(in_k, out_k, bias=bias is not None)
        dense.weight = cloned_parameter(weight, self.weight.requires_grad)
        if bias is not None:
            dense.bias = cloned_parameter(bias, self.bias.requires_grad)
        dense.training = self.training
        return dense

    def to_base(self) -> nn.Linear:
        with torch.device("meta"):
            base = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None)
        base.weight, base.bias, base.training = self.weight, self.bias, self.training
        return base

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, out_group={self.out_group}, in_group={self.in_group}"


@register_operator_kind("slice")
def slice_layer(layer: nn.Module, entry: OperatorEntry) -> WeightSlice:
    """Handler of kind ``"slice"``: an ``nn.Conv2d`` / ``nn.Linear`` slicing groups ``(out_group, in_group)``."""
    out_group, in_group = entry.groups
    cls = WeightSliceConv2d if isinstance(layer, nn.Conv2d) else WeightSliceLinear
    return cls.from_module(layer, out_group, in_group)
