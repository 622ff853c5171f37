// subnetact::sliced_conv2d, CUDA implementation (issue 7).
//
// Implicit-GEMM convolution that reads the sliced filter weight[:o, :i] in place through its strides, with a fused
// epilogue: per-channel scale/shift (a folded SubnetNorm, or a conv bias), optional residual add, optional ReLU.
//
// GEMM view of one group g (fprop):
//   M   = N * P * Q            output pixels           (rows)
//   Ng  = o / groups           output channels         (columns)
//   Kr  = R * S * i            reduction, ordered (r, s, c) with c fastest, so a KRSC (channels-last) filter
//                              slice is read with unit stride along the reduction
//   A[m, k] = x[n, g*i + c, p*sh - ph + r*dh, q*sw - pw + s*dw]   (0 outside the image)
//   B[k, j] = weight[g*Ng + j, c, r, s]
// Every tensor is addressed through its own strides, so any memory format and any [:o, :i] slice work without a
// copy. The reference semantics live in subnetact/ops.py (_conv_reference); the Python wrapper validates inputs.
//
// This is a SIMT kernel (fp32 accumulation, or fp64 for double) without tensor cores: correct for every dtype and
// layout, written to be read. Whether it meets the issue's speed target against cuDNN is unmeasured (no GPU was
// available when it was written); see docs/cuda.md for the remaining GPU checks.

#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "sliced_ops.h"

namespace subnetact {
namespace {

constexpr int kBM = 64;       // output pixels per block
constexpr int kBN = 64;       // output channels per block
constexpr int kBK = 16;       // reduction slice per step
constexpr int kThreads = 256; // 16 x 16 threads, each computing a 4 x 4 micro-tile
constexpr int kTM = 4;
constexpr int kTN = 4;

struct Strides4 {
  int64_t n, c, h, w;
};

template <typename scalar_t>
struct ConvParams {
  const scalar_t* x;
  const scalar_t* w;
  const scalar_t* scale;     // nullable, length o (contiguous)
  const scalar_t* shift;     // nullable, length o (contiguous)
  const scalar_t* residual;  // nullable, output-shaped
  scalar_t* y;
  Strides4 xs, ws, ys, rs;   // element strides; ws is (k, c, r, s)
  int N, H, W, P, Q;
  int C;                     // input channels per group (i)
  int K;                     // output channels per group (o / groups)
  int R, S;
  int sh, sw, ph, pw, dh, dw;
  bool relu;
};

// scale, shift, residual and ReLU for one output element; `co` is the absolute output channel.
template <typename scalar_t, typename acc_t>
__device__ __forceinline__ void store_output(const ConvParams<scalar_t>& p, acc_t v, int n, int co, int oh, int ow) {
  if (p.scale != nullptr) v *= static_cast<acc_t>(p.scale[co]);
  if (p.shift != nullptr) v += static_cast<acc_t>(p.shift[co]);
  if (p.residual != nullptr) {
    v += static_cast<acc_t>(p.residual[n * p.rs.n + co * p.rs.c + oh * p.rs.h + ow * p.rs.w]);
  }
  if (p.relu && v < acc_t(0)) v = acc_t(0);
  p.y[n * p.ys.n + co * p.ys.c + oh * p.ys.h + ow * p.ys.w] = static_cast<scalar_t>(v);
}

// A tile element (input pixel m, reduction index k) of group g, or 0 when out of range / in the padding.
template <typename scalar_t, typename acc_t>
__device__ __forceinline__ acc_t load_a(const ConvParams<scalar_t>& p, int g, int m, int k, int M, int Kr) {
  if (m >= M || k >= Kr) return acc_t(0);
  const int c = k % p.C;
  const int rs = k / p.C;
  const int s = rs % p.S;
  const int r = rs / p.S;
  const int ow = m % p.Q;
  const int nh = m / p.Q;
  const int oh = nh % p.P;
  const int n = nh / p.P;
  const int ih = oh * p.sh - p.ph + r * p.dh;
  const int iw = ow * p.sw - p.pw + s * p.dw;
  if (ih < 0 || ih >= p.H || iw < 0 || iw >= p.W) return acc_t(0);
  return static_cast<acc_t>(p.x[n * p.xs.n + (int64_t)(g * p.C + c) * p.xs.c + ih * p.xs.h + iw * p.xs.w]);
}

template <typename scalar_t, typename acc_t>
__device__ __forceinline__ acc_t load_b(const ConvParams<scalar_t>& p, int g, int k, int j, int Kr) {
  if (j >= p.K || k >= Kr) return acc_t(0);
  const int c = k % p.C;
  const int rs = k / p.C;
  const int s = rs % p.S;
  const int r = rs / p.S;
  return static_cast<acc_t>(p.w[(int64_t)(g * p.K + j) * p.ws.n + c * p.ws.c + r * p.ws.h + s * p.ws.w]);
}

// Block (bx, by, g) computes output pixels [bx*64, +64) x channels [by*64, +64) of group g.
// a_k_fastest: the input has unit channel stride (channels-last), so consecutive threads should walk the
// reduction (channels) rather than the pixels when filling the A tile; chosen per launch, uniform per block.
template <typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(kThreads)
    implicit_gemm_conv_kernel(ConvParams<scalar_t> p, bool a_k_fastest) {
  __shared__ acc_t As[kBK][kBM];
  __shared__ acc_t Bs[kBK][kBN];

  const int g = blockIdx.z;
  const int m0 = blockIdx.x * kBM;
  const int n0 = blockIdx.y * kBN;
  const int M = p.N * p.P * p.Q;
  const int Kr = p.R * p.S * p.C;
  const int t = threadIdx.x;
  const int tx = t % 16;  // column (output channel) micro-tile
  const int ty = t / 16;  // row (output pixel) micro-tile

  acc_t acc[kTM][kTN];
#pragma unroll
  for (int a = 0; a < kTM; ++a)
#pragma unroll
    for (int b = 0; b < kTN; ++b) acc[a][b] = acc_t(0);

  for (int k0 = 0; k0 < Kr; k0 += kBK) {
    // Fill the tiles: 1024 elements each, 4 per thread.
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int kk, mm;
      if (a_k_fastest) {
        kk = t % kBK;
        mm = t / kBK + 16 * e;
      } else {
        mm = t % kBM;
        kk = t / kBM + 4 * e;
      }
      As[kk][mm] = load_a<scalar_t, acc_t>(p, g, m0 + mm, k0 + kk, M, Kr);
      const int bk = t % kBK;        // filter: unit stride along c for a KRSC slice
      const int bn = t / kBK + 16 * e;
      Bs[bk][bn] = load_b<scalar_t, acc_t>(p, g, k0 + bk, n0 + bn, Kr);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      acc_t a[kTM], b[kTN];
#pragma unroll
      for (int i = 0; i < kTM; ++i) a[i] = As[kk][ty * kTM + i];
#pragma unroll
      for (int j = 0; j < kTN; ++j) b[j] = Bs[kk][tx * kTN + j];
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }

  // Epilogue straight from registers: no intermediate tensor, one write per output element.
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int m = m0 + ty * kTM + i;
    if (m >= M) continue;
    const int ow = m % p.Q;
    const int nh = m / p.Q;
    const int oh = nh % p.P;
    const int n = nh / p.P;
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      const int k = n0 + tx * kTN + j;
      if (k < p.K) store_output<scalar_t, acc_t>(p, acc[i][j], n, g * p.K + k, oh, ow);
    }
  }
}

