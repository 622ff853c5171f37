// CUDA implementations of the ops defined in subnetact/ops.py (namespace subnetact). Each takes exactly the
// arguments of its schema; SymInt arguments arrive as int64_t.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>

namespace subnetact {

at::Tensor sliced_linear_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                              int64_t out_features, int64_t in_features, c10::string_view activation);

at::Tensor sliced_conv2d_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& scale,
                              const std::optional<at::Tensor>& shift, const std::optional<at::Tensor>& residual,
                              int64_t out_channels, int64_t in_channels, at::IntArrayRef stride,
                              at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups, bool relu);

}  // namespace subnetact
