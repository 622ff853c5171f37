"""Optional CUDA kernels for subnetact (not built yet).

This package is reserved for the compiled sliced-GEMM / sliced-convolution extension. It contains no code today;
subnetact runs on PyTorch's own kernels everywhere.
"""