// One input channel per group (depthwise, channel multiplier K): a direct convolution, one thread per output
// element. Memory-bound, so the thread order follows the output layout to keep stores coalesced.
template <typename scalar_t, typename acc_t>
__global__ void depthwise_conv_kernel(ConvParams<scalar_t> p, int64_t total, int out_channels, bool channels_last) {
  const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (idx >= total) return;
  int n, co, oh, ow;
  if (channels_last) {  // (n, oh, ow, co)
    co = idx % out_channels;
    int64_t rest = idx / out_channels;
    ow = rest % p.Q;
    rest /= p.Q;
    oh = rest % p.P;
    n = rest / p.P;
  } else {              // (n, co, oh, ow)
    ow = idx % p.Q;
    int64_t rest = idx / p.Q;
    oh = rest % p.P;
    rest /= p.P;
    co = rest % out_channels;
    n = rest / out_channels;
  }
  const int ci = co / p.K;  // the group's single input channel
  const scalar_t* xb = p.x + n * p.xs.n + ci * p.xs.c;
  const scalar_t* wb = p.w + co * p.ws.n;
  acc_t v = acc_t(0);
  for (int r = 0; r < p.R; ++r) {
    const int ih = oh * p.sh - p.ph + r * p.dh;
    if (ih < 0 || ih >= p.H) continue;
    for (int s = 0; s < p.S; ++s) {
      const int iw = ow * p.sw - p.pw + s * p.dw;
      if (iw < 0 || iw >= p.W) continue;
      v += static_cast<acc_t>(xb[ih * p.xs.h + iw * p.xs.w]) * static_cast<acc_t>(wb[r * p.ws.h + s * p.ws.w]);
    }
  }
  store_output<scalar_t, acc_t>(p, v, n, co, oh, ow);
}

Strides4 strides_of(const at::Tensor& t) {
  return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

}  // namespace

