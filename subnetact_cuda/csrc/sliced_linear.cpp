// subnetact::sliced_linear, CUDA implementation, and the registration of every CUDA kernel (issue 7).
//
// y = act(x @ W[:o, :i].T + b[:o]) as ONE cuBLASLt matmul that reads the weight slice in place: a row-major
// slice W[:o, :i] of a (O, I) weight is a column-major (i x o) matrix with leading dimension I, which cuBLASLt
// takes as is (transa = T, lda = I). The bias add and ReLU / tanh-GELU run in cuBLASLt's epilogue, so the output
// is written once. Exact (erf) GELU has no cuBLASLt epilogue and runs as a second, in-place pass.
//
// Why cuBLASLt rather than a hand-written GEMM: the target is "within 1.05x of cuBLAS on the contiguous weight",
// and the contiguous-weight baseline is the very same library; with the leading dimension the slice costs nothing.
// The handle and workspace are PyTorch's own (at::cuda), so the kernel shares PyTorch's stream and workspace.

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/Exceptions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublasLt.h>
#include <torch/library.h>

#include <Python.h>

#include <cstdint>

#include "sliced_ops.h"

namespace subnetact {
namespace {

// RAII holders for the cuBLASLt descriptors (destroyed on every exit path, including TORCH_CHECK throws).
struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  ~MatmulDesc() { if (d) cublasLtMatmulDescDestroy(d); }
};
struct Layout {
  cublasLtMatrixLayout_t d = nullptr;
  ~Layout() { if (d) cublasLtMatrixLayoutDestroy(d); }
};
struct Preference {
  cublasLtMatmulPreference_t d = nullptr;
  ~Preference() { if (d) cublasLtMatmulPreferenceDestroy(d); }
};

// Largest power of two <= 16 dividing the address: cuBLASLt must not pick a kernel that assumes more.
uint32_t alignment_of(const void* ptr) {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  uint32_t a = 1;
  while (a < 16 && addr % (a * 2) == 0) a *= 2;
  return a;
}

at::Tensor apply_activation(at::Tensor y, c10::string_view activation) {
  if (activation == "relu") return y.relu_();
  if (activation == "gelu") return at::gelu_(y);
  if (activation == "gelu_tanh") return at::gelu_(y, "tanh");
  return y;
}

// Plain ATen path: used for float64 (no cuBLASLt epilogue support) and when cuBLASLt offers no algorithm.
at::Tensor linear_aten(const at::Tensor& x2, const at::Tensor& w, const at::Tensor& b, c10::string_view activation) {
  at::Tensor y = b.defined() ? at::addmm(b, x2, w.t()) : at::mm(x2, w.t());
  return apply_activation(y, activation);
}

// Returns false (having launched nothing) if cuBLASLt has no algorithm for this problem.
bool linear_cublaslt(const at::Tensor& x2, const at::Tensor& w, const at::Tensor& b, at::Tensor& y,
                     c10::string_view activation) {
  const int64_t batch = x2.size(0), o = w.size(0), i = w.size(1);
  cudaDataType_t dtype;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  switch (x2.scalar_type()) {
    case at::kFloat:
      dtype = CUDA_R_32F;
      // Honour torch.backends.cuda.matmul.allow_tf32 like F.linear does (default: off, full fp32).
      if (at::globalContext().allowTF32CuBLAS()) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
      break;
    case at::kHalf: dtype = CUDA_R_16F; break;
    case at::kBFloat16: dtype = CUDA_R_16BF; break;
    default: return false;
  }

  // Weight operand A (cuBLAS is column-major): D(o x batch) = op(A)(o x i) * B(i x batch).
  cublasOperation_t transa;
  int64_t lda;
  if (w.stride(1) == 1 && w.stride(0) >= i) {         // row-major slice (the usual nn.Linear weight)
    transa = CUBLAS_OP_T;
    lda = w.stride(0);
  } else if (w.stride(0) == 1 && w.stride(1) >= o) {  // column-major slice (a transposed weight)
    transa = CUBLAS_OP_N;
    lda = w.stride(1);
  } else {
    return false;
  }
  const int64_t ldb = x2.stride(0);

  cublasLtEpilogue_t epilogue;
  const bool has_bias = b.defined();
  if (activation == "relu") {
    epilogue = has_bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
  } else if (activation == "gelu_tanh") {
    epilogue = has_bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  } else {  // "none", or "gelu" (exact GELU is applied afterwards)
    epilogue = has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  }

  MatmulDesc desc;
  TORCH_CUDABLAS_CHECK(cublasLtMatmulDescCreate(&desc.d, compute, CUDA_R_32F));
  const cublasOperation_t transb = CUBLAS_OP_N;
  TORCH_CUDABLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
  TORCH_CUDABLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
  TORCH_CUDABLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  if (has_bias) {
    const void* bias_ptr = b.const_data_ptr();
    TORCH_CUDABLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof(bias_ptr)));
  }

  Layout a_layout, b_layout, d_layout;
  if (transa == CUBLAS_OP_T) {
    TORCH_CUDABLAS_CHECK(cublasLtMatrixLayoutCreate(&a_layout.d, dtype, i, o, lda));
  } else {
    TORCH_CUDABLAS_CHECK(cublasLtMatrixLayoutCreate(&a_layout.d, dtype, o, i, lda));
  }
  TORCH_CUDABLAS_CHECK(cublasLtMatrixLayoutCreate(&b_layout.d, dtype, i, batch, ldb));
  TORCH_CUDABLAS_CHECK(cublasLtMatrixLayoutCreate(&d_layout.d, dtype, o, batch, o));

  const size_t workspace_size = at::cuda::getCUDABlasLtWorkspaceSize();
  void* workspace = at::cuda::getCUDABlasLtWorkspace();
  Preference pref;
  TORCH_CUDABLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.d));
  TORCH_CUDABLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.d, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &workspace_size, sizeof(workspace_size)));
  // A slice starts at the weight's base pointer, but x may be an offset view: state the real alignments.
  const uint32_t align_a = alignment_of(w.const_data_ptr()), align_b = alignment_of(x2.const_data_ptr()),
                 align_d = alignment_of(y.const_data_ptr());
  TORCH_CUDABLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                            &align_a, sizeof(align_a)));
  TORCH_CUDABLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                            &align_b, sizeof(align_b)));
  TORCH_CUDABLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                            &align_d, sizeof(align_d)));
  TORCH_CUDABLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                            &align_d, sizeof(align_d)));

  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  cublasLtMatmulHeuristicResult_t heuristic = {};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle, desc.d, a_layout.d, b_layout.d, d_layout.d,
                                                               d_layout.d, pref.d, 1, &heuristic, &found);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) return false;

  const float alpha = 1.0f, beta = 0.0f;
  TORCH_CUDABLAS_CHECK(cublasLtMatmul(handle, desc.d, &alpha, w.const_data_ptr(), a_layout.d, x2.const_data_ptr(),
                                      b_layout.d, &beta, y.mutable_data_ptr(), d_layout.d, y.mutable_data_ptr(),
                                      d_layout.d, &heuristic.algo, workspace, workspace_size,
                                      at::cuda::getCurrentCUDAStream()));
  if (activation == "gelu") at::gelu_(y);
  return true;
}

}  // namespace

