"""Decides only whether to build the optional CUDA extension ``subnetact_cuda._C``; metadata is in pyproject.toml.

    pip install -e .                                                     # pure Python (CPU machines, CI)
    SUBNETACT_BUILD_CUDA=1 pip install --no-build-isolation -e .        # build the kernels (needs torch + nvcc)

SUBNETACT_BUILD_CUDA: ``auto`` (default) builds when torch is importable (i.e. --no-build-isolation), is a CUDA
build and nvcc is found; ``0`` never builds; ``1`` builds or fails with the reason. See docs/cuda.md.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def _build_config():
    spec = importlib.util.spec_from_file_location("_subnetact_cuda_build", ROOT / "subnetact_cuda" / "_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cuda_build() -> dict:
    mode = os.getenv("SUBNETACT_BUILD_CUDA", "auto")
    if mode not in ("auto", "0", "1"):
        raise RuntimeError(f"SUBNETACT_BUILD_CUDA={mode!r} must be auto, 0 or 1")
    if mode == "0":
        return {}
    build = _build_config()
    home = build.cuda_home()
    if home is not None:
        # torch.utils.cpp_extension reads CUDA_HOME when imported; give it the toolkit nvcc belongs to (its own
        # guess can be a directory without lib64/libcudart, and linking then fails with "cannot find -lcudart").
        os.environ.setdefault("CUDA_HOME", home)
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension
    except ImportError:  # isolated build environment: no torch, so a pure wheel
        if mode == "1":
            raise RuntimeError(
                "SUBNETACT_BUILD_CUDA=1 needs torch at build time: pip install --no-build-isolation -e ."
            ) from None
        return {}
    problem = build.incompatibility(torch.version.cuda, home if CUDA_HOME is not None else None)
    if problem is not None:  # not torch.cuda.is_available(): a GPU is not needed to build
        if mode == "1":
            raise RuntimeError(f"SUBNETACT_BUILD_CUDA=1 but the CUDA kernels cannot be built: {problem}")
        print(f"WARNING: subnetact: not building the CUDA kernels: {problem}", file=sys.stderr)
        return {}
    if not os.getenv("TORCH_CUDA_ARCH_LIST") and torch.cuda.device_count() == 0:
        os.environ["TORCH_CUDA_ARCH_LIST"] = build.DEFAULT_ARCH_LIST
    scratch = ROOT / "build" / "cuda-library-headers"
    ext = CUDAExtension("subnetact_cuda._C", build.sources(ROOT), **build.compile_args(home, scratch))
    return {"ext_modules": [ext], "cmdclass": {"build_ext": BuildExtension}}


setup(**_cuda_build())