at::Tensor sliced_conv2d_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& scale,
                              const std::optional<at::Tensor>& shift, const std::optional<at::Tensor>& residual,
                              int64_t out_channels, int64_t in_channels, at::IntArrayRef stride,
                              at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups, bool relu) {
  // The Python wrapper (subnetact.ops.sliced_conv2d) already validated everything with user-facing messages;
  // these checks only guard direct torch.ops calls against memory errors.
  TORCH_CHECK(x.is_cuda() && weight.is_cuda(), "sliced_conv2d_cuda: x and weight must be CUDA tensors");
  TORCH_CHECK(x.dim() == 4 && weight.dim() == 4, "sliced_conv2d_cuda: x and weight must be 4-D");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "sliced_conv2d_cuda: x and weight dtypes differ");
  TORCH_CHECK(stride.size() == 2 && padding.size() == 2 && dilation.size() == 2, "sliced_conv2d_cuda: bad pairs");
  TORCH_CHECK(groups >= 1 && out_channels % groups == 0, "sliced_conv2d_cuda: out_channels % groups != 0");
  TORCH_CHECK(out_channels <= weight.size(0) && in_channels <= weight.size(1) &&
                  x.size(1) == in_channels * groups,
              "sliced_conv2d_cuda: sizes do not match the weight / input");
  const c10::cuda::CUDAGuard guard(x.device());

  const int64_t N = x.size(0), H = x.size(2), W = x.size(3), R = weight.size(2), S = weight.size(3);
  const int64_t P = (H + 2 * padding[0] - dilation[0] * (R - 1) - 1) / stride[0] + 1;
  const int64_t Q = (W + 2 * padding[1] - dilation[1] * (S - 1) - 1) / stride[1] + 1;
  TORCH_CHECK(P >= 1 && Q >= 1, "sliced_conv2d_cuda: empty output");
  // Same memory-format rule as subnetact.ops._out_memory_format, so fake and real strides agree.
  const bool channels_last = x.is_contiguous(at::MemoryFormat::ChannelsLast) && !x.is_contiguous();
  auto y = at::empty({N, out_channels, P, Q},
                     x.options().memory_format(channels_last ? at::MemoryFormat::ChannelsLast
                                                             : at::MemoryFormat::Contiguous));
  if (y.numel() == 0) return y;
  TORCH_CHECK(N * P * Q < (int64_t{1} << 31) && x.numel() < (int64_t{1} << 40),
              "sliced_conv2d_cuda: output too large for 32-bit pixel indexing");

  const at::Tensor w = weight.slice(0, 0, out_channels).slice(1, 0, in_channels);  // a view: no copy
  // Per-channel vectors are tiny; making the [:o] prefix contiguous costs nothing measurable.
  const auto prefix = [&](const std::optional<at::Tensor>& t) -> at::Tensor {
    if (!t.has_value()) return at::Tensor();
    TORCH_CHECK(t->is_cuda() && t->scalar_type() == x.scalar_type() && t->dim() == 1 && t->size(0) >= out_channels,
                "sliced_conv2d_cuda: scale/shift must be 1-D CUDA tensors of x's dtype with >= out_channels entries");
    return t->slice(0, 0, out_channels).contiguous();
  };
  const at::Tensor scale_v = prefix(scale), shift_v = prefix(shift);
  if (residual.has_value()) {
    TORCH_CHECK(residual->is_cuda() && residual->scalar_type() == x.scalar_type() &&
                    residual->sizes() == y.sizes(),
                "sliced_conv2d_cuda: residual must be a CUDA tensor of x's dtype with the output's shape");
  }
  const auto stream = c10::cuda::getCurrentCUDAStream();

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "sliced_conv2d_cuda", [&] {
    using acc_t = at::acc_type<scalar_t, /*is_cuda=*/true>;
    ConvParams<scalar_t> p;
    p.x = x.const_data_ptr<scalar_t>();
    p.w = w.const_data_ptr<scalar_t>();
    p.scale = scale_v.defined() ? scale_v.const_data_ptr<scalar_t>() : nullptr;
    p.shift = shift_v.defined() ? shift_v.const_data_ptr<scalar_t>() : nullptr;
    p.residual = residual.has_value() ? residual->const_data_ptr<scalar_t>() : nullptr;
    p.y = y.mutable_data_ptr<scalar_t>();
    p.xs = strides_of(x);
    p.ws = strides_of(w);
    p.ys = strides_of(y);
    p.rs = residual.has_value() ? strides_of(*residual) : Strides4{0, 0, 0, 0};
    p.N = N, p.H = H, p.W = W, p.P = P, p.Q = Q;
    p.C = in_channels;
    p.K = out_channels / groups;
    p.R = R, p.S = S;
    p.sh = stride[0], p.sw = stride[1], p.ph = padding[0], p.pw = padding[1], p.dh = dilation[0], p.dw = dilation[1];
    p.relu = relu;
    if (in_channels == 1) {
      const int64_t total = y.numel();
      const int threads = 256;
      const int64_t blocks = (total + threads - 1) / threads;
      depthwise_conv_kernel<scalar_t, acc_t>
          <<<blocks, threads, 0, stream>>>(p, total, static_cast<int>(out_channels), channels_last);
    } else {
      const dim3 grid((N * P * Q + kBM - 1) / kBM, (p.K + kBN - 1) / kBN, groups);
      const bool a_k_fastest = x.stride(1) == 1;
      implicit_gemm_conv_kernel<scalar_t, acc_t><<<grid, kThreads, 0, stream>>>(p, a_k_fastest);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return y;
}

}  // namespace subnetact