at::Tensor sliced_linear_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                              int64_t out_features, int64_t in_features, c10::string_view activation) {
  // User-facing validation is in subnetact.ops.sliced_linear; these guard direct torch.ops calls.
  TORCH_CHECK(x.is_cuda() && weight.is_cuda(), "sliced_linear_cuda: x and weight must be CUDA tensors");
  TORCH_CHECK(weight.dim() == 2 && x.dim() >= 1, "sliced_linear_cuda: weight must be 2-D and x at least 1-D");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "sliced_linear_cuda: x and weight dtypes differ");
  TORCH_CHECK(out_features >= 1 && out_features <= weight.size(0) && in_features >= 1 &&
                  in_features <= weight.size(1) && x.size(-1) == in_features,
              "sliced_linear_cuda: sizes do not match the weight / input");
  TORCH_CHECK(activation == "none" || activation == "relu" || activation == "gelu" || activation == "gelu_tanh",
              "sliced_linear_cuda: unknown activation ", activation);
  const c10::cuda::CUDAGuard guard(x.device());

  const at::Tensor w = weight.slice(0, 0, out_features).slice(1, 0, in_features);  // a view: no copy
  at::Tensor b;
  if (bias.has_value()) {
    TORCH_CHECK(bias->is_cuda() && bias->scalar_type() == x.scalar_type() && bias->dim() == 1 &&
                    bias->size(0) >= out_features,
                "sliced_linear_cuda: bias must be a 1-D CUDA tensor of x's dtype with >= out_features entries");
    b = bias->slice(0, 0, out_features).contiguous();  // a prefix of a contiguous bias: no copy
  }
  at::Tensor x2 = x.reshape({-1, in_features});  // (B, i)
  if (x2.stride(1) != 1 || x2.stride(0) < in_features) x2 = x2.contiguous();

  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = out_features;
  at::Tensor y = at::empty({x2.size(0), out_features}, x.options());  // (B, o)
  if (x2.size(0) == 0) return y.view(out_shape);
  if (!linear_cublaslt(x2, w, b, y, activation)) y = linear_aten(x2, w, b, activation);
  return y.view(out_shape);
}

}  // namespace subnetact

// The schemas are defined in Python (subnetact/ops.py); this library only adds the CUDA backend. Registering an
// impl whose C++ signature disagrees with the Python schema fails when the library loads, which the build test
// (tests/cuda/test_cuda_build.py) exercises on CPU-only machines.
TORCH_LIBRARY_IMPL(subnetact, CUDA, m) {
  m.impl("sliced_linear", &subnetact::sliced_linear_cuda);
  m.impl("sliced_conv2d", &subnetact::sliced_conv2d_cuda);
}

// `import subnetact_cuda._C` only needs a module object; the kernels register themselves when the library loads.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "subnetact CUDA kernels", -1, nullptr};
  return PyModule_Create(&module);
}
